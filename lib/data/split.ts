/**
 * Subsets and seeded random splits, like `torch.utils.data.Subset` and `random_split`, with an
 * optional stratified mode that keeps each class's share in every split.
 * @packageDocumentation
 */
import { ResnetError, expectBool, expectInt, expectOptions, invalid } from '../errors.js';
import { Random } from '../random.js';
import { checkIndex, expectDataset, expectIntArray, promiseOf, resolveSeed } from './dataset.js';
import type { Dataset, DatasetSpec, RawSample } from './types.js';

/** The spec of a {@link Subset}: the parent's spec and the chosen indices. */
export interface SubsetSpec extends DatasetSpec {
  kind: 'Subset';
  dataset: DatasetSpec;
  indices: number[];
}

/** The samples of `dataset` at `indices`, in that order (`torch.utils.data.Subset`). */
export class Subset implements Dataset {
  /** The parent dataset. */
  readonly dataset: Dataset;
  /** Parent indices, one per sample of the subset. */
  readonly indices: Int32Array;

  /**
   * @param dataset - the parent dataset.
   * @param indices - parent indices in `[0, dataset.length)`; repeats are allowed, as in PyTorch.
   */
  constructor(dataset: Dataset, indices: ArrayLike<number>) {
    this.dataset = expectDataset('dataset', dataset);
    this.indices = expectIntArray(
      'indices',
      Array.isArray(indices) || indices instanceof Int32Array ? indices : Array.from(indices),
      0,
      this.dataset.length - 1,
    );
  }

  /** Number of samples. */
  get length(): number {
    return this.indices.length;
  }

  /** The parent's {@link Dataset.imageShape}. */
  get imageShape(): readonly [number, number, number] | undefined {
    return this.dataset.imageShape;
  }

  /** The parent's class names (labels keep the parent's numbering). */
  get classes(): readonly string[] {
    return this.dataset.classes;
  }

  /** Label of sample `index` (the parent's label of `indices[index]`). */
  label(index: number): number {
    return this.dataset.label(this.indices[checkIndex(index, this.length)]!);
  }

  /** Sample `index` (the parent's sample `indices[index]`). */
  get(index: number): Promise<RawSample> {
    return promiseOf(() => this.dataset.get(this.indices[checkIndex(index, this.length)]!));
  }

  /** The parent's spec and the indices. */
  spec(): SubsetSpec {
    return { kind: 'Subset', dataset: this.dataset.spec(), indices: Array.from(this.indices) };
  }
}

/** Options of {@link randomSplit}. */
export interface RandomSplitOptions {
  /** Seed of the shuffle; the same seed gives the same split. Random when omitted. */
  seed?: number;
  /**
   * Split each class separately so that every split holds each class in the given proportion
   * (within one sample per class); default false.
   */
  stratified?: boolean;
}

/**
 * Turns fractions or lengths into split lengths exactly as `torch.utils.data.random_split` does:
 * fractions (summing to 1) are floored, then the remaining samples are added one at a time to the
 * splits in order, round-robin; integer lengths must sum to `n`.
 */
export function splitLengths(n: number, fractions: readonly number[]): number[] {
  const sum = fractions.reduce((a, b) => a + b, 0);
  // PyTorch's test: math.isclose(sum, 1) (relative tolerance 1e-9) and sum <= 1.
  if (Math.abs(sum - 1) <= 1e-9 * Math.max(1, Math.abs(sum)) && sum <= 1) {
    const lengths = fractions.map((f) => Math.floor(n * f));
    const remainder = n - lengths.reduce((a, b) => a + b, 0);
    for (let i = 0; i < remainder; i++) lengths[i % lengths.length]! += 1;
    return lengths;
  }
  if (fractions.every((f) => Number.isInteger(f)) && sum === n) return [...fractions];
  throw new ResnetError(
    'ERR_RC_INVALID_ARGUMENT',
    `Expected fractions summing to 1 or integer lengths summing to the dataset length ${n} for fractions but received [${fractions.join(', ')}] (sum ${sum})`,
  );
}

function shuffle(values: Int32Array, rng: Random): void {
  for (let i = values.length - 1; i > 0; i--) {
    const j = rng.int(i + 1);
    const t = values[i]!;
    values[i] = values[j]!;
    values[j] = t;
  }
}

/** One {@link Subset} per fraction: a tuple for a tuple of fractions, so that destructuring needs no checks. */
export type SplitSubsets<F extends readonly number[]> = { -readonly [K in keyof F]: Subset };

