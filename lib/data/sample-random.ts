/**
 * Counter-based randomness for per-sample transforms: the draws of a sample depend only on
 * `(seed, epoch, index)`, never on which worker processes it or in which order, so a run with any
 * number of workers produces the same augmented images.
 * @packageDocumentation
 */
import { expectInt } from '../errors.js';
import type { SampleRandom } from './types.js';

const TWO_32 = 4294967296;

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}

/** murmur3's 32-bit finaliser: every input bit affects every output bit. */
function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** murmur3_32 over 32-bit words, from a given seed (one seed per state word gives 128 bits). */
function murmurWords(words: readonly number[], seed: number): number {
  let h = seed >>> 0;
  for (const w of words) {
    let k = Math.imul(w, 0xcc9e2d51);
    k = rotl(k, 15);
    k = Math.imul(k, 0x1b873593);
    h ^= k;
    h = rotl(h, 13);
    h = (Math.imul(h, 5) + 0xe6546b64) | 0;
  }
  return fmix32(h ^ (words.length * 4));
}

/** Splits a safe integer into its low and high 32-bit words (two's complement for negatives). */
function words64(v: number): [number, number] {
  return [v >>> 0, Math.floor(v / TWO_32) >>> 0];
}

/**
 * A xoshiro128** generator whose 128-bit state is a hash of `(seed, epoch, index)`. Use
 * {@link sampleRandom} to make one.
 */
export class SampleRng implements SampleRandom {
  #s0: number;
  #s1: number;
  #s2: number;
  #s3: number;

  /** @param state - four 32-bit words, not all zero. */
  constructor(state: readonly [number, number, number, number]) {
    [this.#s0, this.#s1, this.#s2, this.#s3] = state;
    // xoshiro's all-zero state is a fixed point; the hash makes it vanishingly unlikely, but be safe.
    if ((this.#s0 | this.#s1 | this.#s2 | this.#s3) === 0) this.#s0 = 0x9e3779b9;
  }

  /** The next 32-bit unsigned integer. */
  nextUint32(): number {
    const s1 = this.#s1;
    const result = Math.imul(rotl(Math.imul(s1, 5), 7), 9) >>> 0;
    const t = s1 << 9;
    this.#s2 ^= this.#s0;
    this.#s3 ^= this.#s1;
    this.#s1 ^= this.#s2;
    this.#s0 ^= this.#s3;
    this.#s2 ^= t;
    this.#s3 = rotl(this.#s3, 11);
    return result;
  }

  /** A uniform float in [0, 1), with 32 random bits. */
  next(): number {
    return this.nextUint32() / TWO_32;
  }

  /** A uniform float in [low, high). */
  uniform(low: number, high: number): number {
    return low + (high - low) * this.next();
  }

  /** A uniform integer in [0, n). */
  int(n: number): number {
    return randomInt(this, n);
  }
}

/**
 * The random stream of one sample in one epoch: the same `(seed, epoch, index)` always gives the
 * same draws, and neighbouring triples give unrelated ones (the triple is hashed with murmur3 into
 * a xoshiro128** state).
 *
 * @param seed - the run's seed, any safe integer.
 * @param epoch - the epoch, a non-negative safe integer.
 * @param index - the sample's index in the dataset, a non-negative safe integer.
 */
export function sampleRandom(seed: number, epoch: number, index: number): SampleRng {
  expectInt('seed', seed, Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER);
  expectInt('epoch', epoch, 0, Number.MAX_SAFE_INTEGER);
  expectInt('index', index, 0, Number.MAX_SAFE_INTEGER);
  const words = [...words64(seed), ...words64(epoch), ...words64(index)];
  // Four different hash seeds give four independent state words.
  return new SampleRng([
    murmurWords(words, 0x243f6a88),
    murmurWords(words, 0x85a308d3),
    murmurWords(words, 0x13198a2e),
    murmurWords(words, 0x03707344),
  ]);
}

/**
 * A uniform integer in [0, n) from any {@link SampleRandom} (like `torch.randint(0, n)`).
 * @param n - a positive integer.
 */
export function randomInt(rng: SampleRandom, n: number): number {
  const v = Math.floor(rng.next() * n);
  // Guards against a custom generator whose next() returns 1.
  return v < n ? v : n - 1;
}
