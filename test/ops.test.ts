/**
 * Every op case of test/ops/cases.ts on every backend of this build, against the float64
 * reference. Inputs are fresh each run; the seed is printed, and RESNET_TEST_SEED=<seed> replays it.
 */
import { describe, it } from 'vitest';
import { addon } from '../lib/binding.js';
import { cases, gradientChecks, suiteSeed } from './ops/cases.js';

const seed = suiteSeed();
console.log(`op tests: seed ${seed} (replay with RESNET_TEST_SEED=${seed})`);
// RESNET_TEST_BACKENDS=cuda (comma-separated) limits the rows to those backends: the test project
// that runs on the emulated CUDA backend uses it, as the CPU rows run in the main project.
const only = process.env.RESNET_TEST_BACKENDS?.split(',').filter((name) => name !== '');
const emulatorMissing = process.env.RESNET_CUDA_EMULATOR_MISSING;

for (const backend of addon()
  .listBackends()
  .filter((b) => !only || only.includes(b.name))) {
  const device = backend.name;
  const register = (test: typeof it | typeof it.skip): void => {
    for (const c of cases) {
      for (const dtype of c.dtypes) test(`${device} ${c.name} ${dtype}`, () => c.run({ device, dtype, seed }));
    }
  };
  if (backend.available) {
    describe(`${device}: ${backend.device ?? 'available'}`, () => register(it));
  } else {
    // Registered and skipped, so the report counts them as skipped rather than hiding them.
    const reason = emulatorMissing
      ? `the emulated CUDA backend ${emulatorMissing} was not built`
      : (backend.reason ?? 'not available');
    describe.skip(`${device}: skipped — ${reason}`, () => register(it.skip));
  }
}

if (!only) {
  describe('reference gradients vs finite differences', () => {
    for (const check of gradientChecks) it(check.name, () => check.run({ seed }));
  });
}
