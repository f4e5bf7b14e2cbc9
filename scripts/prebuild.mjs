#!/usr/bin/env node
// Copies the built addon into prebuilds/<platform>-<arch>/ (prebuildify's layout), where
// node-gyp-build finds it when there is no build/ folder, as in the published package:
//
//   prebuilds/linux-x64/node.napi.glibc.node       build/Release/resnet_cuda.node
//   prebuilds/linux-x64/libresnet_cuda_backend.so  build/Release/libresnet_cuda_backend.so, if built
//
// The addon opens the CUDA backend library from its own folder, so both go side by side.
// Run after `npm run build:native`; then checks that the copy loads on its own (PREBUILDS_ONLY).
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, readdirSync, rmSync, statSync } from 'node:fs';
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

// Start from an empty folder so that nothing from an older build (a backend no longer built) remains.
rmSync(outDir, { recursive: true, force: true });
mkdirSync(outDir, { recursive: true });
for (const f of files) {
  if (!existsSync(f.from)) continue;
  const to = join(outDir, f.to);
  copyFileSync(f.from, to);
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
