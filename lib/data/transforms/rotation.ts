/**
 * torchvision's `RandomRotation`.
 * @packageDocumentation
 */
import { expectInt, expectNumber, expectOptions, invalid } from '../../errors.js';
import type { DecodedImage, SampleRandom, TransformSpec } from '../types.js';
import { rotate } from './functional.js';
import { copySpecValue, expectInterpolation, expectRange } from './options.js';
import { Transform } from './transform.js';

/** Options of {@link RandomRotation}. */
export interface RandomRotationOptions {
  /** A number `d` for angles in `[-d, d]`, or `[min, max]`, in degrees (counter-clockwise). */
  degrees: number | [number, number];
  /** `'nearest'` (default) or `'bilinear'`. */
  interpolation?: 'nearest' | 'bilinear';
  /** The value of pixels rotated in from outside: one for all channels or one per channel; default 0. */
  fill?: number | number[];
}

/**
 * torchvision's `RandomRotation` (expand = false, about the centre): an angle drawn uniformly from
 * `degrees`, counter-clockwise for positive angles.
 */
export class RandomRotation extends Transform {
  readonly kind = 'RandomRotation';
  /** The angle's `[min, max]` in degrees. */
  readonly degrees: [number, number];
  readonly interpolation: 'nearest' | 'bilinear';
  readonly fill: number | number[];

  constructor(options: RandomRotationOptions) {
    super();
    const o = expectOptions<RandomRotationOptions>('RandomRotation options', options, [
      'degrees',
      'interpolation',
      'fill',
    ]);
    if (options === undefined) invalid('RandomRotation options', 'an options object with degrees', options);
    if (typeof o.degrees === 'number') {
      const d = expectNumber('degrees', o.degrees, 0);
      this.degrees = [-d, d];
    } else {
      this.degrees = expectRange('degrees', o.degrees);
    }
    this.interpolation = expectInterpolation('interpolation', o.interpolation ?? 'nearest', ['nearest', 'bilinear']) as
      'nearest' | 'bilinear';
    const fill = o.fill ?? 0;
    if (typeof fill === 'number') this.fill = expectInt('fill', fill, 0, 255);
    else if (Array.isArray(fill) && (fill.length === 1 || fill.length === 3)) {
      this.fill = fill.map((v, i) => expectInt(`fill[${i}]`, v, 0, 255));
    } else invalid('fill', 'an integer in [0, 255] or an array of 1 or 3 of them', fill);
  }

  /** Draws the angle in degrees. */
  getParams(rng: SampleRandom): number {
    return rng.uniform(this.degrees[0], this.degrees[1]);
  }

  spec(): TransformSpec {
    return {
      kind: this.kind,
      degrees: [...this.degrees],
      interpolation: this.interpolation,
      fill: copySpecValue(this.fill),
    };
  }

  apply(img: DecodedImage, rng: SampleRandom): DecodedImage {
    return rotate(img, this.getParams(rng), { interpolation: this.interpolation, fill: this.fill });
  }
}
