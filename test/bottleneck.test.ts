/**
 * The bottleneck report: the rules on constructed measurements (each verdict, the thresholds, the
 * advice), the host-synchronisation counter, the driver reading on the CPU, the Trainer's measured
 * phases on small CPU runs (a slow loader is data-bound, a plain run compute-bound), the log and
 * TensorBoard records, and `doctor --run`.
 */
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  BatchNorm2d,
  Conv2d,
  DataLoader,
  Flatten,
  Linear,
  ReLU,
  SGD,
  Sequential,
  AdaptiveAvgPool2d,
  ShapesDataset,
  SyntheticDataset,
  Tensor,
  BOTTLENECK_THRESHOLDS,
  combineMeasurements,
  deviceUtilization,
  diagnoseBottleneck,
  estimateDeviceMs,
  hostSyncStats,
  readRunBottleneck,
  synchronize,
  type BottleneckContext,
  type StepMeasurements,
} from '../lib/index.js';
import type { Dataset, RawSample } from '../lib/data/types.js';
import { Trainer, type Callback } from '../lib/train/trainer.js';
import { runCli } from './helpers/cli.js';

const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-bottleneck-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const context: BottleneckContext = { batchSize: 32, workers: 2, prefetch: 2, amp: false, logEvery: 10, cpus: 8 };

/** Measurements of a CPU step of `wallMs` split into the given parts (the host takes the rest). */
function cpu(
  parts: { loader?: number; device?: number; sync?: number; syncs?: number },
  wallMs = 100,
): StepMeasurements {
  const loaderMs = parts.loader ?? 0;
  const deviceMs = parts.device ?? 0;
  const syncMs = parts.sync ?? 0;
  return {
    device: 'cpu',
    steps: 20,
    wallMs,
    loaderMs,
    hostMs: wallMs - loaderMs - deviceMs - syncMs,
    deviceMs,
    deviceSource: 'calls',
    syncMs,
    syncsPerStep: parts.syncs ?? 0.1,
    gpuUtilization: null,
  };
}

/** Measurements of a CUDA step: the JS thread's time is loader + host + sync; the device overlaps. */
function cuda(parts: {
  loader?: number;
  host: number;
  sync?: number;
  syncs?: number;
  util?: number | null;
}): StepMeasurements {
  const loaderMs = parts.loader ?? 0;
  const syncMs = parts.sync ?? 0;
  const wallMs = loaderMs + parts.host + syncMs;
  const gpuUtilization = parts.util ?? null;
  const device = estimateDeviceMs({ wallMs, loaderMs, syncMs, gpuUtilization });
  return {
    device: 'cuda:0',
    steps: 50,
    wallMs,
    loaderMs,
    hostMs: parts.host,
    deviceMs: device.deviceMs,
    deviceSource: device.source,
    syncMs,
    syncsPerStep: parts.syncs ?? 1.1,
    gpuUtilization,
  };
}

