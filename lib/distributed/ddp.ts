/**
 * DistributedDataParallel: one model replica per process, the gradients averaged over the ranks in
 * buckets whose all-reduce starts during backward, as soon as each bucket's gradients are final.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { ResnetError, expectBool, expectNumber, expectOneOf, expectOptions, invalid } from '../errors.js';
import { Module, type RemovableHook } from '../nn/module.js';
import type { Parameter, ParameterArena } from '../nn/parameter.js';
import { Tensor } from '../tensor.js';
import { planBuckets, type GradientBucket } from './buckets.js';
import type { ProcessGroup } from './types.js';

/** How gradients travel between ranks: as they are (f32), or cast to bf16 and back. */
export type GradientCompression = 'none' | 'bf16';

/** Options of {@link DistributedDataParallel} (PyTorch's names in camelCase). */
export interface DistributedDataParallelOptions {
  /** Size of a gradient bucket in MiB (PyTorch's `bucket_cap_mb`); default 25. */
  bucketCapMb?: number;
  /**
   * `'bf16'` halves the bytes sent: each bucket is cast to bf16 into a staging buffer of its own,
   * all-reduced in bf16 and cast back into the f32 gradients (PyTorch's `bf16_compress_hook`);
   * default `'none'`.
   */
  gradientCompression?: GradientCompression;
  /**
   * Broadcast the buffers (BatchNorm running statistics) from rank 0 before every training
   * {@link DistributedDataParallel.forward}, as PyTorch's `broadcast_buffers`; default true. They
   * are broadcast at construction either way.
   */
  broadcastBuffers?: boolean;
}

/** A bucket's state during one backward pass. */
interface BucketState {
  readonly bucket: GradientBucket;
  /** The bucket's range of the gradient arena. */
  readonly grads: Tensor;
  /** The bf16 copy that travels instead, with compression. */
  readonly staging: Tensor | null;
  /** Parameters of the bucket still to get their final gradient in this pass. */
  pending: number;
  /** Whether the bucket holds a parameter that requires a gradient (else it is never reduced). */
  trainable: boolean;
  /** Whether its all-reduce has been enqueued in this pass. */
  launched: boolean;
}

/**
 * Data-parallel training across the ranks of a {@link ProcessGroup}, in the shape of PyTorch's
 * `DistributedDataParallel`: every rank holds the whole model and trains on its own share of each
 * batch; after backward every rank holds the gradients averaged over all ranks, so that identical
 * optimizer steps keep the replicas identical.
 *
 * ```ts
 * const group = initProcessGroup({ backend: 'gloo' });
 * const model = ResNet50({ device: group.device, seed: 1 });
 * const ddp = new DistributedDataParallel(model, group);
 * // every step:
 * loss.forward(ddp.forward(x), labels);
 * ddp.backward(loss.backward());   // bucket all-reduces start during backward
 * ddp.finishGradientSync();        // before unscale / clip / step
 * optimizer.step();
 * optimizer.zeroGrad();
 * ```
 *
 * At construction rank 0's parameters (the whole arena in one broadcast) and buffers are broadcast
 * to every rank. The gradient arena is split into buckets (see {@link planBuckets}), in reverse
 * arena order, the order in which backward produces them. A hook after each module's backward
 * marks that module's parameters final; when a bucket has all of its parameters final (parameters
 * with `requiresGrad` false are not waited for) its all-reduce (`avg`) is enqueued on the group,
 * which runs it on its own thread (Gloo) or stream (NCCL) while backward goes on. Buckets are
 * enqueued in bucket order on every rank, as the collectives of all ranks must match.
 * {@link DistributedDataParallel.finishGradientSync} enqueues the buckets still waiting (those of
 * parameters that took no part in this backward), then makes later device work wait for the
 * all-reduces: no host synchronisation on a GPU.
 *
 * Gradient accumulation: micro-steps run inside {@link DistributedDataParallel.noSync} (or with
 * {@link DistributedDataParallel.syncGradients} false) launch nothing and accumulate locally; the
 * next synced backward reduces the accumulated sum. A synced backward must be followed by
 * `finishGradientSync()` before the next forward or backward, since the reduction may still be
 * writing the gradients; a second synced backward before it is refused.
 *
 * Mixed precision: every rank unscales and checks the averaged gradients after
 * `finishGradientSync()` (the Trainer averages before it unscales and clips). An inf or NaN on one
 * rank survives the average (inf/NaN plus anything is inf or NaN), so every rank's GradScaler finds
 * it and skips the same step, with no extra reduction of the found-inf flag.
 */
