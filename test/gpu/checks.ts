/**
 * The GPU checks of test/gpu/cases.ts with Node alone (for GPU machines without npm):
 *   node dist/test/gpu/checks.js [cuda:0] [--small]
 * Runs with RESNET_CUDA_DETERMINISTIC=1 unless the environment sets it. One line per check, then
 * "N passed, N failed, N skipped"; exits non-zero when a check fails.
 */
import { cudaDeviceCount, gpuChecks } from './cases.js';

// The checks compare runs bit for bit (graph replay against eager, DDP against the plain backward):
// cuDNN may only pick algorithms that give the same bits every run. Read when the device's context
// is made, which no import does.
process.env.RESNET_CUDA_DETERMINISTIC ??= '1';

const args = process.argv.slice(2);
const device = args.find((a) => !a.startsWith('--')) ?? 'cuda:0';
const scale = args.includes('--small') ? 'small' : 'full';
let passed = 0;
let failed = 0;

let skipped = 0;
const devices = cudaDeviceCount();
for (const check of gpuChecks) {
  if ((check.minDevices ?? 1) > devices) {
    skipped++;
    console.log(`skip  ${check.name} (needs ${check.minDevices} CUDA devices, ${devices} visible)`);
    continue;
  }
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

console.log(`${passed} passed, ${failed} failed, ${skipped} skipped`);
process.exitCode = failed ? 1 : 0;
