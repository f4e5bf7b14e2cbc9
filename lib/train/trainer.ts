/**
 * The Trainer: the training loop of torchvision's reference script as a class. Mixed precision with
 * a GradScaler, gradient accumulation and clipping, an exponential moving average of the weights,
 * learning-rate schedules, evaluation with top-1/top-5, a confusion matrix and a classification
 * report, checkpoints (latest, best, keep-last-k) with exact resume, early stopping, a progress
 * bar, a JSON-lines log, TensorBoard event files and PNG charts, and data-parallel gradients.
 *
 * ```ts
 * const model = ResNet50({ numClasses: 1000 }).to('cuda:0');
 * const optimizer = new SGD(parameterGroups(model, { weightDecay: 1e-4 }), { lr: 0.5, momentum: 0.9 });
 * const trainer = new Trainer({
 *   model, optimizer, amp: 'bf16', labelSmoothing: 0.1, outDir: 'runs/r50',
 *   schedule: new SequentialSchedule({ schedules: [warmup, cosine], milestones: [5], interval: 'epoch' }),
 * });
 * const result = await trainer.fit(trainLoader, { epochs: 90, val: valLoader, resume: true });
 * console.log(result.best);
 * ```
 * @packageDocumentation
 */
import { mkdir, readFile, readdir, stat, unlink } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { addon } from '../binding.js';
import type { Communicator } from '../cuda.js';
import type { DataLoader } from '../data/loader.js';
import { ResnetError, expectBool, expectInt, expectNumber, expectOneOf, expectOptions, invalid } from '../errors.js';
import { IMAGENET_MEAN, IMAGENET_STD, InputNormalize } from '../nn/input.js';
import { CrossEntropyLoss } from '../nn/loss.js';
import { Module } from '../nn/module.js';
import { GradScaler, type GradScalerOptions } from '../optim/grad-scaler.js';
import { clipGradNorm } from '../optim/clip.js';
import { Optimizer } from '../optim/optimizer.js';
import { Tensor } from '../tensor.js';
import { decodeSafetensors, loadCheckpoint, saveCheckpoint, saveWeights, writeFileAtomic, type Stateful } from './checkpoint.js';
import { ModelEma, type ModelEmaOptions } from './ema.js';
import { JsonLinesLogger, ProgressBar, formatDuration, type ProgressStream } from './outputs/logging.js';
import { ConfusionMatrix, topkCorrect } from './metrics.js';
import { plotConfusionMatrix, plotCurves, writePng, type Series } from './outputs/plots.js';
import { ReduceLROnPlateau, Schedule, Scheduler, type ReduceLROnPlateauOptions, type ReduceLROnPlateauState, type SchedulerState } from './schedules.js';
import { SummaryWriter } from './outputs/tensorboard.js';

/** Whether a monitored metric is better when lower or higher. */
export type MetricMode = 'min' | 'max';

/** When and which checkpoints {@link Trainer.fit} writes under `outDir/checkpoints`. */
export interface CheckpointPolicy {
  /** Write a checkpoint every this many epochs (and at the end of the run); default 1. */
  everyEpochs?: number;
  /** Also write one every this many optimizer steps (mid-epoch); default never. */
  everySteps?: number;
  /** Periodic checkpoints kept on disk, oldest removed first; default 3. `best.safetensors` is kept apart. */
  keepLast?: number;
  /** The metric that picks `best.safetensors`, e.g. `'val/acc1'` (default with validation data) or `'val/loss'`. */
  monitor?: string;
  /** Default: `'min'` for metrics ending in `loss`, else `'max'`. */
  mode?: MetricMode;
}

/** Options of early stopping: stop when `monitor` has not improved by `minDelta` in `patience` evaluations. */
export interface EarlyStoppingOptions {
  /** A metric name such as `'val/loss'` or `'val/acc1'`. */
  monitor: string;
  /** Evaluations without improvement before stopping (at least 1). */
  patience: number;
  /** The least change that counts as an improvement; default 0. */
  minDelta?: number;
  /** Default: `'min'` for metrics ending in `loss`, else `'max'`. */
  mode?: MetricMode;
}

/** Options of the weights' moving average; see {@link ModelEma}. */
export interface TrainerEmaOptions extends ModelEmaOptions {
  /** During the first this many optimizer steps (lr warm-up) the average copies the weights; default 0. */
  warmupSteps?: number;
}

/** What a callback's `onStepEnd` receives, once per optimizer step. */
export interface StepInfo {
  /** The epoch, from 0. */
  epoch: number;
  /** Optimizer steps taken so far (this one included). */
  step: number;
  /** The last micro-batch of this step within its epoch, from 0. */
  batch: number;
  /** Micro-batches per epoch. */
  batchesPerEpoch: number;
  /** The learning rate this step used (first parameter group). */
  lr: number;
  /** Images in this step (all micro-batches, this process). */
  images: number;
  /** This step's mean loss over its micro-batches; reading it waits for the device. */
  loss(): number;
}

/** One epoch's summary: what {@link Callback.onEpochEnd} receives and {@link FitResult.history} holds. */
export interface EpochRecord {
  /** The epoch, from 0. */
  epoch: number;
  /** Optimizer steps taken by its end. */
  step: number;
  /** Mean training loss over the epoch's micro-batches (this process). */
  trainLoss: number;
  /** The learning rate at the end of the epoch. */
  lr: number;
  /** Wall time of the epoch's training, in seconds. */
  seconds: number;
  /** Training images per second over the epoch. */
  imagesPerSec: number;
  /** Every metric of the epoch by name: `train/loss`, `val/loss`, `val/acc1`, `val/acc5`, `val_ema/…`. */
  metrics: Record<string, number>;
}

/** Hooks into the loop; every method is optional and may return a promise. */
export interface Callback {
  /** Before the first epoch (after a resume has been applied). */
  onFitBegin?(trainer: Trainer, info: { epochs: number; startEpoch: number; step: number }): void | Promise<void>;
  /** At the start of each epoch. */
  onEpochBegin?(trainer: Trainer, epoch: number): void | Promise<void>;
  /** Before each optimizer step's first micro-batch. */
  onStepBegin?(trainer: Trainer, info: { epoch: number; step: number; batch: number }): void | Promise<void>;
  /** After each optimizer step. */
  onStepEnd?(trainer: Trainer, info: StepInfo): void | Promise<void>;
  /** After each epoch, with its validation results when it was evaluated. */
  onEpochEnd?(trainer: Trainer, record: EpochRecord, evaluation: { val?: EvalResult; valEma?: EvalResult }): void | Promise<void>;
  /** When the run ends, normally or stopped. */
  onFitEnd?(trainer: Trainer, result: FitResult): void | Promise<void>;
}

/** Options of {@link Trainer}. */
export interface TrainerOptions {
  /** The model, mapping u8-normalised NHWC images to logits `[N, classes]`. */
  model: Module;
  /** The optimizer over the model's parameters (SGD, AdamW, LAMB). */
  optimizer: Optimizer<{ lr: number }>;
  /** Where to train; default the model's device, else `'cpu'`. The model is moved there. */
  device?: string;
  /** The learning-rate schedule, stepped once per optimizer step; default constant. */
  schedule?: Schedule;
  /** Reduce the lr when a metric stops improving, checked after each evaluation (excludes `schedule`). */
  plateau?: ReduceLROnPlateauOptions & { monitor?: string };
  /** Label smoothing of the cross-entropy loss; default 0. */
  labelSmoothing?: number;
  /** Mixed precision: activations in bf16 or fp16 over fp32 master weights; default false (fp32). fp16 needs CUDA. */
  amp?: 'bf16' | 'fp16' | false;
  /** Loss scaling; on by default with `amp: 'fp16'` only. `{ enabled: true }` turns it on for bf16 too. */
  gradScaler?: GradScalerOptions;
  /** Clip the gradients' total L2 norm to this (after unscaling); default no clipping. */
  clipGradNorm?: number;
  /** Micro-batches per optimizer step (gradient accumulation); default 1. */
  accumulate?: number;
  /** Keep an exponential moving average of the weights and evaluate it too; default off. */
  ema?: TrainerEmaOptions | false;
  /** Input normalisation; default the loader's `Normalize` step, else ImageNet's mean and std. */
  normalize?: { mean: readonly number[]; std: readonly number[] };
  /** Output folder: checkpoints, log.jsonl, TensorBoard events, PNGs, weights; nothing is written when absent. */
  outDir?: string;
  /** Checkpoint policy, or false for none; default `{ everyEpochs: 1, keepLast: 3 }` when `outDir` is set. */
  checkpoint?: CheckpointPolicy | false;
  /** Stop when a validation metric stops improving. */
  earlyStopping?: EarlyStoppingOptions;
  /** Hooks called in order. */
  callbacks?: Callback[];
  /** Optimizer steps between training-loss records (log, TensorBoard, progress); default 10. */
  logEvery?: number;
  /** A progress bar on stderr (true, default), on another stream, or none (false). */
  progress?: boolean | ProgressStream;
  /** Write TensorBoard event files under `outDir/tensorboard`; default true. */
  tensorboard?: boolean;
  /** Write `outDir/log.jsonl`; default true. */
  jsonLog?: boolean;
  /** Write PNG charts of the curves and the confusion matrix; default true. */
  plots?: boolean;
  /** Class names for reports; default the dataset's. */
  classNames?: readonly string[];
  /** Data-parallel training: gradients are averaged over the communicator's ranks; rank 0 writes the outputs. */
  distributed?: { communicator: Communicator };
  /** Your own JSON-serialisable description of the run (model, data, flags), kept in checkpoints. */
  config?: Record<string, unknown>;
}

