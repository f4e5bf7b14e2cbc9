/**
 * The learning-rate range test (Leslie N. Smith, "Cyclical Learning Rates for Training Neural
 * Networks", arXiv:1506.01186, section 3.3), as fastai's `lr_find` and pytorch-lr-finder's
 * `LRFinder.range_test` run it: train for `numIter` optimizer steps while the learning rate grows
 * from `startLr` to `endLr` (exponentially by default), record the loss of every step, smooth it,
 * stop when it diverges, put the model and the optimizer back exactly as they were, and suggest a
 * learning rate where the smoothed loss falls fastest.
 *
 * - Schedule (pytorch-lr-finder's `ExponentialLR` / `LinearLR`): step i of n uses
 *   `startLr * (endLr / startLr) ** (i / (n - 1))`, or `startLr + (endLr - startLr) * i / (n - 1)`,
 *   so the first step uses `startLr` and the last `endLr`. Every parameter group gets that rate.
 * - Smoothing (fastai's `SmoothenValue`): `avg = beta * avg + (1 - beta) * loss`,
 *   `smoothed_i = avg / (1 - beta ** (i + 1))` (bias-corrected), `beta` 0.98.
 * - Divergence (fastai's `stop_div`): the test stops after a step whose smoothed loss is NaN or
 *   above `divergeThreshold` (4) times the lowest smoothed loss so far; that step is kept.
 * - Suggestion: the steepest descent of the smoothed loss against log(lr) (pytorch-lr-finder's
 *   `suggestion`, fastai's `steep`), its gradient taken by central differences after leaving out
 *   the first `skipStart` (10) and last `skipEnd` (5) steps; also the lr of the minimum smoothed loss
 *   divided by 10 (fastai's `minimum`).
 *
 * The state the test changes is saved first and restored afterwards, bit for bit: the parameter
 * arena (values and gradients), the buffers (batch-norm running statistics), the integer counters
 * (`num_batches_tracked`), the training/evaluation mode of every module, the optimizer (step count,
 * group settings including the learning rate, momentum and moment arenas), the GradScaler and the
 * loader's epoch.
 * @packageDocumentation
 */
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { DataLoader } from '../data/loader.js';
import { ResnetError, expectInt, expectNumber, expectOneOf, expectOptions, invalid } from '../errors.js';
import type { Module, StateDict } from '../nn/module.js';
import type { GradScaler } from '../optim/grad-scaler.js';
import type { Optimizer, OptimizerState } from '../optim/optimizer.js';
import type { Tensor } from '../tensor.js';
import { checkSignal, throwIfAborted } from './abort.js';
import { loaderBatches, type DeviceBatch } from './batches.js';
import { writeFileAtomic } from './checkpoint.js';
import { plotCurves, writePng, type Series } from './outputs/plots.js';

/** Options of {@link Trainer.findLr}. */
export interface LrFinderOptions {
  /** The learning rate of the first step; default 1e-7 (fastai's). */
  startLr?: number;
  /** The learning rate of the last step; default 10 (fastai's and pytorch-lr-finder's). */
  endLr?: number;
  /** Optimizer steps of the sweep (each takes the Trainer's `accumulate` batches); default 100. */
  numIter?: number;
  /** How the rate grows: `'exp'` (default) or `'linear'`. */
  mode?: 'exp' | 'linear';
  /** The smoothing factor of the loss; default 0.98. */
  beta?: number;
  /** Stop when the smoothed loss exceeds this many times its lowest value; default 4 (fastai's). */
  divergeThreshold?: number;
  /** Steps left out at the start when looking for the steepest descent; default 10. */
  skipStart?: number;
  /** Steps left out at the end when looking for the steepest descent; default 5. */
  skipEnd?: number;
  /** Cancels the test (the state is still restored); it rejects with an `AbortError`. */
  signal?: AbortSignal;
}

