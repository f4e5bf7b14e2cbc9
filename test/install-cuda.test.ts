/**
 * `resnet-cuda install-cuda` against a local stand-in for PyPI's JSON API (an HTTP server in this
 * process serving small wheels made here): the shared libraries unpacked, nothing else; the CUDA
 * library search finding them in the cache; a second run doing nothing; a wheel whose digest does
 * not match refused with nothing left behind; no wheel for this machine reported by name; and
 * scripts/setup-cuda-sdk --runtime producing the same folder under the same key.
 */
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addon } from '../lib/binding.js';
import { installCudaRuntime } from '../lib/cuda-runtime/install.js';
import { RUNTIME_MARKER, parsePins, runtimeKey, runtimePins, type WheelPin } from '../lib/cuda-runtime/pins.js';
import { extractWheelLibraries } from '../lib/cuda-runtime/wheel.js';
import { runCli } from './helpers/cli.js';
import { makeZip } from './helpers/zip-writer.js';

const dir = mkdtempSync(join(tmpdir(), 'rc-install-cuda-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** What each pinned runtime wheel holds in the stand-in index: libraries, plus files that must not be unpacked. */
const CONTENTS: Record<string, string[]> = {
  'nvidia-cublas': [
    'nvidia/cu13/lib/libcublas.so.13',
    'nvidia/cu13/lib/libcublasLt.so.13',
    'nvidia/cu13/include/cublas.h',
  ],
  'nvidia-cudnn-cu13': [
    'nvidia/cudnn/lib/libcudnn.so.9',
    'nvidia/cudnn/lib/libcudnn_ops.so.9',
    'nvidia/cudnn/include/cudnn.h',
  ],
  'nvidia-nccl-cu13': ['nvidia/nccl/lib/libnccl.so.2', 'nvidia/nccl/include/nccl.h'],
  'nvidia-nvjpeg': ['nvidia/cu13/lib/libnvjpeg.so.13', 'nvidia/cu13/include/nvjpeg.h'],
};

/** A wheel of `pin`: its files (each holding its own name, deflated) and a dist-info. */
function wheel(pin: WheelPin): Buffer {
  const files = CONTENTS[pin.name] ?? [`nvidia/${pin.name}/lib/lib${pin.name}.so.1`];
  return makeZip([
    ...files.map((name) => ({ name, data: Buffer.from(`${name} `.repeat(200)), deflate: true })),
    { name: `${pin.name.replace(/-/g, '_')}-${pin.version}.dist-info/METADATA`, data: Buffer.from('Name: x\n') },
  ]);
}

function wheelName(pin: WheelPin, machine = 'x86_64'): string {
  return `${pin.name.replace(/-/g, '_')}-${pin.version}-py3-none-manylinux_2_27_${machine}.whl`;
}

/** The stand-in index: `/pypi/<name>/<version>/json` and `/files/<wheel>`; `tamper` names lie about their digest. */
interface Index {
  url: string;
  requests: string[];
  tamper: Set<string>;
  /** Release names that have only an aarch64 wheel. */
  armOnly: Set<string>;
  /** Serve only the project documents (`/pypi/<name>/json`, all releases), with relative file addresses, as some mirrors do. */
  projectOnly: boolean;
}

let server: Server;
const index: Index = { url: '', requests: [], tamper: new Set(), armOnly: new Set(), projectOnly: false };
const wheels = new Map<string, Buffer>();

beforeAll(async () => {
  server = createServer((req, res) => {
    const path = req.url ?? '';
    index.requests.push(path);
    const release = /^\/pypi\/([^/]+)\/([^/]+)\/json$/.exec(path);
    const project = /^\/pypi\/([^/]+)\/json$/.exec(path);
    if ((release && !index.projectOnly) || (project && index.projectOnly)) {
      const projectName = project?.[1] ?? '';
      const pin: WheelPin = release
        ? { name: release[1]!, version: release[2]!, role: 'runtime' }
        : (runtimePins().find((p) => p.name === projectName) ?? { name: projectName, version: '1.0', role: 'runtime' });
      const name = wheelName(pin, index.armOnly.has(pin.name) ? 'aarch64' : 'x86_64');
      const bytes = wheel(pin);
      wheels.set(name, bytes);
      const sha256 = createHash('sha256')
        .update(index.tamper.has(pin.name) ? Buffer.from('something else') : bytes)
        .digest('hex');
      const files = [
        {
          filename: `${name.replace(/-py3-.*/, '')}.tar.gz`,
          url: `${index.url}/files/x.tar.gz`,
          packagetype: 'sdist',
          digests: { sha256 },
        },
        {
          filename: name,
          url: index.projectOnly ? `../../files/${name}` : `${index.url}/files/${name}`,
          packagetype: 'bdist_wheel',
          digests: { sha256 },
        },
      ];
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify(release ? { urls: files } : { releases: { '0.1': [], [pin.version]: files } }));
      return;
    }
    const file = /^\/files\/(.+)$/.exec(path);
    const bytes = file ? wheels.get(file[1]!) : undefined;
    if (bytes === undefined) {
      res.statusCode = 404;
      res.end('not found');
      return;
    }
    res.end(bytes);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('the stand-in index has no port');
  index.url = `http://127.0.0.1:${address.port}`;
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

/** Every file and folder under `root`, relative. */
function tree(root: string): string[] {
  return readdirSync(root, { recursive: true, encoding: 'utf8' }).sort();
}

describe('install-cuda', () => {
  it('unpacks only the shared libraries of the pinned wheels, where the CUDA library search finds them', async () => {
    const cache = join(dir, 'cache');
    const run = await runCli(['install-cuda', '--cache-dir', cache, '--index-url', `${index.url}/pypi`], dir);
    expect(run.stderr).toContain('unpacked 6 libraries from 4 downloaded wheels');
    expect(run.code).toBe(0);
    const runtimeDir = join(cache, `cuda-runtime-${runtimeKey(runtimePins())}`);
    expect(run.stdout).toBe(`${join(runtimeDir, 'lib')}\n`);
    expect(run.stderr).toContain(`run with RESNET_CUDA_CACHE=${cache}`);
    expect(tree(runtimeDir)).toEqual([
      'lib',
      'lib/libcublas.so.13',
      'lib/libcublasLt.so.13',
      'lib/libcudnn.so.9',
      'lib/libcudnn_ops.so.9',
      'lib/libnccl.so.2',
      'lib/libnvjpeg.so.13',
      RUNTIME_MARKER,
    ]);
    expect(readFileSync(join(runtimeDir, 'lib', 'libcudnn_ops.so.9'), 'utf8')).toBe(
      'nvidia/cudnn/lib/libcudnn_ops.so.9 '.repeat(200),
    );
    expect(readFileSync(join(runtimeDir, RUNTIME_MARKER), 'utf8')).toContain('nvidia-cudnn-cu13==');
    // Only the finished folder and the checked wheels are left.
    expect(readdirSync(cache).sort()).toEqual([`cuda-runtime-${runtimeKey(runtimePins())}`, 'wheels']);

    const found = addon().cudaLibraries({ env: { RESNET_CUDA_CACHE: cache, PATH: '' } });
    expect(found.complete).toBe(true);
    for (const l of found.libraries.filter((x) => x.required)) {
      expect(l.path).toBe(join(runtimeDir, 'lib', l.soname));
      expect(l.place).toBe(`resnet-cuda install-cuda ${runtimeDir}`);
    }

    // A second run finds the folder complete and asks nothing.
    const requests = index.requests.length;
    const again = await runCli(['install-cuda', '--cache-dir', cache, '--index-url', `${index.url}/pypi`], dir);
    expect(again.code).toBe(0);
    expect(again.stderr).toContain('the CUDA libraries are in place already');
    expect(index.requests.length).toBe(requests);

    // --reinstall unpacks again from the cached wheels (their digests checked), downloading nothing.
    const before = index.requests.filter((r) => r.startsWith('/files/')).length;
    const re = await runCli(
      ['install-cuda', '--cache-dir', cache, '--index-url', `${index.url}/pypi`, '--reinstall'],
      dir,
    );
    expect(re.code).toBe(0);
    expect(re.stderr).toContain('unpacked 6 libraries\n');
    expect(index.requests.filter((r) => r.startsWith('/files/')).length).toBe(before);
  });

  it('refuses a wheel whose sha256 does not match the index, leaving nothing behind', async () => {
    const cache = join(dir, 'tampered');
    index.tamper.add('nvidia-cudnn-cu13');
    try {
      const run = await runCli(['install-cuda', '--cache-dir', cache, '--index-url', `${index.url}/pypi`], dir);
      expect(run.code).toBe(1);
      expect(run.stderr).toMatch(
        /nvidia_cudnn_cu13-[^ ]+\.whl from http:\/\/127\.0\.0\.1:\d+\/files\/\S+ has sha256 [0-9a-f]{64}, but the index says [0-9a-f]{64}; it was deleted, nothing was installed/,
      );
      // The wheels that checked out stay for the next run; no partial download, staging or runtime folder.
      expect(tree(cache)).toEqual(['wheels', `wheels/${wheelName(runtimePins()[0]!)}`]);
    } finally {
      index.tamper.clear();
    }
  });

  it('says so when a release has no wheel for this machine, or the index is not a PyPI JSON API', async () => {
    const pins = parsePins('nvidia-fake==1.0 runtime\n', 'test');
    index.armOnly.add('nvidia-fake');
    try {
      await expect(
        installCudaRuntime({ cacheDir: join(dir, 'arm'), indexUrl: `${index.url}/pypi`, pins, machine: 'x86_64' }),
      ).rejects.toThrow(
        /nvidia-fake==1\.0 has no manylinux x86_64 wheel at .*\(files: nvidia_fake-1\.0\.tar\.gz, nvidia_fake-1\.0-py3-none-manylinux_2_27_aarch64\.whl\)/,
      );
      const arm = await installCudaRuntime({
        cacheDir: join(dir, 'arm'),
        indexUrl: `${index.url}/pypi`,
        pins,
        machine: 'aarch64',
      });
      expect(tree(arm.libDir)).toEqual(['libnvidia-fake.so.1']);
    } finally {
      index.armOnly.clear();
    }
    const notAnIndex = installCudaRuntime({ cacheDir: join(dir, 'x'), indexUrl: `${index.url}/files`, pins });
    await expect(notAnIndex).rejects.toThrow(/\/files\/nvidia-fake\/1\.0\/json: HTTP 404/);
    await expect(notAnIndex).rejects.toHaveProperty('code', 'ERR_RC_DOWNLOAD');
    const bad = await runCli(['install-cuda', '--index-url', 'ftp://example.org'], dir);
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toContain("--index-url must be an http(s) URL, got 'ftp://example.org'");
  });

  it("reads a mirror that serves only the project's document, with relative file addresses", async () => {
    const cache = join(dir, 'mirror');
    index.projectOnly = true;
    try {
      const run = await runCli(['install-cuda', '--cache-dir', cache, '--index-url', `${index.url}/pypi`], dir);
      expect(run.stderr).toContain('unpacked 6 libraries from 4 downloaded wheels');
      expect(run.code).toBe(0);
      expect(index.requests).toContain(`/pypi/nvidia-cudnn-cu13/json`);
      expect(index.requests).toContain(`/files/${wheelName(runtimePins()[1]!)}`);
    } finally {
      index.projectOnly = false;
    }
  });

  it('unpacks zip64 wheels and refuses a damaged member', async () => {
    const good = join(dir, 'z64.whl');
    const bytes = makeZip([{ name: 'nvidia/x/lib/libx.so.1', data: Buffer.from('x'.repeat(5000)), deflate: true }], {
      zip64: true,
    });
    writeFileSync(good, bytes);
    mkdirSync(join(dir, 'z64'));
    expect(await extractWheelLibraries(good, join(dir, 'z64'))).toEqual(['libx.so.1']);
    expect(readFileSync(join(dir, 'z64', 'libx.so.1'), 'utf8')).toBe('x'.repeat(5000));
    // One byte of the stored member changed: its CRC-32 no longer matches.
    const stored = makeZip([{ name: 'nvidia/x/lib/liby.so.1', data: Buffer.from('y'.repeat(100)) }]);
    stored[30 + 'nvidia/x/lib/liby.so.1'.length + 5] = 'z'.charCodeAt(0);
    writeFileSync(join(dir, 'bad.whl'), stored);
    await expect(extractWheelLibraries(join(dir, 'bad.whl'), join(dir, 'z64'))).rejects.toThrow(
      /liby\.so\.1: CRC-32 mismatch/,
    );
    expect(existsSync(join(dir, 'z64', 'libx.so.1'))).toBe(true);
  });

  const hasPip = spawnSync('python3', ['-m', 'pip', '--version'], { timeout: 30_000 }).status === 0;
  it.skipIf(!hasPip)('is what scripts/setup-cuda-sdk --runtime installs, under the same key', async () => {
    // The wheels already in the cache (as install-cuda leaves them): the script downloads nothing.
    const cache = join(dir, 'script');
    mkdirSync(join(cache, 'wheels'), { recursive: true });
    for (const pin of runtimePins()) writeFileSync(join(cache, 'wheels', wheelName(pin)), wheel(pin));
    const script = spawnSync('bash', [join(import.meta.dirname, '..', 'scripts', 'setup-cuda-sdk'), '--runtime'], {
      encoding: 'utf8',
      timeout: 120_000,
      env: { ...process.env, RESNET_CUDA_CACHE: cache },
    });
    expect(script.stderr).toContain('installed the CUDA runtime libraries');
    expect(script.status).toBe(0);
    const runtimeDir = join(cache, `cuda-runtime-${runtimeKey(runtimePins())}`);
    expect(script.stdout).toBe(`${runtimeDir}\n`);
    const fromScript = tree(runtimeDir);
    rmSync(runtimeDir, { recursive: true });
    const fromCli = await runCli(['install-cuda', '--cache-dir', cache, '--index-url', `${index.url}/pypi`], dir);
    expect(fromCli.code).toBe(0);
    expect(tree(runtimeDir)).toEqual(fromScript);
    expect(readFileSync(join(runtimeDir, 'lib', 'libnccl.so.2'), 'utf8')).toBe(
      'nvidia/nccl/lib/libnccl.so.2 '.repeat(200),
    );
  });
});
