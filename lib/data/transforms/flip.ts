/**
 * torchvision's `RandomHorizontalFlip`.
 * @packageDocumentation
 */
import { expectNumber, expectOptions } from '../../errors.js';
import type { DecodedImage, SampleRandom, TransformSpec } from '../types.js';
import { hflip } from './functional.js';
import { Transform } from './transform.js';

/** Options of {@link RandomHorizontalFlip}. */
export interface RandomHorizontalFlipOptions {
  /** Probability of a flip; default 0.5. */
  p?: number;
}

/**
 * torchvision's `RandomHorizontalFlip`: mirrors the image with probability `p` (one draw per
 * sample, whatever `p`). {@link Compose.run} with `deferFlip` reports the decision instead, for
 * the device's input conversion to mirror.
 */
export class RandomHorizontalFlip extends Transform {
  readonly kind = 'RandomHorizontalFlip';
  /** Probability of a flip. */
  readonly p: number;

  constructor(options: RandomHorizontalFlipOptions = {}) {
    super();
    const o = expectOptions<RandomHorizontalFlipOptions>('RandomHorizontalFlip options', options, ['p']);
    this.p = expectNumber('p', o.p ?? 0.5, 0, 1);
  }

  /** Draws the flip decision (what `apply` would do). */
  draw(rng: SampleRandom): boolean {
    return rng.next() < this.p;
  }

  spec(): TransformSpec {
    return { kind: this.kind, p: this.p };
  }

  apply(img: DecodedImage, rng: SampleRandom): DecodedImage {
    return this.draw(rng) ? hflip(img) : img;
  }

  override get commutesWithHorizontalFlip(): boolean {
    return true;
  }
}