/** {@link LrFinderOptions} with their defaults. */
export interface LrFinderSettings {
  startLr: number;
  endLr: number;
  numIter: number;
  mode: 'exp' | 'linear';
  beta: number;
  divergeThreshold: number;
  skipStart: number;
  skipEnd: number;
}

/** A suggested learning rate and the step of the sweep it comes from. */
export interface LrSuggestion {
  /** The learning rate. */
  lr: number;
  /** Its step in the sweep (an index into `lrs`). */
  index: number;
}

/** What the range test measured and suggests. */
export interface LrFinderResult {
  /** The settings the test ran with. */
  settings: LrFinderSettings;
  /** The learning rate of each step taken. */
  lrs: number[];
  /** The training loss of each step (the mean over its micro-batches). */
  losses: number[];
  /** The bias-corrected exponentially smoothed loss of each step. */
  smoothedLosses: number[];
  /** The lowest smoothed loss. */
  bestLoss: number;
  /** Whether the test stopped early because the loss diverged. */
  diverged: boolean;
  /**
   * The steepest descent of the smoothed loss against log(lr), or null when fewer than two steps
   * remain after `skipStart` and `skipEnd` (run more steps, or lower them).
   */
  suggestion: LrSuggestion | null;
  /** The step of the lowest smoothed loss (in the same window) and its learning rate divided by 10, or null. */
  minimum: (LrSuggestion & { lrOverTen: number }) | null;
}

const KEYS = [
  'startLr',
  'endLr',
  'numIter',
  'mode',
  'beta',
  'divergeThreshold',
  'skipStart',
  'skipEnd',
  'signal',
] as const;

/** Checks the options of the range test and applies the defaults. */
export function parseLrFinderOptions(options: LrFinderOptions | undefined): LrFinderSettings & {
  signal: AbortSignal | null;
} {
  const o = expectOptions<LrFinderOptions>('findLr options', options, KEYS);
  const startLr = expectNumber('startLr', o.startLr ?? 1e-7, 0);
  if (!(startLr > 0)) invalid('startLr', 'a positive learning rate', o.startLr);
  const endLr = expectNumber('endLr', o.endLr ?? 10, 0);
  if (!(endLr > startLr)) invalid('endLr', `a learning rate above startLr (${startLr})`, o.endLr);
  const beta = expectNumber('beta', o.beta ?? 0.98, 0, 1);
  if (beta === 1) invalid('beta', 'a smoothing factor in [0, 1)', o.beta);
  const divergeThreshold = expectNumber('divergeThreshold', o.divergeThreshold ?? 4, 1);
  if (divergeThreshold === 1) invalid('divergeThreshold', 'a factor above 1', o.divergeThreshold);
  return {
    startLr,
    endLr,
    numIter: expectInt('numIter', o.numIter ?? 100, 2),
    mode: expectOneOf('mode', o.mode ?? 'exp', ['exp', 'linear'] as const),
    beta,
    divergeThreshold,
    skipStart: expectInt('skipStart', o.skipStart ?? 10, 0),
    skipEnd: expectInt('skipEnd', o.skipEnd ?? 5, 0),
    signal: checkSignal('signal', o.signal),
  };
}

/** The learning rate of step `i` of the sweep. */
export function sweepLr(settings: Pick<LrFinderSettings, 'startLr' | 'endLr' | 'numIter' | 'mode'>, i: number): number {
  const { startLr, endLr, numIter, mode } = settings;
  const r = i / (numIter - 1);
  return mode === 'exp' ? startLr * (endLr / startLr) ** r : startLr + (endLr - startLr) * r;
}

/** The bias-corrected exponential moving average of `values` (fastai's `SmoothenValue`). */
export function smoothLosses(values: readonly number[], beta: number): number[] {
  let avg = 0;
  return values.map((v, i) => {
    avg = beta * avg + (1 - beta) * v;
    return avg / (1 - beta ** (i + 1));
  });
}

/**
 * The suggestions of a sweep: the steepest descent of `smoothed` against log(lr) (central
 * differences inside the window, one-sided at its ends) and the minimum, over the steps
 * `[skipStart, n - skipEnd)`.
 */
