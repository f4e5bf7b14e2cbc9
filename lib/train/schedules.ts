/**
 * Learning-rate schedules with the semantics of `torch.optim.lr_scheduler`.
 *
 * Every schedule except {@link ReduceLROnPlateau} is a pure function of the number of optimizer
 * steps taken (the iteration) and the group's base learning rate, evaluated in closed form, so
 * resuming from a checkpoint only needs the iteration count to reproduce the exact learning rate.
 * (PyTorch's `get_lr()` is recursive; its `_get_closed_form_lr()` gives the same values, which are
 * the ones used here.)
 *
 * A schedule counts either optimizer steps (`interval: 'step'`, the default) or whole epochs
 * (`interval: 'epoch'`); the {@link Scheduler} is always stepped once per iteration and converts
 * with its `stepsPerEpoch`, so an epoch-based schedule changes the learning rate at the first
 * iteration of each epoch, exactly where calling PyTorch's `scheduler.step()` at the end of every
 * epoch would.
 * @packageDocumentation
 */
import { ResnetError, expectInt, expectNumber, expectOneOf, expectOptions, invalid, isArray } from '../errors.js';

/** The unit a schedule counts in: optimizer steps or whole epochs. */
export type Interval = 'step' | 'epoch';

/** Options every schedule accepts. */
export interface IntervalOptions {
  /** Whether the schedule's time counts optimizer steps (default) or whole epochs. */
  interval?: Interval;
}

/**
 * A learning-rate schedule: a pure function from the iteration to a learning rate.
 *
 * Subclasses implement {@link Schedule.lrAtTime} in their own unit; {@link Schedule.lrAt} does the
 * conversion from iterations.
 */
export abstract class Schedule {
  /** The unit this schedule's time counts in. */
  readonly interval: Interval;

  /**
   * @param where - the options' name for error messages.
   * @param options - the subclass's options, checked here for unknown keys.
   * @param known - the subclass's option names (besides `interval`).
   */
  protected constructor(where: string, options: unknown, known: readonly string[]) {
    const o = expectOptions<IntervalOptions>(where, options, [...known, 'interval']);
    this.interval = expectOneOf(`${where}.interval`, o.interval ?? 'step', ['step', 'epoch'] as const);
  }

  /**
   * The learning rate at a time counted in this schedule's own unit.
   * @param t - steps or epochs since the schedule started (an integer of at least 0).
   * @param baseLr - the parameter group's initial learning rate.
   */
  abstract lrAtTime(t: number, baseLr: number): number;

  /**
   * The learning rate for the optimizer step numbered `step` (0 for the first).
   * @param step - optimizer steps taken before this one.
   * @param baseLr - the parameter group's initial learning rate.
   * @param stepsPerEpoch - iterations per epoch; required when the schedule (or a part of it) counts epochs.
   */
  lrAt(step: number, baseLr: number, stepsPerEpoch?: number): number {
    expectInt('step', step, 0);
    return this.lrAtTime(toTime(this.interval, step, stepsPerEpoch), baseLr);
  }

  /** Whether this schedule, or a part of it, counts epochs (so the scheduler needs `stepsPerEpoch`). */
  usesEpochs(): boolean {
    return this.interval === 'epoch';
  }
}

function toTime(interval: Interval, step: number, stepsPerEpoch: number | undefined): number {
  return interval === 'step' ? step : Math.floor(step / requireStepsPerEpoch(stepsPerEpoch));
}

function requireStepsPerEpoch(stepsPerEpoch: number | undefined): number {
  if (stepsPerEpoch === undefined) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      "Expected stepsPerEpoch (an integer of at least 1) for a schedule with interval 'epoch' but received undefined",
    );
  }
  return expectInt('stepsPerEpoch', stepsPerEpoch, 1);
}

/** Options of {@link LinearWarmup} (PyTorch's `LinearLR`). */
export interface LinearWarmupOptions extends IntervalOptions {
  /** Steps (or epochs) over which the factor moves from `startFactor` to `endFactor`. */
  totalIters: number;
  /** Factor of the base lr at time 0; default 1/3 as in PyTorch. */
  startFactor?: number;
  /** Factor of the base lr from `totalIters` on; default 1. */
  endFactor?: number;
}

