#!/usr/bin/env node
// What binding.gyp compiles and links the CPU addon with, printed one item a line for gyp's
// `<!@(...)` expansion:
//
//   node scripts/gyp-deps.mjs sources        the C++ sources of the addon (native/core, cpu, image, napi)
//   node scripts/gyp-deps.mjs include_dirs   header folders of oneDNN, libjpeg-turbo and Gloo
//   node scripts/gyp-deps.mjs libraries      what the addon links: the three libraries and OpenMP, and
//                                            the run path to the shared oneDNN's folder
//   node scripts/gyp-deps.mjs cflags         those folders and node-addon-api's as system headers
//                                            (-isystem), and the warnings of CMakeLists.txt (-Werror
//                                            with RESNET_CUDA_WERROR=1)
//   node scripts/gyp-deps.mjs version        the package version (RC_VERSION)
//
// As CMakeLists.txt links them: oneDNN shared (libdnnl.so, with a run path to its folder after
// binding.gyp's $ORIGIN, as build/Release finds it in the CMake build), libjpeg-turbo and Gloo as
// static archives, from the prefixes of RESNET_DEPS_PREFIX (one or several, separated by ':', each
// with include/ and lib/ or lib64/; together they hold libdnnl.so, libjpeg.a and libgloo.a), else
// from those `scripts/deps --prefix` prints when it has installed them. Without either, or with
// RESNET_CUDA_SYSTEM_LIBS=1, they are the system's shared libraries (Debian/Ubuntu: libdnnl-dev,
// libjpeg-dev, libgloo-dev). A header or library the prefixes lack stops the build here, naming it.
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { delimiter, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
// Every .cc of these folders is part of the addon, as in CMakeLists.txt's rc_core, rc_cpu, rc_image and
// addon targets; native/cpu/optim.cc is compiled on its own (binding.gyp's rc_cpu_optim).
const sourceDirs = ['native/core', 'native/cpu', 'native/image', 'native/napi'];
const separateSources = ['native/cpu/optim.cc'];
// oneDNN is linked shared (scripts/deps installs Intel's libdnnl.so.3), the other two statically.
const archives = ['libdnnl.so', 'libgloo.a', 'libjpeg.a'];
const headers = ['dnnl.hpp', 'gloo/allreduce.h', 'jpeglib.h'];
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

/**
 * The static prefixes: RESNET_DEPS_PREFIX's list (separated by ':'), else those that
 * `scripts/deps --prefix` prints when that script is there and has built them; none with
 * RESNET_CUDA_SYSTEM_LIBS=1 or when neither gives any (then the system's packages are linked).
 */
function staticPrefixes() {
  const listed = process.env.RESNET_DEPS_PREFIX;
  if (listed) return { prefixes: listed.split(delimiter).filter(Boolean), from: 'RESNET_DEPS_PREFIX' };
  if (envFlag('RESNET_CUDA_SYSTEM_LIBS')) return undefined;
  const script = join(root, 'scripts', 'deps');
  if (!existsSync(script)) return undefined;
  const r = spawnSync('bash', [script, '--prefix'], { encoding: 'utf8' });
  const printed = r.status === 0 ? r.stdout.split('\n').filter(Boolean) : [];
  return printed.length ? { prefixes: printed, from: 'scripts/deps --prefix' } : undefined;
}

/**
 * The header folders and libraries of the prefixes, or undefined without any. Each header and
 * library may be in any one of them; one found in none stops the build, naming it.
 */
function staticDeps() {
  const found = staticPrefixes();
  if (!found) return undefined;
  const { prefixes, from } = found;
  const where = `${from} (${prefixes.join(delimiter)})`;
  const includes = new Set();
  for (const header of headers) {
    const include = prefixes.map((p) => join(p, 'include')).find((d) => existsSync(join(d, header)));
    if (!include) fail(`no include/${header} in ${where}`);
    includes.add(include);
  }
  const libs = archives.map((a) => {
    const file = prefixes.flatMap((p) => ['lib', 'lib64'].map((d) => join(p, d, a))).find((f) => existsSync(f));
    return file ?? fail(`no lib/${a} (nor lib64/${a}) in ${where}`);
  });
  return { includes: [...includes], libs };
}

const what = process.argv[2];
const deps = staticDeps();
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
    lines = deps ? deps.includes : [];
    break;
  case 'libraries':
    // The run path to oneDNN's folder comes after binding.gyp's $ORIGIN (ldflags), so that a copy
    // beside the addon wins, as in the prebuilt package.
    lines = deps
      ? [...deps.libs, `-Wl,-rpath,${dirname(deps.libs[0])}`, '-fopenmp', '-lpthread', '-ldl']
      : ['-ldnnl', `-L${systemGlooDir}`, '-lgloo', '-ljpeg', '-fopenmp', '-ldl'];
    break;
  case 'cflags':
    // The libraries' headers and node-addon-api's as system headers (as CMakeLists.txt includes
    // them), so that the warnings are about our own sources only.
    lines = [
      ...(deps ? deps.includes.flatMap((dir) => ['-isystem', dir]) : []),
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
