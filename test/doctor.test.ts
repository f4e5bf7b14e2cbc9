/**
 * `resnet-cuda doctor` where something is missing, through the compiled entry point in a child
 * process: an addon that does not load (the loader's own error and hint printed, not a reference to
 * a hint elsewhere), and a CUDA backend whose libraries are nowhere (the one command that installs
 * them).
 */
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

const root = join(import.meta.dirname, '..');
const dir = mkdtempSync(join(tmpdir(), 'rc-doctor-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('doctor', () => {
  it('prints the actual load error and its hint when the addon does not load', () => {
    // The compiled package in a folder without any native build.
    const pkg = join(dir, 'package');
    mkdirSync(pkg);
    cpSync(join(root, 'dist', 'lib'), join(pkg, 'dist', 'lib'), { recursive: true });
    writeFileSync(join(pkg, 'package.json'), '{"name": "resnet-cuda", "version": "9.9.9", "type": "module"}');
    writeFileSync(join(pkg, 'CMakeLists.txt'), '');
    symlinkSync(join(root, 'node_modules'), join(pkg, 'node_modules'));
    const run = spawnSync(process.execPath, [join(pkg, 'dist', 'lib', 'cli', 'main.js'), 'doctor'], {
      encoding: 'utf8',
      timeout: 120_000,
    });
    expect(run.status).toBe(1);
    expect(run.stdout).toMatch(/^ {2}addon {2}FAILED to load \(see below\)$/m);
    expect(run.stdout).toMatch(/^problem \(addon\): the native addon does not load: No native build was found for /m);
    // The fix is the loader's hint itself.
    expect(run.stdout).toMatch(/^ {2}fix: The installed package has no prebuilt addon .*`npm rebuild resnet-cuda`/m);
    expect(run.stdout).not.toContain('hint above');
  });

  const backend = join(root, 'build', 'Release', 'libresnet_cuda_backend.so');
  it.skipIf(!existsSync(backend))('names the command that installs missing CUDA libraries', () => {
    const home = join(dir, 'home');
    mkdirSync(home);
    const run = spawnSync(process.execPath, [join(root, 'dist', 'lib', 'cli', 'main.js'), 'doctor'], {
      encoding: 'utf8',
      timeout: 120_000,
      // No Python, an empty cache, no CUDA_HOME: nowhere to find them.
      env: { HOME: home, RESNET_CUDA_CACHE: join(home, 'cache'), PATH: '' },
    });
    expect(run.stdout).toMatch(/^ {9}cuDNN +not found \(libcudnn\.so\.9\)$/m);
    expect(run.stdout).toMatch(/^ {9}NVRTC +not found \(libnvrtc\.so\.13, optional\)$/m);
    expect(run.stdout).toMatch(/^ {9}searched in order: \/usr\/local\/cuda; the dynamic loader's search/m);
    expect(run.stdout).toContain(
      'note (cuda): CUDA libraries the backend needs are missing: cuBLASLt (libcublasLt.so.13) was not found; cuBLAS (libcublas.so.13) was not found; cuDNN (libcudnn.so.9) was not found; NCCL (libnccl.so.2) was not found\n  fix: `npx resnet-cuda install-cuda`',
    );
    // The CPU backend still works: the exit code says so.
    expect(run.status).toBe(0);
  });
});