/**
 * Linear warmup (PyTorch's `LinearLR`):
 * `lr = baseLr * (startFactor + (endFactor - startFactor) * min(t, totalIters) / totalIters)`.
 */
export class LinearWarmup extends Schedule {
  readonly totalIters: number;
  readonly startFactor: number;
  readonly endFactor: number;

  constructor(options: LinearWarmupOptions) {
    super('LinearWarmup options', options, ['totalIters', 'startFactor', 'endFactor']);
    const o: Partial<LinearWarmupOptions> = options ?? {};
    this.totalIters = expectInt('LinearWarmup options.totalIters', o.totalIters, 0);
    // PyTorch requires 0 < startFactor <= 1 and 0 <= endFactor <= 1.
    this.startFactor = expectNumber('LinearWarmup options.startFactor', o.startFactor ?? 1 / 3, 0, 1);
    if (this.startFactor === 0) invalid('LinearWarmup options.startFactor', 'a number above 0 and at most 1', 0);
    this.endFactor = expectNumber('LinearWarmup options.endFactor', o.endFactor ?? 1, 0, 1);
  }

  lrAtTime(t: number, baseLr: number): number {
    if (this.totalIters === 0) return baseLr * this.endFactor;
    return (
      baseLr *
      (this.startFactor + ((this.endFactor - this.startFactor) * Math.min(t, this.totalIters)) / this.totalIters)
    );
  }
}

/** Options of {@link ConstantWarmup} (PyTorch's `ConstantLR`). */
export interface ConstantWarmupOptions extends IntervalOptions {
  /** Steps (or epochs) during which the lr is scaled by `factor`. */
  totalIters: number;
  /** Factor of the base lr before `totalIters`; default 1/3 as in PyTorch. */
  factor?: number;
}

/** Constant warmup (PyTorch's `ConstantLR`): `baseLr * factor` before `totalIters`, then `baseLr`. */
export class ConstantWarmup extends Schedule {
  readonly totalIters: number;
  readonly factor: number;

  constructor(options: ConstantWarmupOptions) {
    super('ConstantWarmup options', options, ['totalIters', 'factor']);
    const o: Partial<ConstantWarmupOptions> = options ?? {};
    this.totalIters = expectInt('ConstantWarmup options.totalIters', o.totalIters, 0);
    this.factor = expectNumber('ConstantWarmup options.factor', o.factor ?? 1 / 3, 0, 1);
  }

  lrAtTime(t: number, baseLr: number): number {
    return t < this.totalIters ? baseLr * this.factor : baseLr;
  }
}

/**
 * The base learning rate, unchanged (e.g. to hold the lr between phases of a
 * {@link SequentialSchedule}). Not PyTorch's `ConstantLR`, which is {@link ConstantWarmup}.
 */
export class ConstantSchedule extends Schedule {
  constructor(options?: IntervalOptions) {
    super('ConstantSchedule options', options, []);
  }

  lrAtTime(_t: number, baseLr: number): number {
    return baseLr;
  }
}

/** Options of {@link CosineAnnealingLR}. */
export interface CosineAnnealingLROptions extends IntervalOptions {
  /** Steps (or epochs) from the base lr down to `minLr` (PyTorch's `T_max`). */
  tMax: number;
  /** The floor the lr reaches at `tMax` (PyTorch's `eta_min`), absolute; default 0. */
  minLr?: number;
}

/**
 * Cosine annealing (PyTorch's `CosineAnnealingLR`, closed form):
 * `lr = minLr + (baseLr - minLr) * (1 + cos(pi * t / tMax)) / 2`.
 *
 * As in PyTorch the curve is periodic past `tMax` (the lr climbs back up); size `tMax` to the
 * training run, or follow it with another schedule in a {@link SequentialSchedule}.
 */
export class CosineAnnealingLR extends Schedule {
  readonly tMax: number;
  readonly minLr: number;

  constructor(options: CosineAnnealingLROptions) {
    super('CosineAnnealingLR options', options, ['tMax', 'minLr']);
    const o: Partial<CosineAnnealingLROptions> = options ?? {};
    this.tMax = expectInt('CosineAnnealingLR options.tMax', o.tMax, 1);
    this.minLr = expectNumber('CosineAnnealingLR options.minLr', o.minLr ?? 0, 0);
  }

