/**
 * The DataLoader: batches of decoded, augmented uint8 NHWC images produced by worker threads into
 * shared memory, delivered in sampler order, like `torch.utils.data.DataLoader`.
 *
 * ```ts
 * const loader = new DataLoader(dataset, { batchSize: 256, shuffle: true, seed: 0, transform });
 * const normalize = new InputNormalize({ dtype: 'bf16' });
 * for (let epoch = 0; epoch < 90; epoch++) {
 *   for await (const batch of loader) {               // epochs are counted automatically
 *     const { images, labels } = batch.toTensors('cuda:0');
 *     const logits = model.forward(normalize.forward(images, batch.flips));
 *     ...
 *   }
 * }
 * await loader.close();
 * ```
 *
 * How it works: each worker rebuilds the dataset (`datasetFromSpec(dataset.spec())`) and the
 * transform (`Compose.fromSpec(transform.spec())`) once, then fills whole batches. Batches live in a
 * ring of `workers * prefetch + 1` slots of one SharedArrayBuffer, so pixels are written once by the
 * worker and never copied between threads. A slot is handed to a worker again only after the
 * consumer has moved past the batch in it: a batch's arrays are valid until the next iteration
 * step. Every sample's random draws come from `sampleRandom(seed, epoch, index)`, so results do
 * not depend on the number of workers or on which worker served a sample.
 *
 * Workers decode with sharp, each one image at a time: they set libvips' concurrency to one thread
 * per image (`sharp.concurrency(1)`, a process-wide setting), since the parallelism comes from the
 * workers, and read ImageFolder files with blocking reads, which cost a worker less than the round
 * trips of asynchronous ones.
 *
 * Workers start from the compiled `loader-worker.js` beside this module, with the parent's Node
 * flags less those that choose the main program (see {@link workerExecArgv}).
 *
 * With `decode: 'gpu'` the workers only read each batch's files into one buffer, transferred to
 * the main thread, and a {@link DeviceDecodeStage} decodes them on the device (nvJPEG, then the
 * backend's crop, resize and flip kernels with the samples' usual draws): when batch k is asked
 * for, batch k + 1's decode is enqueued too if its files are here, so that it runs during the step
 * on batch k. Slots then only count the batches in flight (no pixels pass through host memory).
 * @packageDocumentation
 */
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import { asyncDisposeSymbol } from '../dispose.js';
import { parseDevice } from '../device.js';
import { ResnetError, defined, expectBool, expectInt, expectOneOf, expectOptions, invalid } from '../errors.js';
import { Tensor, copyToDevice } from '../tensor.js';
import { BatchReader, ReadFailure, type EncodedBatch } from './batch-reader.js';
import { expectDataset } from './dataset.js';
import { DeviceDecodeStage, wrongDevice } from './device-decode-stage.js';
import type { GpuDecodedBatch } from './gpu-decode.js';
import { expectGpuDataset, expectGpuTransform, gpuDecodeDevice } from './gpu-decode-checks.js';
import {
  BatchFiller,
  SampleFailure,
  WORKER_TAG,
  failureInfo,
  type FailureInfo,
  type Job,
  type SlotLayout,
  type WorkerInit,
  type WorkerReply,
} from './loader-worker.js';
import { loaderWorkerUrl } from './loader-worker-url.js';
import { DistributedSampler, RandomSampler, SequentialSampler, randomSeed, type Sampler } from './sampler.js';
import { Compose } from './transforms.js';
import type { Dataset } from './types.js';
import { workerExecArgv } from './worker-flags.js';

/** Options of {@link DataLoader}. */
export interface DataLoaderOptions {
  /** Samples per batch. */
  batchSize: number;
  /**
   * The per-sample transform; it must end in a fixed output size (`Resize` to a pair,
   * `CenterCrop`, `RandomResizedCrop`), which sets the batches' height and width. Optional for a
   * dataset whose images all have one size ({@link Dataset.imageShape}: IDX, CIFAR, synthetic and
   * generated datasets), which are then batched as they are, with their channels (1 or 3).
   */
  transform?: Compose;
  /** Visit the samples in a fresh seeded random order each epoch; default false. */
  shuffle?: boolean;
  /**
   * Seed of the shuffling and of every sample's augmentation draws; random (fixed for this
   * loader's lifetime) when omitted. With `distributed`, the default is 0, the same on every rank.
   */
  seed?: number;
  /** A custom sampler (excludes `shuffle` and `distributed`). */
  sampler?: Sampler;
  /** Drop the last batch when it is smaller than `batchSize`; default false. */
  dropLast?: boolean;
  /**
   * Worker threads; default `os.availableParallelism() - 1` (at least 1). `0` fills batches in the
   * main thread, one at a time when the consumer asks for it.
   */
  workers?: number;
  /** Batches in flight per worker; default 2. */
  prefetch?: number;
  /**
   * Keep the workers (and their rebuilt datasets) between epochs until {@link DataLoader.close};
   * default false: workers start at the beginning of each epoch and end with it. Idle persistent
   * workers do not keep the process alive.
   */
  persistentWorkers?: boolean;
  /**
   * Leave horizontal flips to the consumer: the pixels stay unflipped and `batch.flips` says which
   * samples to mirror (pass it to `InputNormalize.forward`, which flips on the device); default true.
   */
  deferFlip?: boolean;
  /**
   * Default device of {@link Batch.toTensors}; default `'cpu'`. With `decode: 'gpu'`, the CUDA
   * device the batches are decoded on (required).
   */
  device?: string;
  /**
   * Data-parallel training: this process reads only its share of each epoch, through a
   * {@link DistributedSampler} (shuffled when `shuffle` is true, padded unless `dropLast` here).
   */
  distributed?: { rank: number; worldSize: number; dropLast?: boolean };
  /**
   * Where the JPEGs are decoded: `'cpu'` (default; the workers decode and transform into host
   * memory) or `'gpu'`: the workers only read the files, and the batches are decoded, cropped,
   * resized and flipped on `device` (a CUDA device, required) with nvJPEG and the backend's
   * kernels, each batch's decode overlapping the step on the one before. `toTensors()` then gives
   * the decoded images on the device without a copy, and `images` is a host copy made when read.
   * Takes datasets of JPEG files (ImageFolder or ImageFiles of JPEGs, and Subsets of them) and
   * transforms of a RandomResizedCrop, Resize or CenterCrop (a CenterCrop may follow a Resize),
   * then only RandomHorizontalFlip and Normalize; anything else is refused when the loader is
   * made, naming what the device cannot do. Samplers, shuffling, epochs, `dropLast` and
   * `distributed` are the CPU path's, and so are every sample's random draws: the batches match
   * the CPU decoder's up to the JPEG decoders' rounding.
   */
  decode?: 'cpu' | 'gpu';
  /**
   * Stops the loader: once aborted, the running epoch fails with the signal's reason (an
   * `AbortError` by default), the workers end, and later epochs fail the same way at their start.
   */
  signal?: AbortSignal;
}

