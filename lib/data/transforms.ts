/**
 * torchvision-style image transforms on uint8 HWC images, seeded per sample, and the `Compose`
 * pipeline that decodes encoded files and runs them: JPEGs with libjpeg-turbo in the native addon,
 * fused with the first crop and resize so that only the needed region is decoded; other formats
 * (PNG, WebP, CMYK JPEGs) with sharp (libvips). This module gathers them; each has its file under
 * `transforms/` (the functional ops in `functional.ts`, decoding in `decode.ts`).
 *
 * Semantics and parameter names follow torchvision (camelCase): `RandomResizedCrop`,
 * `RandomHorizontalFlip`, `ColorJitter`, `RandomRotation`, `Resize`, `CenterCrop`, `Normalize`,
 * `Grayscale`, plus `ToRGB`. Every transform describes itself with `spec()` so that worker threads
 * rebuild the same pipeline with {@link Compose.fromSpec}, and draws its randomness from the
 * {@link SampleRandom} of the sample, so results do not depend on the worker.
 *
 * Resizing (RandomResizedCrop, Resize) is PIL's algorithm, in the native addon: the same filters
 * (triangle for bilinear, Catmull-Rom for bicubic, Lanczos-3, nearest at pixel centres), the
 * same fixed-point arithmetic and the same order of passes, so that on the same decoded pixels the
 * results are identical; JPEGs are decoded by libjpeg-turbo with the settings PIL uses (accurate
 * integer IDCT, fancy upsampling), so a JPEG's pixels match PIL's as well when the libjpeg-turbo
 * versions do.
 *
 * Deviations from torchvision (with PIL images, its default for files):
 * - A JPEG whose crop is reduced 4x or more is decoded at 1/2, 1/4 or 1/8 size in the DCT domain
 *   (as PIL's `draft` mode or libvips' shrink-on-load), keeping at least a 2x reduction for the
 *   filter; the result differs slightly from resizing the full-size decode.
 * - Embedded ICC profiles are ignored (as PIL does), but CMYK JPEGs are converted to sRGB with
 *   libvips' profile, not PIL's naive formula.
 * - ColorJitter's brightness, contrast and saturation reproduce PIL's `ImageEnhance` exactly
 *   (float32 blend, truncation, PIL's integer luma, the rounded mean); hue follows torchvision's
 *   tensor implementation (continuous HSV) and rounds to the nearest value, where PIL quantises
 *   hue to 1/255 turns and torchvision's tensor path truncates.
 * - RandomRotation's bilinear mode rounds to the nearest value; `expand` and `center` are not
 *   supported (always the centre, same size).
 * - A JPEG that does not end with its end-of-image marker (truncated, or with trailing data) is
 *   decoded whole before cropping, so that truncation fails whatever the crop; other damage
 *   after the rows a crop needs goes unnoticed, as the decoder stops there.
 * @packageDocumentation
 */
export { Transform } from './transforms/transform.js';
export type { Interpolation } from './transforms/functional.js';
export { RandomResizedCrop, type RandomResizedCropOptions } from './transforms/random-resized-crop.js';
export { RandomHorizontalFlip, type RandomHorizontalFlipOptions } from './transforms/flip.js';
export {
  ColorJitter,
  type ColorJitterOptions,
  type ColorJitterParams,
  type JitterRange,
} from './transforms/color-jitter.js';
export { RandomRotation, type RandomRotationOptions } from './transforms/rotation.js';
export { Resize, type ResizeOptions } from './transforms/resize.js';
export { CenterCrop, type CenterCropOptions } from './transforms/center-crop.js';
export { Normalize, type NormalizeOptions } from './transforms/normalize.js';
export { Grayscale, ToRGB, type GrayscaleOptions } from './transforms/channels.js';
export { TRANSFORM_KINDS, transformFromSpec } from './transforms/registry.js';
export {
  Compose,
  type ComposeOptions,
  type ComposeResult,
  type ComposeRunOptions,
  type ComposeSpec,
} from './transforms/compose.js';
