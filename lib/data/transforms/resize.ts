/**
 * torchvision's `Resize`.
 * @packageDocumentation
 */
import { expectInt, expectOptions, invalid } from '../../errors.js';
import type { DecodedImage, SampleRandom, TransformSpec } from '../types.js';
import type { RawJpegRequest } from '../../binding.js';
import { type Interpolation, resizedCrop, resizeOutputSize, roundHalfEven } from './functional.js';
import { copySpecValue, expectInterpolation, expectSize } from './options.js';
import { Transform } from './transform.js';

/** Options of {@link Resize}. */
export interface ResizeOptions {
  /** An int: the smaller edge becomes `size`, keeping the aspect ratio; `[height, width]`: exact. */
  size: number | [number, number];
  /** Default `'bilinear'`. */
  interpolation?: Interpolation;
  /** With an int size: the longer edge's maximum (torchvision's `max_size`). */
  maxSize?: number;
}

/**
 * torchvision's `Resize`. With an int size the smaller edge becomes `size` and the longer one
 * `int(size * long / short)`; an image already of the output size is returned as it is. On a JPEG
 * it resizes in the decoder's pipeline, with shrink-on-load.
 */
export class Resize extends Transform {
  readonly kind = 'Resize';
  /** An int (the smaller edge) or `[height, width]`. */
  readonly size: number | [number, number];
  readonly interpolation: Interpolation;
  readonly maxSize: number | undefined;

  constructor(options: ResizeOptions) {
    super();
    const o = expectOptions<ResizeOptions>('Resize options', options, ['size', 'interpolation', 'maxSize']);
    if (options === undefined) invalid('Resize options', 'an options object with a size', options);
    this.size = expectSize('size', o.size);
    this.interpolation = expectInterpolation('interpolation', o.interpolation ?? 'bilinear');
    if (o.maxSize !== undefined) {
      if (typeof this.size !== 'number') {
        invalid(
          'maxSize',
          'no maxSize with a [height, width] size (torchvision allows it only with an int size)',
          o.maxSize,
        );
      }
      this.maxSize = expectInt('maxSize', o.maxSize, this.size + 1);
    } else {
      this.maxSize = undefined;
    }
  }

  spec(): TransformSpec {
    return {
      kind: this.kind,
      size: copySpecValue(this.size),
      interpolation: this.interpolation,
      ...(this.maxSize !== undefined ? { maxSize: this.maxSize } : {}),
    };
  }

  apply(img: DecodedImage): DecodedImage {
    const [h, w] = resizeOutputSize([img.height, img.width], this.size, this.maxSize);
    if (h === img.height && w === img.width) return img;
    return resizedCrop(img, null, [h, w], this.interpolation);
  }

  override outputSize(input: [number, number] | null): [number, number] | null {
    if (typeof this.size !== 'number') return [this.size[0], this.size[1]];
    return input === null ? null : resizeOutputSize(input, this.size, this.maxSize);
  }

  override jpegRequest(
    jpeg: { height: number; width: number },
    _rng: SampleRandom,
    mirror: () => boolean,
    centerCrop?: [number, number],
  ): Omit<RawJpegRequest, 'bytes'> {
    const [h, w] = resizeOutputSize([jpeg.height, jpeg.width], this.size, this.maxSize);
    const flip = mirror();
    // A following CenterCrop is a window of the resized image: only its pixels are computed.
    const window: [number, number, number, number] | undefined = centerCrop
      ? [roundHalfEven((h - centerCrop[0]) / 2), roundHalfEven((w - centerCrop[1]) / 2), centerCrop[0], centerCrop[1]]
      : undefined;
    return { size: [h, w], ...(window ? { window } : {}), filter: this.interpolation, mirror: flip };
  }

  override get takesCenterCrop(): boolean {
    return true;
  }
}