  lrAtTime(t: number, baseLr: number): number {
    return this.minLr + ((baseLr - this.minLr) * (1 + Math.cos((Math.PI * t) / this.tMax))) / 2;
  }
}

/** Options of {@link StepLR}. */
export interface StepLROptions extends IntervalOptions {
  /** Period of the decay in steps (or epochs). */
  stepSize: number;
  /** Multiplicative factor per period; default 0.1. */
  gamma?: number;
}

/** Step decay (PyTorch's `StepLR`): `lr = baseLr * gamma ** floor(t / stepSize)`. */
export class StepLR extends Schedule {
  readonly stepSize: number;
  readonly gamma: number;

  constructor(options: StepLROptions) {
    super('StepLR options', options, ['stepSize', 'gamma']);
    const o: Partial<StepLROptions> = options ?? {};
    this.stepSize = expectInt('StepLR options.stepSize', o.stepSize, 1);
    this.gamma = expectNumber('StepLR options.gamma', o.gamma ?? 0.1, 0);
  }

  lrAtTime(t: number, baseLr: number): number {
    return baseLr * this.gamma ** Math.floor(t / this.stepSize);
  }
}

/** Options of {@link MultiStepLR}. */
export interface MultiStepLROptions extends IntervalOptions {
  /** Steps (or epochs) at which the lr is multiplied by `gamma`; a repeated milestone counts twice, as in PyTorch. */
  milestones: readonly number[];
  /** Multiplicative factor per milestone passed; default 0.1. */
  gamma?: number;
}

/**
 * Decay at milestones (PyTorch's `MultiStepLR`): `lr = baseLr * gamma ** (number of milestones <= t)`
 * (PyTorch's `bisect_right`).
 */
export class MultiStepLR extends Schedule {
  readonly milestones: readonly number[];
  readonly gamma: number;

  constructor(options: MultiStepLROptions) {
    super('MultiStepLR options', options, ['milestones', 'gamma']);
    const o: Partial<MultiStepLROptions> = options ?? {};
    if (!Array.isArray(o.milestones)) invalid('MultiStepLR options.milestones', 'an array of integers', o.milestones);
    const milestones = o.milestones.map((m, i) => expectInt(`MultiStepLR options.milestones[${i}]`, m, 0));
    this.milestones = milestones.sort((a, b) => a - b);
    this.gamma = expectNumber('MultiStepLR options.gamma', o.gamma ?? 0.1, 0);
  }

  lrAtTime(t: number, baseLr: number): number {
    let passed = 0;
    for (const m of this.milestones) if (m <= t) passed++;
    return baseLr * this.gamma ** passed;
  }
}

/** Options of {@link ExponentialLR}. */
export interface ExponentialLROptions extends IntervalOptions {
  /** Multiplicative factor per step (or epoch). */
  gamma: number;
}

/** Exponential decay (PyTorch's `ExponentialLR`): `lr = baseLr * gamma ** t`. */
export class ExponentialLR extends Schedule {
  readonly gamma: number;

  constructor(options: ExponentialLROptions) {
    super('ExponentialLR options', options, ['gamma']);
    const o: Partial<ExponentialLROptions> = options ?? {};
    this.gamma = expectNumber('ExponentialLR options.gamma', o.gamma, 0);
  }

  lrAtTime(t: number, baseLr: number): number {
    return baseLr * this.gamma ** t;
  }
}

/** Options of {@link OneCycleLR}. */
export interface OneCycleLROptions extends IntervalOptions {
  /**
   * The peak learning rate. When omitted, each parameter group peaks at its own base lr, which keeps
   * the ratio between groups (PyTorch takes a list of peaks for that).
   */
  maxLr?: number;
  /** Length of the cycle in steps (or epochs). */
  totalSteps: number;
  /** Fraction of the cycle spent increasing the lr; default 0.3. */
  pctStart?: number;
  /** Annealing curve; default `'cos'`. */
  annealStrategy?: 'cos' | 'linear';
  /** The initial lr is `maxLr / divFactor`; default 25. */
  divFactor?: number;
  /** The final lr is `maxLr / divFactor / finalDivFactor`; default 1e4. */
  finalDivFactor?: number;
  /** Use PyTorch's three-phase variant (up, back down to the initial lr, then to the final lr); default false. */
  threePhase?: boolean;
}

