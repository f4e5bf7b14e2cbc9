/**
 * The types the Trainer hands to callbacks and returns: step information, epoch records, the
 * callback hooks and the result of a run.
 * @packageDocumentation
 */
import type { BestValue } from './monitors.js';
import type { EvalResult } from './evaluation.js';
import type { Trainer } from './trainer.js';

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
  /** Mean training loss over the epoch's micro-batches (of every rank in data-parallel training). */
  trainLoss: number;
  /** The learning rate at the end of the epoch. */
  lr: number;
  /** Wall time of the epoch's training, in seconds. */
  seconds: number;
  /** Training images per second over the epoch (of all ranks together in data-parallel training). */
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
  onEpochEnd?(
    trainer: Trainer,
    record: EpochRecord,
    evaluation: { val?: EvalResult; valEma?: EvalResult },
  ): void | Promise<void>;
  /** When the run ends, normally or stopped. */
  onFitEnd?(trainer: Trainer, result: FitResult): void | Promise<void>;
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
  best?: BestValue;
  /** One record per epoch. */
  history: EpochRecord[];
  /** The output folder, when there is one. */
  outDir?: string;
  /** The last validation result. */
  lastEval?: EvalResult;
  /** The last validation result of the moving average. */
  lastEvalEma?: EvalResult;
}