/** Options of {@link Trainer.fit}. */
export interface FitOptions {
  /** Epochs to train in all (a resumed run continues to this number). */
  epochs: number;
  /** Validation data, evaluated every `evalEvery` epochs and at the end. */
  val?: DataLoader;
  /**
   * Continue a run: `true` reads `outDir/checkpoints/latest.json`; a string names a checkpoint file,
   * a `latest.json` pointer, or a folder holding one. Model, optimizer, scaler, schedule, moving
   * average, epoch, position in the epoch, best metric and early-stopping state are restored.
   */
  resume?: boolean | string;
  /** Evaluate every this many epochs; default 1. */
  evalEvery?: number;
  /**
   * Debugging: train on only the first this many batches, again every epoch, and evaluate on them
   * (a model that cannot overfit a few batches has a bug). No checkpoints are written.
   */
  overfitBatches?: number;
  /** Stop after this many optimizer steps in all (a checkpoint is written there). */
  maxSteps?: number;
}

/** What {@link Trainer.evaluate} returns. */
export interface EvalResult {
  /** Mean cross-entropy (with the trainer's label smoothing, as torchvision's reference evaluates). */
  loss: number;
  /** Top-1 accuracy, a fraction in [0, 1]. */
  acc1: number;
  /** Top-k accuracy (k = 5, or the number of classes when fewer), a fraction in [0, 1]. */
  acc5: number;
  /** Samples evaluated. */
  count: number;
  /** Rows: true class, columns: predicted class. */
  confusion: ConfusionMatrix;
  /** Per-class precision, recall, F1 and support, formatted as scikit-learn's `classification_report`. */
  report: string;
}

/** What {@link Trainer.predict} returns. */
export interface Predictions {
  /** Classes of the model's output. */
  numClasses: number;
  /** Classes reported per sample. */
  topk: number;
  /** The `topk` best classes of each sample, best first: `[n * topk]`. */
  classes: Int32Array;
  /** Their softmax probabilities: `[n * topk]`. */
  probabilities: Float32Array;
  /** All logits, `[n * numClasses]`. */
  logits: Float32Array;
  /** The dataset index of each sample (0..n-1 for a tensor). */
  indices: Int32Array;
}

/** What {@link Trainer.fit} returns. */
export interface FitResult {
  /** Epochs completed (in all, including those before a resume). */
  epochs: number;
  /** Optimizer steps taken in all. */
  steps: number;
  /** Whether early stopping ended the run. */
  stoppedEarly: boolean;
  /** Whether {@link Trainer.requestStop} or `maxSteps` ended the run before its last epoch. */
  interrupted: boolean;
  /** The best value of the checkpoint monitor, when there was one. */
  best?: { monitor: string; value: number; epoch: number };
  /** One record per epoch. */
  history: EpochRecord[];
  /** The output folder, when there is one. */
  outDir?: string;
  /** The last validation result. */
  lastEval?: EvalResult;
  /** The last validation result of the moving average. */
  lastEvalEma?: EvalResult;
}

/** What {@link Trainer.readCheckpointInfo} returns. */
export interface CheckpointInfo {
  /** The checkpoint file (a pointer or folder resolved). */
  file: string;
  /** The `config` the Trainer was given. */
  config: Record<string, unknown>;
  /** The epoch to continue at (from 0). */
  epoch: number;
  /** Optimizer steps taken. */
  step: number;
  /** The class names of the training data, when it had them. */
  classNames: string[] | null;
  /** The loop's own state (position, best, history); null in checkpoints not written by {@link Trainer.fit}. */
  run: RunState | null;
  /** What else it holds: the learning-rate state's kind, a moving average, the optimizer's group count. */
  parts: { lr: 'schedule' | 'plateau' | null; ema: boolean; optimizerGroups: number | null };
}

/** A batch as the loop uses it: device tensors plus the deferred flips. */
interface DeviceBatch {
  images: Tensor;
  labels: Tensor;
  hostLabels: Int32Array;
  flips: Uint8Array;
  size: number;
  index: number;
  indices: Int32Array;
}

/** A cached host copy of a batch (overfit mode). */
interface HostBatch {
  images: Uint8Array;
  labels: Int32Array;
  flips: Uint8Array;
  shape: readonly [number, number, number, number];
  indices: Int32Array;
}

/** The loop's state saved in a checkpoint's `extra` metadata besides the parts. */
export interface RunState {
  batch: number;
  epochs: number;
  best: { monitor: string; value: number; epoch: number } | null;
  earlyStopping: { best: number | null; bad: number } | null;
  earlyMonitor: string | null;
  history: EpochRecord[];
  trainLossPoints: [number, number][];
  periodic: string[];
  data: { trainSeed: number; trainLength: number; batchSize: number };
  config: Record<string, unknown>;
}

/** A checkpoint policy with its defaults applied. */
interface ResolvedCheckpointPolicy {
  everyEpochs: number;
  everySteps: number | null;
  keepLast: number;
  monitor: string | null;
  mode: MetricMode | null;
}

const CHECKPOINT_KEYS = ['everyEpochs', 'everySteps', 'keepLast', 'monitor', 'mode'];
const EARLY_KEYS = ['monitor', 'patience', 'minDelta', 'mode'];
const OPTION_KEYS = [
  'model', 'optimizer', 'device', 'schedule', 'plateau', 'labelSmoothing', 'amp', 'gradScaler', 'clipGradNorm', 'accumulate', 'ema',
  'normalize', 'outDir', 'checkpoint', 'earlyStopping', 'callbacks', 'logEvery', 'progress', 'tensorboard', 'jsonLog', 'plots',
  'classNames', 'distributed', 'config',
];
const FIT_KEYS = ['epochs', 'val', 'resume', 'evalEvery', 'overfitBatches', 'maxSteps'];
const METRIC_NAME = /^(train\/loss|(val|val_ema)\/(loss|acc1|acc5))$/;

function defaultMode(monitor: string): MetricMode {
  return monitor.endsWith('loss') ? 'min' : 'max';
}

function checkMonitor(where: string, monitor: unknown): string {
  if (typeof monitor !== 'string' || !METRIC_NAME.test(monitor)) {
    invalid(where, "a metric name: 'train/loss', 'val/loss', 'val/acc1', 'val/acc5', or the same under 'val_ema/'", monitor);
  }
  return monitor;
}

function improves(value: number, best: number | null, mode: MetricMode, minDelta: number): boolean {
  if (!Number.isFinite(value)) return false;
  if (best === null) return true;
  return mode === 'max' ? value > best + minDelta : value < best - minDelta;
}

function isLoader(value: unknown): value is DataLoader {
  return (
    value !== null &&
    typeof value === 'object' &&
    typeof (value as DataLoader)[Symbol.asyncIterator] === 'function' &&
    typeof (value as DataLoader).setEpoch === 'function' &&
    typeof (value as DataLoader).length === 'number'
  );
}

function stepFileName(step: number): string {
  return `step-${String(step).padStart(8, '0')}.safetensors`;
}

/**
 * Trains, evaluates and runs a classification model; see the module documentation for an example.
 *
 * Per optimizer step, with `accumulate = k`: for each of k micro-batches the loss gradient is scaled
 * by `scale / k` (scale 1 without a GradScaler), forward and backward accumulate gradients; then
 * the gradients are averaged over ranks (data-parallel), unscaled and clipped when asked, the
 * optimizer steps (skipped on the device on inf/NaN under a GradScaler), the scaler updates, the
 * gradients are zeroed, the schedule advances and the moving average updates. The last step of an
 * epoch may have fewer micro-batches. The loss is summed on the device and read only when logged.
 */
