/**
 * IEEE 754 half precision (binary16) conversion: f32 values to the bit patterns that ONNX stores
 * for FLOAT16 tensors, rounding to nearest with ties to even, as a hardware conversion does.
 * @packageDocumentation
 */

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The binary16 bit pattern nearest to `value` (ties to even; overflow to infinity; NaN stays NaN). */
export function float16Bits(value: number): number {
  f32[0] = value;
  const x = u32[0]!;
  const sign = (x >>> 16) & 0x8000;
  const exponent = (x >>> 23) & 0xff;
  const mantissa = x & 0x7fffff;
  if (exponent === 0xff) return sign | 0x7c00 | (mantissa !== 0 ? 0x200 : 0);
  const e = exponent - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    // A subnormal half (or zero): the significand with its implicit bit, shifted into 10 bits.
    if (e < -10) return sign;
    const full = mantissa | 0x800000;
    const shift = 14 - e;
    let half = full >>> shift;
    const rest = full & ((1 << shift) - 1);
    const middle = 1 << (shift - 1);
    if (rest > middle || (rest === middle && (half & 1) !== 0)) half++;
    return sign | half;
  }
  let half = (e << 10) | (mantissa >>> 13);
  const rest = mantissa & 0x1fff;
  // A carry out of the mantissa moves to the next binade, and past the largest one to infinity.
  if (rest > 0x1000 || (rest === 0x1000 && (half & 1) !== 0)) half++;
  return sign | half;
}

/** The binary16 bit patterns of `values`, element by element. */
export function toFloat16(values: Float32Array): Uint16Array {
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = float16Bits(values[i]!);
  return out;
}
