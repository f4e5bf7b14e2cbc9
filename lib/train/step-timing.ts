/**
 * Where a training step's time goes, measured by the Trainer at a few `performance.now()` calls per
 * step: the time the training thread waits in the batch iterator (the loader), the time it spends
 * in the forward, backward and optimizer calls, the host's waits for the device (counted where they
 * happen, see `hostSyncStats`), and the step's wall time between the ends of two steps. At the end
 * of each epoch it reports the bottleneck (`bottleneck.ts`): a line, a `bottleneck` record in
 * `log.jsonl` and `bottleneck/*` TensorBoard scalars. On a CUDA device it also samples the driver's
 * utilisation and memory (NVML) at every loss read, as `gpu/utilization` and `gpu/memory_used`.
 *
 * Device time: on the CPU the ops execute in the calling thread, so it is the time in the
 * forward, backward and optimizer calls, and the step's host time is the rest (loop, callbacks,
 * logging). On CUDA those calls only queue work, so they are host time, and the device time is
 * inferred without adding any wait for the device (see `estimateDeviceMs`): from NVML's
 * utilisation when the driver provides it, else from how long the host waited for the device.
 *
 * The first step a Trainer takes is left out (it creates the plans, chooses the convolution
 * algorithms and allocates the buffers). Time spent between epochs (evaluation, checkpoints at the
 * epoch's end) is not part of any step.
 * @packageDocumentation
 */
import { availableParallelism } from 'node:os';
import { deviceUtilization, hostSyncStats, type DeviceUtilization } from '../device.js';
import {
  diagnoseBottleneck,
  estimateDeviceMs,
  type BottleneckContext,
  type BottleneckReport,
  type StepMeasurements,
} from './bottleneck.js';
import type { RunOutputs } from './run-outputs.js';

/** Bytes in a MiB, the unit `nvidia-smi` shows memory in. */
const MIB = 1024 * 1024;

/** Running sums of one stretch of steps, in milliseconds. */
interface Sums {
  steps: number;
  wall: number;
  loader: number;
  compute: number;
  sync: number;
  syncs: number;
}

function zeroSums(): Sums {
  return { steps: 0, wall: 0, loader: 0, compute: 0, sync: 0, syncs: 0 };
}

/** What the Trainer tells the timing about the epoch it starts. */
export interface TimedEpoch {
  /** The epoch, from 0. */
  epoch: number;
  /** The run settings the advice refers to. */
  context: Omit<BottleneckContext, 'cpus'>;
}

/** The Trainer's step timing and bottleneck report; see the module documentation. */
export class StepTiming {
  readonly #device: string;
  readonly #cuda: boolean;
  readonly #outputs: RunOutputs;
  #context: BottleneckContext | null = null;
  #epoch = zeroSums();
  #step = zeroSums();
  #stepStart = 0;
  #computeStart = 0;
  #computeSync = 0;
  #syncAtStepStart = { count: 0, milliseconds: 0 };
  #warm = false;
  #gpuSamples: number[] = [];
  #gpuReason: string | null = null;
  #gpuOpened = false;
  #lastKind: string | null = null;

  /**
   * @param device - the Trainer's device.
   * @param outputs - where the report goes.
   */
  constructor(device: string, outputs: RunOutputs) {
    this.#device = device;
    this.#cuda = device.startsWith('cuda');
    this.#outputs = outputs;
  }

  /** Starts an epoch's accounting and returns its batches, timed: the time waiting for each one is the loader's. */
  beginEpoch<T>(epoch: TimedEpoch, batches: AsyncIterable<T> | Iterable<T>): AsyncGenerator<T> {
    this.#context = { ...epoch.context, cpus: availableParallelism() };
    this.#epoch = zeroSums();
    this.#gpuSamples = [];
    // The first reading opens and initialises NVML (which can take a while): here, outside any step.
    if (this.#cuda && !this.#gpuOpened) {
      this.#gpuOpened = true;
      this.#checkReading(deviceUtilization(this.#device));
    }
    this.#startStep(performance.now());
    return this.#timed(batches);
  }