/**
 * Splits `dataset` into disjoint random subsets that together cover every index, like
 * `torch.utils.data.random_split`: `fractions` are proportions summing to 1 (or integer lengths
 * summing to `dataset.length`), rounded as {@link splitLengths} describes. The indices of each
 * subset are in shuffled order.
 *
 * With `stratified: true` each class is split on its own (its count times each fraction, floored;
 * the remaining samples of the class go to the splits that are furthest behind their overall
 * target, among those with a non-zero fraction for that class), so every split holds each class in
 * proportion within one sample, and the split sizes stay within a sample or so of the unstratified
 * ones.
 *
 * @param dataset - any dataset; stratification reads `dataset.label(i)` for every index.
 * @param fractions - default `[0.8, 0.1, 0.1]` (train, validation, test).
 */
export function randomSplit(
  dataset: Dataset,
  fractions?: undefined,
  options?: RandomSplitOptions,
): [Subset, Subset, Subset];
export function randomSplit<const F extends readonly number[]>(
  dataset: Dataset,
  fractions: F,
  options?: RandomSplitOptions,
): SplitSubsets<F>;
export function randomSplit(
  dataset: Dataset,
  fractions: readonly number[] = [0.8, 0.1, 0.1],
  options?: RandomSplitOptions,
): Subset[] {
  const data = expectDataset('dataset', dataset);
  if (!Array.isArray(fractions) || fractions.length === 0) {
    invalid('fractions', 'a non-empty array of fractions or lengths', fractions);
  }
  fractions.forEach((f, i) => {
    if (typeof f !== 'number' || !Number.isFinite(f) || f < 0) {
      invalid(`fractions[${i}]`, 'a finite non-negative number', f);
    }
  });
  const o = expectOptions<RandomSplitOptions>('randomSplit options', options, ['seed', 'stratified']);
  const rng = new Random(resolveSeed('seed', o.seed));
  const stratified = o.stratified === undefined ? false : expectBool('stratified', o.stratified);
  const n = data.length;
  const lengths = splitLengths(n, fractions);
  if (!stratified) {
    const order = new Int32Array(n);
    for (let i = 0; i < n; i++) order[i] = i;
    shuffle(order, rng);
    let offset = 0;
    return lengths.map((len) => new Subset(data, order.subarray(offset, (offset += len))));
  }
  // Integer lengths become the equivalent fractions.
  const shares = lengths.map((len) => (n === 0 ? 0 : len / n));
  const byClass = new Map<number, number[]>();
  for (let i = 0; i < n; i++) {
    const label = expectInt(`dataset.label(${i})`, data.label(i));
    let list = byClass.get(label);
    if (!list) byClass.set(label, (list = []));
    list.push(i);
  }
  const parts: number[][] = lengths.map(() => []);
  const target = lengths.map(() => 0);
  const assigned = lengths.map(() => 0);
  for (const [, list] of [...byClass].sort(([a], [b]) => a - b)) {
    const members = Int32Array.from(list);
    shuffle(members, rng);
    const exact = shares.map((s) => members.length * s);
    const counts = exact.map((e) => Math.floor(e));
    let remainder = members.length - counts.reduce((a, b) => a + b, 0);
    exact.forEach((e, s) => (target[s]! += e));
    // Remainders go where the running total lags its target most, so that rounding does not pile
    // up in the first split across many small classes; only splits whose exact share has a
    // fractional part are eligible, which keeps each class within one sample of its proportion.
    let eligible = exact.map((e, s) => s).filter((s) => exact[s]! - counts[s]! > 1e-9);
    if (eligible.length < remainder) eligible = exact.map((e, s) => s).filter((s) => shares[s]! > 0);
    eligible.sort((a, b) => target[b]! - assigned[b]! - counts[b]! - (target[a]! - assigned[a]! - counts[a]!) || a - b);
    for (let k = 0; remainder > 0; k++, remainder--) counts[eligible[k % eligible.length]!]! += 1;
    let offset = 0;
    counts.forEach((c, s) => {
      for (let k = 0; k < c; k++) parts[s]!.push(members[offset + k]!);
      offset += c;
      assigned[s]! += c;
    });
  }
  return parts.map((indices) => {
    const order = Int32Array.from(indices);
    shuffle(order, rng);
    return new Subset(data, order);
  });
}
