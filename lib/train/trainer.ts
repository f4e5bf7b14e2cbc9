/**
 * The Trainer: the training loop of torchvision's reference script as a class. Mixed precision with
 * a GradScaler, gradient accumulation and clipping, an exponential moving average of the weights,
 * learning-rate schedules, evaluation with top-1/top-5, a confusion matrix and a classification
 * report, checkpoints (latest, best, keep-last-k) with exact resume, early stopping, a progress
 * bar, a JSON-lines log, TensorBoard event files and PNG charts, and data-parallel gradients.
 *
 * The pieces live beside it, one job each: option checks (`trainer-options.ts`), checkpoint files
 * (`checkpoint-manager.ts`), logs and charts (`run-outputs.ts`), best metric and early stopping
 * (`monitors.ts`), the epoch's loss accounting (`epoch-meter.ts`), batches (`batches.ts`), step timing and the bottleneck report (`step-timing.ts`),
 * evaluation (`evaluation.ts`) and the data-parallel reductions (`distributed.ts`).
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
import { AsyncLocalStorage } from 'node:async_hooks';
import { join, resolve } from 'node:path';
import { addon } from '../binding.js';
import type { DataLoader } from '../data/loader.js';
import { DistributedDataParallel } from '../distributed/ddp.js';
import { convertSyncBatchNorm } from '../distributed/sync-batchnorm.js';
import type { ProcessGroup } from '../distributed/types.js';
import { ResnetError, defined, expectBool, expectInt, expectOptions, invalid } from '../errors.js';
import { IMAGENET_MEAN, IMAGENET_STD, InputNormalize } from '../nn/input.js';
import { CrossEntropyLoss } from '../nn/loss.js';
import type { Module } from '../nn/module.js';
import { clipGradNorm } from '../optim/clip.js';
import { GradScaler } from '../optim/grad-scaler.js';
import type { Optimizer } from '../optim/optimizer.js';
import { Tensor } from '../tensor.js';
import { AbortError, checkSignal, throwIfAborted } from './abort.js';
import { cacheBatches, cachedBatches, isLoader, loaderBatches, type DeviceBatch, type HostBatch } from './batches.js';
import { loadCheckpoint, saveCheckpoint, saveWeights, type CheckpointParts, type Stateful } from './checkpoint.js';
import {
  CheckpointManager,
  findResumeFile,
  readCheckpointInfo,
  type CheckpointInfo,
  type RunState,
} from './checkpoint-manager.js';
import {
  averageOverRanks,
  checkRankLoader,
  checkSameStep,
  isDistributed,
  ownSamples,
  sumEvalCounts,
} from './distributed.js';
import { Distillation } from './distillation.js';
import { ModelEma } from './ema.js';
import { startQat, type QatObserverSchedule } from './qat.js';
import { EpochMeter, type EpochProgress, type EpochTotals } from './epoch-meter.js';
import { GraphMode, type CudaGraphStats } from './graph-mode.js';
import type { StepParts } from './graph-step.js';
import { evalResult, evaluateBatches, rankPredictions, type EvalResult, type Predictions } from './evaluation.js';
import { parseLrFinderOptions, rangeTest, type LrFinderOptions, type LrFinderResult } from './lr-finder.js';
import { BestMetric, EarlyStopping, defaultMode } from './monitors.js';
import { formatDuration } from './outputs/logging.js';
import { trainingParams } from './outputs/mlflow-tracking.js';
import { RunOutputs } from './run-outputs.js';
import { ReduceLROnPlateau, Scheduler } from './schedules.js';
import { StepTiming } from './step-timing.js';
import {
  parseFitOptions,
  parseTrainerOptions,
  type FitOptions,
  type FitSettings,
  type TrainerOptions,
  type TrainerSettings,
} from './trainer-options.js';
import type { EpochRecord, FitResult, StepInfo } from './trainer-types.js';

export type { CheckpointInfo, RunState } from './checkpoint-manager.js';
export type { CudaGraphStats } from './graph-mode.js';
export type { DistillationOptions } from './distillation.js';
export type { EvalResult, Predictions } from './evaluation.js';
export type {
  CheckpointPolicy,
  CudaGraphOptions,
  DistributedTrainingOptions,
  EarlyStoppingOptions,
  FitOptions,
  MetricMode,
  TrainerEmaOptions,
  TrainerOptions,
} from './trainer-options.js';
export type { Callback, EpochRecord, FitResult, StepInfo } from './trainer-types.js';

/** What one `fit` call trains on, resolved once. */
interface FitRun extends FitSettings {
  train: DataLoader;
  cached: HostBatch[] | null;
  batchesPerEpoch: number;
  classNames: readonly string[] | null;
  /** Where a resumed run continues inside its first epoch. */
  resumeAt: { batch: number; progress: EpochProgress | null } | null;
}

/** How an epoch's training ended. */
interface TrainedEpoch {
  /** False when the run stopped inside the epoch (a checkpoint was written there). */
  complete: boolean;
  /** A stop was asked for (or the step budget spent) at the epoch's last step. */
  stopAtEnd: boolean;
  totals: EpochTotals;
}

/** The Trainer whose `fit`, `evaluate` or `predict` is running in this async context (a callback's). */
const runningIn = new AsyncLocalStorage<Trainer>();

