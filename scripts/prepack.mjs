#!/usr/bin/env node
// The package's `prepack` step (`npm pack`, `npm publish`): a tarball is made only from a compiled
// dist/ and a prebuilt addon that loads and matches the sources. It refuses, saying what to run,
// when
//   - dist/lib is missing or older than a lib/ source (`npm run build:ts`);
//   - prebuilds/<platform>-<arch>/node.napi.glibc.node (or the CUDA backend library beside it) is
//     missing or older than a source it is compiled from: it is (re)made from build/Release with
//     scripts/prebuild.mjs when that build is up to date, else it asks for
//     `npm run build:native && npm run prebuilds`;
//   - the prebuilt addon does not load, reports another version than package.json, or has no CPU
//     backend;
//   - `npm publish` finds no CUDA backend library beside it (`npm pack` notes its absence).
//
// RESNET_CUDA_PREPACK_ROOT names another package folder to check (the tests use a copy).
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(process.env.RESNET_CUDA_PREPACK_ROOT || dirname(dirname(fileURLToPath(import.meta.url))));
const tuple = `${process.platform}-${process.arch}`;
const addonName = `node.napi${process.platform === 'linux' ? '.glibc' : ''}.node`;
const prebuiltDir = join(root, 'prebuilds', tuple);
const prebuilt = join(prebuiltDir, addonName);
const backendName = 'libresnet_cuda_backend.so';
const built = join(root, 'build', 'Release', 'resnet_cuda.node');
const publishing = process.env.npm_command === 'publish';
const rel = (path) => relative(root, path) || '.';

function log(line) {
  console.log(`prepack: ${line}`);
}

function refuse(lines) {
  console.error(['', 'prepack: refusing to pack resnet-cuda:', ...lines.map((l) => `  ${l}`), ''].join('\n'));
  process.exit(1);
}

/** Every file under `dir` (relative to the root) whose name passes `keep`, or none when it is absent. */
function filesUnder(dir, keep) {
  const top = join(root, dir);
  if (!existsSync(top)) return [];
  return readdirSync(top, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && keep(e.name))
    .map((e) => join(e.parentPath ?? e.path, e.name));
}

/** The newest of `files` as { file, mtimeMs }, or undefined when there are none. */
function newest(files) {
  let best;
  for (const file of files) {
    const mtimeMs = statSync(file).mtimeMs;
    if (!best || mtimeMs > best.mtimeMs) best = { file, mtimeMs };
  }
  return best;
}

/** dist/lib must hold a compiled file, no older than its source, for every lib/ source. */
function checkDist() {
  const sources = filesUnder('lib', (n) => n.endsWith('.ts') && !n.endsWith('.d.ts'));
  if (sources.length === 0) return; // a folder without the TypeScript sources: dist/ is all there is
  const problems = [];
  for (const source of sources) {
    const compiled = join(root, 'dist', rel(source)).replace(/\.ts$/, '.js');
    if (!existsSync(compiled)) problems.push(`${rel(compiled)} is missing`);
    else if (statSync(compiled).mtimeMs < statSync(source).mtimeMs) {
      problems.push(`${rel(compiled)} is older than ${rel(source)}`);
    }
  }
  if (problems.length) {
    refuse([
      ...problems.slice(0, 5),
      ...(problems.length > 5 ? [`(and ${problems.length - 5} more)`] : []),
      'Compile the TypeScript first: npm run build:ts',
    ]);
  }
  log(`dist/lib is compiled from the current lib/ (${sources.length} sources)`);
}

/** The native sources of the folders `dirs` (under native/). */
function nativeSources(dirs) {
  return dirs.flatMap((d) => filesUnder(join('native', d), (n) => /\.(cc|cu|cuh|h|hpp)$/.test(n)));
}