export function suggestLr(
  lrs: readonly number[],
  smoothed: readonly number[],
  skipStart: number,
  skipEnd: number,
): { suggestion: LrSuggestion | null; minimum: LrFinderResult['minimum'] } {
  const from = skipStart;
  const to = smoothed.length - skipEnd;
  if (to - from < 2) return { suggestion: null, minimum: null };
  const x = lrs.map((lr) => Math.log(lr));
  let steepest = -1;
  let steepestSlope = Infinity;
  let lowest = -1;
  for (let i = from; i < to; i++) {
    const lo = Math.max(from, i - 1);
    const hi = Math.min(to - 1, i + 1);
    const slope = (smoothed[hi]! - smoothed[lo]!) / (x[hi]! - x[lo]!);
    if (slope < steepestSlope) {
      steepestSlope = slope;
      steepest = i;
    }
    if (lowest < 0 || smoothed[i]! < smoothed[lowest]!) lowest = i;
  }
  return {
    suggestion: steepest >= 0 ? { lr: lrs[steepest]!, index: steepest } : null,
    minimum: lowest >= 0 ? { lr: lrs[lowest]!, index: lowest, lrOverTen: lrs[lowest]! / 10 } : null,
  };
}

/** What the range test changes, to be put back afterwards. */
export interface RangeTestState {
  model: Module;
  optimizer: Optimizer<{ lr: number }>;
  scaler: GradScaler;
  loader: DataLoader;
}

/**
 * Saves everything a training step can change (see the module documentation) and returns the
 * function that puts it back, bit for bit.
 */
export function snapshotTraining(state: RangeTestState): () => void {
  const { model, optimizer, scaler, loader } = state;
  const arena = model.arena();
  const values = arena.params.toFloat32Array();
  const grads = arena.grads.toFloat32Array();
  const buffers: [Tensor, Float32Array][] = model.namedBuffers().map(([, t]) => [t, t.toFloat32Array()]);
  const counters: StateDict = new Map([...model.stateDict()].filter(([, e]) => e.dtype === 'i64'));
  const modes = model.namedModules().map(([, m]) => [m, m.training] as const);
  const optimizerState: OptimizerState = optimizer.state();
  const scalerState = scaler.state();
  const epoch = loader.epoch;
  return () => {
    arena.params.copyFromHost(values);
    arena.grads.copyFromHost(grads);
    for (const [t, data] of buffers) t.copyFromHost(data);
    model.loadStateDict(counters, { strict: false });
    for (const [m, training] of modes) m.training = training;
    scaler.abandonStep();
    optimizer.loadState(optimizerState);
    scaler.loadState(scalerState);
    loader.setEpoch(epoch);
  };
}

/** What {@link rangeTest} needs of the Trainer. */
export interface RangeTestHooks extends RangeTestState {
  device: string;
  /** Puts the model in training mode with zero gradients (after the snapshot). */
  begin(): void;
  /** One optimizer step over the micro-batches it takes from `next`; resolves to its mean loss (read from the device). */
  step(next: () => Promise<DeviceBatch>): Promise<number>;
  /** Called after each step, e.g. for a progress bar. */
  progress?(done: number, lr: number, smoothed: number): void;
}

/** The loader's batches, epoch after epoch, from its current epoch. */
async function* endless(loader: DataLoader, device: string): AsyncGenerator<DeviceBatch> {
  for (let epoch = loader.epoch; ; epoch++) yield* loaderBatches(loader, device, epoch, 0);
}

/**
 * Runs the range test through the Trainer's step (see {@link Trainer.findLr}), and restores the
 * state it changed even when it fails or is cancelled.
 */
