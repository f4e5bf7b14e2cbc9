#!/usr/bin/env node
// The package's `install` step: make sure a loadable native addon exists.
//
//   1. A binary that loads already (build/Release/ or prebuilds/<platform>-<arch>/): nothing to do.
//   2. A source tree with cmake-js at hand (this repository after `npm ci`): build it with CMake.
//   3. Otherwise: explain what is missing and fail.
//
// `node scripts/install.mjs --build` always builds from source (`npm run build:native`).
//
// The CUDA backend (build/Release/libresnet_cuda_backend.so) is built too when a CUDA 13 toolkit
// with cuDNN and NCCL is at hand: the SDK of scripts/setup-cuda-sdk (or the system toolkit it
// accepts), else whatever CMake finds through CUDA_HOME / CUDA_PATH / /usr/local/cuda.
//
// Environment:
//   RESNET_CUDA_SKIP_NATIVE_BUILD=1  do nothing at all.
//   RESNET_CUDA_FORBID_BUILD=1       fail instead of compiling (checks that a prebuilt binary is used).
//   RESNET_CUDA_BUILD_CUDA=1 / =0    require / skip the CUDA backend (default: build it when possible).
//   RESNET_CUDA_SYSTEM_LIBS=1        link the system's oneDNN, libjpeg and Gloo (Debian: libdnnl-dev,
//                                    libjpeg-dev, libgloo-dev) instead of the pinned ones of
//                                    scripts/deps (the default; installed once into its cache).
//   RESNET_CUDA_WERROR=1             compiler warnings are errors (CI sets it; off by default, so that a
//                                    newer compiler's new warnings do not break an install).
//
// The build uses the headers of the Node.js that runs this script (<prefix>/include/node) and never
// downloads Node.js headers: when they are absent, it falls back to the Node-API headers of the
// `node-api-headers` package, which is all the addon includes.
import { spawnSync } from 'node:child_process';
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  realpathSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const tuple = `${process.platform}-${process.arch}`;
const forceBuild = process.argv.includes('--build');
const log = (line) => console.log(`resnet-cuda: ${line}`);
const rel = (path) => relative(root, path) || '.';

function fail(lines, code = 1) {
  console.error(['', ...lines.map((l) => `resnet-cuda: ${l}`), ''].join('\n'));
  process.exit(code);
}

function envFlag(name) {
  const value = process.env[name];
  return value !== undefined && value !== '' && value !== '0' && value.toLowerCase() !== 'false';
}

/** Finds and loads the addon the way the package does at run time, in a child process. */
function probe() {
  const code = `
    const path = require('node:path');
    const root = process.argv[1];
    const out = (o) => process.stdout.write(JSON.stringify(o));
    let file;
    try {
      file = require('node:module').createRequire(path.join(root, 'package.json'))('node-gyp-build').resolve(root);
    } catch (e) { out({ found: false, error: String(e && e.message || e) }); process.exit(0); }
    try { const addon = require(file); out({ found: true, loaded: true, file, version: addon.version }); }
    catch (e) { out({ found: true, loaded: false, file, error: String(e && e.message || e) }); }
  `;
  const r = spawnSync(process.execPath, ['-e', code, root], { cwd: root, encoding: 'utf8' });
  try {
    return JSON.parse(r.stdout);
  } catch {
    const why = r.signal ? `signal ${r.signal}` : `exit code ${r.status}`;
    return { found: true, loaded: false, error: `loading the addon crashed (${why})\n${r.stderr.trim()}` };
  }
}

/** cmake-js and node-addon-api as seen from the package root, or why the source build is impossible. */
function buildTools() {
  const missing = [];
  for (const f of ['CMakeLists.txt', 'native']) if (!existsSync(join(root, f))) missing.push(f);
  const req = createRequire(join(root, 'package.json'));
  let cmakeJs;
  try {
    const pkgFile = req.resolve('cmake-js/package.json');
    const bin = req(pkgFile).bin;
    cmakeJs = join(dirname(pkgFile), typeof bin === 'string' ? bin : bin['cmake-js']);
  } catch {
    missing.push('cmake-js (a devDependency)');
  }
  try {
    req.resolve('node-addon-api');
  } catch {
    missing.push('node-addon-api (a devDependency)');
  }
  return { cmakeJs, missing };
}