describe('diagnoseBottleneck: the rules', () => {
  it('data: the loader wait at the threshold share is data-bound, just under it is not', () => {
    const at = diagnoseBottleneck(cpu({ loader: 20, device: 70 }), context);
    expect(at.kind).toBe('data');
    expect(at.shares.loader).toBeCloseTo(0.2, 12);
    expect(diagnoseBottleneck(cpu({ loader: 19.9, device: 70 }), context).kind).toBe('device');
    // Data wins over a larger device share: the loader is the first thing to fix.
    expect(diagnoseBottleneck(cpu({ loader: 25, device: 70 }), context).kind).toBe('data');
  });

  it('device and host: whichever is busier, on the CPU and on CUDA', () => {
    expect(diagnoseBottleneck(cpu({ device: 51 }), context).kind).toBe('device');
    expect(diagnoseBottleneck(cpu({ device: 40 }), context).kind).toBe('host');
    // CUDA with NVML: the GPU ran 95% of the step, the host issued for 30%.
    const busy = diagnoseBottleneck(cuda({ host: 30, sync: 70, util: 0.95 }), context);
    expect(busy.kind).toBe('device');
    expect(busy.shares.device).toBeCloseTo(0.95, 12);
    // CUDA, the host issues for 90% of the step and the GPU idles (35% busy).
    expect(diagnoseBottleneck(cuda({ host: 90, sync: 10, util: 0.35 }), context).kind).toBe('host');
  });

  it('syncs: needs more than the threshold of waits per step, their share, the host share, and a GPU not saturated', () => {
    const base = { host: 40, sync: 30, loader: 5, util: 0.5 };
    const t = BOTTLENECK_THRESHOLDS;
    expect(diagnoseBottleneck(cuda({ ...base, syncs: t.syncsPerStep + 0.5 }), context).kind).toBe('syncs');
    expect(diagnoseBottleneck(cuda({ ...base, syncs: t.syncsPerStep }), context).kind).not.toBe('syncs');
    // Waits under the share threshold: 10 of 75 ms.
    expect(diagnoseBottleneck(cuda({ host: 60, sync: 10, loader: 5, util: 0.5, syncs: 3 }), context).kind).toBe('host');
    // The host hardly works (20% < 25%): the device is what the host waits for.
    expect(diagnoseBottleneck(cuda({ host: 20, sync: 75, loader: 5, util: 0.5, syncs: 3 }), context).kind).toBe(
      'device',
    );
    // A saturated GPU: the waits are the device's compute.
    expect(diagnoseBottleneck(cuda({ ...base, util: 0.95, syncs: 3 }), context).kind).toBe('device');
    // On the CPU with many reads that cost time (reachable there too).
    expect(diagnoseBottleneck(cpu({ device: 30, sync: 20, syncs: 4 }), context).kind).toBe('syncs');
  });

  it('the summary carries the numbers; the advice is concrete and fits the settings', () => {
    const data = diagnoseBottleneck(cpu({ loader: 40, device: 50 }), { ...context, workers: 2 });
    expect(data.summary).toMatch(/^data loading limits the run: 100 ms\/step over 20 steps; data 40% \(40\.0 ms\)/);
    expect(data.advice[0]).toContain('`--workers 4` (now 2, on 8 CPUs)');
    expect(data.advice[1]).toContain('`prefetch: 4` (now 2)');
    const inThread = diagnoseBottleneck(cpu({ loader: 40 }), { ...context, workers: 0 }).advice;
    expect(inThread[0]).toContain('--workers 4');
    expect(inThread.join('\n')).not.toContain('prefetch'); // nothing is prepared ahead without workers
    expect(diagnoseBottleneck(cpu({ loader: 40 }), { ...context, workers: 7 }).advice[0]).toContain(
      'already use every core',
    );
    const syncs = diagnoseBottleneck(cuda({ host: 40, sync: 30, util: 0.5, syncs: 3 }), { ...context, logEvery: 1 });
    expect(syncs.advice[0]).toContain('`--print-freq 10`');
    expect(syncs.advice.join('\n')).toContain('bench --cuda-graph');
    const host = diagnoseBottleneck(cuda({ host: 90, sync: 10, util: 0.3 }), context);
    expect(host.advice[0]).toContain('bench --cuda-graph');
    expect(host.advice.join('\n')).toContain('`-b 64`');
    const device = diagnoseBottleneck(cpu({ device: 90 }), context);
    expect(device.advice[0]).toContain('--amp bf16');
    expect(device.advice.join('\n')).toContain('channels-last');
    expect(diagnoseBottleneck(cpu({ device: 90 }), { ...context, amp: 'bf16' }).advice[0]).not.toContain('--amp');
    expect(diagnoseBottleneck(cuda({ host: 10, sync: 90, util: 0.97 }), context).advice.join('\n')).toContain(
      'resnet-cuda launch',
    );
  });

  it('refuses bad measurements and settings, naming the field', () => {
    expect(() => diagnoseBottleneck({ ...cpu({}), wallMs: -1 }, context)).toThrow(/measurements\.wallMs/);
    expect(() => diagnoseBottleneck({ ...cpu({}), steps: 0 }, context)).toThrow(/measurements\.steps/);
    expect(() => diagnoseBottleneck({ ...cpu({}), gpuUtilization: 1.5 }, context)).toThrow(
      /measurements\.gpuUtilization/,
    );
    expect(() => diagnoseBottleneck(cpu({}), { ...context, workers: -1 })).toThrow(/context\.workers/);
    expect(() => diagnoseBottleneck(cpu({}), { ...context, amp: 'fp8' as never })).toThrow(/context\.amp/);
  });
});

