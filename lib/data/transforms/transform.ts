/**
 * The base class of the transform steps.
 * @packageDocumentation
 */
import type { DecodedImage, SampleRandom, TransformSpec } from '../types.js';
import type { EncodedJpeg } from './decode.js';

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
    _jpeg: EncodedJpeg,
    _rng: SampleRandom,
    _mirror: () => boolean,
    _centerCrop?: [number, number],
  ): DecodedImage | Promise<DecodedImage> | null {
    return null;
  }

  /** Whether {@link Transform.applyToJpeg} can take a following CenterCrop in its pipeline. @internal */
  get takesCenterCrop(): boolean {
    return false;
  }
}
