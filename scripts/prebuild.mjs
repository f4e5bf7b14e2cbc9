#!/usr/bin/env node
// Copies the built addon into prebuilds/<platform>-<arch>/ (prebuildify's layout), where
// node-gyp-build finds it when there is no build/ folder, as in the published package:
//
//   prebuilds/linux-x64/node.napi.glibc.node       build/Release/resnet_cuda.node
//   prebuilds/linux-x64/libresnet_cuda_backend.so  build/Release/libresnet_cuda_backend.so, if built
//   prebuilds/linux-x64/libdnnl.so.3               oneDNN, the copy the addon loads here (scripts/deps)
//   prebuilds/linux-x64/licenses/onednn/           oneDNN's LICENSE and THIRD-PARTY-PROGRAMS
//   prebuilds/linux-x64/libgomp.so.1               GCC's OpenMP runtime, the one the addon loads here
//
// The addon opens the CUDA backend library from its own folder, so both go side by side.
// libjpeg-turbo and Gloo are linked into the addon statically (scripts/deps); oneDNN is the shared
// libdnnl.so.3 of Intel's wheels, and libgomp is needed by both and lacking on slim images: the
// addon's run path ($ORIGIN) finds the copies beside it (oneDNN's Apache-2.0 license and GCC's
// runtime library exception allow shipping them; oneDNN's license files go with it).
// Run after `npm run build:native`; then checks that the copy loads on its own (PREBUILDS_ONLY).
import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
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

// The shared libraries bundled beside the addon, when it links them: each must be found through an
// $ORIGIN run path, and is copied from where the loader finds it on this machine.
const addonBuilt = files[0].from;
const bundled = [
  { soname: 'libdnnl.so.3', hint: 'run scripts/deps (it installs oneDNN into its cache)' },
  { soname: 'libgomp.so.1', hint: 'install libgomp1' },
];
if (process.platform === 'linux') {
  const needed = dynamicEntries(addonBuilt, 'NEEDED');
  const origin = dynamicEntries(addonBuilt, 'RUNPATH').some((p) => p.split(':').includes('$ORIGIN'));
  for (const { soname, hint } of bundled) {
    if (!needed.includes(soname)) continue;
    if (!origin) {
      fail(`${relative(root, addonBuilt)} needs ${soname} but has no $ORIGIN run path to find a bundled copy.`);
    }
    const from = resolvedPath(addonBuilt, soname);
    if (!from) fail(`ldd does not find ${soname} for ${relative(root, addonBuilt)}: ${hint}.`);
    files.push({ from, to: soname, required: true });
    if (soname === 'libdnnl.so.3') {
      // scripts/deps's prefix: lib/libdnnl.so.3 and licenses/ (the system's oneDNN has neither beside).
      const licenses = join(dirname(dirname(from)), 'licenses');
      for (const name of ['LICENSE', 'THIRD-PARTY-PROGRAMS']) {
        const file = join(licenses, name);
        if (existsSync(file)) files.push({ from: file, to: join('licenses', 'onednn', name), required: true });
      }
    }
  }
}

// Start from an empty folder so that nothing from an older build (a backend no longer built) remains.
rmSync(outDir, { recursive: true, force: true });
mkdirSync(outDir, { recursive: true });
for (const f of files) {
  if (!existsSync(f.from)) continue;
  const to = join(outDir, f.to);
  mkdirSync(dirname(to), { recursive: true });
  copyFileSync(f.from, to);
  chmodSync(to, 0o644);
  const kib = (statSync(to).size / 1024).toFixed(1);
  console.log(`prebuild: ${relative(root, to)}  ${kib} KiB  (from ${relative(root, f.from)})`);
}

// The development build's run path also names the oneDNN folder of scripts/deps on this machine;
// the copy keeps only $ORIGIN. CMake's own ELF editor rewrites it in place (as `cmake --install`
// does; no patchelf needed): file(RPATH_CHANGE) with the old value read from the file.
const addonCopy = join(outDir, addonName);
if (process.platform === 'linux') {
  const before = dynamicEntries(addonCopy, 'RUNPATH');
  if (before.length === 1 && before[0] !== '$ORIGIN' && before[0].split(':').includes('$ORIGIN')) {
    const scratch = mkdtempSync(join(tmpdir(), 'resnet-cuda-prebuild-'));
    try {
      const script = join(scratch, 'runpath.cmake');
      writeFileSync(script, 'file(RPATH_CHANGE FILE "${RC_FILE}" OLD_RPATH "${RC_OLD}" NEW_RPATH "${RC_NEW}")\n');
      const r = spawnSync(
        'cmake',
        [`-DRC_FILE=${addonCopy}`, `-DRC_OLD=${before[0]}`, '-DRC_NEW=$ORIGIN', '-P', script],
        {
          encoding: 'utf8',
        },
      );
      if (r.status !== 0) {
        fail(
          `could not set the run path of ${relative(root, addonCopy)}: ${(r.stderr || r.error?.message || '').trim()}`,
        );
      }
    } finally {
      rmSync(scratch, { recursive: true, force: true });
    }
  }
  const after = dynamicEntries(addonCopy, 'RUNPATH');
  if (after.length > 1 || (after.length === 1 && after[0] !== '$ORIGIN')) {
    fail(
      `${relative(root, addonCopy)} has the run path '${after.join(':')}'; the prebuilt addon may only have $ORIGIN.`,
    );
  }
  console.log(`prebuild: ${relative(root, addonCopy)} run path: ${after[0] ?? '(none)'}`);
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
  `prebuild: ${relative(root, loaded.file)} loads (native ${loaded.version}); ${readdirSync(outDir, { recursive: true }).length} entries in ${relative(root, outDir)}/`,
);
