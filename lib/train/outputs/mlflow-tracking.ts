/**
 * A training run folder tracked as an MLflow run: the run is started on the first `fit`, its id
 * kept in the folder's `mlflow-run.json` so that a resumed run continues the same MLflow run, and
 * the Trainer's scalars, parameters and final files go to it.
 * @packageDocumentation
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Module } from '../../nn/module.js';
import type { Optimizer } from '../../optim/optimizer.js';
import {
  MlflowRun,
  flattenParams,
  writeFileAtomicSync,
  type MlflowRunOptions,
  type MlflowRunStatus,
} from './mlflow.js';

/** The file of a run folder naming its MLflow run. */
export const MLFLOW_POINTER = 'mlflow-run.json';

/** What the pointer file holds. */
interface Pointer {
  trackingDir: string;
  experimentId: string;
  runId: string;
}

function readPointer(path: string): Pointer | null {
  if (!existsSync(path)) return null;
  try {
    const p = JSON.parse(readFileSync(path, 'utf8')) as Partial<Pointer>;
    return typeof p.trackingDir === 'string' && typeof p.runId === 'string' && typeof p.experimentId === 'string'
      ? { trackingDir: p.trackingDir, experimentId: p.experimentId, runId: p.runId }
      : null;
  } catch {
    return null;
  }
}

/** The MLflow run of one training run folder. */
export class MlflowTracking {
  readonly #outDir: string;
  readonly #options: MlflowRunOptions;
  #run: MlflowRun | null = null;

  /**
   * @param outDir - the training run's folder (it keeps `mlflow-run.json`).
   * @param options - where and under which experiment and name the run is tracked.
   */
  constructor(outDir: string, options: MlflowRunOptions) {
    this.#outDir = outDir;
    this.#options = options;
  }

  /** The MLflow run, once begun. */
  get run(): MlflowRun | null {
    return this.#run;
  }

  /**
   * Starts the run, or continues it: a second `fit` of the same Trainer, or (`resumed`) a run
   * resumed from this folder whose MLflow run is still in the store, goes on in the same run.
   * Parameters already logged keep their first value.
   */
  begin(resumed: boolean, params: Record<string, string>): void {
    const pointerFile = join(this.#outDir, MLFLOW_POINTER);
    if (this.#run && this.#run.status !== 'RUNNING') {
      this.#run = MlflowRun.reopen(this.#run.trackingDir, this.#run.runId);
    }
    if (!this.#run && resumed) {
      const pointer = readPointer(pointerFile);
      if (pointer) this.#run = MlflowRun.reopen(pointer.trackingDir, pointer.runId);
    }
    if (!this.#run) {
      this.#run = MlflowRun.start(this.#options);
      const pointer: Pointer = {
        trackingDir: this.#run.trackingDir,
        experimentId: this.#run.experimentId,
        runId: this.#run.runId,
      };
      writeFileAtomicSync(pointerFile, JSON.stringify(pointer, null, 2) + '\n');
    }
    this.#run.logParams(params, { keepExisting: true });
  }

  /** Appends a metric value at `step`. */
  metric(key: string, value: number, step: number): void {
    this.#run?.logMetric(key, value, step);
  }

  /** Stores a file of the run folder as an artifact. */
  artifact(file: string): void {
    this.#run?.logArtifact(file);
  }

  /** Ends the run with `status`. */
  end(status: Exclude<MlflowRunStatus, 'RUNNING'>): void {
    if (this.#run?.status === 'RUNNING') this.#run.end(status);
  }

  /** Closes the metric files (the run keeps its status). */
  close(): void {
    this.#run?.close();
  }
}

/**
 * The parameters a Trainer records: the model's class and size, the optimizer's class and its
 * first group's settings, the Trainer's settings, and the caller's `config`, flattened.
 */
export function trainingParams(parts: {
  model: Module;
  optimizer: Optimizer<{ lr: number }>;
  settings: Record<string, unknown>;
  config: Record<string, unknown>;
}): Record<string, string> {
  const group = { ...parts.optimizer.paramGroups[0] } as Record<string, unknown>;
  delete group.params;
  return {
    model: parts.model.constructor.name,
    num_parameters: String(parts.model.numParameters()),
    optimizer: parts.optimizer.constructor.name,
    param_groups: String(parts.optimizer.paramGroups.length),
    ...flattenParams(group, 'optimizer.'),
    ...flattenParams(parts.settings),
    ...flattenParams(parts.config, 'config.'),
  };
}
