/**
 * JPEG decoding on the GPU: nvJPEG decodes each file whole on the device (its hardware decoder on
 * A100, H100 and H200, its hybrid decoder elsewhere), then the backend's kernels crop, resize and
 * mirror with the CPU decoder's resampling (the same plan and fixed-point arithmetic), into a u8
 * NHWC batch on the device; `InputNormalize` then normalises (and applies deferred flips) into the
 * model's dtype. Every sample's random draws are the CPU pipeline's (`sampleRandom(seed, epoch,
 * index)` through {@link Compose}), so a GPU-decoded batch has the CPU loader's crops and flips.
 *
 * ```ts
 * const decoder = new GpuJpegDecoder({ transform, device: 'cuda:0', seed: 0 });
 * const batch = decoder.decode(samples, epoch);        // samples: { bytes, path, index }[]
 * const input = normalize.forward(batch.images, batch.flips);
 * ```
 *
 * Double buffering: a decode runs on the decoder's own stream, so that the next batch is decoded
 * while the current step runs; its writes into the output wait only for the work already enqueued
 * on the device's stream, and the device's stream waits for the decode before any later work. The
 * output alternates between two device buffers: a batch's `images` stay valid until the decode
 * after the next one.
 * @packageDocumentation
 */
import { addon, type RawJpegDecoder, type RawJpegDecodeImage } from '../binding.js';
import { ResnetError, expectBool, expectInt, expectNumber, expectOptions, invalid, isArray } from '../errors.js';
import { parseDevice } from '../device.js';
import { Tensor } from '../tensor.js';
import { sampleRandom } from './sample-random.js';
import { Compose } from './transforms.js';

/** Options of {@link GpuJpegDecoder}. */
export interface GpuJpegDecoderOptions {
  /**
   * The CPU pipeline this decoder reproduces: a `RandomResizedCrop`, `Resize` (with an optional
   * `CenterCrop`) or `CenterCrop` first, then only `RandomHorizontalFlip` and `Normalize`.
   */
  transform: Compose;
  /** A CUDA device, `'cuda'` or `'cuda:N'`. */
  device: string;
  /** The seed of the samples' random draws (the DataLoader's `seed`). */
  seed: number;
  /** Report flips in `flips` for `InputNormalize` (default true), or mirror the pixels. */
  deferFlip?: boolean;
}

/** One encoded file of a batch. */
export interface GpuDecodeSample {
  /** The file's bytes. */
  bytes: Uint8Array;
  /** The file's name, for error messages. */
  path: string;
  /** The sample's dataset index (which selects its random draws). */
  index: number;
}

/** A decoded batch. */
export interface GpuDecodedBatch {
  /** u8 `[n, H, W, 3]` on the device, valid until the decode after the next one. */
  readonly images: Tensor;
  /** 1 where the sample is to be mirrored (deferred flips): `InputNormalize.forward`'s `flip`. */
  readonly flips: Uint8Array;
}

/**
 * Decodes batches of JPEG files on a CUDA device with the crops, resizes and flips of a CPU
 * pipeline. Throws `ERR_RC_BACKEND_UNAVAILABLE` on a machine without the CUDA backend or without
 * nvJPEG (saying how to install it), `ERR_RC_CORRUPT_FILE` naming the file that does not decode.
 */
export class GpuJpegDecoder {
  /** The device decoded on. */
  readonly device: string;
  /** The output `[height, width]` of every image. */
  readonly size: readonly [number, number];
  readonly #transform: Compose;
  readonly #seed: number;
  readonly #deferFlip: boolean;
  #raw: RawJpegDecoder | null;
  readonly #buffers: (Tensor | null)[] = [null, null];
  #next = 0;

  constructor(options: GpuJpegDecoderOptions) {
    const o = expectOptions<GpuJpegDecoderOptions>('GpuJpegDecoder options', options, [
      'transform',
      'device',
      'seed',
      'deferFlip',
    ]);
    if (!(o.transform instanceof Compose)) invalid('transform', 'a Compose', o.transform);
    const device = parseDevice(o.device);
    if (!device.startsWith('cuda')) {
      invalid('device', "a CUDA device ('cuda' or 'cuda:N'): decoding on the GPU needs one", o.device);
    }
    const size =
      o.transform.fixedOutputSize() ??
      invalid('transform', 'a pipeline with a fixed output size (a crop or a resize to [h, w])', o.transform);
    this.device = device;
    this.size = size;
    this.#transform = o.transform;
    this.#seed = expectInt('seed', o.seed, 0);
    this.#deferFlip = o.deferFlip === undefined ? true : expectBool('deferFlip', o.deferFlip);
    this.#raw = new (addon().JpegDecoder)({ device });
  }