/**
 * One batch. `images` is a view of a shared slot that the loader refills once the consumer has
 * moved on: it is valid until the next iteration step (copy it, or call `toTensors`, to keep the
 * pixels). `labels`, `flips` and `indices` are the batch's own small arrays, valid for good.
 */
export interface Batch {
  /**
   * `size * height * width * channels` bytes, uint8 NHWC (RGB), a view of shared memory; valid
   * until the next iteration step. Move it to a tensor with `toTensors` (the addon's
   * `copyFromHost` does not take SharedArrayBuffer views).
   */
  readonly images: Uint8Array;
  /** Where the batch was decoded: `'cpu'`, or `'gpu'` for a batch already on the loader's device. */
  readonly decoded: 'cpu' | 'gpu';
  /** The class label of each sample (ordinary memory: pass it to the loss as it is). */
  readonly labels: Int32Array;
  /** 1 where the sample is to be mirrored left-right (deferred flips), else 0: `InputNormalize.forward`'s `flip`. */
  readonly flips: Uint8Array;
  /** Number of samples (the last batch of an epoch can be smaller than `batchSize`). */
  readonly size: number;
  /** `[size, height, width, channels]`. */
  readonly shape: readonly [number, number, number, number];
  /** The dataset index of each sample. */
  readonly indices: Int32Array;
  /** The epoch this batch belongs to. */
  readonly epoch: number;
  /** The batch's position in its epoch, from 0. */
  readonly index: number;
  /**
   * Copies the batch into tensors on `device` (default: the loader's `device`): `images` u8
   * `[size, H, W, C]` and `labels` i32 `[size]`. The tensors are owned by the loader and reused by
   * the next call (one pair per device and batch size); they stay valid after the iteration moves
   * on, until that next call. Throws once the batch is no longer current. With `decode: 'gpu'`,
   * `images` is the decoded batch itself, on the loader's device only (no copy), whose buffer is
   * decoded into again once the iteration moves on (after the device work enqueued until then).
   */
  toTensors(device?: string): { images: Tensor; labels: Tensor };
}

/** An error from loading a sample, with the original message and code and the sample's identity. */
export class DataLoaderError extends Error {
  /** The original error's code (`ENOENT`, `ERR_RC_INVALID_ARGUMENT`, …), or `ERR_RC_DATA_LOADER`. */
  readonly code: string;
  /** The dataset index of the failing sample, when the failure concerned one. */
  readonly index: number | undefined;
  /** The file of the failing sample, for datasets of encoded files. */
  readonly path: string | undefined;
  /** The worker that failed (0-based), or undefined for the main thread. */
  readonly worker: number | undefined;
  /** The original error's stack, as printed in the thread that threw it. */
  readonly originalStack: string | undefined;

  /** @internal */
  constructor(info: FailureInfo, context: string) {
    const where = [
      info.index !== undefined ? `dataset index ${info.index}` : undefined,
      info.path !== undefined ? `file ${info.path}` : undefined,
      info.worker !== undefined ? `loader worker ${info.worker}` : 'main thread',
    ].filter((s) => s !== undefined);
    super(`${context}: ${info.message} (${where.join(', ')})`);
    this.name = 'DataLoaderError';
    this.code = info.code ?? 'ERR_RC_DATA_LOADER';
    this.index = info.index;
    this.path = info.path;
    this.worker = info.worker;
    this.originalStack = info.stack;
  }
}

/** A batch job's result: its slot, and for `decode: 'gpu'` the files read. */
interface JobResult {
  slot: number;
  files?: EncodedBatch;
}

/** The jobs of an epoch run by the workers (see DataLoader's #feed). */
interface Feed {
  /** Batch k's result, in epoch order. */
  done: Deferred<JobResult>[];
  /** The results that have arrived, to look at without waiting. */
  arrived: (JobResult | undefined)[];
  /** Gives a slot back, for the next job. */
  release(slot: number): void;
}

