/**
 * Input conversion: uint8 NHWC images to normalised floats on the device in one pass.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { expectNumber, expectOneOf, expectOptions, invalid, mismatch } from '../errors.js';
import { opRecorder } from '../profile/hooks.js';
import { Tensor, expectTensor, type DType } from '../tensor.js';
import { ShapeCache } from './module.js';

/** ImageNet's per-channel mean, in [0, 1] units (torchvision's). */
export const IMAGENET_MEAN = [0.485, 0.456, 0.406] as const;
/** ImageNet's per-channel standard deviation, in [0, 1] units (torchvision's). */
export const IMAGENET_STD = [0.229, 0.224, 0.225] as const;

/** Options of {@link InputNormalize}. */
export interface InputNormalizeOptions {
  /** Per-channel mean in [0, 1] units; default ImageNet's. */
  mean?: readonly number[];
  /** Per-channel standard deviation in [0, 1] units; default ImageNet's. */
  std?: readonly number[];
  /** Output dtype: `f32`, or `bf16`/`f16` for mixed precision; default `f32`. */
  dtype?: DType;
}

/**
 * `(x / 255 - mean) / std` from a u8 `[N, H, W, C]` batch to a float batch on the same device,
 * optionally mirroring chosen samples left-right, as torchvision's `ToTensor` + `Normalize` (+
 * `RandomHorizontalFlip`). The output is owned and reused.
 */
export class InputNormalize {
  readonly mean: number[];
  readonly std: number[];
  readonly dtype: DType;
  readonly #out = new ShapeCache<Tensor>(2);
  #flip: Tensor | null = null;

  constructor(options: InputNormalizeOptions = {}) {
    const o = expectOptions<InputNormalizeOptions>('InputNormalize options', options, ['mean', 'std', 'dtype']);
    const mean = o.mean ?? IMAGENET_MEAN;
    const std = o.std ?? IMAGENET_STD;
    if (!Array.isArray(mean)) invalid('mean', 'an array of numbers', mean);
    if (!Array.isArray(std)) invalid('std', 'an array of numbers', std);
    if (mean.length !== std.length) {
      mismatch('std', `${mean.length} values (one per channel, like mean)`, `${std.length} values`);
    }
    this.mean = mean.map((v, i) => expectNumber(`mean[${i}]`, v));
    this.std = std.map((v, i) => expectNumber(`std[${i}]`, v, Number.MIN_VALUE));
    this.dtype = expectOneOf('dtype', o.dtype ?? 'f32', ['f32', 'bf16', 'f16'] as const);
  }

  /**
   * Converts `images`; `flip[i] != 0` mirrors sample i. `flip` is host bytes, or a u8 tensor `[N]`
   * on the images' device (read when the op runs, as a captured CUDA graph needs).
   */
  forward(images: Tensor, flip?: Uint8Array | Tensor): Tensor {
    expectTensor('images', images, { rank: 4, dtype: 'u8' });
    if (images.shape[3] !== this.mean.length) {
      mismatch('images', `an NHWC batch with ${this.mean.length} channels`, `shape [${images.shape.join(', ')}]`);
    }
    const out = this.#out.get(images, () => Tensor.empty(images.shape, { dtype: this.dtype, device: images.device }));
    let flipTensor: Tensor | undefined;
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('convert_input', 'input', images.device) : 0;
    if (flip instanceof Tensor) {
      expectTensor('flip', flip, { rank: 1, dtype: 'u8' });
      if (flip.shape[0] !== images.shape[0] || flip.device !== images.device) {
        mismatch(
          'flip',
          `a u8 tensor [${images.shape[0]}] on ${images.device}`,
          `[${flip.shape.join(', ')}] on ${flip.device}`,
        );
      }
      flipTensor = flip;
    } else if (flip !== undefined) {
      if (!(flip instanceof Uint8Array) || flip.length !== images.shape[0]) {
        mismatch(
          'flip',
          `a Uint8Array of ${images.shape[0]} values`,
          flip instanceof Uint8Array ? `${flip.length} values` : typeof flip,
        );
      }
      if (!this.#flip || this.#flip.numel !== flip.length || this.#flip.device !== images.device) {
        this.#flip?.dispose();
        this.#flip = Tensor.empty([flip.length], { dtype: 'u8', device: images.device });
      }
      this.#flip.raw.copyFromHost(flip);
      flipTensor = this.#flip;
    }
    addon().convertInput({
      src: images.raw,
      dst: out.raw,
      mean: this.mean,
      std: this.std,
      ...(flipTensor ? { flip: flipTensor.raw } : {}),
    });
    recorder?.end(token);
    return out;
  }

  /** Frees the output buffers. */
  dispose(): void {
    this.#out.clear();
    this.#flip?.dispose();
    this.#flip = null;
  }
}
