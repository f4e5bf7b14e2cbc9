/**
 * Barnes-Hut t-SNE (L. van der Maaten, "Accelerating t-SNE using Tree-Based Algorithms", JMLR
 * 15:3221-3245, 2014), embedding feature vectors in two dimensions:
 *
 * - input similarities: for each point, a Gaussian over its `k = min(N - 1, floor(3 * perplexity))`
 *   nearest neighbours (squared Euclidean distances) whose precision is found by binary search so
 *   that its entropy is `log(perplexity)` (section 4.1); then `P = (P + P^T) / 2N`, sparse;
 * - gradient `dC/dy_i = 4 (sum_j p_ij q_ij Z (y_i - y_j) - sum_j q_ij^2 Z (y_i - y_j))`, the
 *   attraction over P's non-zeros and the repulsion from a quadtree with the criterion
 *   `r_cell / |y_i - y_cell| < theta` (section 4.2; theta 0 is the exact sum);
 * - optimisation as in the paper's experiments and scikit-learn's `TSNE`: early exaggeration 12 for
 *   250 iterations with momentum 0.5, then momentum 0.8, per-coordinate gains (+0.2 when the
 *   gradient's sign changes, x0.8 otherwise, at least 0.01), and the learning rate
 *   `max(N / early_exaggeration / 4, 50)` (scikit-learn's `learning_rate='auto'`, after Belkina et
 *   al., Nature Communications 10:5415, 2019; with the gradient's factor 4 included, as in
 *   scikit-learn: https://scikit-learn.org/stable/modules/generated/sklearn.manifold.TSNE.html).
 *
 * Nearest neighbours are found exactly, in time `N^2 * D`: meant for up to about 10,000 points
 * (a few seconds for 2,000 points of 2048 values). The optimisation runs in `N log N` per
 * iteration and allocates nothing per iteration.
 * @packageDocumentation
 */
import { ResnetError, expectInt, expectNumber, expectOneOf, expectOptions, invalid, mismatch } from '../errors.js';
import { Random } from '../random.js';
import { QuadTree } from './quadtree.js';

/** Options of {@link tsne}. */
export interface TsneOptions {
  /** The effective number of neighbours each point's Gaussian covers; default 30. Must be below N - 1. */
  perplexity?: number;
  /** Gradient-descent iterations; default 1000. */
  iterations?: number;
  /** Barnes-Hut accuracy: 0 is exact (and slow), larger is faster and coarser; default 0.5. */
  theta?: number;
  /** Step size, or `'auto'` for `max(N / earlyExaggeration / 4, 50)`; default `'auto'`. */
  learningRate?: number | 'auto';
  /** Factor on P during the first `exaggerationIterations`; default 12. */
  earlyExaggeration?: number;
  /** Iterations with exaggeration and the initial momentum; default 250 (at most `iterations`). */
  exaggerationIterations?: number;
  /** Momentum during the exaggeration; default 0.5. */
  initialMomentum?: number;
  /** Momentum afterwards; default 0.8. */
  finalMomentum?: number;
  /**
   * The starting layout: `'pca'` (the first two principal components, scaled to a standard
   * deviation of 1e-4, as scikit-learn's default), `'random'` (normal with standard deviation
   * 1e-4, from `seed`), or `N * 2` coordinates; default `'pca'`.
   */
  init?: 'pca' | 'random' | Float64Array;
  /** Seed of the random initialisation and of the PCA's power iteration; default 0. */
  seed?: number;
  /** Iterations between KL-divergence reports (history and `onProgress`); default 50. */
  reportEvery?: number;
  /** Called with the iteration (from 1) and the KL divergence at each report. */
  onProgress?: (report: TsneReport) => void;
}

/** One report of the optimisation's progress. */
export interface TsneReport {
  /** Iterations done. */
  iteration: number;
  /** KL(P || Q) before this iteration's step, with the un-exaggerated P. */
  kl: number;
}

