/**
 * The arithmetic of INT8 post-training quantization: per-channel weight scales, histograms of
 * activation magnitudes, and the clipping thresholds chosen from them (maximum, percentile, and the
 * KL-divergence search of NVIDIA's calibrator). Symmetric throughout: a value `x` is stored as
 * `q = clamp(round(x / scale))`, with `q` in [-128, 127] (s8) or [0, 255] (u8, for non-negative
 * inputs), and `scale = threshold / 127` or `threshold / 255` (so the threshold maps to 127 or 255;
 * weights are within [-127, 127] by construction, activations clipped below saturate at -128 as
 * oneDNN's and ONNX's QuantizeLinear do).
 * @packageDocumentation
 */
import { expectInt, expectNumber, invalid } from '../errors.js';

/** The largest stored value of a signed (s8, symmetric) and an unsigned (u8) quantized tensor. */
export const INT8_MAX = { signed: 127, unsigned: 255 } as const;

/** Bins of an {@link AbsHistogram} (TensorRT's calibrator uses 2048 as well). */
export const HISTOGRAM_BINS = 2048;

/**
 * The widths weights can be quantized to: 8 bits (values in [-127, 127]), or 7 bits ([-63, 63]),
 * whose products with u8 or s8 activations never saturate the 16-bit pair sums of int8 kernels
 * without VNNI, so that the plan computes the quantized arithmetic exactly on every CPU.
 */
export const WEIGHT_BITS = [8, 7] as const;
/** One of {@link WEIGHT_BITS}. */
export type WeightBits = (typeof WEIGHT_BITS)[number];

/**
 * Per-output-channel symmetric weight scales: `max |w| / 127` (8 bits) or `max |w| / 63` (7 bits)
 * over each channel's `weight.length / outChannels` values (a channel of zeros gets 1, any positive
 * scale represents it exactly).
 */
export function weightScales(weight: Float32Array, outChannels: number, bits: WeightBits = 8): Float32Array {
  expectInt('outChannels', outChannels, 1);
  if (!WEIGHT_BITS.includes(bits)) invalid('bits', `one of ${WEIGHT_BITS.join(', ')}`, bits);
  const largest = 2 ** (bits - 1) - 1;
  if (weight.length % outChannels !== 0) {
    invalid('weight', `a multiple of ${outChannels} values (one block per output channel)`, `${weight.length} values`);
  }
  const per = weight.length / outChannels;
  const scales = new Float32Array(outChannels);
  for (let o = 0; o < outChannels; o++) {
    let max = 0;
    for (let i = o * per; i < (o + 1) * per; i++) max = Math.max(max, Math.abs(weight[i]!));
    scales[o] = max > 0 ? max / largest : 1;
  }
  return scales;
}

/** The scale that maps `threshold` to the largest stored value (1 for a tensor that was all zeros). */
export function scaleOf(threshold: number, unsigned: boolean): number {
  if (!(threshold > 0) || !Number.isFinite(threshold)) return 1;
  return threshold / (unsigned ? INT8_MAX.unsigned : INT8_MAX.signed);
}

/** Rounds half to even, as the CPU's default rounding (and oneDNN's reorders and kernels) do. */
export function roundHalfEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x - Math.trunc(x)) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** `clamp(round(x / scale))` in s8 ([-128, 127]) or u8 ([0, 255]). */
export function quantize(x: number, scale: number, unsigned: boolean): number {
  const q = roundHalfEven(x / scale);
  return unsigned ? Math.min(INT8_MAX.unsigned, Math.max(0, q)) : Math.min(127, Math.max(-128, q));
}

/**
 * A histogram of `|x|` over `[0, range)` in {@link HISTOGRAM_BINS} equal bins, filled in one pass:
 * when a value beyond the range arrives the range doubles as often as needed and adjacent bins
 * merge in pairs, which keeps the counts exact (only the resolution halves), so the final range is
 * less than twice the largest value seen.
 */
export class AbsHistogram {
  /** Counts per bin. */
  readonly counts = new Float64Array(HISTOGRAM_BINS);
  /** The upper end of the last bin (0 until a non-zero value is added). */
  range = 0;
  /** The largest `|x|` added. */
  max = 0;
  /** How many values were added. */
  total = 0;

  /** Width of one bin. */
  get binWidth(): number {
    return this.range / HISTOGRAM_BINS;
  }

