/**
 * The Trainer's data-parallel bookkeeping through a {@link ProcessGroup}: which loaders share the
 * data as the group's ranks, the samples of a padded rank's share that count, evaluation counts
 * summed over the ranks, values averaged over them, and a check that every rank resumed at the
 * same step.
 * @packageDocumentation
 */
import type { DataLoader } from '../data/loader.js';
import { DistributedSampler } from '../data/sampler.js';
import type { ProcessGroup } from '../distributed/types.js';
import { ResnetError } from '../errors.js';
import { Tensor } from '../tensor.js';
import { ConfusionMatrix } from './metrics.js';

/** Whether `group` joins more than one process. */
export function isDistributed(group: ProcessGroup | null): group is ProcessGroup {
  return group !== null && group.worldSize > 1;
}

/**
 * Refuses a loader that does not read this rank's share of the data: in data-parallel training
 * every loader must be built with `distributed: { rank, worldSize }` matching the group (a
 * {@link DistributedSampler}), so that the ranks see disjoint samples and step in lock-step.
 */
export function checkRankLoader(group: ProcessGroup | null, loader: DataLoader, what: string): void {
  if (!isDistributed(group)) return;
  const s = loader.sampler;
  if (!(s instanceof DistributedSampler) || s.rank !== group.rank || s.worldSize !== group.worldSize) {
    const has =
      s instanceof DistributedSampler
        ? `a DistributedSampler for rank ${s.rank} of ${s.worldSize}`
        : `a ${s.constructor.name}, which gives every rank the same samples`;
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `${what} has ${has}, but this process is rank ${group.rank} of ${group.worldSize}; ` +
        `create it with distributed: { rank: ${group.rank}, worldSize: ${group.worldSize} }`,
    );
  }
}

/**
 * How many of the samples this rank's loader yields in an epoch are its own, in the sampler's
 * order: a {@link DistributedSampler} that pads the dataset to a multiple of the world size gives
 * the padding (repeats of the first indices) to the last positions of some ranks, which must not
 * be counted twice in an evaluation. Every sample counts for other samplers.
 */
export function ownSamples(loader: DataLoader): number {
  const s = loader.sampler;
  if (!(s instanceof DistributedSampler) || s.dropLast) return s.length;
  // Rank r takes positions r, r + w, r + 2w, … of the padded list; those below the dataset length are real.
  return Math.min(s.length, Math.max(0, Math.ceil((s.datasetLength - s.rank) / s.worldSize)));
}

/** An evaluation's counts on one rank, or over all of them. */
export interface EvalCounts {
  confusion: ConfusionMatrix;
  lossTotal: number;
  topHits: number;
  count: number;
}

/**
 * Sums every rank's counts (the confusion matrix, the loss total, the top-k hits and the count) in
 * one all-reduce, waited for. The counts are summed in f32, exact up to 2^24 per cell.
 */
export function sumEvalCounts(group: ProcessGroup | null, counts: EvalCounts, device: string): EvalCounts {
  if (!isDistributed(group)) return counts;
  const cells = counts.confusion.toArray().flat();
  const packed = Tensor.from([...cells, counts.lossTotal, counts.topHits, counts.count], [cells.length + 3], {
    device,
  });
  let all: Float32Array;
  try {
    group.allReduce(packed, { op: 'sum' });
    group.synchronize();
    all = packed.toFloat32Array();
  } finally {
    packed.dispose();
  }
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

/** The mean of each of `values` over the ranks (the values themselves for one process), in f32. */
export function averageOverRanks(group: ProcessGroup | null, values: readonly number[], device: string): number[] {
  if (!isDistributed(group)) return [...values];
  const t = Tensor.from(values, [values.length], { device });
  try {
    group.allReduce(t, { op: 'avg' });
    group.synchronize();
    return Array.from(t.toFloat32Array());
  } finally {
    t.dispose();
  }
}

/**
 * Checks that every rank resumed at the same optimizer step (they read the checkpoint rank 0
 * wrote; a rank that found another one, or none, would silently train another model).
 */
export function checkSameStep(group: ProcessGroup | null, step: number, device: string): void {
  if (!isDistributed(group)) return;
  const t = Tensor.from([step, -step], [2], { device, dtype: 'i32' });
  let highest: number;
  let lowest: number;
  try {
    group.allReduce(t, { op: 'max' });
    group.synchronize();
    const v = t.toArray();
    highest = Number(v[0]);
    lowest = -Number(v[1]);
  } finally {
    t.dispose();
  }
  if (highest !== lowest) {
    throw new ResnetError(
      'ERR_RC_CHECKPOINT',
      `the ranks start at different steps (from ${lowest} to ${highest}; rank ${group.rank} at ${step}): ` +
        'every rank must resume from the same checkpoint, which needs the output folder on a file system all ranks share',
    );
  }
}
