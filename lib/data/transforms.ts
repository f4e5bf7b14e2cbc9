/**
 * torchvision-style image transforms on uint8 HWC images, seeded per sample, and the `Compose`
 * pipeline that decodes encoded files and runs them: JPEGs with libjpeg-turbo in the native addon,
 * fused with the first crop and resize so that only the needed region is decoded; other formats
 * (PNG, WebP, CMYK JPEGs) with sharp (libvips).
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
import type { Sharp } from 'sharp';
import { addon, type RawImage, type RawJpegRequest } from '../binding.js';
import { ResnetError, expectBool, expectInt, expectNumber, expectOneOf, expectOptions, expectPair, invalid, mismatch } from '../errors.js';
import { randomInt } from './sample-random.js';
import type { DecodedImage, RawSample, SampleRandom, TransformSpec } from './types.js';

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

/** Interpolation modes (torchvision's `InterpolationMode`, lower case). */
export type Interpolation = 'nearest' | 'bilinear' | 'bicubic' | 'lanczos';

const INTERPOLATIONS = ['nearest', 'bilinear', 'bicubic', 'lanczos'] as const;

/** Input options for every decode: PIL raises on truncated or broken data and ignores ICC profiles. */
const DECODE_OPTIONS = { failOn: 'error', ignoreIcc: true } as const;

/** A crop box in pixels: rows `top .. top + height`, columns `left .. left + width`. */
export interface CropBox {
  top: number;
  left: number;
  height: number;
  width: number;
}

/** Python's `round()`: halves go to the even neighbour. */
function roundHalfEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** PIL's integer luma, `L = R * 299/1000 + G * 587/1000 + B * 114/1000`, rounded. */
function luma(r: number, g: number, b: number): number {
  return (r * 19595 + g * 38470 + b * 7471 + 0x8000) >>> 16;
}

/** PIL's `Image.blend` of one value: float32 arithmetic, clipped and truncated to uint8. */
function blend8(degenerate: number, value: number, alpha32: number): number {
  const t = Math.fround(degenerate + Math.fround(alpha32 * (value - degenerate)));
  return t <= 0 ? 0 : t >= 255 ? 255 : Math.trunc(t);
}

function image(data: Uint8Array, height: number, width: number, channels: number): DecodedImage {
  return { data, height, width, channels };
}

/** Validates a decoded image: a Uint8Array of height * width * channels bytes, 1 to 4 channels. */
function expectImage(name: string, value: unknown): DecodedImage {
  if (value === null || typeof value !== 'object') invalid(name, 'a decoded image { data, height, width, channels }', value);
  const img = value as DecodedImage;
  if (!(img.data instanceof Uint8Array)) invalid(`${name}.data`, 'a Uint8Array', img.data);
  expectInt(`${name}.height`, img.height, 1);
  expectInt(`${name}.width`, img.width, 1);
  expectInt(`${name}.channels`, img.channels, 1, 4);
  if (img.data.length !== img.height * img.width * img.channels) {
    mismatch(`${name}.data`, `${img.height * img.width * img.channels} bytes (height ${img.height} x width ${img.width} x channels ${img.channels})`, `${img.data.length} bytes`);
  }
  return img;
}

function expectInterpolation(name: string, value: unknown, allowed: readonly Interpolation[] = INTERPOLATIONS): Interpolation {
  return expectOneOf(name, value, allowed);
}

/** A `[min, max]` pair of finite numbers with min <= max. */
function expectRange(name: string, value: unknown, min = -Infinity, max = Infinity): [number, number] {
  if (!Array.isArray(value) || value.length !== 2) invalid(name, 'a [min, max] pair of numbers', value);
  const lo = expectNumber(`${name}[0]`, value[0], min, max);
  const hi = expectNumber(`${name}[1]`, value[1], min, max);
  if (lo > hi) mismatch(name, 'a [min, max] pair with min <= max', `[${lo}, ${hi}]`);
  return [lo, hi];
}

/** A torchvision size: an int (square) or `[height, width]`; kept in the form given for specs. */
function expectSize(name: string, value: unknown): number | [number, number] {
  const pair = expectPair(name, value, 1);
  return typeof value === 'number' ? pair[0] : pair;
}

function sizePair(size: number | [number, number]): [number, number] {
  return typeof size === 'number' ? [size, size] : [size[0], size[1]];
}

function copySpecValue<T>(v: T): T {
  return (Array.isArray(v) ? [...v] : v) as T;
}

// ---------------------------------------------------------------------------------------------
// Functional ops on decoded images (never modify their input)
// ---------------------------------------------------------------------------------------------

/** Drops an alpha channel (2 → 1, 4 → 3 channels), like PIL's `convert('RGB')` drops it. */
export function dropAlpha(img: DecodedImage): DecodedImage {
  if (img.channels !== 2 && img.channels !== 4) return img;
  const c = img.channels - 1;
  const n = img.height * img.width;
  const out = new Uint8Array(n * c);
  const src = img.data;
  for (let p = 0, s = 0, d = 0; p < n; p++, s += img.channels) {
    for (let k = 0; k < c; k++) out[d++] = src[s + k]!;
  }
  return image(out, img.height, img.width, c);
}

/** Converts to 3 channels: grey values are replicated, alpha is dropped; RGB is returned as is. */
export function toRGB(img: DecodedImage): DecodedImage {
  const base = dropAlpha(img);
  if (base.channels === 3) return base;
  const n = base.height * base.width;
  const out = new Uint8Array(n * 3);
  const src = base.data;
  for (let p = 0, d = 0; p < n; p++) {
    const v = src[p]!;
    out[d++] = v;
    out[d++] = v;
    out[d++] = v;
  }
  return image(out, base.height, base.width, 3);
}

/** Converts to one grey channel with PIL's luma (`convert('L')`); alpha is dropped. */
export function toGrayscale(img: DecodedImage): DecodedImage {
  const base = dropAlpha(img);
  if (base.channels === 1) return base;
  const n = base.height * base.width;
  const out = new Uint8Array(n);
  const src = base.data;
  for (let p = 0, s = 0; p < n; p++, s += 3) out[p] = luma(src[s]!, src[s + 1]!, src[s + 2]!);
  return image(out, base.height, base.width, 1);
}

/** Mirrors an image left-right (torchvision's `F.hflip`). */
export function hflip(img: DecodedImage): DecodedImage {
  const { height, width, channels: c } = img;
  const src = img.data;
  const out = new Uint8Array(src.length);
  const row = width * c;
  for (let y = 0; y < height; y++) {
    const base = y * row;
    for (let x = 0; x < width; x++) {
      const s = base + x * c;
      const d = base + (width - 1 - x) * c;
      for (let k = 0; k < c; k++) out[d + k] = src[s + k]!;
    }
  }
  return image(out, height, width, c);
}

