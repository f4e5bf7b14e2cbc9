/**
 * The op test table without vitest: `node dist/test/run-ops.js [device...]` (default: every
 * available device). One line per case, then `N passed, N failed, N skipped`; exits non-zero
 * when a case fails. RESNET_TEST_SEED=<seed> replays a run.
 */
import { addon } from '../lib/binding.js';
import { cases, gradientChecks, suiteSeed, type OpCase } from './ops/cases.js';

function main(argv: string[]): number {
  const backends = addon().listBackends();
  const devices = argv.length > 0 ? argv : backends.filter((b) => b.available).map((b) => b.name);
  const seed = suiteSeed();
  console.log(
    `op tests: seed ${seed} (replay with RESNET_TEST_SEED=${seed}); devices: ${devices.join(', ') || 'none'}`,
  );
  let passed = 0;
  let failed = 0;
  let skipped = 0;

  const attempt = (title: string, body: () => void): void => {
    const start = performance.now();
    try {
      body();
      ++passed;
      console.log(`ok    ${title} (${(performance.now() - start).toFixed(0)} ms)`);
    } catch (error) {
      ++failed;
      console.log(`FAIL  ${title}\n      ${error instanceof Error ? error.message : String(error)}`);
    }
  };

  for (const device of devices) {
    const backendName = device.split(':')[0];
    const backend = backends.find((b) => b.name === backendName);
    const unavailable = !backend
      ? `unknown backend '${backendName}'`
      : backend.available
        ? undefined
        : (backend.reason ?? 'not available');
    const each = (fn: (c: OpCase, dtype: (typeof c.dtypes)[number]) => void): void => {
      for (const c of cases) for (const dtype of c.dtypes) fn(c, dtype);
    };
    if (unavailable) {
      console.log(`${device}: skipped — ${unavailable}`);
      each((c, dtype) => {
        ++skipped;
        console.log(`skip  ${device} ${c.name} ${dtype}`);
      });
      continue;
    }
    each((c, dtype) => attempt(`${device} ${c.name} ${dtype}`, () => c.run({ device, dtype, seed })));
  }
  for (const check of gradientChecks) attempt(`gradient ${check.name}`, () => check.run({ seed }));

  console.log(`${passed} passed, ${failed} failed, ${skipped} skipped`);
  return failed > 0 ? 1 : 0;
}

process.exitCode = main(process.argv.slice(2));
