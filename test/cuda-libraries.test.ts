/**
 * Where the CUDA backend's libraries are found (native/napi/cuda_libraries.cc), in made-up
 * environments over temporary folder trees: the search order (explicit path, the active Python
 * environment's nvidia wheels, the cache, the system's CUDA), one place for everything when one
 * has everything, the python3 on PATH asked (and given up on after its timeout), loading with the
 * versions the libraries report (small shared libraries compiled here), and the backend's refusal
 * that names what is missing and the command that installs it.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { addon, type CudaLibrarySearch } from '../lib/binding.js';
import { defined } from './helpers/defined.js';

const root = mkdtempSync(join(tmpdir(), 'rc-cuda-libs-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const SONAMES = ['libcublasLt.so.13', 'libcublas.so.13', 'libcudnn.so.9', 'libnccl.so.2'];

let counter = 0;
/** A fresh folder under the test's root. */
function fresh(name: string): string {
  const dir = join(root, `${name}-${counter++}`);
  mkdirSync(dir, { recursive: true });
  return dir;
}

/** Empty files named like the libraries (the search without loading only checks that they exist). */
function touch(dir: string, names: readonly string[]): void {
  mkdirSync(dir, { recursive: true });
  for (const n of names) writeFileSync(join(dir, n), '');
}

/** A virtual environment's site-packages with the CUDA 13 wheels' layout for `names`. */
function venv(names: readonly string[]): { prefix: string; sitePackages: string } {
  const prefix = fresh('venv');
  const sitePackages = join(prefix, 'lib', 'python3.12', 'site-packages');
  mkdirSync(sitePackages, { recursive: true });
  const wheelDir: Record<string, string> = {
    'libcublasLt.so.13': 'cu13',
    'libcublas.so.13': 'cu13',
    'libcudnn.so.9': 'cudnn',
    'libnccl.so.2': 'nccl',
  };
  for (const n of names) touch(join(sitePackages, 'nvidia', wheelDir[n]!, 'lib'), [n]);
  return { prefix, sitePackages };
}

function search(env: Record<string, string>, load = false, pythonTimeoutMs?: number): CudaLibrarySearch {
  return addon().cudaLibraries({ env, load, ...(pythonTimeoutMs ? { pythonTimeoutMs } : {}) });
}

/** soname -> the label of the place it was found in. */
function placesOf(s: CudaLibrarySearch): Record<string, string | undefined> {
  return Object.fromEntries(s.libraries.map((l) => [l.soname, l.place]));
}

