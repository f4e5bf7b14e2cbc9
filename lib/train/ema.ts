/**
 * An exponential moving average of a model's weights and BatchNorm statistics, as torchvision's
 * reference scripts keep one (`ExponentialMovingAverage`, an `AveragedModel` with
 * `use_buffers=True`): a shadow copy of the parameter arena and of each persistent buffer on the
 * model's device, updated in place after optimizer steps without host synchronisation or
 * allocation.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { ResnetError, expectInt, expectNumber, expectOptions, invalid } from '../errors.js';
import { Module, oihwToOhwi, type StateDict } from '../nn/module.js';
import type { ParameterArena } from '../nn/parameter.js';
import type { Tensor } from '../tensor.js';

/** Options of {@link ModelEma}. */
export interface ModelEmaOptions {
  /**
   * Decay per update, in [0, 1]; default 0.9999. torchvision's reference script derives it from
   * `--model-ema-decay` scaled by world size, batch size and `--model-ema-steps` over the epochs.
   */
  decay?: number;
  /** Update every this many optimizer steps (torchvision's `--model-ema-steps`); default 1. */
  every?: number;
}

/** The counters of a {@link ModelEma}, for checkpoints. */
export interface ModelEmaState {
  /** Averages taken since the last copy (torchvision's `n_averaged`). */
  numAveraged: number;
  /** Calls of `update()`, averaging or not. */
  calls: number;
}

/** A live buffer of the model, its average, and the part of the scratch tensor a swap goes through. */
interface BufferShadow {
  name: string;
  live: Tensor;
  shadow: Tensor;
  scratch: Tensor;
}

/**
 * An exponential moving average of a model's parameters and BN running statistics. After each
 * optimizer step call {@link ModelEma.update}; every `every`-th call averages
 * `ema = decay * ema + (1 - decay) * model` over everything in the model's parameter arena
 * (frozen parameters included, as `AveragedModel` averages all parameters) and every persistent
 * buffer. The first average copies the model instead, as `AveragedModel` does while its
 * `n_averaged` is 0, and {@link ModelEma.reset} makes the next one copy again (torchvision resets
 * it during the learning-rate warm-up).
 *
 * To evaluate or save the averaged model without a second copy of the network,
 * {@link ModelEma.swap} exchanges its weights with the model's; calling it again swaps back.
 *
 * The model must stay on the device it was on when the average was made: moving it makes
 * `update` and `swap` throw. The shadow tensors are the caller's to free with `dispose()`.
 */
export class ModelEma {
  /** Decay per update. */
  readonly decay: number;
  /** Calls of `update()` per average. */
  readonly every: number;
  readonly #model: Module;
  readonly #device: string;
  readonly #arena: ParameterArena;
  readonly #params: Tensor;
  readonly #scratch: Tensor;
  readonly #buffers: BufferShadow[];
  #numAveraged = 0;
  #calls = 0;
  #swapped = false;
  #disposed = false;