function hasNodeHeaders(prefix) {
  return (
    Boolean(prefix) &&
    existsSync(join(prefix, 'include/node/node.h')) &&
    existsSync(join(prefix, 'include/node/node_api.h'))
  );
}

/**
 * A `nodedir` for cmake-js that holds include/node/: the running Node's own prefix when it ships its
 * headers, else a folder under build/ filled from `node-api-headers`.
 */
function nodeDir(cmakeJs) {
  const prefix = (exe) => dirname(dirname(exe));
  const candidates = [
    ...new Set([process.env.npm_config_nodedir, prefix(process.execPath), prefix(realpathSync(process.execPath))]),
  ];
  for (const prefix of candidates) {
    if (hasNodeHeaders(prefix)) return { dir: prefix, what: `Node.js headers in ${join(prefix, 'include/node')}` };
  }

  const cmakeJsRequire = createRequire(join(dirname(dirname(cmakeJs)), 'package.json'));
  const includeDir = cmakeJsRequire('node-api-headers').include_dir;
  const dir = join(root, 'build', 'node-api-headers');
  const target = join(dir, 'include', 'node');
  mkdirSync(target, { recursive: true });
  for (const f of readdirSync(includeDir)) if (f.endsWith('.h')) copyFileSync(join(includeDir, f), join(target, f));
  // cmake-js checks for node.h before it would download headers; the addon itself includes only Node-API.
  writeFileSync(join(target, 'node.h'), '#error "resnet-cuda builds against Node-API only (node_api.h)"\n');
  return {
    dir,
    what: `Node-API headers from node-api-headers (no Node.js headers under ${candidates.filter(Boolean).join(', ')})`,
  };
}

/**
 * What to tell CMake about CUDA: RC_CUDA (AUTO, ON or OFF) and RC_CUDA_ROOT. In a source checkout,
 * the toolkit is the one scripts/setup-cuda-sdk reports (its SDK, or a system CUDA 13 with cuDNN and
 * NCCL), and without one the build is CPU only; elsewhere CMake looks at CUDA_HOME, CUDA_PATH and
 * /usr/local/cuda itself. The root is always passed explicitly because CMake would otherwise keep
 * the one cached by an earlier configuration (cmake-js cannot pass an empty value).
 */
function cudaOptions() {
  const wanted = process.env.RESNET_CUDA_BUILD_CUDA;
  const mode = wanted === undefined || wanted === '' ? 'AUTO' : envFlag('RESNET_CUDA_BUILD_CUDA') ? 'ON' : 'OFF';
  if (mode === 'OFF') {
    return { enabled: false, args: ['--CDRC_CUDA=OFF'], what: 'without the CUDA backend (RESNET_CUDA_BUILD_CUDA=0)' };
  }
  const script = join(root, 'scripts', 'setup-cuda-sdk');
  if (!existsSync(script)) {
    return {
      enabled: true,
      args: [`--CDRC_CUDA=${mode}`],
      what: 'with the CUDA backend if CMake finds a CUDA 13 toolkit (CUDA_HOME)',
    };
  }
  const r = spawnSync('bash', [script, '--print-root'], { cwd: root, encoding: 'utf8' });
  const cudaRoot = r.status === 0 ? (r.stdout.trim().split('\n').pop() ?? '') : '';
  if (cudaRoot) {
    return {
      enabled: true,
      cudaRoot,
      args: [`--CDRC_CUDA=${mode}`, `--CDRC_CUDA_ROOT=${cudaRoot}`],
      what: `with the CUDA backend (toolkit ${cudaRoot})`,
    };
  }
  if (mode === 'ON') {
    fail([
      'RESNET_CUDA_BUILD_CUDA=1, but there is no CUDA 13 toolkit with cuDNN and NCCL to build the CUDA backend with',
      '(scripts/setup-cuda-sdk --print-root found none): run scripts/setup-cuda-sdk first, or set CUDA_HOME.',
    ]);
  }
  return {
    enabled: false,
    args: ['--CDRC_CUDA=OFF'],
    what: 'CPU only (no CUDA toolkit: scripts/setup-cuda-sdk installs one)',
  };
}

