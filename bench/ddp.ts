/**
 * Data-parallel scaling on the CPU: 2 processes of 1 OpenMP thread each, training with
 * DistributedDataParallel over Gloo on half the batch each, against 1 process of 2 threads on the
 * whole batch (bench/ddp-worker.ts in both). Reports images/s of both and their ratio, the bytes
 * all-reduced per step, and the share of the all-reduce time that ran while backward was still
 * running (from the group's collective records and the workers' backward timestamps).
 * @packageDocumentation
 */
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { spawnRanks } from './spawn-ranks.js';

/** What a worker prints. */
interface WorkerReport {
  stepMs: number[];
  buckets: number;
  bytesPerStep: number;
  reduceMsPerStep: number;
  hiddenShare: number;
}

/** Options of {@link benchDataParallel}. */
export interface DataParallelBenchOptions {
  /** ResNet depth (18 or 50). */
  depth: 18 | 50;
  /** Image side (the small-image stem). */
  size: number;
  /** Global batch: each of the 2 ranks takes half. */
  batch: number;
  /** Timed steps (after one warm-up step). */
  steps: number;
}

/** One row of the data-parallel table. */
export interface DataParallelRow {
  /** ResNet depth. */
  depth: number;
  /** Image side. */
  size: number;
  /** Global batch. */
  batch: number;
  /** Timed steps. */
  steps: number;
  /** 2 ranks x 1 thread: global images per second (the slower rank's median step). */
  ddpImagesPerSec: number;
  /** 1 process x 2 threads on the whole batch. */
  singleImagesPerSec: number;
  /** `ddpImagesPerSec / singleImagesPerSec`. */
  ratio: number;
  /** Gradient buckets (25 MiB). */
  buckets: number;
  /** Bytes all-reduced per step by each rank. */
  bytesPerStep: number;
  /** All-reduce time per step (the group thread's run time), ms, mean over ranks. */
  allReduceMsPerStep: number;
  /** Share of that time during backward, mean over ranks (0 to 1). */
  hiddenShare: number;
}

function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

function mean(values: readonly number[]): number {
  return values.reduce((a, b) => a + b, 0) / values.length;
}

/** Runs both configurations, one after the other, and compares them. */
export async function benchDataParallel(options: DataParallelBenchOptions): Promise<DataParallelRow> {
  const { depth, size, batch, steps } = options;
  if (batch % 2 !== 0) throw new Error(`benchDataParallel: the batch must be even, got ${batch}`);
  const worker = join(dirname(fileURLToPath(import.meta.url)), 'ddp-worker.js');
  const common = [String(depth), String(size)];
  const timeoutMs = 600_000;
  const ranks = (await spawnRanks(
    worker,
    ['ddp', ...common, String(batch / 2), String(steps)],
    2,
    1,
    timeoutMs,
  )) as WorkerReport[];
  const singles = (await spawnRanks(
    worker,
    ['single', ...common, String(batch), String(steps)],
    1,
    2,
    timeoutMs,
  )) as WorkerReport[];
  const ddpStepMs = Math.max(...ranks.map((r) => median(r.stepMs)));
  const ddpImagesPerSec = batch / (ddpStepMs / 1000);
  const singleImagesPerSec = batch / (median(singles[0]!.stepMs) / 1000);
  return {
    depth,
    size,
    batch,
    steps,
    ddpImagesPerSec,
    singleImagesPerSec,
    ratio: ddpImagesPerSec / singleImagesPerSec,
    buckets: ranks[0]!.buckets,
    bytesPerStep: ranks[0]!.bytesPerStep,
    allReduceMsPerStep: mean(ranks.map((r) => r.reduceMsPerStep)),
    hiddenShare: mean(ranks.map((r) => r.hiddenShare)),
  };
}
