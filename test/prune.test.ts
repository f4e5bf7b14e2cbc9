import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { afterAll, describe, expect, it } from 'vitest';
import { decodeOnnxModel } from '../lib/export/onnx-schema.js';
import { exportOnnxBytes } from '../lib/export/onnx.js';
import {
  AdamW,
  AdaptiveAvgPool2d,
  BatchNorm2d,
  CenterCrop,
  Compose,
  Conv2d,
  CrossEntropyLoss,
  DataLoader,
  Flatten,
  Linear,
  MagnitudePruner,
  PruningCallback,
  ReLU,
  ResNet,
  ResNet18,
  Random,
  SGD,
  Sequential,
  ShapesDataset,
  Tensor,
  Trainer,
  gradualSparsity,
  isPruningStep,
  loadWeights,
  pruneChannels,
  saveWeights,
  weightSparsity,
  type Module,
} from '../lib/index.js';
import { defined } from './helpers/defined.js';
import { eagerLogits, nhwcToNchw, randomizeBatchNorms, relativeError, runOnnx, shapeImages } from './helpers/onnx.js';

const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-prune-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function tinyNet(seed: number): Module {
  return new Sequential(
    new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 3, padding: 1, seed }),
    new BatchNorm2d({ numFeatures: 8 }),
    new ReLU(),
    new Conv2d({ inChannels: 8, outChannels: 16, kernelSize: 3, stride: 2, padding: 1, seed: seed + 1 }),
    new BatchNorm2d({ numFeatures: 16, relu: true }),
    new AdaptiveAvgPool2d(1),
    new Flatten(),
    new Linear({ inFeatures: 16, outFeatures: 4, seed: seed + 2 }),
  ).to('cpu');
}

/** The submodule at `path`, checked to be a `type`. */
function layer<T extends Module>(model: Module, path: string, type: abstract new (...args: never[]) => T): T {
  const m = model.getSubmodule(path);
  if (!(m instanceof type)) throw new Error(`'${path}' is a ${m.constructor.name}, not a ${type.name}`);
  return m;
}

/** The prunable weights' values, by parameter name. */
function weightValues(model: Module): Map<string, Float32Array> {
  const out = new Map<string, Float32Array>();
  for (const [name, m] of model.namedModules()) {
    if (m instanceof Conv2d || m instanceof Linear) out.set(`${name}.weight`, m.weight.values());
  }
  return out;
}

function batch(seed: number, n = 8, size = 16): { x: Tensor; labels: Int32Array } {
  const rng = new Random(seed);
  const x = new Float32Array(n * size * size * 3);
  for (let i = 0; i < x.length; i++) x[i] = rng.normal();
  return { x: Tensor.from(x, [n, size, size, 3]), labels: Int32Array.from({ length: n }, (_, i) => i % 4) };
}

/** Runs `steps` real optimizer steps, applying the mask after each, and checks the masked values stay 0. */
function trainMasked(
  model: Module,
  optimizer: { step(): void; zeroGrad(): void },
  pruner: MagnitudePruner,
  steps: number,
): void {
  const loss = new CrossEntropyLoss();
  const masks = pruner.masks();
  const before = weightValues(model);
  for (let step = 0; step < steps; step++) {
    const { x, labels } = batch(step);
    loss.forward(model.forward(x), labels);
    model.backward(loss.backward());
    optimizer.step();
    optimizer.zeroGrad();
    pruner.apply();
    x.dispose();
    const values = weightValues(model);
    for (const [name, mask] of masks) {
      const w = values.get(name);
      expect(w, name).toBeDefined();
      let leaked = 0;
      mask.forEach((keep, i) => {
        if (keep === 0 && w?.[i] !== 0) leaked++;
      });
      expect(leaked, `${name} after step ${step + 1}`).toBe(0);
    }
  }
  // The steps were real: kept weights moved.
  const after = weightValues(model);
  let moved = 0;
  for (const [name, mask] of masks) {
    const a = after.get(name);
    const b = before.get(name);
    mask.forEach((keep, i) => {
      if (keep === 1 && a?.[i] !== b?.[i]) moved++;
    });
  }
  expect(moved).toBeGreaterThan(0);
}