describe('estimateDeviceMs and combineMeasurements', () => {
  it('device time from NVML, from a full queue (upper bound), or the waits (lower bound)', () => {
    expect(estimateDeviceMs({ wallMs: 100, loaderMs: 10, syncMs: 50, gpuUtilization: 0.8 })).toEqual({
      deviceMs: 80,
      source: 'nvml',
    });
    expect(estimateDeviceMs({ wallMs: 100, loaderMs: 10, syncMs: 10, gpuUtilization: null })).toEqual({
      deviceMs: 90,
      source: 'waits',
    });
    expect(estimateDeviceMs({ wallMs: 100, loaderMs: 10, syncMs: 9.9, gpuUtilization: null })).toEqual({
      deviceMs: 9.9,
      source: 'waits',
    });
  });

  it('combines epochs weighted by their steps', () => {
    const a = { ...cpu({ loader: 10, device: 60 }), steps: 10 };
    const b = { ...cpu({ loader: 40, device: 20 }, 200), steps: 30 };
    const c = combineMeasurements([a, b]);
    expect(c?.steps).toBe(40);
    expect(c?.wallMs).toBeCloseTo((10 * 100 + 30 * 200) / 40, 12);
    expect(c?.loaderMs).toBeCloseTo((10 * 10 + 30 * 40) / 40, 12);
    expect(c?.gpuUtilization).toBeNull();
    expect(combineMeasurements([])).toBeNull();
  });
});

describe('host synchronisations and the driver reading', () => {
  it('counts reads of device memory and synchronize, with their time', () => {
    const t = Tensor.full([1], 3);
    const before = hostSyncStats();
    expect(t.item()).toBe(3);
    t.toArray();
    synchronize('cpu');
    t.copyFromHost(new Float32Array([1])); // a copy to the CPU waits for nothing: not counted
    const after = hostSyncStats();
    expect(after.count - before.count).toBe(3);
    expect(after.milliseconds).toBeGreaterThanOrEqual(before.milliseconds);
    t.dispose();
  });

  it('the CPU has no driver reading: available false, with the reason', () => {
    const r = deviceUtilization('cpu');
    expect(r.available).toBe(false);
    expect(r.reason).toMatch(/NVML reports NVIDIA GPUs only/);
    expect(() => deviceUtilization('gpu')).toThrow(/Expected 'cpu', 'cuda' or 'cuda:N'/);
  });
});

/** A convolutional classifier; with 32 and 64 channels its compute outweighs the loop around it. */
function convNet(width = 32): Sequential {
  return new Sequential(
    new Conv2d({ inChannels: 3, outChannels: width, kernelSize: 3, padding: 1, seed: 1 }),
    new BatchNorm2d({ numFeatures: width }),
    new ReLU(),
    new Conv2d({ inChannels: width, outChannels: 2 * width, kernelSize: 3, stride: 2, padding: 1, seed: 2 }),
    new BatchNorm2d({ numFeatures: 2 * width }),
    new ReLU(),
    new AdaptiveAvgPool2d(1),
    new Flatten(),
    new Linear({ inFeatures: 2 * width, outFeatures: 4, seed: 3 }),
  );
}

/** A linear classifier of 8 x 8 images: next to no compute. */
function linearNet(): Sequential {
  return new Sequential(new Flatten(), new Linear({ inFeatures: 8 * 8 * 3, outFeatures: 4, seed: 1 }));
}

