/**
 * The Trainer's options and `fit`'s, checked together up front with messages that name the option,
 * and resolved with their defaults.
 * @packageDocumentation
 */
import type { DataLoader } from '../data/loader.js';
import type { ProcessGroup } from '../distributed/types.js';
import { ResnetError, expectBool, expectInt, expectNumber, expectOneOf, expectOptions, invalid } from '../errors.js';
import { Module } from '../nn/module.js';
import type { GradScalerOptions } from '../optim/grad-scaler.js';
import { Optimizer } from '../optim/optimizer.js';
import { checkSignal } from './abort.js';
import { isLoader } from './batches.js';
import { parseDistillation, type DistillationOptions, type DistillationSpec } from './distillation.js';
import type { ModelEmaOptions } from './ema.js';
import { parseQatOptions, type QatOptions, type QatSettings } from './qat.js';
import { defaultMode, type EarlyStoppingSettings, type MetricMode } from './monitors.js';
import type { ProgressStream } from './outputs/logging.js';
import type { MlflowRunOptions } from './outputs/mlflow.js';
import { Schedule, type ReduceLROnPlateauOptions } from './schedules.js';
import type { Callback } from './trainer-types.js';

export type { MetricMode };

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

/**
 * Data-parallel training: one process per rank, each with its own share of the data (loaders
 * built with `distributed: { rank, worldSize }` as the group's), the gradients averaged over the
 * ranks by a `DistributedDataParallel` the Trainer builds (parameters and buffers copied from rank
 * 0 first; accumulation micro-batches without synchronisation), evaluation counts and the epoch's
 * training loss combined over the ranks, and every output (checkpoints, logs, charts, progress)
 * written by rank 0 only.
 */