/** What {@link tsne} returns. */
export interface TsneResult {
  /** `[N, 2]` coordinates, row-major, centred on the origin. */
  embedding: Float64Array;
  /** Points. */
  count: number;
  /** KL(P || Q) of the final embedding (Z from the Barnes-Hut sum). */
  kl: number;
  /** The reports, every `reportEvery` iterations. */
  history: TsneReport[];
  /** The perplexity used. */
  perplexity: number;
  /** Neighbours per point in P before symmetrising. */
  neighbours: number;
  /** The learning rate used (resolved from `'auto'`). */
  learningRate: number;
  /** Iterations run. */
  iterations: number;
}

/** The joint probabilities P as a symmetric sparse matrix in compressed rows. */
export interface SparseP {
  /** Points. */
  n: number;
  /** Row `i`'s entries are `cols[rowStart[i]] .. cols[rowStart[i + 1] - 1]`. */
  rowStart: Int32Array;
  /** The column of each entry, increasing within a row. */
  cols: Int32Array;
  /** The entries' probabilities `p_ij`; all of them sum to 1. */
  values: Float64Array;
}

/** Squared distances to the `k` nearest neighbours of every point, nearest first (ties by index). */
export function nearestNeighbours(
  data: Float32Array | Float64Array,
  n: number,
  dims: number,
  k: number,
): { indices: Int32Array; dist2: Float64Array } {
  const norms = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    let s = 0;
    for (let d = 0; d < dims; d++) {
      const v = data[i * dims + d]!;
      s += v * v;
    }
    norms[i] = s;
  }
  const indices = new Int32Array(n * k);
  const dist2 = new Float64Array(n * k);
  // A max-heap of the k best so far: its root is the worst kept neighbour.
  const heapD = new Float64Array(k);
  const heapJ = new Int32Array(k);
  const worse = (a: number, b: number): boolean =>
    heapD[a]! > heapD[b]! || (heapD[a] === heapD[b] && heapJ[a]! > heapJ[b]!);
  const swap = (a: number, b: number): void => {
    const d = heapD[a]!;
    heapD[a] = heapD[b]!;
    heapD[b] = d;
    const j = heapJ[a]!;
    heapJ[a] = heapJ[b]!;
    heapJ[b] = j;
  };
  const siftDown = (size: number): void => {
    let at = 0;
    for (;;) {
      const l = 2 * at + 1;
      const r = l + 1;
      let top = at;
      if (l < size && worse(l, top)) top = l;
      if (r < size && worse(r, top)) top = r;
      if (top === at) return;
      swap(at, top);
      at = top;
    }
  };
  for (let i = 0; i < n; i++) {
    let size = 0;
    const ri = i * dims;
    for (let j = 0; j < n; j++) {
      if (j === i) continue;
      const rj = j * dims;
      let dot = 0;
      for (let d = 0; d < dims; d++) dot += data[ri + d]! * data[rj + d]!;
      const dd = Math.max(0, norms[i]! + norms[j]! - 2 * dot);
      if (size < k) {
        // Sift up the new entry.
        let at = size++;
        heapD[at] = dd;
        heapJ[at] = j;
        while (at > 0) {
          const parent = (at - 1) >> 1;
          if (!worse(at, parent)) break;
          swap(at, parent);
          at = parent;
        }
      } else if (dd < heapD[0]! || (dd === heapD[0]! && j < heapJ[0]!)) {
        heapD[0] = dd;
        heapJ[0] = j;
        siftDown(size);
      }
    }
    // Popping the max-heap fills the row from its end: nearest first.
    for (let s = size - 1; s >= 0; s--) {
      dist2[i * k + s] = heapD[0]!;
      indices[i * k + s] = heapJ[0]!;
      swap(0, s);
      siftDown(s);
    }
  }
  return { indices, dist2 };
}

/**
 * Each point's conditional probabilities `p_{j|i}` over its neighbours: a Gaussian whose precision
 * is found by binary search so that the entropy equals `log(perplexity)` (to 1e-5 nats, at most
 * 200 steps). Rows of `[n, k]`, each summing to 1.
 */