/** Copies a box that lies inside the image. */
export function crop(img: DecodedImage, box: CropBox): DecodedImage {
  const { top, left, height, width } = box;
  if (top < 0 || left < 0 || top + height > img.height || left + width > img.width || height < 1 || width < 1) {
    mismatch('crop box', `a box inside the ${img.height}x${img.width} image`, `top ${top}, left ${left}, height ${height}, width ${width}`);
  }
  if (top === 0 && left === 0 && height === img.height && width === img.width) return img;
  const c = img.channels;
  const out = new Uint8Array(height * width * c);
  const rowBytes = width * c;
  for (let y = 0; y < height; y++) {
    const s = ((top + y) * img.width + left) * c;
    out.set(img.data.subarray(s, s + rowBytes), y * rowBytes);
  }
  return image(out, height, width, c);
}

/**
 * torchvision's `F.center_crop`: pads with zeros where the image is smaller than `[height, width]`
 * (`(crop - size) // 2` before, the rest after), then takes the box at
 * `top = round((H - height) / 2)`, `left = round((W - width) / 2)` with Python's rounding.
 */
export function centerCrop(img: DecodedImage, size: [number, number]): DecodedImage {
  const [h, w] = size;
  const padT = h > img.height ? Math.floor((h - img.height) / 2) : 0;
  const padL = w > img.width ? Math.floor((w - img.width) / 2) : 0;
  const padB = h > img.height ? Math.floor((h - img.height + 1) / 2) : 0;
  const padR = w > img.width ? Math.floor((w - img.width + 1) / 2) : 0;
  const H = img.height + padT + padB;
  const W = img.width + padL + padR;
  const top = roundHalfEven((H - h) / 2) - padT;
  const left = roundHalfEven((W - w) / 2) - padL;
  if (top >= 0 && left >= 0) return crop(img, { top, left, height: h, width: w });
  // Padding: copy the overlap of the box and the image onto zeros.
  const c = img.channels;
  const out = new Uint8Array(h * w * c);
  const x0 = Math.max(0, -left);
  const x1 = Math.min(w, img.width - left);
  for (let y = 0; y < h; y++) {
    const sy = top + y;
    if (sy < 0 || sy >= img.height || x1 <= x0) continue;
    const s = (sy * img.width + left + x0) * c;
    out.set(img.data.subarray(s, s + (x1 - x0) * c), (y * w + x0) * c);
  }
  return image(out, h, w, c);
}

/** The output `[height, width]` of torchvision's `Resize(size, max_size)` for an input size. */
export function resizeOutputSize(input: [number, number], size: number | [number, number], maxSize?: number): [number, number] {
  if (typeof size !== 'number') return [size[0], size[1]];
  const [h, w] = input;
  const [short, long] = w <= h ? [w, h] : [h, w];
  let newShort = size;
  let newLong = Math.trunc((size * long) / short);
  if (maxSize !== undefined && newLong > maxSize) {
    newShort = Math.trunc((maxSize * newShort) / newLong);
    newLong = maxSize;
  }
  return w <= h ? [newLong, newShort] : [newShort, newLong];
}

type SharpFactory = typeof import('sharp').default;
let sharpModule: Promise<SharpFactory> | undefined;
let sharpThreads: number | undefined;

/**
 * sharp (libvips), loaded on first use: only PNG, WebP and CMYK JPEGs need it, so a process (or
 * loader worker) that reads JPEGs never maps libvips.
 */
function loadSharp(): Promise<SharpFactory> {
  sharpModule ??= import('sharp').then((m) => {
    if (sharpThreads !== undefined) m.default.concurrency(sharpThreads);
    return m.default;
  });
  return sharpModule;
}

/**
 * Threads per libvips pipeline, applied when sharp loads (or now, if it has): the loader's
 * workers use 1, as their parallelism is the workers'. The setting is global to the process's
 * libvips. @internal
 */
export function setSharpConcurrency(threads: number): void {
  sharpThreads = expectInt('threads', threads, 1);
  void sharpModule?.then((s) => s.concurrency(threads));
}

/** The `ERR_RC_CORRUPT_FILE` error for `path`, with the decoder's error as its cause. */
function corruptFile(path: string, cause: unknown): ResnetError {
  const reason = cause instanceof Error ? cause.message : String(cause);
  const error = new ResnetError('ERR_RC_CORRUPT_FILE', `Cannot decode the image file '${path}': ${reason.trim()}`);
  Object.assign(error, { cause });
  return error;
}

/** Runs a sharp pipeline to raw uint8 pixels; with a `path`, failures are corrupt files. */
async function toImage(pipeline: Sharp, path?: string): Promise<DecodedImage> {
  try {
    const { data, info } = await pipeline.raw({ depth: 'uchar' }).toBuffer({ resolveWithObject: true });
    return image(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), info.height, info.width, info.channels);
  } catch (err) {
    if (path === undefined) throw err;
    throw corruptFile(path, err);
  }
}

/**
 * Decodes a JPEG (with a crop, resize, window and mirroring, see {@link RawJpegRequest}) with
 * libjpeg-turbo on this thread; null for a colour space it does not handle (CMYK, YCCK). A broken
 * file throws `ERR_RC_CORRUPT_FILE` naming `path`.
 */
function decodeJpegNative(bytes: Uint8Array, path: string, request: Omit<RawJpegRequest, 'bytes'> = {}): DecodedImage | null {
  let r: RawImage | null;
  try {
    r = addon().jpegDecode({ bytes, ...request });
  } catch (err) {
    if ((err as { code?: unknown }).code !== 'ERR_RC_CORRUPT_FILE') throw err;
    throw corruptFile(path, err);
  }
  return r === null ? null : image(new Uint8Array(r.data.buffer, r.data.byteOffset, r.data.byteLength), r.height, r.width, r.channels);
}

/**
 * Decodes an encoded image completely, without alpha, to 1 or 3 channels: a JPEG with
 * libjpeg-turbo (as PIL), other formats and CMYK JPEGs with sharp.
 */
export async function decodeImage(bytes: Uint8Array, path: string): Promise<DecodedImage> {
  if (!(bytes instanceof Uint8Array)) invalid('bytes', 'a Uint8Array', bytes);
  const dims = jpegDimensions(bytes);
  if (dims && (dims.components === 1 || dims.components === 3)) {
    const img = decodeJpegNative(bytes, path);
    if (img) return img;
  }
  const sharp = await loadSharp();
  const img = await toImage(sharp(bytes, DECODE_OPTIONS).removeAlpha(), path);
  return dropAlpha(img);
}

/**
 * Crops `box` (the whole image when omitted) and resizes it to `[height, width]` with PIL's
 * algorithm (antialiased when shrinking; the kernels read only the box's pixels, as after
 * torchvision's crop), optionally mirrored. A box already of the output size is only copied.
 */
export function resizedCrop(img: DecodedImage, box: CropBox | null, size: [number, number], interpolation: Interpolation = 'bilinear', mirror = false): DecodedImage {
  const b = box ?? { top: 0, left: 0, height: img.height, width: img.width };
  const [oh, ow] = size;
  if (b.height === oh && b.width === ow) {
    const out = crop(img, b);
    return mirror ? hflip(out) : out;
  }
  const data = addon().imageResample({
    data: img.data,
    height: img.height,
    width: img.width,
    channels: img.channels,
    box: [b.left, b.top, b.left + b.width, b.top + b.height],
    size: [oh, ow],
    filter: interpolation,
    mirror,
  });
  return image(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), oh, ow, img.channels);
}