/** What an epoch run's cleanup needs: the batch handed out, and whether the run failed. */
interface RunState {
  current: { valid: boolean } | undefined;
  failed: boolean;
}

/** A promise with its settle functions. */
interface Deferred<T> {
  promise: Promise<T>;
  resolve(value: T): void;
  reject(error: unknown): void;
}

/**
 * Does nothing: the handler for a rejection that is awaited elsewhere (or deliberately dropped),
 * and for worker replies and failures that no epoch run is listening to.
 */
function ignore(): void {
  // Nothing to do.
}

function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  let reject!: (error: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  promise.catch(ignore); // awaited later, or never when an epoch is abandoned
  return { promise, resolve, reject };
}

let threadpoolWarned = false;

/**
 * Warns (once) when the workers outnumber libuv's threadpool, as a worker reports that it decodes
 * with sharp (PNG, WebP, CMYK JPEGs; other JPEGs are decoded in the addon, on the worker's own
 * thread): sharp decodes on that pool, which every thread of a process shares, so more workers
 * than pool threads wait for one.
 */
function warnIfThreadpoolSmall(workers: number): void {
  const size = Number(process.env.UV_THREADPOOL_SIZE) || 4;
  if (workers <= size || threadpoolWarned) return;
  threadpoolWarned = true;
  process.emitWarning(
    `DataLoader: ${workers} workers decode with sharp on libuv's threadpool, which all threads of the process share and which has ` +
      `${size} threads, so at most ${size} images decode at a time; start Node with UV_THREADPOOL_SIZE=${workers + 1} in its environment`,
  );
}

/** The loader's worker threads, their outstanding jobs and their liveness. */
class WorkerPool {
  readonly #workers: Worker[] = [];
  readonly #outstanding: number[] = [];
  readonly #alive = new Set<Worker>();
  readonly #ready: Promise<void>;
  #onReply: (reply: WorkerReply) => void = ignore;
  #onFailure: (error: Error) => void = ignore;
  #closing = false;

  constructor(count: number, init: Omit<WorkerInit, 'workerId'>) {
    const url = loaderWorkerUrl();
    const execArgv = workerExecArgv();
    const readies: Promise<undefined>[] = [];
    for (let id = 0; id < count; id++) {
      const worker = new Worker(url, {
        workerData: { ...init, workerId: id } satisfies WorkerInit,
        name: `resnet-cuda loader ${id}`,
        execArgv,
      });
      const ready = deferred<undefined>();
      readies.push(ready.promise);
      this.#workers.push(worker);
      this.#outstanding.push(0);
      this.#alive.add(worker);
      worker.on('message', (reply: WorkerReply) => {
        if (reply.type === 'ready') ready.resolve(undefined);
        else if (reply.type === 'sharp') warnIfThreadpoolSmall(count);
        else if (reply.type === 'fatal') {
          const error = new DataLoaderError(
            reply.error,
            `DataLoader worker ${id} could not rebuild the dataset and transform`,
          );
          ready.reject(error);
          this.#onFailure(error);
        } else {
          this.#outstanding[id]!--;
          this.#onReply(reply);
        }
      });
      worker.on('error', (error: Error) => {
        const wrapped = new DataLoaderError(failureInfo(error, { worker: id }), 'DataLoader worker crashed');
        ready.reject(wrapped);
        this.#onFailure(wrapped);
      });
      worker.on('exit', (code) => {
        this.#alive.delete(worker);
        if (!this.#closing) {
          const error = new DataLoaderError(
            { message: `exited with code ${code}`, worker: id },
            'DataLoader worker stopped unexpectedly',
          );
          ready.reject(error);
          this.#onFailure(error);
        }
      });
    }
    this.#ready = Promise.all(readies).then(() => undefined);
    this.#ready.catch(ignore);
  }

  /** Resolves when every worker has rebuilt its dataset and transform. */
  get ready(): Promise<void> {
    return this.#ready;
  }

  /** Number of worker threads that have not exited. */
  get alive(): number {
    return this.#alive.size;
  }

  /** Number of workers. */
  get size(): number {
    return this.#workers.length;
  }

  /** Jobs posted to worker `id` and not yet answered. */
  outstanding(id: number): number {
    return this.#outstanding[id]!;
  }

  /** Sets where replies and failures go (the current epoch run). */
  listen(onReply: (reply: WorkerReply) => void, onFailure: (error: Error) => void): void {
    this.#onReply = onReply;
    this.#onFailure = onFailure;
  }

  /** Posts a job to worker `id`. */
  post(id: number, job: Job): void {
    this.#outstanding[id]!++;
    this.#workers[id]!.postMessage(job);
  }

