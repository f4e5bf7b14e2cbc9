/**
 * Modules with explicit backward. A module owns its outputs and gradients, sized on the first call
 * for an input shape and reused at every step; containers derive their backward from their
 * children's.
 * @packageDocumentation
 */
import '../dispose.js';
import { parseDevice } from '../device.js';
import { ResnetError, defined, expectBool, invalid, mismatch } from '../errors.js';
import { Tensor, type DType } from '../tensor.js';
import { GradientPool, activeGradientPool, inGradientPass } from './gradient-pool.js';
import { Parameter, ParameterArena } from './parameter.js';

/** One entry of a state dict: a tensor in torchvision's layout, on the host. */
export interface StateEntry {
  /** torchvision's shape (conv weights `[out, in, kh, kw]`). */
  shape: number[];
  /** `f32` for parameters and statistics, `i64` for counters such as `num_batches_tracked`. */
  dtype: 'f32' | 'i64';
  /** Row-major values. */
  data: Float32Array | BigInt64Array;
}

/** A model's parameters and buffers by torchvision name, e.g. `layer1.0.conv1.weight`. */
export type StateDict = Map<string, StateEntry>;

/** A persistent non-learnable tensor of a module (BN running statistics), in the state dict. */
export interface BufferSlot {
  /** Current value on the device, or null before placement. */
  tensor: Tensor | null;
  /** Initial or host-side value. */
  initial: Float32Array;
}

/** Converts OHWI (internal) to OIHW (torchvision). */
export function ohwiToOihw(src: Float32Array, shape: readonly number[]): Float32Array {
  const [k, r, s, c] = shape as [number, number, number, number];
  const out = new Float32Array(src.length);
  for (let o = 0; o < k; o++) {
    for (let y = 0; y < r; y++) {
      for (let x = 0; x < s; x++) {
        for (let i = 0; i < c; i++) out[((o * c + i) * r + y) * s + x] = src[((o * r + y) * s + x) * c + i]!;
      }
    }
  }
  return out;
}

/** Converts OIHW (torchvision) to OHWI (internal). */
export function oihwToOhwi(src: Float32Array, shape: readonly number[]): Float32Array {
  const [k, r, s, c] = shape as [number, number, number, number];
  const out = new Float32Array(src.length);
  for (let o = 0; o < k; o++) {
    for (let y = 0; y < r; y++) {
      for (let x = 0; x < s; x++) {
        for (let i = 0; i < c; i++) out[((o * r + y) * s + x) * c + i] = src[((o * c + i) * r + y) * s + x]!;
      }
    }
  }
  return out;
}

/**
 * Where a module's activation buffers (outputs, saved statistics, input gradients) come from when
 * they are not the module's own tensors: gradient checkpointing hands the modules of a segment
 * views of one pool shared with the other segments (see `lib/nn/checkpoint.ts`).
 */
export interface BufferSource {
  /** An uninitialised tensor of `shape` and `dtype` on `device`, valid until the source is reset. */
  empty(shape: readonly number[], dtype: DType, device: string): Tensor;
}

/** What {@link Module.registerPostBackwardHook} runs: receives the module whose backward finished. */
export type PostBackwardHook = (module: Module) => void;

/** The handle of a registered hook. */
export interface RemovableHook {
  /** Unregisters the hook; calling it again does nothing. */
  remove(): void;
}

/** Base class of all layers and containers. */
export abstract class Module {
  /** Training mode (batch statistics in BN) or evaluation mode. */
  training = true;
  /**
   * Whether `backward` must compute the gradient of the input. A model's first layer sets this to
   * false (an image needs no gradient), and then its `backward` returns null.
   */
  requiresInputGrad = true;
  /**
   * Where {@link activationBuffer} takes memory from: null (the default) for tensors of the
   * module's own; set by gradient checkpointing for the modules of a checkpointed segment.
   * @internal
   */
  bufferSource: BufferSource | null = null;
  readonly #children = new Map<string, Module>();
  readonly #params = new Map<string, Parameter>();
  readonly #buffers = new Map<string, BufferSlot>();
  #counters = new Map<string, bigint>();
  #device: string | null = null;
  /** 'idle' before any forward, 'forwarded' until the backward of that forward, then 'backwarded'. */
  #pass: 'idle' | 'forwarded' | 'backwarded' = 'idle';
  /** The hooks run after this module's backward; null (one check per backward) when there are none. */
  #postBackwardHooks: PostBackwardHook[] | null = null;
  /** The input-gradient memory of the backward passes this module is the root of (gradient-pool.ts). */
  #gradientPool: GradientPool | null = null;
  #disposed = false;

