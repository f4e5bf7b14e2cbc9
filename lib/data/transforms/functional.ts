/**
 * Functional ops on decoded uint8 HWC images, like torchvision's `transforms.functional` with PIL
 * images: channel conversions, flips, crops, PIL's resampling (in the native addon), PIL's colour
 * enhancements and rotation. None modifies its input.
 * @packageDocumentation
 */
import { addon } from '../../binding.js';
import { mismatch } from '../../errors.js';
import type { DecodedImage } from '../types.js';

/** Interpolation modes (torchvision's `InterpolationMode`, lower case). */
export type Interpolation = 'nearest' | 'bilinear' | 'bicubic' | 'lanczos';

/** Every {@link Interpolation}. @internal */
export const INTERPOLATIONS = ['nearest', 'bilinear', 'bicubic', 'lanczos'] as const;

/** A crop box in pixels: rows `top .. top + height`, columns `left .. left + width`. */
export interface CropBox {
  top: number;
  left: number;
  height: number;
  width: number;
}

/** Python's `round()`: halves go to the even neighbour. */
export function roundHalfEven(x: number): number {
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

/** A {@link DecodedImage} of `data`. @internal */
export function image(data: Uint8Array, height: number, width: number, channels: number): DecodedImage {
  return { data, height, width, channels };
}

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
    mismatch(
      'crop box',
      `a box inside the ${img.height}x${img.width} image`,
      `top ${top}, left ${left}, height ${height}, width ${width}`,
    );
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
export function resizeOutputSize(
  input: [number, number],
  size: number | [number, number],
  maxSize?: number,
): [number, number] {
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

/**
 * Crops `box` (the whole image when omitted) and resizes it to `[height, width]` with PIL's
 * algorithm (antialiased when shrinking; the kernels read only the box's pixels, as after
 * torchvision's crop), optionally mirrored. A box already of the output size is only copied.
 */
export function resizedCrop(
  img: DecodedImage,
  box: CropBox | null,
  size: [number, number],
  interpolation: Interpolation = 'bilinear',
  mirror = false,
): DecodedImage {
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
      case 0:
        rr = v;
        gg = t;
        bb = pp;
        break;
      case 1:
        rr = q;
        gg = v;
        bb = pp;
        break;
      case 2:
        rr = pp;
        gg = v;
        bb = t;
        break;
      case 3:
        rr = pp;
        gg = q;
        bb = v;
        break;
      case 4:
        rr = t;
        gg = pp;
        bb = v;
        break;
      default:
        rr = v;
        gg = pp;
        bb = q;
        break;
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
export function rotate(
  img: DecodedImage,
  angle: number,
  options: { interpolation?: 'nearest' | 'bilinear'; fill?: number | readonly number[] } = {},
): DecodedImage {
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
