/**
 * The base class of the transform steps.
 * @packageDocumentation
 */
import type { DecodedImage, SampleRandom, TransformSpec } from '../types.js';
import type { RawJpegRequest } from '../../binding.js';
import { type EncodedJpeg, fusedJpeg } from './decode.js';

/** A transform step: applies itself to a decoded image, drawing randomness from the sample's stream. */
export abstract class Transform {
  /** The name in specs, e.g. `'RandomResizedCrop'`. */
  abstract readonly kind: string;

  /** The plain description {@link transformFromSpec} rebuilds this transform from. */
  abstract spec(): TransformSpec;

  /** Applies the transform; never modifies `img`. */
  abstract apply(img: DecodedImage, rng: SampleRandom): DecodedImage | Promise<DecodedImage>;

  /**
   * The output `[height, width]` for an input of `input` (null: unknown), or null when it depends
   * on an unknown input. Transforms that keep the size return `input`.
   */
  outputSize(input: [number, number] | null): [number, number] | null {
    return input;
  }

  /**
   * Whether the transform gives the same result on a mirrored image as mirrored results, so that
   * a horizontal flip before it can be deferred to the device.
   */
  get commutesWithHorizontalFlip(): boolean {
    return false;
  }

  /**
   * Decodes and transforms a JPEG in one native call (only the region the output needs is
   * decoded), or returns null when this transform has no such path. Draws exactly what `apply`
   * would, then calls `mirror()` once, which draws a following flip's decision; when true the
   * result is mirrored too. `centerCrop` (only given to transforms whose
   * {@link Transform.takesCenterCrop} is true, and never larger than their output) is a
   * CenterCrop that follows this transform, taken before the mirroring.
   * @internal
   */
  applyToJpeg(
    jpeg: EncodedJpeg,
    rng: SampleRandom,
    mirror: () => boolean,
    centerCrop?: [number, number],
  ): DecodedImage | Promise<DecodedImage> | null {
    const request = this.jpegRequest(jpeg, rng, mirror, centerCrop);
    return request ? fusedJpeg(jpeg, request) : null;
  }

  /**
   * What {@link Transform.applyToJpeg} asks the JPEG decoder for (crop, resize, window, mirror),
   * with the same draws, without decoding: the CPU decoder and the device's take the same request.
   * Null when this transform (or this image, e.g. a CenterCrop larger than it) has no such path.
   * @internal
   */
  jpegRequest(
    _jpeg: { height: number; width: number },
    _rng: SampleRandom,
    _mirror: () => boolean,
    _centerCrop?: [number, number],
  ): Omit<RawJpegRequest, 'bytes'> | null {
    return null;
  }

  /** Whether {@link Transform.applyToJpeg} can take a following CenterCrop in its pipeline. @internal */
  get takesCenterCrop(): boolean {
    return false;
  }
}
