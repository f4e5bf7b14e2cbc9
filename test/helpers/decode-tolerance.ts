/**
 * How far a batch decoded on the device (nvJPEG) may be from the CPU loader's (libjpeg-turbo), after
 * the same crop, resize and flip: both resample with the same plan and integer arithmetic, so any
 * difference comes from the JPEG decoders.
 *
 * - The IDCT may differ by one level per sample (IEEE 1180 accuracy, as ITU-T T.83 specifies), the
 *   YCbCr-to-RGB rounding by one more.
 * - Subsampled chroma (4:2:0, the default of most encoders) is upsampled by libjpeg-turbo's "fancy"
 *   triangular filter and by another filter in nvJPEG; the two differ most at sharp colour edges.
 *
 * On an NVIDIA H200 (CUDA 13.0, bench/RESULTS.md of 2026-12-04), 4:4:4 JPEGs decoded to the same
 * bytes on both sides. With 4:2:0, the worst of 8 batches of 64 photographs had a mean difference
 * of 0.78 levels, 2.9% of the values more than 4 levels apart, 0.5% more than 8, and a largest
 * difference of 48. torchvision's own test of nvJPEG against libjpeg-turbo allows a mean
 * difference under 2 levels (test/test_image.py, `test_decode_jpeg_cuda`).
 * @packageDocumentation
 */

/** The per-batch bounds. */
export const DECODE_TOLERANCE = {
  /** The mean |difference|, in levels. */
  mean: 1,
  /** What counts as an outlier: a difference of more than this many levels. */
  level: 4,
  /** The share of outliers in a batch that may hold 4:2:0 JPEGs. */
  outliers: 0.05,
  /** The share of outliers when every JPEG is 4:4:4 (no chroma upsampling). */
  outliersWithoutSubsampling: 0.01,
} as const;

/** How far one decoded batch is from another, in levels. */
export interface DecodeDifference {
  /** The mean |difference|. */
  mean: number;
  /** The largest |difference|. */
  max: number;
  /** The share of values more than 4, 8 and 16 levels apart. */
  over: { 4: number; 8: number; 16: number };
}

/** The statistics of |a - b| over two batches of the same length. */
export function decodeDifference(a: Uint8Array, b: Uint8Array): DecodeDifference {
  if (a.length !== b.length) throw new Error(`decodeDifference: ${a.length} values against ${b.length}`);
  let sum = 0;
  let max = 0;
  const counts = { 4: 0, 8: 0, 16: 0 };
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i]! - b[i]!);
    sum += d;
    if (d > max) max = d;
    if (d > 4) counts[4]++;
    if (d > 8) counts[8]++;
    if (d > 16) counts[16]++;
  }
  const n = a.length;
  return { mean: sum / n, max, over: { 4: counts[4] / n, 8: counts[8] / n, 16: counts[16] / n } };
}
