/**
 * ModelEma (lib/train/ema.ts) on a small conv + BN + linear model trained with SGD, against the
 * EMA recurrence computed here in float64 from the parameters and running statistics read back
 * after every step; swapping, state dicts, counters and bad input. Also Module.namedBuffers and
 * parameter freezing with Module.setRequiresGrad.
 */
import { describe, expect, it } from 'vitest';
import {
  AdaptiveAvgPool2d,
  BatchNorm2d,
  Conv2d,
  CrossEntropyLoss,
  Flatten,
  Linear,
  ParameterArena,
  ReLU,
  SGD,
  Sequential,
  Tensor,
  listBackends,
  type Module,
  type StateDict,
} from '../lib/index.js';
import { ohwiToOihw } from '../lib/nn/module.js';
import { ModelEma } from '../lib/train/ema.js';
import { defined, lookup } from './helpers/defined.js';
import { objectContaining } from './helpers/matchers.js';

const X = Tensor.randn([4, 5, 5, 3], { seed: 11 });
const LABELS = [0, 2, 1, 2];

/** conv -> BN+ReLU -> global average pool -> flatten -> linear, with its features in one submodule. */
class SmallNet extends Sequential {
  constructor(seed = 1) {
    super(
      new Sequential(
        new Conv2d({ inChannels: 3, outChannels: 4, kernelSize: 3, padding: 1, seed }),
        new BatchNorm2d({ numFeatures: 4 }),
        new ReLU(),
      ),
      new AdaptiveAvgPool2d(),
      new Flatten(),
      new Linear({ inFeatures: 4, outFeatures: 3, seed: seed + 1 }),
    );
  }

  get features(): Sequential {
    return this.modules[0] as Sequential;
  }

  get head(): Linear {
    return this.modules[3] as Linear;
  }
}

function smallNet(seed = 1): SmallNet {
  return new SmallNet(seed).to('cpu');
}

function trainStep(model: Module, opt: SGD, loss: CrossEntropyLoss): void {
  model.zeroGrad();
  loss.forward(model.forward(X), LABELS);
  model.backward(loss.backward());
  opt.step();
}

/** The model's whole parameter arena and its buffers, in float64. */
function snapshot(model: Module): { params: Float64Array; buffers: Float64Array[] } {
  return {
    params: Float64Array.from(model.arena().params.toFloat32Array()),
    buffers: model.namedBuffers().map(([, t]) => Float64Array.from(t.toFloat32Array())),
  };
}

/** What the EMA holds, read through two swaps. */
function averaged(model: Module, ema: ModelEma): { params: Float64Array; buffers: Float64Array[] } {
  ema.swap();
  try {
    return snapshot(model);
  } finally {
    ema.swap();
  }
}

/** torch's `ema = decay * ema + (1 - decay) * model`, copying when nothing was averaged yet. */
class EmaReference {
  /** Empty until the first update, which copies. */
  params = new Float64Array(0);
  buffers: Float64Array[] = [];
  #updated = false;
  constructor(readonly decay: number) {}

  update(now: { params: Float64Array; buffers: Float64Array[] }): void {
    if (!this.#updated) {
      this.#updated = true;
      this.params = now.params.slice();
      this.buffers = now.buffers.map((b) => b.slice());
      return;
    }
    const mix = (avg: Float64Array, cur: Float64Array) => {
      for (let i = 0; i < avg.length; i++) avg[i] = this.decay * avg[i]! + (1 - this.decay) * cur[i]!;
    };
    mix(this.params, now.params);
    this.buffers.forEach((b, i) => mix(b, now.buffers[i]!));
  }
}

/** |got - want| <= tol * max(1, |want|) for every element. */
function expectClose(got: ArrayLike<number>, want: ArrayLike<number>, tol = 1e-6): void {
  expect(got.length).toBe(want.length);
  for (let i = 0; i < want.length; i++) {
    const err = Math.abs(got[i]! - want[i]!);
    if (!(err <= tol * Math.max(1, Math.abs(want[i]!)))) {
      throw new Error(`element ${i}: got ${got[i]}, expected ${want[i]} (difference ${err.toExponential(2)} > ${tol})`);
    }
  }
}

function expectSameBits(got: Float32Array | Float64Array, want: Float32Array | Float64Array): void {
  expect(got.length).toBe(want.length);
  expect(
    Buffer.from(got.buffer, got.byteOffset, got.byteLength).equals(
      Buffer.from(want.buffer, want.byteOffset, want.byteLength),
    ),
  ).toBe(true);
}