describe('gradual sparsity schedule (Zhu & Gupta 2017)', () => {
  const schedule = { initialSparsity: 0.1, finalSparsity: 0.9, startStep: 100, endStep: 500, frequency: 50 };

  it('follows the cubic formula between the start and the end', () => {
    expect(gradualSparsity(99, schedule)).toBe(0);
    expect(gradualSparsity(100, schedule)).toBeCloseTo(0.1, 12);
    // s_t = s_f + (s_i - s_f)(1 - (t - t0)/(n dt))^3 at t - t0 = 200 of 400
    expect(gradualSparsity(300, schedule)).toBeCloseTo(0.9 + (0.1 - 0.9) * 0.5 ** 3, 12);
    expect(gradualSparsity(400, schedule)).toBeCloseTo(0.9 + (0.1 - 0.9) * 0.25 ** 3, 12);
    expect(gradualSparsity(500, schedule)).toBe(0.9);
    expect(gradualSparsity(10_000, schedule)).toBe(0.9);
    expect([99, 100, 120, 150, 450, 500, 550].map((t) => isPruningStep(t, schedule))).toEqual([
      false,
      true,
      false,
      true,
      true,
      true,
      false,
    ]);
  });

  it('refuses bad schedules, naming the field', () => {
    expect(() => gradualSparsity(0, { finalSparsity: 1.5 })).toThrow(/finalSparsity/);
    expect(() => gradualSparsity(0, { finalSparsity: 0.5, initialSparsity: 0.8 })).toThrow(/initialSparsity/);
    expect(() => gradualSparsity(0, { finalSparsity: 0.5, startStep: 10, endStep: 5 })).toThrow(/endStep/);
    expect(() => gradualSparsity(0, { finalSparsity: 0.5, frequency: 0 })).toThrow(/frequency/);
    expect(() => gradualSparsity(0, { finalSparsity: 0.5, every: 3 } as never)).toThrow(/every/);
  });
});