describe('the CUDA library search', () => {
  it('searches the explicit path, the Python environment, the cache, then the system, in that order', () => {
    const explicit = fresh('explicit');
    const { prefix, sitePackages } = venv([]);
    const cache = fresh('cache');
    const cudaHome = fresh('cuda-home');
    const s = search({
      RESNET_CUDA_LIBRARY_PATH: `${explicit}::${explicit}-b`,
      LD_LIBRARY_PATH: `${explicit}-ld`,
      VIRTUAL_ENV: prefix,
      RESNET_CUDA_CACHE: cache,
      CUDA_HOME: cudaHome,
    });
    touch(join(cache, 'cuda-runtime-13.0-abc', 'lib'), []);
    const s2 = search({ RESNET_CUDA_CACHE: cache, PATH: '' });
    expect(s.places.map((p) => [p.kind, p.label])).toEqual([
      ['explicit', 'RESNET_CUDA_LIBRARY_PATH'],
      ['explicit', 'LD_LIBRARY_PATH'],
      ['python', `Python environment ${sitePackages}`],
      ['system', `CUDA_HOME ${cudaHome}`],
      ['system', '/usr/local/cuda'],
      ['system', "the dynamic loader's search (ld.so.cache)"],
    ]);
    expect(s.places[0]!.dirs).toEqual([explicit, `${explicit}-b`]);
    expect(s.places[1]!.dirs).toEqual([`${explicit}-ld`]);
    expect(s.places[3]!.dirs).toEqual([join(cudaHome, 'lib64'), join(cudaHome, 'lib')]);
    expect(s2.places.map((p) => p.kind)).toEqual(['cache', 'system', 'system']);
    expect(s2.places[0]!.dirs).toEqual([join(cache, 'cuda-runtime-13.0-abc', 'lib')]);
    // Nothing anywhere: every required library is reported missing.
    expect(s.complete).toBe(false);
    expect(s.libraries.map((l) => [l.name, l.found])).toEqual([
      ['cuBLASLt', false],
      ['cuBLAS', false],
      ['cuDNN', false],
      ['NCCL', false],
      ['NVRTC', false],
      ['nvJPEG', false],
    ]);
  });

  it('takes everything from the first place that has everything, and what the explicit path has from there', () => {
    const { prefix } = venv(['libcudnn.so.9']);
    const cache = fresh('cache');
    const runtime = join(cache, 'cuda-runtime-13.0-abc', 'lib');
    touch(runtime, SONAMES);
    const cudaHome = fresh('cuda-home');
    touch(join(cudaHome, 'lib64'), SONAMES);
    const cacheLabel = `resnet-cuda install-cuda ${dirname(runtime)}`;
    // cuDNN is in the Python environment, but the cache has all four: all come from the cache.
    const one = search({ VIRTUAL_ENV: prefix, RESNET_CUDA_CACHE: cache, CUDA_HOME: cudaHome });
    expect(one.complete).toBe(true);
    expect(new Set(Object.values(placesOf(one)).filter(Boolean))).toEqual(new Set([cacheLabel]));
    expect(
      defined(
        one.libraries.find((l) => l.name === 'cuDNN'),
        'cuDNN',
      ).path,
    ).toBe(join(runtime, 'libcudnn.so.9'));
    // An explicit folder with cuDNN alone: cuDNN from there, the rest still together from the cache.
    const explicit = fresh('explicit');
    touch(explicit, ['libcudnn.so.9']);
    const two = search({ RESNET_CUDA_LIBRARY_PATH: explicit, VIRTUAL_ENV: prefix, RESNET_CUDA_CACHE: cache });
    expect(placesOf(two)).toMatchObject({
      'libcudnn.so.9': 'RESNET_CUDA_LIBRARY_PATH',
      'libcublas.so.13': cacheLabel,
      'libnccl.so.2': cacheLabel,
    });
  });

  it('mixes places only when no place has everything, and keeps cuBLAS with cuBLASLt', () => {
    // The venv has cuBLAS without cuBLASLt (an incomplete group) and NCCL; CUDA_HOME has cuBLAS, cuBLASLt, cuDNN.
    const { prefix, sitePackages } = venv(['libcublas.so.13', 'libnccl.so.2']);
    const cudaHome = fresh('cuda-home');
    touch(join(cudaHome, 'lib'), ['libcublasLt.so.13', 'libcublas.so.13', 'libcudnn.so.9']);
    const s = search({ VIRTUAL_ENV: prefix, CUDA_HOME: cudaHome });
    const home = `CUDA_HOME ${cudaHome}`;
    expect(placesOf(s)).toEqual({
      'libcublasLt.so.13': home,
      'libcublas.so.13': home,
      'libcudnn.so.9': home,
      'libnccl.so.2': `Python environment ${sitePackages}`,
      'libnvrtc.so.13': undefined,
    });
    expect(
      defined(
        s.libraries.find((l) => l.name === 'cuBLAS'),
        'cuBLAS',
      ).path,
    ).toBe(join(cudaHome, 'lib', 'libcublas.so.13'));
    expect(s.complete).toBe(true);
  });

  it("finds conda's environment and its lib folder", () => {
    const prefix = fresh('conda');
    const sitePackages = join(prefix, 'lib', 'python3.11', 'site-packages');
    touch(join(sitePackages, 'nvidia', 'cu13', 'lib'), ['libcublasLt.so.13', 'libcublas.so.13']);
    touch(join(prefix, 'lib'), ['libcudnn.so.9', 'libnccl.so.2']);
    const s = search({ CONDA_PREFIX: prefix, PATH: '' });
    expect(s.places.slice(0, 2).map((p) => p.label)).toEqual([
      `Python environment ${sitePackages}`,
      `conda environment ${prefix}/lib`,
    ]);
    expect(placesOf(s)['libcudnn.so.9']).toBe(`conda environment ${prefix}/lib`);
    expect(placesOf(s)['libcublas.so.13']).toBe(`Python environment ${sitePackages}`);
  });

  it('asks the python3 on PATH for its site-packages, and gives up on one that does not answer', () => {
    const { sitePackages } = venv(SONAMES);
    const bin = fresh('bin');
    writeFileSync(join(bin, 'python3'), `#!/bin/sh\necho /no/such/site-packages\necho ${sitePackages}\n`);
    chmodSync(join(bin, 'python3'), 0o755);
    const s = search({ PATH: `${fresh('empty')}:${bin}` });
    expect(s.places.filter((p) => p.kind === 'python').map((p) => p.label)).toEqual([
      'Python environment /no/such/site-packages',
      `Python environment ${sitePackages}`,
    ]);
    expect(placesOf(s)['libcudnn.so.9']).toBe(`Python environment ${sitePackages}`);
    expect(s.notes).toEqual([]);

    const slow = fresh('slow');
    writeFileSync(join(slow, 'python3'), `#!/bin/sh\nsleep 30\necho ${sitePackages}\n`);
    chmodSync(join(slow, 'python3'), 0o755);
    const started = Date.now();
    const late = search({ PATH: slow }, false, 300);
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(late.places.some((p) => p.kind === 'python')).toBe(false);
    expect(late.notes).toEqual([`${join(slow, 'python3')} (asked for its site-packages) did not answer within 300 ms`]);
  });

  it('refuses a bad env option by name', () => {
    expect(() => addon().cudaLibraries({ env: { PATH: 1 as unknown as string } })).toThrow(
      /option 'env'.PATH must be a string/,
    );
    expect(() => addon().cudaLibraries({ env: {}, pythonTimeoutMs: 0 })).toThrow(/option 'pythonTimeoutMs'/);
  });
});

