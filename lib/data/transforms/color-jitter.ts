/**
 * torchvision's `ColorJitter`.
 * @packageDocumentation
 */
import { expectNumber, expectOptions, mismatch } from '../../errors.js';
import { randomInt } from '../sample-random.js';
import type { DecodedImage, SampleRandom, TransformSpec } from '../types.js';
import { adjustBrightness, adjustContrast, adjustHue, adjustSaturation } from './functional.js';
import { expectRange } from './options.js';
import { Transform } from './transform.js';

/** A jitter range: a number `v` (torchvision's `[max(0, 1 - v), 1 + v]`, or `[-v, v]` for hue) or `[min, max]`. */
export type JitterRange = number | [number, number] | null;

/** Options of {@link ColorJitter}. */
export interface ColorJitterOptions {
  /** Brightness factor range (non-negative); off by default. */
  brightness?: JitterRange;
  /** Contrast factor range (non-negative); off by default. */
  contrast?: JitterRange;
  /** Saturation factor range (non-negative); off by default. */
  saturation?: JitterRange;
  /** Hue shift range in turns: at most 0.5, or within [-0.5, 0.5]; off by default. */
  hue?: JitterRange;
}

/** The factors {@link ColorJitter} drew for a sample; null where the adjustment is off. */
export interface ColorJitterParams {
  /** The order of the four adjustments (0 brightness, 1 contrast, 2 saturation, 3 hue). */
  order: number[];
  brightness: number | null;
  contrast: number | null;
  saturation: number | null;
  hue: number | null;
}

function jitterRange(
  name: string,
  value: unknown,
  center: number,
  bound: [number, number],
  clipFirstOnZero: boolean,
): [number, number] | null {
  if (value === undefined || value === null) return null;
  let range: [number, number];
  if (typeof value === 'number') {
    expectNumber(name, value, 0);
    range = [center - value, center + value];
    if (clipFirstOnZero) range[0] = Math.max(range[0], 0);
  } else {
    range = expectRange(name, value);
  }
  if (range[0] < bound[0] || range[1] > bound[1]) {
    mismatch(name, `values within [${bound[0]}, ${bound[1]}]`, `[${range[0]}, ${range[1]}]`);
  }
  // torchvision turns an adjustment off when its range is exactly the identity.
  return range[0] === center && range[1] === center ? null : range;
}

/**
 * torchvision's `ColorJitter`: brightness, contrast, saturation and hue adjusted by factors drawn
 * uniformly from their ranges, in a random order. Brightness blends with black, contrast with
 * the mean grey level, saturation with the grey image (PIL's `ImageEnhance`), hue shifts in HSV.
 */
export class ColorJitter extends Transform {
  readonly kind = 'ColorJitter';
  /** The brightness factor's `[min, max]`, or null when off (as every range below). */
  readonly brightness: [number, number] | null;
  readonly contrast: [number, number] | null;
  readonly saturation: [number, number] | null;
  /** The hue shift's `[min, max]` in turns. */
  readonly hue: [number, number] | null;

  constructor(options: ColorJitterOptions = {}) {
    super();
    const o = expectOptions<ColorJitterOptions>('ColorJitter options', options, [
      'brightness',
      'contrast',
      'saturation',
      'hue',
    ]);
    this.brightness = jitterRange('brightness', o.brightness, 1, [0, Infinity], true);
    this.contrast = jitterRange('contrast', o.contrast, 1, [0, Infinity], true);
    this.saturation = jitterRange('saturation', o.saturation, 1, [0, Infinity], true);
    this.hue = jitterRange('hue', o.hue, 0, [-0.5, 0.5], false);
  }

  /** torchvision's `get_params`: a random permutation of the four, then each enabled factor. */
  getParams(rng: SampleRandom): ColorJitterParams {
    const order = [0, 1, 2, 3];
    for (let i = 3; i > 0; i--) {
      const j = randomInt(rng, i + 1);
      const t = order[i]!;
      order[i] = order[j]!;
      order[j] = t;
    }
    const draw = (r: [number, number] | null) => (r === null ? null : rng.uniform(r[0], r[1]));
    return {
      order,
      brightness: draw(this.brightness),
      contrast: draw(this.contrast),
      saturation: draw(this.saturation),
      hue: draw(this.hue),
    };
  }

  spec(): TransformSpec {
    const r = (v: [number, number] | null) => (v === null ? null : [...v]);
    return {
      kind: this.kind,
      brightness: r(this.brightness),
      contrast: r(this.contrast),
      saturation: r(this.saturation),
      hue: r(this.hue),
    };
  }

  apply(img: DecodedImage, rng: SampleRandom): DecodedImage {
    const params = this.getParams(rng);
    let out = img;
    for (const op of params.order) {
      if (op === 0 && params.brightness !== null) out = adjustBrightness(out, params.brightness);
      else if (op === 1 && params.contrast !== null) out = adjustContrast(out, params.contrast);
      else if (op === 2 && params.saturation !== null) out = adjustSaturation(out, params.saturation);
      else if (op === 3 && params.hue !== null) out = adjustHue(out, params.hue);
    }
    return out;
  }

  override get commutesWithHorizontalFlip(): boolean {
    return true;
  }
}