/**
 * The 1cycle policy (PyTorch's `OneCycleLR`, same phase boundaries and annealing formulas).
 *
 * With `initial = maxLr / divFactor` and `min = initial / finalDivFactor`, the lr goes from
 * `initial` at step 0 to `maxLr` at step `pctStart * totalSteps - 1`, then to `min` at step
 * `totalSteps - 1`. Cosine annealing between `a` and `b` at fraction `p` of a phase is
 * `b + (a - b) / 2 * (cos(pi * p) + 1)`, linear is `a + (b - a) * p`. As in PyTorch, asking for a
 * step beyond `totalSteps` is an error. Momentum cycling is not part of this schedule.
 */
export class OneCycleLR extends Schedule {
  readonly maxLr: number | undefined;
  readonly totalSteps: number;
  readonly pctStart: number;
  readonly annealStrategy: 'cos' | 'linear';
  readonly divFactor: number;
  readonly finalDivFactor: number;
  readonly threePhase: boolean;

  constructor(options: OneCycleLROptions) {
    const where = 'OneCycleLR options';
    super(where, options, [
      'maxLr',
      'totalSteps',
      'pctStart',
      'annealStrategy',
      'divFactor',
      'finalDivFactor',
      'threePhase',
    ]);
    const o: Partial<OneCycleLROptions> = options ?? {};
    this.maxLr = o.maxLr === undefined ? undefined : expectNumber(`${where}.maxLr`, o.maxLr, 0);
    this.totalSteps = expectInt(`${where}.totalSteps`, o.totalSteps, 1);
    this.pctStart = expectNumber(`${where}.pctStart`, o.pctStart ?? 0.3, 0, 1);
    this.annealStrategy = expectOneOf(`${where}.annealStrategy`, o.annealStrategy ?? 'cos', ['cos', 'linear'] as const);
    this.divFactor = expectNumber(`${where}.divFactor`, o.divFactor ?? 25, Number.MIN_VALUE);
    this.finalDivFactor = expectNumber(`${where}.finalDivFactor`, o.finalDivFactor ?? 1e4, Number.MIN_VALUE);
    this.threePhase = o.threePhase ?? false;
    if (typeof this.threePhase !== 'boolean') invalid(`${where}.threePhase`, 'a boolean', o.threePhase);
  }

  lrAtTime(t: number, baseLr: number): number {
    if (t > this.totalSteps) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `OneCycleLR: tried to step ${t} times, more than the ${this.totalSteps} total steps of the cycle`,
      );
    }
    const maxLr = this.maxLr ?? baseLr;
    const initialLr = maxLr / this.divFactor;
    const minLr = initialLr / this.finalDivFactor;
    // PyTorch's phase table: end steps are floats (pct_start * total_steps - 1 need not be whole).
    const phases: { end: number; from: number; to: number }[] = this.threePhase
      ? [
          { end: this.pctStart * this.totalSteps - 1, from: initialLr, to: maxLr },
          { end: 2 * this.pctStart * this.totalSteps - 2, from: maxLr, to: initialLr },
          { end: this.totalSteps - 1, from: initialLr, to: minLr },
        ]
      : [
          { end: this.pctStart * this.totalSteps - 1, from: initialLr, to: maxLr },
          { end: this.totalSteps - 1, from: maxLr, to: minLr },
        ];
    let start = 0;
    for (let i = 0; i < phases.length; i++) {
      const phase = phases[i]!;
      if (t <= phase.end || i === phases.length - 1) {
        const pct = (t - start) / (phase.end - start);
        return this.annealStrategy === 'cos'
          ? phase.to + ((phase.from - phase.to) / 2) * (Math.cos(Math.PI * pct) + 1)
          : (phase.to - phase.from) * pct + phase.from;
      }
      start = phase.end;
    }
    // The last phase always answers (see the condition above); this satisfies the return type.
    throw new Error('OneCycleLR: no phase matched');
  }
}

/** Options of {@link SequentialSchedule} (PyTorch's `SequentialLR`). */
export interface SequentialScheduleOptions extends IntervalOptions {
  /** The schedules, in order. */
  schedules: readonly Schedule[];
  /**
   * Where each schedule after the first takes over, in this schedule's unit (`interval`), strictly
   * increasing; one fewer than `schedules`.
   */
  milestones: readonly number[];
}

