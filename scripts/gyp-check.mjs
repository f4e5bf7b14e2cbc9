#!/usr/bin/env node
// Checks the node-gyp build path (binding.gyp) end to end, in a temporary copy of the sources so
// that build/ (the CMake build the tests use) is left alone:
//   1. `node-gyp rebuild --nodedir=<the running Node's prefix>` (no header download), with the
//      libraries scripts/gyp-deps.mjs picks (static archives of RESNET_DEPS_PREFIX or scripts/deps,
//      else the system's);
//   2. lists the addon's shared-library dependencies and checks that its run path starts with $ORIGIN;
//   3. loads the result through the package's own loader (dist/lib) and checks that it is the
//      node-gyp binary, that a Linear layer's forward pass matches a JavaScript reference, and that
//      a small ResNet-18 trains one step.
// node-gyp and the headers are found as `npm run build:gyp` finds them (scripts/gyp-build.mjs).
// Exits 2 (skipped, with the reason) when node-gyp or the Node.js headers are absent.
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, realpathSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { nodeDir, nodeGyp, rebuildArgs } from './gyp-build.mjs';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const keep = process.argv.includes('--keep');
const BUILD_TIMEOUT_MS = 45 * 60_000;

function step(line) {
  console.log(`gyp-check: ${line}`);
}

function skip(reason) {
  console.log(`gyp-check: SKIPPED: ${reason}`);
  process.exit(2);
}

const gyp = nodeGyp();
if (!gyp) skip('node-gyp is not in node_modules, nor bundled with npm');
const nodedir = nodeDir();
if (!nodedir) skip(`the running Node.js (${process.execPath}) has no headers in <prefix>/include/node`);
if (!existsSync(join(root, 'dist', 'lib', 'index.js'))) {
  console.error('gyp-check: dist/lib is missing: run `npm run build:ts` first');
  process.exit(1);
}

