/**
 * The DataLoader's batch filler and its worker-thread entry point.
 *
 * {@link BatchFiller} turns a job (a batch's dataset indices and their positions in the batch) into
 * pixels, labels and flip flags written straight into a shared batch slot; for `decode: 'gpu'` a
 * {@link BatchReader} only reads the job's files and the worker sends them back. The main thread uses it
 * as is when the loader runs with `workers: 0`; in a worker thread (this module loaded with the
 * loader's `workerData`) it rebuilds the dataset and the transform from their specs once and then
 * serves jobs from the parent, one at a time, replying `done` or `error` per job.
 * @packageDocumentation
 */
import { isMainThread, parentPort, workerData } from 'node:worker_threads';
import { defined } from '../errors.js';
import { BatchReader, ReadFailure, type EncodedBatch } from './batch-reader.js';
import { datasetFromSpec } from './registry.js';
import { sampleRandom } from './sample-random.js';
import { Compose, type ComposeSpec } from './transforms.js';
import { setSharpConcurrency, sharpLoaded } from './transforms/decode.js';
import type { Dataset, DatasetSpec, RawSample } from './types.js';

/** Marks `workerData` as the loader's, so that importing this module elsewhere does nothing. @internal */
export const WORKER_TAG = 'resnet-cuda/data-loader-worker';

/** The shared memory of a loader's batch slots and what one sample occupies. @internal */
export interface SlotLayout {
  /** `slots * batchSize * height * width * channels` bytes of NHWC pixels. */
  images: SharedArrayBuffer;
  /** `slots * batchSize` int32 labels. */
  labels: SharedArrayBuffer;
  /** `slots * batchSize` flip flags (1 = mirror left-right). */
  flips: SharedArrayBuffer;
  /** Samples per slot. */
  batchSize: number;
  /** `[height, width, channels]` of every sample. */
  sampleShape: [number, number, number];
}

/** What a worker is started with. @internal */
export interface WorkerInit {
  tag: typeof WORKER_TAG;
  workerId: number;
  dataset: DatasetSpec;
  /**
   * `pixels`: decode and transform the samples into the shared slots; `files`: only read the
   * encoded files and send them back (`decode: 'gpu'`, which decodes on the device).
   */
  work: { kind: 'pixels'; transform: ComposeSpec; deferFlip: boolean; layout: SlotLayout } | { kind: 'files' };
}

/** One batch to fill: sample `items[i].index` goes to position `items[i].position` of `slot`. @internal */
export interface Job {
  /** Identifies the epoch run that posted the job, so replies from an abandoned run are ignored. */
  run: number;
  slot: number;
  batchIndexInEpoch: number;
  items: { index: number; position: number }[];
  epoch: number;
  seed: number;
}

/** A failure, as plain data that crosses threads. @internal */
export interface FailureInfo {
  message: string;
  /** The original error's `code` (e.g. `ERR_RC_INVALID_ARGUMENT`, `ENOENT`), when it had one. */
  code?: string;
  name?: string;
  stack?: string;
  /** The dataset index being processed. */
  index?: number;
  /** The file, for encoded sources. */
  path?: string;
  /** The worker (0-based), or undefined for the main thread. */
  worker?: number;
}

/** A worker's reply. @internal */
export type WorkerReply =
  | { type: 'ready'; workerId: number }
  /** Sent once, after the first job that loaded sharp (which decodes on libuv's shared threadpool). */
  | { type: 'sharp'; workerId: number }
  | { type: 'fatal'; workerId: number; error: FailureInfo }
  /** A filled slot; in `files` work, the batch's files (transferred) as well. */
  | { type: 'done'; run: number; slot: number; batchIndexInEpoch: number; files?: EncodedBatch }
  | { type: 'error'; run: number; slot: number; batchIndexInEpoch: number; error: FailureInfo };

/** Thrown by {@link BatchFiller.fill} with the failing sample's details. @internal */
export class SampleFailure extends Error {
  readonly info: FailureInfo;
  constructor(info: FailureInfo) {
    super(info.message);
    this.info = info;
  }
}

