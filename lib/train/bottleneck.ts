/**
 * The bottleneck report: from a training run's per-step measurements (time waiting for the data
 * loader, host time, device time, host synchronisations), which one limits the run and what to
 * change. Pure functions of the numbers, so that the rules are tested on constructed measurements
 * and `resnet-cuda doctor --run DIR` reaches the same verdict from a run's log as the run did.
 *
 * The rules, in order (thresholds in {@link BOTTLENECK_THRESHOLDS}):
 *
 * 1. **data**: the training thread waited for the loader at least `dataShare` of the step. The
 *    loader's workers run beside the step, so any wait means they do not keep up.
 * 2. **syncs**: the host waited for the device more than `syncsPerStep` times per step, those waits
 *    took at least `syncShare` of the step, and the host's own work at least `syncHostShare`, while
 *    the device was not saturated (utilisation under `busyUtilization`, when known): host and
 *    device take turns instead of overlapping.
 * 3. **device** when the device's busy share is at least the host's, else **host**.
 *
 * On the CPU the ops run in the calling thread, so the device time is measured (the time in the
 * forward, backward and optimizer calls) and the four parts add up to the step. On CUDA the host
 * only queues work; see {@link estimateDeviceMs} for how the device time is inferred.
 * @packageDocumentation
 */
import { expectInt, expectNumber, expectOneOf, expectOptions, invalid } from '../errors.js';

/** What limits a run: the data loader, the host (the JavaScript thread issuing the step), the device's compute, or host-device synchronisations. */
export type BottleneckKind = 'data' | 'host' | 'device' | 'syncs';

/** How a device time was obtained: timed calls (CPU), NVML utilisation, or inferred from the host's waits (CUDA without NVML). */
export type DeviceTimeSource = 'calls' | 'nvml' | 'waits';

/** Mean per-step measurements of a stretch of training (an epoch, a run), in milliseconds. */
export interface StepMeasurements {
  /** `'cpu'` or `'cuda:N'`. */
  device: string;
  /** Optimizer steps measured. */
  steps: number;
  /** Wall time of a step. */
  wallMs: number;
  /** Time the training thread waited in the batch iterator (loader), host waits excluded. */
  loaderMs: number;
  /** Time the training thread spent issuing the step (everything but waiting for data, the device, or computing on the CPU). */
  hostMs: number;
  /** Device compute time of a step: measured on the CPU, inferred on CUDA (see `deviceSource`). */
  deviceMs: number;
  /** How `deviceMs` was obtained. */
  deviceSource: DeviceTimeSource;
  /** Time the host waited for the device (result reads, input copies to a GPU, `synchronize`). */
  syncMs: number;
  /** Host synchronisations per step. */
  syncsPerStep: number;
  /** Mean GPU utilisation reported by the driver (NVML), 0 to 1, or null when unknown. */
  gpuUtilization: number | null;
}

/** The run settings the advice refers to. */
export interface BottleneckContext {
  /** Images per micro-batch. */
  batchSize: number;
  /** Loader worker threads (0: batches are made on the training thread). */
  workers: number;
  /** Batches each worker prepares ahead. */
  prefetch: number;
  /** The Trainer's `amp`. */
  amp: 'bf16' | 'fp16' | false;
  /** Steps between loss reads (`--print-freq`, the Trainer's `logEvery`). */
  logEvery: number;
  /** CPU cores of the machine. */
  cpus: number;
}

/** The verdict, with the numbers it rests on and what to change. */
export interface BottleneckReport {
  kind: BottleneckKind;
  /** The measurements diagnosed. */
  measurements: StepMeasurements;
  /** `loader`, `host`, `sync`: shares of the step's wall time; `device`: the device's busy share (on CUDA it overlaps the others). */
  shares: { loader: number; host: number; device: number; sync: number };
  /** One line: the verdict and the per-step numbers. */
  summary: string;
  /** Concrete changes, the most effective first. */
  advice: string[];
}