/** Runs scripts/prebuild.mjs (build/Release -> prebuilds/), refusing when it fails. */
function makePrebuilt() {
  log(`copying build/Release into ${rel(prebuiltDir)}/ with scripts/prebuild.mjs`);
  const r = spawnSync(process.execPath, [join(root, 'scripts', 'prebuild.mjs')], { cwd: root, stdio: 'inherit' });
  if (r.status !== 0) refuse([`scripts/prebuild.mjs failed (${r.signal ?? `exit code ${r.status}`})`]);
}

/**
 * The prebuilt files and the sources each is compiled from: the addon (required) and the CUDA
 * backend library (when one was built or laid out).
 */
function artifacts() {
  const list = [{ prebuilt, built, sources: nativeSources(['core', 'cpu', 'image', 'napi']), required: true }];
  const backend = { prebuilt: join(prebuiltDir, backendName), built: join(root, 'build', 'Release', backendName) };
  if (existsSync(backend.prebuilt) || existsSync(backend.built)) {
    list.push({ ...backend, sources: nativeSources(['core', 'cuda']), required: false });
  }
  return list;
}

/**
 * Makes sure prebuilds/ holds files no older than their sources: copied from build/Release when
 * that build is up to date, else refused.
 */
function checkFresh() {
  let copy = false;
  for (const a of artifacts()) {
    const source = newest(a.sources);
    const fresh = (file) => existsSync(file) && (!source || statSync(file).mtimeMs >= source.mtimeMs);
    if (fresh(a.prebuilt)) continue;
    const why = existsSync(a.prebuilt)
      ? `${rel(a.prebuilt)} is older than ${rel(source.file)}`
      : `${rel(a.prebuilt)} is missing`;
    if (fresh(a.built)) {
      log(`${why}; ${rel(a.built)} is up to date`);
      copy = true;
      continue;
    }
    refuse([
      why,
      existsSync(a.built)
        ? `and ${rel(a.built)} is older than ${rel(source.file)} too.`
        : `and there is no ${rel(a.built)}.`,
      'Build the addon and lay it out in prebuilds/ first:',
      '  npm run build:native && npm run prebuilds',
    ]);
  }
  if (copy) makePrebuilt();
}

/** Loads the prebuilt addon in a child process: its version and the backends it reports. */
function probe() {
  const code = `
    const addon = require(process.argv[1]);
    process.stdout.write(JSON.stringify({ version: addon.version, backends: addon.listBackends() }));
  `;
  const r = spawnSync(process.execPath, ['-e', code, prebuilt], { cwd: root, encoding: 'utf8', timeout: 60_000 });
  if (r.status !== 0) {
    const why = r.error?.message ?? (r.signal ? `signal ${r.signal}` : `exit code ${r.status}`);
    refuse([`${rel(prebuilt)} does not load (${why}):`, ...r.stderr.trim().split('\n').slice(0, 8)]);
  }
  return JSON.parse(r.stdout);
}

checkDist();
checkFresh();
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const loaded = probe();
if (loaded.version !== pkg.version) {
  refuse([
    `${rel(prebuilt)} was built from version ${loaded.version}, package.json says ${pkg.version}.`,
    'Rebuild it: npm run build:native && npm run prebuilds',
  ]);
}
const cpu = loaded.backends.find((b) => b.name === 'cpu');
if (!cpu?.built) refuse([`${rel(prebuilt)} reports no CPU backend.`]);
const hasCuda = existsSync(join(prebuiltDir, backendName));
if (!hasCuda && publishing) {
  refuse([
    `${rel(join(prebuiltDir, backendName))} is missing: the published package would be CPU only.`,
    'Build with a CUDA SDK (scripts/setup-cuda-sdk) and lay it out: npm run build:native && npm run prebuilds',
  ]);
}
log(
  `${rel(prebuilt)} loads (native ${loaded.version}, CPU backend${hasCuda ? `, CUDA backend ${backendName}` : '; no CUDA backend: the tarball is CPU only'})`,
);
