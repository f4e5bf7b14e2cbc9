/**
 * The bottleneck report of a finished (or running) training run, read back from its `log.jsonl`:
 * the `bottleneck` records the Trainer writes at the end of each epoch, diagnosed again over the
 * whole run (what `resnet-cuda doctor --run DIR` prints).
 * @packageDocumentation
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { ResnetError, invalid } from '../errors.js';
import {
  combineMeasurements,
  diagnoseBottleneck,
  type BottleneckContext,
  type BottleneckKind,
  type BottleneckReport,
  type StepMeasurements,
} from './bottleneck.js';

/** One epoch's verdict as the run logged it. */
export interface EpochBottleneck {
  epoch: number;
  step: number;
  kind: BottleneckKind;
  summary: string;
  measurements: StepMeasurements;
}

/** A run's bottleneck report. */
export interface RunBottleneck {
  /** The run folder. */
  dir: string;
  /** Every epoch's verdict, in order. */
  epochs: EpochBottleneck[];
  /** The verdict over all the run's measured steps (step-weighted), with the last epoch's settings. */
  overall: BottleneckReport;
  /** Why the GPU utilisation is missing, when the run logged why. */
  gpuMonitor?: string;
}

/** A logged record that is a well-formed `bottleneck` record. */
interface BottleneckRecord {
  epoch: number;
  step: number;
  kind: BottleneckKind;
  summary: string;
  measurements: StepMeasurements;
  context: BottleneckContext;
  gpuMonitor?: string;
}

function isBottleneckRecord(value: unknown): value is BottleneckRecord {
  if (value === null || typeof value !== 'object') return false;
  const r = value as Record<string, unknown>;
  return (
    r.type === 'bottleneck' &&
    typeof r.epoch === 'number' &&
    typeof r.kind === 'string' &&
    typeof r.measurements === 'object' &&
    typeof r.context === 'object'
  );
}

/**
 * Reads the bottleneck records of the run in `dir` (its `log.jsonl`) and diagnoses the whole run.
 * Throws `ERR_RC_INVALID_ARGUMENT` naming the folder when it does not exist, has no `log.jsonl`, or
 * the log has no bottleneck record (no epoch finished, or a run from before the report existed).
 */
export function readRunBottleneck(dir: string): RunBottleneck {
  if (typeof dir !== 'string' || dir.length === 0) invalid('dir', 'a run folder', dir);
  if (!existsSync(dir) || !statSync(dir).isDirectory()) {
    throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `${dir}: no such run folder`);
  }
  const log = join(dir, 'log.jsonl');
  if (!existsSync(log)) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `${dir} has no log.jsonl: give the output folder of a \`resnet-cuda train\` run (its --output-dir)`,
    );
  }
  const records: BottleneckRecord[] = [];
  for (const line of readFileSync(log, 'utf8').split('\n')) {
    if (line.trim() === '') continue;
    let parsed: unknown;
    try {
      parsed = JSON.parse(line);
    } catch {
      continue; // a line cut short by a crash; the others still count
    }
    if (isBottleneckRecord(parsed)) records.push(parsed);
  }
  const last = records[records.length - 1];
  if (last === undefined) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `${log} has no bottleneck record: the run has not finished an epoch yet (the report is written at the end of each)`,
    );
  }
  const combined = combineMeasurements(records.map((r) => r.measurements));
  if (combined === null) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `${log}: no measured steps`);
  const monitor = records.find((r) => typeof r.gpuMonitor === 'string')?.gpuMonitor;
  return {
    dir,
    epochs: records.map((r) => ({
      epoch: r.epoch,
      step: r.step,
      kind: r.kind,
      summary: r.summary,
      measurements: r.measurements,
    })),
    overall: diagnoseBottleneck(combined, last.context),
    ...(monitor !== undefined ? { gpuMonitor: monitor } : {}),
  };
}
