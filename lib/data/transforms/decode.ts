/**
 * Decoding of encoded files: JPEGs with libjpeg-turbo in the native addon (whole, or fused with a
 * crop and resize), other formats (PNG, WebP) and CMYK JPEGs with sharp (libvips), loaded on first
 * use. Every failure is `ERR_RC_CORRUPT_FILE` naming the file.
 * @packageDocumentation
 */
import type { Sharp } from 'sharp';
import { addon, type RawImage, type RawJpegRequest } from '../../binding.js';
import { expectInt, invalid, ResnetError } from '../../errors.js';
import type { DecodedImage } from '../types.js';
import { dropAlpha, image } from './functional.js';

/** Input options for every decode: PIL raises on truncated or broken data and ignores ICC profiles. */
const DECODE_OPTIONS = { failOn: 'error', ignoreIcc: true } as const;

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

/** Whether this thread has loaded sharp (to decode a file the addon does not). @internal */
export function sharpLoaded(): boolean {
  return sharpModule !== undefined;
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
function decodeJpegNative(
  bytes: Uint8Array,
  path: string,
  request: Omit<RawJpegRequest, 'bytes'> = {},
): DecodedImage | null {
  let r: RawImage | null;
  try {
    r = addon().jpegDecode({ bytes, ...request });
  } catch (err) {
    if ((err as { code?: unknown }).code !== 'ERR_RC_CORRUPT_FILE') throw err;
    throw corruptFile(path, err);
  }
  return r === null
    ? null
    : image(new Uint8Array(r.data.buffer, r.data.byteOffset, r.data.byteLength), r.height, r.width, r.channels);
}

/** Whether `bytes` start with a JPEG's start-of-image marker (FF D8). */
function isJpeg(bytes: Uint8Array): boolean {
  return bytes.length >= 2 && bytes[0] === 0xff && bytes[1] === 0xd8;
}

/** What a JPEG's headers say, read by libjpeg. @internal */
export interface JpegHeader {
  height: number;
  width: number;
  /** Whether the native decoder handles the colour space: grey, YCbCr or RGB (not CMYK or YCCK). */
  supported: boolean;
}

/**
 * Reads a JPEG's headers with libjpeg (without decoding); null when `bytes` are not a JPEG. A JPEG
 * whose headers are broken throws `ERR_RC_CORRUPT_FILE` naming `path`. @internal
 */
export function jpegHeader(bytes: Uint8Array, path: string): JpegHeader | null {
  if (!isJpeg(bytes)) return null;
  try {
    const { height, width, supported } = addon().jpegHeader({ bytes });
    return { height, width, supported };
  } catch (err) {
    if ((err as { code?: unknown }).code !== 'ERR_RC_CORRUPT_FILE') throw err;
    throw corruptFile(path, err);
  }
}

/**
 * Decodes an encoded image completely, without alpha, to 1 or 3 channels: a JPEG with
 * libjpeg-turbo (as PIL), other formats and CMYK JPEGs with sharp.
 */
export async function decodeImage(bytes: Uint8Array, path: string): Promise<DecodedImage> {
  if (!(bytes instanceof Uint8Array)) invalid('bytes', 'a Uint8Array', bytes);
  if (bytes.length === 0) {
    throw new ResnetError('ERR_RC_CORRUPT_FILE', `Cannot decode the image file '${path}': the file is empty`);
  }
  if (isJpeg(bytes)) {
    const img = decodeJpegNative(bytes, path);
    if (img) return img;
  }
  const sharp = await loadSharp();
  const img = await toImage(sharp(bytes, DECODE_OPTIONS).removeAlpha(), path);
  return dropAlpha(img);
}

/** An encoded JPEG whose dimensions are known from its header. @internal */
export interface EncodedJpeg {
  bytes: Uint8Array;
  path: string;
  height: number;
  width: number;
}

/** Decodes a JPEG of 1 or 3 components (checked by the caller) with a fused crop and resize. */
export function fusedJpeg(jpeg: EncodedJpeg, request: Omit<RawJpegRequest, 'bytes'>): DecodedImage {
  const img = decodeJpegNative(jpeg.bytes, jpeg.path, request);
  if (!img) {
    throw new ResnetError(
      'ERR_RC_CORRUPT_FILE',
      `Cannot decode the image file '${jpeg.path}': a JPEG of 1 or 3 components in an unsupported colour space`,
    );
  }
  return img;
}

/** Whether a JPEG ends with its end-of-image marker (FF D9). */
export function endsWithEoi(bytes: Uint8Array): boolean {
  const n = bytes.length;
  return n >= 2 && bytes[n - 2] === 0xff && bytes[n - 1] === 0xd9;
}
