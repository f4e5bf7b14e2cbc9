/**
 * The CUDA backend on the emulated device (test/cuda-emulator): the GPU checks of
 * test/gpu/cases.ts at their small size, and the emulator's own executor test. Runs in the
 * 'cuda-emulator' test project, which points RESNET_CUDA_BACKEND_LIBRARY at the emulated backend;
 * elsewhere (and where the emulator was not built) the tests are skipped with the reason.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { listBackends } from '../lib/index.js';
import { cudaDeviceCount, gpuChecks } from './gpu/cases.js';

const library = process.env.RESNET_CUDA_BACKEND_LIBRARY;
const cuda = library ? listBackends().find((b) => b.name === 'cuda') : undefined;
const reason = !library
  ? process.env.RESNET_CUDA_EMULATOR_MISSING
    ? `the emulated CUDA backend ${process.env.RESNET_CUDA_EMULATOR_MISSING} was not built`
    : 'runs in the cuda-emulator test project'
  : cuda?.available
    ? undefined
    : `the emulated CUDA backend is not usable: ${cuda?.reason ?? 'no cuda backend'}`;

describe.skipIf(reason !== undefined)(
  `CUDA backend on the emulated device${reason ? ` (skipped: ${reason})` : ''}`,
  () => {
    const devices = reason === undefined ? cudaDeviceCount() : 0;
    for (const check of gpuChecks) {
      const short = (check.minDevices ?? 1) > devices;
      it.skipIf(short)(`${check.name}${short ? ` (skipped: needs ${check.minDevices} devices)` : ''}`, async () => {
        await check.run({ device: 'cuda', scale: 'small', log: (line) => console.log(`${check.name}: ${line}`) });
      });
    }

    const executorTest = library ? join(dirname(library), 'rc_emu_executor_test') : '';
    it.skipIf(!existsSync(executorTest))(
      'the kernel executor: barriers, warp shuffles, faults, block reduce and scan, schedules',
      () => {
        const r = spawnSync(executorTest, [], { encoding: 'utf8' });
        expect(r.stdout + r.stderr).toMatch(/executor: \d+ passed, 0 failed/);
        expect(r.status).toBe(0);
      },
    );
  },
);
