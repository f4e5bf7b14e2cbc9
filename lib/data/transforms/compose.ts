/**
 * The `Compose` pipeline: decodes an encoded sample (fusing the first crop and resize with the JPEG
 * decoder), runs the transforms with the sample's random stream, and converts to the output channels.
 * @packageDocumentation
 */
import type { RawJpegRequest } from '../../binding.js';
import { ResnetError, expectBool, expectOneOf, expectOptions, invalid, isArray, mismatch } from '../../errors.js';
import type { DecodedImage, RawSample, SampleRandom, TransformSpec } from '../types.js';
import { CenterCrop } from './center-crop.js';
import { decodeImage, endsWithEoi, jpegHeader } from './decode.js';
import { RandomHorizontalFlip } from './flip.js';
import { dropAlpha, toGrayscale, toRGB } from './functional.js';
import { Normalize } from './normalize.js';
import { expectImage, sizePair } from './options.js';
import { transformFromSpec } from './registry.js';
import { Transform } from './transform.js';

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

/** See {@link Compose.deviceJpegPlan}. @internal */
export interface DeviceJpegPlan {
  /** The decoder request: crop, resize, window, filter and mirroring. */
  request: Omit<RawJpegRequest, 'bytes'>;
  /** The image's size, from its header. */
  height: number;
  width: number;
  /** Whether the consumer is to mirror the result (a deferred flip). */
  flip: boolean;
}

/** The decode-fused part of a pipeline for one JPEG (see Compose's #fusion). */
interface Fusion {
  first: number;
  span: number;
  dims: { height: number; width: number } | null;
  fuser: Transform | undefined;
  centerCrop: [number, number] | undefined;
}