  /** Computes the output for `x`; the result is owned by the module and reused next call. */
  abstract forward(x: Tensor): Tensor;

  /**
   * Given the gradient of the loss with respect to the last output, accumulates parameter
   * gradients and returns the gradient with respect to the last input (null when
   * `requiresInputGrad` is false).
   */
  abstract backward(gradOutput: Tensor): Tensor | null;

  /** The device the module's parameters live on, or null before placement. */
  get device(): string | null {
    return this.#device;
  }

  /**
   * A per-shape activation buffer (an output, a saved statistic, an input gradient): a tensor of
   * the module's own, or a view from its {@link bufferSource}. Layers allocate every such buffer
   * through this, once per input shape.
   * @internal
   */
  activationBuffer(shape: readonly number[], dtype: DType, device: string): Tensor {
    return this.bufferSource ? this.bufferSource.empty(shape, dtype, device) : Tensor.empty(shape, { dtype, device });
  }

  /**
   * The buffer an input gradient (or another gradient that lives only until the module before
   * this one has read it) is written to in the running backward: one from the pass's
   * {@link GradientPool}, or, for the modules of a checkpointed segment (which take every buffer
   * from their {@link bufferSource}), `held` or a new {@link activationBuffer} to keep.
   * @internal
   */
  gradientBuffer(held: Tensor | null, shape: readonly number[], dtype: DType, device: string): Tensor {
    const pool = activeGradientPool();
    if (pool === null || this.bufferSource) return held ?? this.activationBuffer(shape, dtype, device);
    return pool.acquire(shape, dtype, device);
  }

  /**
   * Bytes held by the input-gradient pool of the backward passes this module was the root of
   * (the module whose `backward` was called from outside any other backward).
   * @internal
   */
  get gradientPoolBytes(): number {
    return this.#gradientPool?.bytes() ?? 0;
  }

  /** Registers a child module under `name` (its parameters are named `name.*`). */
  protected registerModule<M extends Module>(name: string, module: M): M {
    this.#children.set(name, module);
    return module;
  }

  /** Registers a parameter under `name`. */
  protected registerParameter(name: string, p: Parameter): Parameter {
    this.#params.set(name, p);
    return p;
  }

  /** Registers a persistent f32 buffer (in the state dict, not optimised). */
  protected registerBuffer(name: string, initial: Float32Array): BufferSlot {
    const slot: BufferSlot = { tensor: null, initial };
    this.#buffers.set(name, slot);
    return slot;
  }

  /** Registers an integer counter kept on the host (e.g. `num_batches_tracked`). */
  protected registerCounter(name: string): void {
    this.#counters.set(name, 0n);
  }

  /** Adds `by` to a counter. */
  protected bumpCounter(name: string, by = 1n): void {
    this.#counters.set(name, (this.#counters.get(name) ?? 0n) + by);
  }

