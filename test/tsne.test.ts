import { describe, expect, it } from 'vitest';
import { QuadTree } from '../lib/analysis/quadtree.js';
import {
  conditionalProbabilities,
  gradient,
  gradientWork,
  klDivergence,
  nearestNeighbours,
  pca2,
  symmetrize,
  tsne,
} from '../lib/analysis/tsne.js';
import { Random } from '../lib/random.js';
import { objectContaining, stringMatching } from './helpers/matchers.js';
import { densePFrom, exactGradient, exactKl, knnAccuracy } from './helpers/tsne-reference.js';

/** `perClass` points around each of `classes` random centres in `dims` dimensions (seeded). */
function clusters(o: { classes: number; perClass: number; dims: number; spread: number; seed: number }) {
  const rng = new Random(o.seed);
  const centres = Array.from({ length: o.classes }, () => Array.from({ length: o.dims }, () => 10 * rng.normal()));
  const n = o.classes * o.perClass;
  const data = new Float32Array(n * o.dims);
  const labels = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    // Interleaved classes, so that the order of the points says nothing of their class.
    const c = i % o.classes;
    labels[i] = c;
    for (let d = 0; d < o.dims; d++) data[i * o.dims + d] = centres[c]![d]! + o.spread * rng.normal();
  }
  return { data, labels, n };
}

function sparseP(data: Float32Array, n: number, dims: number, perplexity: number) {
  const k = Math.min(n - 1, Math.floor(3 * perplexity));
  const { indices, dist2 } = nearestNeighbours(data, n, dims, k);
  return symmetrize(indices, conditionalProbabilities(dist2, n, k, perplexity), n, k);
}

function randomLayout(n: number, seed: number, scale: number): Float64Array {
  const rng = new Random(seed);
  return Float64Array.from({ length: 2 * n }, () => scale * rng.normal());
}