/**
 * Runs schedules one after another (PyTorch's `SequentialLR`), e.g. a linear warmup then cosine
 * annealing. Each schedule restarts its own clock at its milestone, as PyTorch's `SequentialLR`
 * does when it calls `step(0)` on the next scheduler, and starts again from the base lr.
 *
 * The children keep their own `interval`: a warmup counted in steps can be followed by a decay
 * counted in epochs, with the milestone given in epochs (`interval: 'epoch'`).
 */
export class SequentialSchedule extends Schedule {
  readonly schedules: readonly Schedule[];
  readonly milestones: readonly number[];

  constructor(options: SequentialScheduleOptions) {
    const where = 'SequentialSchedule options';
    super(where, options, ['schedules', 'milestones']);
    const o: Partial<SequentialScheduleOptions> = options ?? {};
    if (!isArray(o.schedules) || o.schedules.length === 0) {
      invalid(`${where}.schedules`, 'a non-empty array of schedules', o.schedules);
    }
    o.schedules.forEach((s, i) => {
      if (!(s instanceof Schedule)) invalid(`${where}.schedules[${i}]`, 'a Schedule', s);
    });
    if (!isArray(o.milestones) || o.milestones.length !== o.schedules.length - 1) {
      invalid(
        `${where}.milestones`,
        `an array of ${o.schedules.length - 1} integers (one per schedule after the first)`,
        o.milestones,
      );
    }
    const milestones = o.milestones;
    milestones.forEach((m, i) => expectInt(`${where}.milestones[${i}]`, m, i === 0 ? 0 : milestones[i - 1]! + 1));
    this.schedules = [...o.schedules];
    this.milestones = [...milestones];
  }

  /**
   * The children need the time in iterations, which only {@link SequentialSchedule.lrAt} has; for a
   * sequence counted in steps `t` is that, and a sequence counted in epochs cannot answer here.
   */
  lrAtTime(t: number, baseLr: number): number {
    if (this.interval === 'epoch') {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        "SequentialSchedule with interval 'epoch': call lrAt(step, baseLr, stepsPerEpoch) so the parts can count in steps",
      );
    }
    return this.lrAt(t, baseLr);
  }

  override lrAt(step: number, baseLr: number, stepsPerEpoch?: number): number {
    expectInt('step', step, 0);
    const toSteps = (m: number): number => (this.interval === 'step' ? m : m * requireStepsPerEpoch(stepsPerEpoch));
    let index = 0;
    while (index < this.milestones.length && step >= toSteps(this.milestones[index]!)) index++;
    const start = index === 0 ? 0 : toSteps(this.milestones[index - 1]!);
    return this.schedules[index]!.lrAt(step - start, baseLr, stepsPerEpoch);
  }

  override usesEpochs(): boolean {
    return this.interval === 'epoch' || this.schedules.some((s) => s.usesEpochs());
  }
}

/**
 * The linear scaling rule (Goyal et al., "Accurate, Large Minibatch SGD"): the learning rate grows
 * in proportion to the global batch, `baseLr * globalBatch / referenceBatch`.
 * @param baseLr - the learning rate tuned for `referenceBatch` images per step.
 * @param globalBatch - images per optimizer step over all processes.
 * @param referenceBatch - the batch `baseLr` was tuned for; default 256 (ImageNet ResNet recipes).
 */
export function scaleLrForBatch(baseLr: number, globalBatch: number, referenceBatch = 256): number {
  expectNumber('baseLr', baseLr, 0);
  expectInt('globalBatch', globalBatch, 1);
  expectInt('referenceBatch', referenceBatch, 1);
  return (baseLr * globalBatch) / referenceBatch;
}

/** Anything with parameter groups whose `lr` can be set, such as {@link SGD}. */
export interface LrGroups {
  readonly paramGroups: { lr: number }[];
}

/** Options of {@link Scheduler}. */
export interface SchedulerOptions {
  /** Iterations per epoch; required when the schedule counts epochs. */
  stepsPerEpoch?: number;
  /** Resume at this iteration (as `state().step` recorded); default 0. */
  step?: number;
}

/** What {@link Scheduler.state} returns; plain data that survives JSON. */
export interface SchedulerState {
  /** Optimizer steps taken. */
  step: number;
  /** Each group's base (initial) learning rate. */
  baseLrs: number[];
}

