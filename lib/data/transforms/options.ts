/**
 * The argument checks that the transforms share: decoded images, interpolation modes, ranges,
 * torchvision sizes, and the copies that keep specs independent of the transform.
 * @packageDocumentation
 */
import { expectInt, expectNumber, expectOneOf, expectPair, invalid, mismatch } from '../../errors.js';
import type { DecodedImage } from '../types.js';
import { type Interpolation, INTERPOLATIONS } from './functional.js';

/** Validates a decoded image: a Uint8Array of height * width * channels bytes, 1 to 4 channels. */
export function expectImage(name: string, value: unknown): DecodedImage {
  if (value === null || typeof value !== 'object') {
    invalid(name, 'a decoded image { data, height, width, channels }', value);
  }
  const img = value as DecodedImage;
  if (!(img.data instanceof Uint8Array)) invalid(`${name}.data`, 'a Uint8Array', img.data);
  expectInt(`${name}.height`, img.height, 1);
  expectInt(`${name}.width`, img.width, 1);
  expectInt(`${name}.channels`, img.channels, 1, 4);
  if (img.data.length !== img.height * img.width * img.channels) {
    mismatch(
      `${name}.data`,
      `${img.height * img.width * img.channels} bytes (height ${img.height} x width ${img.width} x channels ${img.channels})`,
      `${img.data.length} bytes`,
    );
  }
  return img;
}

/** Validates an interpolation mode, one of `allowed`. */
export function expectInterpolation(
  name: string,
  value: unknown,
  allowed: readonly Interpolation[] = INTERPOLATIONS,
): Interpolation {
  return expectOneOf(name, value, allowed);
}

/** A `[min, max]` pair of finite numbers with min <= max. */
export function expectRange(name: string, value: unknown, min = -Infinity, max = Infinity): [number, number] {
  if (!Array.isArray(value) || value.length !== 2) invalid(name, 'a [min, max] pair of numbers', value);
  const lo = expectNumber(`${name}[0]`, value[0], min, max);
  const hi = expectNumber(`${name}[1]`, value[1], min, max);
  if (lo > hi) mismatch(name, 'a [min, max] pair with min <= max', `[${lo}, ${hi}]`);
  return [lo, hi];
}

/** A torchvision size: an int (square) or `[height, width]`; kept in the form given for specs. */
export function expectSize(name: string, value: unknown): number | [number, number] {
  const pair = expectPair(name, value, 1);
  return typeof value === 'number' ? pair[0] : pair;
}

/** A torchvision size as `[height, width]`. */
export function sizePair(size: number | [number, number]): [number, number] {
  return typeof size === 'number' ? [size, size] : [size[0], size[1]];
}

/** A copy of a spec value that shares no array with the transform. */
export function copySpecValue<T>(v: T): T {
  return (Array.isArray(v) ? [...v] : v) as T;
}