export class Trainer {
  /** The model being trained. */
  readonly model: Module;
  /** Its optimizer. */
  readonly optimizer: Optimizer<{ lr: number }>;
  /** The device everything runs on. */
  readonly device: string;
  /** The training loss (its `gradScale` is set every step). */
  readonly loss: CrossEntropyLoss;
  /** Loss scaling (disabled unless fp16 or asked for). */
  readonly scaler: GradScaler;
  /** The moving average of the weights, when enabled. */
  readonly ema: ModelEma | null;
  /** Micro-batches per optimizer step. */
  readonly accumulate: number;
  /** The activation precision. */
  readonly amp: 'bf16' | 'fp16' | false;

  readonly #o: {
    schedule: Schedule | null;
    plateau: (ReduceLROnPlateauOptions & { monitor?: string }) | null;
    clip: number | null;
    emaWarmup: number;
    normalize: { mean: readonly number[]; std: readonly number[] } | null;
    outDir: string | null;
    checkpoint: ResolvedCheckpointPolicy | null;
    early: Required<EarlyStoppingOptions> | null;
    callbacks: Callback[];
    logEvery: number;
    progress: ProgressStream | null;
    tensorboard: boolean;
    jsonLog: boolean;
    plots: boolean;
    classNames: readonly string[] | null;
    communicator: Communicator | null;
    config: Record<string, unknown>;
  };
  readonly #evalLoss: CrossEntropyLoss;
  #normalize: InputNormalize | null = null;
  #scheduler: Scheduler | null = null;
  #plateau: ReduceLROnPlateau | null = null;
  #lossSum: Tensor | null = null;
  #stepLoss: Tensor | null = null;
  #step = 0;
  #epoch = 0;
  #stopRequested = false;
  #best: { monitor: string; value: number; epoch: number } | null = null;
  #early: { best: number | null; bad: number } | null = null;
  #history: EpochRecord[] = [];
  #trainLossPoints: [number, number][] = [];
  #periodic: string[] = [];
  #logger: JsonLinesLogger | null = null;
  #writer: SummaryWriter | null = null;
  #disposed = false;
  #hasVal = false;

  constructor(options: TrainerOptions) {
    const o = expectOptions<TrainerOptions>('Trainer options', options, OPTION_KEYS);
    if (!(o.model instanceof Module)) invalid('model', 'a Module', o.model);
    if (!(o.optimizer instanceof Optimizer)) invalid('optimizer', 'an Optimizer (SGD, AdamW, LAMB)', o.optimizer);
    const model = o.model;
    const device = o.device ?? model.device ?? 'cpu';
    if (typeof device !== 'string') invalid('device', "a device name such as 'cpu' or 'cuda:0'", device);
    this.amp = o.amp === undefined || o.amp === false ? false : expectOneOf('amp', o.amp, ['bf16', 'fp16'] as const);
    if (this.amp === 'fp16' && !device.startsWith('cuda')) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `amp 'fp16' needs a CUDA device (got '${device}'); on the CPU use amp 'bf16'`);
    }
    if (o.schedule !== undefined && !(o.schedule instanceof Schedule)) invalid('schedule', 'a Schedule (e.g. CosineAnnealingLR)', o.schedule);
    if (o.schedule !== undefined && o.plateau !== undefined) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'Trainer options: give either schedule or plateau, not both (a schedule sets the lr every step and would undo the plateau reductions)');
    }
    let plateau: (ReduceLROnPlateauOptions & { monitor?: string }) | null = null;
    if (o.plateau !== undefined) {
      if (o.plateau === null || typeof o.plateau !== 'object') invalid('plateau', 'ReduceLROnPlateau options with an optional monitor', o.plateau);
      const { monitor, ...rest } = o.plateau;
      plateau = { ...rest, monitor: checkMonitor('plateau.monitor', monitor ?? 'val/loss') };
      // Validate the options now: a throwaway instance over a stand-in group.
      new ReduceLROnPlateau({ paramGroups: o.optimizer.paramGroups.map(() => ({ lr: 1 })) }, rest);
    }
    this.accumulate = expectInt('accumulate', o.accumulate ?? 1, 1);
    const clip = o.clipGradNorm === undefined ? null : expectNumber('clipGradNorm', o.clipGradNorm, 0);
    if (clip !== null && !(clip > 0)) invalid('clipGradNorm', 'a positive number', o.clipGradNorm);
    let emaOptions: TrainerEmaOptions | null = null;
    if (o.ema !== undefined && o.ema !== false) {
      const e = expectOptions<TrainerEmaOptions>('ema', o.ema, ['decay', 'every', 'warmupSteps']);
      emaOptions = e as TrainerEmaOptions;
    }
    const emaWarmup = emaOptions ? expectInt('ema.warmupSteps', emaOptions.warmupSteps ?? 0, 0) : 0;
    let normalize: { mean: readonly number[]; std: readonly number[] } | null = null;
    if (o.normalize !== undefined) {
      const n = expectOptions<{ mean: number[]; std: number[] }>('normalize', o.normalize, ['mean', 'std']);
      // InputNormalize validates the values; build one now so that bad input fails here.
      new InputNormalize({ mean: n.mean as number[], std: n.std as number[] });
      normalize = { mean: [...(n.mean as number[])], std: [...(n.std as number[])] };
    }
    const outDir = o.outDir === undefined ? null : o.outDir;
    if (outDir !== null && (typeof outDir !== 'string' || outDir.length === 0)) invalid('outDir', 'a folder path', outDir);
    let checkpoint: ResolvedCheckpointPolicy | null = null;
    if (outDir !== null && o.checkpoint !== false) {
      const c = expectOptions<CheckpointPolicy>('checkpoint', o.checkpoint ?? {}, CHECKPOINT_KEYS);
      const monitor = c.monitor === undefined ? null : checkMonitor('checkpoint.monitor', c.monitor);
      checkpoint = {
        everyEpochs: expectInt('checkpoint.everyEpochs', c.everyEpochs ?? 1, 1),
        everySteps: c.everySteps === undefined ? null : expectInt('checkpoint.everySteps', c.everySteps, 1),
        keepLast: expectInt('checkpoint.keepLast', c.keepLast ?? 3, 1),
        monitor,
        mode: c.mode === undefined ? null : expectOneOf('checkpoint.mode', c.mode, ['min', 'max'] as const),
      };
    } else if (o.checkpoint !== undefined && o.checkpoint !== false) {
      expectOptions<CheckpointPolicy>('checkpoint', o.checkpoint, CHECKPOINT_KEYS);
    }
    let early: Required<EarlyStoppingOptions> | null = null;
    if (o.earlyStopping !== undefined) {
      const e = expectOptions<EarlyStoppingOptions>('earlyStopping', o.earlyStopping, EARLY_KEYS);
      const monitor = checkMonitor('earlyStopping.monitor', e.monitor);
      early = {
        monitor,
        patience: expectInt('earlyStopping.patience', e.patience, 1),
        minDelta: expectNumber('earlyStopping.minDelta', e.minDelta ?? 0, 0),
        mode: e.mode === undefined ? defaultMode(monitor) : expectOneOf('earlyStopping.mode', e.mode, ['min', 'max'] as const),
      };
    }
    const callbacks = o.callbacks ?? [];
    if (!Array.isArray(callbacks) || callbacks.some((c) => c === null || typeof c !== 'object')) invalid('callbacks', 'an array of callback objects', callbacks);
    let progress: ProgressStream | null;
    if (o.progress === undefined || o.progress === true) progress = process.stderr;
    else if (o.progress === false) progress = null;
    else if (typeof o.progress === 'object' && o.progress !== null && typeof o.progress.write === 'function') progress = o.progress;
    else progress = invalid('progress', 'a boolean or a writable stream', o.progress);
    const classNames = o.classNames === undefined ? null : o.classNames;
    if (classNames !== null && (!Array.isArray(classNames) || classNames.some((c) => typeof c !== 'string'))) invalid('classNames', 'an array of strings', classNames);
    let communicator: Communicator | null = null;
    if (o.distributed !== undefined) {
      const d = expectOptions<{ communicator: Communicator }>('distributed', o.distributed, ['communicator']);
      const c = d.communicator as Communicator | undefined;
      if (!c || typeof c.allReduce !== 'function' || typeof c.rank !== 'number') invalid('distributed.communicator', 'a Communicator', c);
      communicator = c;
    }
    const config = o.config ?? {};
    if (config === null || typeof config !== 'object' || Array.isArray(config)) invalid('config', 'a plain JSON object', config);
    try {
      JSON.stringify(config);
    } catch (error) {
      invalid('config', `a JSON-serialisable object (${(error as Error).message})`, config);
    }

    this.#o = {
      schedule: o.schedule ?? null,
      plateau,
      clip,
      emaWarmup,
      normalize,
      outDir: outDir === null ? null : resolve(outDir),
      checkpoint,
      early,
      callbacks,
      logEvery: expectInt('logEvery', o.logEvery ?? 10, 1),
      progress,
      tensorboard: expectBool('tensorboard', o.tensorboard ?? true),
      jsonLog: expectBool('jsonLog', o.jsonLog ?? true),
      plots: expectBool('plots', o.plots ?? true),
      classNames,
      communicator,
      config: config as Record<string, unknown>,
    };
    const gradScaler = o.gradScaler === undefined ? {} : o.gradScaler;
    if (gradScaler === null || typeof gradScaler !== 'object') invalid('gradScaler', 'GradScaler options', gradScaler);
    this.scaler = new GradScaler({ ...gradScaler, enabled: gradScaler.enabled ?? this.amp === 'fp16' });

    this.model = model.device === device ? model : model.to(device);
    this.optimizer = o.optimizer;
    // The optimizer's parameters must live in the model's arena.
    if (this.optimizer.arena() !== this.model.arena()) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', "Trainer: the optimizer's parameters do not belong to this model");
    }
    this.device = device;
    const labelSmoothing = expectNumber('labelSmoothing', o.labelSmoothing ?? 0, 0, 1);
    this.loss = new CrossEntropyLoss({ labelSmoothing });
    this.#evalLoss = new CrossEntropyLoss({ labelSmoothing });
    this.ema = emaOptions ? new ModelEma(this.model, { ...(emaOptions.decay !== undefined ? { decay: emaOptions.decay } : {}), ...(emaOptions.every !== undefined ? { every: emaOptions.every } : {}) }) : null;
  }

  /** Optimizer steps taken (restored by a resume). */
  get stepCount(): number {
    return this.#step;
  }

  /** The epoch being trained, or the next one between epochs (from 0). */
  get epoch(): number {
    return this.#epoch;
  }

  /** The learning rate of the first parameter group. */
  get lr(): number {
    return this.optimizer.paramGroups[0]?.lr ?? 0;
  }

  /** Whether this process writes outputs (rank 0, or not distributed). */
  get isMain(): boolean {
    return (this.#o.communicator?.rank ?? 0) === 0;
  }

  /**
   * Asks {@link Trainer.fit} to stop after the current optimizer step, writing a checkpoint there
   * (e.g. from a SIGINT handler: the loop yields to the event loop after every step).
   */
  requestStop(): void {
    this.#stopRequested = true;
  }

  /**
   * Reads the config, epoch and step recorded in a checkpoint written by {@link Trainer.fit},
   * without building anything (to rebuild the model before evaluating or resuming).
   */
  static async readCheckpointInfo(path: string): Promise<CheckpointInfo> {
    const file = await resolveCheckpointPath(path);
    const bytes = await readFile(file).catch((error: Error) => {
      throw new ResnetError('ERR_RC_CHECKPOINT', `${file}: cannot be read (${error.message})`);
    });
    const { metadata } = decodeSafetensors(bytes, file);
    if (metadata.format !== 'resnet-cuda-checkpoint') throw new ResnetError('ERR_RC_CHECKPOINT', `${file}: is not a resnet-cuda checkpoint`);
    let progress: { epoch: number; step: number };
    let extra: { run?: RunState; classNames?: string[] };
    let lr: { kind?: string } | null;
    let optimizer: { paramGroups?: unknown[] } | null;
    try {
      progress = JSON.parse(metadata.progress ?? '{}') as { epoch: number; step: number };
      extra = JSON.parse(metadata.extra ?? '{}') as { run?: RunState; classNames?: string[] };
      lr = metadata.scheduler === undefined ? null : (JSON.parse(metadata.scheduler) as { kind?: string });
      optimizer = metadata.optimizer === undefined ? null : (JSON.parse(metadata.optimizer) as { paramGroups?: unknown[] });
    } catch {
      throw new ResnetError('ERR_RC_CHECKPOINT', `${file}: has unreadable metadata`);
    }
    return {
      file,
      config: extra.run?.config ?? {},
      epoch: progress.epoch,
      step: progress.step,
      classNames: extra.classNames ?? null,
      run: extra.run ?? null,
      parts: {
        lr: lr?.kind === 'schedule' || lr?.kind === 'plateau' ? lr.kind : null,
        ema: metadata.ema !== undefined,
        optimizerGroups: Array.isArray(optimizer?.paramGroups) ? optimizer.paramGroups.length : null,
      },
    };
  }

  /** Trains for `options.epochs` epochs on `train`; see {@link FitOptions}. */
  async fit(train: DataLoader, options: FitOptions): Promise<FitResult> {
    this.#checkAlive();
    // A stop requested from here on (even while a checkpoint is read) ends this run.
    this.#stopRequested = false;
    const f = expectOptions<FitOptions>('fit options', options, FIT_KEYS);
    if (!isLoader(train)) invalid('train', 'a DataLoader', train);
    const epochs = expectInt('epochs', f.epochs, 1);
    const val = f.val;
    if (val !== undefined && !isLoader(val)) invalid('val', 'a DataLoader', val);
    const evalEvery = expectInt('evalEvery', f.evalEvery ?? 1, 1);
    const overfit = f.overfitBatches === undefined ? null : expectInt('overfitBatches', f.overfitBatches, 1);
    const maxSteps = f.maxSteps === undefined ? null : expectInt('maxSteps', f.maxSteps, 1);
    if (f.resume !== undefined && typeof f.resume !== 'boolean' && typeof f.resume !== 'string') invalid('resume', 'a boolean or a checkpoint path', f.resume);
    if (f.resume === true && this.#o.outDir === null) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'fit: resume: true reads the latest checkpoint of outDir, but the Trainer has no outDir; pass the checkpoint path instead');
    }
    if (overfit !== null && f.resume) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'fit: overfitBatches (a debugging run) cannot resume a checkpoint');
    const hasVal = val !== undefined || overfit !== null;
    this.#hasVal = hasVal;
    for (const [where, monitor] of [
      ['checkpoint.monitor', this.#o.checkpoint?.monitor],
      ['earlyStopping.monitor', this.#o.early?.monitor],
      ['plateau.monitor', this.#o.plateau?.monitor],
    ] as const) {
      if (!monitor) continue;
      if (monitor.startsWith('val') && !hasVal) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `fit: ${where} is '${monitor}' but no validation data (val) was given`);
      if (monitor.startsWith('train') && this.#o.communicator && this.#o.communicator.worldSize > 1) {
        throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `fit: ${where} is '${monitor}', which differs between ranks in data-parallel training; monitor a val/ metric (evaluation combines all ranks)`);
      }
      if (monitor.startsWith('val_ema') && !this.ema) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `fit: ${where} is '${monitor}' but the moving average (ema) is off`);
    }
    const classNames = this.#o.classNames ?? (train.dataset.classes.length > 0 ? train.dataset.classes : null);
    this.#ensureNormalize(train);

    // Host copies of the first batches, for the overfit debugging mode.
    let cached: HostBatch[] | null = null;
    if (overfit !== null) cached = await this.#cacheBatches(train, overfit);
    const batchesPerEpoch = cached ? cached.length : train.length;
    if (batchesPerEpoch === 0) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'fit: the training loader yields no batches (empty dataset, or dropLast with fewer samples than a batch)');
    const stepsPerEpoch = Math.ceil(batchesPerEpoch / this.accumulate);
    if (this.#o.schedule && !this.#scheduler) this.#scheduler = new Scheduler(this.optimizer, this.#o.schedule, { stepsPerEpoch });
    if (this.#o.plateau && !this.#plateau) {
      const { monitor, ...rest } = this.#o.plateau;
      this.#plateau = new ReduceLROnPlateau(this.optimizer, { ...rest, mode: rest.mode ?? defaultMode(monitor!) });
    }
    const monitor = this.#o.checkpoint?.monitor ?? (hasVal ? 'val/acc1' : null);
    const monitorMode = this.#o.checkpoint?.mode ?? (monitor ? defaultMode(monitor) : 'max');
    if (this.#o.early && !this.#early) this.#early = { best: null, bad: 0 };

    const writes = this.isMain && this.#o.outDir !== null;
    const ckptDir = this.#o.outDir === null ? null : join(this.#o.outDir, 'checkpoints');
    if (writes) {
      await mkdir(ckptDir!, { recursive: true });
      if (this.#o.jsonLog && !this.#logger) this.#logger = new JsonLinesLogger(join(this.#o.outDir!, 'log.jsonl'));
      if (this.#o.tensorboard && !this.#writer) this.#writer = new SummaryWriter(join(this.#o.outDir!, 'tensorboard'));
    }
    let startBatch = 0;
    if (f.resume) startBatch = await this.#resume(f.resume, train);
    const canCheckpoint = writes && this.#o.checkpoint !== null && cached === null;
    const runState = (batch: number): RunState => ({
      batch,
      epochs,
      best: this.#best,
      earlyStopping: this.#early,
      earlyMonitor: this.#o.early?.monitor ?? null,
      history: this.#history,
      trainLossPoints: this.#trainLossPoints,
      periodic: this.#periodic,
      data: { trainSeed: train.seed, trainLength: train.dataset.length, batchSize: train.batchSize },
      config: this.#o.config,
    });
    let lastCheckpointStep = -1;
    const writeCheckpoint = async (epoch: number, batch: number): Promise<void> => {
      if (!canCheckpoint || lastCheckpointStep === this.#step) return;
      const name = stepFileName(this.#step);
      const path = join(ckptDir!, name);
      await this.#save(path, epoch, runState(batch), classNames);
      lastCheckpointStep = this.#step;
      if (!this.#periodic.includes(name)) this.#periodic.push(name);
      await writeFileAtomic(join(ckptDir!, 'latest.json'), JSON.stringify({ file: name, epoch, batch, step: this.#step }, null, 2) + '\n');
      this.#log({ type: 'checkpoint', epoch, step: this.#step, file: `checkpoints/${name}` });
      while (this.#periodic.length > this.#o.checkpoint!.keepLast) {
        const old = this.#periodic.shift()!;
        await unlink(join(ckptDir!, old)).catch(() => undefined);
      }
    };

    const callbacks = this.#o.callbacks;
    const startEpoch = this.#epoch;
    for (const c of callbacks) await c.onFitBegin?.(this, { epochs, startEpoch, step: this.#step });
    let stoppedEarly = false;
    let interrupted = false;
    let lastEval: EvalResult | undefined;
    let lastEvalEma: EvalResult | undefined;
    this.#lossSum ??= Tensor.zeros([1], { device: this.device });
    this.#stepLoss ??= Tensor.zeros([1], { device: this.device });
    const lossSum = this.#lossSum;
    const stepLoss = this.#stepLoss;
    this.model.train();
    this.scaler.abandonStep();
    this.optimizer.zeroGrad();
    try {
      for (let epoch = this.#epoch; epoch < epochs; epoch++) {
        // A stop asked for between steps (during evaluation, a checkpoint, a callback) or a step
        // budget already spent ends the run before the next step.
        if (this.#stopRequested || (maxSteps !== null && this.#step >= maxSteps)) {
          interrupted = true;
          break;
        }
        this.#epoch = epoch;
        for (const c of callbacks) await c.onEpochBegin?.(this, epoch);
        const bar = this.isMain && this.#o.progress ? new ProgressBar({ total: batchesPerEpoch, stream: this.#o.progress, label: 'train', batchSize: train.batchSize }) : null;
        const epochStart = performance.now();
        let windowStart = epochStart;
        let windowImages = 0;
        let windowBatches = 0;
        let epochLoss = 0;
        let epochBatches = 0;
        let epochImages = 0;
        let lastLoss: number | undefined;
        let micro = 0;
        let stepImages = 0;
        // The lr the last optimizer step used (the schedule has already moved on to the next one).
        let windowLr = this.lr;
        addon().fill({ tensor: lossSum.raw, value: 0 });
        const first = epoch === startEpoch ? startBatch : 0;
        startBatch = 0;
        const readWindow = (): void => {
          if (windowBatches === 0) return;
          const total = lossSum.item();
          addon().fill({ tensor: lossSum.raw, value: 0 });
          lastLoss = total / windowBatches;
          epochLoss += total;
          epochBatches += windowBatches;
          const now = performance.now();
          const ips = (windowImages * 1000) / Math.max(now - windowStart, 1e-6);
          this.#trainLossPoints.push([this.#step, lastLoss]);
          this.#log({ type: 'train', epoch, step: this.#step, loss: lastLoss, lr: windowLr, imagesPerSec: ips });
          this.#scalar('train/loss', lastLoss);
          this.#scalar('train/lr', windowLr);
          this.#scalar('train/images_per_sec', ips);
          windowStart = now;
          windowImages = 0;
          windowBatches = 0;
        };
        let reachedEnd = true;
        for await (const batch of this.#batches(train, cached, epoch, first)) {
          if (micro === 0) {
            for (const c of callbacks) await c.onStepBegin?.(this, { epoch, step: this.#step + 1, batch: batch.index });
            addon().fill({ tensor: stepLoss.raw, value: 0 });
          }
          const groupSize = Math.min(this.accumulate, batchesPerEpoch - (batch.index - micro));
          this.scaler.scale(this.loss, 1 / groupSize);
          const logits = this.model.forward(this.#normalize!.forward(batch.images, batch.flips));
          const value = this.loss.forward(logits, batch.labels);
          addon().add({ a: lossSum.raw, b: value.raw, out: lossSum.raw });
          addon().add({ a: stepLoss.raw, b: value.raw, out: stepLoss.raw });
          this.model.backward(this.loss.backward());
          micro++;
          stepImages += batch.size;
          windowBatches++;
          if (micro < groupSize) continue;

          const lr = this.lr;
          this.#optimizerStep();
          this.#step++;
          windowImages += stepImages;
          epochImages += stepImages;
          let stepLossValue: number | undefined;
          let current = true;
          const info: StepInfo = {
            epoch,
            step: this.#step,
            batch: batch.index,
            batchesPerEpoch,
            lr,
            images: stepImages,
            loss: () => {
              if (stepLossValue === undefined) {
                if (!current) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'StepInfo.loss(): read it during onStepEnd; the step is over');
                stepLossValue = stepLoss.item() / groupSize;
              }
              return stepLossValue;
            },
          };
          windowLr = lr;
          micro = 0;
          stepImages = 0;
          if (this.#step % this.#o.logEvery === 0) readWindow();
          bar?.update(batch.index + 1, { epoch: epoch + 1, epochs, lr: this.lr, ...(lastLoss !== undefined ? { loss: lastLoss } : {}) });
          for (const c of callbacks) await c.onStepEnd?.(this, info);
          current = false;
          // Let timers and signal handlers run between steps even when no batch waited on I/O.
          await new Promise<void>((resume) => setImmediate(resume));
          const atEnd = batch.index + 1 >= batchesPerEpoch;
          if (!atEnd && this.#o.checkpoint?.everySteps && this.#step % this.#o.checkpoint.everySteps === 0) await writeCheckpoint(epoch, batch.index + 1);
          if ((maxSteps !== null && this.#step >= maxSteps) || this.#stopRequested) {
            if (!atEnd) {
              interrupted = true;
              reachedEnd = false;
              readWindow();
              bar?.finish();
              await writeCheckpoint(epoch, batch.index + 1);
              break;
            }
            interrupted = epoch + 1 < epochs;
          }
        }
        if (!reachedEnd) break;
        if (micro > 0) {
          throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `fit: the training loader yielded fewer batches than its length (${batchesPerEpoch}) in epoch ${epoch}; check its sampler's length`);
        }
        readWindow();
        const seconds = (performance.now() - epochStart) / 1000;
        bar?.finish({ ...(lastLoss !== undefined ? { loss: lastLoss } : {}), lr: this.lr });
        const trainLoss = epochBatches > 0 ? epochLoss / epochBatches : NaN;
        const metrics: Record<string, number> = { 'train/loss': trainLoss };
        const evaluation: { val?: EvalResult; valEma?: EvalResult } = {};
        const last = epoch + 1 === epochs || interrupted;
        if (hasVal && ((epoch + 1) % evalEvery === 0 || last)) {
          const source = cached ? { cached } : { loader: val! };
          lastEval = await this.#evaluate(source, classNames, 'val');
          evaluation.val = lastEval;
          Object.assign(metrics, { 'val/loss': lastEval.loss, 'val/acc1': lastEval.acc1, 'val/acc5': lastEval.acc5 });
          if (this.ema) {
            this.ema.swap();
            try {
              lastEvalEma = await this.#evaluate(source, classNames, 'val_ema');
            } finally {
              this.ema.swap();
            }
            evaluation.valEma = lastEvalEma;
            Object.assign(metrics, { 'val_ema/loss': lastEvalEma.loss, 'val_ema/acc1': lastEvalEma.acc1, 'val_ema/acc5': lastEvalEma.acc5 });
          }
          this.model.train();
        }
        const record: EpochRecord = { epoch, step: this.#step, trainLoss, lr: this.lr, seconds, imagesPerSec: epochImages / Math.max(seconds, 1e-9), metrics };
        this.#history.push(record);
        this.#log({ type: 'epoch', ...record });
        for (const [name, value] of Object.entries(metrics)) if (name !== 'train/loss') this.#scalar(name, value);
        this.#scalar('epoch/train_loss', trainLoss);
        if (this.isMain && this.#o.progress) {
          const parts = [`epoch ${epoch + 1}/${epochs}`, `train loss ${trainLoss.toFixed(4)}`];
          if (evaluation.val) parts.push(`val loss ${evaluation.val.loss.toFixed(4)}`, `acc@1 ${(100 * evaluation.val.acc1).toFixed(2)}%`, `acc@5 ${(100 * evaluation.val.acc5).toFixed(2)}%`);
          if (evaluation.valEma) parts.push(`ema acc@1 ${(100 * evaluation.valEma.acc1).toFixed(2)}%`);
          parts.push(formatDuration(seconds));
          this.#o.progress.write(parts.join('  ') + '\n');
        }
        // Reduce on plateau, best checkpoint and early stopping look at this epoch's metrics.
        if (this.#plateau) {
          const v = metrics[this.#o.plateau!.monitor!];
          if (v !== undefined && this.#plateau.step(v)) this.#log({ type: 'lr-reduced', epoch, step: this.#step, lr: this.lr });
        }
        let isBest = false;
        if (monitor && metrics[monitor] !== undefined && improves(metrics[monitor]!, this.#best?.value ?? null, monitorMode, 0)) {
          this.#best = { monitor, value: metrics[monitor]!, epoch };
          isBest = true;
        }
        if (this.#o.early && this.#early && metrics[this.#o.early.monitor] !== undefined) {
          const v = metrics[this.#o.early.monitor]!;
          if (improves(v, this.#early.best, this.#o.early.mode, this.#o.early.minDelta)) this.#early = { best: v, bad: 0 };
          else this.#early = { best: this.#early.best, bad: this.#early.bad + 1 };
          if (this.#early.bad >= this.#o.early.patience) stoppedEarly = true;
        }
        this.#epoch = epoch + 1;
        const end = last || stoppedEarly;
        if ((epoch + 1) % (this.#o.checkpoint?.everyEpochs ?? 1) === 0 || end) await writeCheckpoint(epoch + 1, 0);
        if (isBest && canCheckpoint) {
          await this.#save(join(ckptDir!, 'best.safetensors'), epoch + 1, runState(0), classNames);
          const bestWeights = monitor!.startsWith('val_ema') && this.ema ? this.ema.stateDict() : this.model.stateDict();
          await saveWeights(join(this.#o.outDir!, 'model-best.safetensors'), bestWeights);
          await writeFileAtomic(join(ckptDir!, 'best.json'), JSON.stringify({ ...this.#best, step: this.#step }, null, 2) + '\n');
        }
        if (writes && this.#o.plots) await this.#writeCurves();
        for (const c of callbacks) await c.onEpochEnd?.(this, record, evaluation);
        if (stoppedEarly) {
          this.#log({ type: 'early-stop', epoch, step: this.#step, monitor: this.#o.early!.monitor, best: this.#early!.best });
          if (this.isMain && this.#o.progress) this.#o.progress.write(`early stopping: ${this.#o.early!.monitor} has not improved for ${this.#o.early!.patience} evaluations\n`);
          break;
        }
        if (interrupted) break;
        if (this.#stopRequested && epoch + 1 < epochs) {
          interrupted = true;
          break;
        }
      }
      if (writes) await this.#writeFinal(lastEval, lastEvalEma, classNames);
    } finally {
      await this.#writer?.flush().catch(() => undefined);
    }
    const result: FitResult = {
      epochs: this.#epoch,
      steps: this.#step,
      stoppedEarly,
      interrupted,
      history: [...this.#history],
      ...(this.#best ? { best: { ...this.#best } } : {}),
      ...(this.#o.outDir ? { outDir: this.#o.outDir } : {}),
      ...(lastEval ? { lastEval } : {}),
      ...(lastEvalEma ? { lastEvalEma } : {}),
    };
    for (const c of callbacks) await c.onFitEnd?.(this, result);
    return result;
  }

  /**
   * Evaluates the model (or, with `ema: true`, its moving average) on `loader`: loss, top-1, top-5,
   * confusion matrix and classification report. Data-parallel runs combine every rank's counts.
   */
  async evaluate(loader: DataLoader, options: { ema?: boolean } = {}): Promise<EvalResult> {
    this.#checkAlive();
    if (!isLoader(loader)) invalid('loader', 'a DataLoader', loader);
    const o = expectOptions<{ ema?: boolean }>('evaluate options', options, ['ema']);
    const useEma = expectBool('ema', o.ema ?? false);
    if (useEma && !this.ema) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'evaluate: ema: true, but the Trainer keeps no moving average (ema option)');
    this.#ensureNormalize(loader);
    const names = this.#o.classNames ?? (loader.dataset.classes.length > 0 ? loader.dataset.classes : null);
    const wasTraining = this.model.training;
    if (useEma) this.ema!.swap();
    try {
      return await this.#evaluate({ loader }, names, useEma ? 'val_ema' : 'val');
    } finally {
      if (useEma) this.ema!.swap();
      this.model.train(wasTraining);
    }
  }

  /**
   * Runs the model in evaluation mode and returns the `topk` best classes of every sample with
   * their probabilities. `source` is a DataLoader (in its order) or a u8 NHWC image tensor
   * `[N, H, W, 3]` (normalised like the training input).
   */
  async predict(source: DataLoader | Tensor, options: { topk?: number } = {}): Promise<Predictions> {
    this.#checkAlive();
    const o = expectOptions<{ topk?: number }>('predict options', options, ['topk']);
    const topkWanted = expectInt('topk', o.topk ?? 5, 1);
    const wasTraining = this.model.training;
    this.model.eval();
    const chunks: { logits: Float32Array; indices: Int32Array }[] = [];
    let numClasses = 0;
    try {
      if (source instanceof Tensor) {
        if (source.dtype !== 'u8' || source.shape.length !== 4) invalid('source', 'a u8 NHWC image tensor [N, H, W, 3] or a DataLoader', source);
        this.#ensureNormalize(null);
        const images = source.device === this.device ? source : Tensor.from(source.toArray() as Uint8Array, source.shape, { dtype: 'u8', device: this.device });
        let logits: Float32Array;
        try {
          logits = this.model.forward(this.#normalize!.forward(images)).toFloat32Array();
        } finally {
          if (images !== source) images.dispose();
        }
        numClasses = logits.length / source.shape[0]!;
        chunks.push({ logits, indices: Int32Array.from({ length: source.shape[0]! }, (_, i) => i) });
      } else if (isLoader(source)) {
        this.#ensureNormalize(source);
        for await (const batch of this.#batches(source, null, source.epoch, 0)) {
          const logits = this.model.forward(this.#normalize!.forward(batch.images, batch.flips)).toFloat32Array();
          numClasses = logits.length / batch.size;
          chunks.push({ logits, indices: batch.indices });
        }
      } else {
        invalid('source', 'a DataLoader or a u8 NHWC image tensor', source);
      }
    } finally {
      this.model.train(wasTraining);
    }
    const n = chunks.reduce((a, c) => a + c.indices.length, 0);
    const topk = Math.min(topkWanted, Math.max(numClasses, 1));
    const logits = new Float32Array(n * numClasses);
    const indices = new Int32Array(n);
    let at = 0;
    for (const c of chunks) {
      logits.set(c.logits, at * numClasses);
      indices.set(c.indices, at);
      at += c.indices.length;
    }
    const classes = new Int32Array(n * topk);
    const probabilities = new Float32Array(n * topk);
    const order = new Array<number>(numClasses);
    for (let s = 0; s < n; s++) {
      const row = logits.subarray(s * numClasses, (s + 1) * numClasses);
      let max = -Infinity;
      for (const v of row) if (v > max) max = v;
      let sum = 0;
      for (const v of row) sum += Math.exp(v - max);
      for (let c = 0; c < numClasses; c++) order[c] = c;
      order.sort((a, b) => row[b]! - row[a]! || a - b);
      for (let j = 0; j < topk; j++) {
        classes[s * topk + j] = order[j]!;
        probabilities[s * topk + j] = Math.exp(row[order[j]!]! - max) / sum;
      }
    }
    return { numClasses, topk, classes, probabilities, logits, indices };
  }

  /** Closes the log files and frees the trainer's device state (the model and optimizer stay). */
  async dispose(): Promise<void> {
    if (this.#disposed) return;
    this.#disposed = true;
    this.#logger?.close();
    this.#logger = null;
    this.loss.dispose();
    this.#evalLoss.dispose();
    this.scaler.dispose();
    this.ema?.dispose();
    this.#normalize?.dispose();
    this.#normalize = null;
    this.#lossSum?.dispose();
    this.#stepLoss?.dispose();
    this.#lossSum = this.#stepLoss = null;
    const writer = this.#writer;
    this.#writer = null;
    await writer?.close();
  }

  #checkAlive(): void {
    if (this.#disposed) throw new ResnetError('ERR_RC_DISPOSED', 'This Trainer has been disposed');
  }

  #ensureNormalize(loader: DataLoader | null): void {
    if (this.#normalize) return;
    const stats = this.#o.normalize ?? loader?.normalization() ?? { mean: IMAGENET_MEAN, std: IMAGENET_STD };
    this.#normalize = new InputNormalize({ mean: [...stats.mean], std: [...stats.std], dtype: this.amp === 'bf16' ? 'bf16' : this.amp === 'fp16' ? 'f16' : 'f32' });
  }

  /** Averages gradients over ranks, unscales, clips, steps, updates the scaler, zeroes, schedules, averages weights. */
  #optimizerStep(): void {
    try {
      this.#optimizerStepUnguarded();
    } catch (error) {
      // Leave nothing half-done for the next step: no scaler state, no stale gradients.
      this.scaler.abandonStep();
      this.optimizer.zeroGrad();
      throw error;
    }
  }

  #optimizerStepUnguarded(): void {
    const communicator = this.#o.communicator;
    if (communicator && communicator.worldSize > 1) communicator.allReduce(this.optimizer.arena().grads, { average: true });
    if (this.#o.clip !== null) {
      this.scaler.unscale(this.optimizer);
      clipGradNorm(this.model, this.#o.clip);
    }
    this.scaler.step(this.optimizer);
    this.scaler.update();
    this.optimizer.zeroGrad();
    this.#scheduler?.step();
    if (this.ema) {
      this.ema.update();
      if (this.#step + 1 <= this.#o.emaWarmup) this.ema.reset();
    }
  }

  /** Yields device batches from a loader (skipping the first `first`) or from cached host batches. */
  async *#batches(loader: DataLoader | null, cached: HostBatch[] | null, epoch: number, first: number): AsyncGenerator<DeviceBatch> {
    if (cached) {
      const tensors = new Map<string, { images: Tensor; labels: Tensor }>();
      try {
        for (let index = first; index < cached.length; index++) {
          const b = cached[index]!;
          const key = b.shape.join('x');
          let t = tensors.get(key);
          if (!t) {
            t = { images: Tensor.empty(b.shape, { dtype: 'u8', device: this.device }), labels: Tensor.empty([b.shape[0]], { dtype: 'i32', device: this.device }) };
            tensors.set(key, t);
          }
          t.images.copyFromHost(b.images);
          t.labels.copyFromHost(b.labels);
          yield { images: t.images, labels: t.labels, hostLabels: b.labels, flips: b.flips, size: b.shape[0], index, indices: b.indices };
        }
      } finally {
        for (const t of tensors.values()) {
          t.images.dispose();
          t.labels.dispose();
        }
      }
      return;
    }
    if (!loader) return;
    // A resume inside an epoch starts at its batch: the loader skips the earlier ones without
    // loading them, and the rest are those of the whole epoch.
    loader.setEpoch(epoch, first);
    for await (const batch of loader) {
      const { images, labels } = batch.toTensors(this.device);
      yield { images, labels, hostLabels: batch.labels, flips: batch.flips, size: batch.size, index: batch.index, indices: batch.indices };
    }
  }

  async #cacheBatches(loader: DataLoader, count: number): Promise<HostBatch[]> {
    const out: HostBatch[] = [];
    loader.setEpoch(0);
    for await (const batch of loader) {
      out.push({ images: batch.images.slice(), labels: batch.labels.slice(), flips: batch.flips.slice(), shape: [...batch.shape], indices: batch.indices.slice() });
      if (out.length === count) break;
    }
    return out;
  }

  async #evaluate(source: { loader: DataLoader } | { cached: HostBatch[] }, classNames: readonly string[] | null, label: string): Promise<EvalResult> {
    this.model.eval();
    const loader = 'loader' in source ? source.loader : null;
    const cached = 'cached' in source ? source.cached : null;
    let confusion: ConfusionMatrix | null = null;
    let lossTotal = 0;
    let topHits = 0;
    let count = 0;
    let k5 = 5;
    const total = cached ? cached.length : loader!.length;
    const bar = this.isMain && this.#o.progress && total > 0 ? new ProgressBar({ total, stream: this.#o.progress, label, printEvery: 0 }) : null;
    let done = 0;
    for await (const batch of this.#batches(loader, cached, loader?.epoch ?? 0, 0)) {
      const logitsTensor = this.model.forward(this.#normalize!.forward(batch.images, batch.flips));
      const lossValue = this.#evalLoss.forward(logitsTensor, batch.labels).item();
      const logits = logitsTensor.toFloat32Array();
      const numClasses = logits.length / batch.size;
      confusion ??= new ConfusionMatrix(numClasses);
      k5 = Math.min(5, numClasses);
      confusion.update(logits, batch.hostLabels);
      topHits += topkCorrect(logits, batch.hostLabels, [k5])[0]!;
      lossTotal += lossValue * batch.size;
      count += batch.size;
      bar?.update(++done);
    }
    bar?.finish();
    if (!confusion) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'evaluate: the loader yields no batches');
    const communicator = this.#o.communicator;
    if (communicator && communicator.worldSize > 1) {
      // Sum every rank's counts: the confusion matrix, the loss total, the top-k hits and the count.
      const counts = confusion.toArray().flat();
      const packed = Tensor.from([...counts, lossTotal, topHits, count], [counts.length + 3], { device: this.device });
      communicator.allReduce(packed);
      const all = packed.toFloat32Array();
      packed.dispose();
      const n = confusion.toArray().length;
      const rows: number[][] = [];
      for (let r = 0; r < n; r++) rows.push(Array.from(all.subarray(r * n, (r + 1) * n), (v) => Math.round(v)));
      confusion = ConfusionMatrix.fromArray(rows);
      lossTotal = all[n * n]!;
      topHits = Math.round(all[n * n + 1]!);
      count = Math.round(all[n * n + 2]!);
    }
    const names = classNames && classNames.length === confusion.toArray().length ? classNames : undefined;
    return {
      loss: lossTotal / count,
      acc1: confusion.accuracy(),
      acc5: topHits / count,
      count,
      confusion,
      report: confusion.classificationReport(names ? [...names] : undefined),
    };
  }

  /** Writes a full checkpoint to `path`. */
  async #save(path: string, epoch: number, run: RunState, classNames: readonly string[] | null): Promise<void> {
    const scheduler = this.#schedulerPart();
    await saveCheckpoint(
      path,
      { model: this.model, optimizer: this.optimizer, scaler: this.scaler, ...(scheduler ? { scheduler } : {}), ...(this.ema ? { ema: this.ema } : {}) },
      { epoch, step: this.#step, extra: { run, ...(classNames ? { classNames: [...classNames] } : {}) } },
    );
  }

  #schedulerPart(): Stateful | null {
    const scheduler = this.#scheduler;
    const plateau = this.#plateau;
    if (scheduler) return { state: () => ({ kind: 'schedule', state: scheduler.state() }), loadState: (s) => scheduler.loadState(checkKind<SchedulerState>(s, 'schedule')) };
    if (plateau) return { state: () => ({ kind: 'plateau', state: plateau.state() }), loadState: (s) => plateau.loadState(checkKind<ReduceLROnPlateauState>(s, 'plateau')) };
    return null;
  }

  /** Restores a checkpoint; returns the micro-batch of the epoch to continue at. */
  async #resume(resume: true | string, train: DataLoader): Promise<number> {
    const target = resume === true ? join(this.#o.outDir!, 'checkpoints') : resume;
    const file = await resolveCheckpointPath(target);
    const info = await Trainer.readCheckpointInfo(file);
    const run = info.run;
    if (!run) throw new ResnetError('ERR_RC_CHECKPOINT', `${file}: was not written by Trainer.fit (no run state); load it with loadCheckpoint`);
    if (run.data.trainSeed !== train.seed || run.data.trainLength !== train.dataset.length || run.data.batchSize !== train.batchSize) {
      throw new ResnetError(
        'ERR_RC_CHECKPOINT',
        `${file}: the run used training data with seed ${run.data.trainSeed}, ${run.data.trainLength} samples and batch size ${run.data.batchSize}; ` +
          `this loader has seed ${train.seed}, ${train.dataset.length} samples and batch size ${train.batchSize}. Resuming exactly needs the same data: ` +
          `create the DataLoader with seed: ${run.data.trainSeed} and the same dataset and batch size`,
      );
    }
    // Refuse a checkpoint that does not fit this Trainer before anything is restored.
    const wantLr = this.#scheduler ? 'schedule' : this.#plateau ? 'plateau' : null;
    const mismatch = (what: string): never => {
      throw new ResnetError('ERR_RC_CHECKPOINT', `${file}: ${what}; resume with the same Trainer options`);
    };
    if (info.parts.lr !== wantLr) mismatch(`its learning rate follows ${info.parts.lr === 'plateau' ? 'a plateau reduction' : info.parts.lr === 'schedule' ? 'a schedule' : 'no schedule'}, this Trainer's ${wantLr === 'plateau' ? 'a plateau reduction' : wantLr === 'schedule' ? 'a schedule' : 'none'}`);
    if (info.parts.ema !== (this.ema !== null)) mismatch(info.parts.ema ? 'it holds a moving average, but this Trainer keeps none' : 'it holds no moving average, but this Trainer keeps one');
    if (info.parts.optimizerGroups !== this.optimizer.paramGroups.length) mismatch(`its optimizer has ${info.parts.optimizerGroups} parameter groups, this one ${this.optimizer.paramGroups.length}`);
    const scheduler = this.#schedulerPart();
    const progress = await loadCheckpoint(file, {
      model: this.model,
      optimizer: this.optimizer,
      scaler: this.scaler,
      ...(scheduler ? { scheduler } : {}),
      ...(this.ema ? { ema: this.ema } : {}),
    });
    this.#step = progress.step;
    this.#epoch = progress.epoch;
    // A best value or early-stopping count kept for another metric does not carry over.
    const monitor = this.#o.checkpoint?.monitor ?? (this.#hasVal ? 'val/acc1' : null);
    this.#best = run.best && run.best.monitor === monitor ? run.best : null;
    this.#early = this.#o.early ? (run.earlyStopping && run.earlyMonitor === this.#o.early.monitor ? run.earlyStopping : { best: null, bad: 0 }) : null;
    this.#history = run.history;
    this.#trainLossPoints = run.trainLossPoints;
    // Keep-last-k continues over the files of the run being resumed when they are in this outDir.
    this.#periodic = this.#o.outDir && resolve(dirname(file)) === join(this.#o.outDir, 'checkpoints') ? [...run.periodic] : [];
    this.#log({ type: 'resume', file, epoch: progress.epoch, batch: run.batch, step: progress.step, config: info.config });
    if (this.isMain && this.#o.progress) this.#o.progress.write(`resumed from ${file} at epoch ${progress.epoch + 1}, step ${progress.step}\n`);
    return run.batch;
  }

  async #writeCurves(): Promise<void> {
    const out = this.#o.outDir!;
    const history = this.#history;
    const loss: Series[] = [{ name: 'train', points: this.#trainLossPoints }];
    const valLoss = history.filter((h) => h.metrics['val/loss'] !== undefined).map((h) => [h.step, h.metrics['val/loss']!] as [number, number]);
    if (valLoss.length > 0) loss.push({ name: 'val', points: valLoss });
    if (loss.some((s) => s.points.length > 0)) await writePng(join(out, 'curves-loss.png'), await plotCurves(loss, { title: 'Loss', xLabel: 'step', yLabel: 'loss' }));
    const acc: Series[] = [];
    for (const [name, key] of [['val top-1', 'val/acc1'], ['val top-5', 'val/acc5'], ['ema top-1', 'val_ema/acc1']] as const) {
      const points = history.filter((h) => h.metrics[key] !== undefined).map((h) => [h.epoch + 1, 100 * h.metrics[key]!] as [number, number]);
      if (points.length > 0) acc.push({ name, points });
    }
    if (acc.length > 0) await writePng(join(out, 'curves-accuracy.png'), await plotCurves(acc, { title: 'Validation accuracy', xLabel: 'epoch', yLabel: '%' }));
  }

  async #writeFinal(lastEval: EvalResult | undefined, lastEvalEma: EvalResult | undefined, classNames: readonly string[] | null): Promise<void> {
    const out = this.#o.outDir!;
    await saveWeights(join(out, 'model.safetensors'), this.model);
    if (this.ema) await saveWeights(join(out, 'model-ema.safetensors'), this.ema.stateDict());
    if (lastEval) {
      if (this.#o.plots) await writePng(join(out, 'confusion-matrix.png'), await plotConfusionMatrix(lastEval.confusion, classNames ? [...classNames] : undefined));
      let text = `loss ${lastEval.loss.toFixed(4)}  acc@1 ${(100 * lastEval.acc1).toFixed(2)}%  acc@5 ${(100 * lastEval.acc5).toFixed(2)}%  (${lastEval.count} images)\n\n${lastEval.report}`;
      if (lastEvalEma) text += `\n\nmoving average: loss ${lastEvalEma.loss.toFixed(4)}  acc@1 ${(100 * lastEvalEma.acc1).toFixed(2)}%  acc@5 ${(100 * lastEvalEma.acc5).toFixed(2)}%\n\n${lastEvalEma.report}`;
      await writeFileAtomic(join(out, 'classification-report.txt'), text + '\n');
    }
    await writeFileAtomic(
      join(out, 'summary.json'),
      JSON.stringify({ epochs: this.#epoch, steps: this.#step, best: this.#best, history: this.#history, config: this.#o.config }, null, 2) + '\n',
    );
  }

  #log(record: Record<string, unknown>): void {
    if (!this.isMain) return;
    this.#logger?.log({ time: new Date().toISOString(), ...record });
  }

  #scalar(tag: string, value: number): void {
    if (!this.isMain || !this.#writer || !Number.isFinite(value)) return;
    this.#writer.addScalar(tag, value, this.#step);
  }
}

function checkKind<S>(saved: unknown, kind: 'schedule' | 'plateau'): S {
  const s = saved as { kind?: string; state?: unknown } | null;
  if (!s || typeof s !== 'object' || s.kind !== kind) {
    throw new ResnetError('ERR_RC_CHECKPOINT', `the checkpoint's learning-rate state is of kind '${s?.kind ?? 'none'}' but this Trainer uses a ${kind === 'schedule' ? 'schedule' : 'plateau reduction'}`);
  }
  return s.state as S;
}

/** A checkpoint file from a file path, a `latest.json` pointer, or a folder holding one (or `checkpoints/latest.json`). */
async function resolveCheckpointPath(path: string): Promise<string> {
  if (typeof path !== 'string' || path.length === 0) invalid('checkpoint path', 'a file or folder path', path);
  const info = await stat(path).catch(() => null);
  if (!info) throw new ResnetError('ERR_RC_CHECKPOINT', `${path}: no such checkpoint file or folder`);
  let pointer: string | null = null;
  if (info.isDirectory()) {
    const entries = await readdir(path);
    if (entries.includes('latest.json')) pointer = join(path, 'latest.json');
    else if (entries.includes('checkpoints')) pointer = join(path, 'checkpoints', 'latest.json');
    else throw new ResnetError('ERR_RC_CHECKPOINT', `${path}: holds no latest.json checkpoint pointer`);
  } else if (path.endsWith('.json')) {
    pointer = path;
  }
  if (pointer === null) return path;
  let parsed: { file?: unknown };
  try {
    parsed = JSON.parse(await readFile(pointer, 'utf8')) as { file?: unknown };
  } catch (error) {
    throw new ResnetError('ERR_RC_CHECKPOINT', `${pointer}: cannot be read as a checkpoint pointer (${(error as Error).message})`);
  }
  if (typeof parsed.file !== 'string' || parsed.file.includes('/') || parsed.file.includes('\\')) {
    throw new ResnetError('ERR_RC_CHECKPOINT', `${pointer}: does not name a checkpoint file`);
  }
  return join(dirname(pointer), parsed.file);
}
