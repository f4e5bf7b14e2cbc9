/**
 * Float64 references of the quantization-aware training ops, computed with the f32 roundings the
 * native kernels make (an f32 quotient, rounded half to even; an f32 product), so that they agree
 * exactly in f32 and after the output's rounding to bf16.
 * @packageDocumentation
 */

/** f32's machine epsilon: the floor of every scale. */
export const SCALE_FLOOR = 2 ** -23;

/** Rounds half to even (C's rint in the default rounding mode, ONNX QuantizeLinear's rounding). */
export function roundHalfEven(v: number): number {
  const r = Math.round(v);
  return Math.abs(v % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** The quantization level of `x` for scale `s` before clamping: rint(f32(x / s)). */
export function quantLevel(x: number, s: number): number {
  return roundHalfEven(Math.fround(x / s));
}

/** The scale of element `i` of a tensor of `n` elements with `scales.length` scales along dim 0. */
function scaleAt(scales: ArrayLike<number>, n: number, i: number): number {
  return scales[Math.floor(i / (n / scales.length))]!;
}

/** y = clamp(rint(x / s), qmin, qmax) * s, with s per tensor (one scale) or per dim-0 slice. */
export function fakeQuantize(
  x: ArrayLike<number>,
  scales: ArrayLike<number>,
  qmin: number,
  qmax: number,
): Float64Array {
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) {
    const s = scaleAt(scales, x.length, i);
    out[i] = Math.fround(Math.min(Math.max(quantLevel(x[i]!, s), qmin), qmax) * s);
  }
  return out;
}

/** The straight-through gradient: dy inside the representable range, 0 outside. */
export function fakeQuantizeBackward(
  x: ArrayLike<number>,
  scales: ArrayLike<number>,
  dy: ArrayLike<number>,
  qmin: number,
  qmax: number,
): Float64Array {
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) {
    const q = quantLevel(x[i]!, scaleAt(scales, x.length, i));
    out[i] = q >= qmin && q <= qmax ? dy[i]! : 0;
  }
  return out;
}

/** max(max |x_g| / qmax, eps) per group of dim 0 (`groups` of them). */
export function absMaxScale(x: ArrayLike<number>, groups: number, qmax: number): Float64Array {
  const per = x.length / groups;
  const out = new Float64Array(groups);
  for (let g = 0; g < groups; g++) {
    let m = 0;
    for (let i = g * per; i < (g + 1) * per; i++) m = Math.max(m, Math.abs(x[i]!));
    out[g] = Math.max(Math.fround(m / qmax), SCALE_FLOOR);
  }
  return out;
}

/** PyTorch's MovingAverageMinMaxObserver step: the new [min, max] and the symmetric scale. */
export function observeMinMax(
  x: ArrayLike<number>,
  state: readonly [number, number],
  averagingConstant: number,
  qmax: number,
): { minMax: [number, number]; scale: number } {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of Array.from(x)) {
    lo = Math.min(lo, v);
    hi = Math.max(hi, v);
  }
  const first = state[0] === Infinity && state[1] === -Infinity;
  const min = first ? lo : state[0] + averagingConstant * (lo - state[0]);
  const max = first ? hi : state[1] + averagingConstant * (hi - state[1]);
  return { minMax: [min, max], scale: Math.max(Math.max(-min, max, 0) / qmax, SCALE_FLOOR) };
}
