/**
 * Batch normalisation in float64 over the rows of a channels-last tensor (N·H·W rows of C), with
 * the residual add and ReLU the native op fuses: y = relu(bn(x) + residual).
 * @packageDocumentation
 */

/** Options of the training forward; running statistics are read, not modified. */
export interface BatchNormTrainingOptions {
  channels: number;
  gamma: ArrayLike<number>;
  beta: ArrayLike<number>;
  runningMean: ArrayLike<number>;
  runningVar: ArrayLike<number>;
  residual?: ArrayLike<number> | undefined;
  relu?: boolean;
  momentum?: number;
  eps?: number;
}

/** Everything the training forward produces. */
export interface BatchNormTrainingResult {
  y: Float64Array;
  /** bn(x) + residual, before the ReLU: the tests keep it away from 0 to avoid the kink. */
  preActivation: Float64Array;
  saveMean: Float64Array;
  saveInvStd: Float64Array;
  runningMean: Float64Array;
  runningVar: Float64Array;
}

/**
 * Training forward with batch statistics: normalises with the biased variance, and updates the
 * running statistics with momentum and the unbiased variance, as PyTorch does.
 */
export function batchNormTrainingForward(x: ArrayLike<number>, o: BatchNormTrainingOptions): BatchNormTrainingResult {
  const c = o.channels;
  const rows = x.length / c;
  const momentum = o.momentum ?? 0.1;
  const eps = o.eps ?? 1e-5;
  const saveMean = new Float64Array(c);
  const saveInvStd = new Float64Array(c);
  const variance = new Float64Array(c);
  for (let i = 0; i < x.length; ++i) saveMean[i % c] = saveMean[i % c]! + x[i]!;
  for (let k = 0; k < c; ++k) saveMean[k] = saveMean[k]! / rows;
  // Two passes: the sum of squared deviations has no cancellation, unlike E[x²] − E[x]².
  for (let i = 0; i < x.length; ++i) {
    const d = x[i]! - saveMean[i % c]!;
    variance[i % c] = variance[i % c]! + d * d;
  }
  for (let k = 0; k < c; ++k) {
    variance[k] = variance[k]! / rows;
    saveInvStd[k] = 1 / Math.sqrt(variance[k]! + eps);
  }
  const runningMean = new Float64Array(c);
  const runningVar = new Float64Array(c);
  for (let k = 0; k < c; ++k) {
    runningMean[k] = (1 - momentum) * o.runningMean[k]! + momentum * saveMean[k]!;
    runningVar[k] = (1 - momentum) * o.runningVar[k]! + (momentum * variance[k]! * rows) / (rows - 1);
  }
  const { y, preActivation } = affine(x, c, saveMean, saveInvStd, o);
  return { y, preActivation, saveMean, saveInvStd, runningMean, runningVar };
}

/** Options of the inference forward. */
export interface BatchNormInferenceOptions {
  channels: number;
  gamma: ArrayLike<number>;
  beta: ArrayLike<number>;
  runningMean: ArrayLike<number>;
  runningVar: ArrayLike<number>;
  residual?: ArrayLike<number> | undefined;
  relu?: boolean;
  eps?: number;
}

/** Inference forward: normalises with the running statistics. */
export function batchNormInferenceForward(x: ArrayLike<number>, o: BatchNormInferenceOptions): Float64Array {
  const c = o.channels;
  const eps = o.eps ?? 1e-5;
  const invStd = new Float64Array(c);
  for (let k = 0; k < c; ++k) invStd[k] = 1 / Math.sqrt(o.runningVar[k]! + eps);
  return affine(x, c, o.runningMean, invStd, o).y;
}

function affine(
  x: ArrayLike<number>,
  c: number,
  mean: ArrayLike<number>,
  invStd: ArrayLike<number>,
  o: { gamma: ArrayLike<number>; beta: ArrayLike<number>; residual?: ArrayLike<number> | undefined; relu?: boolean },
): { y: Float64Array; preActivation: Float64Array } {
  const y = new Float64Array(x.length);
  const preActivation = new Float64Array(x.length);
  for (let i = 0; i < x.length; ++i) {
    const k = i % c;
    let v = o.gamma[k]! * (x[i]! - mean[k]!) * invStd[k]! + o.beta[k]!;
    if (o.residual) v += o.residual[i]!;
    preActivation[i] = v;
    // max(v, 0) keeping NaN, as torch.relu.
    y[i] = o.relu && v < 0 ? 0 : v;
  }
  return { y, preActivation };
}

