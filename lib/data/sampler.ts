/**
 * Samplers: the order in which a {@link DataLoader} visits dataset indices, like
 * `torch.utils.data.{SequentialSampler, RandomSampler, DistributedSampler}`. Shuffling samplers are
 * seeded per epoch (`setEpoch`), so an epoch's order depends only on `(seed, epoch)`: the same on
 * every run and, for {@link DistributedSampler}, on every rank.
 * @packageDocumentation
 */
import { expectBool, expectInt, expectOptions } from '../errors.js';
import { Random } from '../random.js';

/**
 * An epoch's sequence of dataset indices. Iterating gives the order for the current epoch;
 * `setEpoch` (when present) selects the epoch, and the {@link DataLoader} calls it before each one.
 */
export interface Sampler extends Iterable<number> {
  /** Number of indices one epoch yields. */
  readonly length: number;
  /** Selects the epoch whose order the next iteration yields. */
  setEpoch?(epoch: number): void;
}

/**
 * Mixes a seed and an epoch into one 32-bit generator seed. A hash rather than `seed + epoch`
 * (PyTorch's choice) so that seed 1 at epoch 0 does not repeat seed 0 at epoch 1.
 */
function mixSeed(seed: number, epoch: number): number {
  let h = Math.imul((seed >>> 0) ^ 0x9e3779b9, 0x85ebca6b) >>> 0;
  h = Math.imul(h ^ (h >>> 13) ^ (epoch >>> 0), 0xc2b2ae35) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x27d4eb2f) >>> 0;
  return (h ^ (h >>> 15)) >>> 0;
}

/** A uniformly random permutation of `[0, n)` (Fisher-Yates) that depends only on `(seed, epoch)`. */
export function permutation(n: number, seed: number, epoch: number): Int32Array {
  const out = new Int32Array(n);
  for (let i = 0; i < n; i++) out[i] = i;
  const rng = new Random(mixSeed(seed, epoch));
  for (let i = n - 1; i > 0; i--) {
    const j = rng.int(i + 1);
    const t = out[i]!;
    out[i] = out[j]!;
    out[j] = t;
  }
  return out;
}

function checkEpoch(epoch: unknown): number {
  return expectInt('epoch', epoch, 0);
}

/** A random 32-bit seed for samplers and loaders constructed without one. */
export function randomSeed(): number {
  return Math.floor(Math.random() * 2 ** 32) >>> 0;
}

/** Options of {@link SequentialSampler}. */
export interface SequentialSamplerOptions {
  /** Number of samples (usually `dataset.length`). */
  length: number;
}

/** Yields `0, 1, …, length - 1` every epoch. */
export class SequentialSampler implements Sampler {
  /** Number of indices per epoch. */
  readonly length: number;

  constructor(options: SequentialSamplerOptions) {
    const o = expectOptions<SequentialSamplerOptions>('SequentialSampler options', options, ['length']);
    this.length = expectInt('length', o.length, 0);
  }

  /** Accepted for uniformity with the shuffling samplers; the order never changes. */
  setEpoch(epoch: number): void {
    checkEpoch(epoch);
  }

  *[Symbol.iterator](): Iterator<number> {
    for (let i = 0; i < this.length; i++) yield i;
  }
}

/** Options of {@link RandomSampler}. */
export interface RandomSamplerOptions {
  /** Number of samples (usually `dataset.length`). */
  length: number;
  /** Seed of the permutations; random (fixed for this sampler's lifetime) when omitted. */
  seed?: number;
}

/**
 * A fresh random permutation of `[0, length)` every epoch, without replacement. The permutation
 * is a function of `(seed, epoch)`: call `setEpoch(e)` (the DataLoader does) to move on.
 */
export class RandomSampler implements Sampler {
  /** Number of indices per epoch. */
  readonly length: number;
  /** The seed of the permutations. */
  readonly seed: number;
  #epoch = 0;

  constructor(options: RandomSamplerOptions) {
    const o = expectOptions<RandomSamplerOptions>('RandomSampler options', options, ['length', 'seed']);
    this.length = expectInt('length', o.length, 0);
    this.seed = o.seed === undefined ? randomSeed() : expectInt('seed', o.seed, 0, 2 ** 32 - 1);
  }

  /** The epoch whose permutation the next iteration yields. */
  get epoch(): number {
    return this.#epoch;
  }

