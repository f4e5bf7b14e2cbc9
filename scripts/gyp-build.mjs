#!/usr/bin/env node
// `npm run build:gyp`: builds the CPU addon with node-gyp (binding.gyp) instead of CMake, into
// build/Release/resnet_cuda.node, where the loader finds it. node-gyp is the one in node_modules
// when there is one, else the copy bundled with npm; it compiles against the running Node's own
// headers (--nodedir), so nothing is downloaded. `node-gyp rebuild` starts build/ afresh: a CMake
// build there (and its CUDA backend) is removed.
//
// Also imported by scripts/gyp-check.mjs for nodeGyp() and nodeDir().
import { spawnSync } from 'node:child_process';
import { existsSync, realpathSync } from 'node:fs';
import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));

/** node-gyp's entry point: node_modules' own, else npm's bundled copy; undefined when neither. */
export function nodeGyp() {
  try {
    return createRequire(join(root, 'package.json')).resolve('node-gyp/bin/node-gyp.js');
  } catch {
    // npm bundles node-gyp: <prefix>/lib/node_modules/npm/node_modules/node-gyp.
  }
  const which = spawnSync('sh', ['-c', 'command -v npm'], { encoding: 'utf8' });
  const npm = which.status === 0 ? which.stdout.trim() : '';
  if (!npm) return undefined;
  const bundled = join(dirname(dirname(realpathSync(npm))), 'node_modules', 'node-gyp', 'bin', 'node-gyp.js');
  return existsSync(bundled) ? bundled : undefined;
}

/** The prefix of the running Node.js when it has its headers (include/node), else undefined. */
export function nodeDir() {
  for (const exe of [process.execPath, realpathSync(process.execPath)]) {
    const prefix = dirname(dirname(exe));
    if (existsSync(join(prefix, 'include', 'node', 'node_api.h'))) return prefix;
  }
  return undefined;
}

/** The node-gyp command line for `rebuild` with the running Node's headers and all cores. */
export function rebuildArgs(gyp, nodedir) {
  return [gyp, 'rebuild', `--nodedir=${nodedir}`, '-j', String(Math.max(1, availableParallelism()))];
}

if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  const fail = (message) => {
    console.error(`build:gyp: ${message}`);
    process.exit(1);
  };
  const gyp = nodeGyp();
  if (!gyp) fail('node-gyp is not in node_modules nor bundled with npm: `npm install --no-save node-gyp`');
  const nodedir = nodeDir();
  if (!nodedir) {
    fail(
      `the running Node.js (${process.execPath}) has no headers in <prefix>/include/node; install its headers package`,
    );
  }
  const args = rebuildArgs(gyp, nodedir);
  console.log(`build:gyp: node ${args.join(' ')}`);
  const r = spawnSync(process.execPath, args, { cwd: root, stdio: 'inherit' });
  if (r.status !== 0) fail(`node-gyp failed (${r.signal ?? `exit code ${r.status}`})`);
  console.log('build:gyp: build/Release/resnet_cuda.node (CPU backend; the CUDA backend is built by CMake only)');
}