  /**
   * The host counters of this subtree (`num_batches_tracked`), one entry per counter, in
   * {@link Module.namedModules} order. Kept to replay host bookkeeping, not for state dicts.
   */
  counterValues(): bigint[] {
    const out: bigint[] = [];
    for (const [, m] of this.namedModules()) out.push(...m.#counters.values());
    return out;
  }

  /**
   * Adds `deltas[i]` times `times` to the i-th counter of {@link Module.counterValues}: the
   * bookkeeping of forward passes that ran on the device without the host (a replayed CUDA graph).
   */
  addToCounters(deltas: readonly bigint[], times: bigint): void {
    let i = 0;
    for (const [, m] of this.namedModules()) {
      for (const [name, value] of m.#counters) {
        const delta = deltas[i++];
        if (delta === undefined) {
          throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'addToCounters: fewer deltas than counters');
        }
        m.#counters.set(name, value + delta * times);
      }
    }
    if (i !== deltas.length) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `addToCounters: ${deltas.length} deltas for ${i} counters`);
    }
  }

  /** Direct children, in registration order. */
  children(): [string, Module][] {
    return [...this.#children];
  }

  /** All parameters with their dotted names, depth first in registration order. */
  namedParameters(prefix = ''): [string, Parameter][] {
    const out: [string, Parameter][] = [];
    for (const [name, p] of this.#params) out.push([prefix + name, p]);
    for (const [name, child] of this.#children) out.push(...child.namedParameters(`${prefix}${name}.`));
    return out;
  }

  /** All parameters. */
  parameters(): Parameter[] {
    return this.namedParameters().map(([, p]) => p);
  }

  /**
   * The module at a dotted path below this one (`'layer1'`, `'layer4.2.conv3'`), as PyTorch's
   * `get_submodule`; `''` is this module. Throws `ERR_RC_INVALID_ARGUMENT` naming the children
   * that exist where the path goes wrong.
   */
  getSubmodule(path: string): Module {
    if (typeof path !== 'string') invalid('path', "a dotted module path such as 'layer1.0'", path);
    return this.#submodule(path === '' ? [] : path.split('.'), '');
  }

  /** `getSubmodule`'s walk: the module at `parts` below this one, which is at `walked`. */
  #submodule(parts: readonly string[], walked: string): Module {
    const [part, ...rest] = parts;
    if (part === undefined) return this;
    const child = this.#children.get(part);
    if (!child) {
      const names = [...this.#children.keys()];
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `No submodule '${part}' in ${walked === '' ? 'the model' : `'${walked}'`}; ${names.length > 0 ? `its children are ${names.join(', ')}` : 'it has no children'}`,
      );
    }
    return child.#submodule(rest, walked === '' ? part : `${walked}.${part}`);
  }

  /**
   * Sets `requiresGrad` on every parameter of this subtree, as `requires_grad_(flag)` over a
   * submodule does in PyTorch: frozen parameters get no gradient in `backward` and keep their
   * values through optimizer steps (the optimizers and gradient clipping skip them).
   */
  setRequiresGrad(flag: boolean): this {
    expectBool('flag', flag);
    for (const p of this.parameters()) p.requiresGrad = flag;
    return this;
  }

  /**
   * The persistent f32 buffers of this subtree (BatchNorm2d's `running_mean` and `running_var`)
   * with their dotted torchvision names, depth first in registration order, as the device tensors
   * themselves (writing to one changes the module). Integer counters such as
   * `num_batches_tracked` are kept on the host and are not listed.
   *
   * Buffers exist on a device only once the module is placed (`to(device)` or a first forward):
   * before that this throws `ERR_RC_INVALID_ARGUMENT` rather than return tensors that do not exist.
   */
  namedBuffers(prefix = ''): [string, Tensor][] {
    this.assertUsable('namedBuffers');
    const out: [string, Tensor][] = [];
    for (const [name, slot] of this.#buffers) {
      if (!slot.tensor) {
        throw new ResnetError(
          'ERR_RC_INVALID_ARGUMENT',
          `The buffer '${prefix}${name}' of ${this.constructor.name} is not on a device yet; call module.to(device) or run forward once first`,
        );
      }
      out.push([prefix + name, slot.tensor]);
    }
    for (const [name, child] of this.#children) out.push(...child.namedBuffers(`${prefix}${name}.`));
    return out;
  }

  /** The number of learnable values. */
  numParameters(): number {
    return this.parameters().reduce((n, p) => n + p.numel, 0);
  }

  /** All modules of the tree with dotted names (the root is ''). */
  namedModules(prefix = ''): [string, Module][] {
    const out: [string, Module][] = [[prefix.replace(/\.$/, ''), this]];
    for (const [name, child] of this.#children) out.push(...child.namedModules(`${prefix}${name}.`));
    return out;
  }

  /** Sets training mode on the whole tree. */
  train(mode = true): this {
    for (const [, m] of this.namedModules()) m.training = mode;
    return this;
  }

  /** Sets evaluation mode on the whole tree. */
  eval(): this {
    return this.train(false);
  }

  /**
   * Places the whole tree on `device`: one parameter arena for all parameters (values and
   * gradients), and the buffers beside it. Gradients start at zero.
   */
  to(device: string): this {
    this.assertUsable('to');
    const canonical = parseDevice(device);
    const params = this.parameters();
    const arena = params[0]?.arena;
    const alreadyThere =
      arena?.device === canonical && params.length === arena.entries.length && params.every((p) => p.arena === arena);
    if (!alreadyThere) new ParameterArena(params, canonical);
    for (const [, m] of this.namedModules()) m.#placeBuffers(canonical);
    return this;
  }

  /** The arena holding this module's parameters (materialising it on first use). */
  arena(): ParameterArena {
    this.assertUsable('arena');
    const params = this.parameters();
    if (params.length === 0) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `${this.constructor.name} has no parameters`);
    }
    const arena = params[0]!.arena;
    if (!arena || !params.every((p) => p.arena === arena)) this.to(arena?.device ?? 'cpu');
    return defined(params[0]!.arena, `the parameter arena of ${this.constructor.name}`);
  }

  /** Sets the gradients of all parameters to zero. */
  zeroGrad(): void {
    this.assertUsable('zeroGrad');
    const params = this.parameters();
    const arena = params[0]?.arena;
    if (arena?.entries.length === params.length && params.every((p) => p.arena === arena)) {
      arena.zeroGrad();
      return;
    }
    for (const p of params) if (p.arena) p.grad.raw.copyFromHost(new Float32Array(p.numel));
  }

  /** Parameters and buffers by torchvision name, on the host, in torchvision's layouts. */
  stateDict(): StateDict {
    this.assertUsable('stateDict');
    const out: StateDict = new Map();
    for (const [prefix, m] of this.namedModules()) {
      const dot = prefix ? `${prefix}.` : '';
      for (const [name, p] of m.#params) {
        const values = p.values();
        out.set(dot + name, {
          shape: p.stateShape,
          dtype: 'f32',
          data: p.layout === 'ohwi' ? ohwiToOihw(values, p.shape) : values,
        });
      }
      for (const [name, slot] of m.#buffers) {
        const data = slot.tensor ? slot.tensor.toFloat32Array() : slot.initial.slice();
        out.set(dot + name, { shape: [data.length], dtype: 'f32', data });
      }
      for (const [name, value] of m.#counters) {
        out.set(dot + name, { shape: [], dtype: 'i64', data: BigInt64Array.of(value) });
      }
    }
    return out;
  }

  /**
   * Loads a state dict (torchvision names and layouts). With `strict` (the default) every key
   * must be present and no unknown key may appear; shapes must match exactly. Nothing is changed
   * unless the whole dict is valid.
   */
  loadStateDict(state: StateDict, options: { strict?: boolean } = {}): void {
    this.assertUsable('loadStateDict');
    if (!(state instanceof Map)) {
      throw new ResnetError('ERR_RC_STATE_DICT', 'loadStateDict expects a Map of name -> { shape, dtype, data }');
    }
    const strict = options.strict ?? true;
    const targets = new Map<string, { shape: number[]; apply: (e: StateEntry) => void }>();
    for (const [prefix, m] of this.namedModules()) {
      const dot = prefix ? `${prefix}.` : '';
      for (const [name, p] of m.#params) {
        targets.set(dot + name, {
          shape: p.stateShape,
          apply: (e) =>
            p.setValues(
              p.layout === 'ohwi'
                ? oihwToOhwi(e.data as Float32Array, p.shape)
                : Float32Array.from(e.data as Float32Array),
            ),
        });
      }
      for (const [name, slot] of m.#buffers) {
        targets.set(dot + name, {
          shape: [slot.initial.length],
          apply: (e) => {
            const values = Float32Array.from(e.data as Float32Array);
            if (slot.tensor) slot.tensor.raw.copyFromHost(values);
            else slot.initial = values;
          },
        });
      }
      for (const name of m.#counters.keys()) {
        targets.set(dot + name, {
          shape: [],
          apply: (e) => m.#counters.set(name, (e.data as BigInt64Array)[0] ?? 0n),
        });
      }
    }
    const problems: string[] = [];
    for (const [key, target] of targets) {
      const entry = state.get(key);
      if (!entry) {
        if (strict) problems.push(`missing key '${key}'`);
        continue;
      }
      const shapeOk = entry.shape.length === target.shape.length && entry.shape.every((d, i) => d === target.shape[i]);
      const count = target.shape.reduce((a, b) => a * b, 1);
      if (!shapeOk || entry.data?.length !== count) {
        problems.push(
          `'${key}' has shape [${entry.shape.join(', ')}] (${entry.data?.length ?? 0} values) but the model expects [${target.shape.join(', ')}]`,
        );
      }
      const isCounter = target.shape.length === 0;
      if (isCounter ? !(entry.data instanceof BigInt64Array) : !(entry.data instanceof Float32Array)) {
        problems.push(`'${key}' must hold a ${isCounter ? 'BigInt64Array' : 'Float32Array'}`);
      }
    }
    if (strict) for (const key of state.keys()) if (!targets.has(key)) problems.push(`unexpected key '${key}'`);
    if (problems.length) {
      throw new ResnetError(
        'ERR_RC_STATE_DICT',
        `Cannot load the state dict into ${this.constructor.name}: ${problems.slice(0, 10).join('; ')}${problems.length > 10 ? `; and ${problems.length - 10} more` : ''}`,
      );
    }
    for (const [key, target] of targets) {
      const entry = state.get(key);
      if (entry) target.apply(entry);
    }
  }

  /** Checks the input of a layer and places the module on the input's device on first use. */
  protected prepare(x: Tensor, name: string): void {
    this.assertUsable('forward');
    if (!(x instanceof Tensor)) mismatch(`${name} input`, 'a Tensor', typeof x);
    if (x.disposed) throw new ResnetError('ERR_RC_DISPOSED', `The input of ${name} was disposed and cannot be used`);
    if (this.#device === null) {
      const params = this.parameters();
      if (params.some((p) => p.arena === null)) this.to(x.device);
      else this.#placeBuffers(x.device);
    }
    if (x.device !== this.#device) {
      mismatch(
        `${name} input`,
        `a tensor on ${this.#device} (the module's device; move the module with module.to())`,
        `a tensor on ${x.device}`,
      );
    }
    this.#pass = 'forwarded';
  }

  /**
   * Runs a backward body once per forward, as PyTorch frees its graph after one backward:
   * parameter gradients accumulate across forward/backward pairs (until `zeroGrad`), but a second
   * backward of the same forward would add the same gradients again, so it is refused with
   * `ERR_RC_INVALID_ARGUMENT` (as is a backward before any forward). When `body` throws (a bad
   * gradOutput, say), the forward stays available for a corrected call.
   */
  protected backwardOnce<T>(name: string, body: () => T): T {
    this.assertUsable('backward');
    if (this.#pass === 'idle') {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `${name}.backward() was called before forward()`);
    }
    if (this.#pass === 'backwarded') {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `${name}.backward() was called twice for one forward(); run forward() again first (gradients accumulate over forward/backward pairs until zeroGrad())`,
      );
    }
    this.#pass = 'backwarded';
    return inGradientPass(
      () => (this.#gradientPool ??= new GradientPool()),
      () => this.#backwardThenHooks(body),
    );
  }

  /** Runs a backward body, then the post-backward hooks; a throwing body leaves the forward usable. */
  #backwardThenHooks<T>(body: () => T): T {
    let result: T;
    try {
      result = body();
    } catch (error) {
      this.#pass = 'forwarded';
      throw error;
    }
    const hooks = this.#postBackwardHooks;
    if (hooks) for (const hook of hooks) hook(this);
    return result;
  }

  /**
   * Runs `hook` each time this module's backward has finished, when the gradients of its own
   * parameters are final for that backward pass (PyTorch's post-accumulate-grad hooks, per module):
   * DistributedDataParallel starts reducing a gradient bucket from here. Hooks run in registration
   * order; an error thrown by one propagates out of `backward`. Returns the handle that removes it.
   */
  registerPostBackwardHook(hook: PostBackwardHook): RemovableHook {
    if (typeof hook !== 'function') invalid('hook', 'a function (module) => void', hook);
    const hooks = (this.#postBackwardHooks ??= []);
    hooks.push(hook);
    return {
      remove: () => {
        const list = this.#postBackwardHooks;
        const at = list ? list.indexOf(hook) : -1;
        if (!list || at < 0) return;
        list.splice(at, 1);
        if (list.length === 0) this.#postBackwardHooks = null;
      },
    };
  }

  /** Whether {@link dispose} was called. */
  get disposed(): boolean {
    return this.#disposed;
  }

  /**
   * Frees at once, without waiting for the garbage collector, everything this module and its
   * children hold on their device: the parameter arena (values and gradients), the buffers (BN
   * running statistics), and every cached plan and activation. Afterwards any use of the module
   * (forward, backward, to, stateDict...) throws `ERR_RC_DISPOSED`; calling `dispose` again does
   * nothing. An arena shared with modules outside this subtree (a child of a placed model) is freed
   * by the model that owns it, not by the child: dispose the whole model.
   */
  dispose(): void {
    if (this.#disposed) return;
    const modules = this.namedModules().map(([, m]) => m);
    const params = new Set(this.parameters());
    const arenas = new Set<ParameterArena>();
    for (const p of params) if (p.arena) arenas.add(p.arena);
    for (const m of modules) {
      m.disposeCache();
      m.#disposeGradientPool();
      for (const slot of m.#buffers.values()) {
        slot.tensor?.dispose();
        slot.tensor = null;
      }
      m.#disposed = true;
    }
    for (const arena of arenas) if (arena.entries.every((p) => params.has(p))) arena.dispose();
  }

  /** `using model = ResNet18(...)` disposes the model at the end of the block. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  /** Throws `ERR_RC_DISPOSED` once the module was disposed. */
  protected assertUsable(what: string): void {
    if (this.#disposed) {
      throw new ResnetError(
        'ERR_RC_DISPOSED',
        `${this.constructor.name}.${what}(): the module was disposed and cannot be used`,
      );
    }
  }

  /** Frees every buffer and cached plan of this tree (parameters stay). */
  releaseBuffers(): void {
    for (const [, m] of this.namedModules()) {
      m.disposeCache();
      m.#disposeGradientPool();
    }
  }

  #disposeGradientPool(): void {
    this.#gradientPool?.dispose();
    this.#gradientPool = null;
  }

  /** Frees cached per-shape state; overridden by layers that keep some. */
  protected disposeCache(): void {
    // This module caches nothing.
  }

  #placeBuffers(device: string): void {
    this.#device = device;
    for (const slot of this.#buffers.values()) {
      const values = slot.tensor ? slot.tensor.toFloat32Array() : slot.initial;
      if (slot.tensor?.device === device) continue;
      slot.tensor?.dispose();
      slot.tensor = Tensor.from(values, [values.length], { device });
    }
    this.disposeCache();
  }
}