  async *#timed<T>(batches: AsyncIterable<T> | Iterable<T>): AsyncGenerator<T> {
    let asked = performance.now();
    let syncBefore = hostSyncStats().milliseconds;
    for await (const batch of batches) {
      // A host wait inside the iterator (the input copy to a GPU) is the device's, not the loader's.
      this.#step.loader += performance.now() - asked - (hostSyncStats().milliseconds - syncBefore);
      yield batch;
      asked = performance.now();
      syncBefore = hostSyncStats().milliseconds;
    }
  }

  /** Marks the start of forward/backward or optimizer calls. */
  computeStart(): void {
    this.#computeStart = performance.now();
    this.#computeSync = hostSyncStats().milliseconds;
  }

  /** Marks their end. */
  computeEnd(): void {
    this.#step.compute += performance.now() - this.#computeStart - (hostSyncStats().milliseconds - this.#computeSync);
  }

  /** Ends an optimizer step: its wall time runs from the end of the previous one. */
  stepEnd(): void {
    const now = performance.now();
    const sync = hostSyncStats();
    const s = this.#step;
    if (this.#warm) {
      this.#epoch.steps++;
      this.#epoch.wall += now - this.#stepStart;
      this.#epoch.loader += s.loader;
      this.#epoch.compute += s.compute;
      this.#epoch.sync += sync.milliseconds - this.#syncAtStepStart.milliseconds;
      this.#epoch.syncs += sync.count - this.#syncAtStepStart.count;
    }
    this.#warm = true;
    this.#startStep(now);
  }

  #startStep(now: number): void {
    this.#step = zeroSums();
    this.#stepStart = now;
    this.#syncAtStepStart = hostSyncStats();
  }

  /**
   * At a loss read (the logging interval): on CUDA, samples the driver's utilisation and memory
   * and writes them to TensorBoard; the first time the driver gives none, logs why, once.
   */
  sampleDevice(step: number): void {
    if (!this.#cuda || this.#gpuReason !== null) return;
    const reading = deviceUtilization(this.#device);
    if (!this.#checkReading(reading)) return;
    this.#gpuSamples.push(reading.gpuPercent / 100);
    this.#outputs.scalar('gpu/utilization', reading.gpuPercent, step);
    this.#outputs.scalar('gpu/memory_used', reading.memoryUsedBytes / MIB, step);
  }

  /** Whether `reading` is one; the first time it is not, logs why (once: later readings are not taken). */
  #checkReading(reading: DeviceUtilization): boolean {
    if (reading.available) return true;
    this.#gpuReason = reading.reason ?? 'no reading';
    this.#outputs.log({ type: 'gpu-monitor', device: this.#device, available: false, reason: this.#gpuReason });
    return false;
  }

  /** The epoch's mean per-step measurements, or null when no step was measured. */
  measurements(): StepMeasurements | null {
    const e = this.#epoch;
    if (e.steps === 0) return null;
    const per = (v: number): number => v / e.steps;
    const wallMs = per(e.wall);
    const loaderMs = Math.max(0, per(e.loader));
    const syncMs = per(e.sync);
    const gpuUtilization =
      this.#gpuSamples.length > 0 ? this.#gpuSamples.reduce((a, b) => a + b, 0) / this.#gpuSamples.length : null;
    const device = this.#cuda
      ? estimateDeviceMs({ wallMs, loaderMs, syncMs, gpuUtilization })
      : { deviceMs: Math.max(0, per(e.compute)), source: 'calls' as const };
    // The training thread's time is loader waits + host-device waits + its own work (on the CPU,
    // the compute calls are the device's).
    const hostMs = Math.max(0, wallMs - loaderMs - syncMs - (this.#cuda ? 0 : device.deviceMs));
    return {
      device: this.#device,
      steps: e.steps,
      wallMs,
      loaderMs,
      hostMs,
      deviceMs: device.deviceMs,
      deviceSource: device.source,
      syncMs,
      syncsPerStep: e.syncs / e.steps,
      gpuUtilization,
    };
  }

  /**
   * Ends the epoch: diagnoses it, prints the verdict (with the advice when it changed), and writes
   * the `bottleneck` record and scalars. Returns the report, or null when no step was measured.
   */
  endEpoch(epoch: number, step: number): BottleneckReport | null {
    const m = this.measurements();
    if (m === null || this.#context === null) return null;
    const report = diagnoseBottleneck(m, this.#context);
    this.#outputs.log({
      type: 'bottleneck',
      epoch,
      step,
      kind: report.kind,
      summary: report.summary,
      advice: report.advice,
      measurements: report.measurements,
      shares: report.shares,
      context: this.#context,
      ...(this.#gpuReason !== null ? { gpuMonitor: this.#gpuReason } : {}),
    });
    for (const [tag, value] of [
      ['wall_ms', m.wallMs],
      ['loader_ms', m.loaderMs],
      ['host_ms', m.hostMs],
      ['device_ms', m.deviceMs],
      ['sync_ms', m.syncMs],
      ['syncs_per_step', m.syncsPerStep],
    ] as const) {
      this.#outputs.scalar(`bottleneck/${tag}`, value, step);
    }
    this.#outputs.say(`bottleneck: ${report.summary}`);
    if (report.kind !== this.#lastKind) {
      for (const line of report.advice) this.#outputs.say(`  - ${line}`);
      this.#lastKind = report.kind;
    }
    return report;
  }
}