export interface DistributedTrainingOptions {
  /** The group of processes (torch.distributed's default group). */
  processGroup: ProcessGroup;
  /** Replace every BatchNorm2d by a SyncBatchNorm over the group first (`--sync-bn`); default false. */
  syncBatchNorm?: boolean;
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
  /** Knowledge distillation from a teacher model: the student trains on {@link DistillationLoss}; evaluation stays plain. */
  distillation?: DistillationOptions;
  /** Mixed precision: activations in bf16 or fp16 over fp32 master weights; default false (fp32). fp16 needs CUDA. */
  amp?: 'bf16' | 'fp16' | false;
  /** Loss scaling; on by default with `amp: 'fp16'` only. `{ enabled: true }` turns it on for bf16 too. */
  gradScaler?: GradScalerOptions;
  /** Clip the gradients' total L2 norm to this (after unscaling); default no clipping. */
  clipGradNorm?: number;
  /** Micro-batches per optimizer step (gradient accumulation); default 1. */
  accumulate?: number;
  /**
   * Capture the whole training step (input conversion, forward, loss, backward, the data-parallel
   * all-reduce, loss scaling, clipping, the optimizer update with its learning rate and step count
   * on the device, gradient zeroing) as one CUDA graph after `warmup` eager steps (default 3), and
   * replay it for every later step with the next batch copied into the captured input buffers.
   * A configuration that cannot be captured trains eagerly, saying why once; see the README's
   * "CUDA graphs in the Trainer". Default false.
   */
  cudaGraph?: boolean | CudaGraphOptions;
  /** Keep an exponential moving average of the weights and evaluate it too; default off. */
  ema?: TrainerEmaOptions | false;
  /**
   * Quantization-aware training: fake-quantized weights and activations in every forward (see
   * `prepareQat`; a model already prepared is taken as it is); default off. `quantizedGraph(model)`
   * then gives the INT8 inference graph.
   */
  qat?: QatOptions | boolean;
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
  /**
   * Also track the run in an MLflow file store (`mlruns/<experiment>/<run>/`: parameters, every
   * scalar as a metric, the weights and charts as artifacts, the status at the end); `true` for
   * `mlruns` in the working folder, the "Default" experiment and the output folder's name as the
   * run's. Needs `outDir`; default false.
   */
  mlflow?: boolean | MlflowRunOptions;
  /** Class names for reports; default the dataset's. */
  classNames?: readonly string[];
  /**
   * Data-parallel training over a process group (from `initProcessGroup`); see
   * {@link DistributedTrainingOptions}.
   */
  distributed?: DistributedTrainingOptions;
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
   * Continue a run: `true` reads `outDir/checkpoints/latest.json`, and starts fresh when there is
   * none yet (a first run); a string names a checkpoint file, a `latest.json` pointer, or a folder
   * holding one. Model, optimizer, scaler, schedule, moving average, epoch, position in the epoch
   * (with the epoch's loss, time and image count so far), best metric and early-stopping state are restored.
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
  /**
   * Cancels the run: it stops at the next step boundary (no checkpoint is written; use
   * {@link Trainer.requestStop} for that) and `fit` rejects with an `AbortError` (`code` 'ABORT_ERR').
   */
  signal?: AbortSignal;
}

/** A checkpoint policy with its defaults applied. */
export interface ResolvedCheckpointPolicy {
  everyEpochs: number;
  everySteps: number | null;
  keepLast: number;
  monitor: string | null;
  mode: MetricMode | null;
}

/** Options of the Trainer's `cudaGraph`. */
export interface CudaGraphOptions {
  /** Eager steps before the step is captured (algorithm choice, buffers, the first momentum); default 3, at least 1. */
  warmup?: number;
}

/** The eager steps before the capture, or null when `cudaGraph` is off. */
function parseCudaGraph(value: unknown): number | null {
  if (value === undefined || value === false) return null;
  if (value === true) return 3;
  const o = expectOptions<CudaGraphOptions>('cudaGraph', value, ['warmup']);
  return expectInt('cudaGraph.warmup', o.warmup ?? 3, 1);
}

/** The Trainer's options, checked and with their defaults. */
export interface TrainerSettings {
  model: Module;
  optimizer: Optimizer<{ lr: number }>;
  device: string;
  amp: 'bf16' | 'fp16' | false;
  accumulate: number;
  /** Eager steps before the capture, or null without CUDA graphs. */
  cudaGraphWarmup: number | null;
  labelSmoothing: number;
  distillation: DistillationSpec | null;
  gradScaler: GradScalerOptions;
  schedule: Schedule | null;
  plateau: (ReduceLROnPlateauOptions & { monitor: string }) | null;
  clip: number | null;
  ema: ModelEmaOptions | null;
  qat: QatSettings | null;
  emaWarmup: number;
  normalize: { mean: number[]; std: number[] } | null;
  outDir: string | null;
  checkpoint: ResolvedCheckpointPolicy | null;
  early: EarlyStoppingSettings | null;
  callbacks: Callback[];
  logEvery: number;
  progress: ProgressStream | null;
  tensorboard: boolean;
  jsonLog: boolean;
  plots: boolean;
  mlflow: MlflowRunOptions | null;
  classNames: readonly string[] | null;
  processGroup: ProcessGroup | null;
  syncBatchNorm: boolean;
  config: Record<string, unknown>;
}

/** `fit`'s options, checked. */
export interface FitSettings {
  epochs: number;
  val: DataLoader | null;
  resume: true | string | null;
  evalEvery: number;
  overfit: number | null;
  maxSteps: number | null;
  signal: AbortSignal | null;
}

const CHECKPOINT_KEYS = ['everyEpochs', 'everySteps', 'keepLast', 'monitor', 'mode'];
const MLFLOW_KEYS = ['trackingDir', 'experimentName', 'runName', 'tags'];
const EARLY_KEYS = ['monitor', 'patience', 'minDelta', 'mode'];
const OPTION_KEYS = [
  'model',
  'optimizer',
  'device',
  'schedule',
  'plateau',
  'labelSmoothing',
  'distillation',
  'amp',
  'gradScaler',
  'clipGradNorm',
  'accumulate',
  'cudaGraph',
  'ema',
  'qat',
  'normalize',
  'outDir',
  'checkpoint',
  'earlyStopping',
  'callbacks',
  'logEvery',
  'progress',
  'tensorboard',
  'jsonLog',
  'plots',
  'mlflow',
  'classNames',
  'distributed',
  'config',
];
const FIT_KEYS = ['epochs', 'val', 'resume', 'evalEvery', 'overfitBatches', 'maxSteps', 'signal'];
const METRIC_NAME = /^(train\/loss|(val|val_ema)\/(loss|acc1|acc5))$/;

function checkMonitor(where: string, monitor: unknown): string {
  if (typeof monitor !== 'string' || !METRIC_NAME.test(monitor)) {
    invalid(
      where,
      "a metric name: 'train/loss', 'val/loss', 'val/acc1', 'val/acc5', or the same under 'val_ema/'",
      monitor,
    );
  }
  return monitor;
}

/** Checks the Trainer's options together (the plateau's own settings are checked by ReduceLROnPlateau). */
export function parseTrainerOptions(options: TrainerOptions): TrainerSettings {
  const o = expectOptions<TrainerOptions>('Trainer options', options, OPTION_KEYS);
  if (!(o.model instanceof Module)) invalid('model', 'a Module', o.model);
  if (!(o.optimizer instanceof Optimizer)) invalid('optimizer', 'an Optimizer (SGD, AdamW, LAMB)', o.optimizer);
  const device = o.device ?? o.model.device ?? 'cpu';
  if (typeof device !== 'string') invalid('device', "a device name such as 'cpu' or 'cuda:0'", device);
  const amp = o.amp === undefined || o.amp === false ? false : expectOneOf('amp', o.amp, ['bf16', 'fp16'] as const);
  if (amp === 'fp16' && !device.startsWith('cuda')) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `amp 'fp16' needs a CUDA device (got '${device}'); on the CPU use amp 'bf16'`,
    );
  }
  if (o.schedule !== undefined && !(o.schedule instanceof Schedule)) {
    invalid('schedule', 'a Schedule (e.g. CosineAnnealingLR)', o.schedule);
  }
  if (o.schedule !== undefined && o.plateau !== undefined) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      'Trainer options: give either schedule or plateau, not both (a schedule sets the lr every step and would undo the plateau reductions)',
    );
  }
  const clip = o.clipGradNorm === undefined ? null : expectNumber('clipGradNorm', o.clipGradNorm, 0);
  if (clip !== null && !(clip > 0)) invalid('clipGradNorm', 'a positive number', o.clipGradNorm);
  const ema =
    o.ema === undefined || o.ema === false
      ? null
      : expectOptions<TrainerEmaOptions>('ema', o.ema, ['decay', 'every', 'warmupSteps']);
  const callbacks = o.callbacks ?? [];
  if (!Array.isArray(callbacks) || callbacks.some((c) => c === null || typeof c !== 'object')) {
    invalid('callbacks', 'an array of callback objects', callbacks);
  }
  const classNames = o.classNames ?? null;
  if (classNames !== null && (!Array.isArray(classNames) || classNames.some((c) => typeof c !== 'string'))) {
    invalid('classNames', 'an array of strings', classNames);
  }
  const gradScaler = o.gradScaler ?? {};
  if (gradScaler === null || typeof gradScaler !== 'object') invalid('gradScaler', 'GradScaler options', gradScaler);
  const outDir = parseOutDir(o.outDir);
  if (ema && o.qat !== undefined && o.qat !== false) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      "Trainer options: give either qat or ema, not both (the moving average would average the observers' running ranges, which start infinite)",
    );
  }
  return {
    model: o.model,
    optimizer: o.optimizer,
    device,
    amp,
    accumulate: expectInt('accumulate', o.accumulate ?? 1, 1),
    cudaGraphWarmup: parseCudaGraph(o.cudaGraph),
    labelSmoothing: expectNumber('labelSmoothing', o.labelSmoothing ?? 0, 0, 1),
    distillation: parseDistillation(o.distillation, o.model),
    gradScaler,
    schedule: o.schedule ?? null,
    plateau: parsePlateau(o.plateau),
    clip,
    qat: o.qat === undefined || o.qat === false ? null : parseQatOptions(o.qat),
    ema: ema
      ? {
          ...(ema.decay !== undefined ? { decay: ema.decay } : {}),
          ...(ema.every !== undefined ? { every: ema.every } : {}),
        }
      : null,
    emaWarmup: ema ? expectInt('ema.warmupSteps', ema.warmupSteps ?? 0, 0) : 0,
    normalize: parseNormalize(o.normalize),
    outDir,
    checkpoint: parseCheckpointPolicy(o.checkpoint, outDir !== null),
    early: parseEarlyStopping(o.earlyStopping),
    callbacks,
    logEvery: expectInt('logEvery', o.logEvery ?? 10, 1),
    progress: parseProgress(o.progress),
    tensorboard: expectBool('tensorboard', o.tensorboard ?? true),
    jsonLog: expectBool('jsonLog', o.jsonLog ?? true),
    plots: expectBool('plots', o.plots ?? true),
    mlflow: parseMlflow(o.mlflow, outDir),
    classNames,
    ...parseDistributed(o.distributed),
    config: parseConfig(o.config),
  };
}