/**
 * Binds a {@link Schedule} to an optimizer: each parameter group's lr is the schedule evaluated at
 * the current iteration with that group's base lr (its lr when the scheduler was made).
 *
 * Call {@link Scheduler.step} once after every `optimizer.step()`, as with PyTorch's schedulers
 * stepped per iteration; the lr for the first step is set by the constructor.
 */
export class Scheduler {
  readonly schedule: Schedule;
  readonly stepsPerEpoch: number | undefined;
  #optimizer: LrGroups;
  #baseLrs: number[];
  #step: number;

  constructor(optimizer: LrGroups, schedule: Schedule, options?: SchedulerOptions) {
    const o = expectOptions<SchedulerOptions>('Scheduler options', options, ['stepsPerEpoch', 'step']);
    if (optimizer === null || typeof optimizer !== 'object' || !Array.isArray(optimizer.paramGroups)) {
      invalid('optimizer', 'an optimizer with paramGroups', optimizer);
    }
    if (!(schedule instanceof Schedule)) invalid('schedule', 'a Schedule', schedule);
    this.stepsPerEpoch =
      o.stepsPerEpoch === undefined ? undefined : expectInt('Scheduler options.stepsPerEpoch', o.stepsPerEpoch, 1);
    if (schedule.usesEpochs() && this.stepsPerEpoch === undefined) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        "Expected Scheduler options.stepsPerEpoch (an integer of at least 1) for a schedule with interval 'epoch' but received undefined",
      );
    }
    this.#optimizer = optimizer;
    this.schedule = schedule;
    this.#baseLrs = optimizer.paramGroups.map((g, i) => expectNumber(`optimizer.paramGroups[${i}].lr`, g.lr, 0));
    this.#step = expectInt('Scheduler options.step', o.step ?? 0, 0);
    this.#apply(this.#step, this.#baseLrs);
  }

  /** Optimizer steps taken so far (the time the current lr belongs to). */
  get stepCount(): number {
    return this.#step;
  }

  /** The current learning rate of the first parameter group. */
  get lr(): number {
    return this.#optimizer.paramGroups[0]?.lr ?? 0;
  }

  /** The current learning rate of every parameter group. */
  get lrs(): number[] {
    return this.#optimizer.paramGroups.map((g) => g.lr);
  }

  /** The base learning rates the schedule scales. */
  get baseLrs(): readonly number[] {
    return this.#baseLrs;
  }

  /**
   * Advances one iteration and sets every group's lr for the next optimizer step. If the schedule
   * has no value there (OneCycleLR past its end) it throws and nothing changes.
   */
  step(): void {
    this.#apply(this.#step + 1, this.#baseLrs);
    this.#step++;
  }

  /** The lr of group `group` at iteration `step` without changing anything (e.g. to plot the schedule). */
  lrAt(step: number, group = 0): number {
    expectInt('group', group, 0, this.#baseLrs.length - 1);
    return this.schedule.lrAt(step, this.#baseLrs[group]!, this.stepsPerEpoch);
  }

  /** The state to checkpoint: the iteration and the base lrs. */
  state(): SchedulerState {
    return { step: this.#step, baseLrs: [...this.#baseLrs] };
  }

  /** Restores {@link Scheduler.state}'s output and sets the lrs it implies. */
  loadState(state: SchedulerState): void {
    if (state === null || typeof state !== 'object') invalid('state', 'a SchedulerState object', state);
    const step = expectInt('state.step', state.step, 0);
    if (!Array.isArray(state.baseLrs) || state.baseLrs.length !== this.#optimizer.paramGroups.length) {
      invalid(
        'state.baseLrs',
        `an array of ${this.#optimizer.paramGroups.length} learning rates (one per parameter group)`,
        state.baseLrs,
      );
    }
    const baseLrs = state.baseLrs.map((lr, i) => expectNumber(`state.baseLrs[${i}]`, lr, 0));
    this.#apply(step, baseLrs);
    this.#step = step;
    this.#baseLrs = baseLrs;
  }

  /** Sets the lrs for iteration `step`, all or none: every value is computed before any is set. */
  #apply(step: number, baseLrs: readonly number[]): void {
    const groups = this.#optimizer.paramGroups;
    if (groups.length !== baseLrs.length) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `Scheduler: the optimizer has ${groups.length} parameter groups but the scheduler was made for ${baseLrs.length}`,
      );
    }
    const lrs = baseLrs.map((base) => this.schedule.lrAt(step, base, this.stepsPerEpoch));
    groups.forEach((g, i) => {
      g.lr = lrs[i]!;
    });
  }
}