  /** nvJPEG's engine: `'nvjpeg:hardware'` or `'nvjpeg:hybrid'`. */
  get implementation(): string {
    return this.#live().implementation();
  }

  /**
   * Decodes `samples` of `epoch` (their draws: `sampleRandom(seed, epoch, index)`) into the next
   * output buffer and, unless `join` is false, orders the device's later work after it. Returns
   * without waiting for the device. With `join: false` the decode overlaps the device work
   * enqueued after it until {@link GpuJpegDecoder.join} (call it before the batch is used).
   */
  decode(samples: readonly GpuDecodeSample[], epoch: number, options: { join?: boolean } = {}): GpuDecodedBatch {
    const raw = this.#live();
    const o = expectOptions<{ join?: boolean }>('decode options', options, ['join']);
    const join = o.join === undefined ? true : expectBool('join', o.join);
    if (!isArray(samples) || samples.length === 0) {
      invalid('samples', 'a non-empty array of { bytes, path, index }', samples);
    }
    expectInt('epoch', epoch, 0);
    const n = samples.length;
    const flips = new Uint8Array(n);
    const images: RawJpegDecodeImage[] = samples.map((s, i) => {
      if (s === null || typeof s !== 'object') invalid(`samples[${i}]`, 'a { bytes, path, index } object', s);
      const path = typeof s.path === 'string' ? s.path : `<sample ${i}>`;
      const index = expectInt(`samples[${i}].index`, s.index, 0);
      const plan = this.#transform.deviceJpegPlan(
        s.bytes,
        path,
        sampleRandom(this.#seed, epoch, index),
        this.#deferFlip,
      );
      flips[i] = plan.flip ? 1 : 0;
      return { bytes: s.bytes, height: plan.height, width: plan.width, ...plan.request };
    });
    const dst = this.#buffer(n);
    try {
      raw.decode({ images, dst: dst.raw });
    } catch (err) {
      throw this.#named(err, samples);
    }
    if (join) raw.join();
    return { images: dst, flips };
  }

  /** Orders the device's work enqueued from now on after the last decode, without waiting on the host. */
  join(): void {
    this.#live().join();
  }

  /** Waits on the host for the last decode, at most `timeoutSeconds` (default 60). */
  synchronize(timeoutSeconds = 60): void {
    this.#live().synchronize({ timeoutSeconds: expectNumber('timeoutSeconds', timeoutSeconds, Number.MIN_VALUE) });
  }

  /** Frees the decoder and its buffers (after the device has finished with them). */
  dispose(): void {
    if (!this.#raw) return;
    this.#raw.dispose();
    this.#raw = null;
    for (const b of this.#buffers) b?.dispose();
    this.#buffers.fill(null);
  }

  #live(): RawJpegDecoder {
    if (!this.#raw) throw new ResnetError('ERR_RC_DISPOSED', 'This GpuJpegDecoder was disposed and cannot be used');
    return this.#raw;
  }

  /** The next of the two output buffers, for `n` images. */
  #buffer(n: number): Tensor {
    const k = this.#next;
    this.#next = 1 - k;
    const [h, w] = this.size;
    const old = this.#buffers[k];
    if (old?.shape[0] === n) return old;
    old?.dispose();
    const t = Tensor.empty([n, h, w, 3], { dtype: 'u8', device: this.device });
    this.#buffers[k] = t;
    return t;
  }

  /** A corrupt-file error of the native decoder ("image k ...") naming the file. */
  #named(err: unknown, samples: readonly GpuDecodeSample[]): unknown {
    if ((err as { code?: unknown }).code !== 'ERR_RC_CORRUPT_FILE') return err;
    const message = err instanceof Error ? err.message : String(err);
    const k = /image (\d+)/.exec(message);
    const sample = k ? samples[Number(k[1])] : undefined;
    if (!sample) return err;
    const named = new ResnetError(
      'ERR_RC_CORRUPT_FILE',
      `Cannot decode the image file '${sample.path}' on the device: ${message.trim()}`,
    );
    Object.assign(named, { cause: err });
    return named;
  }
}
