/**
 * torchvision's `CenterCrop`.
 * @packageDocumentation
 */
import type { RawJpegRequest } from '../../binding.js';
import { expectOptions, invalid } from '../../errors.js';
import type { DecodedImage, SampleRandom, TransformSpec } from '../types.js';
import { type EncodedJpeg, fusedJpeg } from './decode.js';
import { centerCrop, hflip, roundHalfEven } from './functional.js';
import { copySpecValue, expectSize, sizePair } from './options.js';
import { Transform } from './transform.js';

/** Options of {@link CenterCrop}. */
export interface CenterCropOptions {
  /** An int for a square, or `[height, width]`. */
  size: number | [number, number];
}

/**
 * torchvision's `CenterCrop`: the central box, at `round((H - h) / 2)`, `round((W - w) / 2)`
 * with Python's rounding, zero-padded where the image is smaller.
 */
export class CenterCrop extends Transform {
  readonly kind = 'CenterCrop';
  /** An int for a square, or `[height, width]`. */
  readonly size: number | [number, number];

  constructor(options: CenterCropOptions) {
    super();
    const o = expectOptions<CenterCropOptions>('CenterCrop options', options, ['size']);
    if (options === undefined) invalid('CenterCrop options', 'an options object with a size', options);
    this.size = expectSize('size', o.size);
  }

  spec(): TransformSpec {
    return { kind: this.kind, size: copySpecValue(this.size) };
  }

  apply(img: DecodedImage): DecodedImage {
    return centerCrop(img, sizePair(this.size));
  }

  override outputSize(): [number, number] {
    return sizePair(this.size);
  }

  override applyToJpeg(jpeg: EncodedJpeg, _rng: SampleRandom, mirror: () => boolean): DecodedImage {
    const [h, w] = sizePair(this.size);
    const flip = mirror();
    if (h > jpeg.height || w > jpeg.width) {
      const out = centerCrop(fusedJpeg(jpeg, {}), [h, w]);
      return flip ? hflip(out) : out;
    }
    return fusedJpeg(jpeg, { crop: this.#crop(jpeg), mirror: flip });
  }

  /** The request of a crop inside the image; null when the image is smaller (padding needed). */
  override jpegRequest(
    jpeg: { height: number; width: number },
    _rng: SampleRandom,
    mirror: () => boolean,
  ): Omit<RawJpegRequest, 'bytes'> | null {
    const [h, w] = sizePair(this.size);
    if (h > jpeg.height || w > jpeg.width) return null;
    return { crop: this.#crop(jpeg), mirror: mirror() };
  }

  #crop(jpeg: { height: number; width: number }): [number, number, number, number] {
    const [h, w] = sizePair(this.size);
    return [roundHalfEven((jpeg.height - h) / 2), roundHalfEven((jpeg.width - w) / 2), h, w];
  }
}
