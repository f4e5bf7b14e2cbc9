/**
 * The device end of `DataLoader({ decode: 'gpu' })`: batches of encoded files (read by the
 * workers) decoded on the device by a {@link GpuJpegDecoder}, and their labels copied there.
 * @packageDocumentation
 */
import { ResnetError } from '../errors.js';
import { Tensor, copyToDevice } from '../tensor.js';
import type { EncodedBatch } from './batch-reader.js';
import { GpuJpegDecoder, type GpuDecodedBatch } from './gpu-decode.js';
import { SampleFailure, failureInfo } from './loader-worker.js';
import type { Compose } from './transforms.js';

/**
 * Decodes a loader's batches on a CUDA device. A decode only enqueues work on the decoder's stream
 * (its writes wait for the device work enqueued before it, which may still read the buffer's
 * previous batch); {@link DeviceDecodeStage.join} then orders the device's later work after it.
 * Decoding batch k + 1 before joining it lets it overlap the step on batch k.
 * @internal
 */
export class DeviceDecodeStage {
  /** The CUDA device decoded on. */
  readonly device: string;
  readonly #decoder: GpuJpegDecoder;
  /** Device labels, one tensor per batch size, reused by the next batch of that size. */
  readonly #labels = new Map<number, Tensor>();

  constructor(transform: Compose, device: string, seed: number, deferFlip: boolean) {
    this.device = device;
    this.#decoder = new GpuJpegDecoder({ transform, device, seed, deferFlip });
  }

  /** nvJPEG's engine, `'nvjpeg:hardware'` or `'nvjpeg:hybrid'`. */
  get implementation(): string {
    return this.#decoder.implementation;
  }

  /**
   * Enqueues the decode of `files` (the samples `indices` of `epoch`) without ordering the device's
   * work after it. Throws a {@link SampleFailure} naming the file that does not decode.
   */
  decode(files: EncodedBatch, indices: Int32Array, epoch: number): GpuDecodedBatch {
    const samples = files.paths.map((path, i) => ({
      bytes: new Uint8Array(files.data, files.offsets[i], files.offsets[i + 1]! - files.offsets[i]!),
      path,
      index: indices[i]!,
    }));
    try {
      return this.#decoder.decode(samples, epoch, { join: false });
    } catch (error) {
      // The decoder names a file that fails as '<path>'; the failure names its sample.
      const message = error instanceof Error ? error.message : String(error);
      const i = files.paths.findIndex((p) => message.includes(`'${p}'`));
      throw new SampleFailure(failureInfo(error, i >= 0 ? { index: indices[i]!, path: files.paths[i]! } : {}));
    }
  }

  /** Orders the device's work enqueued from now on after the last decode. */
  join(): void {
    this.#decoder.join();
  }

  /** `labels` in a device tensor owned by the stage (valid until the next batch of this size). */
  labels(labels: Int32Array): Tensor {
    let t = this.#labels.get(labels.length);
    if (!t) {
      t = Tensor.empty([labels.length], { dtype: 'i32', device: this.device });
      this.#labels.set(labels.length, t);
    }
    copyToDevice(t.raw, labels);
    return t;
  }

  /** Frees the decoder, its buffers and the label tensors (their frees are ordered after the device's work). */
  dispose(): void {
    this.#decoder.dispose();
    for (const t of this.#labels.values()) t.dispose();
    this.#labels.clear();
  }
}

/** The error of `toTensors(device)` on a device batch for another device. @internal */
export function wrongDevice(requested: string, device: string): never {
  throw new ResnetError(
    'ERR_RC_INVALID_ARGUMENT',
    `This batch was decoded on ${device} (decode: 'gpu'), so toTensors() gives tensors there, not on ${requested}: ` +
      'read batch.images for a host copy of the pixels',
  );
}
