import { existsSync, readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { defineConfig } from 'vitest/config';

// The emulated CUDA backend (test/cuda-emulator, built with the addon in a source checkout):
// the 'cuda-emulator' project runs the CUDA test rows on it, so the CUDA backend's own code is
// tested on machines without a GPU. Without the library, those rows are skipped with the reason.
const emulator = resolve('build/Release/libresnet_cuda_emulator.so');
const emulatorEnv = existsSync(emulator)
  ? { RESNET_CUDA_BACKEND_LIBRARY: emulator }
  : { RESNET_CUDA_EMULATOR_MISSING: emulator };

// Where the CPU has AVX-512, oneDNN has bf16 kernels (native or emulated), which the CPU backend
// uses or not by timing them (native/cpu/compute_type.h): the 'cpu-bf16-native' project runs the op
// table and the bf16 checks with them forced on, so that path is tested whichever this CPU chooses.
const avx512 = existsSync('/proc/cpuinfo') && /\bavx512f\b/.test(readFileSync('/proc/cpuinfo', 'utf8'));
const bf16NativeProjects = avx512
  ? [
      {
        extends: true as const,
        test: {
          name: 'cpu-bf16-native',
          include: ['test/ops.test.ts', 'test/cpu-bf16-compute.test.ts'],
          env: { RESNET_TEST_BACKENDS: 'cpu', RESNET_CPU_BF16: 'native' },
        },
      },
    ]
  : [];

export default defineConfig({
  resolve: {
    // Worker threads cannot start from TypeScript sources: the loader's workers run the compiled
    // package (see test/setup/loader-worker-url.ts).
    alias: [{ find: /^\.\/loader-worker-url\.js$/, replacement: resolve('test/setup/loader-worker-url.ts') }],
  },
  test: {
    // Generous: a slow or busy machine must not fail a correct test; speed is measured by `npm run bench`.
    testTimeout: 900_000,
    hookTimeout: 120_000,
    pool: 'forks',
    reporters: ['default', './test/summary-reporter.ts'],
    projects: [
      {
        extends: true,
        test: { name: 'main', include: ['test/**/*.test.ts'], exclude: ['test/cuda-emulator.test.ts'] },
      },
      {
        extends: true,
        test: {
          name: 'cuda-emulator',
          include: ['test/ops.test.ts', 'test/cuda-emulator.test.ts'],
          // Two emulated devices, for the device-selection check.
          env: { RESNET_TEST_BACKENDS: 'cuda', RESNET_CUDA_EMU_DEVICES: '2', ...emulatorEnv },
        },
      },
      {
        // The CUDA cases of the other test files (with RESNET_TEST_BACKENDS=cuda they skip their CPU
        // cases, which run in 'main').
        extends: true,
        test: {
          name: 'cuda-emulator-cases',
          include: [
            'test/ema.test.ts',
            'test/robustness/numerics.test.ts',
            'test/grad-checkpoint.test.ts',
            'test/benchmark-training.test.ts',
            'test/profiler.test.ts',
            'test/inference-cuda.test.ts',
            'test/qat.test.ts',
            'test/inference-artifact.test.ts',
            'test/sync-batchnorm.test.ts',
            'test/trainer-cuda-graph.test.ts',
            'test/data-gpu-decode.test.ts',
            'test/data-loader-gpu.test.ts',
            'test/fused.test.ts',
            'test/fused-bn-add-relu.test.ts',
            'test/fused-conv-bn.test.ts',
            'test/fused-dgrad-dbn.test.ts',
            'test/fused-conv-bn-fallback.test.ts',
          ],
          env: { RESNET_TEST_BACKENDS: 'cuda', ...emulatorEnv },
        },
      },
      {
        // The CPU op table, the bf16 checks, the convolution layouts and the INT8 plan with oneDNN
        // capped at AVX2, where it has no bf16 kernels (the plans compute bf16 in f32,
        // native/cpu/compute_type.h), the convolutions copy some of their inputs into other layouts
        // (native/cpu/conv.cc) and it has no VNNI: those paths are tested on every machine, not only
        // on AVX2-only CPUs.
        extends: true,
        test: {
          name: 'cpu-avx2',
          include: [
            'test/ops.test.ts',
            'test/cpu-bf16-compute.test.ts',
            'test/cpu-conv-layouts.test.ts',
            'test/int8.test.ts',
          ],
          env: { RESNET_TEST_BACKENDS: 'cpu', ONEDNN_MAX_CPU_ISA: 'AVX2' },
        },
      },
      {
        // The op tables again with each block's threads run in a seeded random order: a kernel that
        // relies on an order its barriers do not enforce gives other results.
        extends: true,
        test: {
          name: 'cuda-emulator-random',
          include: ['test/ops.test.ts'],
          env: { RESNET_TEST_BACKENDS: 'cuda', RESNET_CUDA_EMU_SCHEDULE: 'random', ...emulatorEnv },
        },
      },
      ...bf16NativeProjects,
    ],
  },
});