/**
 * The thresholds of the rules (see the module documentation), as shares of a step's wall time,
 * except `syncsPerStep` (a count) and `busyUtilization` (NVML's 0-1 utilisation).
 * `queueFullSyncShare` is the host-wait share above which a CUDA device is taken to have had work
 * queued all along (see {@link estimateDeviceMs}). `syncsPerStep` leaves room for the waits every
 * CUDA step has: the input copy of each micro-batch (labels and images, 2 waits: the host buffer is
 * reused once the copy returns) and the loss read every `logEvery` steps; a loop reading the loss at
 * every step (`--print-freq 1`) has 3.
 */
export const BOTTLENECK_THRESHOLDS = Object.freeze({
  dataShare: 0.2,
  syncsPerStep: 2.5,
  syncShare: 0.15,
  syncHostShare: 0.25,
  busyUtilization: 0.9,
  queueFullSyncShare: 0.1,
});

const KIND_NAMES: Readonly<Record<BottleneckKind, string>> = {
  data: 'data loading',
  host: 'host overhead',
  device: 'device compute',
  syncs: 'host-device synchronisations',
};

/**
 * The device time of a CUDA step, which the host cannot time without waiting for the device:
 * - with the driver's utilisation (NVML): `utilization * wallMs`, the time a kernel was running;
 * - else, when the host waited for the device at least `queueFullSyncShare` of the step, the device
 *   had work queued all along (the host ran ahead and had to wait), so it was busy for the whole
 *   step except while the training thread waited for data: `wallMs - loaderMs` (an upper bound);
 * - else the time the host waited for it, `syncMs` (a lower bound: the device also runs while the
 *   host issues the next step).
 */
export function estimateDeviceMs(m: {
  wallMs: number;
  loaderMs: number;
  syncMs: number;
  gpuUtilization: number | null;
}): { deviceMs: number; source: DeviceTimeSource } {
  if (m.gpuUtilization !== null) return { deviceMs: m.gpuUtilization * m.wallMs, source: 'nvml' };
  if (m.wallMs > 0 && m.syncMs / m.wallMs >= BOTTLENECK_THRESHOLDS.queueFullSyncShare) {
    return { deviceMs: Math.max(0, m.wallMs - m.loaderMs), source: 'waits' };
  }
  return { deviceMs: m.syncMs, source: 'waits' };
}

/** Checks measurements read from a log or built by hand. */
function checkMeasurements(value: unknown): StepMeasurements {
  const m = expectOptions<StepMeasurements>('measurements', value, [
    'device',
    'steps',
    'wallMs',
    'loaderMs',
    'hostMs',
    'deviceMs',
    'deviceSource',
    'syncMs',
    'syncsPerStep',
    'gpuUtilization',
  ]);
  if (typeof m.device !== 'string') invalid('measurements.device', "'cpu' or 'cuda:N'", m.device);
  const time = (key: 'wallMs' | 'loaderMs' | 'hostMs' | 'deviceMs' | 'syncMs' | 'syncsPerStep'): number =>
    expectNumber(`measurements.${key}`, m[key], 0);
  const gpu = m.gpuUtilization;
  if (gpu === undefined) invalid('measurements.gpuUtilization', 'a number from 0 to 1, or null', gpu);
  return {
    device: m.device,
    steps: expectInt('measurements.steps', m.steps, 1),
    wallMs: time('wallMs'),
    loaderMs: time('loaderMs'),
    hostMs: time('hostMs'),
    deviceMs: time('deviceMs'),
    deviceSource: expectOneOf('measurements.deviceSource', m.deviceSource, ['calls', 'nvml', 'waits'] as const),
    syncMs: time('syncMs'),
    syncsPerStep: time('syncsPerStep'),
    gpuUtilization: gpu === null ? null : expectNumber('measurements.gpuUtilization', gpu, 0, 1),
  };
}

