/**
 * What a training run writes besides checkpoints: the JSON-lines log, TensorBoard scalars, the
 * progress bar and epoch lines, the PNG charts, and at the end the weights, the classification
 * report and `summary.json`; with MLflow tracking, the same scalars, parameters and files in an
 * MLflow run. Only the main process (rank 0) writes; elsewhere every call does nothing.
 * @packageDocumentation
 */
import { existsSync } from 'node:fs';
import { basename, join } from 'node:path';
import type { Module } from '../nn/module.js';
import { saveWeights, writeFileAtomic } from './checkpoint.js';
import type { ModelEma } from './ema.js';
import { type EvalResult, namesFor } from './evaluation.js';
import { JsonLinesLogger, ProgressBar, type ProgressBarOptions, type ProgressStream } from './outputs/logging.js';
import { plotConfusionMatrix, plotCurves, writePng, type Series } from './outputs/plots.js';
import { SummaryWriter } from './outputs/tensorboard.js';
import { MlflowTracking } from './outputs/mlflow-tracking.js';
import type { MlflowRunOptions, MlflowRunStatus } from './outputs/mlflow.js';

/** Which outputs a run writes, and where. */
export interface RunOutputSettings {
  /** The output folder, or null for none (the progress stream may still be used). */
  outDir: string | null;
  /** Whether this process writes (rank 0). */
  isMain: boolean;
  progress: ProgressStream | null;
  jsonLog: boolean;
  tensorboard: boolean;
  plots: boolean;
  /** Track the run in an MLflow file store, or null. */
  mlflow?: MlflowRunOptions | null;
}

/** One point of an epoch's history that the charts draw. */
export interface CurvePoint {
  epoch: number;
  step: number;
  metrics: Record<string, number>;
}

/** A loss curve spanning more than this ratio (a decade) between its extremes is drawn on a log axis. */
const LOG_AXIS_RATIO = 10;

/** Whether positive values span more than a decade, so that a log axis shows them better. */
export function spansDecades(values: readonly number[]): boolean {
  const finite = values.filter((v) => Number.isFinite(v));
  if (finite.length < 2 || finite.some((v) => v <= 0)) return false;
  return Math.max(...finite) / Math.min(...finite) > LOG_AXIS_RATIO;
}

/** The files of a run folder that an MLflow run keeps as artifacts, when they exist. */
const ARTIFACTS = [
  'model.safetensors',
  'model-best.safetensors',
  'model-ema.safetensors',
  'curves-loss.png',
  'curves-accuracy.png',
  'confusion-matrix.png',
  'classification-report.txt',
  'summary.json',
  'config.json',
];

/** The run's logs, scalars, progress lines and charts; see the module documentation. */
export class RunOutputs {
  readonly #s: RunOutputSettings;
  #logger: JsonLinesLogger | null = null;
  #writer: SummaryWriter | null = null;
  #mlflow: MlflowTracking | null = null;

  constructor(settings: RunOutputSettings) {
    this.#s = settings;
  }

  /** Whether files are written (an output folder, on the main process). */
  get writes(): boolean {
    return this.#writeDir() !== null;
  }

