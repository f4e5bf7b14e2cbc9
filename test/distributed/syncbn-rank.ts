/**
 * Rank script of test/distributed-syncbn.test.ts: each rank runs a SyncBatchNorm (fused residual
 * add and ReLU) over its share of a batch that every rank generates identically, for two steps,
 * and prints what it got as one JSON line.
 *
 * Arguments: the per-rank batch sizes, comma-separated (e.g. `2,2` or `1,3`).
 */
import { initProcessGroup } from '../../lib/distributed/process-group.js';
import { SyncBatchNorm, Tensor } from '../../lib/index.js';
import { SYNCBN_CHANNELS, SYNCBN_HW, syncBnBatch, syncBnStep, type SyncBnRankResult } from './syncbn-data.js';

const sizes = (process.argv[2] ?? '').split(',').map(Number);
const group = initProcessGroup({ backend: 'gloo', timeoutSeconds: 60 });
if (sizes.length !== group.worldSize || sizes.some((n) => !Number.isInteger(n) || n < 1)) {
  throw new Error(`syncbn-rank: expected ${group.worldSize} batch sizes, got '${process.argv[2] ?? ''}'`);
}
const first = sizes.slice(0, group.rank).reduce((a, b) => a + b, 0);
const mine = sizes[group.rank]!;
const total = sizes.reduce((a, b) => a + b, 0);
const bn = new SyncBatchNorm({ numFeatures: SYNCBN_CHANNELS, relu: true, group });
const out: SyncBnRankResult = { rank: group.rank, steps: [] };
for (let step = 0; step < 2; ++step) {
  const batch = syncBnBatch(total, step);
  const slice = (a: Float32Array): Tensor => {
    const per = SYNCBN_HW * SYNCBN_HW * SYNCBN_CHANNELS;
    return Tensor.from(a.subarray(first * per, (first + mine) * per), [mine, SYNCBN_HW, SYNCBN_HW, SYNCBN_CHANNELS]);
  };
  bn.zeroGrad();
  const y = bn.forward(slice(batch.x), slice(batch.residual));
  const dx = bn.backward(slice(batch.dy));
  out.steps.push(syncBnStep(bn, y, dx));
}
group.destroy();
console.log(JSON.stringify(out));
