/**
 * Element-wise ops and the input conversion in float64.
 * @packageDocumentation
 */

/** max(x, 0), NaN kept: torch.relu(nan) is nan. */
export function relu(x: ArrayLike<number>): Float64Array {
  const y = new Float64Array(x.length);
  for (let i = 0; i < x.length; ++i) y[i] = x[i]! < 0 ? 0 : x[i]!;
  return y;
}

/**
 * torch's threshold_backward for the ReLU: 0 where the output y is <= 0, else dy, so a NaN output
 * passes dy on and a NaN dy reaches dx only where the ReLU was open.
 */
export function reluBackward(y: ArrayLike<number>, dy: ArrayLike<number>): Float64Array {
  const dx = new Float64Array(y.length);
  for (let i = 0; i < y.length; ++i) dx[i] = y[i]! <= 0 ? 0 : dy[i]!;
  return dx;
}

/** a + b. */
export function add(a: ArrayLike<number>, b: ArrayLike<number>): Float64Array {
  const out = new Float64Array(a.length);
  for (let i = 0; i < a.length; ++i) out[i] = a[i]! + b[i]!;
  return out;
}

/** a * b element-wise, torch.mul. */
export function mul(a: ArrayLike<number>, b: ArrayLike<number>): Float64Array {
  const out = new Float64Array(a.length);
  for (let i = 0; i < a.length; ++i) out[i] = a[i]! * b[i]!;
  return out;
}

/** a + weight * (b − a), torch.lerp with a scalar weight. */
export function lerp(a: ArrayLike<number>, b: ArrayLike<number>, weight: number): Float64Array {
  const out = new Float64Array(a.length);
  for (let i = 0; i < a.length; ++i) out[i] = a[i]! + weight * (b[i]! - a[i]!);
  return out;
}

/**
 * u8 images `[N,H,W,C]` to (x/255 − mean[c]) / std[c], with sample i mirrored left-right when
 * flip[i] is non-zero.
 */
export function convertInput(
  src: ArrayLike<number>,
  shape: readonly [number, number, number, number],
  mean: readonly number[],
  std: readonly number[],
  flip?: ArrayLike<number>,
): Float64Array {
  const [n, h, w, c] = shape;
  const dst = new Float64Array(n * h * w * c);
  for (let i = 0; i < n; ++i) {
    const mirrored = flip !== undefined && flip[i] !== 0;
    for (let y = 0; y < h; ++y) {
      for (let x = 0; x < w; ++x) {
        const from = ((i * h + y) * w + (mirrored ? w - 1 - x : x)) * c;
        const to = ((i * h + y) * w + x) * c;
        for (let k = 0; k < c; ++k) dst[to + k] = (src[from + k]! / 255 - mean[k]!) / std[k]!;
      }
    }
  }
  return dst;
}