/** PIL's `ImageEnhance.Brightness`: a blend with black, `trunc(clamp(v * factor))`. */
export function adjustBrightness(img: DecodedImage, factor: number): DecodedImage {
  const a = Math.fround(factor);
  const lut = new Uint8Array(256);
  for (let v = 0; v < 256; v++) lut[v] = blend8(0, v, a);
  return applyLut(img, lut);
}

/**
 * PIL's `ImageEnhance.Contrast`: a blend with the mean grey level, `int(mean(L) + 0.5)`, of the
 * image (PIL's luma for RGB).
 */
export function adjustContrast(img: DecodedImage, factor: number): DecodedImage {
  const n = img.height * img.width;
  const src = img.data;
  let sum = 0;
  if (img.channels === 1) for (let p = 0; p < n; p++) sum += src[p]!;
  else for (let p = 0, s = 0; p < n; p++, s += img.channels) sum += luma(src[s]!, src[s + 1]!, src[s + 2]!);
  const mean = Math.floor(sum / n + 0.5);
  const a = Math.fround(factor);
  const lut = new Uint8Array(256);
  for (let v = 0; v < 256; v++) lut[v] = blend8(mean, v, a);
  return applyLut(img, lut);
}

/** PIL's `ImageEnhance.Color`: a blend of each pixel with its grey (luma) value. Grey images are returned as they are. */
export function adjustSaturation(img: DecodedImage, factor: number): DecodedImage {
  if (img.channels < 3) return img;
  const a = Math.fround(factor);
  const n = img.height * img.width;
  const src = img.data;
  const out = new Uint8Array(src.length);
  const c = img.channels;
  for (let p = 0, s = 0; p < n; p++, s += c) {
    const r = src[s]!;
    const g = src[s + 1]!;
    const b = src[s + 2]!;
    const l = luma(r, g, b);
    out[s] = blend8(l, r, a);
    out[s + 1] = blend8(l, g, a);
    out[s + 2] = blend8(l, b, a);
    for (let k = 3; k < c; k++) out[s + k] = src[s + k]!;
  }
  return image(out, img.height, img.width, c);
}

/**
 * Shifts the hue by `factor` turns (in [-0.5, 0.5]) in HSV space, like torchvision's tensor
 * `adjust_hue` (continuous hue), rounding the result. Grey images are returned as they are.
 */
export function adjustHue(img: DecodedImage, factor: number): DecodedImage {
  if (img.channels < 3 || factor === 0) return img;
  const n = img.height * img.width;
  const src = img.data;
  const out = new Uint8Array(src.length);
  const c = img.channels;
  for (let p = 0, s = 0; p < n; p++, s += c) {
    const r = src[s]!;
    const g = src[s + 1]!;
    const b = src[s + 2]!;
    const maxc = Math.max(r, g, b);
    const minc = Math.min(r, g, b);
    for (let k = 3; k < c; k++) out[s + k] = src[s + k]!;
    if (maxc === minc) {
      // No chroma: the hue is undefined and a shift changes nothing.
      out[s] = r;
      out[s + 1] = g;
      out[s + 2] = b;
      continue;
    }
    const cr = maxc - minc;
    const sat = cr / maxc;
    const rc = (maxc - r) / cr;
    const gc = (maxc - g) / cr;
    const bc = (maxc - b) / cr;
    let h = maxc === r ? bc - gc : maxc === g ? 2 + rc - bc : 4 + gc - rc;
    h = (h / 6 + 1) % 1;
    h = (((h + factor) % 1) + 1) % 1;
    const h6 = h * 6;
    const i = Math.floor(h6);
    const f = h6 - i;
    const v = maxc;
    const pp = v * (1 - sat);
    const q = v * (1 - sat * f);
    const t = v * (1 - sat * (1 - f));
    let rr: number;
    let gg: number;
    let bb: number;
    switch (i % 6) {
      case 0: rr = v; gg = t; bb = pp; break;
      case 1: rr = q; gg = v; bb = pp; break;
      case 2: rr = pp; gg = v; bb = t; break;
      case 3: rr = pp; gg = q; bb = v; break;
      case 4: rr = t; gg = pp; bb = v; break;
      default: rr = v; gg = pp; bb = q; break;
    }
    out[s] = Math.min(255, Math.max(0, Math.round(rr)));
    out[s + 1] = Math.min(255, Math.max(0, Math.round(gg)));
    out[s + 2] = Math.min(255, Math.max(0, Math.round(bb)));
  }
  return image(out, img.height, img.width, c);
}

function applyLut(img: DecodedImage, lut: Uint8Array): DecodedImage {
  const src = img.data;
  const out = new Uint8Array(src.length);
  if (img.channels === 1 || img.channels === 3) {
    for (let i = 0; i < src.length; i++) out[i] = lut[src[i]!]!;
  } else {
    // Leave an alpha channel alone.
    const c = img.channels;
    for (let i = 0; i < src.length; i++) out[i] = i % c === c - 1 ? src[i]! : lut[src[i]!]!;
  }
  return image(out, img.height, img.width, img.channels);
}

/** PIL rounds its rotation matrix to 15 decimals, which makes right angles exact. */
function round15(v: number): number {
  return Number(v.toFixed(15));
}

/**
 * Rotates counter-clockwise by `angle` degrees about the image centre, keeping the size, like
 * PIL's `Image.rotate(angle, expand=False)` (which torchvision calls): output pixel centres are
 * mapped back into the input; those that land outside are `fill`.
 */
export function rotate(img: DecodedImage, angle: number, options: { interpolation?: 'nearest' | 'bilinear'; fill?: number | readonly number[] } = {}): DecodedImage {
  const { height: H, width: W, channels: c } = img;
  const fill = fillValues(options.fill ?? 0, c);
  const bilinear = (options.interpolation ?? 'nearest') === 'bilinear';
  const rad = -((((angle % 360) + 360) % 360) * Math.PI) / 180;
  const cos = round15(Math.cos(rad));
  const sin = round15(Math.sin(rad));
  // PIL's matrix maps output (x, y) to input: [cos, sin, tx; -sin, cos, ty] about (W/2, H/2).
  const cx = W / 2;
  const cy = H / 2;
  const src = img.data;
  const out = new Uint8Array(src.length);
  for (let y = 0; y < H; y++) {
    const dy = y + 0.5 - cy;
    for (let x = 0; x < W; x++) {
      const dx = x + 0.5 - cx;
      const xin = cos * dx + sin * dy + cx;
      const yin = -sin * dx + cos * dy + cy;
      const d = (y * W + x) * c;
      if (!(xin >= 0 && xin < W && yin >= 0 && yin < H)) {
        for (let k = 0; k < c; k++) out[d + k] = fill[k]!;
        continue;
      }
      if (!bilinear) {
        const s = (Math.floor(yin) * W + Math.floor(xin)) * c;
        for (let k = 0; k < c; k++) out[d + k] = src[s + k]!;
        continue;
      }
      // PIL's bilinear: pixel centres at i + 0.5, neighbours clamped at the edges.
      const fx = xin - 0.5;
      const fy = yin - 0.5;
      const x0 = Math.floor(fx);
      const y0 = Math.floor(fy);
      const ax = fx - x0;
      const ay = fy - y0;
      const xa = Math.max(0, x0);
      const xb = Math.min(W - 1, x0 + 1);
      const ya = Math.max(0, y0);
      const yb = Math.min(H - 1, y0 + 1);
      const s00 = (ya * W + xa) * c;
      const s01 = (ya * W + xb) * c;
      const s10 = (yb * W + xa) * c;
      const s11 = (yb * W + xb) * c;
      for (let k = 0; k < c; k++) {
        const top = src[s00 + k]! + (src[s01 + k]! - src[s00 + k]!) * ax;
        const bottom = src[s10 + k]! + (src[s11 + k]! - src[s10 + k]!) * ax;
        out[d + k] = Math.round(top + (bottom - top) * ay);
      }
    }
  }
  return image(out, H, W, c);
}

