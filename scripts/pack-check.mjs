#!/usr/bin/env node
// Checks the package as a consumer gets it:
//   1. `npm pack` (building dist/ and prebuilds/ first when they are missing) and checks the file list;
//   2. installs the tarball into an empty project the normal way (install scripts run), with
//      RESNET_CUDA_FORBID_BUILD=1 so that the install fails if it would compile anything;
//   3. type-checks a strict TypeScript consumer against the installed typings, compiles it, runs it
//      with node and checks that ResNet-18 trains one step and gives logits of shape [2, 10];
//   4. checks the installed manifest (license, repository, homepage, bugs, cpu) and that
//      require('resnet-cuda') from CommonJS, where Node cannot require ES modules, says how to import it;
//   5. checks that `npm pack` refuses, in a copy of the package, without a prebuilt addon and with
//      one built from another version (the prepack step).
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const tuple = `${process.platform}-${process.arch}`;
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
const temps = [];

class CheckError extends Error {}

function step(line) {
  console.log(`pack-check: ${line}`);
}

/** Runs a command; returns its output, or throws with the output when it fails. */
function run(cmd, args, options = {}) {
  const { echo = false, ...rest } = options;
  const r = spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 64 << 20, ...rest });
  const output = `${r.stdout ?? ''}${r.stderr ?? ''}`;
  if (echo && output.trim()) console.log(output.trimEnd().replace(/^/gm, '  | '));
  if (r.error) throw new CheckError(`${cmd} ${args.join(' ')}: ${r.error.message}`);
  if (r.status !== 0) {
    throw new CheckError(
      `${cmd} ${args.join(' ')} failed (${r.signal ?? `exit code ${r.status}`})${echo ? '' : `:\n${output.trimEnd()}`}`,
    );
  }
  return r;
}

function temp(prefix) {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  temps.push(dir);
  return dir;
}

function ensureBuilt() {
  if (!existsSync(join(root, 'dist/lib/index.js')) || !existsSync(join(root, 'dist/lib/index.d.ts'))) {
    step('dist/lib is missing: npm run build:ts');
    run(npm, ['run', 'build:ts'], { cwd: root, echo: true });
  }
  const prebuilds = join(root, 'prebuilds', tuple);
  if (!existsSync(prebuilds) || !readdirSync(prebuilds).some((f) => f.endsWith('.node'))) {
    step(`prebuilds/${tuple} is missing: node scripts/prebuild.mjs`);
    run(process.execPath, [join(root, 'scripts/prebuild.mjs')], { cwd: root, echo: true });
  }
}

function pack() {
  const dest = temp('resnet-cuda-pack-');
  const r = run(npm, ['pack', '--json', '--pack-destination', dest], { cwd: root });
  const info = JSON.parse(r.stdout.slice(r.stdout.indexOf('[')))[0];
  const tarball = join(dest, info.filename);
  const files = info.files.map((f) => f.path);
  const mib = (statSync(tarball).size / 2 ** 20).toFixed(2);
  step(
    `packed ${info.filename}: ${files.length} files, ${mib} MiB (unpacked ${(info.unpackedSize / 2 ** 20).toFixed(2)} MiB)`,
  );

  const problems = [];
  const required = [
    'package.json',
    'LICENSE',
    'binding.gyp',
    'scripts/gyp-build.mjs',
    'scripts/gyp-deps.mjs',
    'cjs/index.cjs',
    'dist/lib/index.js',
    'dist/lib/index.d.ts',
    'dist/lib/binding.js',
    'scripts/install.mjs',
    'CMakeLists.txt',
  ];
  for (const f of required) if (!files.includes(f)) problems.push(`missing ${f}`);
  if (!files.some((f) => f.startsWith(`prebuilds/${tuple}/`) && f.endsWith('.node'))) {
    problems.push(`missing prebuilds/${tuple}/*.node`);
  }
  if (!files.some((f) => f.startsWith('native/') && f.endsWith('.cc'))) problems.push('missing native/ sources');
  const unwanted = files.filter(
    (f) => /^(build|test|bench|node_modules|dist\/(test|bench))\//.test(f) || f.endsWith('.map') || f.endsWith('.tgz'),
  );
  if (unwanted.length) {
    problems.push(`unexpected files: ${unwanted.slice(0, 10).join(', ')}${unwanted.length > 10 ? ', ...' : ''}`);
  }
  if (problems.length) throw new CheckError(`the tarball is not right:\n  ${problems.join('\n  ')}`);
  return tarball;
}

