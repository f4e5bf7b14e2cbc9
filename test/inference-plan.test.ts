/**
 * The fused inference path on the CPU backend: the Predictor's logits against the training
 * modules' eval forward of the same model, the lowering's folding checked by hand, argument errors,
 * and that running a plan allocates nothing.
 *
 * Error measures, both relative to the logits' scale: elementwise, the largest absolute difference
 * divided by the largest absolute reference logit; normwise, the 2-norm of the difference divided
 * by the 2-norm of the reference. f32 is held to 1e-5 elementwise. bf16 (8 significant bits, about
 * 4e-3 of rounding per layer) to 1e-2 normwise, and to 3e-2 elementwise, where the one worst logit
 * of thousands counts.
 */
import { describe, expect, it } from 'vitest';
import {
  AdaptiveAvgPool2d,
  BatchNorm2d,
  Conv2d,
  Flatten,
  Linear,
  MaxPool2d,
  ReLU,
  ResNet,
  Sequential,
  Tensor,
  defaultBlockWidths,
  memoryStats,
  type Module,
  type ResNetOptions,
  type StateDict,
} from '../lib/index.js';
import { lowerForInference, type ConvNode } from '../lib/inference/graph.js';
import { Predictor, type PredictorDType } from '../lib/inference/predictor.js';
import { addon } from '../lib/binding.js';
import { noiseImages, randomizeBatchNorms, shapeImages } from './helpers/onnx.js';

/** The tolerances by dtype: elementwise and normwise. */
const TOLERANCE: Partial<Record<PredictorDType, { element: number; norm: number }>> = {
  f32: { element: 1e-5, norm: 1e-5 },
  bf16: { element: 3e-2, norm: 1e-2 },
};

/** max |got - ref| / max |ref|. */
function scaledError(got: Float32Array, ref: Float32Array): number {
  expect(got.length).toBe(ref.length);
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < ref.length; i++) {
    diff = Math.max(diff, Math.abs(got[i]! - ref[i]!));
    scale = Math.max(scale, Math.abs(ref[i]!));
  }
  expect(scale).toBeGreaterThan(0);
  return diff / scale;
}

/** ||got - ref||_2 / ||ref||_2. */
function normError(got: Float32Array, ref: Float32Array): number {
  let diff = 0;
  let norm = 0;
  for (let i = 0; i < ref.length; i++) {
    diff += (got[i]! - ref[i]!) ** 2;
    norm += ref[i]! ** 2;
  }
  return Math.sqrt(diff / norm);
}

/** The eval forward of `model` (training modules) on NHWC `x`. */
function evalLogits(model: Module, x: Tensor): Float32Array {
  model.eval();
  const y = model.forward(x);
  return y.toFloat32Array();
}

/** Checks the Predictor against the eval forward for each dtype; returns the errors by dtype. */
function expectMatches(
  model: Module,
  shape: [number, number, number, number],
  dtypes: readonly PredictorDType[],
  images: 'noise' | 'shapes' = 'noise',
): Record<string, number> {
  const [n, h, w] = shape;
  const x = images === 'noise' || h !== w ? Tensor.randn(shape, { seed: 7 }) : Tensor.from(shapeImages(n, h, 7), shape);
  const ref = evalLogits(model, x);
  const errors: Record<string, number> = {};
  for (const dtype of dtypes) {
    const predictor = new Predictor(model, { dtype });
    const y = predictor.predict(x);
    expect(y.shape).toEqual([n, ref.length / n]);
    expect(y.dtype).toBe('f32');
    const got = y.toFloat32Array();
    const what = `${dtype}: ${predictor.implementation(shape)}`;
    errors[dtype] = scaledError(got, ref);
    expect(errors[dtype], what).toBeLessThan(TOLERANCE[dtype]!.element);
    expect(normError(got, ref), what).toBeLessThan(TOLERANCE[dtype]!.norm);
    y.dispose();
    predictor.dispose();
  }
  x.dispose();
  return errors;
}

