/**
 * What every optimizer shares: parameter groups over one model's parameter arena, the segment
 * table the native multi-tensor ops take, per-element state arenas, the step count, and
 * checkpoints of all of it.
 * @packageDocumentation
 */
import { addon, type RawFusedStepEnd } from '../binding.js';
import { ResnetError, expectInt, expectNumber, invalid } from '../errors.js';
import { Module } from '../nn/module.js';
import { Parameter, type ParameterArena } from '../nn/parameter.js';
import { opRecorder } from '../profile/hooks.js';
import '../dispose.js';
import { Tensor } from '../tensor.js';

/** A parameter group as given to an optimizer: its parameters and any settings it overrides. */
export type GroupInput<O extends object> = Partial<O> & { params: Parameter[] };

/** A parameter group with every setting resolved; settings such as `lr` may change between steps. */
export type Group<O extends object> = Required<O> & { params: Parameter[] };

/** What an optimizer's constructor accepts: a module (all its parameters), parameters, or groups. */
export type ParamsInput<O extends object> = Module | Parameter[] | GroupInput<O>[];

/** Options of {@link Optimizer.step}, which {@link GradScaler.step} passes. */
export interface OptimizerStepOptions {
  /**
   * An f32[1] tensor on the arena's device: when it holds a non-zero value the step is skipped on
   * the device, with no host synchronisation (the GradScaler found inf or NaN gradients).
   */
  foundInf?: Tensor;
  /** Gradients are multiplied by this first (an unscale fused into the step); default 1. */
  gradScaleInv?: number;
  /**
   * An i32[1] tensor on the arena's device holding the steps taken, for a step captured in a CUDA
   * graph: the step adds one to it on the device (not when `foundInf` is set) and optimizers whose
   * update depends on t (AdamW's and LAMB's bias corrections) read t from it. The host count still
   * advances by one per call: see {@link Optimizer.setStepCount}.
   */
  stepCount?: Tensor;
  /**
   * Only send the settings (learning rates, the parameter table) to the device and update nothing:
   * a captured step replayed afterwards reads them. The step count does not change.
   */
  tablesOnly?: boolean;
  /**
   * The fused optimizer end of a step ({@link GradScaler.stepAndZeroGrad} and
   * {@link GradScaler.stepOnDeviceAndZeroGrad} pass it when the `optim` fused path is on); only optimizers
   * whose {@link Optimizer.supportsFusedStep} is true take it. With `tablesOnly` it changes
   * nothing: the fused step reads the tables the unfused one sends.
   */
  fused?: FusedStepOptions;
}

/** The GradScaler's scale update, run on the device by a fused step (see {@link FusedStepOptions}). */
export interface FusedScaleUpdate {
  /** f32[1]: the scale. */
  scale: Tensor;
  /** i32[1]: clean steps since the scale last changed. */
  growthTracker: Tensor;
  growthFactor: number;
  backoffFactor: number;
  growthInterval: number;
}

/** What a fused step does besides the update (the `optim` fused path). */
export interface FusedStepOptions {
  /** Set `foundInf` when a gradient is inf or NaN, before any parameter moves (then skip the step). */
  checkFinite: boolean;
  /** Leave the stepped parameters' gradients at zero, the skipped step included. */
  zeroGrads: boolean;
  /** The scale update after the step, reading `foundInf`. */
  scaleUpdate?: FusedScaleUpdate;
  /**
   * Unscale by 1 / `scaleUpdate.scale` as the device holds it when the step starts, instead of
   * `gradScaleInv` (a step captured in a CUDA graph); needs `scaleUpdate` and `checkFinite`.
   */
  scaleFromDevice?: boolean;
}

/** The native fused op's fields of `fused` (see {@link FusedStepOptions}). */
export function rawFusedStepEnd(fused: FusedStepOptions): RawFusedStepEnd {
  const u = fused.scaleUpdate;
  return {
    checkFinite: fused.checkFinite,
    zeroGrads: fused.zeroGrads,
    scaleFromDevice: fused.scaleFromDevice ?? false,
    ...(u
      ? {
          scale: u.scale.raw,
          growthTracker: u.growthTracker.raw,
          growthFactor: u.growthFactor,
          backoffFactor: u.backoffFactor,
          growthInterval: u.growthInterval,
        }
      : {}),
  };
}