  /** Adds the magnitudes of `values` (NaN is refused: a calibration over NaN has no meaning). */
  add(values: Float32Array): void {
    let max = 0;
    for (const x of values) {
      const v = Math.abs(x);
      if (!(v <= max)) {
        if (Number.isNaN(v)) invalid('values', 'finite activations (the model produced NaN)', 'NaN');
        max = v;
      }
    }
    if (!Number.isFinite(max)) invalid('values', 'finite activations (the model produced infinity)', max);
    if (max > this.max) this.max = max;
    if (max > 0 && this.range === 0) this.range = max;
    while (max >= this.range && this.range > 0) this.#grow();
    const bins = HISTOGRAM_BINS;
    const perUnit = this.range > 0 ? bins / this.range : 0;
    const counts = this.counts;
    for (const x of values) {
      const b = Math.floor(Math.abs(x) * perUnit);
      counts[b < bins ? b : bins - 1]!++;
    }
    this.total += values.length;
  }

  #grow(): void {
    const c = this.counts;
    for (let i = 0; i < HISTOGRAM_BINS / 2; i++) c[i] = c[2 * i]! + c[2 * i + 1]!;
    c.fill(0, HISTOGRAM_BINS / 2);
    this.range *= 2;
  }
}

/**
 * The smallest threshold below which at least `percentile`% of the magnitudes lie (the upper edge
 * of the bin where the cumulative count reaches it), never above the largest value seen.
 */
export function percentileThreshold(hist: AbsHistogram, percentile: number): number {
  expectNumber('percentile', percentile, 0, 100);
  if (hist.total === 0 || hist.range === 0) return 0;
  const target = (hist.total * percentile) / 100;
  let sum = 0;
  for (let i = 0; i < HISTOGRAM_BINS; i++) {
    sum += hist.counts[i]!;
    if (sum >= target) return Math.min(hist.max, (i + 1) * hist.binWidth);
  }
  return hist.max;
}

/** KL(p || q) of two unnormalised distributions of equal support; terms with p = 0 add nothing. */
function klDivergence(p: Float64Array, q: Float64Array): number {
  let sp = 0;
  let sq = 0;
  for (let i = 0; i < p.length; i++) {
    sp += p[i]!;
    sq += q[i]!;
  }
  let kl = 0;
  for (let i = 0; i < p.length; i++) {
    const pi = p[i]! / sp;
    if (pi === 0) continue;
    const qi = q[i]! / sq;
    // A bin that p has and q lost costs as if q kept a tiny mass there (q is spread over the non-zero
    // bins of each group, so this arises only from rounding).
    kl += pi * Math.log(pi / (qi > 0 ? qi : 1e-12));
  }
  return kl;
}

/**
 * The threshold of least information loss, NVIDIA's entropy calibration (Migacz, "8-bit Inference
 * with TensorRT", GTC 2017): for each candidate number of bins `i` from `levels` up, the reference
 * distribution `P` is the first `i` bins with the mass beyond folded into the last; the candidate
 * `Q` merges those `i` bins into `levels` groups and spreads each group's mass evenly over its
 * non-empty bins; the `i` that minimises KL(P || Q) gives the threshold `(i + 0.5) * binWidth`.
 * `levels` is the quantized levels of the magnitude: 128 for s8, 256 for u8.
 */
export function entropyThreshold(hist: AbsHistogram, levels: number): number {
  expectInt('levels', levels, 2, HISTOGRAM_BINS);
  if (hist.total === 0 || hist.range === 0) return 0;
  const counts = hist.counts;
  let last = HISTOGRAM_BINS;
  while (last > 0 && counts[last - 1] === 0) last--;
  if (last <= levels) return hist.max; // every value already fits the levels at full resolution
  let best = last;
  let bestKl = Infinity;
  let beyond = 0;
  for (let i = last + 1; i < HISTOGRAM_BINS; i++) beyond += counts[i]!;
  // Walk i downwards so the mass beyond i accumulates as it goes.
  const p = new Float64Array(HISTOGRAM_BINS);
  const q = new Float64Array(HISTOGRAM_BINS);
  for (let i = last; i >= levels; i--) {
    if (i < last) beyond += counts[i]!;
    const pi = p.subarray(0, i);
    const qi = q.subarray(0, i);
    pi.set(counts.subarray(0, i));
    pi[i - 1] = pi[i - 1]! + beyond;
    for (let g = 0; g < levels; g++) {
      const start = Math.floor((g * i) / levels);
      const end = Math.floor(((g + 1) * i) / levels);
      let mass = 0;
      let nonzero = 0;
      for (let j = start; j < end; j++) {
        mass += counts[j]!;
        if (counts[j] !== 0) nonzero++;
      }
      const share = nonzero > 0 ? mass / nonzero : 0;
      for (let j = start; j < end; j++) qi[j] = counts[j] !== 0 ? share : 0;
    }
    const kl = klDivergence(pi, qi);
    if (kl < bestKl) {
      bestKl = kl;
      best = i;
    }
  }
  return Math.min(hist.max, (best + 0.5) * hist.binWidth);
}