function maxDifference(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

function code(c: string): unknown {
  return objectContaining({ code: c });
}

/** Trains `steps` SGD steps with an EMA update after each, tracking the float64 reference. */
function trainWithEma(steps: number, decay: number, every = 1) {
  const model = smallNet();
  const ema = new ModelEma(model, { decay, every });
  const opt = new SGD(model, { lr: 0.2, momentum: 0.9, weightDecay: 1e-3 });
  const loss = new CrossEntropyLoss();
  const ref = new EmaReference(decay);
  for (let step = 1; step <= steps; step++) {
    trainStep(model, opt, loss);
    ema.update();
    if (step % every === 0) ref.update(snapshot(model));
  }
  return { model, ema, ref, opt, loss };
}

// In the test project that runs on the emulated CUDA device (RESNET_TEST_BACKENDS=cuda), only the
// CUDA case runs here: the others run in the main project.
const onlyCuda = process.env.RESNET_TEST_BACKENDS === 'cuda';

describe.skipIf(onlyCuda)('ModelEma', () => {
  it('follows the EMA recurrence of torchvision over SGD steps, parameters and BN running statistics', () => {
    const { model, ema, ref } = trainWithEma(6, 0.7);
    expect(ema.numAveraged).toBe(6);
    const got = averaged(model, ema);
    expectClose(got.params, ref.params);
    expect(got.buffers.length).toBe(2);
    got.buffers.forEach((b, i) => expectClose(b, ref.buffers[i]!));
    // The average lags the model: a test that would pass with update() copying every time is no test.
    const now = snapshot(model);
    expect(maxDifference(got.params, now.params)).toBeGreaterThan(1e-3);
    expect(maxDifference(got.buffers[0]!, now.buffers[0]!)).toBeGreaterThan(1e-4);
    ema.dispose();
  });

  it('copies on the first update, and again after reset()', () => {
    const model = smallNet();
    const ema = new ModelEma(model, { decay: 0.5 });
    const opt = new SGD(model, { lr: 0.5 });
    const loss = new CrossEntropyLoss();
    trainStep(model, opt, loss);
    ema.update();
    expect(ema.numAveraged).toBe(1);
    let now = snapshot(model);
    let got = averaged(model, ema);
    expectSameBits(got.params, now.params);
    got.buffers.forEach((b, i) => expectSameBits(b, now.buffers[i]!));

    trainStep(model, opt, loss);
    ema.update();
    expect(maxDifference(averaged(model, ema).params, snapshot(model).params)).toBeGreaterThan(1e-4);

    ema.reset();
    expect(ema.numAveraged).toBe(0);
    trainStep(model, opt, loss);
    ema.update();
    now = snapshot(model);
    got = averaged(model, ema);
    expectSameBits(got.params, now.params);
    got.buffers.forEach((b, i) => expectSameBits(b, now.buffers[i]!));
    ema.dispose();
  });

  it('starts as a copy of the model, before any update', () => {
    const model = smallNet();
    const before = snapshot(model);
    const ema = new ModelEma(model);
    expect(ema.decay).toBe(0.9999);
    expect(ema.every).toBe(1);
    expect(ema.numAveraged).toBe(0);
    const got = averaged(model, ema);
    expectSameBits(got.params, before.params);
    ema.dispose();
  });

  it('averages every `every`-th call only', () => {
    const { model, ema, ref } = trainWithEma(7, 0.6, 3);
    expect(ema.numAveraged).toBe(2);
    expect(ema.state()).toEqual({ numAveraged: 2, calls: 7 });
    const got = averaged(model, ema);
    expectClose(got.params, ref.params);
    got.buffers.forEach((b, i) => expectClose(b, ref.buffers[i]!));
    ema.dispose();
  });

  it('swaps the averaged weights in and out, and two swaps restore every bit', () => {
    const { model, ema, ref } = trainWithEma(3, 0.5);
    const before = snapshot(model);
    ema.swap();
    expect(ema.swapped).toBe(true);
    const inside = snapshot(model);
    expectClose(inside.params, ref.params);
    expect(maxDifference(inside.params, before.params)).toBeGreaterThan(1e-4);
    // Evaluating the averaged model is what the swap is for.
    model.eval();
    const logits = model.forward(X).toFloat32Array();
    expect(logits.every(Number.isFinite)).toBe(true);
    model.train();
    expect(() => ema.update()).toThrow(code('ERR_RC_INVALID_ARGUMENT'));
    ema.swap();
    expect(ema.swapped).toBe(false);
    const after = snapshot(model);
    expectSameBits(after.params, before.params);
    after.buffers.forEach((b, i) => expectSameBits(b, before.buffers[i]!));
    // And the average is intact.
    expectSameBits(averaged(model, ema).params, inside.params);
    ema.dispose();
  });

  it('gives a state dict with torchvision names holding the averages, leaving the model as it was', () => {
    const { model, ema, ref } = trainWithEma(4, 0.8);
    const before = snapshot(model);
    const sd = ema.stateDict();
    expect([...sd.keys()]).toEqual([...model.stateDict().keys()]);
    expect([...sd.keys()]).toEqual([
      '0.0.weight',
      '0.1.weight',
      '0.1.bias',
      '0.1.running_mean',
      '0.1.running_var',
      '0.1.num_batches_tracked',
      '3.weight',
      '3.bias',
    ]);
    for (const [name, p] of model.namedParameters()) {
      const slice = Float32Array.from(ref.params.subarray(p.offset, p.offset + p.numel));
      const want = p.layout === 'ohwi' ? ohwiToOihw(slice, p.shape) : slice;
      const entry = lookup(sd, name);
      expect(entry.shape).toEqual(p.stateShape);
      expectClose(entry.data as Float32Array, want);
    }
    expectClose(lookup(sd, '0.1.running_mean').data as Float32Array, ref.buffers[0]!);
    expectClose(lookup(sd, '0.1.running_var').data as Float32Array, ref.buffers[1]!);
    expect(lookup(sd, '0.1.num_batches_tracked').data).toEqual(BigInt64Array.of(4n));
    const after = snapshot(model);
    expectSameBits(after.params, before.params);
    after.buffers.forEach((b, i) => expectSameBits(b, before.buffers[i]!));
    ema.dispose();
  });

  it('loads a state dict back exactly, checking it whole before changing anything', () => {
    const trained = trainWithEma(3, 0.5);
    const sd = trained.ema.stateDict();
    const model = smallNet(5);
    const modelBefore = snapshot(model);
    const ema = new ModelEma(model, { decay: 0.5 });
    ema.loadStateDict(sd);
    const back = ema.stateDict();
    for (const [name, entry] of sd) {
      if (entry.dtype === 'f32') expectSameBits(lookup(back, name).data as Float32Array, entry.data as Float32Array);
    }
    // The counter stays the model's; the model's own weights are untouched.
    expect(lookup(back, '0.1.num_batches_tracked').data).toEqual(BigInt64Array.of(0n));
    expectSameBits(snapshot(model).params, modelBefore.params);

    // Loading while swapped writes into the model, where the averages are then.
    const other = smallNet(9);
    const otherEma = new ModelEma(other);
    otherEma.swap();
    otherEma.loadStateDict(sd);
    otherEma.swap();
    const reloaded = otherEma.stateDict();
    expectSameBits(lookup(reloaded, '3.weight').data as Float32Array, lookup(sd, '3.weight').data as Float32Array);
    expectSameBits(
      lookup(reloaded, '0.1.running_var').data as Float32Array,
      lookup(sd, '0.1.running_var').data as Float32Array,
    );

    const held = averaged(model, ema).params;
    const without: StateDict = new Map(sd);
    without.delete('3.bias');
    expect(() => ema.loadStateDict(without)).toThrow(/missing key '3.bias'/);
    const badShape: StateDict = new Map(sd);
    badShape.set('0.0.weight', { shape: [4, 3, 3, 2], dtype: 'f32', data: new Float32Array(72) });
    expect(() => ema.loadStateDict(badShape)).toThrow(code('ERR_RC_STATE_DICT'));
    const extra: StateDict = new Map(sd);
    extra.set('fc.weight', { shape: [1], dtype: 'f32', data: new Float32Array(1) });
    expect(() => ema.loadStateDict(extra)).toThrow(/unexpected key 'fc.weight'/);
    expect(() => ema.loadStateDict({} as never)).toThrow(code('ERR_RC_STATE_DICT'));
    expectSameBits(averaged(model, ema).params, held);
    for (const e of [trained.ema, ema, otherEma]) e.dispose();
  });

  it('restores its counters from state(), so `every` and the first copy continue where they were', () => {
    const { model, ema, opt, loss } = trainWithEma(4, 0.5, 3);
    const saved = ema.state();
    expect(saved).toEqual({ numAveraged: 1, calls: 4 });
    const resumed = new ModelEma(model, { decay: 0.5, every: 3 });
    resumed.loadState(JSON.parse(JSON.stringify(saved)) as typeof saved);
    expect(resumed.state()).toEqual(saved);
    trainStep(model, opt, loss);
    resumed.update();
    expect(resumed.numAveraged).toBe(1);
    trainStep(model, opt, loss);
    resumed.update();
    expect(resumed.numAveraged).toBe(2);
    expect(() => resumed.loadState({ numAveraged: -1, calls: 0 })).toThrow(code('ERR_RC_INVALID_ARGUMENT'));
    expect(() => resumed.loadState({ numAveraged: 1 } as never)).toThrow(/calls/);
    expect(() => resumed.loadState({ numAveraged: 1, calls: 2, steps: 3 } as never)).toThrow(/Unknown option 'steps'/);
    ema.dispose();
    resumed.dispose();
  });

  it('rejects bad options and models that are not placed', () => {
    const model = smallNet();
    const invalid = code('ERR_RC_INVALID_ARGUMENT');
    expect(() => new ModelEma(model, { decay: 1.5 })).toThrow(invalid);
    expect(() => new ModelEma(model, { decay: -0.1 })).toThrow(/decay/);
    expect(() => new ModelEma(model, { decay: NaN })).toThrow(invalid);
    expect(() => new ModelEma(model, { decay: '0.9' as never })).toThrow(invalid);
    expect(() => new ModelEma(model, { every: 0 })).toThrow(/integer of at least 1 for every/);
    expect(() => new ModelEma(model, { every: 1.5 })).toThrow(invalid);
    expect(() => new ModelEma(model, { steps: 2 } as never)).toThrow(/Unknown option 'steps'/);
    expect(() => new ModelEma(model, 5 as never)).toThrow(invalid);
    expect(() => new ModelEma(new SmallNet())).toThrow(/call model.to\(device\) first/);
    expect(() => new ModelEma(new SmallNet())).toThrow(invalid);
    expect(() => new ModelEma(new ReLU().to('cpu'))).toThrow(/has none/);
    expect(() => new ModelEma({} as never)).toThrow(invalid);
    // A submodule shares its root's arena: the average belongs to the root.
    expect(() => new ModelEma(model.head)).toThrow(/one arena/);
  });

  it('refuses to work on a model whose parameters were re-placed, and after dispose()', () => {
    const model = smallNet();
    const ema = new ModelEma(model);
    ema.update();
    // What moving the model does to its storage: a new arena, the old one freed.
    new ParameterArena(model.parameters(), 'cpu');
    expect(() => ema.update()).toThrow(/was moved off cpu/);
    expect(() => ema.swap()).toThrow(code('ERR_RC_INVALID_ARGUMENT'));
    expect(ema.state()).toEqual({ numAveraged: 1, calls: 1 });
    ema.dispose();
    expect(() => ema.state()).toThrow(code('ERR_RC_DISPOSED'));

    const other = smallNet();
    const otherEma = new ModelEma(other);
    otherEma.dispose();
    expect(() => otherEma.update()).toThrow(code('ERR_RC_DISPOSED'));
  });

  it("swaps the model's own weights back when disposed while swapped", () => {
    const { model, ema } = trainWithEma(2, 0.5);
    const before = snapshot(model);
    ema.swap();
    ema.dispose();
    expectSameBits(snapshot(model).params, before.params);
  });
});

describe.skipIf(onlyCuda)('Module.namedBuffers', () => {
  it('lists the BN running statistics by torchvision name, as the device tensors', () => {
    const model = smallNet();
    const buffers = model.namedBuffers();
    expect(buffers.map(([name]) => name)).toEqual(['0.1.running_mean', '0.1.running_var']);
    expect(buffers[1]![1].toFloat32Array()).toEqual(new Float32Array(4).fill(1));
    expect(model.features.namedBuffers('features.').map(([name]) => name)).toEqual([
      'features.1.running_mean',
      'features.1.running_var',
    ]);
    // The tensors are the module's own: the forward pass updates what they show.
    model.forward(X);
    expect(maxDifference(buffers[0]![1].toFloat32Array(), new Float32Array(4))).toBeGreaterThan(0);
    expect(new Linear({ inFeatures: 2, outFeatures: 2 }).to('cpu').namedBuffers()).toEqual([]);
  });

  it('throws before the module is placed', () => {
    expect(() => new SmallNet().namedBuffers()).toThrow(/'0.1.running_mean' of BatchNorm2d is not on a device yet/);
  });
});

describe.skipIf(onlyCuda)('Module.setRequiresGrad', () => {
  it('freezes a submodule: no gradients, bit-identical weights through SGD steps; the rest trains', () => {
    const model = smallNet();
    expect(model.features.setRequiresGrad(false)).toBe(model.features);
    expect(model.features.parameters().every((p) => !p.requiresGrad)).toBe(true);
    expect(model.head.parameters().every((p) => p.requiresGrad)).toBe(true);
    const frozen = model.features.parameters().map((p) => p.values());
    const head = model.head.parameters().map((p) => p.values());
    const opt = new SGD(model, { lr: 0.5, momentum: 0.9, weightDecay: 0.1 });
    const loss = new CrossEntropyLoss();
    for (let step = 0; step < 3; step++) {
      model.zeroGrad();
      loss.forward(model.forward(X), LABELS);
      model.backward(loss.backward());
      for (const p of model.features.parameters()) expect(p.grad.toFloat32Array().every((g) => g === 0)).toBe(true);
      for (const p of model.head.parameters()) expect(p.grad.toFloat32Array().some((g) => g !== 0)).toBe(true);
      opt.step();
    }
    model.features.parameters().forEach((p, i) => expectSameBits(p.values(), frozen[i]!));
    model.head.parameters().forEach((p, i) => expect(maxDifference(p.values(), head[i]!)).toBeGreaterThan(1e-3));

    model.features.setRequiresGrad(true);
    trainStep(model, opt, loss);
    expect(maxDifference(model.features.parameters()[0]!.values(), frozen[0]!)).toBeGreaterThan(0);
    expect(() => model.setRequiresGrad('no' as never)).toThrow(code('ERR_RC_INVALID_ARGUMENT'));
  });

  it('freezes a weight alone: its bias still gets the gradient it would get unfrozen', () => {
    const grads = (freezeWeight: boolean) => {
      const model = smallNet();
      model.head.weight.requiresGrad = !freezeWeight;
      model.zeroGrad();
      const loss = new CrossEntropyLoss();
      loss.forward(model.forward(X), LABELS);
      model.backward(loss.backward());
      return {
        weight: model.head.weight.grad.toFloat32Array(),
        bias: defined(model.head.bias, 'the head bias').grad.toFloat32Array(),
      };
    };
    const trainable = grads(false);
    const frozen = grads(true);
    expect(frozen.weight.every((g) => g === 0)).toBe(true);
    expect(trainable.weight.some((g) => g !== 0)).toBe(true);
    expectSameBits(frozen.bias, trainable.bias);
  });
});

describe('ModelEma on CUDA', () => {
  const cuda = listBackends().find((b) => b.name === 'cuda');
  it.skipIf(!cuda?.available)(
    `on CUDA: matches the recurrence, and rejects a model moved back to the CPU${cuda?.available ? '' : ` (skipped: ${cuda?.reason ?? 'no CUDA backend'})`}`,
    () => {
      const model = new SmallNet().to('cuda');
      const ema = new ModelEma(model, { decay: 0.7 });
      const opt = new SGD(model, { lr: 0.2, momentum: 0.9 });
      const loss = new CrossEntropyLoss();
      const x = Tensor.from(X.toFloat32Array(), X.shape, { device: 'cuda' });
      const ref = new EmaReference(0.7);
      for (let step = 0; step < 4; step++) {
        model.zeroGrad();
        loss.forward(model.forward(x), LABELS);
        model.backward(loss.backward());
        opt.step();
        ema.update();
        ref.update(snapshot(model));
      }
      const got = averaged(model, ema);
      expectClose(got.params, ref.params);
      got.buffers.forEach((b, i) => expectClose(b, ref.buffers[i]!));
      model.to('cpu');
      expect(() => ema.update()).toThrow(/was moved off cuda/);
      ema.dispose();
    },
  );
});
