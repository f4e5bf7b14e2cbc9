/**
 * The profiler (lib/profile): the ops and layer paths it records for a small ResNet's training
 * step, its op times against the step's wall time on the CPU, the Chrome trace read back, the
 * tables' totals, nothing recorded without a running profiler, `--profile-steps` and
 * `bench --profile` on the command line; and on the emulated CUDA device, the events it records
 * around each op and reads after the window.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  AdaptiveAvgPool2d,
  BatchNorm2d,
  Conv2d,
  CrossEntropyLoss,
  CudaGraph,
  Flatten,
  InputNormalize,
  Linear,
  MaxPool2d,
  ReLU,
  ResNet18,
  SGD,
  Sequential,
  ShapesDataset,
  Tensor,
  benchmarkTraining,
  listBackends,
  type Module,
} from '../lib/index.js';
import { addon } from '../lib/binding.js';
import { opRecorder } from '../lib/profile/hooks.js';
import { Profiler, type ProfileResult } from '../lib/profile/profiler.js';
import { ProfileStepsCallback, parseStepRange } from '../lib/profile/trainer-callback.js';
import type { ChromeTrace } from '../lib/profile/chrome-trace.js';
import { runCli } from './helpers/cli.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const dir = mkdtempSync(join(tmpdir(), 'rc-profiler-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

// In the test project that runs on the emulated CUDA device only the CUDA cases run.
const onlyCuda = process.env.RESNET_TEST_BACKENDS === 'cuda';

/** One training step of `model` on fixed images: conversion, forward, loss, backward, SGD, zeroing. */
function stepper(model: Module, device: string, batch: number, size: number, classes: number): () => void {
  const normalize = new InputNormalize();
  const loss = new CrossEntropyLoss();
  const optimizer = new SGD(model, { lr: 0.01, momentum: 0.9 });
  const pixels = Uint8Array.from({ length: batch * size * size * 3 }, (_, i) => (i * 2654435761) >>> 24);
  const images = Tensor.from(pixels, [batch, size, size, 3], { dtype: 'u8', device });
  const labels = Tensor.from(
    Array.from({ length: batch }, (_, i) => i % classes),
    [batch],
    { dtype: 'i32', device },
  );
  return () => {
    loss.forward(model.forward(normalize.forward(images)), labels);
    model.backward(loss.backward());
    optimizer.step();
    optimizer.zeroGrad();
  };
}

/** The number of modules of `model` of class `type`. */
function count(model: Module, type: abstract new (...args: never[]) => Module): number {
  return model.namedModules().filter(([, m]) => m instanceof type).length;
}

/** Calls per op type of a recording. */
function callsByOp(result: ProfileResult): Map<string, number> {
  const calls = new Map<string, number>();
  for (const op of result.ops) calls.set(op.op, (calls.get(op.op) ?? 0) + 1);
  return calls;
}