function parseOutDir(outDir: unknown): string | null {
  if (outDir === undefined) return null;
  if (typeof outDir !== 'string' || outDir.length === 0) invalid('outDir', 'a folder path', outDir);
  return outDir;
}

function parseMlflow(mlflow: TrainerOptions['mlflow'], outDir: string | null): MlflowRunOptions | null {
  if (mlflow === undefined || mlflow === false) return null;
  const m = mlflow === true ? {} : expectOptions<MlflowRunOptions>('mlflow', mlflow, MLFLOW_KEYS);
  if (outDir === null) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      "Trainer options: mlflow needs outDir (the run's weights and charts are its artifacts)",
    );
  }
  for (const key of ['trackingDir', 'experimentName', 'runName'] as const) {
    if (m[key] !== undefined && (typeof m[key] !== 'string' || m[key].length === 0)) {
      invalid(`mlflow.${key}`, 'a non-empty string', m[key]);
    }
  }
  return m;
}

function parsePlateau(plateau: TrainerOptions['plateau']): TrainerSettings['plateau'] {
  if (plateau === undefined) return null;
  if (plateau === null || typeof plateau !== 'object') {
    invalid('plateau', 'ReduceLROnPlateau options with an optional monitor', plateau);
  }
  const { monitor, ...rest } = plateau;
  const checked = checkMonitor('plateau.monitor', monitor ?? 'val/loss');
  return { ...rest, mode: rest.mode ?? defaultMode(checked), monitor: checked };
}