function fillValues(fill: number | readonly number[], channels: number): number[] {
  if (typeof fill === 'number') return new Array<number>(channels).fill(fill);
  if (fill.length === 1) return new Array<number>(channels).fill(fill[0]!);
  // A per-channel fill for RGB applied to a grey image uses the first value.
  return Array.from({ length: channels }, (_, k) => fill[Math.min(k, fill.length - 1)]!);
}

// ---------------------------------------------------------------------------------------------
// Transforms
// ---------------------------------------------------------------------------------------------

/** An encoded JPEG whose dimensions are known from its header. @internal */
export interface EncodedJpeg {
  bytes: Uint8Array;
  path: string;
  height: number;
  width: number;
}

/** Decodes a JPEG of 1 or 3 components (checked by the caller) with a fused crop and resize. */
function fusedJpeg(jpeg: EncodedJpeg, request: Omit<RawJpegRequest, 'bytes'>): DecodedImage {
  const img = decodeJpegNative(jpeg.bytes, jpeg.path, request);
  if (!img) throw new ResnetError('ERR_RC_CORRUPT_FILE', `Cannot decode the image file '${jpeg.path}': a JPEG of 1 or 3 components in an unsupported colour space`);
  return img;
}

/** A transform step: applies itself to a decoded image, drawing randomness from the sample's stream. */
export abstract class Transform {
  /** The name in specs, e.g. `'RandomResizedCrop'`. */
  abstract readonly kind: string;

  /** The plain description {@link transformFromSpec} rebuilds this transform from. */
  abstract spec(): TransformSpec;

  /** Applies the transform; never modifies `img`. */
  abstract apply(img: DecodedImage, rng: SampleRandom): DecodedImage | Promise<DecodedImage>;

  /**
   * The output `[height, width]` for an input of `input` (null: unknown), or null when it depends
   * on an unknown input. Transforms that keep the size return `input`.
   */
  outputSize(input: [number, number] | null): [number, number] | null {
    return input;
  }

  /**
   * Whether the transform gives the same result on a mirrored image as mirrored results, so that
   * a horizontal flip before it can be deferred to the device.
   */
  get commutesWithHorizontalFlip(): boolean {
    return false;
  }

  /**
   * Decodes and transforms a JPEG in one native call (only the region the output needs is
   * decoded), or returns null when this transform has no such path. Draws exactly what `apply`
   * would, then calls `mirror()` once, which draws a following flip's decision; when true the
   * result is mirrored too. `centerCrop` (only given to transforms whose
   * {@link Transform.takesCenterCrop} is true, and never larger than their output) is a
   * CenterCrop that follows this transform, taken before the mirroring.
   * @internal
   */
  applyToJpeg(_jpeg: EncodedJpeg, _rng: SampleRandom, _mirror: () => boolean, _centerCrop?: [number, number]): DecodedImage | Promise<DecodedImage> | null {
    return null;
  }

  /** Whether {@link Transform.applyToJpeg} can take a following CenterCrop in its pipeline. @internal */
  get takesCenterCrop(): boolean {
    return false;
  }
}

/** Options of {@link RandomResizedCrop}. */
export interface RandomResizedCropOptions {
  /** Output size: an int for a square, or `[height, width]`. */
  size: number | [number, number];
  /** Range of the crop's area as a fraction of the image's; default `[0.08, 1]`. */
  scale?: [number, number];
  /** Range of the crop's aspect ratio (width / height); default `[3/4, 4/3]`. */
  ratio?: [number, number];
  /** Default `'bilinear'`. */
  interpolation?: Interpolation;
}

/**
 * torchvision's `RandomResizedCrop`: a crop of random area (a `scale` fraction of the image) and
 * aspect ratio (log-uniform in `ratio`) at a random position, resized to `size`. On a JPEG it
 * crops and resizes in the decoder's pipeline.
 */
export class RandomResizedCrop extends Transform {
  readonly kind = 'RandomResizedCrop';
  /** Output size, as given: an int for a square, or `[height, width]`. */
  readonly size: number | [number, number];
  /** Range of the crop's area as a fraction of the image's. */
  readonly scale: [number, number];
  /** Range of the crop's aspect ratio (width / height). */
  readonly ratio: [number, number];
  readonly interpolation: Interpolation;

  constructor(options: RandomResizedCropOptions) {
    super();
    const o = expectOptions<RandomResizedCropOptions>('RandomResizedCrop options', options, ['size', 'scale', 'ratio', 'interpolation']);
    if (options === undefined) invalid('RandomResizedCrop options', 'an options object with a size', options);
    this.size = expectSize('size', o.size);
    this.scale = expectRange('scale', o.scale ?? [0.08, 1], 0);
    this.ratio = expectRange('ratio', o.ratio ?? [3 / 4, 4 / 3], Number.MIN_VALUE);
    this.interpolation = expectInterpolation('interpolation', o.interpolation ?? 'bilinear');
  }

