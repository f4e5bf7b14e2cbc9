#!/usr/bin/env node
// Copies the built addon into prebuilds/<platform>-<arch>/ (prebuildify's layout), where
// node-gyp-build finds it when there is no build/ folder, as in the published package:
//
//   prebuilds/linux-x64/node.napi.glibc.node       build/Release/resnet_cuda.node
//   prebuilds/linux-x64/libresnet_cuda_backend.so  build/Release/libresnet_cuda_backend.so, if built
//   prebuilds/linux-x64/libgomp.so.1               GCC's OpenMP runtime, the one the addon loads here
//
// The addon opens the CUDA backend library from its own folder, so both go side by side. oneDNN,
// libjpeg-turbo and Gloo are linked into the addon statically (scripts/deps); its only other
// dependency outside glibc and the C++ runtime is libgomp, which slim images lack: the addon's run
// path ($ORIGIN) finds the copy beside it (GCC's runtime library exception allows shipping it).
// Run after `npm run build:native`; then checks that the copy loads on its own (PREBUILDS_ONLY).
import { spawnSync } from 'node:child_process';
import { chmodSync, copyFileSync, existsSync, mkdirSync, readdirSync, rmSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const tuple = `${process.platform}-${process.arch}`;
// The tags node-gyp-build matches: any Node version with Node-API (napi), glibc only (not musl).
const addonName = `node.napi${process.platform === 'linux' ? '.glibc' : ''}.node`;
const release = join(root, 'build', 'Release');
const outDir = join(root, 'prebuilds', tuple);

function fail(message) {
  console.error(`prebuild: ${message}`);
  process.exit(1);
}

const files = [
  { from: join(release, 'resnet_cuda.node'), to: addonName, required: true },
  { from: join(release, 'libresnet_cuda_backend.so'), to: 'libresnet_cuda_backend.so', required: false },
];
for (const f of files) {
  if (f.required && !existsSync(f.from)) {
    fail(`${relative(root, f.from)} is missing: run \`npm run build:native\` first.`);
  }
}

/** The dynamic section's entries of one kind (NEEDED, RUNPATH, ...) of an ELF file, from readelf. */
function dynamicEntries(file, kind) {
  const r = spawnSync('readelf', ['-d', file], { encoding: 'utf8' });
  if (r.status !== 0) fail(`readelf -d ${relative(root, file)} failed: ${(r.stderr || r.error?.message || '').trim()}`);
  const entries = [];
  for (const line of r.stdout.split('\n')) {
    const m = new RegExp(`\\(${kind}\\)\\s+.*\\[(.*)\\]`).exec(line);
    if (m) entries.push(m[1]);
  }
  return entries;
}

/** Where the dynamic loader finds `soname` for `file` on this machine (from ldd), or undefined. */
function resolvedPath(file, soname) {
  const r = spawnSync('ldd', [file], { encoding: 'utf8' });
  if (r.status !== 0) fail(`ldd ${relative(root, file)} failed: ${(r.stderr || r.error?.message || '').trim()}`);
  const line = r.stdout.split('\n').find((l) => l.trim().startsWith(`${soname} =>`));
  const m = line && /=>\s+(\/\S+)/.exec(line);
  return m ? m[1] : undefined;
}

// The OpenMP runtime, when the addon links it (it does unless built without oneDNN's OpenMP).
const addonBuilt = files[0].from;
if (process.platform === 'linux' && dynamicEntries(addonBuilt, 'NEEDED').includes('libgomp.so.1')) {
  if (!dynamicEntries(addonBuilt, 'RUNPATH').some((p) => p.split(':').includes('$ORIGIN'))) {
    fail(`${relative(root, addonBuilt)} needs libgomp.so.1 but has no $ORIGIN run path to find a bundled copy.`);
  }
  const gomp = resolvedPath(addonBuilt, 'libgomp.so.1');
  if (!gomp) fail(`ldd does not find libgomp.so.1 for ${relative(root, addonBuilt)}: install libgomp1.`);
  files.push({ from: gomp, to: 'libgomp.so.1', required: true });
}

// Start from an empty folder so that nothing from an older build (a backend no longer built) remains.
rmSync(outDir, { recursive: true, force: true });
mkdirSync(outDir, { recursive: true });
for (const f of files) {
  if (!existsSync(f.from)) continue;
  const to = join(outDir, f.to);
  copyFileSync(f.from, to);
  chmodSync(to, 0o644);
  const kib = (statSync(to).size / 1024).toFixed(1);
  console.log(`prebuild: ${relative(root, to)}  ${kib} KiB  (from ${relative(root, f.from)})`);
}

// Load it exactly as an installed package would: prebuilds only, in a fresh process.
const code = `
  const file = require('node-gyp-build').resolve(process.argv[1]);
  const addon = require(file);
  process.stdout.write(JSON.stringify({ file, version: addon.version }));
`;
const r = spawnSync(process.execPath, ['-e', code, root], {
  cwd: root,
  encoding: 'utf8',
  env: { ...process.env, PREBUILDS_ONLY: '1', RESNET_CUDA_PREBUILD: '' },
});
if (r.status !== 0) fail(`the copied addon does not load:\n${r.stderr.trim()}`);
const loaded = JSON.parse(r.stdout);
if (dirname(loaded.file) !== outDir) {
  fail(`node-gyp-build picked ${loaded.file}, not a file in ${relative(root, outDir)}`);
}
console.log(
  `prebuild: ${relative(root, loaded.file)} loads (native ${loaded.version}); ${readdirSync(outDir).length} file(s) in ${relative(root, outDir)}/`,
);