export function conditionalProbabilities(dist2: Float64Array, n: number, k: number, perplexity: number): Float64Array {
  const target = Math.log(perplexity);
  const p = new Float64Array(n * k);
  for (let i = 0; i < n; i++) {
    const row = i * k;
    // Distances relative to the nearest: the probabilities do not change, and exp cannot underflow to all zeros.
    const d0 = dist2[row]!;
    let beta = 1;
    let lo = 0;
    let hi = Infinity;
    for (let step = 0; step < 200; step++) {
      let sum = 0;
      let weighted = 0;
      for (let j = 0; j < k; j++) {
        const d = dist2[row + j]! - d0;
        const e = Math.exp(-beta * d);
        p[row + j] = e;
        sum += e;
        weighted += d * e;
      }
      const entropy = Math.log(sum) + (beta * weighted) / sum;
      for (let j = 0; j < k; j++) p[row + j]! /= sum;
      const diff = entropy - target;
      if (Math.abs(diff) < 1e-5) break;
      if (diff > 0) {
        // Too flat: narrow the Gaussian.
        lo = beta;
        beta = hi === Infinity ? beta * 2 : (beta + hi) / 2;
      } else {
        hi = beta;
        beta = (beta + lo) / 2;
      }
    }
  }
  return p;
}

/** `P = (P_cond + P_cond^T) / 2n` from the neighbours' conditional probabilities, in compressed rows. */
export function symmetrize(indices: Int32Array, conditional: Float64Array, n: number, k: number): SparseP {
  // Every entry (i, j) also lands at (j, i): count both, then merge repeats within each row.
  const counts = new Int32Array(n + 1);
  for (let i = 0; i < n; i++) {
    for (let s = 0; s < k; s++) {
      counts[i + 1]!++;
      counts[indices[i * k + s]! + 1]!++;
    }
  }
  for (let i = 0; i < n; i++) counts[i + 1]! += counts[i]!;
  const fill = counts.slice(0, n);
  const cols = new Int32Array(counts[n]!);
  const values = new Float64Array(counts[n]!);
  const scale = 1 / (2 * n);
  for (let i = 0; i < n; i++) {
    for (let s = 0; s < k; s++) {
      const j = indices[i * k + s]!;
      const v = conditional[i * k + s]! * scale;
      cols[fill[i]!] = j;
      values[fill[i]!++] = v;
      cols[fill[j]!] = i;
      values[fill[j]!++] = v;
    }
  }
  const rowStart = new Int32Array(n + 1);
  const outCols: number[] = [];
  const outValues: number[] = [];
  for (let i = 0; i < n; i++) {
    const start = counts[i]!;
    const end = counts[i + 1]!;
    const order = Array.from({ length: end - start }, (_, t) => start + t).sort((a, b) => cols[a]! - cols[b]!);
    let last = -1;
    for (const at of order) {
      if (cols[at] === last) {
        outValues[outValues.length - 1]! += values[at]!;
      } else {
        last = cols[at]!;
        outCols.push(last);
        outValues.push(values[at]!);
      }
    }
    rowStart[i + 1] = outCols.length;
  }
  return { n, rowStart, cols: Int32Array.from(outCols), values: Float64Array.from(outValues) };
}

/** Scratch buffers of {@link gradient}, allocated once per run. */
export interface GradientWork {
  /** The quadtree, rebuilt at every call. */
  tree: QuadTree;
  /** Unnormalised repulsive forces, `[n, 2]`. */
  repulsion: Float64Array;
}

/** Buffers for {@link gradient} on `n` points. */
export function gradientWork(n: number): GradientWork {
  return { tree: new QuadTree(), repulsion: new Float64Array(2 * n) };
}

/**
 * The t-SNE gradient at `y` (`[n, 2]`) into `grad`, with P multiplied by `exaggeration`, the
 * repulsion from the Barnes-Hut quadtree with `theta` (0: exact). Returns the normalisation
 * `Z = sum_{i != j} (1 + |y_i - y_j|^2)^-1` as summed.
 */