function parseNormalize(normalize: TrainerOptions['normalize']): TrainerSettings['normalize'] {
  if (normalize === undefined) return null;
  const n = expectOptions<{ mean: number[]; std: number[] }>('normalize', normalize, ['mean', 'std']);
  // InputNormalize checks the values when the Trainer builds it from these.
  if (!Array.isArray(n.mean)) invalid('normalize.mean', 'an array of numbers', n.mean);
  if (!Array.isArray(n.std)) invalid('normalize.std', 'an array of numbers', n.std);
  return { mean: [...n.mean], std: [...n.std] };
}

function parseCheckpointPolicy(
  checkpoint: TrainerOptions['checkpoint'],
  hasOutDir: boolean,
): ResolvedCheckpointPolicy | null {
  if (checkpoint === false) return null;
  const c = expectOptions<CheckpointPolicy>('checkpoint', checkpoint ?? {}, CHECKPOINT_KEYS);
  if (!hasOutDir) return null;
  return {
    everyEpochs: expectInt('checkpoint.everyEpochs', c.everyEpochs ?? 1, 1),
    everySteps: c.everySteps === undefined ? null : expectInt('checkpoint.everySteps', c.everySteps, 1),
    keepLast: expectInt('checkpoint.keepLast', c.keepLast ?? 3, 1),
    monitor: c.monitor === undefined ? null : checkMonitor('checkpoint.monitor', c.monitor),
    mode: c.mode === undefined ? null : expectOneOf('checkpoint.mode', c.mode, ['min', 'max'] as const),
  };
}

function parseEarlyStopping(early: TrainerOptions['earlyStopping']): EarlyStoppingSettings | null {
  if (early === undefined) return null;
  const e = expectOptions<EarlyStoppingOptions>('earlyStopping', early, EARLY_KEYS);
  const monitor = checkMonitor('earlyStopping.monitor', e.monitor);
  return {
    monitor,
    patience: expectInt('earlyStopping.patience', e.patience, 1),
    minDelta: expectNumber('earlyStopping.minDelta', e.minDelta ?? 0, 0),
    mode:
      e.mode === undefined ? defaultMode(monitor) : expectOneOf('earlyStopping.mode', e.mode, ['min', 'max'] as const),
  };
}