  /** Selects the epoch whose permutation the next iteration yields. */
  setEpoch(epoch: number): void {
    this.#epoch = checkEpoch(epoch);
  }

  *[Symbol.iterator](): Iterator<number> {
    yield* permutation(this.length, this.seed, this.#epoch);
  }
}

/** Options of {@link DistributedSampler}. */
export interface DistributedSamplerOptions {
  /** Number of samples in the whole dataset. */
  length: number;
  /** This process's rank, `0 <= rank < worldSize`. */
  rank: number;
  /** Number of processes sharing the dataset. */
  worldSize: number;
  /** Shuffle every epoch (with the same permutation on every rank); default true. */
  shuffle?: boolean;
  /** Seed of the permutations; must be the same on every rank; default 0. */
  seed?: number;
  /**
   * Drop the tail so that every rank gets `floor(length / worldSize)` samples, instead of padding
   * by repeating the first indices up to `ceil(length / worldSize)` per rank; default false.
   */
  dropLast?: boolean;
}

/**
 * One rank's share of the dataset for data-parallel training, with PyTorch's
 * `DistributedSampler` semantics: the indices (permuted by `(seed, epoch)` when shuffling) are
 * padded by repeating the first ones to a multiple of `worldSize` (or the tail is dropped with
 * `dropLast`), and rank `r` takes `indices[r], indices[r + worldSize], …`. Every rank gets the same
 * number of samples, so the ranks step in lock-step. The permutation comes from this package's
 * generator, so it is not PyTorch's order for the same seed.
 */
export class DistributedSampler implements Sampler {
  /** Number of samples in the whole dataset. */
  readonly datasetLength: number;
  /** This process's rank. */
  readonly rank: number;
  /** Number of ranks. */
  readonly worldSize: number;
  /** Whether each epoch is shuffled. */
  readonly shuffle: boolean;
  /** The permutations' seed. */
  readonly seed: number;
  /** Whether the tail is dropped rather than padded. */
  readonly dropLast: boolean;
  /** Number of indices this rank yields per epoch. */
  readonly length: number;
  /** `length * worldSize`: the padded (or truncated) number of indices across all ranks. */
  readonly totalSize: number;
  #epoch = 0;

  constructor(options: DistributedSamplerOptions) {
    const o = expectOptions<DistributedSamplerOptions>('DistributedSampler options', options, [
      'length',
      'rank',
      'worldSize',
      'shuffle',
      'seed',
      'dropLast',
    ]);
    this.datasetLength = expectInt('length', o.length, 0);
    this.worldSize = expectInt('worldSize', o.worldSize, 1);
    this.rank = expectInt('rank', o.rank, 0, this.worldSize - 1);
    this.shuffle = o.shuffle === undefined ? true : expectBool('shuffle', o.shuffle);
    this.seed = o.seed === undefined ? 0 : expectInt('seed', o.seed, 0, 2 ** 32 - 1);
    this.dropLast = o.dropLast === undefined ? false : expectBool('dropLast', o.dropLast);
    const n = this.datasetLength;
    // PyTorch: with drop_last and an uneven split, ceil((n - world) / world) == floor(n / world).
    this.length =
      this.dropLast && n % this.worldSize !== 0 ? Math.floor(n / this.worldSize) : Math.ceil(n / this.worldSize);
    this.totalSize = this.length * this.worldSize;
  }

  /** The epoch whose order the next iteration yields. */
  get epoch(): number {
    return this.#epoch;
  }

  /** Selects the epoch; call it with the same value on every rank before each epoch. */
  setEpoch(epoch: number): void {
    this.#epoch = checkEpoch(epoch);
  }

  /** This rank's indices for the current epoch. */
  indices(): Int32Array {
    const n = this.datasetLength;
    const all = this.shuffle ? permutation(n, this.seed, this.#epoch) : Int32Array.from({ length: n }, (_, i) => i);
    const out = new Int32Array(this.length);
    // Position p of the padded list is all[p % n]: padding repeats the first indices, cycling
    // through them again when the padding is longer than the dataset (PyTorch does the same).
    for (let k = 0, p = this.rank; k < this.length; k++, p += this.worldSize) out[k] = all[p % n]!;
    return out;
  }

  *[Symbol.iterator](): Iterator<number> {
    yield* this.indices();
  }
}