  /**
   * torchvision's `get_params`: up to 10 attempts at `area = H * W * U(scale)`,
   * `aspect = exp(U(log ratio))`, `w = round(sqrt(area * aspect))`, `h = round(sqrt(area / aspect))`,
   * accepted when `0 < w <= W` and `0 < h <= H` with `top = randint(0, H - h)` and
   * `left = randint(0, W - w)`; otherwise the central crop with the aspect ratio clamped to `ratio`.
   */
  static getParams(height: number, width: number, rng: SampleRandom, scale: readonly [number, number] = [0.08, 1], ratio: readonly [number, number] = [3 / 4, 4 / 3]): CropBox {
    expectInt('height', height, 1);
    expectInt('width', width, 1);
    const area = height * width;
    const logLo = Math.log(ratio[0]);
    const logHi = Math.log(ratio[1]);
    for (let attempt = 0; attempt < 10; attempt++) {
      const targetArea = area * rng.uniform(scale[0], scale[1]);
      const aspect = Math.exp(rng.uniform(logLo, logHi));
      const w = roundHalfEven(Math.sqrt(targetArea * aspect));
      const h = roundHalfEven(Math.sqrt(targetArea / aspect));
      if (w > 0 && w <= width && h > 0 && h <= height) {
        const top = randomInt(rng, height - h + 1);
        const left = randomInt(rng, width - w + 1);
        return { top, left, height: h, width: w };
      }
    }
    const inRatio = width / height;
    let w: number;
    let h: number;
    if (inRatio < Math.min(ratio[0], ratio[1])) {
      w = width;
      h = roundHalfEven(w / Math.min(ratio[0], ratio[1]));
    } else if (inRatio > Math.max(ratio[0], ratio[1])) {
      h = height;
      w = roundHalfEven(h * Math.max(ratio[0], ratio[1]));
    } else {
      w = width;
      h = height;
    }
    return { top: Math.floor((height - h) / 2), left: Math.floor((width - w) / 2), height: h, width: w };
  }

  /** {@link RandomResizedCrop.getParams} with this transform's scale and ratio. */
  getParams(height: number, width: number, rng: SampleRandom): CropBox {
    return RandomResizedCrop.getParams(height, width, rng, this.scale, this.ratio);
  }

  spec(): TransformSpec {
    return { kind: this.kind, size: copySpecValue(this.size), scale: [...this.scale], ratio: [...this.ratio], interpolation: this.interpolation };
  }

  apply(img: DecodedImage, rng: SampleRandom): DecodedImage {
    return resizedCrop(img, this.getParams(img.height, img.width, rng), sizePair(this.size), this.interpolation);
  }

  override outputSize(): [number, number] {
    return sizePair(this.size);
  }

  override applyToJpeg(jpeg: EncodedJpeg, rng: SampleRandom, mirror: () => boolean): DecodedImage {
    const box = this.getParams(jpeg.height, jpeg.width, rng);
    const flip = mirror();
    const size = sizePair(this.size);
    return fusedJpeg(jpeg, { crop: [box.top, box.left, box.height, box.width], size, filter: this.interpolation, mirror: flip });
  }
}

/** Options of {@link RandomHorizontalFlip}. */
export interface RandomHorizontalFlipOptions {
  /** Probability of a flip; default 0.5. */
  p?: number;
}

/**
 * torchvision's `RandomHorizontalFlip`: mirrors the image with probability `p` (one draw per
 * sample, whatever `p`). {@link Compose.run} with `deferFlip` reports the decision instead, for
 * the device's input conversion to mirror.
 */
export class RandomHorizontalFlip extends Transform {
  readonly kind = 'RandomHorizontalFlip';
  /** Probability of a flip. */
  readonly p: number;

  constructor(options: RandomHorizontalFlipOptions = {}) {
    super();
    const o = expectOptions<RandomHorizontalFlipOptions>('RandomHorizontalFlip options', options, ['p']);
    this.p = expectNumber('p', o.p ?? 0.5, 0, 1);
  }

  /** Draws the flip decision (what `apply` would do). */
  draw(rng: SampleRandom): boolean {
    return rng.next() < this.p;
  }

  spec(): TransformSpec {
    return { kind: this.kind, p: this.p };
  }

  apply(img: DecodedImage, rng: SampleRandom): DecodedImage {
    return this.draw(rng) ? hflip(img) : img;
  }

  override get commutesWithHorizontalFlip(): boolean {
    return true;
  }
}

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