/** A per-input-shape cache of plans and buffers, disposing the least recently used past `limit`. */
export class ShapeCache<T extends { dispose(): void }> {
  readonly #entries = new Map<string, T>();
  constructor(private readonly limit = 4) {}

  /**
   * The entry for `x`'s shape, dtype and device, created with `make` when missing: an entry holds
   * tensors on the device it was made for, so inputs on another device get their own.
   */
  get(x: Tensor, make: () => T): T {
    const key = `${x.shape.join(',')}|${x.dtype}|${x.device}`;
    let entry = this.#entries.get(key);
    if (entry) {
      this.#entries.delete(key);
    } else {
      entry = make();
      if (this.#entries.size >= this.limit) {
        // Map iteration follows insertion order, and a hit is re-inserted: the first is the oldest.
        const first = this.#entries.entries().next();
        if (!first.done) {
          const [oldestKey, oldest] = first.value;
          oldest.dispose();
          this.#entries.delete(oldestKey);
        }
      }
    }
    this.#entries.set(key, entry);
    return entry;
  }

  /** Disposes all entries. */
  clear(): void {
    for (const e of this.#entries.values()) e.dispose();
    this.#entries.clear();
  }
}

/** Disposes every Tensor-like field of an object (used by cache entries). */
export function disposeAll(...items: ({ dispose(): void } | null | undefined)[]): void {
  for (const item of items) item?.dispose();
}

/** A floating dtype check shared by layers. */
export const FLOAT_DTYPES: readonly DType[] = ['f32', 'bf16', 'f16'];