describe.skipIf(onlyCuda)('Profiler on the CPU', () => {
  const model = ResNet18({ numClasses: 4, smallInput: true, seed: 1 });
  const step = stepper(model, 'cpu', 8, 32, 4);
  const STEPS = 4;
  let prof: Profiler;
  let result: ProfileResult;
  const walls: number[] = [];

  beforeAll(() => {
    step(); // plans and buffers are made outside the profiled window
    prof = new Profiler({ model, firstStep: 1 }).start();
    for (let i = 0; i < STEPS; i++) {
      const t0 = performance.now();
      step();
      walls.push(performance.now() - t0);
      prof.step();
    }
    result = prof.stop();
  });

  it('records every leaf op of a ResNet-18 step with its layer path, step by step', () => {
    expect(result.steps.map((s) => s.step)).toEqual([1, 2, 3, 4]);
    const convs = count(model, Conv2d);
    const bns = count(model, BatchNorm2d);
    const expected = new Map([
      ['convert_input', 1],
      ['conv2d.forward', convs],
      ['conv2d.backward_weights', convs],
      // The stem's input is the image, which needs no gradient.
      ['conv2d.backward_data', convs - 1],
      ['batchnorm.forward', bns],
      ['batchnorm.backward', bns],
      // No residual add in backward: each block's first convolution adds the main branch's input
      // gradient into the shortcut's in its backward data.
      ['avg_pool2d.forward', 1],
      ['avg_pool2d.backward', 1],
      ['linear.forward', 1],
      ['linear.backward_weights', 1],
      ['linear.backward_data', 1],
      ['cross_entropy', 1],
      ['sgd.step', 1],
      ['zero_grad', 1],
    ]);
    const calls = callsByOp(result);
    expect([...calls.keys()].sort()).toEqual([...expected.keys()].sort());
    for (const [op, perStep] of expected) expect(calls.get(op), op).toBe(perStep * STEPS);
    const layers = new Set(result.ops.map((op) => op.layer));
    for (const layer of ['conv1', 'bn1', 'layer1.0.conv1', 'layer2.0.downsample.0', 'layer4.1.bn2', 'fc', 'avgpool']) {
      expect(layers, layer).toContain(layer);
    }
    for (const layer of ['input', 'loss', 'optimizer']) expect(layers).toContain(layer);
    // A block has no op of its own: its first convolution sums its input gradients.
    expect(layers).not.toContain('layer1.0');
    const stem = result.ops.filter((op) => op.layer === 'conv1').map((op) => op.op);
    expect(stem.sort()).toEqual([
      ...Array<string>(STEPS).fill('conv2d.backward_weights'),
      ...Array<string>(STEPS).fill('conv2d.forward'),
    ]);
    for (const op of result.ops) {
      expect(op.device).toBe('cpu');
      expect(op.duration).toBeGreaterThanOrEqual(0);
      // On the CPU the op's time is its host call.
      expect(op.start).toBe(op.hostStart);
      expect(op.duration).toBeCloseTo(op.hostEnd - op.hostStart, 9);
      const s = result.steps.find((x) => x.step === op.step);
      expect(op.hostStart).toBeGreaterThanOrEqual(s?.hostStart ?? Infinity);
      expect(op.hostEnd).toBeLessThanOrEqual(s?.hostEnd ?? -Infinity);
    }
  });

  it("sums the op times to within 10% of the step's measured wall time", () => {
    const opMs = result.ops.reduce((sum, op) => sum + op.duration, 0);
    const wallMs = walls.reduce((a, b) => a + b, 0);
    expect(opMs).toBeLessThanOrEqual(wallMs);
    expect(Math.abs(opMs - wallMs) / wallMs).toBeLessThan(0.1);
    // The profiler's own steps enclose the measured ones.
    const stepMs = result.steps.reduce((sum, s) => sum + s.duration, 0);
    expect(stepMs).toBeGreaterThanOrEqual(wallMs);
  });

  it('totals by op type and by layer add up to the recorded ops, and the table shows them', () => {
    const summary = prof.summary();
    expect(summary.steps).toBe(STEPS);
    const opMs = result.ops.reduce((sum, op) => sum + op.duration, 0);
    expect(summary.opMs).toBeCloseTo(opMs, 9);
    expect(summary.byOp.reduce((sum, r) => sum + r.totalMs, 0)).toBeCloseTo(opMs, 9);
    expect(summary.byLayer.reduce((sum, r) => sum + r.calls, 0)).toBe(result.ops.length);
    const conv = summary.byOp.find((r) => r.name === 'conv2d.forward');
    const convOps = result.ops.filter((op) => op.op === 'conv2d.forward');
    expect(conv?.calls).toBe(convOps.length);
    expect(conv?.totalMs).toBeCloseTo(
      convOps.reduce((sum, op) => sum + op.duration, 0),
      9,
    );
    expect(conv?.percentOfStep).toBeCloseTo((100 * (conv?.totalMs ?? 0)) / summary.stepMs, 9);
    // Longest first.
    for (let i = 1; i < summary.byOp.length; i++) {
      expect(summary.byOp[i - 1]!.totalMs).toBeGreaterThanOrEqual(summary.byOp[i]!.totalMs);
    }
    const table = prof.table({ topLayers: 5 });
    expect(table).toMatch(/^profile: 4 steps on cpu, \d+\.\d{3} ms per step \(host time\); ops account for \d+\.\d%/);
    expect(table).toMatch(/^conv2d\.backward_weights\s+80\s+\d+\.\d{3}\s+\d+\.\d{3}\s+\d+\.\d$/m);
    const lines = table.trimEnd().split('\n');
    const header = lines.findIndex((line) => /^top 5 layers\s+calls/.test(line));
    expect(lines.slice(header + 1).map((line) => line.split(/\s+/)[0])).toEqual(
      summary.byLayer.slice(0, 5).map((r) => r.name),
    );
  });

  it('writes a Chrome trace of complete events that parses back to the recording', () => {
    const path = join(dir, 'trace.json');
    prof.writeChromeTrace(path);
    const trace = JSON.parse(readFileSync(path, 'utf8')) as ChromeTrace;
    expect(trace.displayTimeUnit).toBe('ms');
    const complete = trace.traceEvents.filter((e) => e.ph === 'X');
    const steps = complete.filter((e) => e.cat === 'step');
    expect(steps.map((e) => e.name)).toEqual(['ProfilerStep#1', 'ProfilerStep#2', 'ProfilerStep#3', 'ProfilerStep#4']);
    const ops = complete.filter((e) => e.cat === 'op');
    expect(ops).toHaveLength(result.ops.length);
    for (const e of complete) {
      expect(e.pid).toBe(1);
      expect(e.tid).toBe(1);
      expect(e.ts).toBeGreaterThanOrEqual(0);
      expect(e.dur).toBeGreaterThanOrEqual(0);
    }
    const first = ops[0];
    expect(first?.name).toBe('convert_input');
    expect(first?.args).toEqual({ layer: 'input', device: 'cpu', step: 1 });
    expect(first?.ts).toBeCloseTo((result.ops[0]?.hostStart ?? NaN) * 1000, 2);
    const traced = ops.reduce((sum, e) => sum + (e.dur ?? 0), 0) / 1000;
    expect(traced).toBeCloseTo(prof.summary().opMs, 1);
    // Read from the file alone: the ops' durations cover the measured steps to within 10%.
    const wallMs = walls.reduce((a, b) => a + b, 0);
    expect(traced).toBeLessThanOrEqual(wallMs);
    expect(Math.abs(traced - wallMs) / wallMs).toBeLessThan(0.1);
    const names = trace.traceEvents.filter((e) => e.ph === 'M').map((e) => e.args?.name);
    expect(names).toEqual(['resnet-cuda', 'host']);
  });

  it('records nothing when no profiler runs, and one profiler runs at a time', () => {
    expect(opRecorder).toBeNull();
    const before = result.ops.length;
    step();
    expect(prof.result().ops).toHaveLength(before);
    const other = new Profiler().start();
    expect(() => new Profiler().start()).toThrow(/another profiler is running/);
    expect(() => other.start()).toThrow(/already started/);
    step();
    const second = other.stop();
    // Without a model, layers are named by their class.
    expect(new Set(second.ops.map((op) => op.layer))).toContain('Conv2d');
    expect(second.steps).toHaveLength(1);
    expect(second.ops.length).toBe(result.ops.length / STEPS);
    expect(() => other.stop()).toThrow(/not running \(it was stopped\)/);
    expect(() => other.start()).toThrow(/already recorded its window/);
    expect(() => new Profiler().step()).toThrow(/not running \(call start\(\) first\)/);
    expect(() => new Profiler().summary()).toThrow(/call stop\(\) first/);
    expect(() => new Profiler({ model: {} as never })).toThrow(/model/);
    expect(() => new Profiler({ firstStep: -1 })).toThrow(/firstStep/);
    expect(opRecorder).toBeNull();
  });

  it('refuses device timing marks on the CPU with a clear error', () => {
    expect(() => addon().profileMark({ device: 'cpu' })).toThrow(/device timing marks needs a CUDA device/);
    expect(() => addon().profileRead({ device: 'cpu' })).toThrow(/device timing marks needs a CUDA device/);
  });

  it('names max pooling and ReLU ops in a plain Sequential', () => {
    const net = new Sequential(
      new Conv2d({ inChannels: 3, outChannels: 4, kernelSize: 3, padding: 1, seed: 1 }),
      new ReLU(),
      new MaxPool2d({ kernelSize: 2 }),
      new AdaptiveAvgPool2d(1),
      new Flatten(),
      new Linear({ inFeatures: 4, outFeatures: 2, seed: 2 }),
    );
    net.requiresInputGrad = false;
    const run = stepper(net, 'cpu', 2, 8, 2);
    const p = new Profiler({ model: net }).start();
    run();
    const calls = callsByOp(p.stop());
    for (const op of ['relu.forward', 'relu.backward', 'max_pool2d.forward', 'max_pool2d.backward']) {
      expect(calls.get(op), op).toBe(1);
    }
    const layers = new Set(p.result().ops.map((op) => op.layer));
    expect([...layers].filter((l) => /^\d$/.test(l)).sort()).toEqual(['0', '1', '2', '3', '5']);
  });
});