/** Inputs of the backward. */
export interface BatchNormBackwardOptions {
  channels: number;
  gamma: ArrayLike<number>;
  saveMean: ArrayLike<number>;
  saveInvStd: ArrayLike<number>;
  /** The forward's output; with `relu`, dy is masked where y ≤ 0 (a NaN y passes dy, as in torch). */
  y?: ArrayLike<number> | undefined;
  relu?: boolean;
}

/** Gradients of the training forward (fresh, not accumulated). */
export interface BatchNormBackwardResult {
  dx: Float64Array;
  dGamma: Float64Array;
  dBeta: Float64Array;
  /** The gradient reaching the residual: dy masked by the ReLU. */
  dResidual: Float64Array;
}

/** Backward of the training forward, given its saved batch statistics. */
export function batchNormBackward(
  x: ArrayLike<number>,
  dy: ArrayLike<number>,
  o: BatchNormBackwardOptions,
): BatchNormBackwardResult {
  const c = o.channels;
  const rows = x.length / c;
  if (o.relu && !o.y) throw new Error('batchNormBackward: relu needs y');
  const g = maskedGradient(dy, o.relu ? o.y : undefined);
  const dGamma = new Float64Array(c);
  const dBeta = new Float64Array(c);
  for (let i = 0; i < x.length; ++i) {
    const k = i % c;
    dBeta[k] = dBeta[k]! + g[i]!;
    dGamma[k] = dGamma[k]! + g[i]! * (x[i]! - o.saveMean[k]!) * o.saveInvStd[k]!;
  }
  const dx = new Float64Array(x.length);
  for (let i = 0; i < x.length; ++i) {
    const k = i % c;
    const xhat = (x[i]! - o.saveMean[k]!) * o.saveInvStd[k]!;
    dx[i] = ((o.gamma[k]! * o.saveInvStd[k]!) / rows) * (rows * g[i]! - dBeta[k]! - xhat * dGamma[k]!);
  }
  return { dx, dGamma, dBeta, dResidual: g };
}

// dy where the fused ReLU let the value through (torch's threshold_backward: zero where y <= 0);
// `reluOutput` is the forward's output when it fused a ReLU, undefined when it did not.
function maskedGradient(dy: ArrayLike<number>, reluOutput: ArrayLike<number> | undefined): Float64Array {
  const g = new Float64Array(dy.length);
  for (let i = 0; i < dy.length; ++i) g[i] = reluOutput && reluOutput[i]! <= 0 ? 0 : dy[i]!;
  return g;
}

/** Inputs of the backward of the inference forward. */
export interface BatchNormInferenceBackwardOptions {
  channels: number;
  gamma: ArrayLike<number>;
  runningMean: ArrayLike<number>;
  runningVar: ArrayLike<number>;
  eps?: number;
  /** The forward's output; with `relu`, dy is masked where y ≤ 0. */
  y?: ArrayLike<number> | undefined;
  relu?: boolean;
}

/**
 * Backward of the inference forward, where the statistics are constants (PyTorch's
 * batch_norm_backward with training=False): dx = g·γ/√(running_var + ε), dγ = Σ g·x̂, dβ = Σ g,
 * with x̂ from the running statistics and g = dy masked by the ReLU.
 */
export function batchNormInferenceBackward(
  x: ArrayLike<number>,
  dy: ArrayLike<number>,
  o: BatchNormInferenceBackwardOptions,
): BatchNormBackwardResult {
  const c = o.channels;
  const eps = o.eps ?? 1e-5;
  if (o.relu && !o.y) throw new Error('batchNormInferenceBackward: relu needs y');
  const g = maskedGradient(dy, o.relu ? o.y : undefined);
  const invStd = new Float64Array(c);
  for (let k = 0; k < c; ++k) invStd[k] = 1 / Math.sqrt(o.runningVar[k]! + eps);
  const dGamma = new Float64Array(c);
  const dBeta = new Float64Array(c);
  const dx = new Float64Array(x.length);
  for (let i = 0; i < x.length; ++i) {
    const k = i % c;
    dBeta[k] = dBeta[k]! + g[i]!;
    dGamma[k] = dGamma[k]! + g[i]! * (x[i]! - o.runningMean[k]!) * invStd[k]!;
    dx[i] = g[i]! * o.gamma[k]! * invStd[k]!;
  }
  return { dx, dGamma, dBeta, dResidual: g };
}
