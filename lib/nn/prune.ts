/**
 * Pruning. Global unstructured magnitude pruning (the role of PyTorch's
 * `torch.nn.utils.prune.global_unstructured` with `L1Unstructured`): a 0/1 mask over the
 * convolution and linear weights, kept on the device and multiplied into the parameter arena in one
 * native call, with Zhu & Gupta's gradual sparsity schedule. And structured channel pruning, which
 * builds a smaller dense ResNet with fewer channels in each block's inner convolutions.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { ResnetError, expectInt, expectNumber, expectOneOf, expectOptions, invalid, isArray } from '../errors.js';
import { Tensor } from '../tensor.js';
import { Residual } from './containers.js';
import { BatchNorm2d, Conv2d, Linear, MaxPool2d } from './layers.js';
import type { Module, StateDict, StateEntry } from './module.js';
import type { Parameter, ParameterArena } from './parameter.js';
import { ResNet } from './resnet.js';

/** Options of {@link MagnitudePruner}. */
export interface MagnitudePrunerOptions {
  /** Parameter names to leave dense (e.g. `['conv1.weight', 'fc.weight']`); default none. */
  exclude?: readonly string[];
}

/**
 * Global unstructured magnitude pruning over every Conv2d and Linear weight of a model (biases
 * and BatchNorm parameters stay dense, as usual): {@link prune} zeroes the weights of smallest
 * magnitude across all of them together, and {@link apply} multiplies the mask into the weights on
 * the device (one native `mul` over the parameter arena, no host round trip), which a training
 * loop calls after every optimizer step so that pruned weights stay exactly zero whatever the
 * optimizer does (momentum, weight decay, Adam's moments). The mask only grows: a weight once
 * pruned stays pruned.
 */
export class MagnitudePruner {
  /** The pruned tensors, by parameter name. */
  readonly targets: readonly (readonly [string, Parameter])[];
  readonly #model: Module;
  #arena: ParameterArena;
  /** 1 where a value is kept, 0 where pruned; the arena's size (1 outside the targets). */
  #mask: Tensor;
  #pruned = 0;
  #disposed = false;