  /**
   * Starts the average at the model's current weights and buffers.
   * @param model - a model placed on its device (`model.to(device)`), owning its parameter arena.
   */
  constructor(model: Module, options?: ModelEmaOptions) {
    if (!(model instanceof Module)) invalid('model', 'a Module', model);
    const o = expectOptions<ModelEmaOptions>('ModelEma options', options, ['decay', 'every']);
    this.decay = expectNumber('decay', o.decay ?? 0.9999, 0, 1);
    this.every = expectInt('every', o.every ?? 1, 1);
    const device = model.device;
    if (device === null) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `ModelEma needs a model on a device, but this ${model.constructor.name} has not been placed yet; call model.to(device) first`,
      );
    }
    const params = model.parameters();
    const arena = params[0]?.arena ?? null;
    if (arena?.device !== device || arena.entries.length !== params.length || params.some((p) => p.arena !== arena)) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        params.length === 0
          ? `ModelEma needs a model with parameters; this ${model.constructor.name} has none`
          : `ModelEma needs a model whose parameters fill one arena on ${device}; make it for the root module after model.to(device)`,
      );
    }
    this.#model = model;
    this.#device = device;
    this.#arena = arena;
    this.#params = arena.params.clone();
    this.#scratch = arena.params.clone();
    this.#buffers = model
      .namedBuffers()
      .map(([name, live]) => ({ name, live, shadow: live.clone(), scratch: this.#scratch.view(0, live.shape) }));
  }

  /** Averages taken since the last copy (0 before the first update and after `reset()`). */
  get numAveraged(): number {
    return this.#numAveraged;
  }

  /** Whether the averaged weights are in the model now (after an odd number of `swap()` calls). */
  get swapped(): boolean {
    return this.#swapped;
  }

  /**
   * Call after every optimizer step; averages on every `every`-th call (the `every`-th, the
   * `2 * every`-th, ...). The first average, and the first after `reset()`, copies the weights.
   * Enqueued on the device; nothing waits for it.
   */
  update(): void {
    this.#check('update');
    if (this.#swapped) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'ModelEma.update() was called while the averaged weights are swapped into the model; call swap() again first',
      );
    }
    this.#calls++;
    if (this.#calls % this.every !== 0) return;
    const weight = this.#numAveraged === 0 ? 1 : 1 - this.decay;
    const native = addon();
    native.lerp({ a: this.#params.raw, b: this.#arena.params.raw, weight });
    for (const b of this.#buffers) native.lerp({ a: b.shadow.raw, b: b.live.raw, weight });
    this.#numAveraged++;
  }

  /** Makes the next average copy the weights instead (torchvision resets `n_averaged` during lr warm-up). */
  reset(): void {
    this.#alive('reset');
    this.#numAveraged = 0;
  }

  /**
   * Exchanges the model's weights and buffers with the averaged ones; call again to swap back.
   * Used to evaluate the averaged model without a second copy of the network. Device copies
   * through one preallocated scratch tensor, so two swaps restore every bit.
   */
  swap(): void {
    this.#check('swap');
    exchange(this.#arena.params, this.#params, this.#scratch);
    for (const b of this.#buffers) exchange(b.live, b.shadow, b.scratch);
    this.#swapped = !this.#swapped;
  }

  /**
   * The averaged weights and buffers as a state dict with torchvision names, what `saveWeights`
   * writes for the model; counters such as `num_batches_tracked` are the model's, as they are.
   * Swaps the averages in for the copy and back out (this waits for the device).
   */
  stateDict(): StateDict {
    this.#check('stateDict');
    if (this.#swapped) return this.#model.stateDict();
    this.swap();
    try {
      return this.#model.stateDict();
    } finally {
      this.swap();
    }
  }

  /**
   * Restores averaged weights and buffers (e.g. from a checkpoint's EMA tensors), torchvision
   * names and layouts. Every parameter and buffer must be present with its shape; integer
   * counters (`num_batches_tracked`) may be present and are ignored, anything else is rejected.
   * Everything is checked before anything changes. The counts are not part of it: restore them
   * with {@link ModelEma.loadState}, or the next average, if none was taken yet, copies the model.
   */
  loadStateDict(state: StateDict): void {
    this.#check('loadStateDict');
    if (!(state instanceof Map)) {
      throw new ResnetError(
        'ERR_RC_STATE_DICT',
        'ModelEma.loadStateDict expects a Map of name -> { shape, dtype, data }',
      );
    }
    const problems: string[] = [];
    const known = new Set<string>();
    const take = (name: string, shape: readonly number[]): Float32Array | null => {
      known.add(name);
      const entry = state.get(name);
      if (!entry) {
        problems.push(`missing key '${name}'`);
        return null;
      }
      const count = shape.reduce((a, b) => a * b, 1);
      const shapeOk =
        Array.isArray(entry.shape) &&
        entry.shape.length === shape.length &&
        entry.shape.every((d, i) => d === shape[i]);
      if (!shapeOk || !(entry.data instanceof Float32Array) || entry.data.length !== count) {
        problems.push(`'${name}' must be a Float32Array of shape [${shape.join(', ')}]`);
        return null;
      }
      return entry.data;
    };
    const paramWrites: [number, Float32Array][] = [];
    for (const [name, p] of this.#model.namedParameters()) {
      const data = take(name, p.stateShape);
      if (data) paramWrites.push([p.offset, p.layout === 'ohwi' ? oihwToOhwi(data, p.shape) : data]);
    }
    const bufferWrites: [Tensor, Float32Array][] = [];
    for (const b of this.#buffers) {
      const data = take(b.name, b.live.shape);
      if (data) bufferWrites.push([this.#swapped ? b.live : b.shadow, data]);
    }
    for (const [key, entry] of state) {
      const isCounter = entry?.dtype === 'i64' && Array.isArray(entry.shape) && entry.shape.length === 0;
      if (!known.has(key) && !isCounter) problems.push(`unexpected key '${key}'`);
    }
    if (problems.length) {
      throw new ResnetError(
        'ERR_RC_STATE_DICT',
        `Cannot load the averaged weights of ${this.#model.constructor.name}: ${problems.slice(0, 10).join('; ')}${problems.length > 10 ? `; and ${problems.length - 10} more` : ''}`,
      );
    }
    // The arena is written whole, so that its padding keeps the values it had.
    const target = this.#swapped ? this.#arena.params : this.#params;
    const host = target.toFloat32Array();
    for (const [offset, data] of paramWrites) host.set(data, offset);
    target.raw.copyFromHost(host);
    for (const [tensor, data] of bufferWrites) tensor.raw.copyFromHost(data);
  }

  /** The counters, for a checkpoint (JSON). */
  state(): ModelEmaState {
    this.#alive('state');
    return { numAveraged: this.#numAveraged, calls: this.#calls };
  }

  /** Restores the counters of {@link ModelEma.state}. */
  loadState(state: ModelEmaState): void {
    this.#alive('loadState');
    const o = expectOptions<ModelEmaState>('ModelEma state', state, ['numAveraged', 'calls']);
    const numAveraged = expectInt('ModelEma state.numAveraged', o.numAveraged, 0);
    const calls = expectInt('ModelEma state.calls', o.calls, 0);
    this.#numAveraged = numAveraged;
    this.#calls = calls;
  }

  /**
   * Frees the shadow tensors. If the averages are swapped in, the model's own weights are swapped
   * back first (when the model is still where it was), so the model keeps training weights.
   */
  dispose(): void {
    if (this.#disposed) return;
    if (this.#swapped && !this.#moved()) this.swap();
    this.#disposed = true;
    this.#params.dispose();
    this.#scratch.dispose();
    for (const b of this.#buffers) {
      b.shadow.dispose();
      b.scratch.dispose();
    }
  }

  #moved(): boolean {
    if (this.#model.device !== this.#device || this.#arena.params.disposed) return true;
    for (const b of this.#buffers) if (b.live.disposed) return true;
    return false;
  }

  #alive(op: string): void {
    if (this.#disposed) throw new ResnetError('ERR_RC_DISPOSED', `ModelEma.${op}() was called after dispose()`);
  }

  #check(op: string): void {
    this.#alive(op);
    if (this.#moved()) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `ModelEma.${op}(): the model was moved off ${this.#device} (or its parameters re-placed) after the average was made; make a new ModelEma for it where it is now`,
      );
    }
  }
}

/** Exchanges the contents of `a` and `b` through `via`, all on one device. */
function exchange(a: Tensor, b: Tensor, via: Tensor): void {
  via.raw.copyFrom(a.raw);
  a.raw.copyFrom(b.raw);
  b.raw.copyFrom(via.raw);
}