describe('t-SNE pieces', () => {
  it('finds the exact nearest neighbours, nearest first', () => {
    const { data, n } = clusters({ classes: 3, perClass: 20, dims: 7, spread: 1, seed: 1 });
    const k = 9;
    const { indices, dist2 } = nearestNeighbours(data, n, 7, k);
    for (const i of [0, 17, 59]) {
      const all = Array.from({ length: n }, (_, j) => {
        let s = 0;
        for (let d = 0; d < 7; d++) s += (data[i * 7 + d]! - data[j * 7 + d]!) ** 2;
        return [s, j] as const;
      })
        .filter(([, j]) => j !== i)
        .sort((a, b) => a[0] - b[0] || a[1] - b[1]);
      expect(Array.from(indices.subarray(i * k, (i + 1) * k))).toEqual(all.slice(0, k).map(([, j]) => j));
      all.slice(0, k).forEach(([d], s) => expect(dist2[i * k + s]).toBeCloseTo(d, 3));
    }
  });

  it('matches each point’s perplexity and makes P symmetric with total 1', () => {
    const { data, n } = clusters({ classes: 3, perClass: 30, dims: 5, spread: 2, seed: 2 });
    const perplexity = 12;
    const k = 36;
    const { indices, dist2 } = nearestNeighbours(data, n, 5, k);
    const cond = conditionalProbabilities(dist2, n, k, perplexity);
    for (let i = 0; i < n; i++) {
      let sum = 0;
      let entropy = 0;
      for (let s = 0; s < k; s++) {
        const p = cond[i * k + s]!;
        sum += p;
        if (p > 0) entropy -= p * Math.log(p);
      }
      expect(sum).toBeCloseTo(1, 12);
      expect(Math.exp(entropy)).toBeCloseTo(perplexity, 3);
    }
    const p = symmetrize(indices, cond, n, k);
    const dense = densePFrom(p);
    let total = 0;
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) {
        expect(dense[i * n + j]).toBeCloseTo(dense[j * n + i]!, 15);
        total += dense[i * n + j]!;
      }
    }
    expect(total).toBeCloseTo(1, 12);
    // Entry (i, j) is (p_j|i + p_i|j) / 2n.
    const i = 4;
    const j = indices[i * k + 2]!;
    const back = Array.from(indices.subarray(j * k, (j + 1) * k)).indexOf(i);
    const expected = (cond[i * k + 2]! + (back >= 0 ? cond[j * k + back]! : 0)) / (2 * n);
    expect(dense[i * n + j]).toBeCloseTo(expected, 15);
  });

  it('Barnes-Hut with theta 0 is the exact gradient, and theta 0.5 is close to it', () => {
    const { data, n } = clusters({ classes: 4, perClass: 25, dims: 6, spread: 1.5, seed: 3 });
    const p = sparseP(data, n, 6, 10);
    const dense = densePFrom(p);
    const work = gradientWork(n);
    for (const [seed, exaggeration] of [
      [5, 1],
      [6, 12],
    ] as const) {
      const y = randomLayout(n, seed, 3);
      const exact = exactGradient(dense, n, y, exaggeration);
      const grad = new Float64Array(2 * n);
      const z = gradient(p, y, 0, exaggeration, grad, work);
      let scale = 0;
      for (const g of exact) scale = Math.max(scale, Math.abs(g));
      for (let c = 0; c < 2 * n; c++) expect(Math.abs(grad[c]! - exact[c]!)).toBeLessThan(1e-12 * scale);
      expect(klDivergence(p, y, z)).toBeCloseTo(exactKl(dense, n, y), 10);

      gradient(p, y, 0.5, exaggeration, grad, work);
      let err = 0;
      let norm = 0;
      for (let c = 0; c < 2 * n; c++) {
        err += (grad[c]! - exact[c]!) ** 2;
        norm += exact[c]! ** 2;
      }
      const relative = Math.sqrt(err / norm);
      expect(relative).toBeGreaterThan(0); // the approximation is in use
      expect(relative).toBeLessThan(0.05);
    }
  });

  it('keeps points at the same coordinates in one leaf and still sums their repulsion', () => {
    // Five points, two pairs of duplicates: the exact sums by hand.
    const y = Float64Array.from([0, 0, 0, 0, 1, 1, 1, 1, 3, -2]);
    const tree = new QuadTree();
    tree.build(y, 5);
    const z = tree.repulsion(y, 0, 0);
    // From point 0: one point at distance 0 (q = 1), two at |(1,1)|^2 = 2 (q = 1/3), one at 13 (q = 1/14).
    expect(z).toBeCloseTo(1 + 2 / 3 + 1 / 14, 14);
    expect(tree.forceX).toBeCloseTo(2 * (1 / 9) * -1 + (1 / 196) * -3, 14);
    expect(tree.forceY).toBeCloseTo(2 * (1 / 9) * -1 + (1 / 196) * 2, 14);
  });

  it('PCA scores are the leading principal components', () => {
    // Points on a line along (1, 2, 0) with small noise across: the first component is that line.
    const rng = new Random(9);
    const n = 50;
    const data = new Float64Array(n * 3);
    for (let i = 0; i < n; i++) {
      const t = rng.normal() * 5;
      data[i * 3] = t + 0.01 * rng.normal();
      data[i * 3 + 1] = 2 * t + 0.01 * rng.normal();
      data[i * 3 + 2] = 0.1 * rng.normal();
    }
    const scores = pca2(data, n, 3, 0);
    let mean = 0;
    for (let i = 0; i < n; i++) mean += (data[i * 3]! + 2 * data[i * 3 + 1]!) / Math.sqrt(5);
    mean /= n;
    for (let i = 0; i < n; i++) {
      const projected = (data[i * 3]! + 2 * data[i * 3 + 1]!) / Math.sqrt(5) - mean;
      expect(Math.abs(scores[2 * i]!)).toBeCloseTo(Math.abs(projected), 2);
    }
  });
});