/** The plain description of a {@link Compose}. */
export interface ComposeSpec extends TransformSpec {
  kind: 'Compose';
  transforms: TransformSpec[];
  outputChannels: 1 | 3;
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
    if (!isArray(transforms)) invalid('transforms', 'an array of transforms', transforms);
    transforms.forEach((t, i) => {
      if (!(t instanceof Transform)) {
        invalid(`transforms[${i}]`, 'a Transform (e.g. new RandomResizedCrop({ size: 224 }))', t);
      }
    });
    const o = expectOptions<ComposeOptions>('Compose options', options, ['outputChannels']);
    this.transforms = [...transforms];
    this.outputChannels = expectOneOf('outputChannels', o.outputChannels ?? 3, [1, 3] as const);
    const norm = this.#lastNormalize();
    if (norm && norm.mean.length !== 1 && norm.mean.length !== this.outputChannels) {
      mismatch('Normalize mean', `1 or ${this.outputChannels} values (outputChannels)`, `${norm.mean.length} values`);
    }
    this.#deferrable = this.transforms.map((_, k) =>
      this.transforms.slice(k + 1).every((t) => t.commutesWithHorizontalFlip),
    );
  }

  /** Rebuilds a pipeline from {@link Compose.spec}, or from a list of transform specs (3 output channels). */
  static fromSpec(spec: ComposeSpec | TransformSpec | readonly TransformSpec[]): Compose {
    if (Array.isArray(spec)) return new Compose(spec.map((s: TransformSpec) => transformFromSpec(s)));
    const s = spec as TransformSpec;
    if (s === null || typeof s !== 'object' || s.kind !== 'Compose' || !Array.isArray(s.transforms)) {
      invalid(
        'Compose spec',
        "{ kind: 'Compose', transforms: [...], outputChannels } or an array of transform specs",
        spec,
      );
    }
    return new Compose(
      (s.transforms as TransformSpec[]).map((t) => transformFromSpec(t)),
      { outputChannels: s.outputChannels as 1 | 3 },
    );
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
    if (
      rng === null ||
      typeof rng !== 'object' ||
      typeof rng.next !== 'function' ||
      typeof rng.uniform !== 'function'
    ) {
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
      const f = this.#fusion(source.bytes, path);
      const mirrorNext = this.#mirrorNext(f, rng, deferFlip);
      const fused =
        f.dims && f.fuser
          ? f.fuser.applyToJpeg({ bytes: source.bytes, path, ...f.dims }, rng, mirrorNext.mirror, f.centerCrop)
          : null;
      if (fused) {
        img = dropAlpha(await fused);
        start = f.first + f.span + (mirrorNext.mirrored() ? 1 : 0);
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

  /**
   * What the device JPEG decoder is to do with an encoded JPEG: the decoder request of the fused
   * transforms (with the same draws as {@link Compose.run}, so that both give the same pixels up to
   * the decoders' IDCT), the image's size from its header, and the deferred flip. Throws
   * `ERR_RC_INVALID_ARGUMENT` when the pipeline is not one the device runs (a crop or resize first,
   * then only flips and Normalize, 3 output channels), `ERR_RC_CORRUPT_FILE` naming `path` for a
   * file that is not a JPEG of 1 or 3 components with its end-of-image marker.
   * @internal
   */
  deviceJpegPlan(bytes: Uint8Array, path: string, rng: SampleRandom, deferFlip: boolean): DeviceJpegPlan {
    if (this.outputChannels !== 3) invalid('transform outputChannels', "3 for decode: 'gpu'", this.outputChannels);
    if (!(bytes instanceof Uint8Array)) invalid('bytes', 'a Uint8Array', bytes);
    const notJpeg = (why: string): never => {
      throw new ResnetError('ERR_RC_CORRUPT_FILE', `Cannot decode the image file '${path}' on the device: ${why}`);
    };
    if (bytes.length < 2 || bytes[0] !== 0xff || bytes[1] !== 0xd8) notJpeg('it is not a JPEG');
    if (!endsWithEoi(bytes)) notJpeg('the JPEG has no end-of-image marker (truncated)');
    const f = this.#fusion(bytes, path);
    const dims =
      f.dims ?? notJpeg('a JPEG of 4 components (CMYK or YCCK); the device decodes grey and YCbCr/RGB JPEGs');
    const mirrorNext = this.#mirrorNext(f, rng, deferFlip);
    const request = f.fuser?.jpegRequest(dims, rng, mirrorNext.mirror, f.centerCrop) ?? null;
    if (request === null) {
      return invalid(
        'transform',
        "for decode: 'gpu', a RandomResizedCrop, Resize or CenterCrop (inside the image) first, then only " +
          'RandomHorizontalFlip and Normalize',
        this.transforms.map((t) => t.kind).join(', '),
      );
    }
    let flip = false;
    for (let k = f.first + f.span + (mirrorNext.mirrored() ? 1 : 0); k < this.transforms.length; k++) {
      const t = this.transforms[k]!;
      if (t instanceof Normalize) continue;
      if (deferFlip && t instanceof RandomHorizontalFlip && this.#deferrable[k]) {
        if (t.draw(rng)) flip = !flip;
        continue;
      }
      invalid(
        'transform',
        `for decode: 'gpu', only RandomHorizontalFlip (deferred) and Normalize after the crop, got ${t.kind}`,
        this.transforms.map((x) => x.kind).join(', '),
      );
    }
    return { request, height: dims.height, width: dims.width, flip };
  }

  /**
   * The transforms that fuse with the decode of a JPEG: the first after any Normalize (which does
   * nothing to pixels) and a CenterCrop right after it when it needs no padding
   * (Resize(256) + CenterCrop(224)); `dims` is null when the file is not fused.
   */
  #fusion(bytes: Uint8Array, path: string): Fusion {
    let first = 0;
    while (first < this.transforms.length && this.transforms[first] instanceof Normalize) first++;
    // The decoder stops at the last row a crop needs, so a truncated file (no end-of-image
    // marker) is decoded whole: it then fails whatever the crop, as it does in PIL. CMYK and
    // YCCK JPEGs (4 components) go to sharp.
    const header = first < this.transforms.length && endsWithEoi(bytes) ? jpegHeader(bytes, path) : null;
    const dims = header?.supported ? { height: header.height, width: header.width } : null;
    const fuser = this.transforms[first];
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
    return { first, span, dims, fuser, centerCrop };
  }

  /**
   * A flip right after the fused transforms is mirrored in the same decode, unless it is deferred
   * to the device; it draws its decision after the fused transforms' draws.
   */
  #mirrorNext(f: Fusion, rng: SampleRandom, deferFlip: boolean): { mirror: () => boolean; mirrored: () => boolean } {
    const next = this.transforms[f.first + f.span];
    let mirrored = false;
    const mirror = (): boolean => {
      if (!(next instanceof RandomHorizontalFlip) || (deferFlip && this.#deferrable[f.first + f.span])) return false;
      mirrored = true;
      return next.draw(rng);
    };
    return { mirror, mirrored: () => mirrored };
  }

  #lastNormalize(): Normalize | undefined {
    for (let k = this.transforms.length - 1; k >= 0; k--) {
      const t = this.transforms[k];
      if (t instanceof Normalize) return t;
    }
    return undefined;
  }
}