/** Checks the run settings the advice refers to. */
function checkContext(value: unknown): BottleneckContext {
  const c = expectOptions<BottleneckContext>('context', value, [
    'batchSize',
    'workers',
    'prefetch',
    'amp',
    'logEvery',
    'cpus',
  ]);
  if (c.amp !== false && c.amp !== 'bf16' && c.amp !== 'fp16') invalid('context.amp', "'bf16', 'fp16' or false", c.amp);
  return {
    batchSize: expectInt('context.batchSize', c.batchSize, 1),
    workers: expectInt('context.workers', c.workers, 0),
    prefetch: expectInt('context.prefetch', c.prefetch, 1),
    amp: c.amp,
    logEvery: expectInt('context.logEvery', c.logEvery, 1),
    cpus: expectInt('context.cpus', c.cpus, 1),
  };
}

function ms(value: number): string {
  return value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2);
}

function pct(share: number): string {
  return `${Math.round(100 * share)}%`;
}

/** The changes that address `kind`, the most effective first. */
function adviceFor(kind: BottleneckKind, m: StepMeasurements, c: BottleneckContext): string[] {
  const cuda = m.device.startsWith('cuda');
  const graphs =
    'capture the step as a CUDA graph (one launch replaces the step’s hundreds; `resnet-cuda bench --cuda-graph` measures the replayed step)';
  const out: string[] = [];
  switch (kind) {
    case 'data': {
      const spare = Math.max(1, c.cpus - 1);
      if (c.workers === 0) {
        out.push(
          `load in worker threads: \`--workers ${Math.min(4, spare)}\` (DataLoader \`workers\`); now the batches are made on the training thread`,
        );
      } else if (c.workers < spare) {
        out.push(
          `more loader workers: \`--workers ${Math.min(2 * c.workers, spare)}\` (now ${c.workers}, on ${c.cpus} CPUs)`,
        );
      } else {
        out.push(
          `the ${c.workers} workers already use every core (${c.cpus} CPUs): decode less per image (store images near the training size) or use a machine with more cores`,
        );
      }
      // Without workers nothing is prepared ahead, so prefetch does not apply.
      if (c.workers > 0) {
        out.push(
          `prefetch more batches to even out slow ones: DataLoader \`prefetch: ${2 * c.prefetch}\` (now ${c.prefetch})`,
        );
      }
      break;
    }
    case 'syncs':
      out.push(
        `read the loss less often: \`--print-freq ${Math.max(10, 10 * c.logEvery)}\` (Trainer \`logEvery\`, now ${c.logEvery}); every read waits for the device`,
        'read no values (`StepInfo.loss()`, `item()`, `toArray()`) in step callbacks',
      );
      if (cuda) out.push(graphs);
      break;
    case 'host':
      if (cuda) out.push(graphs);
      out.push(
        `a larger batch: \`-b ${2 * c.batchSize}\` issues the same per-step host work for twice the images`,
        'keep step callbacks light (they run on the training thread between steps)',
      );
      break;
    case 'device':
      if (c.amp === false) {
        out.push(
          cuda
            ? '`--amp bf16` (Trainer `amp: "bf16"`): tensor-core convolutions and half the activation memory traffic'
            : '`--amp bf16` (Trainer `amp: "bf16"`): faster on CPUs with AVX512-BF16 or AMX, half the activation memory traffic',
        );
      }
      if (cuda && m.gpuUtilization !== null && m.gpuUtilization >= BOTTLENECK_THRESHOLDS.busyUtilization) {
        out.push(
          `the GPU is busy ${pct(m.gpuUtilization)} of the time: more GPUs (\`resnet-cuda launch --nproc-per-node N\`) or a faster one`,
        );
      } else if (cuda) {
        out.push(`a larger batch: \`-b ${2 * c.batchSize}\` gives each kernel more work to fill the GPU`);
      } else {
        out.push('more cores: the CPU backend uses one thread per core (OMP_NUM_THREADS)');
      }
      out.push('activations are already channels-last (NHWC) throughout: nothing to change there');
      break;
  }
  return out;
}