/** Plain data describing any thrown value. @internal */
export function failureInfo(error: unknown, extra: Partial<FailureInfo> = {}): FailureInfo {
  if (error instanceof SampleFailure) return { ...error.info, ...extra };
  if (error instanceof ReadFailure) {
    const where = { index: error.index, ...(error.path !== undefined ? { path: error.path } : {}) };
    return { ...failureInfo(error.cause), ...where, ...extra };
  }
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code;
    return {
      message: error.message,
      name: error.name,
      ...(error.stack !== undefined ? { stack: error.stack } : {}),
      ...(typeof code === 'string' ? { code } : {}),
      ...extra,
    };
  }
  return { message: String(error), ...extra };
}

/** A dataset that can also read a sample without yielding (ImageFolder's `getSync`). */
interface SyncReadable {
  getSync(index: number): RawSample;
}

function canReadSync(dataset: Dataset): dataset is Dataset & SyncReadable {
  return typeof (dataset as Partial<SyncReadable>).getSync === 'function';
}

/**
 * Fills batch slots: for each item, `dataset.get(index)`, then the transform seeded by
 * `sampleRandom(seed, epoch, index)` (so the result does not depend on which thread runs it), then
 * a size check and a copy of the pixels, the label and the flip flag into the slot. Samples are
 * done one at a time: a second one in flight makes a worker faster (it overlaps the thread
 * hand-offs) but costs about 6% more CPU time per image (two libvips pipelines contend for its
 * locks), and throughput per core is what a loader sized by cores needs.
 * @internal
 */
export class BatchFiller {
  readonly #dataset: Dataset;
  readonly #transform: Compose;
  readonly #deferFlip: boolean;
  readonly #images: Uint8Array;
  readonly #labels: Int32Array;
  readonly #flips: Uint8Array;
  readonly #batchSize: number;
  readonly #shape: [number, number, number];
  readonly #sampleBytes: number;
  readonly #readSync: ((index: number) => RawSample) | undefined;

  /**
   * With `syncReads` (worker threads, which have nothing else to do while they fill a batch), a
   * dataset that offers `getSync` is read without the round trips of asynchronous file reads.
   */
  constructor(dataset: Dataset, transform: Compose, deferFlip: boolean, layout: SlotLayout, syncReads = false) {
    this.#dataset = dataset;
    this.#transform = transform;
    this.#deferFlip = deferFlip;
    this.#images = new Uint8Array(layout.images);
    this.#labels = new Int32Array(layout.labels);
    this.#flips = new Uint8Array(layout.flips);
    this.#batchSize = layout.batchSize;
    this.#shape = layout.sampleShape;
    this.#sampleBytes = layout.sampleShape[0] * layout.sampleShape[1] * layout.sampleShape[2];
    this.#readSync = syncReads && canReadSync(dataset) ? (index) => dataset.getSync(index) : undefined;
  }

  /** Fills `job.slot`; throws a {@link SampleFailure} naming the sample (and file) that failed. */
  async fill(job: Job): Promise<void> {
    for (const { index, position } of job.items) {
      let sample: RawSample | undefined;
      try {
        sample = this.#readSync ? this.#readSync(index) : await this.#dataset.get(index);
        const rng = sampleRandom(job.seed, job.epoch, index);
        const { image, flip } = await this.#transform.run(sample, rng, { deferFlip: this.#deferFlip });
        const [h, w, c] = this.#shape;
        if (image.height !== h || image.width !== w || image.channels !== c || image.data.length < this.#sampleBytes) {
          throw new Error(
            `the transform produced a ${image.height}x${image.width}x${image.channels} image (${image.data.length} bytes) ` +
              `but the loader's batches hold ${h}x${w}x${c} (height x width x channels)`,
          );
        }
        const slotSample = job.slot * this.#batchSize + position;
        this.#images.set(image.data.subarray(0, this.#sampleBytes), slotSample * this.#sampleBytes);
        this.#labels[slotSample] = sample.label;
        // A flip the transform applied itself is already in the pixels; only a deferred one is
        // left for the consumer (InputNormalize's flip argument).
        this.#flips[slotSample] = this.#deferFlip && flip ? 1 : 0;
      } catch (error) {
        // A sample that could not be read names its file in the error (as Node's file errors do).
        const errorPath = (error as { path?: unknown } | null)?.path;
        const path =
          sample?.source.kind === 'encoded'
            ? sample.source.path
            : typeof errorPath === 'string'
              ? errorPath
              : undefined;
        throw new SampleFailure(failureInfo(error, { index, ...(path !== undefined ? { path } : {}) }));
      }
    }
  }
}