describe('global magnitude pruning', () => {
  it('masks exactly the target fraction of the conv and linear weights, the smallest in magnitude across all', () => {
    const model = tinyNet(1);
    const bnBefore = layer(model, '1', BatchNorm2d).weight.values();
    using pruner = new MagnitudePruner(model);
    expect(pruner.targets.map(([n]) => n)).toEqual(['0.weight', '3.weight', '7.weight']);
    const total = 8 * 27 + 16 * 72 + 4 * 16;
    expect(pruner.size).toBe(total);
    pruner.prune(0.37);
    const k = Math.round(0.37 * total);
    const values = [...weightValues(model).values()].flatMap((v) => [...v]);
    expect(values.filter((v) => v === 0)).toHaveLength(k);
    expect(pruner.sparsity).toBe(k / total);
    expect(weightSparsity(model)).toBe(k / total);
    const masks = [...pruner.masks().values()].flatMap((m) => [...m]);
    const prunedMax = Math.max(
      ...[...weightValues(tinyNet(1)).values()]
        .flatMap((v) => [...v])
        .filter((_, i) => masks[i] === 0)
        .map(Math.abs),
    );
    const keptMin = Math.min(...values.filter((_, i) => masks[i] === 1).map(Math.abs));
    expect(prunedMax).toBeLessThanOrEqual(keptMin);
    // Some weights of every tensor are pruned (global, not per tensor), and BN/bias are untouched.
    expect(layer(model, '1', BatchNorm2d).weight.values()).toEqual(bnBefore);
    expect(
      layer(model, '7', Linear)
        .bias?.values()
        .every((v) => v !== 0),
    ).toBe(true);
    // The mask only grows; a lower target keeps it.
    pruner.prune(0.1);
    expect(pruner.sparsity).toBe(k / total);
    pruner.prune(0.8);
    expect(weightSparsity(model)).toBe(Math.round(0.8 * total) / total);
    const stillPruned = [...pruner.masks().values()].flatMap((m) => [...m]);
    expect(masks.every((m, i) => m === 1 || stillPruned[i] === 0)).toBe(true);
    model.dispose();
  });

  it('keeps pruned weights exactly zero through SGD steps with momentum, Nesterov and weight decay', () => {
    const model = tinyNet(2);
    using pruner = new MagnitudePruner(model);
    pruner.prune(0.6);
    const optimizer = new SGD(model, { lr: 0.1, momentum: 0.9, nesterov: true, weightDecay: 1e-2 });
    trainMasked(model, optimizer, pruner, 4);
    model.dispose();
  });

  it('keeps pruned weights exactly zero through AdamW steps with decoupled weight decay', () => {
    const model = tinyNet(3);
    using pruner = new MagnitudePruner(model, { exclude: ['7.weight'] });
    expect(pruner.targets.map(([n]) => n)).toEqual(['0.weight', '3.weight']);
    pruner.prune(0.5);
    const optimizer = new AdamW(model, { lr: 0.01, weightDecay: 0.05 });
    trainMasked(model, optimizer, pruner, 4);
    expect(
      layer(model, '7', Linear)
        .weight.values()
        .every((v) => v !== 0),
    ).toBe(true);
    model.dispose();
  });

  it('takes the mask back from the zeros of saved weights', async () => {
    const model = tinyNet(4);
    using pruner = new MagnitudePruner(model);
    pruner.prune(0.45);
    const file = join(dir, 'sparse.safetensors');
    await saveWeights(file, model);
    const again = tinyNet(5);
    await loadWeights(file, again);
    using restored = new MagnitudePruner(again);
    restored.maskFromZeros();
    expect(restored.sparsity).toBe(pruner.sparsity);
    expect(restored.masks()).toEqual(pruner.masks());
    model.dispose();
    again.dispose();
  });

  it('prunes gradually through the Trainer, reaching the final sparsity with the weights kept zero', async () => {
    const model = tinyNet(6);
    const callback = new PruningCallback(model, { finalSparsity: 0.75, startStep: 1, endStep: 5, frequency: 2 });
    const seen: number[] = [];
    const trainer = new Trainer({
      model,
      optimizer: new SGD(model, { lr: 0.05, momentum: 0.9, weightDecay: 1e-3 }),
      progress: false,
      normalize: { mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] },
      callbacks: [callback, { onStepEnd: () => void seen.push(weightSparsity(model)) }],
    });
    const data = new DataLoader(new ShapesDataset({ length: 96, size: 16, classes: 4, seed: 3 }), {
      batchSize: 16,
      transform: new Compose([new CenterCrop({ size: 16 })]),
      workers: 0,
    });
    await trainer.fit(data, { epochs: 1 });
    const total = 8 * 27 + 16 * 72 + 4 * 16;
    const expected = [1, 2, 3, 4, 5, 6].map((t) => {
      const last = [5, 3, 1].find((u) => u <= t); // the latest pruning step so far
      return last === undefined ? 0 : Math.round(gradualSparsity(last, callback.schedule) * total) / total;
    });
    expect(seen).toEqual(expected);
    expect(seen.at(-1)).toBe(Math.round(0.75 * total) / total);
    model.dispose();
  });

  it('prunes at once when training starts past the schedule (fine-tuning), and takes a resumed mask from the zeros', () => {
    const model = tinyNet(8);
    const total = 8 * 27 + 16 * 72 + 4 * 16;
    const callback = new PruningCallback(model, { finalSparsity: 0.6, startStep: 0, endStep: 0 });
    callback.onFitBegin(null, { step: 0 });
    callback.onStepEnd(null, { step: 1 });
    expect(weightSparsity(model)).toBe(Math.round(0.6 * total) / total);
    callback.onFitEnd();
    // A resumed run (step > 0) starts from the zeros the checkpoint holds.
    const resumed = new PruningCallback(model, { finalSparsity: 0.9, startStep: 0, endStep: 100, frequency: 50 });
    resumed.onFitBegin(null, { step: 20 });
    expect(resumed.pruner?.sparsity).toBe(Math.round(0.6 * total) / total);
    resumed.onFitEnd();
    model.dispose();
  });

  it('refuses bad arguments', () => {
    const model = tinyNet(7);
    expect(() => new MagnitudePruner(model, { exclude: ['nope.weight'] })).toThrow(/exclude/);
    expect(() => new MagnitudePruner(model, { keep: 1 } as never)).toThrow(/keep/);
    using pruner = new MagnitudePruner(model);
    expect(() => pruner.prune(1.2)).toThrow(/sparsity/);
    expect(() => new PruningCallback(model, { finalSparsity: -0.1 })).toThrow(/finalSparsity/);
    model.dispose();
  });
});

/** Sets the BN parameters and statistics of a model to varied values, and zeroes γ and β of `amount` of each inner BN's channels. */
function prepareForChannelPruning(model: ResNet, amount: number, seed: number): void {
  const rng = new Random(seed);
  const innerBn = model.depth >= 50 ? /^layer\d\.\d+\.bn[12]$/ : /^layer\d\.\d+\.bn1$/;
  for (const [name, m] of model.namedModules()) {
    if (!(m instanceof BatchNorm2d)) continue;
    const c = m.numFeatures;
    const gamma = Float32Array.from({ length: c }, () => rng.uniform(0.5, 1.5));
    const beta = Float32Array.from({ length: c }, () => rng.uniform(-0.5, 0.5));
    if (innerBn.test(name)) {
      const removed = Math.round(c * amount);
      const order = Array.from({ length: c }, (_, i) => i).sort(() => rng.next() - 0.5);
      for (const i of order.slice(0, removed)) gamma[i] = beta[i] = 0;
    }
    m.weight.setValues(gamma);
    m.bias.setValues(beta);
  }
  const state = model.stateDict();
  for (const [key, entry] of state) {
    if (key.endsWith('running_mean')) {
      entry.data = Float32Array.from(entry.data as Float32Array, () => rng.uniform(-0.3, 0.3));
    }
    if (key.endsWith('running_var')) {
      entry.data = Float32Array.from(entry.data as Float32Array, () => rng.uniform(0.5, 2));
    }
  }
  model.loadStateDict(state);
}

