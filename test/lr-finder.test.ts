import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { afterAll, describe, expect, it } from 'vitest';
import {
  AdaptiveAvgPool2d,
  BatchNorm2d,
  CenterCrop,
  Compose,
  Conv2d,
  DataLoader,
  Flatten,
  Linear,
  ReLU,
  SGD,
  Sequential,
  ShapesDataset,
  type Tensor,
} from '../lib/index.js';
import type { Module, StateDict } from '../lib/nn/module.js';
import type { OptimizerState } from '../lib/optim/optimizer.js';
import {
  parseLrFinderOptions,
  smoothLosses,
  suggestLr,
  sweepLr,
  writeLrFinder,
  type LrFinderResult,
} from '../lib/train/lr-finder.js';
import { Trainer, type TrainerOptions } from '../lib/train/trainer.js';
import { defined } from './helpers/defined.js';

const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-lr-find-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function tinyNet(seed: number): Module {
  return new Sequential(
    new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 3, padding: 1, seed }),
    new BatchNorm2d({ numFeatures: 8, relu: true }),
    new Conv2d({ inChannels: 8, outChannels: 16, kernelSize: 3, stride: 2, padding: 1, seed: seed + 1 }),
    new BatchNorm2d({ numFeatures: 16 }),
    new ReLU(),
    new AdaptiveAvgPool2d(1),
    new Flatten(),
    new Linear({ inFeatures: 16, outFeatures: 4, seed: seed + 2 }),
  ).to('cpu');
}

function loader(length = 128, seed = 7): DataLoader {
  return new DataLoader(new ShapesDataset({ length, size: 16, classes: 4, seed: 3 }), {
    batchSize: 16,
    transform: new Compose([new CenterCrop({ size: 16 })]),
    workers: 0,
    shuffle: true,
    seed,
  });
}

function make(extra: Partial<TrainerOptions> = {}): Trainer {
  const model = tinyNet(1);
  return new Trainer({
    model,
    optimizer: new SGD(model, { lr: 0.05, momentum: 0.9, weightDecay: 1e-4 }),
    progress: false,
    normalize: { mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] },
    ...extra,
  });
}

/** Everything the range test may change, copied to the host. */
function capture(t: Trainer): { state: StateDict; optimizer: OptimizerState; grads: Float32Array; modes: boolean[] } {
  return {
    state: t.model.stateDict(),
    optimizer: t.optimizer.state(),
    grads: t.model.arena().grads.toFloat32Array(),
    modes: t.model.namedModules().map(([, m]) => m.training),
  };
}

/** Compares two captures bit for bit (typed arrays as bytes). */
function expectSame(a: ReturnType<typeof capture>, b: ReturnType<typeof capture>): void {
  const bytes = (v: Float32Array | BigInt64Array): Buffer => Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  expect([...a.state.keys()]).toEqual([...b.state.keys()]);
  for (const [name, entry] of a.state) {
    expect(bytes(entry.data).equals(bytes(defined(b.state.get(name), name).data)), name).toBe(true);
  }
  expect(a.optimizer.step).toBe(b.optimizer.step);
  expect(a.optimizer.paramGroups).toEqual(b.optimizer.paramGroups);
  expect(Object.keys(a.optimizer.buffers)).toEqual(Object.keys(b.optimizer.buffers));
  for (const [name, values] of Object.entries(a.optimizer.buffers)) {
    expect(bytes(values).equals(bytes(defined(b.optimizer.buffers[name], name))), name).toBe(true);
  }
  expect(bytes(a.grads).equals(bytes(b.grads))).toBe(true);
  expect(a.modes).toEqual(b.modes);
}

