/**
 * The GPU checks of test/gpu/cases.ts with Node alone (for GPU machines without npm):
 *   node dist/test/gpu/checks.js [cuda:0] [--small]
 * One line per check, then "N passed, N failed"; exits non-zero when a check fails.
 */
import { gpuChecks } from './cases.js';

const args = process.argv.slice(2);
const device = args.find((a) => !a.startsWith('--')) ?? 'cuda:0';
const scale = args.includes('--small') ? 'small' : 'full';
let passed = 0;
let failed = 0;

for (const check of gpuChecks) {
  const started = performance.now();
  try {
    await check.run({ device, scale, log: (line) => console.log(`      ${line}`) });
    passed++;
    console.log(`ok    ${check.name} (${(performance.now() - started).toFixed(0)} ms)`);
  } catch (error) {
    failed++;
    console.log(`FAIL  ${check.name}: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
  }
}

console.log(`${passed} passed, ${failed} failed`);
process.exitCode = failed ? 1 : 0;