/** Replaces the values of state-dict entry `key` (which must exist). */
function setEntry(sd: StateDict, key: string, values: Float32Array): void {
  const entry = sd.get(key);
  if (!entry) throw new Error(`no state-dict entry '${key}'`);
  entry.data = values;
}

function convByName(convs: readonly ConvNode[], name: string): ConvNode {
  const node = convs.find((n) => n.name === name);
  if (!node) throw new Error(`no convolution '${name}'`);
  return node;
}

function resnet(depth: 18 | 50, options: ResNetOptions, seed = 1): ResNet {
  const model = new ResNet(depth, { seed, ...options });
  randomizeBatchNorms(model, seed + 100);
  return model;
}

describe('lowerForInference', () => {
  it('folds a batch norm into the convolution before it (checked by hand) and keeps the ReLU on it', () => {
    const conv = new Conv2d({ inChannels: 2, outChannels: 2, kernelSize: 1, bias: true, seed: 3 });
    const bn = new BatchNorm2d({ numFeatures: 2, eps: 1e-5 });
    const model = new Sequential(
      conv,
      bn,
      new ReLU(),
      new AdaptiveAvgPool2d(1),
      new Flatten(),
      new Linear({ inFeatures: 2, outFeatures: 3, seed: 4 }),
    );
    const sd = model.stateDict();
    // conv weight [out, in, 1, 1] and bias; batch norm gamma, beta, running mean and variance.
    setEntry(sd, '0.weight', Float32Array.of(1, 2, -3, 0.5));
    setEntry(sd, '0.bias', Float32Array.of(0.25, -1));
    setEntry(sd, '1.weight', Float32Array.of(2, 1.5));
    setEntry(sd, '1.bias', Float32Array.of(1, -2));
    setEntry(sd, '1.running_mean', Float32Array.of(0.5, 3));
    setEntry(sd, '1.running_var', Float32Array.of(4 - 1e-5, 0.25 - 1e-5));
    model.loadStateDict(sd);
    const graph = lowerForInference(model);
    expect(graph.inChannels).toBe(2);
    expect(graph.nodes.map((n) => n.op)).toEqual(['conv', 'globalavgpool', 'linear']);
    const node = graph.nodes[0] as ConvNode;
    expect(node.relu).toBe(true);
    expect(node.residual).toBeNull();
    // Channel 0: scale = 2 / sqrt(4) = 1; weight (1, 2); bias = 1 + (0.25 - 0.5) * 1 = 0.75.
    // Channel 1: scale = 1.5 / sqrt(0.25) = 3; weight (-9, 1.5); bias = -2 + (-1 - 3) * 3 = -14.
    const expectedWeight = [1, 2, -9, 1.5];
    const expectedBias = [0.75, -14];
    node.weight.forEach((v, i) => expect(v).toBeCloseTo(expectedWeight[i]!, 5));
    node.bias.forEach((v, i) => expect(v).toBeCloseTo(expectedBias[i]!, 5));
    model.dispose();
  });

  it('folds a non-unit scale into every weight of its channel, in OHWI order', () => {
    const conv = new Conv2d({ inChannels: 2, outChannels: 1, kernelSize: [1, 2], seed: 3 });
    const bn = new BatchNorm2d({ numFeatures: 1, eps: 1e-5 });
    const model = new Sequential(conv, bn, new AdaptiveAvgPool2d(1));
    const sd = model.stateDict();
    // OIHW [1, 2, 1, 2]: in 0 -> (1, 2), in 1 -> (3, 4).
    setEntry(sd, '0.weight', Float32Array.of(1, 2, 3, 4));
    setEntry(sd, '1.weight', Float32Array.of(3));
    setEntry(sd, '1.bias', Float32Array.of(0.5));
    setEntry(sd, '1.running_mean', Float32Array.of(1));
    setEntry(sd, '1.running_var', Float32Array.of(0.25 - 1e-5));
    model.loadStateDict(sd);
    const node = lowerForInference(model).nodes[0] as ConvNode;
    // scale = 3 / sqrt(0.25) = 6; OHWI [1, 1, 2, 2]: (kw 0: in 0, in 1), (kw 1: in 0, in 1).
    [6, 18, 12, 24].forEach((v, i) => expect(node.weight[i]).toBeCloseTo(v, 4));
    expect(node.bias[0]).toBeCloseTo(0.5 - 1 * 6, 4);
    expect(node.relu).toBe(false);
    model.dispose();
  });

  it('adds the residual in the last convolution of each block and the shortcut first', () => {
    const model = new ResNet(18, { numClasses: 5, seed: 1, smallInput: true });
    const graph = lowerForInference(model);
    const convs = graph.nodes.filter((n): n is ConvNode => n.op === 'conv');
    expect(convs).toHaveLength(20);
    const withResidual = convs.filter((n) => n.residual !== null);
    expect(withResidual).toHaveLength(8);
    expect(withResidual.every((n) => n.relu && n.name.endsWith('conv2'))).toBe(true);
    const downsample = convByName(convs, 'layer2.0.downsample.0');
    const last = convByName(convs, 'layer2.0.conv2');
    expect(last.residual).toBe(graph.nodes.indexOf(downsample) + 1);
    expect(downsample.relu).toBe(false);
    model.dispose();
  });

  it('names what it cannot lower', () => {
    const bnFirst = new Sequential(new BatchNorm2d({ numFeatures: 3 }), new AdaptiveAvgPool2d(1));
    expect(() => lowerForInference(bnFirst, { inChannels: 3 })).toThrow(
      /0: a BatchNorm2d not right after a convolution/,
    );
    const reluFirst = new Sequential(new ReLU(), new AdaptiveAvgPool2d(1));
    expect(() => lowerForInference(reluFirst, { inChannels: 3 })).toThrow(/ReLU not right after a convolution/);
    const noPool = new Sequential(new Conv2d({ inChannels: 3, outChannels: 4, kernelSize: 1 }));
    expect(() => lowerForInference(noPool)).toThrow(/does not end in global pooling/);
    expect(() => lowerForInference(new ReLU())).toThrow(/model/);
    expect(() => new Predictor(new ReLU())).toThrow(/model/);
  });
});