export function gradient(
  p: SparseP,
  y: Float64Array,
  theta: number,
  exaggeration: number,
  grad: Float64Array,
  work: GradientWork,
): number {
  const n = p.n;
  const { tree, repulsion } = work;
  tree.build(y, n);
  let z = 0;
  for (let i = 0; i < n; i++) {
    z += tree.repulsion(y, i, theta);
    repulsion[2 * i] = tree.forceX;
    repulsion[2 * i + 1] = tree.forceY;
  }
  const { rowStart, cols, values } = p;
  for (let i = 0; i < n; i++) {
    const yx = y[2 * i]!;
    const yy = y[2 * i + 1]!;
    let ax = 0;
    let ay = 0;
    for (let e = rowStart[i]!; e < rowStart[i + 1]!; e++) {
      const j = cols[e]!;
      const dx = yx - y[2 * j]!;
      const dy = yy - y[2 * j + 1]!;
      const m = (exaggeration * values[e]!) / (1 + dx * dx + dy * dy);
      ax += m * dx;
      ay += m * dy;
    }
    grad[2 * i] = 4 * (ax - repulsion[2 * i]! / z);
    grad[2 * i + 1] = 4 * (ay - repulsion[2 * i + 1]! / z);
  }
  return z;
}

/**
 * KL(P || Q) = sum p_ij log(p_ij / q_ij) over P's non-zeros, with `q_ij = (1 + |y_i - y_j|^2)^-1 / z`
 * and `z` from {@link gradient} at the same `y`.
 */
export function klDivergence(p: SparseP, y: Float64Array, z: number): number {
  let kl = 0;
  const { rowStart, cols, values } = p;
  for (let i = 0; i < p.n; i++) {
    for (let e = rowStart[i]!; e < rowStart[i + 1]!; e++) {
      const v = values[e]!;
      if (v <= 0) continue;
      const j = cols[e]!;
      const dx = y[2 * i]! - y[2 * j]!;
      const dy = y[2 * i + 1]! - y[2 * j + 1]!;
      kl += v * Math.log(v * z * (1 + dx * dx + dy * dy));
    }
  }
  return kl;
}

/**
 * The first two principal components' scores of the centred data, by block power iteration
 * (seeded start, at most 200 steps, stopping once the basis moves by less than 1e-10), each sign
 * chosen so that its largest score is positive.
 */
export function pca2(data: Float32Array | Float64Array, n: number, dims: number, seed: number): Float64Array {
  const mean = new Float64Array(dims);
  for (let i = 0; i < n; i++) for (let d = 0; d < dims; d++) mean[d]! += data[i * dims + d]!;
  for (let d = 0; d < dims; d++) mean[d]! /= n;
  const rng = new Random(seed);
  const basis = [new Float64Array(dims), new Float64Array(dims)] as const;
  for (const v of basis) for (let d = 0; d < dims; d++) v[d] = rng.normal();
  const scores = new Float64Array(n);
  const next = [new Float64Array(dims), new Float64Array(dims)] as const;
  const normalise = (v: Float64Array): void => {
    let sq = 0;
    for (let d = 0; d < dims; d++) sq += v[d]! * v[d]!;
    const norm = Math.sqrt(sq) || 1;
    for (let d = 0; d < dims; d++) v[d]! /= norm;
  };
  const orthonormalise = (vs: readonly [Float64Array, Float64Array]): void => {
    const [a, b] = vs;
    normalise(a);
    let dot = 0;
    for (let d = 0; d < dims; d++) dot += a[d]! * b[d]!;
    for (let d = 0; d < dims; d++) b[d]! -= dot * a[d]!;
    normalise(b);
  };
  orthonormalise(basis);
  for (let step = 0; step < 200; step++) {
    // next = C basis, with C = Xc^T Xc, computed as Xc^T (Xc v) without forming C.
    for (let c = 0; c < 2; c++) {
      const v = basis[c]!;
      const out = next[c]!;
      out.fill(0);
      for (let i = 0; i < n; i++) {
        let s = 0;
        for (let d = 0; d < dims; d++) s += (data[i * dims + d]! - mean[d]!) * v[d]!;
        scores[i] = s;
      }
      for (let i = 0; i < n; i++) {
        const s = scores[i]!;
        for (let d = 0; d < dims; d++) out[d]! += (data[i * dims + d]! - mean[d]!) * s;
      }
    }
    orthonormalise(next);
    let moved = 0;
    for (let c = 0; c < 2; c++) {
      for (let d = 0; d < dims; d++) moved = Math.max(moved, Math.abs(next[c]![d]! - basis[c]![d]!));
      basis[c]!.set(next[c]!);
    }
    if (moved < 1e-10) break;
  }
  const out = new Float64Array(2 * n);
  for (let c = 0; c < 2; c++) {
    let largest = 0;
    for (let i = 0; i < n; i++) {
      let s = 0;
      for (let d = 0; d < dims; d++) s += (data[i * dims + d]! - mean[d]!) * basis[c]![d]!;
      out[2 * i + c] = s;
      if (Math.abs(s) > Math.abs(largest)) largest = s;
    }
    if (largest < 0) for (let i = 0; i < n; i++) out[2 * i + c] = -out[2 * i + c]!;
  }
  return out;
}

