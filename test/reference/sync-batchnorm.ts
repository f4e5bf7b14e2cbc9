/**
 * The per-rank pieces of SyncBatchNorm in float64 over the rows of a channels-last tensor: one
 * rank's statistics (count, mean, M2) and its backward sums. Their merged forms are checked
 * against `batchNormTrainingForward` and `batchNormBackward` of the whole batch.
 * @packageDocumentation
 */
/**
 * One rank's statistics laid out as the native `stats` tensor, f32[3, C]: the row count, the mean
 * and M2 (the sum of squared deviations from that mean), channel by channel, each row of C.
 */
export function syncBatchNormStats(x: ArrayLike<number>, channels: number): Float64Array {
  const rows = x.length / channels;
  const out = new Float64Array(3 * channels);
  for (let i = 0; i < x.length; ++i) out[channels + (i % channels)]! += x[i]!;
  for (let k = 0; k < channels; ++k) {
    out[k] = rows;
    out[channels + k] = out[channels + k]! / rows;
  }
  for (let i = 0; i < x.length; ++i) {
    const d = x[i]! - out[channels + (i % channels)]!;
    out[2 * channels + (i % channels)]! += d * d;
  }
  return out;
}

/** Inputs of {@link syncBatchNormBackwardSums}: the global statistics the forward saved. */
export interface SyncBatchNormSumsOptions {
  channels: number;
  saveMean: ArrayLike<number>;
  saveInvStd: ArrayLike<number>;
  /** The forward's output; with `relu`, dy is masked where y ≤ 0. */
  y?: ArrayLike<number> | undefined;
  relu?: boolean;
}

/**
 * One rank's backward sums laid out as the native `sums` tensor, f32[3, C]: sum(g), sum(g·x̂) and
 * the row count, with g = dy masked by the ReLU and x̂ = (x − mean)·invStd. The first two rows are
 * also this rank's dBeta and dGamma.
 */
export function syncBatchNormBackwardSums(
  x: ArrayLike<number>,
  dy: ArrayLike<number>,
  o: SyncBatchNormSumsOptions,
): Float64Array {
  const c = o.channels;
  const y = o.relu ? o.y : undefined;
  if (o.relu && !y) throw new Error('syncBatchNormBackwardSums: relu needs y');
  const out = new Float64Array(3 * c);
  for (let i = 0; i < x.length; ++i) {
    const k = i % c;
    const g = y && y[i]! <= 0 ? 0 : dy[i]!;
    out[k]! += g;
    out[c + k]! += g * (x[i]! - o.saveMean[k]!) * o.saveInvStd[k]!;
  }
  for (let k = 0; k < c; ++k) out[2 * c + k] = x.length / c;
  return out;
}