/**
 * The CPU libraries to link: oneDNN from Intel's pinned wheels and the static libjpeg-turbo and Gloo
 * that scripts/deps builds from pinned sources into its cache (installed here when missing: once, a
 * few minutes), or with RESNET_CUDA_SYSTEM_LIBS=1 the system's packages.
 */
function cpuLibraries() {
  if (envFlag('RESNET_CUDA_SYSTEM_LIBS')) {
    log("linking the system's oneDNN, libjpeg and Gloo (RESNET_CUDA_SYSTEM_LIBS=1)");
    return { system: true };
  }
  const script = join(root, 'scripts', 'deps');
  if (!existsSync(script)) {
    fail([`${rel(script)} is missing: it installs the CPU libraries (or set RESNET_CUDA_SYSTEM_LIBS=1).`]);
  }
  const ready = spawnSync('bash', [script, '--prefix'], { cwd: root, encoding: 'utf8' });
  if (ready.status !== 0) {
    log('installing the CPU libraries (oneDNN, libjpeg-turbo, Gloo) with scripts/deps, once');
    const r = spawnSync('bash', [script], { cwd: root, stdio: 'inherit' });
    if (r.status !== 0) {
      fail([
        `scripts/deps failed (${r.signal ? `signal ${r.signal}` : `exit code ${r.status}`}): it needs curl, unzip, CMake,`,
        'a C++17 compiler and nasm; or build against the system packages with RESNET_CUDA_SYSTEM_LIBS=1.',
      ]);
    }
  }
  return { system: false };
}

/** The value of a variable in build/CMakeCache.txt, or undefined when it is not there. */
function cachedValue(name) {
  const cache = join(root, 'build', 'CMakeCache.txt');
  if (!existsSync(cache)) return undefined;
  const line = readFileSync(cache, 'utf8')
    .split('\n')
    .find((l) => l.startsWith(`${name}:`));
  return line === undefined ? undefined : line.slice(line.indexOf('=') + 1);
}

function build(cmakeJs) {
  if (envFlag('RESNET_CUDA_FORBID_BUILD')) {
    fail([
      `RESNET_CUDA_FORBID_BUILD is set, but this install would compile the native addon from source`,
      `(no loadable binary for ${tuple} in ${rel(join(root, 'build/Release'))}/ or ${rel(join(root, 'prebuilds', tuple))}/).`,
    ]);
  }
  const cuda = cudaOptions();
  // CMake keeps the CUDA compiler it first detected for the life of a build folder (RC_CUDA_NVCC
  // records it), so a change of toolkit starts the configuration afresh.
  const previous = cachedValue('RC_CUDA_NVCC');
  if (cuda.enabled && previous) {
    const candidates = cuda.cudaRoot
      ? [cuda.cudaRoot]
      : [process.env.CUDA_HOME, process.env.CUDA_PATH, '/usr/local/cuda'];
    const toolkit = candidates.find((dir) => dir && existsSync(join(dir, 'bin', 'nvcc')));
    if (toolkit && previous !== join(realpathSync(toolkit), 'bin', 'nvcc')) {
      log(`the CUDA toolkit changed (${previous} -> ${join(toolkit, 'bin', 'nvcc')}): configuring build/ afresh`);
      for (const f of ['CMakeCache.txt', 'CMakeFiles']) {
        rmSync(join(root, 'build', f), { recursive: true, force: true });
      }
    }
  }
  const cpuLibs = cpuLibraries();
  const headers = nodeDir(cmakeJs);
  const jobs = String(Math.max(1, availableParallelism()));
  const werror = envFlag('RESNET_CUDA_WERROR');
  log(
    `building the native addon from source with CMake (${jobs} jobs${werror ? ', warnings as errors' : ''}) ${cuda.what}, using ${headers.what}`,
  );
  const env = { ...process.env, npm_config_nodedir: headers.dir };
  // Configured every time, so that the CUDA settings above always apply (cmake-js alone configures
  // only a new build folder); an unchanged configuration rebuilds nothing.
  // The emulated CUDA backend is a test tool: built in a source checkout (which has the tests),
  // unless RESNET_CUDA_BUILD_EMULATOR=0.
  const emulatorWanted = process.env.RESNET_CUDA_BUILD_EMULATOR;
  const emulator =
    emulatorWanted === undefined || emulatorWanted === ''
      ? existsSync(join(root, 'test', 'cuda-emulator'))
      : envFlag('RESNET_CUDA_BUILD_EMULATOR');
  // RC_WERROR is passed every time too, so that a value cached by an earlier build does not stay.
  const steps = [
    [
      cmakeJs,
      'configure',
      '--out',
      'build',
      ...cuda.args,
      `--CDRC_CUDA_EMULATOR=${emulator ? 'ON' : 'OFF'}`,
      `--CDRC_WERROR=${werror ? 'ON' : 'OFF'}`,
      `--CDRC_SYSTEM_LIBS=${cpuLibs.system ? 'ON' : 'OFF'}`,
    ],
    [cmakeJs, 'build', '--out', 'build', '--parallel', jobs],
  ];
  for (const args of steps) {
    const r = spawnSync(process.execPath, args, { cwd: root, stdio: 'inherit', env });
    if (r.error) fail([`could not run cmake-js: ${r.error.message}`]);
    if (r.status !== 0) {
      fail(
        [
          `the native ${args[1]} step failed (${r.signal ? `signal ${r.signal}` : `exit code ${r.status}`}).`,
          'It needs CMake >= 3.18, a C++17 compiler with OpenMP, and the oneDNN, libjpeg-turbo and Gloo of',
          'scripts/deps (on Debian: apt-get install cmake make g++ nasm curl unzip; scripts/setup in the source',
          'repository runs all of it); with RESNET_CUDA_SYSTEM_LIBS=1, a oneDNN 3.x (Debian 13: libdnnl-dev)',
          'libgloo-dev ocl-icd-opencl-dev libjpeg-dev instead.',
          ...(cuda.enabled
            ? [
                'The CUDA backend (native/cuda) is part of this build; RESNET_CUDA_BUILD_CUDA=0 builds the CPU backend only.',
              ]
            : []),
        ],
        r.status || 1,
      );
    }
  }
  const after = probe();
  if (!after.loaded) fail([`the build finished, but the addon does not load:`, after.error ?? 'not found']);
  log(`addon ready: ${rel(after.file)} (native ${after.version})`);
}

