/**
 * The Trainer's data-parallel reductions: gradients averaged over ranks before each optimizer
 * step, evaluation counts summed so that every rank reports the whole validation set.
 * @packageDocumentation
 */
import type { ProcessGroup } from '../distributed/types.js';
import type { Optimizer } from '../optim/optimizer.js';
import { Tensor } from '../tensor.js';
import { ConfusionMatrix } from './metrics.js';

/** Whether `group` joins more than one process. */
export function isDistributed(group: ProcessGroup | null): group is ProcessGroup {
  return group !== null && group.worldSize > 1;
}

/** Averages the optimizer's gradient arena over the ranks; later device work waits for it. */
export function averageGradients(group: ProcessGroup | null, optimizer: Optimizer<{ lr: number }>): void {
  if (!isDistributed(group)) return;
  group.allReduce(optimizer.arena().grads, { op: 'avg' });
  group.wait();
}

/** An evaluation's counts on one rank, or over all of them. */
export interface EvalCounts {
  confusion: ConfusionMatrix;
  lossTotal: number;
  topHits: number;
  count: number;
}

/** Sums every rank's counts (the confusion matrix, the loss total, the top-k hits and the count) in one all-reduce. */
export function sumEvalCounts(group: ProcessGroup | null, counts: EvalCounts, device: string): EvalCounts {
  if (!isDistributed(group)) return counts;
  const cells = counts.confusion.toArray().flat();
  const packed = Tensor.from([...cells, counts.lossTotal, counts.topHits, counts.count], [cells.length + 3], {
    device,
  });
  group.allReduce(packed);
  group.wait();
  const all = packed.toFloat32Array();
  packed.dispose();
  const n = counts.confusion.toArray().length;
  const rows: number[][] = [];
  for (let r = 0; r < n; r++) rows.push(Array.from(all.subarray(r * n, (r + 1) * n), (v) => Math.round(v)));
  return {
    confusion: ConfusionMatrix.fromArray(rows),
    lossTotal: all[n * n]!,
    topHits: Math.round(all[n * n + 1]!),
    count: Math.round(all[n * n + 2]!),
  };
}