describe('the range test rules', () => {
  it('sweeps exponentially (or linearly) from startLr at the first step to endLr at the last', () => {
    const s = { startLr: 1e-6, endLr: 1, numIter: 7, mode: 'exp' as const };
    const lrs = Array.from({ length: 7 }, (_, i) => sweepLr(s, i));
    [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1].forEach((want, i) => expect(lrs[i]).toBeCloseTo(want, 18 - i * 3));
    // Constant ratio between steps: (endLr / startLr) ** (1 / (n - 1)).
    for (let i = 1; i < 7; i++) expect(lrs[i]! / lrs[i - 1]!).toBeCloseTo(10, 10);
    const lin = { ...s, startLr: 0.1, endLr: 0.7, mode: 'linear' as const };
    [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7].forEach((want, i) => expect(sweepLr(lin, i)).toBeCloseTo(want, 14));
  });

  it('smooths with the bias-corrected moving average (a hand computation)', () => {
    // beta 0.5: avg 0.5, 1.25, 2.125; divided by 1 - 0.5^t = 0.5, 0.75, 0.875.
    const got = smoothLosses([1, 2, 3], 0.5);
    expect(got[0]).toBeCloseTo(1, 15);
    expect(got[1]).toBeCloseTo(1.25 / 0.75, 15);
    expect(got[2]).toBeCloseTo(2.125 / 0.875, 15);
    // beta 0.98 on a constant loss is that constant from the first step (the bias correction's point).
    for (const v of smoothLosses([2.5, 2.5, 2.5, 2.5], 0.98)) expect(v).toBeCloseTo(2.5, 12);
  });

  it('suggests the steepest descent against log(lr) and the minimum / 10, inside the skipped window', () => {
    // A loss falling fastest at lr = 1e-3 (a logistic in log10(lr)), rising again after 1e-1.
    const lrs = Array.from({ length: 61 }, (_, i) => 10 ** (-6 + i / 10));
    const loss = lrs.map((lr) => 2 - 1 / (1 + Math.exp(-3 * (Math.log10(lr) + 3))) + (lr > 0.1 ? 10 * (lr - 0.1) : 0));
    const { suggestion, minimum } = suggestLr(lrs, loss, 10, 5);
    expect(defined(suggestion, 'a suggestion').index).toBe(30);
    expect(suggestion?.lr).toBeCloseTo(1e-3, 12);
    expect(defined(minimum, 'a minimum').index).toBe(50);
    expect(minimum?.lrOverTen).toBeCloseTo(1e-2, 12);
    // The window leaves out the first and last steps even when they fall faster.
    const steep = [...loss];
    steep[0] = 100;
    steep[60] = -100;
    expect(suggestLr(lrs, steep, 10, 5).suggestion?.index).toBe(30);
    expect(suggestLr(lrs.slice(0, 16), loss.slice(0, 16), 10, 5)).toEqual({ suggestion: null, minimum: null });
  });

  it('refuses bad options, naming them', () => {
    const bad: [Record<string, unknown>, RegExp][] = [
      [{ startLr: 0 }, /startLr/],
      [{ startLr: -1 }, /startLr/],
      [{ startLr: 1, endLr: 0.5 }, /above startLr \(1\) for endLr/],
      [{ numIter: 1 }, /numIter/],
      [{ numIter: 2.5 }, /numIter/],
      [{ mode: 'log' }, /mode/],
      [{ beta: 1 }, /beta/],
      [{ beta: -0.1 }, /beta/],
      [{ divergeThreshold: 1 }, /divergeThreshold/],
      [{ skipStart: -1 }, /skipStart/],
      [{ signal: 'stop' }, /signal/],
      [{ lr: 1 }, /Unknown option 'lr' in findLr options/],
    ];
    for (const [options, message] of bad) {
      expect(() => parseLrFinderOptions(options), JSON.stringify(options)).toThrow(message);
    }
    expect(parseLrFinderOptions(undefined)).toMatchObject({
      startLr: 1e-7,
      endLr: 10,
      numIter: 100,
      mode: 'exp',
      beta: 0.98,
      divergeThreshold: 4,
    });
  });
});