/** The starting layout of {@link tsne}. */
function initialLayout(
  init: 'pca' | 'random' | Float64Array,
  data: Float32Array | Float64Array,
  n: number,
  dims: number,
  seed: number,
): Float64Array {
  if (init instanceof Float64Array) {
    if (init.length !== 2 * n || !init.every(Number.isFinite)) {
      invalid('init', `'pca', 'random' or a Float64Array of ${2 * n} finite coordinates`, init);
    }
    return init.slice();
  }
  if (init === 'random') {
    const rng = new Random(seed);
    return Float64Array.from({ length: 2 * n }, () => 1e-4 * rng.normal());
  }
  const y = pca2(data, n, dims, seed);
  let sum = 0;
  let sq = 0;
  for (let i = 0; i < n; i++) {
    sum += y[2 * i]!;
    sq += y[2 * i]! * y[2 * i]!;
  }
  const std = Math.sqrt(Math.max(0, sq / n - (sum / n) ** 2));
  // Data with no spread at all (every point the same) starts at the origin.
  const scale = std > 0 ? 1e-4 / std : 0;
  for (let i = 0; i < 2 * n; i++) y[i]! *= scale;
  return y;
}

/**
 * Embeds `n = data.length / dims` points of `dims` values (row-major, e.g. the features of
 * `extractFeatures`) in two dimensions with Barnes-Hut t-SNE; deterministic for a given seed.
 * PyTorch/scikit-learn equivalent: `sklearn.manifold.TSNE(n_components=2, perplexity=30,
 * method='barnes_hut', angle=0.5, init='pca', learning_rate='auto').fit_transform(features)`.
 * @throws `ERR_RC_INVALID_ARGUMENT` for non-finite data, fewer than 3 points, a perplexity not
 *   below `n - 1`, or other bad options, naming the parameter.
 */
