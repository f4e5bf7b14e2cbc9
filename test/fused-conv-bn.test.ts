/**
 * The `conv-bn` fused path on CUDA (native/cuda/fused_conv*.cc): cuDNN's graph API
 * (native/cuda/graph_api.cc) as the emulator provides it, checked by its own C++ test. Runs in the
 * 'cuda-emulator-cases' project on the emulated device (test/cuda-emulator); without a usable CUDA
 * backend the cases are skipped with the reason.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, expect, it } from 'vitest';

describe('the emulated cuDNN graph API', () => {
  const library = process.env.RESNET_CUDA_BACKEND_LIBRARY;
  const graphTest = library ? join(dirname(library), 'rc_emu_graph_api_test') : '';
  it.skipIf(!existsSync(graphTest))(
    'interprets a scale-bias-ReLU-convolution-statistics graph against a direct sum, and refuses what cuDNN documents',
    () => {
      const r = spawnSync(graphTest, [], { encoding: 'utf8', timeout: 120_000 });
      expect(r.stdout + r.stderr).toMatch(/graph api: \d+ passed, 0 failed/);
      expect(r.status).toBe(0);
    },
  );
});
