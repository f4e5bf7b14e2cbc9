/**
 * References for the t-SNE tests: the exact O(N^2) gradient and KL divergence in float64 straight
 * from the formulas of van der Maaten (JMLR 15:3221, 2014, eq. 5 and section 4), and the
 * leave-one-out k-nearest-neighbour accuracy of labelled points.
 * @packageDocumentation
 */
import type { SparseP } from '../../lib/analysis/tsne.js';

/** P as a dense `n x n` matrix. */
export function densePFrom(p: SparseP): Float64Array {
  const dense = new Float64Array(p.n * p.n);
  for (let i = 0; i < p.n; i++) {
    for (let e = p.rowStart[i]!; e < p.rowStart[i + 1]!; e++) dense[i * p.n + p.cols[e]!] = p.values[e]!;
  }
  return dense;
}

/** `dC/dy_i = 4 sum_j (p_ij - q_ij) (y_i - y_j) / (1 + |y_i - y_j|^2)`, with P times `exaggeration`. */
export function exactGradient(dense: Float64Array, n: number, y: Float64Array, exaggeration: number): Float64Array {
  let z = 0;
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      if (i !== j) z += 1 / (1 + (y[2 * i]! - y[2 * j]!) ** 2 + (y[2 * i + 1]! - y[2 * j + 1]!) ** 2);
    }
  }
  const grad = new Float64Array(2 * n);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      if (i === j) continue;
      const dx = y[2 * i]! - y[2 * j]!;
      const dy = y[2 * i + 1]! - y[2 * j + 1]!;
      const w = 1 / (1 + dx * dx + dy * dy);
      const m = 4 * (exaggeration * dense[i * n + j]! - w / z) * w;
      grad[2 * i]! += m * dx;
      grad[2 * i + 1]! += m * dy;
    }
  }
  return grad;
}

/** `sum_ij p_ij log(p_ij / q_ij)` with the exact Q. */
export function exactKl(dense: Float64Array, n: number, y: Float64Array): number {
  const w = (i: number, j: number): number =>
    1 / (1 + (y[2 * i]! - y[2 * j]!) ** 2 + (y[2 * i + 1]! - y[2 * j + 1]!) ** 2);
  let z = 0;
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) if (i !== j) z += w(i, j);
  let kl = 0;
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      const p = dense[i * n + j]!;
      if (p > 0) kl += p * Math.log(p / (w(i, j) / z));
    }
  }
  return kl;
}

/** The share of points whose `k` nearest other points (Euclidean, in `dims` dimensions) vote their own label. */
export function knnAccuracy(points: ArrayLike<number>, dims: number, labels: ArrayLike<number>, k: number): number {
  const n = labels.length;
  let hits = 0;
  for (let i = 0; i < n; i++) {
    const dist: [number, number][] = [];
    for (let j = 0; j < n; j++) {
      if (j === i) continue;
      let s = 0;
      for (let d = 0; d < dims; d++) s += (points[i * dims + d]! - points[j * dims + d]!) ** 2;
      dist.push([s, j]);
    }
    dist.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    const votes = new Map<number, number>();
    for (const [, j] of dist.slice(0, k)) votes.set(labels[j]!, (votes.get(labels[j]!) ?? 0) + 1);
    const best = [...votes].sort((a, b) => b[1] - a[1] || a[0] - b[0])[0]![0];
    if (best === labels[i]) hits++;
  }
  return hits / n;
}