export function tsne(data: Float32Array | Float64Array, dims: number, options: TsneOptions = {}): TsneResult {
  if (!(data instanceof Float32Array || data instanceof Float64Array)) {
    invalid('data', 'a Float32Array or Float64Array of n * dims values', data);
  }
  expectInt('dims', dims, 1);
  if (data.length % dims !== 0) invalid('data', `a length that is a multiple of dims (${dims})`, data);
  const n = data.length / dims;
  if (n < 3) mismatch('data', 'at least 3 points', `${n} point${n === 1 ? '' : 's'}`);
  for (let i = 0; i < data.length; i++) {
    if (!Number.isFinite(data[i])) {
      mismatch('data', 'finite values', `${data[i]} at point ${Math.floor(i / dims)}, value ${i % dims}`);
    }
  }
  const o = expectOptions<TsneOptions>('tsne options', options, [
    'perplexity',
    'iterations',
    'theta',
    'learningRate',
    'earlyExaggeration',
    'exaggerationIterations',
    'initialMomentum',
    'finalMomentum',
    'init',
    'seed',
    'reportEvery',
    'onProgress',
  ]);
  const perplexity = expectNumber('perplexity', o.perplexity ?? 30, 1);
  if (perplexity >= n - 1) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `perplexity ${perplexity} must be below the number of points less one (${n - 1}): each point has ${n - 1} neighbours`,
    );
  }
  const iterations = expectInt('iterations', o.iterations ?? 1000, 1);
  const theta = expectNumber('theta', o.theta ?? 0.5, 0);
  const exaggeration = expectNumber('earlyExaggeration', o.earlyExaggeration ?? 12, 1);
  const exaggerationIterations = Math.min(
    iterations,
    expectInt('exaggerationIterations', o.exaggerationIterations ?? 250, 0),
  );
  const momentum0 = expectNumber('initialMomentum', o.initialMomentum ?? 0.5, 0, 1);
  const momentum1 = expectNumber('finalMomentum', o.finalMomentum ?? 0.8, 0, 1);
  const rate =
    o.learningRate === undefined || o.learningRate === 'auto'
      ? Math.max(n / exaggeration / 4, 50)
      : expectNumber('learningRate', o.learningRate, Number.MIN_VALUE);
  const init =
    o.init instanceof Float64Array ? o.init : expectOneOf('init', o.init ?? 'pca', ['pca', 'random'] as const);
  const seed = expectInt('seed', o.seed ?? 0);
  const reportEvery = expectInt('reportEvery', o.reportEvery ?? 50, 1);
  if (o.onProgress !== undefined && typeof o.onProgress !== 'function') {
    invalid('onProgress', 'a function', o.onProgress);
  }

  const k = Math.min(n - 1, Math.floor(3 * perplexity));
  const { indices, dist2 } = nearestNeighbours(data, n, dims, k);
  const p = symmetrize(indices, conditionalProbabilities(dist2, n, k, perplexity), n, k);
  const y = initialLayout(init, data, n, dims, seed);

  const grad = new Float64Array(2 * n);
  const update = new Float64Array(2 * n);
  const gains = new Float64Array(2 * n).fill(1);
  const work = gradientWork(n);
  const history: TsneReport[] = [];
  for (let it = 0; it < iterations; it++) {
    const early = it < exaggerationIterations;
    const z = gradient(p, y, theta, early ? exaggeration : 1, grad, work);
    if ((it + 1) % reportEvery === 0) {
      const report = { iteration: it + 1, kl: klDivergence(p, y, z) };
      history.push(report);
      o.onProgress?.(report);
    }
    const momentum = early ? momentum0 : momentum1;
    let mx = 0;
    let my = 0;
    for (let c = 0; c < 2 * n; c++) {
      const g = grad[c]!;
      const u = update[c]!;
      // As scikit-learn: a step against the last one's direction grows the gain, any other shrinks it.
      const gain = u * g < 0 ? gains[c]! + 0.2 : gains[c]! * 0.8;
      gains[c] = gain < 0.01 ? 0.01 : gain;
      const step = momentum * u - rate * gains[c]! * g;
      update[c] = step;
      y[c]! += step;
      if (c % 2 === 0) mx += y[c]!;
      else my += y[c]!;
    }
    // t-SNE's cost does not change under translation; keeping the layout centred keeps its numbers small.
    mx /= n;
    my /= n;
    for (let i = 0; i < n; i++) {
      y[2 * i]! -= mx;
      y[2 * i + 1]! -= my;
    }
  }
  const z = gradient(p, y, theta, 1, grad, work);
  return {
    embedding: y,
    count: n,
    kl: klDivergence(p, y, z),
    history,
    perplexity,
    neighbours: k,
    learningRate: rate,
    iterations,
  };
}