/** A dataset whose every `get` first sleeps `ms` (a slow disk or decoder). */
class SlowDataset implements Dataset {
  readonly #inner: Dataset;
  readonly #ms: number;
  constructor(inner: Dataset, ms: number) {
    this.#inner = inner;
    this.#ms = ms;
  }
  get length(): number {
    return this.#inner.length;
  }
  get classes(): readonly string[] {
    return this.#inner.classes;
  }
  get imageShape(): readonly [number, number, number] | undefined {
    return this.#inner.imageShape;
  }
  label(index: number): number {
    return this.#inner.label(index);
  }
  async get(index: number): Promise<RawSample> {
    await new Promise((resolve) => setTimeout(resolve, this.#ms));
    return this.#inner.get(index);
  }
  spec(): ReturnType<Dataset['spec']> {
    return this.#inner.spec();
  }
}

interface BottleneckLine {
  type: string;
  epoch: number;
  kind: string;
  measurements: StepMeasurements;
}

/** Trains `epochs` epochs on `dataset` in a new run folder; returns the folder, the log's bottleneck records and the epoch seconds. */
async function train(
  name: string,
  dataset: Dataset,
  model: Sequential,
  options: { epochs?: number; callbacks?: Callback[] } = {},
): Promise<{ out: string; records: BottleneckLine[]; seconds: number[]; progress: string }> {
  const out = join(dir, name);
  let progress = '';
  const trainer = new Trainer({
    model,
    optimizer: new SGD(model, { lr: 0.01, momentum: 0.9 }),
    outDir: out,
    plots: false,
    checkpoint: false,
    logEvery: 4,
    progress: { write: (s: string) => void (progress += s) },
    callbacks: options.callbacks ?? [],
  });
  const loader = new DataLoader(dataset, { batchSize: 16, workers: 0 });
  try {
    const result = await trainer.fit(loader, { epochs: options.epochs ?? 1 });
    const records = readFileSync(join(out, 'log.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as BottleneckLine)
      .filter((r) => r.type === 'bottleneck');
    return { out, records, seconds: result.history.map((h) => h.seconds), progress };
  } finally {
    await trainer.dispose();
    await loader.close();
  }
}

let plain: ReturnType<typeof train> | undefined;
/**
 * A plain small run (9 steps of a convolutional network on generated data), trained once for the
 * tests that read it. The network is wide enough that a step's compute (tens of milliseconds) dwarfs
 * the loader's work on the training thread, even when other processes hold the cores.
 */
function plainRun(): ReturnType<typeof train> {
  const synthetic = new SyntheticDataset({ length: 16 * 9, height: 24, width: 24, classes: 4, seed: 3 });
  return (plain ??= train('plain', synthetic, convNet(96)));
}

describe('the Trainer measures its steps (CPU)', () => {
  it('loader wait + host + device + syncs make the step; the steps make the epoch; a slow callback is host time', async () => {
    const busyMs = 4;
    // A callback that keeps the training thread busy: host time, by definition.
    const busy: Callback = {
      onStepEnd: () => {
        const end = performance.now() + busyMs;
        while (performance.now() < end);
      },
    };
    const data = new SyntheticDataset({ length: 16 * 8, height: 16, width: 16, classes: 4, seed: 1 });
    const { records, seconds } = await train('phases', data, convNet(8), { epochs: 2, callbacks: [busy] });
    expect(records.map((r) => r.epoch)).toEqual([0, 1]);
    for (const r of records) {
      const m = r.measurements;
      expect(m.deviceSource).toBe('calls');
      // Nothing double-counted: the parts measured on their own fit in the step (1% for rounding).
      expect(m.loaderMs + m.deviceMs + m.syncMs).toBeLessThanOrEqual(m.wallMs * 1.01);
      expect(m.loaderMs + m.hostMs + m.deviceMs + m.syncMs).toBeCloseTo(m.wallMs, 6);
      // A step's wall time runs from the end of the step before to its own end, so it holds the
      // previous step's onStepEnd. An epoch's first measured step follows the break between epochs
      // (epoch 2), or the left-out first step whose callback it holds (epoch 1): at least
      // steps - 1 of the busy callbacks are in the epoch's steps.
      expect(m.hostMs).toBeGreaterThanOrEqual((busyMs * (m.steps - 1)) / m.steps);
      expect(m.deviceMs).toBeGreaterThan(0);
      expect(m.loaderMs).toBeGreaterThan(0);
      // The loss is read after every 4th step (logEvery); copies to the CPU wait for nothing. The read
      // after an epoch's last step falls between epochs, so each epoch counts one read: in its 5th step.
      expect(m.syncsPerStep * m.steps).toBeCloseTo(1, 9);
    }
    // Epoch 2 measures all its 8 steps: their wall times make the epoch's training time (EpochMeter's
    // clock, which also holds the epoch's set-up and last loss read) within 10% + 5 ms.
    const second = records[1]!.measurements;
    expect(second.steps).toBe(8);
    expect(records[0]!.measurements.steps).toBe(7); // the Trainer's first step (plan creation) is left out
    const epochMs = seconds[1]! * 1000;
    expect(second.steps * second.wallMs).toBeLessThanOrEqual(epochMs);
    expect(second.steps * second.wallMs).toBeGreaterThan(epochMs * 0.9 - 5);
  });

  it('a slow loader is diagnosed as data-bound; a plain tiny run as compute-bound', async () => {
    const shapes = new ShapesDataset({ length: 16 * 4, size: 8, classes: 4, seed: 2 });
    const slow = await train('slow', new SlowDataset(shapes, 4), linearNet());
    const s = slow.records[0]!;
    expect(s.kind).toBe('data');
    // 16 samples, each awaiting a 4 ms timer: at least 64 ms of every step waits for the loader.
    expect(s.measurements.loaderMs).toBeGreaterThanOrEqual(60);
    expect(slow.progress).toMatch(/bottleneck: data loading limits the run/);
    expect(slow.progress).toMatch(/--workers/);

    const plain = await plainRun();
    expect(plain.records[0]!.kind).toBe('device');
    expect(plain.progress).toMatch(/bottleneck: device compute limits the run/);
  });

  it('writes the TensorBoard scalars, and doctor --run reads the verdict back', async () => {
    const { out } = await plainRun();
    const events = readdirSync(join(out, 'tensorboard')).map((f) => readFileSync(join(out, 'tensorboard', f)));
    const all = Buffer.concat(events).toString('latin1');
    for (const tag of ['bottleneck/wall_ms', 'bottleneck/loader_ms', 'bottleneck/device_ms', 'bottleneck/sync_ms']) {
      expect(all).toContain(tag);
    }
    // No GPU: no gpu/* scalars and no monitor record.
    expect(all).not.toContain('gpu/utilization');

    const report = readRunBottleneck(out);
    expect(report.overall.kind).toBe('device');
    const text = await runCli(['doctor', '--run', out], dir);
    expect(text.code).toBe(0);
    expect(text.stdout).toContain('epoch 1: device');
    expect(text.stdout).toMatch(/device compute limits the run: [\d.]+ ms\/step over 8 steps/);
    expect(text.stdout).toMatch(/what to change:\n {2}- `--amp bf16`/);
    const json = await runCli(['doctor', '--run', out, '--json'], dir);
    expect((JSON.parse(json.stdout) as { overall: { kind: string } }).overall.kind).toBe('device');
  });

  it('doctor --run on a folder without a log, or a missing folder, says so', async () => {
    const empty = join(dir, 'empty');
    mkdirSync(empty);
    const r = await runCli(['doctor', '--run', empty], dir);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/--run: .*empty has no log\.jsonl/);
    const missing = await runCli(['doctor', '--run', join(dir, 'nope')], dir);
    expect(missing.code).not.toBe(0);
    expect(missing.stderr).toMatch(/--run: .*nope: no such run folder/);
  });
});