/** Options of {@link ReduceLROnPlateau}; the defaults are PyTorch's. */
export interface ReduceLROnPlateauOptions {
  /** Whether lower (`'min'`, default) or higher (`'max'`) metric values are better. */
  mode?: 'min' | 'max';
  /** Multiplier applied to the lr on a plateau, below 1; default 0.1. */
  factor?: number;
  /** Epochs without improvement tolerated before reducing; default 10. */
  patience?: number;
  /** Minimum change that counts as an improvement; default 1e-4. */
  threshold?: number;
  /** `'rel'` (default): improvement relative to the best, `best * (1 ∓ threshold)`; `'abs'`: `best ∓ threshold`. */
  thresholdMode?: 'rel' | 'abs';
  /** Epochs to wait after a reduction before counting bad epochs again; default 0. */
  cooldown?: number;
  /** Floor on the lr, one for all groups or one per group; default 0. */
  minLr?: number | readonly number[];
  /** Reductions smaller than this are skipped; default 1e-8. */
  eps?: number;
}

/** What {@link ReduceLROnPlateau.state} returns; plain data that survives JSON (`best` may be ±Infinity, stored as null). */
export interface ReduceLROnPlateauState {
  best: number | null;
  numBadEpochs: number;
  cooldownCounter: number;
  lastEpoch: number;
  lrs: number[];
}

/**
 * Reduces the learning rate when a metric stops improving (PyTorch's `ReduceLROnPlateau`, same
 * rules): after each evaluation call {@link ReduceLROnPlateau.step} with the metric; once more than
 * `patience` evaluations in a row fail to improve on the best by `threshold`, every group's lr
 * becomes `max(lr * factor, minLr)` (unless that changes it by no more than `eps`), and the next
 * `cooldown` evaluations do not count as bad.
 *
 * Unlike the other schedules it is stateful and sets the optimizer's lrs directly; checkpoint it
 * with {@link ReduceLROnPlateau.state}.
 */
export class ReduceLROnPlateau {
  readonly mode: 'min' | 'max';
  readonly factor: number;
  readonly patience: number;
  readonly threshold: number;
  readonly thresholdMode: 'rel' | 'abs';
  readonly cooldown: number;
  readonly minLrs: readonly number[];
  readonly eps: number;
  #optimizer: LrGroups;
  #best: number;
  #numBadEpochs = 0;
  #cooldownCounter = 0;
  #lastEpoch = 0;

  constructor(optimizer: LrGroups, options?: ReduceLROnPlateauOptions) {
    const where = 'ReduceLROnPlateau options';
    const o = expectOptions<ReduceLROnPlateauOptions>(where, options, [
      'mode',
      'factor',
      'patience',
      'threshold',
      'thresholdMode',
      'cooldown',
      'minLr',
      'eps',
    ]);
    if (optimizer === null || typeof optimizer !== 'object' || !Array.isArray(optimizer.paramGroups)) {
      invalid('optimizer', 'an optimizer with paramGroups', optimizer);
    }
    this.#optimizer = optimizer;
    this.mode = expectOneOf(`${where}.mode`, o.mode ?? 'min', ['min', 'max'] as const);
    this.factor = expectNumber(`${where}.factor`, o.factor ?? 0.1, 0);
    if (this.factor >= 1) invalid(`${where}.factor`, 'a number below 1', this.factor);
    this.patience = expectInt(`${where}.patience`, o.patience ?? 10, 0);
    this.threshold = expectNumber(`${where}.threshold`, o.threshold ?? 1e-4, 0);
    this.thresholdMode = expectOneOf(`${where}.thresholdMode`, o.thresholdMode ?? 'rel', ['rel', 'abs'] as const);
    this.cooldown = expectInt(`${where}.cooldown`, o.cooldown ?? 0, 0);
    this.eps = expectNumber(`${where}.eps`, o.eps ?? 1e-8, 0);
    const groups = optimizer.paramGroups.length;
    const minLr = o.minLr ?? 0;
    if (Array.isArray(minLr)) {
      if (minLr.length !== groups) {
        invalid(`${where}.minLr`, `a number or an array of ${groups} numbers (one per parameter group)`, minLr);
      }
      this.minLrs = minLr.map((v, i) => expectNumber(`${where}.minLr[${i}]`, v, 0));
    } else {
      this.minLrs = new Array<number>(groups).fill(expectNumber(`${where}.minLr`, minLr, 0));
    }
    this.#best = this.#worst();
  }