describe('Predictor on the CPU equals the eval forward', () => {
  it('ResNet-18, small-input stem, 32 px, batch 3 (BasicBlock)', () => {
    const model = resnet(18, { numClasses: 10, smallInput: true });
    expectMatches(model, [3, 32, 32, 3], ['f32', 'bf16']);
    model.dispose();
  });

  it('ResNet-18, standard stem with max pooling, 64 px, batch 1, shape images', () => {
    const model = resnet(18, { numClasses: 6 }, 2);
    expectMatches(model, [1, 64, 64, 3], ['f32', 'bf16'], 'shapes');
    model.dispose();
  });

  it('ResNet-50, standard stem, 64 px, batch 2 (Bottleneck with downsampling)', () => {
    const model = resnet(50, { numClasses: 20 }, 3);
    expectMatches(model, [2, 64, 64, 3], ['f32', 'bf16']);
    model.dispose();
  });

  it('ResNet-50, small-input stem, 32 px, batch 4', () => {
    const model = resnet(50, { numClasses: 10, smallInput: true }, 4);
    expectMatches(model, [4, 32, 32, 3], ['f32', 'bf16']);
    model.dispose();
  });

  it('ResNet-50, 224 px, batch 1, 1000 classes', () => {
    const model = resnet(50, { numClasses: 1000 }, 5);
    expectMatches(model, [1, 224, 224, 3], ['f32', 'bf16']);
    model.dispose();
  });

  it('a channel-pruned ResNet-18 (blockWidths)', () => {
    const widths = defaultBlockWidths(18).map((block, b) => block.map((w) => Math.max(4, w - 16 - 3 * b)));
    const model = resnet(18, { numClasses: 7, smallInput: true, blockWidths: widths }, 6);
    expectMatches(model, [2, 32, 32, 3], ['f32', 'bf16']);
    model.dispose();
  });

  it('a channel-pruned ResNet-50 (blockWidths), odd widths', () => {
    const widths = defaultBlockWidths(50).map((block, b) => block.map((w, i) => Math.max(3, (w >> 1) + 5 * i - b)));
    const model = resnet(50, { numClasses: 7, smallInput: true, blockWidths: widths }, 7);
    expectMatches(model, [2, 24, 24, 3], ['f32', 'bf16']);
    model.dispose();
  });

  it('a plain Sequential(conv, bn, relu, maxpool, conv, bn, avgpool, flatten, linear), odd sizes', () => {
    const model = new Sequential(
      new Conv2d({ inChannels: 5, outChannels: 12, kernelSize: [3, 5], stride: [2, 1], padding: [1, 2], seed: 1 }),
      new BatchNorm2d({ numFeatures: 12 }),
      new ReLU(),
      new MaxPool2d({ kernelSize: 3, stride: 2, padding: 1 }),
      new Conv2d({ inChannels: 12, outChannels: 9, kernelSize: 3, dilation: 2, padding: 2, bias: true, seed: 2 }),
      new BatchNorm2d({ numFeatures: 9 }),
      new AdaptiveAvgPool2d(1),
      new Flatten(),
      new Linear({ inFeatures: 9, outFeatures: 4, seed: 3 }),
    );
    const sd = model.stateDict();
    for (const [name, entry] of sd) {
      if (!(entry.data instanceof Float32Array)) continue;
      if (name.endsWith('running_var')) entry.data.forEach((_, i, a) => (a[i] = 0.5 + (i % 5) * 0.3));
      if (name.endsWith('running_mean')) entry.data.forEach((_, i, a) => (a[i] = 0.1 * ((i % 7) - 3)));
    }
    model.loadStateDict(sd);
    expectMatches(model, [3, 19, 23, 5], ['f32', 'bf16']);
    model.dispose();
  });

  it('a network ending in global pooling returns its features', () => {
    const model = new Sequential(
      new Conv2d({ inChannels: 3, outChannels: 16, kernelSize: 3, padding: 1, seed: 1 }),
      new BatchNorm2d({ numFeatures: 16, relu: true }),
      new AdaptiveAvgPool2d(1),
      new Flatten(),
    );
    randomizeBatchNorms(model, 9);
    expectMatches(model, [2, 9, 9, 3], ['f32', 'bf16']);
    model.dispose();
  });

  it('one predictor serves several batch sizes, each with its own plan', () => {
    const model = resnet(18, { numClasses: 5, smallInput: true }, 8);
    const predictor = new Predictor(model);
    for (const n of [1, 5, 2]) {
      const x = Tensor.from(noiseImages(n, 16, n, 3), [n, 16, 16, 3]);
      const y = predictor.predict(x);
      expect(scaledError(y.toFloat32Array(), evalLogits(model, x))).toBeLessThan(1e-5);
      x.dispose();
      y.dispose();
    }
    expect(predictor.implementation([5, 16, 16, 3])).toMatch(/^onednn f32: convs /);
    predictor.dispose();
    model.dispose();
  });
});