/** One job's work in a worker: fill the job's slot, or read its files. */
type JobWork = (job: Job) => Promise<EncodedBatch | undefined>;

/** The worker's work for its init: a {@link BatchFiller} or a {@link BatchReader} (blocking reads). */
async function buildWork(init: WorkerInit): Promise<JobWork> {
  const dataset = await datasetFromSpec(init.dataset);
  const work = init.work;
  if (work.kind === 'files') {
    const reader = new BatchReader(dataset, true);
    return (job) => reader.read(job.items.map((item) => item.index));
  }
  const transform = Compose.fromSpec(work.transform);
  const filler = new BatchFiller(dataset, transform, work.deferFlip, work.layout, true);
  return async (job) => {
    await filler.fill(job);
    return undefined;
  };
}

/** The worker thread's main: build once, then do jobs in the order they arrive. */
function serve(init: WorkerInit): void {
  const port = defined(parentPort, "the worker's parent port"); // serve() runs in a worker thread
  // Parallelism comes from the workers, so each libvips pipeline gets one thread: sharp's default
  // on some platforms (macOS, musl, jemalloc) is one per core, which would put workers x cores
  // threads on the cores and spend the difference on hand-offs. The setting is global to the
  // process's libvips (the main thread's own sharp calls get one thread as well). sharp is loaded
  // only for files the native JPEG decoder does not take (PNG, WebP, CMYK JPEGs).
  setSharpConcurrency(1);
  // The listener is attached before the (asynchronous) rebuild so that no job is missed; jobs wait
  // for the rebuild and then run one at a time, each using one thread of decoding at most.
  const ready: Promise<JobWork> = buildWork(init);
  let queue: Promise<void> = Promise.resolve();
  let sharpReported = false;
  const reportSharp = (): void => {
    if (sharpReported || !sharpLoaded()) return;
    sharpReported = true;
    port.postMessage({ type: 'sharp', workerId: init.workerId } satisfies WorkerReply);
  };
  port.on('message', (job: Job) => {
    queue = queue.then(async () => {
      let work: JobWork;
      try {
        work = await ready;
      } catch {
        return; // reported once as 'fatal' below
      }
      try {
        const files = await work(job);
        reportSharp();
        const reply: WorkerReply = {
          type: 'done',
          run: job.run,
          slot: job.slot,
          batchIndexInEpoch: job.batchIndexInEpoch,
          ...(files ? { files } : {}),
        };
        // The files' buffers move to the main thread (no copy).
        port.postMessage(reply, files ? [files.data, files.labels.buffer as ArrayBuffer] : []);
      } catch (error) {
        const reply: WorkerReply = {
          type: 'error',
          run: job.run,
          slot: job.slot,
          batchIndexInEpoch: job.batchIndexInEpoch,
          error: failureInfo(error, { worker: init.workerId }),
        };
        reportSharp();
        port.postMessage(reply);
      }
    });
  });
  ready.then(
    () => port.postMessage({ type: 'ready', workerId: init.workerId } satisfies WorkerReply),
    (error: unknown) =>
      port.postMessage({
        type: 'fatal',
        workerId: init.workerId,
        error: failureInfo(error, { worker: init.workerId }),
      } satisfies WorkerReply),
  );
}

if (!isMainThread && (workerData as Partial<WorkerInit> | null)?.tag === WORKER_TAG) serve(workerData as WorkerInit);
