/**
 * torchvision's `Normalize`, which a loader hands to the device's input normalisation.
 * @packageDocumentation
 */
import { expectNumber, expectOptions, invalid } from '../../errors.js';
import type { DecodedImage, TransformSpec } from '../types.js';
import { Transform } from './transform.js';

/** Options of {@link Normalize}. */
export interface NormalizeOptions {
  /** Per-channel mean in [0, 1] units (one value, or one per channel). */
  mean: number[];
  /** Per-channel standard deviation in [0, 1] units, positive. */
  std: number[];
}

/**
 * torchvision's `Normalize`, which leaves the pixels alone here: normalisation happens on the
 * device in one pass (`InputNormalize`), with the mean and std from {@link Compose.normalization}.
 */
export class Normalize extends Transform {
  readonly kind = 'Normalize';
  readonly mean: number[];
  readonly std: number[];

  constructor(options: NormalizeOptions) {
    super();
    const o = expectOptions<NormalizeOptions>('Normalize options', options, ['mean', 'std']);
    if (options === undefined) invalid('Normalize options', 'an options object with mean and std', options);
    if (!Array.isArray(o.mean) || (o.mean.length !== 1 && o.mean.length !== 3)) {
      invalid('mean', 'an array of 1 or 3 numbers', o.mean);
    }
    if (!Array.isArray(o.std) || o.std.length !== o.mean.length) {
      invalid('std', `an array of ${o.mean.length} numbers (like mean)`, o.std);
    }
    this.mean = o.mean.map((v, i) => expectNumber(`mean[${i}]`, v));
    this.std = o.std.map((v, i) => expectNumber(`std[${i}]`, v, Number.MIN_VALUE));
  }

  spec(): TransformSpec {
    return { kind: this.kind, mean: [...this.mean], std: [...this.std] };
  }

  apply(img: DecodedImage): DecodedImage {
    return img;
  }

  override get commutesWithHorizontalFlip(): boolean {
    return true;
  }
}