/** Compiles a shared library with soname `soname` from C source `code` into `dir`. */
function compile(dir: string, soname: string, code: string, links: string[] = []): void {
  mkdirSync(dir, { recursive: true });
  const source = join(dir, `${soname}.c`);
  writeFileSync(source, code);
  execFileSync('cc', ['-shared', '-fPIC', `-Wl,-soname,${soname}`, '-o', join(dir, soname), source, ...links], {
    timeout: 60_000,
  });
  rmSync(source);
}

/** The four libraries, each answering its version call as the real ones do. */
function fakeLibraries(dir: string): void {
  compile(dir, 'libcublasLt.so.13', 'unsigned long cublasLtGetVersion(void) { return 130002; }\n');
  compile(
    dir,
    'libcublas.so.13',
    'int cublasGetProperty(int type, int* value) { static const int v[] = {13, 0, 2}; if (type < 0 || type > 2) return 7; *value = v[type]; return 0; }\n',
  );
  compile(dir, 'libcudnn.so.9', 'unsigned long cudnnGetVersion(void) { return 91301; }\n');
  compile(dir, 'libnccl.so.2', 'int ncclGetVersion(int* v) { *v = 22707; return 0; }\n');
}

describe('loading the CUDA libraries', () => {
  it('loads them, reads their versions, and reports one that is found but does not load', () => {
    // A file that is not a library, alone: found, not loaded, with the loader's reason.
    const broken = fresh('broken');
    writeFileSync(join(broken, 'libnccl.so.2'), 'not a shared library');
    const only = search({ RESNET_CUDA_LIBRARY_PATH: broken, PATH: '' }, true);
    const nccl = defined(
      only.libraries.find((l) => l.name === 'NCCL'),
      'NCCL',
    );
    expect(nccl).toMatchObject({ found: true, loaded: false, path: join(broken, 'libnccl.so.2') });
    expect(nccl.error).toMatch(/libnccl\.so\.2: (invalid ELF header|file too short)/);
    expect(only.complete).toBe(false);

    // The same broken file first on the path, good libraries in the venv: NCCL falls back to those.
    const { prefix, sitePackages } = venv([]);
    fakeLibraries(join(sitePackages, 'nvidia', 'all', 'lib'));
    const s = search({ RESNET_CUDA_LIBRARY_PATH: broken, VIRTUAL_ENV: prefix }, true);
    expect(s.complete).toBe(true);
    expect(s.loaded).toBe(true);
    const lib = join(sitePackages, 'nvidia', 'all', 'lib');
    expect(s.libraries.filter((l) => l.required).map((l) => [l.name, l.version, l.path, l.loaded])).toEqual([
      ['cuBLASLt', '13.0.2', join(lib, 'libcublasLt.so.13'), true],
      ['cuBLAS', '13.0.2', join(lib, 'libcublas.so.13'), true],
      ['cuDNN', '9.13.1', join(lib, 'libcudnn.so.9'), true],
      ['NCCL', '2.27.7', join(lib, 'libnccl.so.2'), true],
    ]);
  });
});

describe('the CUDA backend without its libraries', () => {
  const backend = join(import.meta.dirname, '..', 'build', 'Release', 'libresnet_cuda_backend.so');
  it.skipIf(!existsSync(backend))(
    'names each missing library, where it looked, and the command that installs them',
    () => {
      // A stand-in for the driver, so that the backend gets as far as its libraries.
      const driver = fresh('driver');
      compile(driver, 'libcuda.so.1', 'int cuDriverGetVersion(int* v) { *v = 13000; return 0; }\n');
      const home = fresh('home');
      const program = `
      const { listBackends } = await import(${JSON.stringify(join(import.meta.dirname, '..', 'dist', 'lib', 'device.js'))});
      console.log(JSON.stringify(listBackends().find((b) => b.name === 'cuda')));`;
      const child = spawnSync(process.execPath, ['--input-type=module', '-e', program], {
        encoding: 'utf8',
        timeout: 60_000,
        env: { HOME: home, RESNET_CUDA_CACHE: join(home, 'cache'), LD_LIBRARY_PATH: driver, PATH: '' },
      });
      expect(child.stderr).toBe('');
      const cuda = JSON.parse(child.stdout) as { available: boolean; reason: string };
      expect(cuda.available).toBe(false);
      expect(cuda.reason).toContain(
        'CUDA libraries it needs are missing: cuBLASLt (libcublasLt.so.13) was not found; cuBLAS (libcublas.so.13) was not found; cuDNN (libcudnn.so.9) was not found; NCCL (libnccl.so.2) was not found',
      );
      expect(cuda.reason).toContain(
        `Looked in, in this order: LD_LIBRARY_PATH, /usr/local/cuda, the dynamic loader's search`,
      );
      expect(cuda.reason).toContain('`npx resnet-cuda install-cuda`');
    },
  );
});
