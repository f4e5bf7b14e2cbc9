#!/usr/bin/env node
// What binding.gyp compiles and links the CPU addon with, printed one item a line for gyp's
// `<!@(...)` expansion:
//
//   node scripts/gyp-deps.mjs sources        the C++ sources of the addon (native/core, cpu, image, napi)
//   node scripts/gyp-deps.mjs include_dirs   header folders of oneDNN, libjpeg-turbo and Gloo
//   node scripts/gyp-deps.mjs libraries      what the addon links: the three libraries and OpenMP
//   node scripts/gyp-deps.mjs cflags         node-addon-api's headers as system headers, and the warnings of
//                                            CMakeLists.txt (-Werror with RESNET_CUDA_WERROR=1)
//   node scripts/gyp-deps.mjs version        the package version (RC_VERSION)
//
// With RESNET_DEPS_PREFIX set, the libraries are the static archives of that prefix
// (<prefix>/include, <prefix>/lib or lib64 with libdnnl.a, libjpeg.a and libgloo.a); otherwise the
// system's shared libraries (Debian/Ubuntu: libdnnl-dev, libjpeg-dev, libgloo-dev). A prefix that
// lacks a file stops the build here, naming the file.
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
// Every .cc of these folders is part of the addon, as in CMakeLists.txt's rc_core, rc_cpu, rc_image and
// addon targets; native/cpu/optim.cc is compiled on its own (binding.gyp's rc_cpu_optim).
const sourceDirs = ['native/core', 'native/cpu', 'native/image', 'native/napi'];
const separateSources = ['native/cpu/optim.cc'];
const archives = ['libdnnl.a', 'libgloo.a', 'libjpeg.a'];
// The system's Gloo (libgloo-dev) installs into /usr/lib, outside the multiarch folder.
const systemGlooDir = '/usr/lib';

function fail(message) {
  console.error(`gyp-deps: ${message}`);
  process.exit(1);
}

function envFlag(name) {
  const value = process.env[name];
  return value !== undefined && value !== '' && value !== '0' && value.toLowerCase() !== 'false';
}

/** node-addon-api's header folder (a devDependency: `npm ci` installs it). */
function nodeAddonApiDir() {
  try {
    return resolve(createRequire(join(root, 'package.json'))('node-addon-api').include_dir);
  } catch {
    return fail(
      'node-addon-api is missing: it is a devDependency, `npm ci` (or `npm install node-addon-api`) installs it',
    );
  }
}

/** The static prefix's include and library folders, or undefined without RESNET_DEPS_PREFIX. */
function staticPrefix() {
  const prefix = process.env.RESNET_DEPS_PREFIX;
  if (!prefix) return undefined;
  const include = join(prefix, 'include');
  for (const header of ['dnnl.hpp', 'jpeglib.h', 'gloo/allreduce.h']) {
    if (!existsSync(join(include, header))) fail(`RESNET_DEPS_PREFIX=${prefix} has no include/${header}`);
  }
  const lib = ['lib', 'lib64'].map((d) => join(prefix, d)).find((d) => existsSync(join(d, archives[0])));
  if (!lib) fail(`RESNET_DEPS_PREFIX=${prefix} has no lib/${archives[0]} (nor lib64/${archives[0]})`);
  for (const a of archives) if (!existsSync(join(lib, a))) fail(`RESNET_DEPS_PREFIX=${prefix} has no ${join(lib, a)}`);
  return { include, lib };
}

const what = process.argv[2];
const deps = staticPrefix();
let lines;
switch (what) {
  case 'sources':
    lines = sourceDirs
      .flatMap((dir) =>
        readdirSync(join(root, dir))
          .filter((f) => f.endsWith('.cc'))
          .sort()
          .map((f) => `${dir}/${f}`),
      )
      .filter((f) => !separateSources.includes(f));
    break;
  case 'include_dirs':
    lines = deps ? [deps.include] : [];
    break;
  case 'libraries':
    lines = deps
      ? [...archives.map((a) => join(deps.lib, a)), '-fopenmp', '-lpthread', '-ldl']
      : ['-ldnnl', `-L${systemGlooDir}`, '-lgloo', '-ljpeg', '-fopenmp', '-ldl'];
    break;
  case 'cflags':
    lines = [
      '-isystem',
      nodeAddonApiDir(),
      '-Wall',
      '-Wextra',
      '-Wpedantic',
      '-Wshadow',
      '-Wno-missing-field-initializers',
    ];
    if (envFlag('RESNET_CUDA_WERROR')) lines.push('-Werror');
    break;
  case 'version':
    lines = [JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).version];
    break;
  default:
    fail(`unknown request ${JSON.stringify(what)}: expected sources, include_dirs, libraries, cflags or version`);
}
process.stdout.write(lines.map((l) => `${l}\n`).join(''));