/** An optimizer's checkpoint, plain data (typed arrays and numbers). */
export interface OptimizerState {
  /** Steps taken; the next step is `step + 1`. */
  step: number;
  /** Each group's settings, in order (numbers and booleans; `betas` as a pair). */
  paramGroups: Record<string, unknown>[];
  /**
   * Per-element state over the whole arena (one value per arena element, padding included), by
   * name: `momentum` (SGD), `expAvg` and `expAvgSq` (AdamW, LAMB). Absent before it exists.
   */
  buffers: Record<string, Float32Array>;
}

/** What {@link Optimizer.applyStep} receives. */
export interface StepContext<O extends object> {
  arena: ParameterArena;
  /** (offset, count, group) triples of the parameters to update. */
  segments: Int32Array;
  /** The groups' validated settings. */
  groups: Required<O>[];
  /** t of this step: 1 on the first. */
  step: number;
  foundInf: Tensor | undefined;
  gradScaleInv: number;
  /** See {@link OptimizerStepOptions.stepCount}. */
  stepCount: Tensor | undefined;
  /** See {@link OptimizerStepOptions.tablesOnly}. */
  tablesOnly: boolean;
  /** The fused step's extra work, when {@link OptimizerStepOptions.fused} was given. */
  fused?: FusedStepOptions;
}

/**
 * The base of the optimizers: resolves parameter groups, keeps the step count and the state
 * arenas, and calls {@link Optimizer.applyStep} with the segment table of the parameters that
 * require gradients (rebuilt every step, so freezing and unfreezing take effect at once).
 */
export abstract class Optimizer<O extends object> {
  /** The parameter groups; change `lr` (or any setting) here between steps. */
  readonly paramGroups: Group<O>[];
  readonly #name: string;
  /** The profiler's name of the step op (`sgd.step`). */
  readonly #stepOp: string;
  readonly #check: (where: string, group: Partial<O>, defaults: Partial<O>) => Required<O>;
  readonly #buffers = new Map<string, Tensor>();
  #steps = 0;

