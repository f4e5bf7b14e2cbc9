/**
 * Max and average pooling in float64, NHWC, with PyTorch's semantics: floor-mode output size,
 * padding never wins a max, average pooling counts padding (count_include_pad=True).
 * @packageDocumentation
 */
import type { RawPool2dOptions } from '../../lib/binding.js';

/** A pooling window's sizes, as the native plan takes them; stride defaults to the kernel, padding to 0. */
export type Pool2dGeometry = Omit<RawPool2dOptions, 'device' | 'dtype' | 'kind'>;

/** Geometry with every optional field filled in and the output size. */
export interface ResolvedPool2d extends Required<Pool2dGeometry> {
  outH: number;
  outW: number;
}

/** Fills in defaults and computes the output size. */
export function resolvePool2d(g: Pool2dGeometry): ResolvedPool2d {
  const strideH = g.strideH ?? g.kernelH;
  const strideW = g.strideW ?? g.kernelW;
  const padH = g.padH ?? 0;
  const padW = g.padW ?? 0;
  const outH = Math.floor((g.h + 2 * padH - g.kernelH) / strideH) + 1;
  const outW = Math.floor((g.w + 2 * padW - g.kernelW) / strideW) + 1;
  return { ...g, strideH, strideW, padH, padW, outH, outW };
}

// For each output element: its flat index, and the flat x indices of the real input elements of
// its window in row-major window order (which decides "first" among equal maxima), and the
// divisor PyTorch's avg_pool2d uses with count_include_pad (the window clipped to the padded input).
function forEachWindow(g: ResolvedPool2d, body: (yIndex: number, xIndices: number[], divisor: number) => void): void {
  const xIndices: number[] = [];
  for (let n = 0; n < g.n; ++n) {
    for (let oh = 0; oh < g.outH; ++oh) {
      for (let ow = 0; ow < g.outW; ++ow) {
        const h0 = oh * g.strideH - g.padH;
        const w0 = ow * g.strideW - g.padW;
        const divisor = (Math.min(h0 + g.kernelH, g.h + g.padH) - h0) * (Math.min(w0 + g.kernelW, g.w + g.padW) - w0);
        for (let c = 0; c < g.c; ++c) {
          xIndices.length = 0;
          for (let ih = Math.max(h0, 0); ih < Math.min(h0 + g.kernelH, g.h); ++ih) {
            for (let iw = Math.max(w0, 0); iw < Math.min(w0 + g.kernelW, g.w); ++iw) {
              xIndices.push(((n * g.h + ih) * g.w + iw) * g.c + c);
            }
          }
          body(((n * g.outH + oh) * g.outW + ow) * g.c + c, xIndices, divisor);
        }
      }
    }
  }
}

/**
 * Max pooling: y, and for each y element the flat index of the first maximum in its window. A NaN
 * wins, and the last NaN of the window holds the index (PyTorch's `val > max || isnan(val)`); a
 * window of -inf keeps its first element.
 */
export function maxPool2dForward(
  geometry: Pool2dGeometry,
  x: ArrayLike<number>,
): { y: Float64Array; argmax: Int32Array } {
  const g = resolvePool2d(geometry);
  const y = new Float64Array(g.n * g.outH * g.outW * g.c);
  const argmax = new Int32Array(y.length);
  forEachWindow(g, (yi, xs) => {
    let best = -Infinity;
    let at = xs[0] ?? -1;
    for (const xi of xs) {
      if (x[xi]! > best || Number.isNaN(x[xi]!)) {
        best = x[xi]!;
        at = xi;
      }
    }
    y[yi] = best;
    argmax[yi] = at;
  });
  return { y, argmax };
}

/** Max pooling's dx: each dy goes to the element {@link maxPool2dForward} chose in its window (PyTorch). */
export function maxPool2dBackward(geometry: Pool2dGeometry, x: ArrayLike<number>, dy: ArrayLike<number>): Float64Array {
  const g = resolvePool2d(geometry);
  const { argmax } = maxPool2dForward(g, x);
  const dx = new Float64Array(g.n * g.h * g.w * g.c);
  for (let i = 0; i < argmax.length; ++i) {
    const at = argmax[i]!;
    if (at >= 0) dx[at] = dx[at]! + dy[i]!;
  }
  return dx;
}

/** Average pooling counting padded elements as zeros (count_include_pad=True). */
export function avgPool2dForward(geometry: Pool2dGeometry, x: ArrayLike<number>): Float64Array {
  const g = resolvePool2d(geometry);
  const y = new Float64Array(g.n * g.outH * g.outW * g.c);
  forEachWindow(g, (yi, xs, divisor) => {
    let sum = 0;
    for (const xi of xs) sum += x[xi]!;
    y[yi] = sum / divisor;
  });
  return y;
}

/** Average pooling's dx. */
export function avgPool2dBackward(geometry: Pool2dGeometry, dy: ArrayLike<number>): Float64Array {
  const g = resolvePool2d(geometry);
  const dx = new Float64Array(g.n * g.h * g.w * g.c);
  forEachWindow(g, (yi, xs, divisor) => {
    const d = dy[yi]! / divisor;
    for (const xi of xs) dx[xi] = dx[xi]! + d;
  });
  return dx;
}