  /** The current learning rate of the first parameter group. */
  get lr(): number {
    return this.#optimizer.paramGroups[0]?.lr ?? 0;
  }

  /** The best metric seen so far (±Infinity before the first). */
  get best(): number {
    return this.#best;
  }

  /** Evaluations in a row without improvement. */
  get numBadEpochs(): number {
    return this.#numBadEpochs;
  }

  /** Whether the scheduler is waiting out a cooldown. */
  get inCooldown(): boolean {
    return this.#cooldownCounter > 0;
  }

  /**
   * Records one evaluation's metric and reduces the lrs on a plateau.
   * @returns whether the lrs were reduced.
   */
  step(metric: number): boolean {
    // NaN is accepted, as in PyTorch: it never counts as an improvement.
    if (typeof metric !== 'number') invalid('metric', 'a number', metric);
    this.#lastEpoch++;
    if (this.#isBetter(metric)) {
      this.#best = metric;
      this.#numBadEpochs = 0;
    } else {
      this.#numBadEpochs++;
    }
    if (this.#cooldownCounter > 0) {
      this.#cooldownCounter--;
      this.#numBadEpochs = 0;
    }
    if (this.#numBadEpochs > this.patience) {
      const reduced = this.#reduce();
      this.#cooldownCounter = this.cooldown;
      this.#numBadEpochs = 0;
      return reduced;
    }
    return false;
  }

  /** The state to checkpoint, including the current lrs. */
  state(): ReduceLROnPlateauState {
    return {
      best: Number.isFinite(this.#best) ? this.#best : null,
      numBadEpochs: this.#numBadEpochs,
      cooldownCounter: this.#cooldownCounter,
      lastEpoch: this.#lastEpoch,
      lrs: this.#optimizer.paramGroups.map((g) => g.lr),
    };
  }

  /** Restores {@link ReduceLROnPlateau.state}'s output, lrs included. */
  loadState(state: ReduceLROnPlateauState): void {
    if (state === null || typeof state !== 'object') invalid('state', 'a ReduceLROnPlateauState object', state);
    const best = state.best === null ? this.#worst() : expectNumber('state.best', state.best);
    const numBadEpochs = expectInt('state.numBadEpochs', state.numBadEpochs, 0);
    const cooldownCounter = expectInt('state.cooldownCounter', state.cooldownCounter, 0);
    const lastEpoch = expectInt('state.lastEpoch', state.lastEpoch, 0);
    const groups = this.#optimizer.paramGroups;
    if (!Array.isArray(state.lrs) || state.lrs.length !== groups.length) {
      invalid('state.lrs', `an array of ${groups.length} learning rates (one per parameter group)`, state.lrs);
    }
    const lrs = state.lrs.map((lr, i) => expectNumber(`state.lrs[${i}]`, lr, 0));
    this.#best = best;
    this.#numBadEpochs = numBadEpochs;
    this.#cooldownCounter = cooldownCounter;
    this.#lastEpoch = lastEpoch;
    groups.forEach((g, i) => {
      g.lr = lrs[i]!;
    });
  }

  #worst(): number {
    return this.mode === 'min' ? Infinity : -Infinity;
  }

  #isBetter(a: number): boolean {
    const best = this.#best;
    if (this.mode === 'min') {
      return this.thresholdMode === 'rel' ? a < best * (1 - this.threshold) : a < best - this.threshold;
    }
    return this.thresholdMode === 'rel' ? a > best * (this.threshold + 1) : a > best + this.threshold;
  }

  #reduce(): boolean {
    let any = false;
    this.#optimizer.paramGroups.forEach((g, i) => {
      const next = Math.max(g.lr * this.factor, this.minLrs[i] ?? 0);
      if (g.lr - next > this.eps) {
        g.lr = next;
        any = true;
      }
    });
    return any;
  }
}
