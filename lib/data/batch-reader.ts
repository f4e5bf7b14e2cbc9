/**
 * The file reads of `DataLoader({ decode: 'gpu' })`: a batch's encoded files read (not decoded)
 * into one buffer, which a worker thread hands to the main thread without a copy (transferred).
 * @packageDocumentation
 */
import type { Dataset, RawSample } from './types.js';

/** A batch's encoded files, in batch order: file i is `data[offsets[i], offsets[i + 1])`. @internal */
export interface EncodedBatch {
  /** The files' bytes, one after the other. */
  data: ArrayBuffer;
  /** `n + 1` byte offsets into `data`. */
  offsets: number[];
  /** The samples' labels. */
  labels: Int32Array;
  /** The samples' file names (for error messages). */
  paths: string[];
}

/** A read that failed, with the sample it concerned. @internal */
export class ReadFailure extends Error {
  /** The dataset index of the sample. */
  readonly index: number;
  /** The sample's file, when known. */
  readonly path: string | undefined;
  /** The original error. */
  override readonly cause: unknown;
  constructor(cause: unknown, index: number, path: string | undefined) {
    super(cause instanceof Error ? cause.message : String(cause));
    this.cause = cause;
    this.index = index;
    this.path = path;
  }
}

/** A dataset that can also read a sample without yielding (ImageFolder's `getSync`). */
interface SyncReadable {
  getSync(index: number): RawSample;
}

/**
 * Reads a batch's samples as encoded files. Only datasets that yield encoded files can be read so:
 * a decoded sample fails with a message that says so.
 * @internal
 */
export class BatchReader {
  readonly #dataset: Dataset;
  readonly #readSync: ((index: number) => RawSample) | undefined;

  /**
   * With `syncReads` (worker threads, which have nothing else to do meanwhile), a dataset that
   * offers `getSync` is read with blocking reads.
   */
  constructor(dataset: Dataset, syncReads = false) {
    this.#dataset = dataset;
    const getSync = (dataset as Dataset & Partial<SyncReadable>).getSync;
    this.#readSync = syncReads && typeof getSync === 'function' ? (index) => getSync.call(dataset, index) : undefined;
  }

  /**
   * Reads the samples `indices` (in that order) into one {@link EncodedBatch}; throws a
   * {@link ReadFailure} naming the sample (and file) that failed.
   */
  async read(indices: readonly number[]): Promise<EncodedBatch> {
    const files: Uint8Array[] = [];
    const labels = new Int32Array(indices.length);
    const paths: string[] = [];
    for (let i = 0; i < indices.length; i++) {
      const index = indices[i]!;
      let sample: RawSample;
      try {
        sample = this.#readSync ? this.#readSync(index) : await this.#dataset.get(index);
      } catch (error) {
        const errorPath = (error as { path?: unknown } | null)?.path;
        throw new ReadFailure(error, index, typeof errorPath === 'string' ? errorPath : undefined);
      }
      if (sample.source.kind !== 'encoded') {
        throw new ReadFailure(
          new Error(
            "decode: 'gpu' decodes encoded JPEG files, but this sample is an already decoded image: use decode: 'cpu' for this dataset",
          ),
          index,
          undefined,
        );
      }
      files.push(sample.source.bytes);
      paths.push(sample.source.path);
      labels[i] = sample.label;
    }
    const offsets = [0];
    for (const f of files) offsets.push(offsets[offsets.length - 1]! + f.length);
    const data = new ArrayBuffer(offsets[offsets.length - 1]!);
    const bytes = new Uint8Array(data);
    files.forEach((f, i) => bytes.set(f, offsets[i]));
    return { data, offsets, labels, paths };
  }
}
