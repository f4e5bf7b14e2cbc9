/**
 * A small seeded random number generator, so that every failing op test can be replayed exactly
 * from the seed printed in its message.
 * @packageDocumentation
 */
import { randomInt } from 'node:crypto';

/** A fresh 32-bit seed from the OS, for suites that want new inputs on every run. */
export function freshSeed(): number {
  return randomInt(0, 0x1_0000_0000);
}

/** Seeded generator: mulberry32 for uniforms, Box-Muller for normals. */
export class Rng {
  private state: number;
  private spare: number | undefined;

  constructor(seed: number) {
    this.state = seed >>> 0;
  }

  /** Uniform in [0, 1), 32 bits of resolution. */
  uniform(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 0x1_0000_0000;
  }

  /** Uniform in [lo, hi). */
  range(lo: number, hi: number): number {
    return lo + (hi - lo) * this.uniform();
  }

  /** Integer uniform in [lo, hi). */
  int(lo: number, hi: number): number {
    return lo + Math.floor((hi - lo) * this.uniform());
  }

  /** Standard normal. */
  normal(): number {
    if (this.spare !== undefined) {
      const v = this.spare;
      this.spare = undefined;
      return v;
    }
    // 1 - u keeps the argument of log in (0, 1].
    const u = 1 - this.uniform();
    const v = this.uniform();
    const r = Math.sqrt(-2 * Math.log(u));
    this.spare = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  }

  /** `count` normals with the given mean and standard deviation. */
  normals(count: number, mean = 0, std = 1): Float64Array {
    const out = new Float64Array(count);
    for (let i = 0; i < count; ++i) out[i] = mean + std * this.normal();
    return out;
  }

  /** `count` uniforms in [lo, hi). */
  uniforms(count: number, lo: number, hi: number): Float64Array {
    const out = new Float64Array(count);
    for (let i = 0; i < count; ++i) out[i] = this.range(lo, hi);
    return out;
  }

  /** In-place Fisher-Yates shuffle. */
  shuffle<T extends { length: number; [i: number]: unknown }>(items: T): T {
    for (let i = items.length - 1; i > 0; --i) {
      const j = this.int(0, i + 1);
      const tmp = items[i];
      items[i] = items[j];
      items[j] = tmp;
    }
    return items;
  }
}