if (envFlag('RESNET_CUDA_SKIP_NATIVE_BUILD')) {
  log('RESNET_CUDA_SKIP_NATIVE_BUILD is set: skipping the native addon');
  process.exit(0);
}

const tools = buildTools();
if (forceBuild) {
  if (tools.missing.length) {
    fail([
      `cannot build from source: missing ${tools.missing.join(', ')}.`,
      'Run `npm ci` in a source checkout first.',
    ]);
  }
  build(tools.cmakeJs);
  process.exit(0);
}

const found = probe();
if (found.loaded) {
  log(`using ${rel(found.file)} (native ${found.version})`);
  process.exit(0);
}
if (tools.missing.length === 0) {
  if (found.found) log(`${rel(found.file)} does not load, rebuilding:\n${found.error}`);
  build(tools.cmakeJs);
  process.exit(0);
}

if (found.found) {
  // The loader's hint (dist/lib/addon-load-hint.js, in the package): the cause and the command.
  const hintModule = join(root, 'dist', 'lib', 'addon-load-hint.js');
  const { version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
  const hint = existsSync(hintModule)
    ? (await import(pathToFileURL(hintModule).href)).addonLoadHint(new Error(found.error), { root, version })
    : '';
  fail([
    `the prebuilt native addon ${rel(found.file)} does not load:`,
    found.error,
    ...hint.split('\n').filter(Boolean),
  ]);
}
fail([
  `no prebuilt native addon matches ${tuple} (Node ${process.versions.node}), and this is not a source checkout`,
  `that can be built here (missing: ${tools.missing.join(', ')}).`,
  'Prebuilt binaries ship for linux-x64 (glibc). To build from source, clone the repository and run',
  '`bash scripts/setup` (Debian/Ubuntu: installs CMake and g++, installs oneDNN 3.2 with scripts/deps, then `npm ci`), or, with those',
  'installed, `npm ci && npm run build:native`. To install without the addon: RESNET_CUDA_SKIP_NATIVE_BUILD=1.',
]);
