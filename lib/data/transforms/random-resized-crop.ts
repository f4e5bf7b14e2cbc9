/**
 * torchvision's `RandomResizedCrop`.
 * @packageDocumentation
 */
import { expectInt, expectOptions, invalid } from '../../errors.js';
import { randomInt } from '../sample-random.js';
import type { DecodedImage, SampleRandom, TransformSpec } from '../types.js';
import type { RawJpegRequest } from '../../binding.js';
import { type CropBox, type Interpolation, resizedCrop, roundHalfEven } from './functional.js';
import { copySpecValue, expectInterpolation, expectRange, expectSize, sizePair } from './options.js';
import { Transform } from './transform.js';

/** Options of {@link RandomResizedCrop}. */
export interface RandomResizedCropOptions {
  /** Output size: an int for a square, or `[height, width]`. */
  size: number | [number, number];
  /** Range of the crop's area as a fraction of the image's; default `[0.08, 1]`. */
  scale?: [number, number];
  /** Range of the crop's aspect ratio (width / height); default `[3/4, 4/3]`. */
  ratio?: [number, number];
  /** Default `'bilinear'`. */
  interpolation?: Interpolation;
}

/**
 * torchvision's `RandomResizedCrop`: a crop of random area (a `scale` fraction of the image) and
 * aspect ratio (log-uniform in `ratio`) at a random position, resized to `size`. On a JPEG it
 * crops and resizes in the decoder's pipeline.
 */
export class RandomResizedCrop extends Transform {
  readonly kind = 'RandomResizedCrop';
  /** Output size, as given: an int for a square, or `[height, width]`. */
  readonly size: number | [number, number];
  /** Range of the crop's area as a fraction of the image's. */
  readonly scale: [number, number];
  /** Range of the crop's aspect ratio (width / height). */
  readonly ratio: [number, number];
  readonly interpolation: Interpolation;

  constructor(options: RandomResizedCropOptions) {
    super();
    const o = expectOptions<RandomResizedCropOptions>('RandomResizedCrop options', options, [
      'size',
      'scale',
      'ratio',
      'interpolation',
    ]);
    if (options === undefined) invalid('RandomResizedCrop options', 'an options object with a size', options);
    this.size = expectSize('size', o.size);
    this.scale = expectRange('scale', o.scale ?? [0.08, 1], 0);
    this.ratio = expectRange('ratio', o.ratio ?? [3 / 4, 4 / 3], Number.MIN_VALUE);
    this.interpolation = expectInterpolation('interpolation', o.interpolation ?? 'bilinear');
  }

  /**
   * torchvision's `get_params`: up to 10 attempts at `area = H * W * U(scale)`,
   * `aspect = exp(U(log ratio))`, `w = round(sqrt(area * aspect))`, `h = round(sqrt(area / aspect))`,
   * accepted when `0 < w <= W` and `0 < h <= H` with `top = randint(0, H - h)` and
   * `left = randint(0, W - w)`; otherwise the central crop with the aspect ratio clamped to `ratio`.
   */
  static getParams(
    height: number,
    width: number,
    rng: SampleRandom,
    scale: readonly [number, number] = [0.08, 1],
    ratio: readonly [number, number] = [3 / 4, 4 / 3],
  ): CropBox {
    expectInt('height', height, 1);
    expectInt('width', width, 1);
    const area = height * width;
    const logLo = Math.log(ratio[0]);
    const logHi = Math.log(ratio[1]);
    for (let attempt = 0; attempt < 10; attempt++) {
      const targetArea = area * rng.uniform(scale[0], scale[1]);
      const aspect = Math.exp(rng.uniform(logLo, logHi));
      const w = roundHalfEven(Math.sqrt(targetArea * aspect));
      const h = roundHalfEven(Math.sqrt(targetArea / aspect));
      if (w > 0 && w <= width && h > 0 && h <= height) {
        const top = randomInt(rng, height - h + 1);
        const left = randomInt(rng, width - w + 1);
        return { top, left, height: h, width: w };
      }
    }
    const inRatio = width / height;
    let w: number;
    let h: number;
    if (inRatio < Math.min(ratio[0], ratio[1])) {
      w = width;
      h = roundHalfEven(w / Math.min(ratio[0], ratio[1]));
    } else if (inRatio > Math.max(ratio[0], ratio[1])) {
      h = height;
      w = roundHalfEven(h * Math.max(ratio[0], ratio[1]));
    } else {
      w = width;
      h = height;
    }
    return { top: Math.floor((height - h) / 2), left: Math.floor((width - w) / 2), height: h, width: w };
  }

  /** {@link RandomResizedCrop.getParams} with this transform's scale and ratio. */
  getParams(height: number, width: number, rng: SampleRandom): CropBox {
    return RandomResizedCrop.getParams(height, width, rng, this.scale, this.ratio);
  }

  spec(): TransformSpec {
    return {
      kind: this.kind,
      size: copySpecValue(this.size),
      scale: [...this.scale],
      ratio: [...this.ratio],
      interpolation: this.interpolation,
    };
  }

  apply(img: DecodedImage, rng: SampleRandom): DecodedImage {
    return resizedCrop(img, this.getParams(img.height, img.width, rng), sizePair(this.size), this.interpolation);
  }

  override outputSize(): [number, number] {
    return sizePair(this.size);
  }

  override jpegRequest(
    jpeg: { height: number; width: number },
    rng: SampleRandom,
    mirror: () => boolean,
  ): Omit<RawJpegRequest, 'bytes'> {
    const box = this.getParams(jpeg.height, jpeg.width, rng);
    const flip = mirror();
    return {
      crop: [box.top, box.left, box.height, box.width],
      size: sizePair(this.size),
      filter: this.interpolation,
      mirror: flip,
    };
  }
}
