/**
 * Number formats and error measures shared by the op tests: bf16 and fp16 rounding that matches
 * native/core/dtype.h bit for bit, and the relative error used for every comparison.
 * @packageDocumentation
 */
import type { Rng } from './rng.js';

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The bits of `v` as an IEEE float32 (after rounding `v` to float32). */
export function f32Bits(v: number): number {
  f32[0] = v;
  return u32[0]!;
}

/** The float32 whose bits are `bits`. */
export function f32FromBits(bits: number): number {
  u32[0] = bits >>> 0;
  return f32[0]!;
}

/**
 * bf16 bits of `v`, rounded to nearest even through float32, quiet NaN kept: `floatToBf16` in
 * native/core/dtype.h.
 */
export function f32ToBf16Bits(v: number): number {
  const u = f32Bits(v);
  if ((u & 0x7fffffff) > 0x7f800000) return ((u >>> 16) | 0x40) & 0xffff;
  // No 32-bit overflow: the largest non-NaN input is -inf, 0xff800000, far from 2^32 - 0x8000.
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

/** The value of bf16 bits. */
export function bf16BitsToF32(bits: number): number {
  return f32FromBits((bits & 0xffff) << 16);
}

/** `v` rounded to the nearest bf16 value. */
export function roundBf16(v: number): number {
  return bf16BitsToF32(f32ToBf16Bits(v));
}

function nearbyIntEven(x: number): number {
  const floor = Math.floor(x);
  const frac = x - floor;
  if (frac > 0.5) return floor + 1;
  if (frac < 0.5) return floor;
  return floor % 2 === 0 ? floor : floor + 1;
}

/** IEEE half bits of `v`, rounded to nearest even through float32: `floatToHalf` in dtype.cc. */
export function f32ToF16Bits(v: number): number {
  const u = f32Bits(v);
  const sign = (u >>> 16) & 0x8000;
  const abs = u & 0x7fffffff;
  if (abs > 0x7f800000) return sign | 0x7e00;
  if (abs >= 0x477ff000) return sign | 0x7c00;
  if (abs < 0x38800000) return sign | nearbyIntEven(Math.abs(f32FromBits(u)) * 16777216);
  const rounded = abs + 0xfff + ((abs >>> 13) & 1);
  return sign | ((rounded - 0x38000000) >>> 13);
}

/** The value of IEEE half bits. */
export function f16BitsToF32(bits: number): number {
  const sign = (bits & 0x8000) !== 0 ? -1 : 1;
  const exponent = (bits >>> 10) & 0x1f;
  const mantissa = bits & 0x3ff;
  if (exponent === 0) return sign * mantissa * 2 ** -24;
  if (exponent === 0x1f) return mantissa === 0 ? sign * Infinity : NaN;
  return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15);
}

/** `v` rounded to the nearest fp16 value. */
export function roundF16(v: number): number {
  return f16BitsToF32(f32ToF16Bits(v));
}

/** Floating dtypes the reference can round to. */
export type FloatFormat = 'f32' | 'bf16' | 'f16';

/** Each value rounded to what a tensor of `format` stores, as a new array. */
export function quantize(values: ArrayLike<number>, format: FloatFormat): Float64Array {
  const round = format === 'bf16' ? roundBf16 : format === 'f16' ? roundF16 : Math.fround;
  const out = new Float64Array(values.length);
  for (let i = 0; i < values.length; ++i) out[i] = round(values[i]!);
  return out;
}

/**
 * ‖out − ref‖₂ / ‖ref‖₂ over the whole tensor (the absolute norm when ref is all zeros); NaN when
 * `out` holds a NaN, so `!(err <= tol)` rejects it.
 */
export function relError(out: ArrayLike<number>, ref: ArrayLike<number>): number {
  if (out.length !== ref.length) throw new Error(`relError: lengths differ (${out.length} vs ${ref.length})`);
  let diff = 0;
  let norm = 0;
  for (let i = 0; i < ref.length; ++i) {
    const d = out[i]! - ref[i]!;
    diff += d * d;
    norm += ref[i]! * ref[i]!;
  }
  return norm === 0 ? Math.sqrt(diff) : Math.sqrt(diff / norm);
}

/** The largest |out − ref| and where it is, for failure messages. */
export function worstElement(
  out: ArrayLike<number>,
  ref: ArrayLike<number>,
): { index: number; out: number; ref: number } {
  let index = 0;
  let worst = -1;
  for (let i = 0; i < ref.length; ++i) {
    const d = Math.abs(out[i]! - ref[i]!);
    if (!(d <= worst)) {
      worst = d;
      index = i;
      if (Number.isNaN(d)) break;
    }
  }
  return { index, out: out[index]!, ref: ref[index]! };
}

/**
 * `count` distinct values, each exactly representable in bf16 (and so in every float format
 * here), in random order, with magnitudes in [2^-8, 8). Max pooling tests use them so that no
 * window has a tie, whatever the dtype; neighbours differ by at least 2^-15.
 */
export function distinctValues(rng: Rng, count: number): Float64Array {
  const pool: number[] = [];
  for (let e = -8; e < 3; ++e) {
    for (let m = 0; m < 128; ++m) {
      const v = (1 + m / 128) * 2 ** e;
      pool.push(v, -v);
    }
  }
  if (count > pool.length) throw new Error(`distinctValues: at most ${pool.length} values, asked for ${count}`);
  rng.shuffle(pool);
  return Float64Array.from(pool.slice(0, count));
}

/** NaN, +inf and −inf, the values every op must carry through as PyTorch does. */
export const SPECIAL_VALUES: readonly number[] = [NaN, Infinity, -Infinity];

/**
 * A copy of `values` with `count` elements at random positions replaced by NaN, +inf and −inf in
 * turn (at least one of each when count ≥ 3).
 */
export function withSpecials(rng: Rng, values: ArrayLike<number>, count: number): Float64Array {
  const out = Float64Array.from(values);
  const positions = Array.from({ length: out.length }, (_, i) => i);
  rng.shuffle(positions);
  for (let i = 0; i < Math.min(count, out.length); ++i) out[positions[i]!] = SPECIAL_VALUES[i % SPECIAL_VALUES.length]!;
  return out;
}
