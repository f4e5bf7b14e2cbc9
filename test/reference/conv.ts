/**
 * conv2d and linear in float64, as naive loops in the native layouts: activations NHWC, conv
 * weights OHWI `[K,R,S,C]`, linear weights `[out,in]`.
 * @packageDocumentation
 */
import type { RawConv2dOptions } from '../../lib/binding.js';

/** A convolution's sizes, as the native plan takes them; strides default to 1, padding to 0, dilation to 1. */
export type Conv2dGeometry = Omit<RawConv2dOptions, 'device' | 'dtype' | 'bias'>;

/** Geometry with every optional field filled in and the output size (PyTorch's floor mode). */
export interface ResolvedConv2d extends Required<Conv2dGeometry> {
  outH: number;
  outW: number;
}

/** Fills in defaults and computes the output size. */
export function resolveConv2d(g: Conv2dGeometry): ResolvedConv2d {
  const strideH = g.strideH ?? 1;
  const strideW = g.strideW ?? 1;
  const padH = g.padH ?? 0;
  const padW = g.padW ?? 0;
  const dilationH = g.dilationH ?? 1;
  const dilationW = g.dilationW ?? 1;
  const outH = Math.floor((g.h + 2 * padH - dilationH * (g.kernelH - 1) - 1) / strideH) + 1;
  const outW = Math.floor((g.w + 2 * padW - dilationW * (g.kernelW - 1) - 1) / strideW) + 1;
  return { ...g, strideH, strideW, padH, padW, dilationH, dilationW, outH, outW };
}

// Calls body(yIndex, xIndex, wIndex) for every (output, tap, channel) triple that reads a real
// (unpadded) input element: the one loop nest all three conv directions share.
function forEachTap(g: ResolvedConv2d, body: (yIndex: number, xBase: number, wBase: number) => void): void {
  for (let n = 0; n < g.n; ++n) {
    for (let oh = 0; oh < g.outH; ++oh) {
      for (let ow = 0; ow < g.outW; ++ow) {
        for (let k = 0; k < g.k; ++k) {
          const yIndex = ((n * g.outH + oh) * g.outW + ow) * g.k + k;
          for (let r = 0; r < g.kernelH; ++r) {
            const ih = oh * g.strideH - g.padH + r * g.dilationH;
            if (ih < 0 || ih >= g.h) continue;
            for (let s = 0; s < g.kernelW; ++s) {
              const iw = ow * g.strideW - g.padW + s * g.dilationW;
              if (iw < 0 || iw >= g.w) continue;
              body(yIndex, ((n * g.h + ih) * g.w + iw) * g.c, ((k * g.kernelH + r) * g.kernelW + s) * g.c);
            }
          }
        }
      }
    }
  }
}

/** y[N,OH,OW,K] = conv(x[N,H,W,C], weight[K,R,S,C]) + bias[K]. */
export function conv2dForward(
  geometry: Conv2dGeometry,
  x: ArrayLike<number>,
  weight: ArrayLike<number>,
  bias?: ArrayLike<number>,
): Float64Array {
  const g = resolveConv2d(geometry);
  const y = new Float64Array(g.n * g.outH * g.outW * g.k);
  if (bias) for (let i = 0; i < y.length; ++i) y[i] = bias[i % g.k]!;
  forEachTap(g, (yi, xb, wb) => {
    let acc = 0;
    for (let c = 0; c < g.c; ++c) acc += x[xb + c]! * weight[wb + c]!;
    y[yi] = y[yi]! + acc;
  });
  return y;
}

/** dx[N,H,W,C] = dL/dx given dy[N,OH,OW,K]. */
export function conv2dBackwardData(
  geometry: Conv2dGeometry,
  dy: ArrayLike<number>,
  weight: ArrayLike<number>,
): Float64Array {
  const g = resolveConv2d(geometry);
  const dx = new Float64Array(g.n * g.h * g.w * g.c);
  forEachTap(g, (yi, xb, wb) => {
    const d = dy[yi]!;
    for (let c = 0; c < g.c; ++c) dx[xb + c] = dx[xb + c]! + d * weight[wb + c]!;
  });
  return dx;
}

/** The weight gradient `[K,R,S,C]` and bias gradient `[K]` (fresh, not accumulated). */
export function conv2dBackwardWeights(
  geometry: Conv2dGeometry,
  x: ArrayLike<number>,
  dy: ArrayLike<number>,
): { dWeight: Float64Array; dBias: Float64Array } {
  const g = resolveConv2d(geometry);
  const dWeight = new Float64Array(g.k * g.kernelH * g.kernelW * g.c);
  const dBias = new Float64Array(g.k);
  for (let i = 0; i < dy.length; ++i) dBias[i % g.k] = dBias[i % g.k]! + dy[i]!;
  forEachTap(g, (yi, xb, wb) => {
    const d = dy[yi]!;
    for (let c = 0; c < g.c; ++c) dWeight[wb + c] = dWeight[wb + c]! + d * x[xb + c]!;
  });
  return { dWeight, dBias };
}

/** A fully connected layer's sizes. */
export interface LinearGeometry {
  n: number;
  in: number;
  out: number;
}

/** y[N,out] = x[N,in] · weight[out,in]ᵀ + bias[out]. */
export function linearForward(
  g: LinearGeometry,
  x: ArrayLike<number>,
  weight: ArrayLike<number>,
  bias?: ArrayLike<number>,
): Float64Array {
  const y = new Float64Array(g.n * g.out);
  for (let n = 0; n < g.n; ++n) {
    for (let o = 0; o < g.out; ++o) {
      let acc = bias ? bias[o]! : 0;
      for (let i = 0; i < g.in; ++i) acc += x[n * g.in + i]! * weight[o * g.in + i]!;
      y[n * g.out + o] = acc;
    }
  }
  return y;
}

/** dx[N,in] = dy[N,out] · weight[out,in]. */
export function linearBackwardData(g: LinearGeometry, dy: ArrayLike<number>, weight: ArrayLike<number>): Float64Array {
  const dx = new Float64Array(g.n * g.in);
  for (let n = 0; n < g.n; ++n) {
    for (let o = 0; o < g.out; ++o) {
      const d = dy[n * g.out + o]!;
      for (let i = 0; i < g.in; ++i) dx[n * g.in + i] = dx[n * g.in + i]! + d * weight[o * g.in + i]!;
    }
  }
  return dx;
}

/** dWeight[out,in] = dyᵀ · x and dBias[out] = Σₙ dy (fresh, not accumulated). */
export function linearBackwardWeights(
  g: LinearGeometry,
  x: ArrayLike<number>,
  dy: ArrayLike<number>,
): { dWeight: Float64Array; dBias: Float64Array } {
  const dWeight = new Float64Array(g.out * g.in);
  const dBias = new Float64Array(g.out);
  for (let n = 0; n < g.n; ++n) {
    for (let o = 0; o < g.out; ++o) {
      const d = dy[n * g.out + o]!;
      dBias[o] = dBias[o]! + d;
      for (let i = 0; i < g.in; ++i) dWeight[o * g.in + i] = dWeight[o * g.in + i]! + d * x[n * g.in + i]!;
    }
  }
  return { dWeight, dBias };
}