  /** The worker with the fewest outstanding jobs. */
  leastBusy(): number {
    let best = 0;
    for (let i = 1; i < this.#workers.length; i++) if (this.#outstanding[i]! < this.#outstanding[best]!) best = i;
    return best;
  }

  /** Total outstanding jobs. */
  get totalOutstanding(): number {
    return this.#outstanding.reduce((a, b) => a + b, 0);
  }

  /** Lets the workers keep the process alive (while an epoch runs) or not (while idle). */
  setRef(ref: boolean): void {
    for (const worker of this.#alive) {
      if (ref) worker.ref();
      else worker.unref();
    }
  }

  /** Terminates every worker and waits for them to exit. */
  async terminate(): Promise<void> {
    this.#closing = true;
    this.#onReply = ignore;
    this.#onFailure = ignore;
    await Promise.all([...this.#alive].map((w) => w.terminate()));
  }
}

const OPTION_KEYS = [
  'batchSize',
  'transform',
  'shuffle',
  'seed',
  'sampler',
  'dropLast',
  'workers',
  'prefetch',
  'persistentWorkers',
  'deferFlip',
  'device',
  'distributed',
  'decode',
  'signal',
] as const;

/** The default number of workers: one core is left to the training loop. */
export function defaultWorkers(): number {
  return Math.max(1, availableParallelism() - 1);
}

/**
 * Iterates a {@link Dataset} in batches, with the samples decoded and transformed by worker
 * threads. `for await (const batch of loader)` runs one epoch; epochs are numbered automatically
 * from 0 (each iteration takes the next) unless set with {@link DataLoader.setEpoch}. One epoch
 * runs at a time. Leaving the loop early (`break`, an exception) stops the epoch and, unless
 * `persistentWorkers`, its workers. Call {@link DataLoader.close} when done. An epoch's iterator
 * taken by hand and dropped without `return()` keeps its workers running (and the process
 * alive) until `close()`.
 */
export class DataLoader implements AsyncIterable<Batch> {
  /** The dataset. */
  readonly dataset: Dataset;
  /** The transform applied to every sample. */
  readonly transform: Compose;
  /** Samples per batch. */
  readonly batchSize: number;
  /** Whether a last, smaller batch is dropped. */
  readonly dropLast: boolean;
  /** The order of the samples. */
  readonly sampler: Sampler;
  /** Seed of the shuffling and the augmentations. */
  readonly seed: number;
  /** Worker threads (0: the main thread fills the batches). */
  readonly workers: number;
  /** Batches in flight per worker. */
  readonly prefetch: number;
  /** Whether workers outlive an epoch. */
  readonly persistentWorkers: boolean;
  /** Whether horizontal flips are left to the consumer (`batch.flips`). */
  readonly deferFlip: boolean;
  /** Default device of `toTensors`. */
  readonly device: string;
  /** Where the JPEGs are decoded (see {@link DataLoaderOptions.decode}). */
  readonly decode: 'cpu' | 'gpu';
  /** `[height, width]` of every image, from the transform (or the dataset's images, without one). */
  readonly outputSize: readonly [number, number];
  /** Stops the loader when aborted. */
  readonly signal: AbortSignal | undefined;

  #epoch = 0;
  #startBatch = 0;
  #runCounter = 0;
  #active = false;
  #closed = false;
  #layout: SlotLayout | undefined;
  #pool: WorkerPool | undefined;
  #filler: BatchFiller | undefined;
  #reader: BatchReader | undefined;
  /** The device decoder of `decode: 'gpu'`. */
  #stage: DeviceDecodeStage | undefined;
  /** Fails the running epoch's pending batches (set while an epoch with workers runs). */
  #abortRun: ((error: Error) => void) | undefined;
  readonly #tensors = new Map<string, { images: Tensor; labels: Tensor }>();
  /** Whether the addon takes shared-memory arrays directly (unknown until the first copy). */
  #directCopy: boolean | undefined;
  /** Host staging memory for `toTensors` when it does not: one slot's pixels. */
  #staging: Uint8Array | undefined;
  /** The one closing of this loader, once started. */
  #closing: Promise<void> | undefined;
  readonly #onAbort = (): void => void this.#stop(defined(this.signal, 'the abort signal').reason);

  constructor(dataset: Dataset, options: DataLoaderOptions) {
    const o = expectOptions<DataLoaderOptions>('DataLoader options', options, OPTION_KEYS);
    this.dataset = expectDataset('dataset', dataset);
    this.batchSize = expectInt('batchSize', o.batchSize, 1);
    if (o.transform !== undefined && !(o.transform instanceof Compose)) {
      invalid('transform', 'a Compose (e.g. Compose.fromSpec([...]))', o.transform);
    }
    const shape = this.dataset.imageShape;
    if (o.transform === undefined && shape === undefined) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'DataLoader needs a transform for this dataset, whose images can be of different sizes (it declares no imageShape): ' +
          'give transform: new Compose([...]) ending with RandomResizedCrop({ size }), CenterCrop({ size }) or Resize({ size: [height, width] })',
      );
    }
    let size: [number, number] | null;
    if (o.transform === undefined) {
      // The check above: without a transform the dataset declares its image shape.
      const fixed = defined(shape, "the dataset's image shape");
      this.transform = new Compose([], { outputChannels: fixed[2] === 1 ? 1 : 3 });
      size = [fixed[0], fixed[1]];
    } else {
      this.transform = o.transform;
      size = this.transform.fixedOutputSize();
    }
    if (size === null) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `DataLoader needs a transform with a fixed output size, so that every sample fits the batch; this one ` +
          `(${this.transform.transforms.map((t) => t.kind).join(', ') || 'empty'}) can yield images of any size: ` +
          `end it with RandomResizedCrop({ size }), CenterCrop({ size }) or Resize({ size: [height, width] })`,
      );
    }
    this.outputSize = Object.freeze([size[0], size[1]] as const);
    const shuffle = o.shuffle === undefined ? false : expectBool('shuffle', o.shuffle);
    this.dropLast = o.dropLast === undefined ? false : expectBool('dropLast', o.dropLast);
    if (o.sampler !== undefined && (o.shuffle !== undefined || o.distributed !== undefined)) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'DataLoader: give either sampler or shuffle/distributed, not both (a custom sampler decides the order)',
      );
    }
    if (o.distributed !== undefined) {
      const d = expectOptions<{ rank: number; worldSize: number; dropLast?: boolean }>('distributed', o.distributed, [
        'rank',
        'worldSize',
        'dropLast',
      ]);
      this.seed = o.seed === undefined ? 0 : expectInt('seed', o.seed, 0, 2 ** 32 - 1);
      // Checked as DistributedSampler checks them (same names, order and messages).
      const worldSize = expectInt('worldSize', d.worldSize, 1);
      const rank = expectInt('rank', d.rank, 0, worldSize - 1);
      this.sampler = new DistributedSampler({
        length: dataset.length,
        rank,
        worldSize,
        shuffle,
        seed: this.seed,
        dropLast: d.dropLast ?? false,
      });
    } else {
      this.seed = o.seed === undefined ? randomSeed() : expectInt('seed', o.seed, 0, 2 ** 32 - 1);
      if (o.sampler !== undefined) {
        const s = o.sampler as unknown;
        if (
          s === null ||
          typeof s !== 'object' ||
          typeof (s as Sampler)[Symbol.iterator] !== 'function' ||
          typeof (s as Sampler).length !== 'number'
        ) {
          invalid('sampler', 'a Sampler (iterable of indices with a length)', s);
        }
        this.sampler = o.sampler;
      } else {
        this.sampler = shuffle
          ? new RandomSampler({ length: dataset.length, seed: this.seed })
          : new SequentialSampler({ length: dataset.length });
      }
    }
    this.workers = o.workers === undefined ? defaultWorkers() : expectInt('workers', o.workers, 0, 1024);
    this.prefetch = o.prefetch === undefined ? 2 : expectInt('prefetch', o.prefetch, 1, 1024);
    this.persistentWorkers =
      o.persistentWorkers === undefined ? false : expectBool('persistentWorkers', o.persistentWorkers);
    this.deferFlip = o.deferFlip === undefined ? true : expectBool('deferFlip', o.deferFlip);
    if (o.device !== undefined && typeof o.device !== 'string') {
      invalid('device', "a device name such as 'cpu' or 'cuda:0'", o.device);
    }
    this.decode = o.decode === undefined ? 'cpu' : expectOneOf('decode', o.decode, ['cpu', 'gpu'] as const);
    if (this.decode === 'gpu') {
      this.device = gpuDecodeDevice(o.device);
      expectGpuDataset(this.dataset, this.dataset.spec());
      expectGpuTransform(this.transform, this.deferFlip);
    } else {
      this.device = o.device ?? 'cpu';
    }
    if (o.signal !== undefined && !(o.signal instanceof AbortSignal)) invalid('signal', 'an AbortSignal', o.signal);
    this.signal = o.signal;
    // Last of what can throw, as it takes device resources: the checks above throw first.
    if (this.decode === 'gpu') {
      this.#stage = new DeviceDecodeStage(this.transform, this.device, this.seed, this.deferFlip);
    }
    this.signal?.addEventListener('abort', this.#onAbort, { once: true });
  }

  /** Batches per epoch. */
  get length(): number {
    const n = this.sampler.length;
    return this.dropLast ? Math.floor(n / this.batchSize) : Math.ceil(n / this.batchSize);
  }

  /** The epoch the next iteration runs. */
  get epoch(): number {
    return this.#epoch;
  }

  /**
   * Sets the epoch the next iteration runs (later iterations continue from it) and, for resuming
   * inside an epoch, the batch it starts at: the batches before `startBatch` are neither loaded
   * nor yielded, and the others are the same as in a whole epoch (every sample's randomness comes
   * from the seed, the epoch and its index), with the same `index`. `startBatch` applies to the
   * next iteration only.
   */
  setEpoch(epoch: number, startBatch = 0): void {
    this.#epoch = expectInt('epoch', epoch, 0);
    this.#startBatch = expectInt('startBatch', startBatch, 0);
  }

  /** Worker threads currently running (0 between epochs unless `persistentWorkers`). */
  get activeWorkers(): number {
    return this.#pool?.alive ?? 0;
  }

  /** The `Normalize` step's mean and std (in [0, 1] units) for `InputNormalize`, if the transform has one. */
  normalization(): { mean: number[]; std: number[] } | null {
    const n = this.transform.normalization();
    return n === null ? null : { mean: [...n.mean], std: [...n.std] };
  }

  /** Runs the next epoch. */
  [Symbol.asyncIterator](): AsyncIterator<Batch> {
    if (this.#closed) throw new ResnetError('ERR_RC_DISPOSED', 'This DataLoader was closed');
    const epoch = this.#epoch++;
    const first = this.#startBatch;
    this.#startBatch = 0;
    return this.#run(epoch, first);
  }

  /**
   * Stops the workers and frees the tensors of `toTensors`; the loader cannot be used afterwards.
   * Closing again does nothing (and resolves when the first closing has finished).
   */
  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  /** {@link DataLoader.close}, for `await using loader = new DataLoader(...)`. */
  async [asyncDisposeSymbol](): Promise<void> {
    await this.close();
  }

  async #close(): Promise<void> {
    this.#closed = true;
    this.signal?.removeEventListener('abort', this.#onAbort);
    await this.#stop(new ResnetError('ERR_RC_DISPOSED', 'The DataLoader was closed while an epoch was running'));
    for (const { images, labels } of this.#tensors.values()) {
      images.dispose();
      labels.dispose();
    }
    this.#tensors.clear();
    this.#stage?.dispose();
  }

  /** Fails the running epoch with `reason` and ends the workers. */
  async #stop(reason: unknown): Promise<void> {
    this.#abortRun?.(reason instanceof Error ? reason : new Error(String(reason)));
    const pool = this.#pool;
    this.#pool = undefined;
    await pool?.terminate();
  }

  /** The slot layout: the transform's fixed size and channels, allocated on first use and kept. */
  #ensureLayout(): SlotLayout {
    if (this.#layout) return this.#layout;
    const [h, w] = this.outputSize;
    const c = this.transform.outputChannels;
    const slots = this.#slotCount();
    const sampleBytes = h * w * c;
    return (this.#layout = {
      images: sharedBuffer(
        slots * this.batchSize * sampleBytes,
        `${slots} batches of ${this.batchSize} images of ${h}x${w}x${c}`,
      ),
      labels: sharedBuffer(slots * this.batchSize * 4, `${slots} batches of ${this.batchSize} labels`),
      flips: sharedBuffer(slots * this.batchSize, `${slots} batches of ${this.batchSize} flip flags`),
      batchSize: this.batchSize,
      sampleShape: [h, w, c],
    });
  }

  /**
   * Batch slots: one per batch in flight plus the one the consumer holds. Without workers the
   * next batch is filled only when asked for, after the consumer has left the previous one.
   */
  #slotCount(): number {
    return this.workers === 0 ? 1 : this.workers * this.prefetch + 1;
  }

  /** The batches of one epoch, as dataset indices. */
  #plan(epoch: number): Int32Array[] {
    this.sampler.setEpoch?.(epoch);
    const order = Int32Array.from(this.sampler);
    const batches: Int32Array[] = [];
    for (let start = 0; start < order.length; start += this.batchSize) {
      const batch = order.subarray(start, Math.min(order.length, start + this.batchSize));
      if (batch.length < this.batchSize && this.dropLast) break;
      batches.push(batch);
    }
    return batches;
  }

  async *#run(epoch: number, first: number): AsyncGenerator<Batch, void, undefined> {
    if (this.#active) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        "DataLoader runs one epoch at a time: finish or break out of the previous epoch's loop (or call return() on its iterator) before starting another",
      );
    }
    this.#active = true;
    const run = ++this.#runCounter;
    this.signal?.throwIfAborted();
    const state: RunState = { current: undefined, failed: false };
    try {
      const plan = this.#plan(epoch);
      if (plan.length <= first) return;
      if (this.#stage) {
        yield* this.workers === 0
          ? this.#runDeviceInline(this.#stage, state, run, epoch, plan, first)
          : this.#runDevice(this.#stage, state, run, epoch, plan, first);
        return;
      }
      const layout = this.#ensureLayout();
      if (this.workers === 0) {
        this.#filler ??= new BatchFiller(this.dataset, this.transform, this.deferFlip, layout);
        for (let k = first; k < plan.length; k++) {
          this.#checkOpen();
          const job = this.#job(run, 0, k, plan[k]!, epoch);
          try {
            await this.#filler.fill(job);
          } catch (error) {
            state.failed = true;
            throw this.#sampleError(error);
          }
          state.current = { valid: true };
          yield this.#batch(layout, 0, plan[k]!, epoch, k, state.current);
          state.current.valid = false;
        }
        return;
      }
      const feed = this.#feed(run, epoch, plan, first);
      for (let k = first; k < plan.length; k++) {
        const { slot } = await this.#arrival(feed, k, state);
        state.current = { valid: true };
        yield this.#batch(layout, slot, plan[k]!, epoch, k, state.current);
        state.current.valid = false;
        feed.release(slot);
      }
    } finally {
      if (state.current) state.current.valid = false;
      this.#abortRun = undefined;
      await this.#endEpoch(state.failed);
      this.#active = false;
    }
  }

  /** Throws when the loader was closed or aborted during an epoch without workers. */
  #checkOpen(): void {
    if (this.#closed) throw new ResnetError('ERR_RC_DISPOSED', 'The DataLoader was closed while an epoch was running');
    this.signal?.throwIfAborted();
  }

  /** Waits for batch k's job; a failure marks the run failed. */
  async #arrival(feed: Feed, k: number, state: RunState): Promise<JobResult> {
    try {
      return await feed.done[k]!.promise;
    } catch (error) {
      state.failed = true;
      throw error;
    }
  }

  /**
   * Starts (or reuses) the workers and posts the epoch's jobs from batch `first`, one per free
   * slot, at most `prefetch` per worker; results arrive in `done` (and `arrived`, for looking
   * without waiting), and `release` hands a slot back for the next job.
   */
  #feed(run: number, epoch: number, plan: Int32Array[], first: number): Feed {
    const pool = (this.#pool ??= new WorkerPool(this.workers, {
      tag: WORKER_TAG,
      dataset: this.dataset.spec(),
      work: this.#stage
        ? { kind: 'files' }
        : {
            kind: 'pixels',
            transform: this.transform.spec(),
            deferFlip: this.deferFlip,
            layout: this.#ensureLayout(),
          },
    }));
    pool.setRef(true);
    const done = plan.map(() => deferred<JobResult>());
    const arrived: (JobResult | undefined)[] = [];
    let failure: Error | undefined;
    const fail = (error: Error): void => {
      failure ??= error;
      for (const d of done) d.reject(error);
    };
    this.#abortRun = fail;
    pool.listen((reply) => {
      if (reply.type === 'ready' || reply.type === 'sharp' || reply.type === 'fatal' || reply.run !== run) return;
      const k = reply.batchIndexInEpoch;
      if (reply.type === 'done') {
        const result: JobResult = { slot: reply.slot, ...(reply.files ? { files: reply.files } : {}) };
        arrived[k] = result;
        done[k]!.resolve(result);
      } else {
        done[k]!.reject(new DataLoaderError(reply.error, 'DataLoader failed to load a sample'));
      }
    }, fail);
    const free: number[] = [];
    for (let s = this.#slotCount() - 1; s >= 0; s--) free.push(s);
    let next = first;
    const dispatch = (): void => {
      // A slot is free once its batch was consumed; a worker takes at most `prefetch` jobs.
      while (next < plan.length && free.length > 0 && failure === undefined) {
        const id = pool.leastBusy();
        if (pool.outstanding(id) >= this.prefetch) break;
        const slot = free.pop();
        if (slot === undefined) break; // not reached: the loop runs while a slot is free
        pool.post(id, this.#job(run, slot, next, plan[next]!, epoch));
        next++;
      }
    };
    dispatch();
    return {
      done,
      arrived,
      release: (slot) => {
        free.push(slot);
        dispatch();
      },
    };
  }

  /**
   * An epoch of `decode: 'gpu'` with workers reading the files. When batch k is asked for, its
   * decode (enqueued earlier if its files had arrived) is joined to the device's stream, and batch
   * k + 1's decode is enqueued if its files are here, so that it runs while the step on batch k
   * does; its writes wait for the device work already enqueued, the step on batch k - 1, whose
   * buffer it reuses. A failure of that early decode is thrown when batch k + 1 is asked for.
   */
  async *#runDevice(
    stage: DeviceDecodeStage,
    state: RunState,
    run: number,
    epoch: number,
    plan: Int32Array[],
    first: number,
  ): AsyncGenerator<Batch, void, undefined> {
    const feed = this.#feed(run, epoch, plan, first);
    let ahead: { k: number; decoded?: GpuDecodedBatch; error?: Error } | undefined;
    const decode = (k: number, result: JobResult): GpuDecodedBatch => {
      try {
        return stage.decode(defined(result.files, "a batch's files"), plan[k]!, epoch);
      } finally {
        feed.release(result.slot); // the files are staged by the decoder: their slot is free
      }
    };
    for (let k = first; k < plan.length; k++) {
      const result = await this.#arrival(feed, k, state);
      let decoded: GpuDecodedBatch;
      try {
        if (ahead?.k === k) {
          if (ahead.error !== undefined) throw ahead.error;
          decoded = defined(ahead.decoded, 'the decoded batch');
        } else {
          decoded = decode(k, result);
        }
      } catch (error) {
        state.failed = true;
        throw this.#sampleError(error);
      }
      ahead = undefined;
      stage.join();
      const nextFiles = feed.arrived[k + 1];
      if (nextFiles) {
        try {
          ahead = { k: k + 1, decoded: decode(k + 1, nextFiles) };
        } catch (error) {
          ahead = { k: k + 1, error: error instanceof Error ? error : new Error(String(error)) };
        }
      }
      state.current = { valid: true };
      const labels = defined(result.files, "a batch's files").labels;
      yield this.#deviceBatch(stage, decoded, labels, plan[k]!, epoch, k, state.current);
      state.current.valid = false;
    }
  }

  /** An epoch of `decode: 'gpu'` without workers: each batch's files read when it is asked for. */
  async *#runDeviceInline(
    stage: DeviceDecodeStage,
    state: RunState,
    run: number,
    epoch: number,
    plan: Int32Array[],
    first: number,
  ): AsyncGenerator<Batch, void, undefined> {
    this.#reader ??= new BatchReader(this.dataset);
    for (let k = first; k < plan.length; k++) {
      this.#checkOpen();
      let decoded: GpuDecodedBatch;
      let files: EncodedBatch;
      try {
        files = await this.#reader.read(Array.from(plan[k]!));
        decoded = stage.decode(files, plan[k]!, epoch);
      } catch (error) {
        state.failed = true;
        throw this.#sampleError(error);
      }
      stage.join();
      state.current = { valid: true };
      yield this.#deviceBatch(stage, decoded, files.labels, plan[k]!, epoch, k, state.current);
      state.current.valid = false;
    }
  }

  /** After an epoch (finished, abandoned or failed): drain or stop the workers. */
  async #endEpoch(failed: boolean): Promise<void> {
    const pool = this.#pool;
    if (!pool) return;
    if (!this.persistentWorkers || failed || this.#closed) {
      this.#pool = undefined;
      await pool.terminate();
      return;
    }
    // Persistent workers keep the slots: wait for jobs of an abandoned epoch to finish writing
    // before the next epoch hands their slots out again.
    // A persistent pool whose worker dies (while draining or idle) is retired; the next epoch
    // starts a new one.
    const retire = (): void => {
      if (this.#pool === pool) this.#pool = undefined;
      void pool.terminate();
    };
    if (pool.totalOutstanding > 0) {
      await new Promise<void>((resolve) => {
        const check = (): void => {
          if (pool.totalOutstanding === 0) resolve();
        };
        pool.listen(check, () => {
          retire();
          resolve();
        });
        check();
      });
    }
    pool.listen(ignore, retire);
    pool.setRef(false);
  }

  #job(run: number, slot: number, k: number, indices: Int32Array, epoch: number): Job {
    return {
      run,
      slot,
      batchIndexInEpoch: k,
      items: Array.from(indices, (index, position) => ({ index, position })),
      epoch,
      seed: this.seed,
    };
  }

  #sampleError(error: unknown): Error {
    if (error instanceof SampleFailure || error instanceof ReadFailure) {
      return new DataLoaderError(failureInfo(error), 'DataLoader failed to load a sample');
    }
    return error instanceof Error ? error : new Error(String(error));
  }

  #batch(
    layout: SlotLayout,
    slot: number,
    indices: Int32Array,
    epoch: number,
    index: number,
    current: { valid: boolean },
  ): Batch {
    const [h, w, c] = layout.sampleShape;
    const size = indices.length;
    const sampleBytes = h * w * c;
    const images = new Uint8Array(layout.images, slot * this.batchSize * sampleBytes, size * sampleBytes);
    // Labels and flips are copied out of shared memory (a few bytes per sample): the addon, and so
    // the loss and InputNormalize, read host arrays through N-API calls that refuse shared memory.
    const labels = new Int32Array(layout.labels, slot * this.batchSize * 4, size).slice();
    const flips = new Uint8Array(layout.flips, slot * this.batchSize, size).slice();
    const shape = Object.freeze([size, h, w, c] as const);
    const batch: Batch = {
      images,
      labels,
      flips,
      size,
      shape,
      indices: Int32Array.from(indices),
      epoch,
      index,
      decoded: 'cpu',
      toTensors: (device?: string) => {
        if (!current.valid) {
          throw new ResnetError(
            'ERR_RC_DISPOSED',
            `Batch ${index} of epoch ${epoch} is no longer current: its slot is being refilled; call toTensors() before moving to the next batch`,
          );
        }
        return this.#toTensors(batch, device ?? this.device);
      },
    };
    return batch;
  }

  /**
   * A batch of `decode: 'gpu'`: `images` read back from the device when first asked for,
   * `toTensors` the decoded tensor itself and the labels copied to the device.
   */
  #deviceBatch(
    stage: DeviceDecodeStage,
    decoded: GpuDecodedBatch,
    labels: Int32Array,
    indices: Int32Array,
    epoch: number,
    index: number,
    current: { valid: boolean },
  ): Batch {
    const [size, h, w, c] = decoded.images.shape as [number, number, number, number];
    const stale = (what: string): never => {
      throw new ResnetError(
        'ERR_RC_DISPOSED',
        `Batch ${index} of epoch ${epoch} is no longer current: its device buffer is being decoded into again; ` +
          `${what} before moving to the next batch`,
      );
    };
    let host: Uint8Array | undefined;
    return {
      get images(): Uint8Array {
        if (!current.valid && host === undefined) stale('read images');
        return (host ??= decoded.images.toArray() as Uint8Array);
      },
      labels,
      flips: decoded.flips,
      size,
      shape: Object.freeze([size, h, w, c] as const),
      indices: Int32Array.from(indices),
      epoch,
      index,
      decoded: 'gpu',
      toTensors: (device?: string) => {
        if (!current.valid) stale('call toTensors()');
        const target = device === undefined ? stage.device : parseDevice(device);
        if (target !== stage.device) wrongDevice(target, stage.device);
        return { images: decoded.images, labels: stage.labels(labels) };
      },
    };
  }

  #toTensors(batch: Batch, device: string): { images: Tensor; labels: Tensor } {
    const key = `${device}|${batch.shape.join('x')}`;
    let pair = this.#tensors.get(key);
    if (!pair) {
      pair = {
        images: Tensor.empty(batch.shape, { dtype: 'u8', device }),
        labels: Tensor.empty([batch.size], { dtype: 'i32', device }),
      };
      this.#tensors.set(key, pair);
    }
    copyToDevice(pair.labels.raw, batch.labels);
    if (this.#directCopy !== false) {
      try {
        copyToDevice(pair.images.raw, batch.images);
        this.#directCopy = true;
        return pair;
      } catch (error) {
        if (this.#directCopy === true) throw error;
        this.#directCopy = false;
      }
    }
    // The addon reads host arrays through their ArrayBuffer, which N-API refuses for a
    // SharedArrayBuffer: stage the pixels through ordinary memory (one extra host copy per batch).
    this.#staging ??= new Uint8Array(defined(this.#layout, 'the slot layout').images.byteLength / this.#slotCount());
    const images = this.#staging.subarray(0, batch.images.length);
    images.set(batch.images);
    copyToDevice(pair.images.raw, images);
    return pair;
  }
}

/**
 * A shared batch buffer of `bytes`; when the memory cannot be had, an out-of-memory error that says
 * how much `what` needs and what to try, instead of V8's bare "Array buffer allocation failed".
 */
function sharedBuffer(bytes: number, what: string): SharedArrayBuffer {
  try {
    return new SharedArrayBuffer(bytes);
  } catch (error) {
    if (!(error instanceof RangeError)) throw error;
    const gib = (bytes / 2 ** 30).toFixed(2);
    throw new ResnetError(
      'ERR_RC_OUT_OF_MEMORY',
      `The DataLoader could not allocate ${gib} GiB for ${what} (${error.message}): ` +
        'try a smaller batchSize, fewer workers or a smaller prefetch',
    );
  }
}