export async function rangeTest(
  hooks: RangeTestHooks,
  settings: LrFinderSettings & { signal: AbortSignal | null },
): Promise<LrFinderResult> {
  if (hooks.loader.length === 0) {
    throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'findLr: the loader yields no batches');
  }
  const restore = snapshotTraining(hooks);
  const batches = endless(hooks.loader, hooks.device);
  const next = async (): Promise<DeviceBatch> => {
    const item = await batches.next();
    if (item.done) throw new ResnetError('ERR_RC_INTERNAL', 'findLr: the endless batch stream ended (a bug)');
    return item.value;
  };
  const lrs: number[] = [];
  const losses: number[] = [];
  const smoothedLosses: number[] = [];
  let bestLoss = Infinity;
  let diverged = false;
  let avg = 0;
  try {
    hooks.begin();
    for (let i = 0; i < settings.numIter; i++) {
      throwIfAborted(settings.signal, 'Trainer.findLr');
      const lr = sweepLr(settings, i);
      for (const group of hooks.optimizer.paramGroups) group.lr = lr;
      const loss = await hooks.step(next);
      avg = settings.beta * avg + (1 - settings.beta) * loss;
      const smoothed = avg / (1 - settings.beta ** (i + 1));
      lrs.push(lr);
      losses.push(loss);
      smoothedLosses.push(smoothed);
      if (smoothed < bestLoss) bestLoss = smoothed;
      hooks.progress?.(i + 1, lr, smoothed);
      // Let timers and signal handlers run between steps, as Trainer.fit does.
      await new Promise<void>((resume) => setImmediate(resume));
      if (Number.isNaN(smoothed) || smoothed > settings.divergeThreshold * bestLoss) {
        diverged = true;
        break;
      }
    }
  } finally {
    await batches.return(undefined);
    restore();
  }
  const { signal: _signal, ...kept } = settings;
  return {
    settings: kept,
    lrs,
    losses,
    smoothedLosses,
    bestLoss,
    diverged,
    ...suggestLr(lrs, smoothedLosses, settings.skipStart, settings.skipEnd),
  };
}

const PLOT_TITLE = 'Learning-rate range test';

/**
 * Draws the smoothed loss against the learning rate on a log axis, without the last `skipEnd`
 * steps (where the loss shoots up, as fastai's plot leaves them out), with the suggestion marked
 * by a vertical line; returns the PNG's bytes.
 */
export async function plotLrFinder(result: LrFinderResult): Promise<Buffer> {
  const end = Math.max(2, result.lrs.length - result.settings.skipEnd);
  const points = result.lrs.slice(0, end).map((lr, i) => [lr, result.smoothedLosses[i]!] as [number, number]);
  const series: Series[] = [{ name: 'smoothed loss', points }];
  const shown = points.map((p) => p[1]).filter((v) => Number.isFinite(v));
  const low = Math.min(...shown);
  const high = Math.max(...shown);
  if (result.suggestion && result.suggestion.index < end) {
    const lr = result.suggestion.lr;
    series.push({
      name: `steepest: ${lr.toPrecision(2)}`,
      points: [
        [lr, low],
        [lr, high],
      ],
    });
  }
  if (result.minimum && result.minimum.index < end) {
    const lr = result.minimum.lrOverTen;
    if (lr >= (result.lrs[0] ?? lr)) {
      series.push({
        name: `minimum/10: ${lr.toPrecision(2)}`,
        points: [
          [lr, low],
          [lr, high],
        ],
      });
    }
  }
  return plotCurves(series, {
    title: PLOT_TITLE,
    xLabel: 'learning rate',
    yLabel: 'loss',
    logX: result.settings.mode === 'exp',
  });
}

/**
 * Writes `lr-find.png` (see {@link plotLrFinder}) and `lr-find.json` (the result, every step's
 * learning rate, loss and smoothed loss) into `dir`; returns their paths.
 */
export async function writeLrFinder(result: LrFinderResult, dir: string): Promise<{ png: string; json: string }> {
  await mkdir(dir, { recursive: true });
  const png = join(dir, 'lr-find.png');
  const json = join(dir, 'lr-find.json');
  await writePng(png, await plotLrFinder(result));
  await writeFileAtomic(json, JSON.stringify(result, null, 2) + '\n');
  return { png, json };
}
