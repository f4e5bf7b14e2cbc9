/**
 * Reading back an MLflow file store written by the trainer: its meta.yaml files, run folders and
 * metric files directly, and a run as MLflow's own client sees it (test/mlflow/read_run.py), when
 * RESNET_MLFLOW_PYTHON names a Python with `mlflow` installed.
 * @packageDocumentation
 */
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { parseFlatYaml } from '../../lib/train/outputs/mlflow.js';

/** The Python with `mlflow` installed that RESNET_MLFLOW_PYTHON names, if any. */
export const MLFLOW_PYTHON = process.env.RESNET_MLFLOW_PYTHON;

/** Added to the title of a case that needs {@link MLFLOW_PYTHON} when it is not set (the case is skipped). */
export const MLFLOW_SKIPPED = MLFLOW_PYTHON
  ? ''
  : ' (skipped: set RESNET_MLFLOW_PYTHON to a Python with mlflow installed)';

/** The meta.yaml in the folder `join(...parts)` of a store, parsed. */
export function readMeta(...parts: string[]): Record<string, string | number | null> {
  return parseFlatYaml(readFileSync(join(...parts, 'meta.yaml'), 'utf8'));
}

/** The run ids (the 32-hex-digit folders) of an experiment folder. */
export function runIds(experimentDir: string): string[] {
  return readdirSync(experimentDir).filter((n) => /^[0-9a-f]{32}$/.test(n));
}

/** A metric file's lines as [timestamp, value, step]. */
export function metricLines(runDir: string, key: string): [number, number, number][] {
  return readFileSync(join(runDir, 'metrics', key), 'utf8')
    .trim()
    .split('\n')
    .map((line) => {
      const [t, v, s] = line.split(' ');
      return [Number(t), Number(v), Number(s)];
    });
}

/** A run as MlflowClient reads it (what test/mlflow/read_run.py prints). */
export interface MlflowClientRun {
  /** [id, name] of every experiment, by id. */
  experiments: [string, string][];
  experiment_id: string;
  run_name: string;
  status: string;
  params: Record<string, string>;
  /** The last value of each metric. */
  metrics: Record<string, number>;
  tags: Record<string, string>;
  /** Each metric's history as [step, value, timestamp]. */
  history: Record<string, [number, number, number][]>;
  /** Every artifact file, its path relative to the run's artifacts and its size in bytes. */
  artifacts: { path: string; size: number }[];
}

/** Run `runId` of the file store at `root`, read by MlflowClient through {@link MLFLOW_PYTHON} (which must be set). */
export function readWithMlflowClient(root: string, runId: string): MlflowClientRun {
  if (MLFLOW_PYTHON === undefined) throw new Error('readWithMlflowClient: RESNET_MLFLOW_PYTHON is not set');
  const script = join(import.meta.dirname, '..', 'mlflow', 'read_run.py');
  const text = execFileSync(MLFLOW_PYTHON, [script, root, runId], { encoding: 'utf8', timeout: 120_000 });
  return JSON.parse(text) as MlflowClientRun;
}