describe('the CPU plan on a hand-made graph', () => {
  /** 1x1 convolution of NHWC `x` ([pixels, cin]) with OHWI weights [cout, cin], plus bias, residual and ReLU. */
  function conv1x1(
    x: number[][],
    w: Float32Array,
    b: Float32Array,
    residual: number[][] | null,
    relu: boolean,
  ): number[][] {
    const cout = b.length;
    return x.map((px, p) =>
      Array.from({ length: cout }, (_, o) => {
        let v = b[o]! + px.reduce((acc, xi, i) => acc + xi * w[o * px.length + i]!, 0);
        if (residual) v += residual[p]![o]!;
        return relu ? Math.max(v, 0) : v;
      }),
    );
  }

  it('adds residuals that are still read later (copied) and last read (accumulated in place), and one from the input', () => {
    const c = 16;
    const pixels = 9;
    const rng = Tensor.randn([6 * c * c + 6 * c], { seed: 11 }).toFloat32Array();
    let at = 0;
    const take = (k: number): Float32Array => rng.slice(at, (at += k));
    const w = [0, 1, 2, 3].map(() => take(c * c).map((v) => v * 0.25));
    const b = [0, 1, 2, 3].map(() => take(c));
    const fcW = take(3 * c);
    const fcB = take(3);
    const conv = (input: number, weight: Float32Array, bias: Float32Array, residual: number, relu: boolean) => ({
      op: 'conv' as const,
      input,
      residual,
      relu,
      inChannels: c,
      outChannels: c,
      weight,
      bias,
    });
    const nodes = [
      conv(0, w[0]!, b[0]!, -1, true), // v1
      conv(1, w[1]!, b[1]!, 0, true), // v2 = relu(conv(v1) + x): the residual is the caller's input
      conv(2, w[2]!, b[2]!, 1, false), // v3 = conv(v2) + v1: v1 is read again below, so it is copied
      conv(1, w[3]!, b[3]!, 3, true), // v4 = relu(conv(v1) + v3): v3's last reader accumulates into it
      { op: 'globalavgpool' as const, input: 4 },
      { op: 'linear' as const, input: 5, inChannels: c, outChannels: 3, weight: fcW, bias: fcB },
    ];
    const x = Tensor.randn([1, 3, 3, c], { seed: 12 });
    const xs = Array.from({ length: pixels }, (_, p) => Array.from(x.toFloat32Array().slice(p * c, (p + 1) * c)));
    const v1 = conv1x1(xs, w[0]!, b[0]!, null, true);
    const v2 = conv1x1(v1, w[1]!, b[1]!, xs, true);
    const v3 = conv1x1(v2, w[2]!, b[2]!, v1, false);
    const v4 = conv1x1(v1, w[3]!, b[3]!, v3, true);
    const pooled = Array.from({ length: c }, (_, k) => v4.reduce((acc, px) => acc + px[k]!, 0) / pixels);
    const expected = Float32Array.from({ length: 3 }, (_, o) =>
      pooled.reduce((acc, v, i) => acc + v * fcW[o * c + i]!, fcB[o]!),
    );
    const plan = new (addon().InferencePlan)({ device: 'cpu', dtype: 'f32', n: 1, h: 3, w: 3, c, nodes });
    expect(plan.implementation()).toMatch(/2 residual copies/);
    const y = Tensor.zeros([1, 3]);
    for (let i = 0; i < 2; i++) {
      plan.run({ x: x.raw, y: y.raw });
      expect(scaledError(y.toFloat32Array(), expected)).toBeLessThan(1e-5);
    }
    plan.dispose();
    x.dispose();
    y.dispose();
  });
});

