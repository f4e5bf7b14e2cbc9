/**
 * `benchmarkTraining` (lib/train/benchmark.ts) in f16 on CUDA: the step scales its loss with a
 * GradScaler whose scale stays on the device, so that it runs eagerly and captured as a CUDA graph
 * without a host wait inside a step, and the loss it reports is finite. Runs in the
 * 'cuda-emulator-cases' project on the emulated device; without a usable CUDA backend the cases are
 * skipped with the reason.
 */
import { describe, expect, it } from 'vitest';
import { ResNet, benchmarkTraining, hostSyncStats, listBackends } from '../lib/index.js';

const cuda = listBackends().find((b) => b.name === 'cuda');
const skipped = cuda?.available ? '' : ` (skipped: ${cuda?.reason ?? 'no CUDA backend'})`;

/** The host waits of one f16 benchmark of `steps` timed steps, and its loss. */
function run(cudaGraph: boolean, steps: number): { waits: number; loss: number } {
  const model = new ResNet(18, { numClasses: 4, smallInput: true, seed: 1, device: 'cuda' });
  try {
    const before = hostSyncStats().count;
    const { loss } = benchmarkTraining({
      model,
      device: 'cuda',
      numClasses: 4,
      dtype: 'f16',
      batch: 2,
      size: 8,
      steps,
      warmup: 1,
      cudaGraph,
    });
    return { waits: hostSyncStats().count - before, loss };
  } finally {
    model.dispose();
  }
}

describe('benchmarkTraining in f16 on CUDA', () => {
  it.skipIf(!cuda?.available).each([false, true])(
    `cudaGraph %s: loss scaling on the device, a finite loss, no host wait inside a step${skipped}`,
    (cudaGraph) => {
      const short = run(cudaGraph, 1);
      const long = run(cudaGraph, 4);
      expect(Number.isFinite(short.loss)).toBe(true);
      expect(Number.isFinite(long.loss)).toBe(true);
      // Three more steps, no more waits: a scaler that read its scale back would wait every step.
      expect(long.waits).toBe(short.waits);
    },
  );
});