/**
 * Says which part limits a run, with the numbers and what to change; see the module
 * documentation for the rules.
 */
export function diagnoseBottleneck(measurements: StepMeasurements, context: BottleneckContext): BottleneckReport {
  const m = checkMeasurements(measurements);
  const c = checkContext(context);
  const wall = Math.max(m.wallMs, 1e-9);
  const shares = {
    loader: m.loaderMs / wall,
    host: m.hostMs / wall,
    device: Math.min(1, m.deviceMs / wall),
    sync: m.syncMs / wall,
  };
  const t = BOTTLENECK_THRESHOLDS;
  const saturated = m.gpuUtilization !== null && m.gpuUtilization >= t.busyUtilization;
  let kind: BottleneckKind;
  if (shares.loader >= t.dataShare) kind = 'data';
  else if (
    m.syncsPerStep > t.syncsPerStep &&
    shares.sync >= t.syncShare &&
    shares.host >= t.syncHostShare &&
    !saturated
  ) {
    kind = 'syncs';
  } else kind = shares.device >= shares.host ? 'device' : 'host';
  const deviceText =
    m.deviceSource === 'calls'
      ? `device ${pct(shares.device)} (${ms(m.deviceMs)} ms)`
      : `device busy ~${pct(shares.device)} (${ms(m.deviceMs)} ms, ${m.deviceSource === 'nvml' ? 'from NVML' : 'inferred from the host’s waits'})`;
  const summary =
    `${KIND_NAMES[kind]} limits the run: ${ms(m.wallMs)} ms/step over ${m.steps} steps; ` +
    `data ${pct(shares.loader)} (${ms(m.loaderMs)} ms), host ${pct(shares.host)} (${ms(m.hostMs)} ms), ${deviceText}, ` +
    `syncs ${pct(shares.sync)} (${ms(m.syncMs)} ms, ${m.syncsPerStep.toFixed(2)}/step)` +
    (m.gpuUtilization !== null ? `, GPU utilisation ${pct(m.gpuUtilization)}` : '');
  return { kind, measurements: { ...m }, shares, summary, advice: adviceFor(kind, m, c) };
}

/**
 * The step-weighted mean of several stretches' measurements (the epochs of a run), on one device;
 * null for none. The GPU utilisation is averaged over the stretches that have one.
 */
export function combineMeasurements(parts: readonly StepMeasurements[]): StepMeasurements | null {
  if (!Array.isArray(parts)) invalid('parts', 'an array of step measurements', parts);
  if (parts.length === 0) return null;
  const checked = parts.map((p) => checkMeasurements(p));
  const steps = checked.reduce((a, p) => a + p.steps, 0);
  const mean = (key: 'wallMs' | 'loaderMs' | 'hostMs' | 'deviceMs' | 'syncMs' | 'syncsPerStep'): number =>
    checked.reduce((a, p) => a + p[key] * p.steps, 0) / steps;
  const withGpu = checked.filter((p) => p.gpuUtilization !== null);
  const gpuSteps = withGpu.reduce((a, p) => a + p.steps, 0);
  const last = checked[checked.length - 1]!;
  return {
    device: last.device,
    steps,
    wallMs: mean('wallMs'),
    loaderMs: mean('loaderMs'),
    hostMs: mean('hostMs'),
    deviceMs: mean('deviceMs'),
    deviceSource: last.deviceSource,
    syncMs: mean('syncMs'),
    syncsPerStep: mean('syncsPerStep'),
    gpuUtilization: gpuSteps > 0 ? withGpu.reduce((a, p) => a + (p.gpuUtilization ?? 0) * p.steps, 0) / gpuSteps : null,
  };
}