const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-gyp-'));
let code = 1;
try {
  // The files binding.gyp builds from, the compiled loader, and this checkout's node_modules.
  for (const path of [
    'binding.gyp',
    'package.json',
    'CMakeLists.txt',
    'scripts/gyp-deps.mjs',
    'scripts/deps',
    'dist/lib',
  ]) {
    if (existsSync(join(root, path))) cpSync(join(root, path), join(dir, path), { recursive: true });
  }
  for (const sub of ['core', 'cpu', 'image', 'napi']) {
    cpSync(join(root, 'native', sub), join(dir, 'native', sub), { recursive: true });
  }
  symlinkSync(realpathSync(join(root, 'node_modules')), join(dir, 'node_modules'));

  const args = rebuildArgs(gyp, nodedir);
  const libraries = spawnSync(process.execPath, ['scripts/gyp-deps.mjs', 'libraries'], { cwd: dir, encoding: 'utf8' });
  if (libraries.status !== 0) throw new Error(`scripts/gyp-deps.mjs libraries failed:\n${libraries.stderr.trim()}`);
  step(`node-gyp ${args.slice(1).join(' ')} in ${dir}`);
  step(`links: ${libraries.stdout.trim().split('\n').join(' ')}`);
  const started = Date.now();
  const build = spawnSync(process.execPath, args, {
    cwd: dir,
    encoding: 'utf8',
    maxBuffer: 256 << 20,
    timeout: BUILD_TIMEOUT_MS,
  });
  const output = `${build.stdout}${build.stderr}`;
  if (build.status !== 0) {
    const why = build.error?.message ?? (build.signal ? `signal ${build.signal}` : `exit code ${build.status}`);
    throw new Error(`node-gyp rebuild failed (${why}):\n${output.split('\n').slice(-40).join('\n')}`);
  }
  const warnings = output.split('\n').filter((l) => l.includes('warning:'));
  const addonFile = join(dir, 'build', 'Release', 'resnet_cuda.node');
  if (!existsSync(addonFile)) throw new Error(`node-gyp succeeded but ${addonFile} is missing`);
  step(
    `built build/Release/resnet_cuda.node in ${((Date.now() - started) / 1000).toFixed(0)} s, ${warnings.length} warning(s)`,
  );
  for (const w of warnings.slice(0, 10)) console.log(`  | ${w}`);

  const readelf = spawnSync('readelf', ['-d', addonFile], { encoding: 'utf8' });
  if (readelf.status === 0) {
    const needed = [...readelf.stdout.matchAll(/\(NEEDED\).*\[(.*)\]/g)].map((m) => m[1]);
    const runpath = /\(RUNPATH\).*\[(.*)\]/.exec(readelf.stdout)?.[1] ?? '';
    step(`needs: ${needed.join(' ')}; run path: ${runpath || '(none)'}`);
    // As the CMake build: $ORIGIN first, so that a libdnnl.so.3 or libgomp.so.1 beside it wins.
    if (runpath.split(':')[0] !== '$ORIGIN') throw new Error(`the run path '${runpath}' does not start with $ORIGIN`);
  }

  const program = `
    import { createRequire } from 'node:module';
    import { Linear, ResNet18, Tensor, CrossEntropyLoss, SGD, listBackends } from './dist/lib/index.js';
    const resolved = createRequire(import.meta.url)('node-gyp-build').resolve(process.cwd());
    const cpu = listBackends().find((b) => b.name === 'cpu');
    if (!cpu || !cpu.available) throw new Error('no available CPU backend: ' + JSON.stringify(listBackends()));

    // Linear, x [3, 5] -> [3, 4], against y = x W^T + b in double precision.
    const layer = new Linear({ inFeatures: 5, outFeatures: 4, seed: 3 });
    const x = Tensor.randn([3, 5], { seed: 4 });
    const y = layer.forward(x).toArray();
    const w = layer.weight.data.toArray(), b = layer.bias.data.toArray(), xs = x.toArray();
    let worst = 0;
    for (let n = 0; n < 3; n++) for (let o = 0; o < 4; o++) {
      let ref = b[o];
      for (let i = 0; i < 5; i++) ref += xs[n * 5 + i] * w[o * 5 + i];
      worst = Math.max(worst, Math.abs(y[n * 4 + o] - ref) / Math.max(1, Math.abs(ref)));
    }
    if (!(worst < 1e-5)) throw new Error('Linear forward differs from the reference by ' + worst);

    const model = ResNet18({ numClasses: 10, smallInput: true, seed: 1 });
    const images = Tensor.randn([2, 32, 32, 3], { seed: 2 });
    const lossFn = new CrossEntropyLoss();
    const opt = new SGD(model, { lr: 0.1, momentum: 0.9 });
    const logits = model.forward(images);
    const loss = lossFn.forward(logits, [3, 7]).item();
    model.backward(lossFn.backward());
    opt.step();
    const after = lossFn.forward(model.forward(images), [3, 7]).item();
    if (!Number.isFinite(loss) || !Number.isFinite(after) || !(after < loss)) {
      throw new Error('one SGD step did not lower the loss: ' + loss + ' -> ' + after);
    }
    console.log(JSON.stringify({ resolved, onednn: cpu.properties?.onednn, worst, shape: logits.shape, loss, after }));
  `;
  const run = spawnSync(process.execPath, ['--input-type=module', '-e', program], {
    cwd: dir,
    encoding: 'utf8',
    timeout: 300_000,
  });
  if (run.status !== 0) throw new Error(`the node-gyp addon does not work:\n${run.stderr.trim()}`);
  const result = JSON.parse(run.stdout.trim().split('\n').pop());
  if (result.resolved !== addonFile) throw new Error(`the loader picked ${result.resolved}, not ${addonFile}`);
  step(
    `the loader picks it; oneDNN ${result.onednn}; Linear matches the reference (max rel. error ${result.worst.toExponential(1)}); ` +
      `ResNet-18 logits [${result.shape}], loss ${result.loss.toFixed(4)} -> ${result.after.toFixed(4)} after one SGD step`,
  );
  step('OK');
  code = 0;
} catch (error) {
  console.error(`gyp-check: FAILED: ${error instanceof Error ? error.message : String(error)}`);
} finally {
  if (keep) step(`kept ${dir}`);
  else rmSync(dir, { recursive: true, force: true });
}
process.exit(code);