describe('tsne', () => {
  const blobs = clusters({ classes: 4, perClass: 40, dims: 10, spread: 1, seed: 11 });

  it('separates well-separated clusters: 5-NN accuracy in 2-D near 1 (chance 0.25)', () => {
    const result = tsne(blobs.data, 10, { perplexity: 15, iterations: 500, seed: 1 });
    expect(result.count).toBe(160);
    expect(result.embedding.length).toBe(320);
    expect(result.learningRate).toBe(50);
    expect(result.neighbours).toBe(45);
    expect(knnAccuracy(result.embedding, 2, blobs.labels, 5)).toBeGreaterThanOrEqual(0.98);
  });

  it('lowers the KL divergence after the exaggeration and reports it', () => {
    const reports: number[] = [];
    const result = tsne(blobs.data, 10, {
      perplexity: 15,
      iterations: 600,
      reportEvery: 50,
      seed: 2,
      init: 'random',
      onProgress: (r) => reports.push(r.iteration),
    });
    expect(reports).toEqual([50, 100, 150, 200, 250, 300, 350, 400, 450, 500, 550, 600]);
    const after = result.history.filter((h) => h.iteration > 300).map((h) => h.kl);
    for (let i = 1; i < after.length; i++) expect(after[i]!).toBeLessThanOrEqual(after[i - 1]! * 1.01);
    expect(result.kl).toBeLessThan(result.history[0]!.kl);
    expect(result.kl).toBeLessThan(result.history[5]!.kl); // iteration 300
    // The final value, against the exact KL divergence of the final layout (Z summed exactly).
    const p = sparseP(blobs.data, blobs.n, 10, 15);
    expect(result.kl).toBeCloseTo(exactKl(densePFrom(p), blobs.n, result.embedding), 2);
    expect(result.kl).toBeGreaterThan(0);
  });

  it('gives the same embedding for the same seed, another for another seed', () => {
    const a = tsne(blobs.data, 10, { perplexity: 10, iterations: 120, init: 'random', seed: 7 });
    const b = tsne(blobs.data, 10, { perplexity: 10, iterations: 120, init: 'random', seed: 7 });
    const c = tsne(blobs.data, 10, { perplexity: 10, iterations: 120, init: 'random', seed: 8 });
    expect(Array.from(b.embedding)).toEqual(Array.from(a.embedding));
    expect(Array.from(c.embedding)).not.toEqual(Array.from(a.embedding));
    const pcaA = tsne(blobs.data, 10, { perplexity: 10, iterations: 60 });
    const pcaB = tsne(blobs.data, 10, { perplexity: 10, iterations: 60 });
    expect(Array.from(pcaB.embedding)).toEqual(Array.from(pcaA.embedding));
  });

  it('refuses bad input and options, naming the parameter', () => {
    const small = new Float32Array(20 * 2).map((_, i) => i % 7);
    const bad = (f: () => unknown, pattern: RegExp) =>
      expect(f).toThrow(objectContaining({ code: 'ERR_RC_INVALID_ARGUMENT', message: stringMatching(pattern) }));
    bad(() => tsne(small, 2, { perplexity: 19 }), /perplexity 19 must be below .* \(19\)/);
    bad(() => tsne(small, 2, { perplexity: 25 }), /perplexity/);
    bad(() => tsne(small, 2, { perplexity: 0.5 }), /perplexity/);
    bad(() => tsne(small, 3), /data/);
    bad(() => tsne(new Float32Array(4), 2), /at least 3 points for data but received 2 points/);
    bad(
      () => tsne(Float32Array.of(1, 2, NaN, 4, 5, 6), 2, { perplexity: 1 }),
      /finite values for data but received NaN at point 1, value 0/,
    );
    bad(() => tsne(small, 2, { perplexity: 5, theta: -1 }), /theta/);
    bad(() => tsne(small, 2, { perplexity: 5, iterations: 0 }), /iterations/);
    bad(() => tsne(small, 2, { perplexity: 5, learningRate: 0 }), /learningRate/);
    bad(() => tsne(small, 2, { perplexity: 5, init: 'spectral' as 'pca' }), /init/);
    bad(() => tsne(small, 2, { perplexity: 5, init: new Float64Array(3) }), /init/);
    bad(() => tsne(small, 2, { perplexity: 5, perplexty: 5 } as object), /perplexty/);
    bad(() => tsne([1, 2, 3] as unknown as Float32Array, 1), /data/);
  });
});