export class DistributedDataParallel {
  /** The wrapped model (PyTorch's `ddp.module`). */
  readonly module: Module;
  /** The group the gradients are averaged over. */
  readonly group: ProcessGroup;
  /** The gradient buckets, in launch order. */
  readonly buckets: readonly GradientBucket[];
  /** The compression of the all-reduced gradients. */
  readonly gradientCompression: GradientCompression;
  /** Whether training forwards broadcast the buffers from rank 0 first. */
  readonly broadcastBuffers: boolean;
  /**
   * Whether backward launches the all-reduces; false accumulates gradients locally (PyTorch's
   * `require_backward_grad_sync`). {@link DistributedDataParallel.noSync} sets it for a body.
   */
  syncGradients = true;
  readonly #arena: ParameterArena;
  readonly #states: BucketState[];
  readonly #bucketOf = new Map<Parameter, BucketState>();
  readonly #hooks: RemovableHook[] = [];
  /** Parameters marked final in the current pass. */
  readonly #ready = new Set<Parameter>();
  /** Whether a synced backward has begun since the last finishGradientSync. */
  #passActive = false;
  /** The next bucket to enqueue, in bucket order. */
  #next = 0;
  #bytesLastSync = 0;
  #disposed = false;

  /**
   * @param model - a model placed on `group.device` (its parameter arena exists: `model.to(device)`
   *   or a first forward).
   * @param group - the ranks to train with.
   */
  constructor(model: Module, group: ProcessGroup, options: DistributedDataParallelOptions = {}) {
    if (!(model instanceof Module)) invalid('model', 'a Module', model);
    if (
      group === null ||
      typeof group !== 'object' ||
      typeof group.allReduce !== 'function' ||
      typeof group.broadcast !== 'function' ||
      typeof group.wait !== 'function'
    ) {
      invalid('group', 'a ProcessGroup (from initProcessGroup)', group);
    }
    const o = expectOptions<DistributedDataParallelOptions>('DistributedDataParallel options', options, [
      'bucketCapMb',
      'gradientCompression',
      'broadcastBuffers',
    ]);
    const capMb = expectNumber('bucketCapMb', o.bucketCapMb ?? 25, 0);
    if (!(capMb > 0)) invalid('bucketCapMb', 'a positive number of MiB', o.bucketCapMb);
    this.gradientCompression = expectOneOf('gradientCompression', o.gradientCompression ?? 'none', ['none', 'bf16']);
    this.broadcastBuffers = expectBool('broadcastBuffers', o.broadcastBuffers ?? true);
    this.module = model;
    this.group = group;
    this.#arena = materialisedArena(model, group.device);

    group.broadcast(this.#arena.params, 0);
    this.#broadcastBufferTensors();
    group.wait();

    this.buckets = Object.freeze(planBuckets(this.#arena, capMb * 1024 * 1024));
    this.#states = this.buckets.map((bucket) => {
      const grads = this.#arena.grads.view(bucket.offset, [bucket.length]);
      const staging =
        this.gradientCompression === 'bf16'
          ? Tensor.empty([bucket.length], { dtype: 'bf16', device: this.#arena.device })
          : null;
      const state: BucketState = { bucket, grads, staging, pending: 0, trainable: false, launched: false };
      for (const p of bucket.parameters) this.#bucketOf.set(p, state);
      return state;
    });
    for (const [, m] of model.namedModules()) {
      const own = m
        .namedParameters()
        .filter(([name]) => !name.includes('.'))
        .map(([, p]) => p);
      if (own.length > 0) this.#hooks.push(m.registerPostBackwardHook(() => this.#onBackward(own)));
    }
  }

  /**
   * The model's forward. In training mode with `broadcastBuffers`, rank 0's buffers are broadcast
   * first. Refused while the last synced backward's reduction has not been finished.
   */
  forward(x: Tensor): Tensor {
    this.#assertUsable('forward');
    this.#assertNoPendingSync('forward');
    if (this.broadcastBuffers && this.module.training && this.group.worldSize > 1) {
      this.#broadcastBufferTensors();
      this.group.wait();
    }
    return this.module.forward(x);
  }

  /** The model's backward; with {@link syncGradients}, enqueues each bucket's all-reduce as it is ready. */
  backward(gradOutput: Tensor): Tensor | null {
    this.#assertUsable('backward');
    return this.module.backward(gradOutput);
  }

  /**
   * Completes the gradient averaging of the last backward: enqueues the buckets not yet launched
   * (parameters that got no gradient in it, or every bucket when no synced backward ran since the
   * last call, e.g. after a backward called on the module directly with hooks that found nothing
   * to do), makes later device work wait for the all-reduces ({@link ProcessGroup.wait}), and with
   * bf16 compression casts the averaged values back into the gradient arena. Call it before
   * unscaling, clipping and the optimizer step. Errors of the group (a lost rank, a timeout)
   * propagate; the pass is reset either way.
   */
  finishGradientSync(): void {
    this.#assertUsable('finishGradientSync');
    if (!this.syncGradients) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'DistributedDataParallel.finishGradientSync() was called inside noSync() (syncGradients is false); the synced backward of the last micro-step reduces the accumulated gradients',
      );
    }
    try {
      if (!this.#passActive) this.#beginPass();
      while (this.#next < this.#states.length) this.#launch(this.#states[this.#next++]!);
      this.group.wait();
      this.#bytesLastSync = 0;
      for (const state of this.#states) {
        if (!state.launched) continue;
        this.#bytesLastSync += state.bucket.length * (state.staging ? 2 : 4);
        if (state.staging) addon().cast({ src: state.staging.raw, dst: state.grads.raw });
      }
    } finally {
      this.#passActive = false;
      this.#ready.clear();
    }
  }

  /**
   * Runs `body` (micro-steps of gradient accumulation) with gradient synchronisation off, as
   * PyTorch's `no_sync()`: its backwards accumulate gradients locally; the next synced backward
   * reduces the sum. A promise returned by `body` keeps synchronisation off until it settles.
   */
  noSync<T>(body: () => T): T {
    this.#assertUsable('noSync');
    if (typeof body !== 'function') invalid('body', 'a function', body);
    const before = this.syncGradients;
    this.syncGradients = false;
    let result: T;
    try {
      result = body();
    } catch (error) {
      this.syncGradients = before;
      throw error;
    }
    if (result instanceof Promise) {
      return result.finally(() => {
        this.syncGradients = before;
      }) as T;
    }
    this.syncGradients = before;
    return result;
  }

  /** Broadcasts rank 0's buffers (BatchNorm running statistics) to every rank now. */
  syncBuffers(): void {
    this.#assertUsable('syncBuffers');
    this.#broadcastBufferTensors();
    this.group.wait();
  }

  /** Bytes all-reduced by the last {@link finishGradientSync} (bf16 buckets count 2 bytes an element). */
  get bytesLastSync(): number {
    return this.#bytesLastSync;
  }

  /** Removes the backward hooks and frees the staging buffers; the model stays usable alone. */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    for (const hook of this.#hooks) hook.remove();
    for (const state of this.#states) {
      state.staging?.dispose();
      state.grads.dispose();
    }
  }

  /** `using ddp = new DistributedDataParallel(...)` disposes it at the end of the block. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  // A module's backward finished: its own parameters' gradients are final for this pass.
  #onBackward(params: readonly Parameter[]): void {
    if (!this.syncGradients || this.#disposed) return;
    if (!this.#passActive) this.#beginPass();
    for (const p of params) {
      if (!p.requiresGrad) continue;
      if (this.#ready.has(p)) {
        throw new ResnetError(
          'ERR_RC_INVALID_ARGUMENT',
          'DistributedDataParallel: a second synced backward ran before finishGradientSync(); call finishGradientSync() after each synced backward, and run accumulation micro-steps inside noSync()',
        );
      }
      this.#ready.add(p);
      const state = this.#bucketOf.get(p);
      if (state) state.pending--;
    }
    while (this.#next < this.#states.length && this.#states[this.#next]!.pending <= 0) {
      this.#launch(this.#states[this.#next++]!);
    }
  }

  // Resets the buckets for a new backward pass, counting the parameters each one waits for.
  #beginPass(): void {
    for (const state of this.#states) {
      state.pending = 0;
      state.launched = false;
      for (const p of state.bucket.parameters) if (p.requiresGrad) state.pending++;
      state.trainable = state.pending > 0;
    }
    this.#ready.clear();
    this.#next = 0;
    this.#passActive = true;
  }

  // Enqueues a bucket's all-reduce (through its bf16 staging buffer with compression).
  #launch(state: BucketState): void {
    if (!state.trainable) return;
    state.launched = true;
    if (state.staging) {
      addon().cast({ src: state.grads.raw, dst: state.staging.raw });
      this.group.allReduce(state.staging, { op: 'avg' });
    } else {
      this.group.allReduce(state.grads, { op: 'avg' });
    }
  }

  #broadcastBufferTensors(): void {
    for (const [, buffer] of this.module.namedBuffers()) this.group.broadcast(buffer, 0);
  }

  #assertNoPendingSync(what: string): void {
    if (this.#passActive) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `DistributedDataParallel.${what}(): the last synced backward has not been finished; call finishGradientSync() first`,
      );
    }
  }

  #assertUsable(what: string): void {
    if (this.#disposed) {
      throw new ResnetError('ERR_RC_DISPOSED', `DistributedDataParallel.${what}(): it was disposed`);
    }
  }
}

/** The model's parameter arena, which must exist, hold every parameter, and live on `device`. */
function materialisedArena(model: Module, device: string): ParameterArena {
  const params = model.parameters();
  if (params.length === 0) invalid('model', 'a model with parameters', model);
  const arena = params[0]!.arena;
  if (!arena || !params.every((p) => p.arena === arena) || arena.entries.length !== params.length) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `DistributedDataParallel: the model is not materialised (its parameters are not in one arena); call model.to('${device}') first`,
    );
  }
  if (arena.device !== device) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `DistributedDataParallel: the model is on ${arena.device} but the group's device is ${device}; call model.to('${device}') first`,
    );
  }
  return arena;
}
