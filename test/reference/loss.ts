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