function install(tarball) {
  const project = temp('resnet-cuda-consumer-');
  // allowScripts: npm 11.16+ lists dependency install scripts nobody approved, and npm 12 skips them.
  // A tarball is approved by its file: address (a registry install would use `resnet-cuda`).
  const manifest = {
    name: 'consumer',
    version: '1.0.0',
    private: true,
    type: 'module',
    allowScripts: { [`file:${tarball}`]: true },
  };
  writeFileSync(join(project, 'package.json'), JSON.stringify(manifest, null, 2) + '\n');
  step(`installing the tarball into an empty project (RESNET_CUDA_FORBID_BUILD=1)`);
  const env = { ...process.env, RESNET_CUDA_FORBID_BUILD: '1' };
  delete env.RESNET_CUDA_SKIP_NATIVE_BUILD;
  delete env.RESNET_CUDA_PREBUILD;
  delete env.PREBUILDS_ONLY;
  const r = run(
    npm,
    ['install', tarball, '--prefer-offline', '--foreground-scripts', '--no-audit', '--no-fund', '--loglevel=warn'],
    {
      cwd: project,
      env,
      echo: true,
    },
  );
  // The install script must have run (not been skipped) and picked the prebuilt binary.
  if (!/resnet-cuda: using prebuilds\//.test(r.stdout + r.stderr)) {
    throw new CheckError('the package install script did not report using a prebuilt binary (did it run?)');
  }
  const installed = join(project, 'node_modules', 'resnet-cuda');
  if (existsSync(join(installed, 'build'))) {
    throw new CheckError('the install created node_modules/resnet-cuda/build: something was compiled');
  }
  const file = createRequire(join(project, 'package.json'))('node-gyp-build').resolve(installed);
  if (!file.startsWith(join(installed, 'prebuilds', tuple) + '/')) {
    throw new CheckError(`node-gyp-build resolves ${file}, not a prebuilt binary`);
  }
  return project;
}

const consumerSource = `import { ResNet18, Tensor, CrossEntropyLoss, SGD, listBackends } from 'resnet-cuda';

const model = ResNet18({ numClasses: 10, smallInput: true, seed: 1 });
const x = Tensor.randn([2, 32, 32, 3], { seed: 2 });
const logits = model.forward(x);
const shape: readonly number[] = logits.shape;
console.log('logits.shape', JSON.stringify(shape));
console.log('backend', listBackends()[0].name);

const lossFn = new CrossEntropyLoss();
const opt = new SGD(model, { lr: 0.1, momentum: 0.9 });
const loss: number = lossFn.forward(logits, [3, 7]).item();
model.backward(lossFn.backward());
opt.step();
opt.zeroGrad();
const after: number = lossFn.forward(model.forward(x), [3, 7]).item();
if (!Number.isFinite(loss) || !Number.isFinite(after)) throw new Error('non-finite loss');
console.log('loss', loss.toFixed(4), '->', after.toFixed(4));
console.log('RESULT ' + JSON.stringify({ shape, backend: listBackends()[0].name, loss, after }));
`;

function consume(project) {
  const tsc = join(root, 'node_modules/typescript/bin/tsc');
  if (!existsSync(tsc)) throw new CheckError('node_modules/typescript is missing: run npm ci');
  writeFileSync(join(project, 'consumer.ts'), consumerSource);
  // Strict, NodeNext, and no skipLibCheck: the published .d.ts files are checked too. @types/node
  // comes from this repository, as a consumer's own would.
  const tsconfig = {
    compilerOptions: {
      target: 'ES2022',
      module: 'NodeNext',
      moduleResolution: 'NodeNext',
      lib: ['ES2022'],
      strict: true,
      skipLibCheck: false,
      typeRoots: [join(root, 'node_modules/@types')],
      types: ['node'],
      outDir: 'out',
    },
    files: ['consumer.ts'],
  };
  writeFileSync(join(project, 'tsconfig.json'), JSON.stringify(tsconfig, null, 2) + '\n');
  step('type-checking and compiling consumer.ts (strict, NodeNext)');
  run(process.execPath, [tsc, '-p', 'tsconfig.json'], { cwd: project, echo: true });

  step('running the compiled consumer');
  const env = { ...process.env };
  delete env.RESNET_CUDA_PREBUILD;
  const r = run(process.execPath, ['out/consumer.js'], { cwd: project, env, echo: true });
  const line = r.stdout.split('\n').find((l) => l.startsWith('RESULT '));
  if (!line) throw new CheckError('the consumer printed no RESULT line');
  const result = JSON.parse(line.slice('RESULT '.length));
  if (JSON.stringify(result.shape) !== '[2,10]') {
    throw new CheckError(`logits.shape is ${JSON.stringify(result.shape)}, expected [2,10]`);
  }
  if (typeof result.backend !== 'string' || !result.backend) throw new CheckError('listBackends()[0].name is empty');

  step('running the installed command line (node_modules/.bin/resnet-cuda doctor --json)');
  const bin = join(project, 'node_modules', '.bin', 'resnet-cuda');
  const doctor = run(bin, ['doctor', '--json'], { cwd: project, env });
  const report = JSON.parse(doctor.stdout);
  if (!report || typeof report !== 'object') throw new CheckError('resnet-cuda doctor --json printed no JSON object');
}

