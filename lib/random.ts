/**
 * A small seeded random number generator (mulberry32 with Box-Muller normals), used for parameter
 * initialisation and the generated datasets so that runs are reproducible from a seed.
 * @packageDocumentation
 */
import { randomInt } from 'node:crypto';

/** A seeded pseudo-random generator. Not for cryptography. */
export class Random {
  #state: number;
  #spare: number | undefined;

  /** @param seed - any 32-bit integer; the same seed gives the same sequence. */
  constructor(seed: number = randomInt(0, 2 ** 31)) {
    this.#state = seed >>> 0;
  }

  /** A uniform float in [0, 1). */
  next(): number {
    let t = (this.#state = (this.#state + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** A uniform float in [low, high). */
  uniform(low: number, high: number): number {
    return low + (high - low) * this.next();
  }

  /** A uniform integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  /** A standard normal sample. */
  normal(): number {
    if (this.#spare !== undefined) {
      const s = this.#spare;
      this.#spare = undefined;
      return s;
    }
    let u = 0;
    while (u === 0) u = this.next();
    const v = this.next();
    const r = Math.sqrt(-2 * Math.log(u));
    this.#spare = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  }

  /** The generator's state, to save in a checkpoint. */
  get state(): number {
    return this.#state;
  }

  /** A new generator for a derived stream (e.g. one per layer), independent of later draws here. */
  fork(): Random {
    return new Random(Math.floor(this.next() * 2 ** 32));
  }
}
