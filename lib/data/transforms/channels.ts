/**
 * Channel conversions as transform steps: `ToRGB` and torchvision's `Grayscale`.
 * @packageDocumentation
 */
import { expectOneOf, expectOptions } from '../../errors.js';
import type { DecodedImage, TransformSpec } from '../types.js';
import { toGrayscale, toRGB } from './functional.js';
import { Transform } from './transform.js';

/** Converts to 3 channels: grey (IDX, grey JPEGs) is replicated, alpha is dropped. */
export class ToRGB extends Transform {
  readonly kind = 'ToRGB';

  constructor(options?: Record<string, never>) {
    super();
    expectOptions('ToRGB options', options, []);
  }

  spec(): TransformSpec {
    return { kind: this.kind };
  }

  apply(img: DecodedImage): DecodedImage {
    return toRGB(img);
  }

  override get commutesWithHorizontalFlip(): boolean {
    return true;
  }
}

/** Options of {@link Grayscale}. */
export interface GrayscaleOptions {
  /** 1 (default) or 3 (the grey value replicated). */
  numOutputChannels?: 1 | 3;
}

/** torchvision's `Grayscale`: PIL's luma, on 1 or 3 channels. */
export class Grayscale extends Transform {
  readonly kind = 'Grayscale';
  readonly numOutputChannels: 1 | 3;

  constructor(options: GrayscaleOptions = {}) {
    super();
    const o = expectOptions<GrayscaleOptions>('Grayscale options', options, ['numOutputChannels']);
    this.numOutputChannels = expectOneOf('numOutputChannels', o.numOutputChannels ?? 1, [1, 3] as const);
  }

  spec(): TransformSpec {
    return { kind: this.kind, numOutputChannels: this.numOutputChannels };
  }

  apply(img: DecodedImage): DecodedImage {
    const grey = toGrayscale(img);
    return this.numOutputChannels === 3 ? toRGB(grey) : grey;
  }

  override get commutesWithHorizontalFlip(): boolean {
    return true;
  }
}