describe.skipIf(onlyCuda)('--profile-steps and bench --profile', () => {
  it('reads step ranges and refuses bad ones with the reason', async () => {
    expect(parseStepRange('3:5')).toEqual({ first: 3, last: 5 });
    expect(parseStepRange('7')).toEqual({ first: 7, last: 7 });
    expect(parseStepRange(' 2 : 2 ')).toEqual({ first: 2, last: 2 });
    expect(() => parseStepRange('5:3')).toThrow(/--profile-steps: the last step \(3\) comes before the first \(5\)/);
    expect(() => parseStepRange('0:2')).toThrow(/--profile-steps: steps count from 1; got '0:2'/);
    for (const bad of ['a:b', '1:', ':2', '1-3', '1.5:2', '', '-1:2']) {
      expect(() => parseStepRange(bad), bad).toThrow(/--profile-steps expects A:B, the first and last optimizer step/);
    }
    const run = await runCli(['train', '--profile-steps', '4:2'], dir);
    expect(run.code).toBe(2);
    expect(run.stderr).toMatch(
      /^resnet-cuda train: --profile-steps: the last step \(2\) comes before the first \(4\)/m,
    );
    const other = await runCli(['train', '--profile-steps', 'x'], dir);
    expect(other.stderr).toMatch(/--profile-steps expects A:B/);
    const model = ResNet18({ numClasses: 2, smallInput: true, seed: 1 });
    const options = { model, device: 'cpu', numClasses: 2, batch: 1, size: 8, cudaGraph: true };
    expect(() => benchmarkTraining({ ...options, profiler: new Profiler() })).toThrow(
      /profiler and cudaGraph exclude each other/,
    );
    expect(() => benchmarkTraining({ ...options, cudaGraph: false, profiler: {} as never })).toThrow(
      /Expected a Profiler for profiler/,
    );
  });

  it('a run that fails inside the range leaves no profiler running', () => {
    const model = ResNet18({ numClasses: 2, smallInput: true, seed: 1 });
    const reports: string[] = [];
    const callback = new ProfileStepsCallback({ steps: { first: 1, last: 3 }, report: (text) => reports.push(text) });
    callback.onStepBegin({ model } as never, { step: 1 });
    expect(opRecorder).not.toBeNull();
    callback.abandon();
    expect(opRecorder).toBeNull();
    expect(callback.profiler).toBeNull();
    expect(reports).toEqual([]);
    expect(() => new ProfileStepsCallback({ steps: { first: 3, last: 2 } })).toThrow(/steps/);
  });

  it('train --profile-steps A:B prints the table and writes trace.json into the run folder', async () => {
    const folder = join(dir, 'shapes');
    await ShapesDataset.writeImageFolder(join(folder, 'train'), { count: 16, size: 16, seed: 1 });
    await ShapesDataset.writeImageFolder(join(folder, 'val'), { count: 4, size: 16, seed: 2 });
    const args = [folder, '--epochs', '1', '-b', '4', '-j', '0', '--train-crop-size', '16'];
    const out2 = join(dir, 'run2');
    const profiled = await runCli(
      [
        'train',
        ...args,
        '--val-resize-size',
        '16',
        '--val-crop-size',
        '16',
        '--seed',
        '1',
        '--output-dir',
        out2,
        '--profile-steps',
        '2:3',
      ],
      dir,
    );
    expect(profiled.code, profiled.stderr).toBe(0);
    expect(profiled.stdout).toMatch(/^profile: 2 steps on cpu, /m);
    expect(profiled.stdout).toContain(`trace: ${join(out2, 'trace.json')}`);
    const trace = JSON.parse(readFileSync(join(out2, 'trace.json'), 'utf8')) as ChromeTrace;
    const steps = trace.traceEvents.filter((e) => e.cat === 'step').map((e) => e.name);
    expect(steps).toEqual(['ProfilerStep#2', 'ProfilerStep#3']);
    const convs = trace.traceEvents.filter((e) => e.name === 'conv2d.forward' && e.args?.layer === 'layer3.1.conv2');
    expect(convs.map((e) => e.args?.step)).toEqual([2, 3]);
  });

  it('bench --profile prints the table and writes the trace', async () => {
    const trace = join(dir, 'bench-trace.json');
    const args = ['bench', '--model', 'resnet18', '--size', '16', '--small-input', '-b', '2', '--steps', '2'];
    const run = await runCli(
      [...args, '--warmup', '1', '--num-classes', '4', '--profile', '--profile-trace', trace],
      dir,
    );
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/^profile: 2 steps on cpu, /m);
    expect(run.stdout).toMatch(/^sgd\.step\s+2\s/m);
    const parsed = JSON.parse(readFileSync(trace, 'utf8')) as ChromeTrace;
    expect(parsed.traceEvents.filter((e) => e.cat === 'step')).toHaveLength(2);
  });
});