describe('Predictor errors', () => {
  const model = new Sequential(
    new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 3, seed: 1 }),
    new BatchNorm2d({ numFeatures: 8, relu: true }),
    new AdaptiveAvgPool2d(1),
    new Flatten(),
    new Linear({ inFeatures: 8, outFeatures: 2, seed: 2 }),
  );

  it('names a bad input', () => {
    const predictor = new Predictor(model);
    const wrongChannels = Tensor.zeros([1, 8, 8, 4]);
    expect(() => predictor.predict(wrongChannels)).toThrow(/x.*\[N, H, W, 3\].*\[1, 8, 8, 4\]/);
    const wrongRank = Tensor.zeros([8, 8, 3]);
    expect(() => predictor.predict(wrongRank)).toThrow(/x.*\[N, H, W, 3\]/);
    const wrongDtype = Tensor.zeros([1, 8, 8, 3], { dtype: 'bf16' });
    expect(() => predictor.predict(wrongDtype)).toThrow(/x.*f32.*bf16|x.*bf16.*f32/);
    const tooSmall = Tensor.zeros([1, 2, 2, 3]);
    expect(() => predictor.predict(tooSmall)).toThrow(
      /inference node 0 \(conv\): the window does not fit its 2x2 input/,
    );
    expect(() => predictor.predict(new Float32Array(3) as unknown as Tensor)).toThrow(/x/);
    for (const t of [wrongChannels, wrongRank, wrongDtype, tooSmall]) t.dispose();
    predictor.dispose();
    expect(() => predictor.predict(Tensor.zeros([1, 8, 8, 3]))).toThrow(/disposed/);
  });

  it('names bad options', () => {
    expect(() => new Predictor(model, { dtype: 'f64' as PredictorDType })).toThrow(/options\.dtype/);
    expect(() => new Predictor(model, { dtype: 'int8' })).toThrow(/calibrate.*options\.dtype/);
    expect(() => new Predictor(model, { device: 'tpu' })).toThrow(/options\.device/);
    expect(() => new Predictor(model, { batch: 1 } as never)).toThrow(/batch/);
  });

  it('the native plan checks its input and output tensors', () => {
    const graph = lowerForInference(model);
    const predictor = new Predictor(graph);
    const x = Tensor.zeros([2, 8, 8, 3]);
    const y = predictor.predict(x);
    expect(y.shape).toEqual([2, 2]);
    const plan = new (addon().InferencePlan)({
      device: 'cpu',
      dtype: 'f32',
      n: 2,
      h: 8,
      w: 8,
      c: 3,
      nodes: [
        {
          op: 'conv',
          input: 0,
          inChannels: 3,
          outChannels: 2,
          kernelH: 1,
          kernelW: 1,
          weight: new Float32Array(6),
          bias: new Float32Array(2),
        },
        { op: 'globalavgpool', input: 1 },
      ],
    });
    const badY = Tensor.zeros([2, 3]);
    expect(() => plan.run({ x: x.raw, y: badY.raw })).toThrow(/y/);
    const badX = Tensor.zeros([1, 8, 8, 3]);
    expect(() => plan.run({ x: badX.raw, y: y.raw })).toThrow(/x/);
    plan.run({ x: x.raw, y: y.raw });
    expect(Array.from(y.toFloat32Array())).toEqual([0, 0, 0, 0]);
    plan.dispose();
    expect(() => plan.run({ x: x.raw, y: y.raw })).toThrow(/disposed/);
    for (const t of [x, y, badX, badY]) t.dispose();
    predictor.dispose();
  });

  it('an f16 plan runs within its tolerance or is refused at creation, naming f16', () => {
    const x = Tensor.from(noiseImages(1, 8, 1, 3), [1, 8, 8, 3]);
    let predictor: Predictor | null = null;
    try {
      predictor = new Predictor(model, { dtype: 'f16' });
      const y = predictor.predict(x);
      expect(scaledError(y.toFloat32Array(), evalLogits(model, x))).toBeLessThan(1e-2);
      y.dispose();
    } catch (error) {
      expect(String(error)).toMatch(/f16.*use f32 or bf16/);
    }
    predictor?.dispose();
    x.dispose();
  });
});

describe('Predictor memory', () => {
  it('running a plan repeatedly allocates nothing', () => {
    const model = resnet(18, { numClasses: 10, smallInput: true }, 9);
    const predictor = new Predictor(model, { dtype: 'bf16' });
    const x = Tensor.from(noiseImages(2, 16, 1, 3), [2, 16, 16, 3]);
    for (let i = 0; i < 3; i++) predictor.predict(x).dispose();
    globalThis.gc?.();
    const before = memoryStats();
    const rssBefore = process.memoryUsage().rss;
    for (let i = 0; i < 100; i++) predictor.predict(x).dispose();
    globalThis.gc?.();
    const after = memoryStats();
    expect(after.systemAllocationCount).toBe(before.systemAllocationCount);
    expect(after.allocatedBytes).toBe(before.allocatedBytes);
    expect(process.memoryUsage().rss / rssBefore).toBeLessThan(1.05);
    // The plan's memory (weights, arena, scratchpad) is freed with it.
    predictor.dispose();
    expect(memoryStats().allocatedBytes).toBeLessThan(before.allocatedBytes);
    x.dispose();
    model.dispose();
  });
});
