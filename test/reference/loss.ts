/**
 * Softmax cross-entropy with label smoothing in float64, with PyTorch's semantics.
 * @packageDocumentation
 */

/** Options of {@link crossEntropy}. */
export interface CrossEntropyOptions {
  n: number;
  k: number;
  labelSmoothing?: number;
  gradScale?: number;
}

/**
 * loss = mean_i[−Σ_k q_ik log p_ik] with p = softmax(logits) and q = (1−ε)·onehot + ε/K;
 * dLogits = gradScale · (p − q) / N. A logit of +inf makes its row NaN (inf − inf in the shift by
 * the maximum), as in PyTorch; one of −inf adds nothing unless its class has weight.
 */
export function crossEntropy(
  logits: ArrayLike<number>,
  labels: ArrayLike<number>,
  o: CrossEntropyOptions,
): { loss: number; dLogits: Float64Array } {
  const eps = o.labelSmoothing ?? 0;
  const scale = (o.gradScale ?? 1) / o.n;
  const dLogits = new Float64Array(o.n * o.k);
  let total = 0;
  for (let i = 0; i < o.n; ++i) {
    const row = i * o.k;
    let max = -Infinity;
    for (let j = 0; j < o.k; ++j) max = Math.max(max, logits[row + j]!);
    let sumExp = 0;
    for (let j = 0; j < o.k; ++j) sumExp += Math.exp(logits[row + j]! - max);
    const logSumExp = max + Math.log(sumExp);
    for (let j = 0; j < o.k; ++j) {
      const logP = logits[row + j]! - logSumExp;
      const q = (j === labels[i] ? 1 - eps : 0) + eps / o.k;
      // Terms of weight 0 are left out, as PyTorch's nll_loss does: 0 · (−inf) would be NaN.
      if (q !== 0) total -= q * logP;
      dLogits[row + j] = scale * (Math.exp(logP) - q);
    }
  }
  return { loss: total / o.n, dLogits };
}

/** Options of {@link distillationLoss}. */
export interface DistillationOptions extends CrossEntropyOptions {
  temperature: number;
  alpha: number;
}

/** log Σ_j exp(scale · z_j) over one row, shifted by the row's maximum. */
function rowLogSumExp(z: ArrayLike<number>, row: number, k: number, scale: number): number {
  let max = -Infinity;
  for (let j = 0; j < k; ++j) max = Math.max(max, scale * z[row + j]!);
  let sum = 0;
  for (let j = 0; j < k; ++j) sum += Math.exp(scale * z[row + j]! - max);
  return max + Math.log(sum);
}

/**
 * Knowledge distillation (Hinton et al. 2015, arXiv:1503.02531), written from its definition:
 * loss = mean_i[α·T²·Σ_j pt_ij (log pt_ij − log ps_ij) + (1−α)·CE_i] with ps = softmax(s/T),
 * pt = softmax(t/T) and CE_i the smoothed cross-entropy of {@link crossEntropy} (PyTorch's
 * `F.kl_div(log_softmax(s/T), softmax(t/T), reduction='batchmean') * T*T`, mixed with
 * `F.cross_entropy(s, y, label_smoothing=ε)`). A class of pt = 0 adds nothing (xlogy).
 * dLogits = gradScale · (α·T·(ps − pt) + (1−α)·(softmax(s) − q)) / N.
 */
export function distillationLoss(
  logits: ArrayLike<number>,
  teacher: ArrayLike<number>,
  labels: ArrayLike<number>,
  o: DistillationOptions,
): { loss: number; dLogits: Float64Array } {
  const { temperature: T, alpha } = o;
  const ce = crossEntropy(logits, labels, { n: o.n, k: o.k, labelSmoothing: o.labelSmoothing ?? 0, gradScale: 1 });
  const scale = (o.gradScale ?? 1) / o.n;
  const dLogits = new Float64Array(o.n * o.k);
  let kl = 0;
  for (let i = 0; i < o.n; ++i) {
    const row = i * o.k;
    const lseS = rowLogSumExp(logits, row, o.k, 1 / T);
    const lseT = rowLogSumExp(teacher, row, o.k, 1 / T);
    for (let j = 0; j < o.k; ++j) {
      const logPs = logits[row + j]! / T - lseS;
      const logPt = teacher[row + j]! / T - lseT;
      const pt = Math.exp(logPt);
      if (pt !== 0) kl += pt * (logPt - logPs);
      // ce.dLogits holds (softmax(s) − q) / N.
      dLogits[row + j] = scale * (alpha * T * (Math.exp(logPs) - pt) + (1 - alpha) * ce.dLogits[row + j]! * o.n);
    }
  }
  return { loss: (alpha * T * T * kl) / o.n + (1 - alpha) * ce.loss, dLogits };
}
