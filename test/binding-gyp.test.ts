import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { defined } from './helpers/defined.js';

// The node-gyp build itself runs in CI (scripts/gyp-check.mjs: minutes of compiling); these check
// that binding.gyp builds what CMakeLists.txt builds, and how it finds the libraries.
const root = fileURLToPath(new URL('..', import.meta.url));
const cmake = readFileSync(join(root, 'CMakeLists.txt'), 'utf8');
const gyp = readFileSync(join(root, 'binding.gyp'), 'utf8');

/** Runs scripts/gyp-deps.mjs with `env` over this process's environment (undefined: unset). */
function gypDeps(what: string, env: Record<string, string | undefined> = {}) {
  const merged = Object.fromEntries(
    Object.entries({ ...process.env, ...env }).filter((e): e is [string, string] => e[1] !== undefined),
  );
  return spawnSync(process.execPath, [join(root, 'scripts/gyp-deps.mjs'), what], { encoding: 'utf8', env: merged });
}

/** The source files of the CMake target `name` (its add_library list). */
function cmakeSources(name: string): string[] {
  const block = new RegExp(`add_library\\(${name.replace(/[${}]/g, '\\$&')} (?:STATIC|SHARED)([^)]*)\\)`).exec(cmake);
  return defined(block?.[1], `add_library(${name}) in CMakeLists.txt`)
    .split(/\s+/)
    .filter((f) => f.startsWith('native/'));
}

describe('binding.gyp', () => {
  it('compiles the sources of the CMake addon, less the CUDA backend', () => {
    const fromCmake = ['rc_core', 'rc_cpu', 'rc_image', '${PROJECT_NAME}'].flatMap(cmakeSources).sort();
    const listed = gypDeps('sources');
    expect(listed.status, listed.stderr).toBe(0);
    const fromGyp = [...listed.stdout.trim().split('\n'), 'native/cpu/optim.cc'].sort();
    expect(fromGyp).toEqual(fromCmake);
    expect(gyp).toContain("'sources': ['native/cpu/optim.cc']");
    expect(gyp).toContain("'cflags': ['-fno-math-errno']");
  });

  it('has the defines of the CMake addon', () => {
    const definitions = defined(
      /target_compile_definitions\(\$\{PROJECT_NAME\} PRIVATE([^)]*)\)/.exec(cmake)?.[1],
      "the addon's target_compile_definitions",
    );
    const defines = definitions.split(/\s+/).filter(Boolean);
    expect(defines).toContain('RC_VERSION="${RC_VERSION}"');
    for (const d of defines) {
      expect(gyp).toContain(d === 'RC_VERSION="${RC_VERSION}"' ? `'RC_VERSION="<(rc_version)"'` : `'${d}'`);
    }
    const version = gypDeps('version');
    expect(version.stdout.trim()).toBe(
      (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version: string }).version,
    );
  });

  it("links the system's libraries with RESNET_CUDA_SYSTEM_LIBS=1", () => {
    const system = { RESNET_DEPS_PREFIX: undefined, RESNET_CUDA_SYSTEM_LIBS: '1' };
    const libs = gypDeps('libraries', system);
    expect(libs.status, libs.stderr).toBe(0);
    expect(libs.stdout.trim().split('\n')).toEqual(expect.arrayContaining(['-ldnnl', '-lgloo', '-ljpeg', '-fopenmp']));
    expect(gypDeps('include_dirs', system).stdout).toBe('');
  });

  it("links the libraries of RESNET_DEPS_PREFIX's prefixes, and names what they lack", () => {
    // Two prefixes, as scripts/deps installs one per library: oneDNN and Gloo in one, libjpeg in the other.
    const top = mkdtempSync(join(tmpdir(), 'resnet-cuda-deps-prefix-'));
    const a = join(top, 'a');
    const b = join(top, 'b');
    try {
      mkdirSync(join(a, 'include', 'gloo'), { recursive: true });
      mkdirSync(join(b, 'include'), { recursive: true });
      const prefixes = { RESNET_DEPS_PREFIX: `${a}:${b}` };
      const missingHeader = gypDeps('libraries', prefixes);
      expect(missingHeader.status).toBe(1);
      expect(missingHeader.stderr).toContain(`no include/dnnl.hpp in RESNET_DEPS_PREFIX (${a}:${b})`);

      for (const h of ['dnnl.hpp', 'gloo/allreduce.h']) writeFileSync(join(a, 'include', h), '');
      writeFileSync(join(b, 'include', 'jpeglib.h'), '');
      mkdirSync(join(a, 'lib64'));
      mkdirSync(join(b, 'lib'));
      writeFileSync(join(a, 'lib64', 'libdnnl.so'), '');
      writeFileSync(join(a, 'lib64', 'libgloo.a'), '');
      const missingArchive = gypDeps('libraries', prefixes);
      expect(missingArchive.status).toBe(1);
      expect(missingArchive.stderr).toContain('no lib/libjpeg.a (nor lib64/libjpeg.a) in RESNET_DEPS_PREFIX');
      rmSync(join(a, 'lib64', 'libdnnl.so'));
      writeFileSync(join(b, 'lib', 'libjpeg.a'), '');
      const missingDnnl = gypDeps('libraries', prefixes);
      expect(missingDnnl.status).toBe(1);
      expect(missingDnnl.stderr).toContain('no lib/libdnnl.so (nor lib64/libdnnl.so) in RESNET_DEPS_PREFIX');
      writeFileSync(join(a, 'lib64', 'libdnnl.so'), '');
      const libs = gypDeps('libraries', prefixes);
      expect(libs.status, libs.stderr).toBe(0);
      const lines = libs.stdout.trim().split('\n');
      // oneDNN shared, with a run path to its folder; Gloo and libjpeg-turbo static.
      expect(lines.slice(0, 4)).toEqual([
        join(a, 'lib64', 'libdnnl.so'),
        join(a, 'lib64', 'libgloo.a'),
        join(b, 'lib', 'libjpeg.a'),
        `-Wl,-rpath,${join(a, 'lib64')}`,
      ]);
      expect(lines).not.toContain('-ldnnl');
      expect(gypDeps('include_dirs', prefixes).stdout.trim().split('\n')).toEqual([
        join(a, 'include'),
        join(b, 'include'),
      ]);
      // Their headers are system headers: the warnings (-Wshadow, -Werror) are about our sources only.
      const cflags = gypDeps('cflags', prefixes).stdout.trim().split('\n').join(' ');
      expect(cflags).toContain(`-isystem ${join(a, 'include')} -isystem ${join(b, 'include')}`);
    } finally {
      rmSync(top, { recursive: true, force: true });
    }
  });

  it('adds -Werror with RESNET_CUDA_WERROR=1 only', () => {
    expect(gypDeps('cflags', { RESNET_CUDA_WERROR: '1' }).stdout.split('\n')).toContain('-Werror');
    expect(gypDeps('cflags', { RESNET_CUDA_WERROR: undefined }).stdout.split('\n')).not.toContain('-Werror');
  });
});