function parseProgress(progress: TrainerOptions['progress']): ProgressStream | null {
  if (progress === undefined || progress === true) return process.stderr;
  if (progress === false) return null;
  if (typeof progress === 'object' && progress !== null && typeof progress.write === 'function') return progress;
  return invalid('progress', 'a boolean or a writable stream', progress);
}

function parseDistributed(
  distributed: TrainerOptions['distributed'],
): Pick<TrainerSettings, 'processGroup' | 'syncBatchNorm'> {
  if (distributed === undefined) return { processGroup: null, syncBatchNorm: false };
  const d = expectOptions<DistributedTrainingOptions>('distributed', distributed, ['processGroup', 'syncBatchNorm']);
  const g = d.processGroup as unknown;
  if (
    g === null ||
    typeof g !== 'object' ||
    typeof (g as ProcessGroup).allReduce !== 'function' ||
    typeof (g as ProcessGroup).rank !== 'number' ||
    typeof (g as ProcessGroup).worldSize !== 'number'
  ) {
    invalid('distributed.processGroup', 'a ProcessGroup (initProcessGroup)', g);
  }
  return {
    processGroup: g as ProcessGroup,
    syncBatchNorm: expectBool('distributed.syncBatchNorm', d.syncBatchNorm ?? false),
  };
}

function parseConfig(config: unknown): Record<string, unknown> {
  const value = config ?? {};
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    invalid('config', 'a plain JSON object', value);
  }
  try {
    JSON.stringify(value);
  } catch (error) {
    invalid('config', `a JSON-serialisable object (${(error as Error).message})`, value);
  }
  return value as Record<string, unknown>;
}

/** Checks `fit`'s options, and that every monitored metric will exist in this run. */
export function parseFitOptions(
  train: unknown,
  options: FitOptions,
  trainer: { settings: TrainerSettings; hasEma: boolean },
): FitSettings {
  const f = expectOptions<FitOptions>('fit options', options, FIT_KEYS);
  if (!isLoader(train)) invalid('train', 'a DataLoader', train);
  const epochs = expectInt('epochs', f.epochs, 1);
  if (f.val !== undefined && !isLoader(f.val)) invalid('val', 'a DataLoader', f.val);
  const overfit = f.overfitBatches === undefined ? null : expectInt('overfitBatches', f.overfitBatches, 1);
  if (f.resume !== undefined && typeof f.resume !== 'boolean' && typeof f.resume !== 'string') {
    invalid('resume', 'a boolean or a checkpoint path', f.resume);
  }
  const s = trainer.settings;
  if (f.resume === true && s.outDir === null) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      'fit: resume: true reads the latest checkpoint of outDir, but the Trainer has no outDir; pass the checkpoint path instead',
    );
  }
  if (overfit !== null && f.resume) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      'fit: overfitBatches (a debugging run) cannot resume a checkpoint',
    );
  }
  const hasVal = f.val !== undefined || overfit !== null;
  for (const [where, monitor] of [
    ['checkpoint.monitor', s.checkpoint?.monitor],
    ['earlyStopping.monitor', s.early?.monitor],
    ['plateau.monitor', s.plateau?.monitor],
  ] as const) {
    if (!monitor) continue;
    if (monitor.startsWith('val') && !hasVal) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `fit: ${where} is '${monitor}' but no validation data (val) was given`,
      );
    }
    if (monitor.startsWith('val_ema') && !trainer.hasEma) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `fit: ${where} is '${monitor}' but the moving average (ema) is off`,
      );
    }
  }
  return {
    epochs,
    val: f.val ?? null,
    resume: f.resume === true ? true : typeof f.resume === 'string' ? f.resume : null,
    evalEvery: expectInt('evalEvery', f.evalEvery ?? 1, 1),
    overfit,
    maxSteps: f.maxSteps === undefined ? null : expectInt('maxSteps', f.maxSteps, 1),
    signal: checkSignal('signal', f.signal),
  };
}