/** The installed manifest's fields, and the message of require('resnet-cuda') without require(esm). */
function checkManifest(project) {
  const installed = join(project, 'node_modules', 'resnet-cuda');
  const manifest = JSON.parse(readFileSync(join(installed, 'package.json'), 'utf8'));
  const problems = [];
  if (manifest.license !== 'MIT') problems.push(`license is ${JSON.stringify(manifest.license)}, not MIT`);
  if (!/^MIT License\n/.test(readFileSync(join(installed, 'LICENSE'), 'utf8'))) {
    problems.push('LICENSE is not the MIT text');
  }
  if (!/^git\+https:\/\/github\.com\/[\w.-]+\/[\w.-]+\.git$/.test(manifest.repository?.url ?? '')) {
    problems.push(`repository.url is ${JSON.stringify(manifest.repository?.url)}`);
  }
  if (!/^https:\/\/github\.com\/.+#readme$/.test(manifest.homepage ?? '')) problems.push('homepage is not the #readme');
  if (!/^https:\/\/github\.com\/.+\/issues$/.test(manifest.bugs?.url ?? '')) {
    problems.push('bugs.url is not the issues');
  }
  if (JSON.stringify(manifest.cpu) !== JSON.stringify(['x64'])) problems.push(`cpu is ${JSON.stringify(manifest.cpu)}`);
  if (problems.length) throw new CheckError(`the installed package.json is not right:\n  ${problems.join('\n  ')}`);
  step('the installed package has LICENSE (MIT), repository, homepage, bugs and cpu');

  step("require('resnet-cuda') from CommonJS with --no-experimental-require-module");
  const probe =
    "try { require('resnet-cuda'); console.log('loaded'); } catch (e) { console.log(e.code + '\\n' + e.message); }";
  const r = run(process.execPath, ['--no-experimental-require-module', '-e', probe], { cwd: project });
  if (!r.stdout.startsWith('ERR_REQUIRE_ESM\n') || !r.stdout.includes("await import('resnet-cuda')")) {
    throw new CheckError(`require('resnet-cuda') did not explain how to import it:\n${r.stdout.trimEnd()}`);
  }
}

/**
 * `npm pack` in a copy of the package (never the real prebuilds/): it must refuse with no prebuilt
 * addon, and with a prebuilt addon of another version.
 */
function checkPrepackRefuses() {
  const copy = temp('resnet-cuda-prepack-');
  for (const path of ['package.json', 'scripts/prepack.mjs', 'native']) {
    cpSync(join(root, path), join(copy, path), { recursive: true });
  }
  const dest = temp('resnet-cuda-prepack-out-');
  const attempt = (what, expected) => {
    const r = spawnSync(npm, ['pack', '--pack-destination', dest], { cwd: copy, encoding: 'utf8' });
    const output = `${r.stdout}${r.stderr}`;
    if (r.status === 0 || readdirSync(dest).length > 0) {
      throw new CheckError(`npm pack made a tarball ${what}:\n${output.trimEnd()}`);
    }
    if (!output.includes('refusing to pack') || !expected.test(output)) {
      throw new CheckError(
        `npm pack failed ${what}, but not with the prepack message ${expected}:\n${output.trimEnd()}`,
      );
    }
    step(`npm pack refuses ${what}`);
  };
  attempt(
    'without a prebuilt addon',
    /node\.napi\.glibc\.node is missing[\s\S]*npm run build:native && npm run prebuilds/,
  );

  cpSync(join(root, 'prebuilds'), join(copy, 'prebuilds'), { recursive: true });
  const manifest = JSON.parse(readFileSync(join(copy, 'package.json'), 'utf8'));
  const version = manifest.version;
  manifest.version = `${version}-other.1`;
  writeFileSync(join(copy, 'package.json'), JSON.stringify(manifest, null, 2) + '\n');
  attempt(
    'with a prebuilt addon of another version',
    new RegExp(
      `built from version ${version.replace(/\./g, '\\.')}, package\\.json says ${manifest.version.replace(/\./g, '\\.')}`,
    ),
  );
}

let code = 0;
try {
  ensureBuilt();
  const tarball = pack();
  const project = install(tarball);
  consume(project);
  checkManifest(project);
  checkPrepackRefuses();
  step(
    'OK: the packed tarball installs without compiling, type-checks and trains; prepack refuses a tarball without the addon',
  );
} catch (error) {
  code = 1;
  console.error(`pack-check: FAILED: ${error instanceof CheckError ? error.message : (error?.stack ?? error)}`);
} finally {
  for (const dir of temps) rmSync(dir, { recursive: true, force: true });
}
process.exit(code);