describe('Trainer.findLr', () => {
  it('restores model, buffers, counters, optimizer, modes and the loader epoch exactly, so that training afterwards is unchanged', async () => {
    const train = loader();
    // Both Trainers have trained a few steps first, so that momentum and BN statistics are not fresh.
    const plain = make();
    await plain.fit(train, { epochs: 1, maxSteps: 3 });
    const probed = make();
    await probed.fit(train, { epochs: 1, maxSteps: 3 });
    const before = capture(probed);
    const epoch = train.epoch;
    const result = await probed.findLr(train, { startLr: 1e-4, endLr: 1, numIter: 12 });
    expect(result.lrs).toHaveLength(12);
    expectSame(capture(probed), before);
    expect(train.epoch).toBe(epoch);
    // The same training continues identically.
    const a = await plain.fit(train, { epochs: 2 });
    const b = await probed.fit(train, { epochs: 2 });
    expect(b.history.map((h) => h.trainLoss)).toEqual(a.history.map((h) => h.trainLoss));
    expectSame(capture(probed), capture(plain));
    await plain.dispose();
    await probed.dispose();
  });

  it('restores the state in bf16 with loss scaling and accumulation too, and when cancelled', async () => {
    const t = make({ amp: 'bf16', gradScaler: { enabled: true, initScale: 1024 }, accumulate: 2 });
    const train = loader();
    const before = capture(t);
    const scale = t.scaler.state();
    const seen: number[] = [];
    const step = t.optimizer.step.bind(t.optimizer);
    t.optimizer.step = (options) => {
      seen.push(t.optimizer.paramGroups[0]?.lr ?? NaN);
      step(options);
    };
    const result = await t.findLr(train, { startLr: 1e-3, endLr: 1e-1, numIter: 4 });
    // Every step used the rate of the sweep, each over two micro-batches.
    expect(seen).toEqual(result.lrs);
    expect(result.lrs.map((lr, i) => lr / sweepLr(result.settings, i))).toEqual([1, 1, 1, 1]);
    expectSame(capture(t), before);
    expect(t.scaler.state()).toEqual(scale);
    const controller = new AbortController();
    const cancelled = t.findLr(train, { numIter: 50, signal: controller.signal });
    setImmediate(() => controller.abort());
    await expect(cancelled).rejects.toMatchObject({ name: 'AbortError' });
    expectSame(capture(t), before);
    await t.dispose();
  });

  it('stops early when a huge learning rate makes the loss diverge', async () => {
    const t = make();
    const result = await t.findLr(loader(), { startLr: 1e-3, endLr: 1e6, numIter: 100 });
    expect(result.diverged).toBe(true);
    expect(result.lrs.length).toBeLessThan(100);
    const last = defined(result.smoothedLosses.at(-1), 'the last smoothed loss');
    expect(Number.isNaN(last) || last > 4 * result.bestLoss).toBe(true);
    // Only the last step crossed the line.
    for (const v of result.smoothedLosses.slice(0, -1)) expect(v).toBeLessThanOrEqual(4 * result.bestLoss);
    expect(result.bestLoss).toBe(Math.min(...result.smoothedLosses.filter((v) => !Number.isNaN(v))));
    await t.dispose();
  });

  it('suggests a sane learning rate on the generated shapes, and draws it', async () => {
    const t = make();
    const result = await t.findLr(loader(256), { startLr: 1e-4, endLr: 10, numIter: 40 });
    const lr = defined(result.suggestion, 'a suggestion').lr;
    // SGD with momentum 0.9 on this net trains well from 0.01 to 0.1 (the Trainer tests use 0.05).
    expect(lr).toBeGreaterThan(1e-3);
    expect(lr).toBeLessThan(1);
    expect(defined(result.minimum, 'a minimum').lr).toBeGreaterThan(lr);
    // The smoothed loss fell below the loss of the first steps before the sweep ended.
    expect(result.bestLoss).toBeLessThan(defined(result.smoothedLosses[0], 'the first loss'));
    expect(result.smoothedLosses).toEqual(smoothLosses(result.losses, 0.98));
    const out = await writeLrFinder(result, join(dir, 'plot'));
    const image = await sharp(out.png).metadata();
    expect([image.width, image.height]).toEqual([800, 500]);
    const json = JSON.parse(readFileSync(out.json, 'utf8')) as LrFinderResult;
    expect(json.lrs).toEqual(result.lrs);
    expect(json.suggestion).toEqual(result.suggestion);
    await t.dispose();
  });

  it('averages the loss over the ranks in data-parallel training, so that every rank stops at the same step', async () => {
    // Two ranks with identical data (gradients averaged unchanged); the other rank's loss is twice this one's.
    const reduced: number[] = [];
    const processGroup = {
      rank: 0,
      worldSize: 2,
      allReduce(tensor: Tensor, options: { op?: string } = {}) {
        if (tensor.numel !== 1) return;
        reduced.push(tensor.item());
        if (options.op === 'avg') tensor.copyFromHost(tensor.toFloat32Array().map((v) => (v + 2 * v) / 2));
      },
      wait() {},
    };
    const single = await make().findLr(loader(), { startLr: 1e-3, endLr: 1e-1, numIter: 5 });
    const ranked = await make({ distributed: { processGroup: processGroup as never } }).findLr(loader(), {
      startLr: 1e-3,
      endLr: 1e-1,
      numIter: 5,
    });
    expect(reduced).toEqual(single.losses);
    expect(ranked.losses).toEqual(single.losses.map((v) => Math.fround(1.5 * v)));
  });

  it('refuses a non-loader and runs one call at a time', async () => {
    const t = make();
    await expect(t.findLr({ length: 1 } as never)).rejects.toThrow(/for train/);
    await expect(t.findLr(loader(), { numIter: 0 })).rejects.toThrow(/numIter/);
    const running = t.findLr(loader(), { numIter: 3 });
    await expect(t.findLr(loader(), { numIter: 3 })).rejects.toThrow(/already running findLr/);
    await running;
    await t.dispose();
  });
});