/**
 * Trains, evaluates and runs a classification model; see the module documentation for an example.
 *
 * Per optimizer step, with `accumulate = k`: for each of k micro-batches the loss gradient is scaled
 * by `scale / k` (scale 1 without a GradScaler), forward and backward accumulate gradients; then
 * the gradients are averaged over ranks (data-parallel), unscaled and clipped when asked, the
 * optimizer steps (skipped on the device on inf/NaN under a GradScaler), the scaler updates, the
 * gradients are zeroed, the schedule advances and the moving average updates. The last step of an
 * epoch may have fewer micro-batches. The loss is summed on the device and read only when logged.
 *
 * One call at a time: a `fit`, `evaluate` or `predict` started while another runs on the same
 * Trainer is refused (`evaluate` and `predict` from a callback of the running `fit` are allowed).
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
  /** The teacher and the loss of knowledge distillation, which replaces `loss` in training when set. */
  readonly distillation: Distillation | null;
  /** Loss scaling (disabled unless fp16 or asked for). */
  readonly scaler: GradScaler;
  /** The moving average of the weights, when enabled. */
  readonly ema: ModelEma | null;
  /** Micro-batches per optimizer step. */
  readonly accumulate: number;
  /** The activation precision. */
  readonly amp: 'bf16' | 'fp16' | false;
  /** The data-parallel wrapper that averages the gradients over the ranks, when a process group was given. */
  readonly ddp: DistributedDataParallel | null;

  readonly #s: TrainerSettings;
  readonly #evalLoss: CrossEntropyLoss;
  readonly #outputs: RunOutputs;
  readonly #timing: StepTiming;
  readonly #checkpoints: CheckpointManager | null;
  readonly #plateau: ReduceLROnPlateau | null;
  readonly #early: EarlyStopping | null;
  readonly #qat: QatObserverSchedule | null;
  readonly #graphs: GraphMode | null;
  #best: BestMetric | null = null;
  #normalize: InputNormalize | null = null;
  #scheduler: Scheduler | null = null;
  #lossSum: Tensor | null = null;
  #stepLoss: Tensor | null = null;
  #step = 0;
  #epoch = 0;
  #stopRequested = false;
  /** Data-parallel stop agreement: the flag all-reduced over the ranks, one in flight, and the outcome. */
  #stopFlag: Tensor | null = null;
  #stopPending = false;
  #stopAgreed = false;
  #history: EpochRecord[] = [];
  #trainLossPoints: [number, number][] = [];
  #running: 'fit' | 'evaluate' | 'predict' | 'findLr' | null = null;
  #disposed = false;

  constructor(options: TrainerOptions) {
    const s = parseTrainerOptions(options);
    this.#s = { ...s, outDir: s.outDir === null ? null : resolve(s.outDir) };
    this.amp = s.amp;
    this.accumulate = s.accumulate;
    this.scaler = new GradScaler({ ...s.gradScaler, enabled: s.gradScaler.enabled ?? s.amp === 'fp16' });
    this.model = s.model.device === s.device ? s.model : s.model.to(s.device);
    this.optimizer = s.optimizer;
    // The optimizer's parameters must live in the model's arena.
    if (this.optimizer.arena() !== this.model.arena()) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        "Trainer: the optimizer's parameters do not belong to this model",
      );
    }
    this.device = s.device;
    this.#qat = s.qat ? startQat(this.model, s.qat) : null;
    this.ddp = s.processGroup ? this.#dataParallel(s.processGroup, s.syncBatchNorm) : null;
    this.loss = new CrossEntropyLoss({ labelSmoothing: s.labelSmoothing });
    this.#evalLoss = new CrossEntropyLoss({ labelSmoothing: s.labelSmoothing });
    this.distillation = s.distillation
      ? new Distillation(s.distillation, { device: s.device, labelSmoothing: s.labelSmoothing })
      : null;
    const { monitor: _monitor, ...plateau } = s.plateau ?? { monitor: '' };
    this.#plateau = s.plateau ? new ReduceLROnPlateau(this.optimizer, plateau) : null;
    if (s.normalize) this.#normalize = this.#makeNormalize(s.normalize);
    this.#early = s.early ? new EarlyStopping(s.early) : null;
    this.ema = s.ema ? new ModelEma(this.model, s.ema) : null;
    this.#outputs = new RunOutputs({
      outDir: this.#s.outDir,
      isMain: this.isMain,
      progress: s.progress,
      jsonLog: s.jsonLog,
      tensorboard: s.tensorboard,
      plots: s.plots,
      mlflow: s.mlflow,
    });
    this.#timing = new StepTiming(this.device, this.#outputs);
    this.#graphs =
      s.cudaGraphWarmup === null
        ? null
        : new GraphMode(s.cudaGraphWarmup, (reason) => {
            // On the progress stream when there is one (the command line), else as a process warning.
            this.#outputs.log({ type: 'cuda-graph', step: this.#step, reason });
            if (!this.isMain) return;
            if (this.#s.progress) this.#outputs.say(reason);
            else process.emitWarning(reason, { code: 'RESNET_CUDA_GRAPH' });
          });
    this.#checkpoints =
      this.isMain && this.#s.outDir !== null && s.checkpoint
        ? new CheckpointManager(this.#s.outDir, s.checkpoint.keepLast)
        : null;
  }

  /**
   * Data-parallel training: BatchNorm2d layers made SyncBatchNorm when asked, then the model
   * wrapped in a DistributedDataParallel (which copies rank 0's parameters and buffers to every rank).
   */
  #dataParallel(group: ProcessGroup, syncBatchNorm: boolean): DistributedDataParallel {
    if (!sameDevice(group.device, this.device)) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `Trainer: the process group's device is ${group.device} but the Trainer's is ${this.device}; ` +
          `train on ${group.device} (a ${group.backend} group), or create the group for ${this.device}`,
      );
    }
    if (syncBatchNorm) convertSyncBatchNorm(this.model, group);
    return new DistributedDataParallel(this.model, group);
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

  /**
   * With `cudaGraph`, what the last (or running) `fit` did: captures, replayed and eager steps, and
   * why steps ran eagerly; null without the option.
   */
  get cudaGraphStats(): CudaGraphStats | null {
    return this.#graphs?.stats ?? null;
  }

  /** Number of data-parallel ranks (1 without a process group). */
  get worldSize(): number {
    return this.#s.processGroup?.worldSize ?? 1;
  }

  /** Whether this process writes outputs (rank 0, or not distributed). */
  get isMain(): boolean {
    return (this.#s.processGroup?.rank ?? 0) === 0;
  }

  /** The process group of data-parallel training, or null. */
  get processGroup(): ProcessGroup | null {
    return this.#s.processGroup;
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
    return readCheckpointInfo(path);
  }

  /** Trains for `options.epochs` epochs on `train`; see {@link FitOptions}. */
  async fit(train: DataLoader, options: FitOptions): Promise<FitResult> {
    this.#checkAlive();
    const f = parseFitOptions(train, options, { settings: this.#s, hasEma: this.ema !== null });
    return this.#exclusive('fit', () => this.#fit(train, f));
  }

  async #fit(train: DataLoader, f: FitSettings): Promise<FitResult> {
    // A stop requested from here on (even while a checkpoint is read) ends this run.
    this.#stopRequested = false;
    this.#stopAgreed = false;
    throwIfAborted(f.signal, 'Trainer.fit');
    const run = await this.#prepare(train, f);
    const callbacks = this.#s.callbacks;
    for (const c of callbacks) {
      await c.onFitBegin?.(this, { epochs: f.epochs, startEpoch: this.#epoch, step: this.#step });
    }
    let stoppedEarly = false;
    let interrupted = false;
    let lastEval: EvalResult | undefined;
    let lastEvalEma: EvalResult | undefined;
    this.#beginTraining();
    this.#graphs?.begin(this.#graphBlocker());
    try {
      for (let epoch = this.#epoch; epoch < f.epochs; epoch++) {
        // A stop asked for between steps (during evaluation, a checkpoint, a callback) or a step
        // budget already spent ends the run before the next step.
        if (this.#shouldStop(true) || this.#stepBudgetSpent(f)) {
          interrupted = true;
          break;
        }
        throwIfAborted(f.signal, 'Trainer.fit');
        this.#epoch = epoch;
        for (const c of callbacks) await c.onEpochBegin?.(this, epoch);
        const trained = await this.#trainOneEpoch(run, epoch);
        if (!trained.complete) {
          interrupted = true;
          break;
        }
        interrupted = trained.stopAtEnd && epoch + 1 < f.epochs;
        const last = epoch + 1 === f.epochs || interrupted;
        const hasVal = run.val !== null || run.cached !== null;
        const evaluation = hasVal && ((epoch + 1) % f.evalEvery === 0 || last) ? await this.#evaluateEpoch(run) : {};
        lastEval = evaluation.val ?? lastEval;
        lastEvalEma = evaluation.valEma ?? lastEvalEma;
        const record = this.#recordEpoch(epoch, f.epochs, trained.totals, evaluation);
        const { isBest, stop } = this.#watch(record);
        stoppedEarly = stop;
        this.#epoch = epoch + 1;
        if ((epoch + 1) % (this.#s.checkpoint?.everyEpochs ?? 1) === 0 || last || stop) {
          await this.#saveCheckpoint(run, epoch + 1, 0, null);
        }
        if (isBest) await this.#saveBest(run);
        await this.#outputs.writeCurves(this.#history, this.#trainLossPoints);
        for (const c of callbacks) await c.onEpochEnd?.(this, record, evaluation);
        if (stoppedEarly) {
          this.#announceEarlyStop(epoch);
          break;
        }
        if (interrupted) break;
        if (epoch + 1 < f.epochs && this.#shouldStop(true)) {
          interrupted = true;
          break;
        }
      }
      this.#drainStopFlag();
      const best = this.#best?.best ?? null;
      await this.#outputs.writeFinal(
        { model: this.model, ema: this.ema, lastEval, lastEvalEma, classNames: run.classNames },
        { epochs: this.#epoch, steps: this.#step, best, history: this.#history, config: this.#s.config },
      );
      this.#outputs.endTracking(this.#stopRequested ? 'KILLED' : 'FINISHED');
    } catch (error) {
      // The run's own error is the one to report, not a failure to record its status.
      try {
        this.#outputs.endTracking(error instanceof AbortError ? 'KILLED' : 'FAILED');
      } catch {
        // The MLflow run stays RUNNING, as a crashed run's does.
      }
      throw error;
    } finally {
      this.#graphs?.end();
      await this.#outputs.flush();
    }
    const best = this.#best?.best;
    const result: FitResult = {
      epochs: this.#epoch,
      steps: this.#step,
      stoppedEarly,
      interrupted,
      history: [...this.#history],
      ...(best ? { best: { ...best } } : {}),
      ...(this.#s.outDir ? { outDir: this.#s.outDir } : {}),
      ...(lastEval ? { lastEval } : {}),
      ...(lastEvalEma ? { lastEvalEma } : {}),
    };
    for (const c of callbacks) await c.onFitEnd?.(this, result);
    return result;
  }

  /**
   * Resolves what the run trains on, restores a checkpoint when resuming, then opens the outputs:
   * nothing is written before the checkpoint to resume from has been found and restored.
   */
  async #prepare(train: DataLoader, f: FitSettings): Promise<FitRun> {
    const classNames = this.#s.classNames ?? (train.dataset.classes.length > 0 ? train.dataset.classes : null);
    checkRankLoader(this.#s.processGroup, train, 'fit: the train loader');
    if (f.val) checkRankLoader(this.#s.processGroup, f.val, 'fit: the val loader');
    this.#ensureNormalize(train);
    const cached = f.overfit !== null ? await cacheBatches(train, f.overfit) : null;
    const batchesPerEpoch = cached ? cached.length : train.length;
    if (batchesPerEpoch === 0) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'fit: the training loader yields no batches (empty dataset, or dropLast with fewer samples than a batch)',
      );
    }
    if (this.#s.schedule && !this.#scheduler) {
      this.#scheduler = new Scheduler(this.optimizer, this.#s.schedule, {
        stepsPerEpoch: Math.ceil(batchesPerEpoch / this.accumulate),
      });
    }
    const monitor = this.#s.checkpoint?.monitor ?? (f.val !== null || cached !== null ? 'val/acc1' : null);
    if (monitor === null) this.#best = null;
    else if (this.#best?.monitor !== monitor) {
      this.#best = new BestMetric(monitor, this.#s.checkpoint?.mode ?? defaultMode(monitor));
    }
    const file = f.resume ? await findResumeFile(f.resume, this.#s.outDir) : null;
    const resumed = file ? await this.#resume(file, train) : null;
    checkSameStep(this.#s.processGroup, this.#step, this.device);
    if (this.#outputs.writes) {
      await this.#checkpoints?.prepare();
      this.#outputs.open({ resumed: resumed !== null, params: this.#trackingParams() });
    }
    if (resumed) {
      const { run, config } = resumed;
      this.#outputs.log({ type: 'resume', file, epoch: this.#epoch, batch: run.batch, step: this.#step, config });
      this.#outputs.say(`resumed from ${file} at epoch ${this.#epoch + 1}, step ${this.#step}`);
    }
    const resumeAt =
      resumed && resumed.run.batch > 0
        ? { batch: resumed.run.batch, progress: resumed.run.epochProgress ?? null }
        : null;
    return { ...f, train, cached, batchesPerEpoch, classNames, resumeAt };
  }

  /** Trains one epoch (from the resume position in the first epoch of a resumed run): torchvision's `train_one_epoch`. */
  async #trainOneEpoch(run: FitRun, epoch: number): Promise<TrainedEpoch> {
    const first = run.resumeAt?.batch ?? 0;
    const meter = new EpochMeter(defined(this.#lossSum, 'the loss accumulator'), run.resumeAt?.progress ?? null);
    run.resumeAt = null;
    const bar = this.#outputs.progressBar({
      total: run.batchesPerEpoch,
      initial: first,
      label: 'train',
      batchSize: run.train.batchSize,
    });
    // The overfit mode (cached batches) never resumes, so it always starts at the first batch.
    const { batchSize, workers, prefetch } = run.train;
    const batches = this.#timing.beginEpoch(
      { epoch, context: { batchSize, workers, prefetch, amp: this.amp, logEvery: this.#s.logEvery } },
      run.cached ? cachedBatches(run.cached, this.device) : loaderBatches(run.train, this.device, epoch, first),
    );
    let lastLoss: number | undefined;
    let micro = 0;
    let stepImages = 0;
    // The lr the last optimizer step used (the schedule has already moved on to the next one).
    let windowLr = this.lr;
    const readWindow = (): void => {
      this.#graphs?.sync();
      const reading = meter.readWindow();
      if (!reading) return;
      lastLoss = reading.loss;
      this.#recordTrainLoss(epoch, reading.loss, windowLr, reading.imagesPerSec);
      this.#timing.sampleDevice(this.#step);
    };
    let stopAtEnd = false;
    for await (const batch of batches) {
      if (micro === 0) await this.#beginStep(epoch, batch.index);
      const groupSize = Math.min(this.accumulate, run.batchesPerEpoch - (batch.index - micro));
      this.#qat?.beforeStep(this.#step);
      this.#timing.computeStart();
      const graphed = groupSize === 1 && this.#graphStep(batch, meter);
      if (!graphed) this.#forwardBackward(batch, groupSize, meter, micro + 1 < groupSize);
      this.#timing.computeEnd();
      micro++;
      stepImages += batch.size;
      if (micro < groupSize) continue;

      const lr = this.lr;
      this.#timing.computeStart();
      if (graphed) this.#scheduler?.step();
      else this.#optimizerStep();
      this.#timing.computeEnd();
      this.#step++;
      this.#timing.stepEnd();
      meter.addImages(stepImages);
      const info = this.#stepInfo(epoch, batch.index, run.batchesPerEpoch, lr, stepImages, groupSize);
      windowLr = lr;
      micro = 0;
      stepImages = 0;
      if (this.#step % this.#s.logEvery === 0) readWindow();
      bar?.update(batch.index + 1, {
        epoch: epoch + 1,
        epochs: run.epochs,
        lr: this.lr,
        ...(lastLoss !== undefined ? { loss: lastLoss } : {}),
      });
      for (const c of this.#s.callbacks) await c.onStepEnd?.(this, info.info);
      info.end();
      // Let timers and signal handlers run between steps even when no batch waited on I/O.
      await new Promise<void>((resume) => setImmediate(resume));
      if (run.signal?.aborted) {
        bar?.finish();
        throwIfAborted(run.signal, 'Trainer.fit');
      }
      const atEnd = batch.index + 1 >= run.batchesPerEpoch;
      const everySteps = this.#s.checkpoint?.everySteps;
      if (!atEnd && everySteps && this.#step % everySteps === 0) {
        await this.#saveCheckpoint(run, epoch, batch.index + 1, meter);
      }
      if (this.#shouldStop(false) || this.#stepBudgetSpent(run)) {
        if (atEnd) {
          stopAtEnd = true;
          continue;
        }
        // The checkpoint keeps the unread log window, so that a resumed run logs what this one would have.
        await this.#saveCheckpoint(run, epoch, batch.index + 1, meter);
        readWindow();
        bar?.finish();
        return { complete: false, stopAtEnd: false, totals: meter.totals() };
      }
    }
    if (micro > 0) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `fit: the training loader yielded fewer batches than its length (${run.batchesPerEpoch}) in epoch ${epoch}; check its sampler's length`,
      );
    }
    readWindow();
    bar?.finish({ ...(lastLoss !== undefined ? { loss: lastLoss } : {}), lr: this.lr });
    this.#timing.endEpoch(epoch, this.#step);
    return { complete: true, stopAtEnd, totals: this.#overRanks(meter.totals()) };
  }

  /**
   * An epoch's totals over all ranks in data-parallel training: the mean loss (each rank ran as
   * many micro-batches) and the images per second of the whole group.
   */
  #overRanks(totals: EpochTotals): EpochTotals {
    const group = this.#s.processGroup;
    if (!isDistributed(group)) return totals;
    const [trainLoss = NaN, imagesPerSec = NaN] = averageOverRanks(
      group,
      [totals.trainLoss, totals.imagesPerSec],
      this.device,
    );
    return { ...totals, trainLoss, imagesPerSec: imagesPerSec * group.worldSize };
  }

  /** Calls the step-begin callbacks and clears the step's loss. */
  async #beginStep(epoch: number, batch: number): Promise<void> {
    for (const c of this.#s.callbacks) await c.onStepBegin?.(this, { epoch, step: this.#step + 1, batch });
    addon().fill({ tensor: defined(this.#stepLoss, 'the step loss').raw, value: 0 });
  }

  /**
   * One micro-batch: forward, loss (summed on the device), backward with the loss scaled by
   * `scale / groupSize`. The training loss is the cross-entropy, or with distillation the
   * distillation loss after the teacher's forward on the same input.
   */
  #forwardBackward(batch: DeviceBatch, groupSize: number, meter: EpochMeter | null, noSync = false): void {
    const ddp = this.ddp;
    if (noSync && ddp) {
      ddp.noSync(() => this.#forwardBackward(batch, groupSize, meter));
      return;
    }
    const loss = this.distillation?.loss ?? this.loss;
    this.scaler.scale(loss, 1 / groupSize);
    const input = this.#normalizer().forward(batch.images, batch.flips);
    // Data-parallel: the wrapper's forward (rank 0's buffers first) and backward (bucket all-reduces).
    const net = this.ddp ?? this.model;
    const logits = net.forward(input);
    const value = this.distillation
      ? this.distillation.forward(input, logits, batch.labels)
      : this.loss.forward(logits, batch.labels);
    meter?.addLoss(value);
    const stepLoss = defined(this.#stepLoss, 'the step loss');
    addon().add({ a: stepLoss.raw, b: value.raw, out: stepLoss.raw });
    net.backward(loss.backward());
  }

  /**
   * The step of `batch` as a replayed CUDA graph (captured when due); false when it must run
   * eagerly (see graph-mode.ts). The schedule then advances on the host as after an eager step.
   */
  #graphStep(batch: DeviceBatch, meter: EpochMeter): boolean {
    const graphs = this.#graphs;
    if (!graphs) return false;
    const parts = (): StepParts => ({
      model: this.model,
      net: this.ddp ?? this.model,
      ddp: this.ddp,
      normalize: this.#normalizer(),
      loss: this.loss,
      optimizer: this.optimizer,
      scaler: this.scaler,
      clip: this.#s.clip,
      lossSum: defined(this.#lossSum, 'the loss accumulator'),
      stepLoss: defined(this.#stepLoss, 'the step loss'),
      device: this.device,
    });
    if (!graphs.tryStep(batch, parts, this.optimizer.stepCount)) return false;
    meter.countLoss();
    return true;
  }

  /** Why this Trainer's step cannot be captured as a CUDA graph, or null when it can. */
  #graphBlocker(): string | null {
    const eager = (why: string): string => `cudaGraph: ${why}; training eagerly`;
    if (!this.device.startsWith('cuda')) return eager(`the device is ${this.device} (CUDA graphs need a CUDA device)`);
    if (this.accumulate > 1) return eager(`gradient accumulation (accumulate: ${this.accumulate}) is not captured`);
    if (this.distillation) return eager("knowledge distillation (the teacher's forward) is not captured");
    if (this.ema) return eager('the moving average (ema) follows a host schedule and is not captured');
    if (this.#qat) return eager('quantization-aware training changes its observers on a host schedule');
    if (!this.optimizer.capturable) {
      return eager(`${this.optimizer.constructor.name} cannot be captured (SGD, AdamW and LAMB can)`);
    }
    return null;
  }

  /** The `onStepEnd` information of the step just taken, whose `loss()` may be read until `end()`. */
  #stepInfo(
    epoch: number,
    batch: number,
    batchesPerEpoch: number,
    lr: number,
    images: number,
    groupSize: number,
  ): { info: StepInfo; end(): void } {
    const stepLoss = defined(this.#stepLoss, 'the step loss');
    let value: number | undefined;
    let current = true;
    const info: StepInfo = {
      epoch,
      step: this.#step,
      batch,
      batchesPerEpoch,
      lr,
      images,
      loss: () => {
        if (value === undefined) {
          if (!current) {
            throw new ResnetError(
              'ERR_RC_INVALID_ARGUMENT',
              'StepInfo.loss(): read it during onStepEnd; the step is over',
            );
          }
          value = stepLoss.item() / groupSize;
        }
        return value;
      },
    };
    return { info, end: () => void (current = false) };
  }

  /** A training-loss log point: the log, TensorBoard and the loss curve. */
  #recordTrainLoss(epoch: number, loss: number, lr: number, imagesPerSec: number): void {
    this.#trainLossPoints.push([this.#step, loss]);
    this.#outputs.log({ type: 'train', epoch, step: this.#step, loss, lr, imagesPerSec });
    this.#outputs.scalar('train/loss', loss, this.#step);
    this.#outputs.scalar('train/lr', lr, this.#step);
    this.#outputs.scalar('train/images_per_sec', imagesPerSec, this.#step);
  }

  /** Evaluates the model, and its moving average, on the validation data (the cached batches in the overfit mode). */
  async #evaluateEpoch(run: FitRun): Promise<{ val?: EvalResult; valEma?: EvalResult }> {
    const cached = run.cached;
    const source = (): AsyncIterable<DeviceBatch> | Iterable<DeviceBatch> => {
      if (cached) return cachedBatches(cached, this.device);
      const val = defined(run.val, 'the validation loader');
      return loaderBatches(val, this.device, val.epoch, 0);
    };
    const total = cached ? cached.length : defined(run.val, 'the validation loader').length;
    const limit = cached ? Infinity : ownSamples(defined(run.val, 'the validation loader'));
    const val = await this.#evaluate(source(), total, limit, run.classNames, 'val', run.signal);
    let valEma: EvalResult | undefined;
    if (this.ema) {
      this.ema.swap();
      try {
        valEma = await this.#evaluate(source(), total, limit, run.classNames, 'val_ema', run.signal);
      } finally {
        this.ema.swap();
      }
    }
    this.model.train();
    return { val, ...(valEma ? { valEma } : {}) };
  }

  /** Records an epoch: its metrics in the history, the log, TensorBoard and the epoch line. */
  #recordEpoch(
    epoch: number,
    epochs: number,
    totals: EpochTotals,
    evaluation: { val?: EvalResult; valEma?: EvalResult },
  ): EpochRecord {
    const metrics: Record<string, number> = { 'train/loss': totals.trainLoss };
    for (const [prefix, result] of [
      ['val', evaluation.val],
      ['val_ema', evaluation.valEma],
    ] as const) {
      if (result) {
        Object.assign(metrics, {
          [`${prefix}/loss`]: result.loss,
          [`${prefix}/acc1`]: result.acc1,
          [`${prefix}/acc5`]: result.acc5,
        });
      }
    }
    const record: EpochRecord = {
      epoch,
      step: this.#step,
      trainLoss: totals.trainLoss,
      lr: this.lr,
      seconds: totals.seconds,
      imagesPerSec: totals.imagesPerSec,
      metrics,
    };
    this.#history.push(record);
    this.#outputs.log({ type: 'epoch', ...record });
    for (const [name, value] of Object.entries(metrics)) {
      if (name !== 'train/loss') this.#outputs.scalar(name, value, this.#step);
    }
    this.#outputs.scalar('epoch/train_loss', totals.trainLoss, this.#step);
    const parts = [`epoch ${epoch + 1}/${epochs}`, `train loss ${totals.trainLoss.toFixed(4)}`];
    const { val, valEma } = evaluation;
    if (val) {
      parts.push(
        `val loss ${val.loss.toFixed(4)}`,
        `acc@1 ${(100 * val.acc1).toFixed(2)}%`,
        `acc@5 ${(100 * val.acc5).toFixed(2)}%`,
      );
    }
    if (valEma) parts.push(`ema acc@1 ${(100 * valEma.acc1).toFixed(2)}%`);
    parts.push(formatDuration(totals.seconds));
    this.#outputs.say(parts.join('  '));
    return record;
  }

  /** Reduce on plateau, best metric and early stopping look at the epoch's metrics. */
  #watch(record: EpochRecord): { isBest: boolean; stop: boolean } {
    const reduceOn = this.#s.plateau?.monitor;
    const value = reduceOn === undefined ? undefined : record.metrics[reduceOn];
    if (this.#plateau && value !== undefined && this.#plateau.step(value)) {
      this.#outputs.log({ type: 'lr-reduced', epoch: record.epoch, step: this.#step, lr: this.lr });
    }
    const isBest = this.#best?.update(record.metrics, record.epoch) ?? false;
    return { isBest, stop: this.#early?.update(record.metrics) ?? false };
  }

  #announceEarlyStop(epoch: number): void {
    const { monitor, patience } = defined(this.#s.early, 'the early-stopping settings');
    const best = defined(this.#early, 'the early-stopping monitor').state.best;
    this.#outputs.log({ type: 'early-stop', epoch, step: this.#step, monitor, best });
    this.#outputs.say(`early stopping: ${monitor} has not improved for ${patience} evaluations`);
  }

  /**
   * Whether the run stops here: this process was asked to ({@link Trainer.requestStop}), or in
   * data-parallel training any rank was, so that all stop at the same step (a signal reaches the
   * ranks at different times). Within an epoch (`wait` false) the flags all-reduced at the
   * previous step are read, so that the step does not wait for the reduction: a stop asked for
   * during step k happens after step k + 1 on every rank. Between epochs (`wait` true) the
   * reduction is waited for. Every rank makes the same calls, so they agree.
   */
  #shouldStop(wait: boolean): boolean {
    const group = this.#s.processGroup;
    if (!isDistributed(group)) return this.#stopRequested;
    if (this.#stopAgreed) return true;
    const flag = (this.#stopFlag ??= Tensor.zeros([1], { dtype: 'i32', device: this.device }));
    if (this.#stopPending) {
      group.synchronize();
      this.#stopPending = false;
      if (flag.item() > 0) return (this.#stopAgreed = true);
    }
    flag.copyFromHost(Int32Array.of(this.#stopRequested ? 1 : 0));
    group.allReduce(flag, { op: 'max' });
    this.#stopPending = true;
    if (!wait) return false;
    group.synchronize();
    this.#stopPending = false;
    return (this.#stopAgreed = flag.item() > 0);
  }

  /** Waits for a stop flag's reduction still in flight (every rank has one at the same point). */
  #drainStopFlag(): void {
    if (!this.#stopPending) return;
    this.#s.processGroup?.synchronize();
    this.#stopPending = false;
  }

  #stepBudgetSpent(f: FitSettings): boolean {
    return f.maxSteps !== null && this.#step >= f.maxSteps;
  }

  /** Device accumulators, training mode, and no stale gradients or scaler state from an earlier failed step. */
  #beginTraining(): void {
    this.#lossSum ??= Tensor.zeros([1], { device: this.device });
    this.#stepLoss ??= Tensor.zeros([1], { device: this.device });
    this.model.train();
    this.scaler.abandonStep();
    this.optimizer.zeroGrad();
  }

  /**
   * Evaluates the model (or, with `ema: true`, its moving average) on `loader`: loss, top-1, top-5,
   * confusion matrix and classification report. Data-parallel runs combine every rank's counts.
   * With `signal`, an abort stops at the next batch and rejects with an `AbortError`.
   */
  async evaluate(loader: DataLoader, options: { ema?: boolean; signal?: AbortSignal } = {}): Promise<EvalResult> {
    this.#checkAlive();
    if (!isLoader(loader)) invalid('loader', 'a DataLoader', loader);
    const o = expectOptions<{ ema?: boolean; signal?: AbortSignal }>('evaluate options', options, ['ema', 'signal']);
    const useEma = expectBool('ema', o.ema ?? false);
    const signal = checkSignal('signal', o.signal);
    const ema = useEma ? this.ema : null;
    if (useEma && !ema) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'evaluate: ema: true, but the Trainer keeps no moving average (ema option)',
      );
    }
    checkRankLoader(this.#s.processGroup, loader, 'evaluate: the loader');
    return this.#exclusive('evaluate', async () => {
      throwIfAborted(signal, 'Trainer.evaluate');
      this.#ensureNormalize(loader);
      const names = this.#s.classNames ?? (loader.dataset.classes.length > 0 ? loader.dataset.classes : null);
      const wasTraining = this.model.training;
      ema?.swap();
      try {
        return await this.#evaluate(
          loaderBatches(loader, this.device, loader.epoch, 0),
          loader.length,
          ownSamples(loader),
          names,
          useEma ? 'val_ema' : 'val',
          signal,
        );
      } finally {
        ema?.swap();
        this.model.train(wasTraining);
      }
    });
  }

  async #evaluate(
    batches: AsyncIterable<DeviceBatch> | Iterable<DeviceBatch>,
    total: number,
    limit: number,
    classNames: readonly string[] | null,
    label: string,
    signal: AbortSignal | null,
  ): Promise<EvalResult> {
    this.model.eval();
    const bar = this.#outputs.progressBar({ total, label, printEvery: 0 });
    // Only the first `keep` samples count (the rest pads a rank's share of the data).
    const forward = (batch: DeviceBatch, keep: number): { logits: Tensor; loss: number } => {
      const logits = this.model.forward(this.#normalizer().forward(batch.images, batch.flips));
      if (keep === batch.size) return { logits, loss: this.#evalLoss.forward(logits, batch.labels).item() };
      if (keep === 0) return { logits, loss: 0 };
      const classes = logits.numel / batch.size;
      const own = logits.view(0, [keep, classes]);
      const labels = batch.labels.view(0, [keep]);
      try {
        return { logits, loss: this.#evalLoss.forward(own, labels).item() };
      } finally {
        own.dispose();
        labels.dispose();
      }
    };
    const counts = await evaluateBatches(batches, forward, bar, signal, limit);
    return evalResult(sumEvalCounts(this.#s.processGroup, counts, this.device), classNames);
  }

  /**
   * Runs the model in evaluation mode and returns the `topk` best classes of every sample with
   * their probabilities. `source` is a DataLoader (in its order) or a u8 NHWC image tensor
   * `[N, H, W, 3]` (normalised like the training input). With `signal`, an abort stops at the next
   * batch and rejects with an `AbortError`.
   */
  async predict(
    source: DataLoader | Tensor,
    options: { topk?: number; signal?: AbortSignal } = {},
  ): Promise<Predictions> {
    this.#checkAlive();
    const o = expectOptions<{ topk?: number; signal?: AbortSignal }>('predict options', options, ['topk', 'signal']);
    const topk = expectInt('topk', o.topk ?? 5, 1);
    const signal = checkSignal('signal', o.signal);
    if (source instanceof Tensor) {
      if (source.dtype !== 'u8' || source.shape.length !== 4) {
        invalid('source', 'a u8 NHWC image tensor [N, H, W, 3] or a DataLoader', source);
      }
    } else if (!isLoader(source)) {
      invalid('source', 'a DataLoader or a u8 NHWC image tensor', source);
    }
    return this.#exclusive('predict', async () => {
      throwIfAborted(signal, 'Trainer.predict');
      const wasTraining = this.model.training;
      this.model.eval();
      try {
        const { chunks, numClasses } =
          source instanceof Tensor ? this.#logitsOfTensor(source) : await this.#logitsOfLoader(source, signal);
        return rankPredictions(chunks, numClasses, topk);
      } finally {
        this.model.train(wasTraining);
      }
    });
  }

  #logitsOfTensor(source: Tensor): { chunks: { logits: Float32Array; indices: Int32Array }[]; numClasses: number } {
    const normalize = this.#ensureNormalize(null);
    const images =
      source.device === this.device
        ? source
        : Tensor.from(source.toArray(), source.shape, { dtype: 'u8', device: this.device });
    let logits: Float32Array;
    try {
      logits = this.model.forward(normalize.forward(images)).toFloat32Array();
    } finally {
      if (images !== source) images.dispose();
    }
    const n = source.shape[0]!;
    return {
      chunks: [{ logits, indices: Int32Array.from({ length: n }, (_, i) => i) }],
      numClasses: logits.length / n,
    };
  }

  async #logitsOfLoader(
    loader: DataLoader,
    signal: AbortSignal | null,
  ): Promise<{ chunks: { logits: Float32Array; indices: Int32Array }[]; numClasses: number }> {
    const normalize = this.#ensureNormalize(loader);
    const chunks: { logits: Float32Array; indices: Int32Array }[] = [];
    let numClasses = 0;
    for await (const batch of loaderBatches(loader, this.device, loader.epoch, 0)) {
      throwIfAborted(signal, 'Trainer.predict');
      const logits = this.model.forward(normalize.forward(batch.images, batch.flips)).toFloat32Array();
      numClasses = logits.length / batch.size;
      chunks.push({ logits, indices: batch.indices });
    }
    return { chunks, numClasses };
  }

  /**
   * The learning-rate range test (fastai's `lr_find`, pytorch-lr-finder's `range_test`): trains
   * `numIter` optimizer steps on `train` (cycling through its epochs) with this Trainer's step
   * (mixed precision, loss scaling, accumulation, clipping, data-parallel averaging) while the
   * learning rate sweeps from `startLr` to `endLr`, stops when the smoothed loss diverges, then
   * restores the model, its buffers, the optimizer, the GradScaler and the loader's epoch exactly.
   * The schedule, the moving average and the step count are not touched. See `lr-finder.ts` for the
   * rules; {@link writeLrFinder} draws the result.
   */
  async findLr(train: DataLoader, options?: LrFinderOptions): Promise<LrFinderResult> {
    this.#checkAlive();
    if (!isLoader(train)) invalid('train', 'a DataLoader', train);
    const settings = parseLrFinderOptions(options);
    return this.#exclusive('findLr', async () => {
      throwIfAborted(settings.signal, 'Trainer.findLr');
      this.#ensureNormalize(train);
      const bar = this.#outputs.progressBar({ total: settings.numIter, label: 'lr-find', batchSize: train.batchSize });
      try {
        return await rangeTest(
          {
            model: this.model,
            optimizer: this.optimizer,
            scaler: this.scaler,
            loader: train,
            device: this.device,
            begin: () => {
              this.#beginTraining();
            },
            step: (next) => this.#rangeTestStep(next),
            progress: (done, lr, loss) => bar?.update(done, { lr, loss }),
          },
          settings,
        );
      } finally {
        bar?.finish();
      }
    });
  }

  /**
   * One step of the range test: `accumulate` micro-batches and the update; resolves to the mean
   * loss, averaged over the ranks in data-parallel training, so that every rank stops at the same step.
   */
  async #rangeTestStep(next: () => Promise<DeviceBatch>): Promise<number> {
    const stepLoss = defined(this.#stepLoss, 'the step loss');
    addon().fill({ tensor: stepLoss.raw, value: 0 });
    try {
      for (let i = 0; i < this.accumulate; i++) {
        this.#forwardBackward(await next(), this.accumulate, null, i + 1 < this.accumulate);
      }
      this.#update();
      const group = this.#s.processGroup;
      if (isDistributed(group)) {
        group.allReduce(stepLoss, { op: 'avg' });
        group.synchronize();
      }
    } catch (error) {
      this.scaler.abandonStep();
      this.optimizer.zeroGrad();
      throw error;
    }
    return stepLoss.item() / this.accumulate;
  }

  /** Closes the log files and frees the trainer's device state (the model and optimizer stay). */
  async dispose(): Promise<void> {
    if (this.#disposed) return;
    this.#disposed = true;
    this.ddp?.dispose();
    this.loss.dispose();
    this.distillation?.dispose();
    this.#evalLoss.dispose();
    this.scaler.dispose();
    this.ema?.dispose();
    this.#normalize?.dispose();
    this.#normalize = null;
    this.#lossSum?.dispose();
    this.#stepLoss?.dispose();
    this.#stopFlag?.dispose();
    this.#lossSum = this.#stepLoss = this.#stopFlag = null;
    await this.#outputs.close();
  }

  /** Runs `call` as this Trainer's only running call; a nested evaluate or predict from a callback of `fit` is allowed. */
  async #exclusive<T>(name: 'fit' | 'evaluate' | 'predict' | 'findLr', call: () => Promise<T>): Promise<T> {
    if (this.#running !== null) {
      if (name !== 'fit' && name !== 'findLr' && runningIn.getStore() === this) return call();
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `Trainer.${name}: this Trainer is already running ${this.#running}(); wait for it to finish (one call at a time shares the model, its buffers and the optimizer)`,
      );
    }
    this.#running = name;
    try {
      return await runningIn.run(this, call);
    } finally {
      this.#running = null;
    }
  }

  #checkAlive(): void {
    if (this.#disposed) throw new ResnetError('ERR_RC_DISPOSED', 'This Trainer has been disposed');
  }

  #ensureNormalize(loader: DataLoader | null): InputNormalize {
    return (this.#normalize ??= this.#makeNormalize(
      loader?.normalization() ?? { mean: IMAGENET_MEAN, std: IMAGENET_STD },
    ));
  }

  /** The input normalization that `#ensureNormalize` (or the `normalize` option) has set up. */
  #normalizer(): InputNormalize {
    return defined(this.#normalize, 'the input normalization');
  }

  #makeNormalize(stats: { mean: readonly number[]; std: readonly number[] }): InputNormalize {
    return new InputNormalize({
      mean: [...stats.mean],
      std: [...stats.std],
      dtype: this.amp === 'bf16' ? 'bf16' : this.amp === 'fp16' ? 'f16' : 'f32',
    });
  }

  /** Averages gradients over ranks, unscales, clips, steps, updates the scaler, zeroes, schedules, averages weights. */
  #optimizerStep(): void {
    try {
      this.#update();
      this.#scheduler?.step();
      if (this.ema) {
        this.ema.update();
        if (this.#step + 1 <= this.#s.emaWarmup) this.ema.reset();
      }
    } catch (error) {
      // Leave nothing half-done for the next step: no scaler state, no stale gradients.
      this.scaler.abandonStep();
      this.optimizer.zeroGrad();
      throw error;
    }
  }

  /**
   * The update of a step: gradients averaged over ranks (the all-reduces launched during backward
   * finished), unscaled and clipped; the optimizer steps, the scaler updates, gradients are zeroed.
   * Every rank checks the same averaged gradients for inf/NaN, so all skip the same steps.
   */
  #update(): void {
    this.ddp?.finishGradientSync();
    if (this.#s.clip !== null) {
      this.scaler.unscale(this.optimizer);
      clipGradNorm(this.model, this.#s.clip);
    }
    this.scaler.stepAndZeroGrad(this.optimizer);
  }

  /** The parameters an MLflow run records of this Trainer. */
  #trackingParams(): Record<string, string> {
    const s = this.#s;
    return trainingParams({
      model: this.model,
      optimizer: this.optimizer,
      settings: {
        device: this.device,
        amp: s.amp,
        accumulate: s.accumulate,
        label_smoothing: s.labelSmoothing,
        ...(s.clip !== null ? { clip_grad_norm: s.clip } : {}),
        ...(s.ema ? { ema: s.ema } : {}),
        ...(s.schedule ? { schedule: s.schedule.constructor.name } : {}),
        // The first group's lr above is the schedule's first value (a warm-up's start): the base too.
        ...(this.#scheduler ? { 'optimizer.initial_lr': this.#scheduler.baseLrs[0] } : {}),
        ...(s.processGroup ? { world_size: s.processGroup.worldSize, sync_batchnorm: s.syncBatchNorm } : {}),
      },
      config: s.config,
    });
  }

  /** The parts a checkpoint holds. */
  #parts(): CheckpointParts {
    const scheduler = this.#schedulerPart();
    return {
      model: this.model,
      optimizer: this.optimizer,
      scaler: this.scaler,
      ...(scheduler ? { scheduler } : {}),
      ...(this.ema ? { ema: this.ema } : {}),
    };
  }

  #schedulerPart(): Stateful | null {
    const scheduler = this.#scheduler;
    const plateau = this.#plateau;
    if (scheduler) {
      return {
        state: () => ({ kind: 'schedule', state: scheduler.state() }),
        loadState: (s) => {
          loadKind(scheduler, s, 'schedule');
        },
      };
    }
    if (plateau) {
      return {
        state: () => ({ kind: 'plateau', state: plateau.state() }),
        loadState: (s) => {
          loadKind(plateau, s, 'plateau');
        },
      };
    }
    return null;
  }

  #runState(run: FitRun, batch: number, periodic: string[], epochProgress: EpochProgress | null): RunState {
    return {
      batch,
      epochs: run.epochs,
      best: this.#best?.best ?? null,
      earlyStopping: this.#early?.state ?? null,
      earlyMonitor: this.#s.early?.monitor ?? null,
      history: this.#history,
      trainLossPoints: this.#trainLossPoints,
      periodic,
      data: {
        trainSeed: run.train.seed,
        trainLength: run.train.dataset.length,
        batchSize: run.train.batchSize,
        worldSize: this.worldSize,
      },
      config: this.#s.config,
      epochProgress,
    };
  }

  async #writeCheckpoint(
    path: string,
    epoch: number,
    run: RunState,
    classNames: readonly string[] | null,
  ): Promise<void> {
    await saveCheckpoint(path, this.#parts(), {
      epoch,
      step: this.#step,
      extra: { run, ...(classNames ? { classNames: [...classNames] } : {}) },
    });
  }

  /** Writes the periodic checkpoint of this step (once), at `batch` of `epoch`; `meter` when inside the epoch. */
  async #saveCheckpoint(run: FitRun, epoch: number, batch: number, meter: EpochMeter | null): Promise<void> {
    const manager = this.#checkpoints;
    if (!manager || run.cached || manager.hasStep(this.#step)) return;
    this.#graphs?.sync();
    const progress = meter?.progress() ?? null;
    const name = await manager.save({ epoch, batch, step: this.#step }, (path, kept) =>
      this.#writeCheckpoint(path, epoch, this.#runState(run, batch, kept, progress), run.classNames),
    );
    this.#outputs.log({ type: 'checkpoint', epoch, step: this.#step, file: `checkpoints/${name}` });
  }

  /** Writes `best.safetensors`, `best.json` and the best weights (the moving average's when it is monitored). */
  async #saveBest(run: FitRun): Promise<void> {
    const manager = this.#checkpoints;
    if (!manager || run.cached) return;
    const best = defined(this.#best?.best, 'the best metric');
    await manager.saveBest({ ...best, step: this.#step }, (path) =>
      this.#writeCheckpoint(path, this.#epoch, this.#runState(run, 0, manager.kept, null), run.classNames),
    );
    const weights = best.monitor.startsWith('val_ema') && this.ema ? this.ema.stateDict() : this.model.stateDict();
    await saveWeights(join(defined(this.#s.outDir, 'the output directory'), 'model-best.safetensors'), weights);
  }

  /** Checks that a checkpoint fits this Trainer and restores it (all or nothing); returns its run state. */
  async #resume(file: string, train: DataLoader): Promise<{ run: RunState; config: Record<string, unknown> }> {
    const info = await readCheckpointInfo(file);
    const run = info.run;
    if (!run) {
      throw new ResnetError(
        'ERR_RC_CHECKPOINT',
        `${file}: was not written by Trainer.fit (no run state); load it with loadCheckpoint`,
      );
    }
    const worldSize = run.data.worldSize ?? 1;
    if (worldSize !== this.worldSize) {
      throw new ResnetError(
        'ERR_RC_CHECKPOINT',
        `${file}: the run trained with world size ${worldSize} (${worldSize} processes of batch ${run.data.batchSize}), this one has ${this.worldSize}; ` +
          `an exact resume needs the same data split: run it with ${worldSize} process${worldSize === 1 ? '' : 'es'} (--nproc-per-node ${worldSize}), ` +
          `or start a new run from its weights`,
      );
    }
    if (
      run.data.trainSeed !== train.seed ||
      run.data.trainLength !== train.dataset.length ||
      run.data.batchSize !== train.batchSize
    ) {
      throw new ResnetError(
        'ERR_RC_CHECKPOINT',
        `${file}: the run used training data with seed ${run.data.trainSeed}, ${run.data.trainLength} samples and batch size ${run.data.batchSize}; ` +
          `this loader has seed ${train.seed}, ${train.dataset.length} samples and batch size ${train.batchSize}. Resuming exactly needs the same data: ` +
          `create the DataLoader with seed: ${run.data.trainSeed} and the same dataset and batch size`,
      );
    }
    checkParts(file, info, {
      lr: this.#scheduler ? 'schedule' : this.#plateau ? 'plateau' : null,
      ema: this.ema !== null,
      optimizerGroups: this.optimizer.paramGroups.length,
    });
    const progress = await loadCheckpoint(file, this.#parts());
    this.#step = progress.step;
    this.#epoch = progress.epoch;
    this.#best?.restore(run.best);
    this.#early?.restore(run.earlyStopping, run.earlyMonitor);
    this.#history = run.history;
    this.#trainLossPoints = run.trainLossPoints;
    this.#checkpoints?.adopt(run, file);
    return { run, config: info.config };
  }
}

/** Whether two device names are the same device (`cuda` is `cuda:0`). */
function sameDevice(a: string, b: string): boolean {
  const canonical = (d: string): string => (d === 'cuda' ? 'cuda:0' : d);
  return canonical(a) === canonical(b);
}

/** Refuses a checkpoint whose learning-rate state, moving average or parameter groups do not fit this Trainer. */
function checkParts(file: string, info: CheckpointInfo, want: CheckpointInfo['parts']): void {
  const mismatch = (what: string): never => {
    throw new ResnetError('ERR_RC_CHECKPOINT', `${file}: ${what}; resume with the same Trainer options`);
  };
  const lrKind = (kind: 'schedule' | 'plateau' | null, none: string): string =>
    kind === 'plateau' ? 'a plateau reduction' : kind === 'schedule' ? 'a schedule' : none;
  if (info.parts.lr !== want.lr) {
    mismatch(
      `its learning rate follows ${lrKind(info.parts.lr, 'no schedule')}, this Trainer's ${lrKind(want.lr, 'none')}`,
    );
  }
  if (info.parts.ema !== want.ema) {
    mismatch(
      info.parts.ema
        ? 'it holds a moving average, but this Trainer keeps none'
        : 'it holds no moving average, but this Trainer keeps one',
    );
  }
  if (info.parts.optimizerGroups !== want.optimizerGroups) {
    mismatch(`its optimizer has ${info.parts.optimizerGroups} parameter groups, this one ${want.optimizerGroups}`);
  }
}

/**
 * Restores a checkpoint's learning-rate state into `target` once its kind matches; `loadState`
 * validates the state itself.
 */
function loadKind(target: { loadState(state: unknown): void }, saved: unknown, kind: 'schedule' | 'plateau'): void {
  const s = saved as { kind?: string; state?: unknown } | null;
  if (!s || typeof s !== 'object' || s.kind !== kind) {
    throw new ResnetError(
      'ERR_RC_CHECKPOINT',
      `the checkpoint's learning-rate state is of kind '${s?.kind ?? 'none'}' but this Trainer uses a ${kind === 'schedule' ? 'schedule' : 'plateau reduction'}`,
    );
  }
  target.loadState(s.state);
}