function jitterRange(name: string, value: unknown, center: number, bound: [number, number], clipFirstOnZero: boolean): [number, number] | null {
  if (value === undefined || value === null) return null;
  let range: [number, number];
  if (typeof value === 'number') {
    expectNumber(name, value, 0);
    range = [center - value, center + value];
    if (clipFirstOnZero) range[0] = Math.max(range[0], 0);
  } else {
    range = expectRange(name, value);
  }
  if (range[0] < bound[0] || range[1] > bound[1]) mismatch(name, `values within [${bound[0]}, ${bound[1]}]`, `[${range[0]}, ${range[1]}]`);
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
    const o = expectOptions<ColorJitterOptions>('ColorJitter options', options, ['brightness', 'contrast', 'saturation', 'hue']);
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
    return { order, brightness: draw(this.brightness), contrast: draw(this.contrast), saturation: draw(this.saturation), hue: draw(this.hue) };
  }

  spec(): TransformSpec {
    const r = (v: [number, number] | null) => (v === null ? null : [...v]);
    return { kind: this.kind, brightness: r(this.brightness), contrast: r(this.contrast), saturation: r(this.saturation), hue: r(this.hue) };
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

/** Options of {@link RandomRotation}. */
export interface RandomRotationOptions {
  /** A number `d` for angles in `[-d, d]`, or `[min, max]`, in degrees (counter-clockwise). */
  degrees: number | [number, number];
  /** `'nearest'` (default) or `'bilinear'`. */
  interpolation?: 'nearest' | 'bilinear';
  /** The value of pixels rotated in from outside: one for all channels or one per channel; default 0. */
  fill?: number | number[];
}

/**
 * torchvision's `RandomRotation` (expand = false, about the centre): an angle drawn uniformly from
 * `degrees`, counter-clockwise for positive angles.
 */
export class RandomRotation extends Transform {
  readonly kind = 'RandomRotation';
  /** The angle's `[min, max]` in degrees. */
  readonly degrees: [number, number];
  readonly interpolation: 'nearest' | 'bilinear';
  readonly fill: number | number[];

  constructor(options: RandomRotationOptions) {
    super();
    const o = expectOptions<RandomRotationOptions>('RandomRotation options', options, ['degrees', 'interpolation', 'fill']);
    if (options === undefined) invalid('RandomRotation options', 'an options object with degrees', options);
    if (typeof o.degrees === 'number') {
      const d = expectNumber('degrees', o.degrees, 0);
      this.degrees = [-d, d];
    } else {
      this.degrees = expectRange('degrees', o.degrees);
    }
    this.interpolation = expectInterpolation('interpolation', o.interpolation ?? 'nearest', ['nearest', 'bilinear']) as 'nearest' | 'bilinear';
    const fill = o.fill ?? 0;
    if (typeof fill === 'number') this.fill = expectInt('fill', fill, 0, 255);
    else if (Array.isArray(fill) && (fill.length === 1 || fill.length === 3)) this.fill = fill.map((v, i) => expectInt(`fill[${i}]`, v, 0, 255));
    else invalid('fill', 'an integer in [0, 255] or an array of 1 or 3 of them', fill);
  }

  /** Draws the angle in degrees. */
  getParams(rng: SampleRandom): number {
    return rng.uniform(this.degrees[0], this.degrees[1]);
  }

  spec(): TransformSpec {
    return { kind: this.kind, degrees: [...this.degrees], interpolation: this.interpolation, fill: copySpecValue(this.fill) };
  }

  apply(img: DecodedImage, rng: SampleRandom): DecodedImage {
    return rotate(img, this.getParams(rng), { interpolation: this.interpolation, fill: this.fill });
  }
}

/** Options of {@link Resize}. */
export interface ResizeOptions {
  /** An int: the smaller edge becomes `size`, keeping the aspect ratio; `[height, width]`: exact. */
  size: number | [number, number];
  /** Default `'bilinear'`. */
  interpolation?: Interpolation;
  /** With an int size: the longer edge's maximum (torchvision's `max_size`). */
  maxSize?: number;
}

/**
 * torchvision's `Resize`. With an int size the smaller edge becomes `size` and the longer one
 * `int(size * long / short)`; an image already of the output size is returned as it is. On a JPEG
 * it resizes in the decoder's pipeline, with shrink-on-load.
 */
export class Resize extends Transform {
  readonly kind = 'Resize';
  /** An int (the smaller edge) or `[height, width]`. */
  readonly size: number | [number, number];
  readonly interpolation: Interpolation;
  readonly maxSize: number | undefined;

  constructor(options: ResizeOptions) {
    super();
    const o = expectOptions<ResizeOptions>('Resize options', options, ['size', 'interpolation', 'maxSize']);
    if (options === undefined) invalid('Resize options', 'an options object with a size', options);
    this.size = expectSize('size', o.size);
    this.interpolation = expectInterpolation('interpolation', o.interpolation ?? 'bilinear');
    if (o.maxSize !== undefined) {
      if (typeof this.size !== 'number') invalid('maxSize', 'no maxSize with a [height, width] size (torchvision allows it only with an int size)', o.maxSize);
      this.maxSize = expectInt('maxSize', o.maxSize, this.size + 1);
    } else {
      this.maxSize = undefined;
    }
  }

  spec(): TransformSpec {
    return { kind: this.kind, size: copySpecValue(this.size), interpolation: this.interpolation, ...(this.maxSize !== undefined ? { maxSize: this.maxSize } : {}) };
  }

  apply(img: DecodedImage): DecodedImage {
    const [h, w] = resizeOutputSize([img.height, img.width], this.size, this.maxSize);
    if (h === img.height && w === img.width) return img;
    return resizedCrop(img, null, [h, w], this.interpolation);
  }

  override outputSize(input: [number, number] | null): [number, number] | null {
    if (typeof this.size !== 'number') return [this.size[0], this.size[1]];
    return input === null ? null : resizeOutputSize(input, this.size, this.maxSize);
  }

  override applyToJpeg(jpeg: EncodedJpeg, _rng: SampleRandom, mirror: () => boolean, centerCrop?: [number, number]): DecodedImage {
    const [h, w] = resizeOutputSize([jpeg.height, jpeg.width], this.size, this.maxSize);
    const flip = mirror();
    // A following CenterCrop is a window of the resized image: only its pixels are computed.
    const window: [number, number, number, number] | undefined = centerCrop
      ? [roundHalfEven((h - centerCrop[0]) / 2), roundHalfEven((w - centerCrop[1]) / 2), centerCrop[0], centerCrop[1]]
      : undefined;
    return fusedJpeg(jpeg, { size: [h, w], ...(window ? { window } : {}), filter: this.interpolation, mirror: flip });
  }

  override get takesCenterCrop(): boolean {
    return true;
  }
}

/** Options of {@link CenterCrop}. */
export interface CenterCropOptions {
  /** An int for a square, or `[height, width]`. */
  size: number | [number, number];
}

/**
 * torchvision's `CenterCrop`: the central box, at `round((H - h) / 2)`, `round((W - w) / 2)`
 * with Python's rounding, zero-padded where the image is smaller.
 */
export class CenterCrop extends Transform {
  readonly kind = 'CenterCrop';
  /** An int for a square, or `[height, width]`. */
  readonly size: number | [number, number];

  constructor(options: CenterCropOptions) {
    super();
    const o = expectOptions<CenterCropOptions>('CenterCrop options', options, ['size']);
    if (options === undefined) invalid('CenterCrop options', 'an options object with a size', options);
    this.size = expectSize('size', o.size);
  }

  spec(): TransformSpec {
    return { kind: this.kind, size: copySpecValue(this.size) };
  }

  apply(img: DecodedImage): DecodedImage {
    return centerCrop(img, sizePair(this.size));
  }

  override outputSize(): [number, number] {
    return sizePair(this.size);
  }

  override applyToJpeg(jpeg: EncodedJpeg, _rng: SampleRandom, mirror: () => boolean): DecodedImage {
    const [h, w] = sizePair(this.size);
    const flip = mirror();
    if (h > jpeg.height || w > jpeg.width) {
      const out = centerCrop(fusedJpeg(jpeg, {}), [h, w]);
      return flip ? hflip(out) : out;
    }
    const crop: [number, number, number, number] = [roundHalfEven((jpeg.height - h) / 2), roundHalfEven((jpeg.width - w) / 2), h, w];
    return fusedJpeg(jpeg, { crop, mirror: flip });
  }
}

/** Options of {@link Normalize}. */
export interface NormalizeOptions {
  /** Per-channel mean in [0, 1] units (one value, or one per channel). */
  mean: number[];
  /** Per-channel standard deviation in [0, 1] units, positive. */
  std: number[];
}

/**
 * torchvision's `Normalize`, which leaves the pixels alone here: normalisation happens on the
 * device in one pass (`InputNormalize`), with the mean and std from {@link Compose.normalization}.
 */
export class Normalize extends Transform {
  readonly kind = 'Normalize';
  readonly mean: number[];
  readonly std: number[];

  constructor(options: NormalizeOptions) {
    super();
    const o = expectOptions<NormalizeOptions>('Normalize options', options, ['mean', 'std']);
    if (options === undefined) invalid('Normalize options', 'an options object with mean and std', options);
    if (!Array.isArray(o.mean) || (o.mean.length !== 1 && o.mean.length !== 3)) invalid('mean', 'an array of 1 or 3 numbers', o.mean);
    if (!Array.isArray(o.std) || o.std.length !== o.mean.length) invalid('std', `an array of ${o.mean.length} numbers (like mean)`, o.std);
    this.mean = o.mean.map((v, i) => expectNumber(`mean[${i}]`, v));
    this.std = o.std.map((v, i) => expectNumber(`std[${i}]`, v, Number.MIN_VALUE));
  }

  spec(): TransformSpec {
    return { kind: this.kind, mean: [...this.mean], std: [...this.std] };
  }

  apply(img: DecodedImage): DecodedImage {
    return img;
  }

  override get commutesWithHorizontalFlip(): boolean {
    return true;
  }
}

/** Converts to 3 channels: grey (IDX, grey JPEGs) is replicated, alpha is dropped. */
export class ToRGB extends Transform {
  readonly kind = 'ToRGB';

  constructor(options?: Record<string, never>) {
    super();
    expectOptions('ToRGB options', options, []);
  }

  spec(): TransformSpec {
    return { kind: this.kind };
  }

  apply(img: DecodedImage): DecodedImage {
    return toRGB(img);
  }

  override get commutesWithHorizontalFlip(): boolean {
    return true;
  }
}

/** Options of {@link Grayscale}. */
export interface GrayscaleOptions {
  /** 1 (default) or 3 (the grey value replicated). */
  numOutputChannels?: 1 | 3;
}

/** torchvision's `Grayscale`: PIL's luma, on 1 or 3 channels. */
export class Grayscale extends Transform {
  readonly kind = 'Grayscale';
  readonly numOutputChannels: 1 | 3;

  constructor(options: GrayscaleOptions = {}) {
    super();
    const o = expectOptions<GrayscaleOptions>('Grayscale options', options, ['numOutputChannels']);
    this.numOutputChannels = expectOneOf('numOutputChannels', o.numOutputChannels ?? 1, [1, 3] as const);
  }

  spec(): TransformSpec {
    return { kind: this.kind, numOutputChannels: this.numOutputChannels };
  }

  apply(img: DecodedImage): DecodedImage {
    const grey = toGrayscale(img);
    return this.numOutputChannels === 3 ? toRGB(grey) : grey;
  }

  override get commutesWithHorizontalFlip(): boolean {
    return true;
  }
}

type TransformFactory = (options: Record<string, unknown>) => Transform;

const FACTORIES: Record<string, TransformFactory> = {
  RandomResizedCrop: (o) => new RandomResizedCrop(o as unknown as RandomResizedCropOptions),
  RandomHorizontalFlip: (o) => new RandomHorizontalFlip(o as RandomHorizontalFlipOptions),
  ColorJitter: (o) => new ColorJitter(o as ColorJitterOptions),
  RandomRotation: (o) => new RandomRotation(o as unknown as RandomRotationOptions),
  Resize: (o) => new Resize(o as unknown as ResizeOptions),
  CenterCrop: (o) => new CenterCrop(o as unknown as CenterCropOptions),
  Normalize: (o) => new Normalize(o as unknown as NormalizeOptions),
  ToRGB: (o) => new ToRGB(o as Record<string, never>),
  Grayscale: (o) => new Grayscale(o as GrayscaleOptions),
};

/** The transform kinds {@link transformFromSpec} knows. */
export const TRANSFORM_KINDS: readonly string[] = Object.keys(FACTORIES);

/** Rebuilds a transform from its {@link Transform.spec}. */
export function transformFromSpec(spec: TransformSpec): Transform {
  if (spec === null || typeof spec !== 'object' || Array.isArray(spec)) invalid('transform spec', 'an object { kind, ...options }', spec);
  const { kind, ...options } = spec;
  const factory = typeof kind === 'string' && Object.hasOwn(FACTORIES, kind) ? FACTORIES[kind] : undefined;
  if (factory === undefined) invalid('transform spec kind', `one of ${TRANSFORM_KINDS.map((k) => `'${k}'`).join(', ')}`, kind);
  return factory(options);
}

// ---------------------------------------------------------------------------------------------
// Compose
// ---------------------------------------------------------------------------------------------

/** Options of {@link Compose}. */
export interface ComposeOptions {
  /** Channels of every output image: 3 (default; grey is replicated, alpha dropped) or 1 (PIL's luma). */
  outputChannels?: 1 | 3;
}

/** Options of {@link Compose.run}. */
export interface ComposeRunOptions {
  /**
   * Report horizontal flips in the result's `flip` instead of mirroring the pixels, for the flips
   * that only pixel-wise transforms follow (the others are still done on the pixels); default false.
   */
  deferFlip?: boolean;
}

/** What {@link Compose.run} returns. */
export interface ComposeResult {
  /** The transformed image, with {@link Compose.outputChannels} channels. */
  image: DecodedImage;
  /** With `deferFlip`: whether the image still has to be mirrored. Otherwise always false. */
  flip: boolean;
}

/** The plain description of a {@link Compose}. */
export interface ComposeSpec extends TransformSpec {
  kind: 'Compose';
  transforms: TransformSpec[];
  outputChannels: 1 | 3;
}

/**
 * Reads the dimensions and the number of colour components (1 grey, 3 YCbCr or RGB, 4 CMYK or
 * YCCK) from a JPEG's frame header (SOFn), skipping other segments by their length; null when the
 * bytes are not a JPEG or the header is cut short.
 */
export function jpegDimensions(bytes: Uint8Array): { height: number; width: number; components: number } | null {
  if (bytes.length < 4 || bytes[0] !== 0xff || bytes[1] !== 0xd8) return null;
  let i = 2;
  while (i + 3 < bytes.length) {
    if (bytes[i] !== 0xff) return null;
    const marker = bytes[i + 1]!;
    if (marker === 0xff) {
      // Fill byte before a marker.
      i++;
      continue;
    }
    if (marker === 0xd8 || marker === 0x01 || (marker >= 0xd0 && marker <= 0xd7)) {
      i += 2;
      continue;
    }
    if (marker === 0xd9 || marker === 0xda) return null;
    const length = (bytes[i + 2]! << 8) | bytes[i + 3]!;
    const isFrame = marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc;
    if (isFrame) {
      if (i + 9 >= bytes.length) return null;
      const height = (bytes[i + 5]! << 8) | bytes[i + 6]!;
      const width = (bytes[i + 7]! << 8) | bytes[i + 8]!;
      const components = bytes[i + 9]!;
      return height > 0 && width > 0 ? { height, width, components } : null;
    }
    i += 2 + length;
  }
  return null;
}

/** Whether a JPEG ends with its end-of-image marker (FF D9). */
function endsWithEoi(bytes: Uint8Array): boolean {
  const n = bytes.length;
  return n >= 2 && bytes[n - 2] === 0xff && bytes[n - 1] === 0xd9;
}

/**
 * A pipeline of transforms, like torchvision's `Compose`, that also decodes encoded files and
 * converts the result to `outputChannels`. Rebuild it in a worker from {@link Compose.spec} with
 * {@link Compose.fromSpec}.
 */
export class Compose {
  /** The steps, in order. */
  readonly transforms: readonly Transform[];
  /** Channels of every output image. */
  readonly outputChannels: 1 | 3;
  /** Whether only flip-commuting transforms follow transform k. */
  readonly #deferrable: boolean[];

  constructor(transforms: readonly Transform[], options: ComposeOptions = {}) {
    if (!Array.isArray(transforms)) invalid('transforms', 'an array of transforms', transforms);
    transforms.forEach((t, i) => {
      if (!(t instanceof Transform)) invalid(`transforms[${i}]`, 'a Transform (e.g. new RandomResizedCrop({ size: 224 }))', t);
    });
    const o = expectOptions<ComposeOptions>('Compose options', options, ['outputChannels']);
    this.transforms = [...transforms];
    this.outputChannels = expectOneOf('outputChannels', o.outputChannels ?? 3, [1, 3] as const);
    const norm = this.#lastNormalize();
    if (norm && norm.mean.length !== 1 && norm.mean.length !== this.outputChannels) {
      mismatch('Normalize mean', `1 or ${this.outputChannels} values (outputChannels)`, `${norm.mean.length} values`);
    }
    this.#deferrable = this.transforms.map((_, k) => this.transforms.slice(k + 1).every((t) => t.commutesWithHorizontalFlip));
  }

  /** Rebuilds a pipeline from {@link Compose.spec}, or from a list of transform specs (3 output channels). */
  static fromSpec(spec: ComposeSpec | TransformSpec | readonly TransformSpec[]): Compose {
    if (Array.isArray(spec)) return new Compose(spec.map((s: TransformSpec) => transformFromSpec(s)));
    const s = spec as TransformSpec;
    if (s === null || typeof s !== 'object' || s.kind !== 'Compose' || !Array.isArray(s.transforms)) {
      invalid('Compose spec', "{ kind: 'Compose', transforms: [...], outputChannels } or an array of transform specs", spec);
    }
    return new Compose((s.transforms as TransformSpec[]).map((t) => transformFromSpec(t)), { outputChannels: s.outputChannels as 1 | 3 });
  }

  /** The plain, structured-clone-safe description of this pipeline. */
  spec(): ComposeSpec {
    return { kind: 'Compose', transforms: this.transforms.map((t) => t.spec()), outputChannels: this.outputChannels };
  }

  /**
   * The mean and std of the last {@link Normalize} (one value per output channel), for the
   * device's input normalisation; null when the pipeline has none.
   */
  normalization(): { mean: number[]; std: number[] } | null {
    const n = this.#lastNormalize();
    if (!n) return null;
    const expand = (v: number[]) => (v.length === 1 ? new Array<number>(this.outputChannels).fill(v[0]!) : [...v]);
    return { mean: expand(n.mean), std: expand(n.std) };
  }

  /**
   * The output `[height, width]` for an input of `input`, or, without one, the size every output
   * has; null when it depends on the (unknown) input.
   */
  outputSize(input?: [number, number]): [number, number] | null {
    let size: [number, number] | null = input ? [input[0], input[1]] : null;
    for (const t of this.transforms) size = t.outputSize(size);
    return size;
  }

  /**
   * The size every output has (from the last RandomResizedCrop, CenterCrop or `Resize([h, w])`),
   * or null when it varies with the input, which a loader of fixed-size batches must reject.
   */
  fixedOutputSize(): [number, number] | null {
    return this.outputSize();
  }

  /**
   * Whether `run(..., { deferFlip: true })` defers every flip of this pipeline (true when only
   * pixel-wise transforms follow each RandomHorizontalFlip).
   */
  canDeferAllFlips(): boolean {
    return this.transforms.every((t, k) => !(t instanceof RandomHorizontalFlip) || this.#deferrable[k]);
  }

  /**
   * Decodes the sample (when encoded) and runs the transforms on it with the sample's random
   * stream. A JPEG is cropped and resized in the decoder when the first transform (after any
   * Normalize) is a RandomResizedCrop, Resize or CenterCrop, in one native call on this thread
   * that decodes only the region the output reads; a CenterCrop right after a Resize joins it, so
   * that only the kept pixels are resized. A file that fails to decode throws
   * `ERR_RC_CORRUPT_FILE` naming its path.
   */
  async run(sample: RawSample, rng: SampleRandom, options: ComposeRunOptions = {}): Promise<ComposeResult> {
    if (sample === null || typeof sample !== 'object' || sample.source === null || typeof sample.source !== 'object') {
      invalid('sample', 'a RawSample { source, label }', sample);
    }
    if (rng === null || typeof rng !== 'object' || typeof rng.next !== 'function' || typeof rng.uniform !== 'function') {
      invalid('rng', 'a SampleRandom (sampleRandom(seed, epoch, index))', rng);
    }
    const o = expectOptions<ComposeRunOptions>('Compose.run options', options, ['deferFlip']);
    const deferFlip = o.deferFlip === undefined ? false : expectBool('deferFlip', o.deferFlip);
    const source = sample.source;
    let img: DecodedImage;
    let start = 0;
    if (source.kind === 'encoded') {
      if (!(source.bytes instanceof Uint8Array)) invalid('sample.source.bytes', 'a Uint8Array', source.bytes);
      const path = typeof source.path === 'string' ? source.path : '<unnamed>';
      // Normalize does nothing to pixels, so the first real transform may still fuse with the decode.
      let first = 0;
      while (first < this.transforms.length && this.transforms[first] instanceof Normalize) first++;
      // The decoder stops at the last row a crop needs, so a truncated file (no end-of-image
      // marker) is decoded whole: it then fails whatever the crop, as it does in PIL. CMYK and
      // YCCK JPEGs (4 components) go to sharp.
      const header = first < this.transforms.length && endsWithEoi(source.bytes) ? jpegDimensions(source.bytes) : null;
      const dims = header && (header.components === 1 || header.components === 3) ? { height: header.height, width: header.width } : null;
      const fuser = this.transforms[first];
      // A CenterCrop right after it joins the pipeline too (Resize(256) + CenterCrop(224)), when it
      // needs no padding.
      let span = 1;
      let centerCrop: [number, number] | undefined;
      const after = this.transforms[first + 1];
      if (dims && fuser?.takesCenterCrop && after instanceof CenterCrop) {
        const size = sizePair(after.size);
        const fusedSize = fuser.outputSize([dims.height, dims.width]);
        if (fusedSize && size[0] <= fusedSize[0] && size[1] <= fusedSize[1]) {
          centerCrop = size;
          span = 2;
        }
      }
      // A flip right after the fused transforms is mirrored in the same native call, unless
      // it is deferred to the device; it draws its decision after the fused transforms' draws.
      const next = this.transforms[first + span];
      let mirrored = false;
      const mirror = (): boolean => {
        if (!(next instanceof RandomHorizontalFlip) || (deferFlip && this.#deferrable[first + span])) return false;
        mirrored = true;
        return next.draw(rng);
      };
      const fused = dims ? fuser!.applyToJpeg({ bytes: source.bytes, path, ...dims }, rng, mirror, centerCrop) : null;
      if (fused) {
        img = dropAlpha(await fused);
        start = first + span + (mirrored ? 1 : 0);
      } else {
        img = await decodeImage(source.bytes, path);
      }
    } else if (source.kind === 'decoded') {
      img = dropAlpha(expectImage('sample.source.image', source.image));
    } else {
      return invalid('sample.source.kind', "'encoded' or 'decoded'", (source as { kind: unknown }).kind);
    }
    let flip = false;
    for (let k = start; k < this.transforms.length; k++) {
      const t = this.transforms[k]!;
      if (deferFlip && t instanceof RandomHorizontalFlip && this.#deferrable[k]) {
        if (t.draw(rng)) flip = !flip;
        continue;
      }
      img = await t.apply(img, rng);
    }
    img = this.outputChannels === 3 ? toRGB(img) : toGrayscale(img);
    return { image: img, flip };
  }

  #lastNormalize(): Normalize | undefined {
    for (let k = this.transforms.length - 1; k >= 0; k--) {
      const t = this.transforms[k];
      if (t instanceof Normalize) return t;
    }
    return undefined;
  }
}