  // The output folder when files are written, else null.
  #writeDir(): string | null {
    return this.#s.isMain ? this.#s.outDir : null;
  }

  /**
   * Opens the log and the TensorBoard writer (once; later fits append to them), and the MLflow run
   * with its parameters (`resumed`: continue the run this folder was tracked in).
   */
  open(tracking: { resumed: boolean; params: Record<string, string> } = { resumed: false, params: {} }): void {
    const out = this.#writeDir();
    if (out === null) return;
    if (this.#s.jsonLog && !this.#logger) this.#logger = new JsonLinesLogger(join(out, 'log.jsonl'));
    if (this.#s.tensorboard && !this.#writer) this.#writer = new SummaryWriter(join(out, 'tensorboard'));
    if (this.#s.mlflow) {
      this.#mlflow ??= new MlflowTracking(out, { runName: basename(out), ...this.#s.mlflow });
      this.#mlflow.begin(tracking.resumed, tracking.params);
    }
  }

  /** Ends the MLflow run with `status` (after {@link RunOutputs.writeFinal} has given it the artifacts). */
  endTracking(status: Exclude<MlflowRunStatus, 'RUNNING'>): void {
    this.#mlflow?.end(status);
  }

  /** Appends a record, stamped with the time, to `log.jsonl`. */
  log(record: Record<string, unknown>): void {
    if (this.#s.isMain) this.#logger?.log({ time: new Date().toISOString(), ...record });
  }

  /** Writes a TensorBoard scalar (finite values only). */
  scalar(tag: string, value: number, step: number): void {
    if (this.#s.isMain && Number.isFinite(value)) {
      this.#writer?.addScalar(tag, value, step);
      this.#mlflow?.metric(tag, value, step);
    }
  }

  /** Prints a line on the progress stream. */
  say(line: string): void {
    if (this.#s.isMain) this.#s.progress?.write(line + '\n');
  }

  /** A progress bar on the progress stream, or null when there is none. */
  progressBar(options: Omit<ProgressBarOptions, 'stream'>): ProgressBar | null {
    return this.#s.isMain && this.#s.progress && options.total > 0
      ? new ProgressBar({ ...options, stream: this.#s.progress })
      : null;
  }

  /** Redraws `curves-loss.png` (log axis when the losses span decades) and `curves-accuracy.png`. */
  async writeCurves(history: readonly CurvePoint[], trainLoss: readonly [number, number][]): Promise<void> {
    const out = this.#writeDir();
    if (out === null || !this.#s.plots) return;
    const loss: Series[] = [{ name: 'train', points: [...trainLoss] }];
    const valLoss = history
      .filter((h) => h.metrics['val/loss'] !== undefined)
      .map((h) => [h.step, h.metrics['val/loss']!] as [number, number]);
    if (valLoss.length > 0) loss.push({ name: 'val', points: valLoss });
    if (loss.some((s) => s.points.length > 0)) {
      const logY = spansDecades(loss.flatMap((s) => s.points.map((p) => p[1])));
      await writePng(
        join(out, 'curves-loss.png'),
        await plotCurves(loss, { title: 'Loss', xLabel: 'step', yLabel: 'loss', logY }),
      );
    }
    const acc: Series[] = [];
    for (const [name, key] of [
      ['val top-1', 'val/acc1'],
      ['val top-5', 'val/acc5'],
      ['ema top-1', 'val_ema/acc1'],
    ] as const) {
      const points = history
        .filter((h) => h.metrics[key] !== undefined)
        .map((h) => [h.epoch + 1, 100 * h.metrics[key]!] as [number, number]);
      if (points.length > 0) acc.push({ name, points });
    }
    if (acc.length > 0) {
      await writePng(
        join(out, 'curves-accuracy.png'),
        await plotCurves(acc, { title: 'Validation accuracy', xLabel: 'epoch', yLabel: '%' }),
      );
    }
  }

  /**
   * Writes the final weights (and the moving average's), the confusion matrix (with the model's
   * classes: those beyond `classNames` are named by index), the classification report and `summary.json`.
   */
  async writeFinal(
    run: {
      model: Module;
      ema: ModelEma | null;
      lastEval: EvalResult | undefined;
      lastEvalEma: EvalResult | undefined;
      classNames: readonly string[] | null;
    },
    summary: Record<string, unknown>,
  ): Promise<void> {
    const out = this.#writeDir();
    if (out === null) return;
    await saveWeights(join(out, 'model.safetensors'), run.model);
    if (run.ema) await saveWeights(join(out, 'model-ema.safetensors'), run.ema.stateDict());
    const { lastEval, lastEvalEma } = run;
    if (lastEval) {
      const names = namesFor(lastEval.confusion.toArray().length, run.classNames);
      if (this.#s.plots) {
        await writePng(join(out, 'confusion-matrix.png'), await plotConfusionMatrix(lastEval.confusion, names));
      }
      let text = `loss ${lastEval.loss.toFixed(4)}  acc@1 ${(100 * lastEval.acc1).toFixed(2)}%  acc@5 ${(100 * lastEval.acc5).toFixed(2)}%  (${lastEval.count} images)\n\n${lastEval.report}`;
      if (lastEvalEma) {
        text += `\n\nmoving average: loss ${lastEvalEma.loss.toFixed(4)}  acc@1 ${(100 * lastEvalEma.acc1).toFixed(2)}%  acc@5 ${(100 * lastEvalEma.acc5).toFixed(2)}%\n\n${lastEvalEma.report}`;
      }
      await writeFileAtomic(join(out, 'classification-report.txt'), text + '\n');
    }
    await writeFileAtomic(join(out, 'summary.json'), JSON.stringify(summary, null, 2) + '\n');
    if (this.#mlflow) {
      for (const name of ARTIFACTS) if (existsSync(join(out, name))) this.#mlflow.artifact(join(out, name));
    }
  }

  /** Flushes the TensorBoard events written so far. */
  async flush(): Promise<void> {
    await this.#writer?.flush().catch(() => undefined);
  }

  /** Closes the log and the TensorBoard writer. */
  async close(): Promise<void> {
    this.#logger?.close();
    this.#logger = null;
    this.#mlflow?.close();
    const writer = this.#writer;
    this.#writer = null;
    await writer?.close();
  }
}