  constructor(model: Module, options: MagnitudePrunerOptions = {}) {
    const o = expectOptions<MagnitudePrunerOptions>('MagnitudePruner options', options, ['exclude']);
    const exclude = o.exclude ?? [];
    if (!isArray(exclude) || exclude.some((e) => typeof e !== 'string')) {
      invalid('exclude', 'an array of parameter names', exclude);
    }
    const weights = new Set<Parameter>();
    for (const [, m] of model.namedModules()) if (m instanceof Conv2d || m instanceof Linear) weights.add(m.weight);
    const named = model.namedParameters();
    const names = new Set(named.map(([n]) => n));
    const unknown = exclude.filter((e) => !names.has(e));
    if (unknown.length > 0) invalid('exclude', "names of the model's parameters (such as 'fc.weight')", unknown);
    this.targets = Object.freeze(named.filter(([n, p]) => weights.has(p) && !exclude.includes(n)));
    if (this.targets.length === 0) invalid('model', 'a model with Conv2d or Linear weights to prune', model);
    this.#model = model;
    this.#arena = model.arena();
    this.#mask = Tensor.from(new Float32Array(this.#arena.size).fill(1), [this.#arena.size], {
      device: this.#arena.device,
    });
  }

  /** The number of values the mask covers (the targets' elements). */
  get size(): number {
    return this.targets.reduce((n, [, p]) => n + p.numel, 0);
  }

  /** The fraction of the targets' values the mask prunes. */
  get sparsity(): number {
    return this.#pruned / this.size;
  }

  /**
   * Prunes to a global `sparsity` (a fraction of all target values, from 0 to 1): exactly
   * `round(sparsity * size)` values end up masked, those of smallest magnitude, ties broken by
   * position, values already masked first. Reads the weights once to the host; applies the mask.
   * A sparsity below the current one keeps the current mask.
   */
  prune(sparsity: number): void {
    this.#checkAlive();
    const target = expectNumber('sparsity', sparsity, 0, 1);
    this.#follow();
    const total = this.size;
    const k = Math.round(target * total);
    if (k <= this.#pruned) {
      this.apply();
      return;
    }
    const params = this.#arena.params.toFloat32Array();
    const mask = this.#mask.toFloat32Array();
    // Scores: |w|, and -1 for values masked already, so that they are chosen first.
    const scores = new Float32Array(total);
    let at = 0;
    for (const [, p] of this.targets) {
      for (let i = 0; i < p.numel; i++) {
        const j = p.offset + i;
        scores[at++] = mask[j] === 0 ? -1 : Math.abs(params[j]!);
      }
    }
    const threshold = scores.slice().sort()[k - 1]!;
    // Below the threshold all go; at it, by position until k are masked.
    let below = 0;
    for (const s of scores) if (s < threshold) below++;
    let ties = k - below;
    at = 0;
    for (const [, p] of this.targets) {
      for (let i = 0; i < p.numel; i++) {
        const s = scores[at++]!;
        if (s < threshold || (s === threshold && ties-- > 0)) mask[p.offset + i] = 0;
      }
    }
    this.#mask.raw.copyFromHost(mask);
    this.#pruned = k;
    this.apply();
  }

  /**
   * Multiplies the mask into the weights on the device (one native call over the parameter
   * arena). Call it after every optimizer step; the {@link PruningCallback} does.
   */
  apply(): void {
    this.#checkAlive();
    this.#follow();
    addon().mul({ a: this.#arena.params.raw, b: this.#mask.raw, out: this.#arena.params.raw });
  }

  /**
   * Takes the mask from the weights' zero pattern (every target value that is exactly zero is
   * masked), which is how a mask comes back from a checkpoint or a pruned weights file: pruned
   * weights are stored as zeros, so the pattern holds the mask.
   */
  maskFromZeros(): void {
    this.#checkAlive();
    this.#follow();
    const params = this.#arena.params.toFloat32Array();
    const mask = new Float32Array(this.#arena.size).fill(1);
    let pruned = 0;
    for (const [, p] of this.targets) {
      for (let i = 0; i < p.numel; i++) {
        if (params[p.offset + i] === 0) {
          mask[p.offset + i] = 0;
          pruned++;
        }
      }
    }
    this.#mask.raw.copyFromHost(mask);
    this.#pruned = pruned;
  }

  /** The masks by parameter name (1 kept, 0 pruned), in the parameters' internal layout. */
  masks(): Map<string, Uint8Array> {
    this.#checkAlive();
    const mask = this.#mask.toFloat32Array();
    return new Map(
      this.targets.map(([name, p]) => [name, Uint8Array.from(mask.subarray(p.offset, p.offset + p.numel))] as const),
    );
  }

  /** Frees the mask on the device. */
  dispose(): void {
    if (this.#disposed) return;
    this.#mask.dispose();
    this.#disposed = true;
  }

  /** `using pruner = new MagnitudePruner(model)` frees the mask at the end of the block. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  #checkAlive(): void {
    if (this.#disposed) throw new ResnetError('ERR_RC_DISPOSED', 'This MagnitudePruner was disposed');
  }

  /** Moves the mask along when the model was moved to another device (a new arena of the same layout). */
  #follow(): void {
    const arena = this.#model.arena();
    if (arena === this.#arena) return;
    if (arena.size !== this.#arena.size) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', "The model's parameters changed since the pruner was made");
    }
    const moved = Tensor.from(this.#mask.toFloat32Array(), [arena.size], { device: arena.device });
    this.#mask.dispose();
    this.#mask = moved;
    this.#arena = arena;
  }
}

/** A gradual sparsity schedule (Zhu & Gupta 2017, "To prune, or not to prune", arXiv:1710.01878). */
export interface SparsitySchedule {
  /** The sparsity reached at `endStep` and kept afterwards (s_f), from 0 to 1. */
  finalSparsity: number;
  /** The sparsity of the first pruning step (s_i); default 0. */
  initialSparsity?: number;
  /** The optimizer step of the first pruning (t0); default 0. */
  startStep?: number;
  /** The step at which `finalSparsity` is reached (t0 + n·Δt); default `startStep`: prune at once. */
  endStep?: number;
  /** Steps between mask updates (Δt); default 100 (the mask is applied after every step regardless). */
  frequency?: number;
}

/** A checked {@link SparsitySchedule} with its defaults filled in. */
export type ResolvedSparsitySchedule = Required<SparsitySchedule>;

/** Checks a {@link SparsitySchedule}, naming the bad field. */
export function resolveSparsitySchedule(schedule: SparsitySchedule): ResolvedSparsitySchedule {
  const o = expectOptions<SparsitySchedule>('sparsity schedule', schedule, [
    'finalSparsity',
    'initialSparsity',
    'startStep',
    'endStep',
    'frequency',
  ]);
  const finalSparsity = expectNumber('finalSparsity', o.finalSparsity, 0, 1);
  const initialSparsity = expectNumber('initialSparsity', o.initialSparsity ?? 0, 0, finalSparsity);
  const startStep = expectInt('startStep', o.startStep ?? 0, 0);
  const endStep = expectInt('endStep', o.endStep ?? startStep, startStep);
  const frequency = expectInt('frequency', o.frequency ?? 100, 1);
  return { finalSparsity, initialSparsity, startStep, endStep, frequency };
}

/**
 * Zhu & Gupta's cubic schedule: the target sparsity after optimizer step `step`,
 * `s_t = s_f + (s_i − s_f)·(1 − (t − t0)/(n·Δt))³` between `startStep` (t0) and `endStep`
 * (t0 + n·Δt), 0 before and `finalSparsity` after. Mask updates happen at t0, t0 + Δt, … (see
 * {@link isPruningStep}); this is the target at any step.
 */
export function gradualSparsity(step: number, schedule: SparsitySchedule): number {
  const s = resolveSparsitySchedule(schedule);
  const t = expectInt('step', step, 0);
  if (t < s.startStep) return 0;
  if (t >= s.endStep) return s.finalSparsity;
  const progress = (t - s.startStep) / (s.endStep - s.startStep);
  return s.finalSparsity + (s.initialSparsity - s.finalSparsity) * (1 - progress) ** 3;
}

/** Whether the mask is recomputed after optimizer step `step`: at t0, every Δt up to the end, and at the end. */
export function isPruningStep(step: number, schedule: SparsitySchedule): boolean {
  const s = resolveSparsitySchedule(schedule);
  if (step < s.startStep || step > s.endStep) return false;
  return step === s.endStep || (step - s.startStep) % s.frequency === 0;
}

/** Options of {@link PruningCallback}: a schedule, and the pruner's options. */
export interface PruningCallbackOptions extends SparsitySchedule, MagnitudePrunerOptions {}

/**
 * A Trainer callback that prunes a model gradually while it trains: at the schedule's steps it
 * recomputes the global magnitude mask ({@link gradualSparsity}), and after every optimizer step it
 * multiplies the mask into the weights on the device. The mask is not a checkpoint tensor: it is
 * the weights' zero pattern, which the checkpoint holds, and a resumed run takes it back from
 * there ({@link MagnitudePruner.maskFromZeros}). The Trainer's moving average of the weights (EMA)
 * is updated before the mask is applied, so its pruned values are small but not zero.
 */
export class PruningCallback {
  /** The checked schedule. */
  readonly schedule: ResolvedSparsitySchedule;
  readonly #model: Module;
  readonly #exclude: readonly string[];
  #pruner: MagnitudePruner | null = null;

  constructor(model: Module, options: PruningCallbackOptions) {
    const o = expectOptions<PruningCallbackOptions>('PruningCallback options', options, [
      'finalSparsity',
      'initialSparsity',
      'startStep',
      'endStep',
      'frequency',
      'exclude',
    ]);
    const { exclude, ...schedule } = o;
    this.schedule = resolveSparsitySchedule(schedule as SparsitySchedule);
    this.#model = model;
    this.#exclude = exclude ?? [];
  }

  /** The pruner, once training has begun. */
  get pruner(): MagnitudePruner | null {
    return this.#pruner;
  }

  /** Makes the pruner; a resumed run takes its mask from the weights' zeros. */
  onFitBegin(_trainer: unknown, info: { step: number }): void {
    this.#pruner ??= new MagnitudePruner(this.#model, { exclude: this.#exclude });
    if (info.step > 0) this.#pruner.maskFromZeros();
  }

  /**
   * Updates the mask at the schedule's steps, and applies it after every step. Past the end the
   * final sparsity is held (a run that starts past it, fine-tuning pruned weights, prunes at once;
   * otherwise this only applies the mask).
   */
  onStepEnd(_trainer: unknown, info: { step: number }): void {
    const pruner = (this.#pruner ??= new MagnitudePruner(this.#model, { exclude: this.#exclude }));
    if (isPruningStep(info.step, this.schedule) || info.step > this.schedule.endStep) {
      pruner.prune(gradualSparsity(info.step, this.schedule));
    } else if (pruner.sparsity > 0) {
      pruner.apply();
    }
  }

  /** Frees the mask. */
  onFitEnd(): void {
    this.#pruner?.dispose();
    this.#pruner = null;
  }
}

/** The fraction of exactly-zero values among a model's Conv2d and Linear weights (what pruning leaves). */
export function weightSparsity(model: Module): number {
  let zeros = 0;
  let total = 0;
  for (const [, m] of model.namedModules()) {
    if (!(m instanceof Conv2d || m instanceof Linear)) continue;
    const values = m.weight.values();
    for (const v of values) if (v === 0) zeros++;
    total += values.length;
  }
  return total === 0 ? 0 : zeros / total;
}

/** How {@link pruneChannels} ranks a convolution's output channels. */
export type ChannelCriterion = 'l1' | 'bn-scale';

/** Options of {@link pruneChannels}. */
export interface ChannelPruningOptions {
  /** The fraction of each inner convolution's output channels to remove, from 0 (none) to below 1. */
  amount: number;
  /**
   * `'l1'` (default): keep the filters of largest L1 norm (Li et al. 2017, arXiv:1608.08710);
   * `'bn-scale'`: keep the channels of largest |γ| in the following BatchNorm (network slimming,
   * Liu et al. 2017, arXiv:1708.06519).
   */
  criterion?: ChannelCriterion;
}

/** The submodule at `path` of `parent`, checked to be a `type`. */
function layerOf<T extends Module>(parent: Module, path: string, type: abstract new (...args: never[]) => T): T {
  const m = parent.getSubmodule(path);
  if (!(m instanceof type)) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `pruneChannels: '${path}' is a ${m.constructor.name}, not a ${type.name}`,
    );
  }
  return m;
}

/** The output channels of `conv` (followed by `bn`) to keep, ascending. */
function keptChannels(conv: Conv2d, bn: BatchNorm2d, keep: number, criterion: ChannelCriterion): number[] {
  const k = conv.outChannels;
  const scores = new Float64Array(k);
  if (criterion === 'l1') {
    const w = conv.weight.values(); // [out, kh, kw, in]: each filter is contiguous
    const per = w.length / k;
    for (let o = 0; o < k; o++) for (let i = 0; i < per; i++) scores[o]! += Math.abs(w[o * per + i]!);
  } else {
    const gamma = bn.weight.values();
    for (let o = 0; o < k; o++) scores[o] = Math.abs(gamma[o]!);
  }
  const order = Array.from({ length: k }, (_, i) => i).sort((a, b) => scores[b]! - scores[a]! || a - b);
  return order.slice(0, keep).sort((a, b) => a - b);
}

/** Takes the rows (`rows`, axis 0) and columns (`cols`, axis 1) of a state-dict tensor. */
function select(entry: StateEntry, rows: readonly number[] | null, cols: readonly number[] | null): StateEntry {
  const data = entry.data as Float32Array;
  const [d0, d1 = 1, ...rest] = entry.shape as [number, ...number[]];
  const inner = rest.reduce((a, b) => a * b, 1);
  const r = rows ?? Array.from({ length: d0 }, (_, i) => i);
  const c = cols ?? Array.from({ length: entry.shape.length > 1 ? d1 : 1 }, (_, i) => i);
  const out = new Float32Array(r.length * c.length * inner);
  let at = 0;
  for (const i of r) {
    for (const j of c) {
      const from = (i * (entry.shape.length > 1 ? d1 : 1) + j) * inner;
      out.set(data.subarray(from, from + inner), at);
      at += inner;
    }
  }
  const shape = [r.length, ...(entry.shape.length > 1 ? [c.length, ...rest] : [])];
  return { shape, dtype: 'f32', data: out };
}

/**
 * Structured channel pruning of a ResNet: removes `amount` of the output channels of each block's
 * inner convolutions (`conv1` and `conv2` of a Bottleneck, `conv1` of a BasicBlock), ranked by
 * `criterion`, and returns a new, smaller dense ResNet (its {@link ResNet.blockWidths} record the
 * widths, so it saves, loads, trains and exports like any other) on the same device and in the
 * same training mode. The kept channels' weights are copied: the pruned convolution's filters, the
 * BatchNorm's γ, β and running statistics, and the next convolution's input slices. Block outputs
 * keep their widths, so shortcuts, the stem and the classifier are copied whole. The original
 * model is left as it was. Fine-tune afterwards to recover accuracy.
 */
export function pruneChannels(model: ResNet, options: ChannelPruningOptions): ResNet {
  if (!(model instanceof ResNet)) invalid('model', 'a ResNet', model);
  const o = expectOptions<ChannelPruningOptions>('pruneChannels options', options, ['amount', 'criterion']);
  const amount = expectNumber('amount', o.amount, 0, 1);
  if (amount >= 1) invalid('amount', 'a fraction below 1 (some channels must remain)', amount);
  const criterion = expectOneOf('criterion', o.criterion ?? 'l1', ['l1', 'bn-scale'] as const);

  const state = model.stateDict();
  const replaced = new Map<string, StateEntry>();
  const widths: number[][] = [];
  const take = (key: string, rows: readonly number[] | null, cols: readonly number[] | null): void => {
    const entry = state.get(key);
    if (!entry) throw new ResnetError('ERR_RC_STATE_DICT', `pruneChannels: the model has no '${key}'`);
    replaced.set(key, select(entry, rows, cols));
  };
  const takeBn = (prefix: string, kept: readonly number[]): void => {
    for (const name of ['weight', 'bias', 'running_mean', 'running_var']) take(`${prefix}.${name}`, kept, null);
  };
  for (const [name, block] of model.namedModules()) {
    if (!(block instanceof Residual)) continue;
    const bottleneck = block.children().some(([n]) => n === 'conv3');
    const inner = bottleneck ? ['1', '2'] : ['1'];
    const kept = inner.map((i) => {
      const conv = layerOf(block, `conv${i}`, Conv2d);
      const keep = Math.max(1, Math.round(conv.outChannels * (1 - amount)));
      return keptChannels(conv, layerOf(block, `bn${i}`, BatchNorm2d), keep, criterion);
    });
    widths.push(kept.map((k) => k.length));
    let previous: number[] | null = null;
    kept.forEach((k, index) => {
      take(`${name}.conv${index + 1}.weight`, k, previous);
      takeBn(`${name}.bn${index + 1}`, k);
      previous = k;
    });
    take(`${name}.conv${inner.length + 1}.weight`, null, previous);
  }
  const stem = layerOf(model, 'conv1', Conv2d);
  const pruned = new ResNet(model.depth, {
    numClasses: model.numClasses,
    smallInput: !model.children().some(([, m]) => m instanceof MaxPool2d),
    inChannels: stem.inChannels,
    blockWidths: widths,
    device: model.device ?? 'cpu',
    seed: 0,
  });
  const next: StateDict = new Map([...state].map(([key, entry]) => [key, replaced.get(key) ?? entry]));
  pruned.loadStateDict(next);
  pruned.train(model.training);
  return pruned;
}