function maxRelDiff(a: Float32Array, b: Float32Array): number {
  let scale = 0;
  let diff = 0;
  for (let i = 0; i < a.length; i++) {
    scale = Math.max(scale, Math.abs(a[i]!));
    diff = Math.max(diff, Math.abs(a[i]! - b[i]!));
  }
  return diff / scale;
}

describe('structured channel pruning', () => {
  for (const depth of [18, 50] as const) {
    it(`ResNet-${depth}: removing channels whose BN scale and shift are zero leaves the output unchanged`, () => {
      using model = new ResNet(depth, { numClasses: 5, smallInput: true, seed: depth });
      prepareForChannelPruning(model, 0.25, depth);
      model.eval();
      const { x } = batch(9, 2, 16);
      const reference = model.forward(x).toFloat32Array();
      using pruned = pruneChannels(model, { amount: 0.25, criterion: 'bn-scale' });
      expect(pruned.pruned).toBe(true);
      expect(pruned.training).toBe(false);
      const got = pruned.forward(x).toFloat32Array();
      expect(maxRelDiff(reference, got)).toBeLessThan(1e-5);
      // The check can fail: removing other channels (the smallest filters) changes the output.
      using other = pruneChannels(model, { amount: 0.25, criterion: 'l1' });
      expect(maxRelDiff(reference, other.forward(x).toFloat32Array())).toBeGreaterThan(1e-3);
      x.dispose();
    });
  }

  it('ResNet-18: the expected widths, parameter count and MACs; saves, reloads and trains a step', async () => {
    using model = ResNet18({ numClasses: 4, smallInput: true, seed: 1 });
    using pruned = pruneChannels(model, { amount: 0.5 });
    const widths = [64, 64, 128, 128, 256, 256, 512, 512];
    expect(pruned.blockWidths).toEqual(widths.map((c) => [c / 2]));
    // Each BasicBlock loses (C - C/2) filters of conv1 (in x 9 each), their BN pair, and conv2's input slices (C x 9).
    const inputs = [64, 64, 64, 128, 128, 256, 256, 512];
    const removed = widths.reduce((n, c, b) => n + (c / 2) * (inputs[b]! * 9 + 2 + c * 9), 0);
    const before = model.summary({ inputSize: 32 });
    const after = pruned.summary({ inputSize: 32 });
    expect(after.totalParams).toBe(before.totalParams - removed);
    expect(pruned.numParameters()).toBe(after.totalParams);
    expect(after.macs).toBeLessThan(before.macs * 0.6);

    const file = join(dir, 'channels.safetensors');
    await saveWeights(file, pruned);
    using again = new ResNet(18, { numClasses: 4, smallInput: true, blockWidths: pruned.blockWidths, seed: 2 });
    await loadWeights(file, again);
    expect(again.stateDict().get('layer3.1.conv1.weight')?.data).toEqual(
      pruned.stateDict().get('layer3.1.conv1.weight')?.data,
    );
    await expect(loadWeights(file, ResNet18({ numClasses: 4, smallInput: true }))).rejects.toThrow(/layer1.0.conv1/);

    const { x, labels } = batch(3, 4, 32);
    const loss = new CrossEntropyLoss();
    const optimizer = new SGD(again, { lr: 0.05, momentum: 0.9 });
    const w = again.stateDict().get('layer2.0.conv2.weight')?.data;
    const value = loss.forward(again.forward(x), labels).item();
    again.backward(loss.backward());
    optimizer.step();
    expect(Number.isFinite(value)).toBe(true);
    expect(again.stateDict().get('layer2.0.conv2.weight')?.data).not.toEqual(w);
    x.dispose();
  });

  for (const [depth, amount] of [
    [18, 0.5],
    [50, 0.3],
  ] as const) {
    it(`ResNet-${depth} pruned by ${amount}: reloaded from its weights file, exports to ONNX that ONNX Runtime runs as the eval forward`, async () => {
      using model = new ResNet(depth, { numClasses: 5, smallInput: true, seed: 40 + depth });
      randomizeBatchNorms(model, depth);
      using pruned = pruneChannels(model, { amount, criterion: 'l1' });
      const file = join(dir, `export-${depth}.safetensors`);
      await saveWeights(file, pruned);
      using reloaded = new ResNet(depth, { numClasses: 5, smallInput: true, blockWidths: pruned.blockWidths, seed: 9 });
      await loadWeights(file, reloaded);
      reloaded.eval();

      const { bytes, output } = exportOnnxBytes(reloaded, {});
      expect(output.shape).toEqual(['batch', 5]);
      // The file holds the narrower convolutions: the first block's conv1 (batch norm folded in) has
      // the pruned width as its output channels.
      const width = defined(pruned.blockWidths[0]?.[0], 'the first block width');
      expect(width).toBe(Math.round(64 * (1 - amount)));
      const weights = decodeOnnxModel(bytes).graph.initializer.map((t) => t.dims.map(Number));
      expect(weights.some((dims) => dims.length === 4 && dims[0] === width && dims[1] === 64)).toBe(true);

      const session = await ort.InferenceSession.create(bytes);
      const n = 3;
      const x = shapeImages(n, 16, depth);
      const want = eagerLogits(pruned, x, n, 16);
      expect(relativeError(eagerLogits(reloaded, x, n, 16), want)).toBe(0);
      const got = await runOnnx(session, nhwcToNchw(x, n, 16, 16, 3), [n, 3, 16, 16]);
      expect(relativeError(got, want)).toBeLessThan(1e-4);
      // The comparison can fail: the dense model's logits are not the pruned model's.
      expect(relativeError(eagerLogits(model, x, n, 16), want)).toBeGreaterThan(1e-3);
      await session.release();
    });
  }

  it('a magnitude-pruned model exports with its zeros (batch norm folding scales them), and runs as the eval forward', async () => {
    using model = ResNet18({ numClasses: 4, smallInput: true, seed: 5 });
    randomizeBatchNorms(model, 6);
    const pruner = new MagnitudePruner(model, { exclude: ['fc.weight'] });
    pruner.prune(0.8);
    pruner.apply();
    const masked = [...pruner.masks().values()].reduce((n, m) => n + m.filter((keep) => keep === 0).length, 0);
    pruner.dispose();
    const { bytes } = exportOnnxBytes(model, {});
    let zeros = 0;
    for (const t of decodeOnnxModel(bytes).graph.initializer) {
      if (t.dims.length !== 4) continue;
      const raw = t.rawData;
      const values = new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength));
      zeros += values.filter((v) => v === 0).length;
    }
    expect(masked).toBeGreaterThan(0);
    expect(zeros).toBeGreaterThanOrEqual(masked);
    const x = shapeImages(2, 16, 7);
    const session = await ort.InferenceSession.create(bytes);
    const got = await runOnnx(session, nhwcToNchw(x, 2, 16, 16, 3), [2, 3, 16, 16]);
    expect(relativeError(got, eagerLogits(model, x, 2, 16))).toBeLessThan(1e-4);
    await session.release();
  });

  it('keeps the largest-L1 filters and refuses bad options', () => {
    using model = ResNet18({ numClasses: 4, smallInput: true, seed: 3 });
    using pruned = pruneChannels(model, { amount: 0.75 });
    const conv = layer(model, 'layer1.0.conv1', Conv2d);
    const w = conv.weight.values();
    const per = w.length / 64;
    const norms = Array.from({ length: 64 }, (_, o) =>
      w.subarray(o * per, (o + 1) * per).reduce((s, v) => s + Math.abs(v), 0),
    );
    const kept = norms
      .map((n, o) => [n, o] as const)
      .sort((a, b) => b[0] - a[0])
      .slice(0, 16)
      .map(([, o]) => o)
      .sort((a, b) => a - b);
    const expected = kept.flatMap((o) => [...w.subarray(o * per, (o + 1) * per)]);
    expect([...layer(pruned, 'layer1.0.conv1', Conv2d).weight.values()]).toEqual(expected);
    expect(() => pruneChannels(model, { amount: 1 })).toThrow(/amount/);
    expect(() => pruneChannels(model, { amount: 0.5, criterion: 'l2' as never })).toThrow(/criterion/);
    expect(() => new ResNet(18, { blockWidths: [[3]] })).toThrow(/blockWidths/);
    expect(() => new ResNet(50, { blockWidths: Array.from({ length: 16 }, () => [8]) })).toThrow(/blockWidths\[0\]/);
  });
});