  /**
   * @param name - the optimizer's name, for messages.
   * @param params - a module (all its parameters), a list of parameters, or a list of groups.
   * @param defaults - settings for groups that do not override them, already validated.
   * @param keys - the settings a group may carry.
   * @param check - validates a group's settings (falling back to `defaults`) and resolves them.
   */
  protected constructor(
    name: string,
    params: ParamsInput<O>,
    defaults: Required<O>,
    keys: readonly string[],
    check: (where: string, group: Partial<O>, defaults: Partial<O>) => Required<O>,
  ) {
    this.#name = name;
    this.#stepOp = `${name.toLowerCase()}.step`;
    this.#check = check;
    let groups: GroupInput<O>[];
    if (params instanceof Module) groups = [{ params: params.parameters() } as GroupInput<O>];
    else if (Array.isArray(params) && params.every((p) => p instanceof Parameter)) {
      groups = [{ params: params } as GroupInput<O>];
    } else if (Array.isArray(params)) groups = params;
    else groups = invalid('params', 'a Module, an array of Parameters or an array of parameter groups', params);
    const seen = new Set<Parameter>();
    this.paramGroups = groups.map((g, i) => {
      const where = `paramGroups[${i}]`;
      if (g === null || typeof g !== 'object' || !Array.isArray(g.params)) {
        invalid(where, 'an object with a params array', g);
      }
      for (const key of Object.keys(g)) {
        if (key !== 'params' && !keys.includes(key)) {
          throw new ResnetError(
            'ERR_RC_INVALID_ARGUMENT',
            `Unknown option '${key}' in ${where}; known options: params, ${keys.join(', ')}`,
          );
        }
      }
      for (const p of g.params) {
        if (!(p instanceof Parameter)) invalid(`${where}.params`, 'an array of Parameters', p);
        if (seen.has(p)) {
          throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `${where}: a parameter appears in more than one group`);
        }
        seen.add(p);
      }
      return { ...check(where, g, defaults), params: [...g.params] };
    });
  }

  /** Steps taken so far (steps skipped by a GradScaler do not count, as in PyTorch). */
  get stepCount(): number {
    return this.#steps;
  }

  /** Applies one update to every parameter that requires a gradient. */
  step(options: OptimizerStepOptions = {}): void {
    const arena = this.arena();
    const foundInf = options.foundInf;
    if (foundInf !== undefined) {
      if (
        !(foundInf instanceof Tensor) ||
        foundInf.dtype !== 'f32' ||
        foundInf.numel !== 1 ||
        foundInf.device !== arena.device
      ) {
        invalid('foundInf', `an f32 tensor of one element on ${arena.device}`, foundInf);
      }
    }
    const stepCount = options.stepCount;
    if (
      stepCount !== undefined &&
      (!(stepCount instanceof Tensor) ||
        stepCount.dtype !== 'i32' ||
        stepCount.numel !== 1 ||
        stepCount.device !== arena.device)
    ) {
      invalid('stepCount', `an i32 tensor of one element on ${arena.device}`, stepCount);
    }
    const tablesOnly = options.tablesOnly ?? false;
    if (typeof tablesOnly !== 'boolean') invalid('tablesOnly', 'a boolean', tablesOnly);
    if ((stepCount !== undefined || tablesOnly) && !this.capturable) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `${this.#name}: stepCount and tablesOnly need an optimizer that supports CUDA graph capture (SGD, AdamW, LAMB)`,
      );
    }
    const gradScaleInv = expectNumber('gradScaleInv', options.gradScaleInv ?? 1);
    const fused = options.fused;
    if (fused !== undefined) this.#checkFused(fused, foundInf, arena.device);
    const groups = this.paramGroups.map((g, i) => this.#check(`paramGroups[${i}]`, g as Partial<O>, g as Partial<O>));
    const context = {
      arena,
      segments: this.segmentTable(),
      groups,
      step: this.#steps + 1,
      foundInf,
      gradScaleInv,
      stepCount,
      tablesOnly,
    };
    if (tablesOnly) {
      this.applyStep(context);
      return;
    }
    const recorder = opRecorder;
    const token = recorder ? recorder.begin(this.#stepOp, 'optimizer', arena.device) : 0;
    this.applyStep(fused ? { ...context, fused } : context);
    recorder?.end(token);
    this.#steps++;
  }

  /**
   * Whether this optimizer's step can be captured in a CUDA graph and replayed: its native op takes
   * {@link OptimizerStepOptions.stepCount} and {@link OptimizerStepOptions.tablesOnly}. False unless
   * a subclass says so (SGD, AdamW and LAMB do).
   */
  get capturable(): boolean {
    return false;
  }

  /**
   * Sets the step count, for steps the host did not count itself: the replays of a captured step,
   * less those skipped on the device (a GradScaler found inf/NaN), as read back from the device.
   */
  setStepCount(steps: number): void {
    this.#steps = expectInt('steps', steps, 0);
  }

  /** Runs the native step; `ctx.step` is t of this step. */
  protected abstract applyStep(ctx: StepContext<O>): void;

  /**
   * Whether {@link OptimizerStepOptions.fused} is taken (an optimizer with a fused kernel: SGD,
   * AdamW and LAMB); false here.
   */
  get supportsFusedStep(): boolean {
    return false;
  }

  /**
   * Whether this optimizer's trainable parameters are the whole arena, so that zeroing the stepped
   * gradients is what {@link Optimizer.zeroGrad} does.
   */
  stepsWholeArena(): boolean {
    const arena = this.arena();
    const all = this.paramGroups.reduce((n, g) => n + g.params.length, 0);
    return all === arena.entries.length && this.paramGroups.every((g) => g.params.every((p) => p.requiresGrad));
  }

  #checkFused(fused: FusedStepOptions, foundInf: Tensor | undefined, device: string): void {
    if (!this.supportsFusedStep) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `${this.#name} has no fused step (options.fused)`);
    }
    if (fused === null || typeof fused !== 'object') invalid('fused', 'a FusedStepOptions object', fused);
    if ((fused.checkFinite || fused.scaleUpdate) && foundInf === undefined) {
      invalid('foundInf', 'the found-inf flag, which fused.checkFinite and fused.scaleUpdate need', foundInf);
    }
    const fromDevice = fused.scaleFromDevice ?? false;
    if (typeof fromDevice !== 'boolean') invalid('fused.scaleFromDevice', 'a boolean', fromDevice);
    if (fromDevice && (!fused.checkFinite || fused.scaleUpdate === undefined)) {
      invalid('fused.scaleFromDevice', 'true only with fused.checkFinite and fused.scaleUpdate', fromDevice);
    }
    const u = fused.scaleUpdate;
    if (u !== undefined) {
      const flag = (name: string, t: unknown, dtype: 'f32' | 'i32') => {
        if (!(t instanceof Tensor) || t.dtype !== dtype || t.numel !== 1 || t.device !== device) {
          invalid(name, `a ${dtype} tensor of one element on ${device}`, t);
        }
      };
      flag('fused.scaleUpdate.scale', u.scale, 'f32');
      flag('fused.scaleUpdate.growthTracker', u.growthTracker, 'i32');
    }
  }

  /** The names of the per-element state arenas this optimizer may keep. */
  protected abstract bufferNames(): readonly string[];

  /** Whether the state arena `name` exists yet. */
  protected hasBuffer(name: string): boolean {
    return this.#buffers.has(name);
  }

  /**
   * The state arena `name`, one f32 per arena element: zeros when new; carried over when the
   * model moved to another device (same arena size); zeros again if the arena's size changed.
   */
  protected buffer(name: string, arena: ParameterArena): Tensor {
    const existing = this.#buffers.get(name);
    if (existing?.device === arena.device && existing.numel === arena.size) return existing;
    let fresh: Tensor;
    if (existing?.numel === arena.size) {
      fresh = Tensor.from(existing.toFloat32Array(), [arena.size], { device: arena.device });
    } else fresh = Tensor.zeros([arena.size], { device: arena.device });
    existing?.dispose();
    this.#buffers.set(name, fresh);
    return fresh;
  }

  /**
   * Records that the last step was skipped on the device (a GradScaler found inf or NaN), so that
   * the step count, and with it Adam's bias corrections and SGD's first-step momentum, stay as in
   * PyTorch, where a skipped step never runs. {@link GradScaler.update} calls it.
   */
  stepSkipped(): void {
    if (this.#steps > 0) this.#steps--;
  }

  /** Sets the gradients of this optimizer's parameters to zero. */
  zeroGrad(): void {
    const arena = this.arena();
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('zero_grad', 'optimizer', arena.device) : 0;
    const all = this.paramGroups.reduce((n, g) => n + g.params.length, 0);
    if (all === arena.entries.length) arena.zeroGrad();
    else for (const g of this.paramGroups) for (const p of g.params) addon().fill({ tensor: p.grad.raw, value: 0 });
    recorder?.end(token);
  }

  /** The arena all parameters of this optimizer live in (throws if they are not in one). */
  arena(): ParameterArena {
    const first = this.paramGroups.find((g) => g.params.length > 0)?.params[0];
    const arena = first?.arena;
    if (!first || !arena) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `${this.#name}: the parameters have not been placed on a device; call model.to(device) first`,
      );
    }
    for (const g of this.paramGroups) {
      for (const p of g.params) {
        if (p.arena !== arena) {
          throw new ResnetError(
            'ERR_RC_INVALID_ARGUMENT',
            `${this.#name}: all parameters must belong to one model (one parameter arena); call model.to(device) on the whole model`,
          );
        }
      }
    }
    return arena;
  }

  /** The (offset, count, group) triples of the parameters that require gradients, as of now. */
  segmentTable(): Int32Array {
    const triples: number[] = [];
    this.paramGroups.forEach((g, gi) => {
      for (const p of g.params) if (p.requiresGrad) triples.push(p.offset, p.numel, gi);
    });
    return Int32Array.from(triples);
  }

  /**
   * A checkpoint: step count, group settings and the state arenas, copied to the host (this waits
   * for the device).
   */
  state(): OptimizerState {
    const buffers: Record<string, Float32Array> = {};
    for (const [name, t] of this.#buffers) buffers[name] = t.toFloat32Array();
    const paramGroups = this.paramGroups.map((g) => {
      const settings: Record<string, unknown> = {};
      for (const [key, value] of Object.entries(g)) {
        if (key !== 'params') settings[key] = Array.isArray(value) ? [...value] : value;
      }
      return settings;
    });
    return { step: this.#steps, paramGroups, buffers };
  }

  /**
   * Restores a checkpoint of {@link Optimizer.state} into this optimizer, whose groups must hold as
   * many parameters as the saved ones and whose arena must be as large. Everything is checked
   * before anything changes.
   */
  loadState(state: OptimizerState): void {
    if (state === null || typeof state !== 'object') invalid('state', 'an optimizer state object', state);
    const step = expectInt('state.step', state.step, 0);
    if (!Array.isArray(state.paramGroups) || state.paramGroups.length !== this.paramGroups.length) {
      invalid('state.paramGroups', `an array of ${this.paramGroups.length} groups`, state.paramGroups);
    }
    const settings = state.paramGroups.map((g, i) => {
      if (g === null || typeof g !== 'object') invalid(`state.paramGroups[${i}]`, 'an object of settings', g);
      const { params: _ignored, ...rest } = g;
      return this.#check(`state.paramGroups[${i}]`, rest as Partial<O>, rest as Partial<O>);
    });
    const arena = this.arena();
    const buffers = state.buffers ?? {};
    if (typeof buffers !== 'object') invalid('state.buffers', 'an object of Float32Arrays', buffers);
    const known = this.bufferNames();
    for (const [name, data] of Object.entries(buffers)) {
      if (!known.includes(name)) invalid(`state.buffers`, `only ${known.join(', ')}`, name);
      if (!(data instanceof Float32Array) || data.length !== arena.size) {
        invalid(`state.buffers.${name}`, `a Float32Array of ${arena.size} values (the arena's size)`, data);
      }
    }
    settings.forEach((s, i) => Object.assign(this.paramGroups[i]!, s));
    for (const t of this.#buffers.values()) t.dispose();
    this.#buffers.clear();
    for (const [name, data] of Object.entries(buffers)) {
      this.#buffers.set(name, Tensor.from(data, [arena.size], { device: arena.device }));
    }
    this.#steps = step;
  }

  /** Frees the state arenas. */
  dispose(): void {
    for (const t of this.#buffers.values()) t.dispose();
    this.#buffers.clear();
  }

  /** {@link Optimizer.dispose}, for `using` declarations. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** Options of {@link parameterGroups}. */
export interface ParameterGroupsOptions {
  /** Weight decay of the weights (conv and linear weights). */
  weightDecay: number;
  /** Put normalisation parameters and biases in a second group without weight decay; default true. */
  noWeightDecayOnNormAndBias?: boolean;
}

/**
 * Parameter groups for the usual recipe: weight decay on conv and linear weights only, none on
 * batch-norm parameters and biases (by {@link Parameter.kind}). Empty groups are left out; with
 * `noWeightDecayOnNormAndBias: false` there is one group with `weightDecay` for everything.
 *
 * ```ts
 * const opt = new AdamW(parameterGroups(model, { weightDecay: 0.05 }), { lr: 1e-3 });
 * ```
 */
export function parameterGroups(
  model: Module,
  options: ParameterGroupsOptions,
): { params: Parameter[]; weightDecay: number }[] {
  if (!(model instanceof Module)) invalid('model', 'a Module', model);
  if (options === null || typeof options !== 'object') invalid('options', 'an options object', options);
  for (const key of Object.keys(options)) {
    if (key !== 'weightDecay' && key !== 'noWeightDecayOnNormAndBias') {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `Unknown option '${key}' in parameterGroups options; known options: weightDecay, noWeightDecayOnNormAndBias`,
      );
    }
  }
  const weightDecay = expectNumber('weightDecay', options.weightDecay, 0);
  const split = options.noWeightDecayOnNormAndBias ?? true;
  if (typeof split !== 'boolean') invalid('noWeightDecayOnNormAndBias', 'a boolean', split);
  const params = model.parameters();
  if (!split) return params.length > 0 ? [{ params, weightDecay }] : [];
  const decay = params.filter((p) => p.kind === 'weight');
  const noDecay = params.filter((p) => p.kind !== 'weight');
  return [
    ...(decay.length > 0 ? [{ params: decay, weightDecay }] : []),
    ...(noDecay.length > 0 ? [{ params: noDecay, weightDecay: 0 }] : []),
  ];
}