describe('Profiler on CUDA', () => {
  const cuda = listBackends().find((b) => b.name === 'cuda');
  it.skipIf(!cuda?.available)(
    `records events around each op on the device's stream and reads them after the window${cuda?.available ? '' : ` (skipped: ${cuda?.reason ?? 'no CUDA backend'})`}`,
    () => {
      const net = new Sequential(
        new Conv2d({ inChannels: 3, outChannels: 4, kernelSize: 3, padding: 1, seed: 1 }),
        new BatchNorm2d({ numFeatures: 4, relu: true }),
        new MaxPool2d({ kernelSize: 2 }),
        new AdaptiveAvgPool2d(1),
        new Flatten(),
        new Linear({ inFeatures: 4, outFeatures: 2, seed: 2 }),
      ).to('cuda');
      net.requiresInputGrad = false;
      const run = stepper(net, 'cuda', 2, 8, 2);
      run();
      const prof = new Profiler({ model: net }).start();
      for (let i = 0; i < 2; i++) {
        run();
        prof.step();
      }
      const result = prof.stop();
      expect(result.devices).toEqual(['cuda:0']);
      expect(result.steps).toHaveLength(2);
      const calls = callsByOp(result);
      expect(Object.fromEntries(calls)).toEqual({
        convert_input: 2,
        'conv2d.forward': 2,
        'conv2d.backward_weights': 2,
        'batchnorm.forward': 2,
        'batchnorm.backward': 2,
        'max_pool2d.forward': 2,
        'max_pool2d.backward': 2,
        'avg_pool2d.forward': 2,
        'avg_pool2d.backward': 2,
        'linear.forward': 2,
        'linear.backward_weights': 2,
        'linear.backward_data': 2,
        cross_entropy: 2,
        'sgd.step': 2,
        zero_grad: 2,
      });
      // One stream: each op's events come after the previous op's, in the order of the calls.
      let previousEnd = 0;
      for (const op of result.ops) {
        expect(op.device).toBe('cuda:0');
        expect(Number.isFinite(op.duration)).toBe(true);
        expect(op.duration).toBeGreaterThanOrEqual(0);
        expect(op.start).toBeGreaterThanOrEqual(previousEnd - 1e-3);
        previousEnd = op.start + op.duration;
      }
      for (const s of result.steps) expect(s.duration).toBeGreaterThan(0);
      const trace = prof.chromeTrace();
      const device = trace.traceEvents.filter((e) => e.cat === 'device');
      expect(device).toHaveLength(result.ops.length);
      expect(new Set(device.map((e) => e.tid))).toEqual(new Set([2]));
      expect(trace.traceEvents.find((e) => e.ph === 'M' && e.tid === 2)?.args?.name).toBe('cuda:0 stream');
      // A new window reuses the events and starts its times afresh.
      const again = new Profiler({ model: net }).start();
      run();
      expect(again.stop().ops).toHaveLength(result.ops.length / 2);
      expect(addon().profileRead({ device: 'cuda:0' })).toHaveLength(0);
      // Ops cannot be timed inside a graph capture: refused with the reason, nothing half-recorded.
      const capturing = new Profiler({ model: net }).start();
      expect(() => CudaGraph.capture('cuda', run)).toThrow(
        /the profiler cannot time ops during a CUDA graph capture on cuda:0; stop it before capturing/,
      );
      expect(capturing.stop().ops).toHaveLength(0);
      net.dispose();
    },
  );

  it.skipIf(!cuda?.available)(
    `opens an NVTX range named after each op while it runs, and none otherwise${cuda?.available ? '' : ` (skipped: ${cuda?.reason ?? 'no CUDA backend'})`}`,
    () => {
      // The emulator prints its NVTX ranges (RESNET_CUDA_EMU_NVTX=trace) on stderr, so the program
      // runs in a child process, from the compiled package.
      const script = `
        import { Conv2d, Profiler, ReLU, Sequential, Tensor } from ${JSON.stringify(join(root, 'dist/lib/index.js'))};
        const net = new Sequential(new Conv2d({ inChannels: 3, outChannels: 2, kernelSize: 1, seed: 1 }), new ReLU()).to('cuda');
        const x = Tensor.randn([1, 2, 2, 3], { seed: 1, device: 'cuda' });
        net.forward(x);
        const prof = new Profiler({ model: net }).start();
        net.forward(x);
        prof.stop();
        net.forward(x).toFloat32Array();
      `;
      const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
        env: { ...process.env, RESNET_CUDA_EMU_NVTX: 'trace' },
        encoding: 'utf8',
      });
      expect(child.status, child.stderr).toBe(0);
      expect(child.stderr.split('\n').filter((line) => line.includes('nvtx'))).toEqual([
        'CUDA emulator: nvtx push conv2d.forward 0',
        'CUDA emulator: nvtx pop conv2d.forward 0',
        'CUDA emulator: nvtx push relu.forward 1',
        'CUDA emulator: nvtx pop relu.forward 1',
      ]);
    },
  );
});
