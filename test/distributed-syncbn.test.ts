/**
 * SyncBatchNorm over two processes with Gloo: ranks holding parts of a batch (even and uneven)
 * get the outputs, input gradients and running statistics of one process holding all of it, and
 * local parameter gradients that add up to its own. The ranks run the compiled rank script
 * test/distributed/syncbn-rank.ts (`npm run build:ts` first).
 */
import { describe, expect, it } from 'vitest';
import { BatchNorm2d, Tensor } from '../lib/index.js';
import {
  SYNCBN_CHANNELS,
  SYNCBN_HW,
  syncBnBatch,
  syncBnStep,
  type SyncBnRankResult,
} from './distributed/syncbn-data.js';
import { rankScript, runRanks } from './helpers/ranks.js';

/** f32: the merged statistics and summed gradient terms round differently from one pass. */
const TOL = 1e-5;

type Step = SyncBnRankResult['steps'][number];

/** One process, the whole batch: the same two steps as the rank script. */
function wholeBatch(total: number): Step[] {
  const bn = new BatchNorm2d({ numFeatures: SYNCBN_CHANNELS, relu: true });
  const shape = [total, SYNCBN_HW, SYNCBN_HW, SYNCBN_CHANNELS];
  const steps: Step[] = [];
  for (let step = 0; step < 2; ++step) {
    const batch = syncBnBatch(total, step);
    bn.zeroGrad();
    const y = bn.forward(Tensor.from(batch.x, shape), Tensor.from(batch.residual, shape));
    const dx = bn.backward(Tensor.from(batch.dy, shape));
    steps.push(syncBnStep(bn, y, dx));
  }
  bn.dispose();
  return steps;
}

/** max |a - b| / max |b|. */
function relError(a: readonly number[], b: readonly number[]): number {
  expect(a).toHaveLength(b.length);
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.length; ++i) {
    num = Math.max(num, Math.abs(a[i]! - b[i]!));
    den = Math.max(den, Math.abs(b[i]!));
  }
  return num / Math.max(den, 1e-30);
}

function sum(vectors: number[][]): number[] {
  return vectors[0]!.map((_, i) => vectors.reduce((s, v) => s + v[i]!, 0));
}

describe('SyncBatchNorm on 2 processes (Gloo) equals BatchNorm2d on 1 process with the whole batch', () => {
  for (const sizes of [
    [2, 2],
    [1, 3],
  ]) {
    it(`ranks of ${sizes.join(' and ')} samples`, async () => {
      const runs = await runRanks(rankScript('syncbn-rank'), { args: [sizes.join(',')], timeoutMs: 60_000 });
      for (const run of runs) expect(run.code, `rank ${run.rank}: ${run.stderr}`).toBe(0);
      const results = runs.map((run) => JSON.parse(run.stdout.trim().split('\n').at(-1) ?? '') as SyncBnRankResult);
      const ref = wholeBatch(sizes[0]! + sizes[1]!);
      ref.forEach((whole, step) => {
        const ranks = results.map((r) => r.steps[step]!);
        expect(
          relError(
            ranks.flatMap((r) => r.y),
            whole.y,
          ),
        ).toBeLessThan(TOL);
        expect(
          relError(
            ranks.flatMap((r) => r.dx),
            whole.dx,
          ),
        ).toBeLessThan(TOL);
        expect(
          relError(
            ranks.flatMap((r) => r.dResidual),
            whole.dResidual,
          ),
        ).toBeLessThan(TOL);
        for (const r of ranks) {
          expect(relError(r.runningMean, whole.runningMean)).toBeLessThan(TOL);
          expect(relError(r.runningVar, whole.runningVar)).toBeLessThan(TOL);
        }
        // dγ and dβ stay local (DistributedDataParallel averages them): they add up to the whole's.
        expect(relError(sum(ranks.map((r) => r.dGamma)), whole.dGamma)).toBeLessThan(TOL);
        expect(relError(sum(ranks.map((r) => r.dBeta)), whole.dBeta)).toBeLessThan(TOL);
      });
    }, 120_000);
  }
});
