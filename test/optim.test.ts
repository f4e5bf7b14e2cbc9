/**
 * The optimizers and mixed-precision helpers of lib/optim/ on a tiny model, against their
 * formulas computed here in float64 per parameter tensor: AdamW and LAMB over three steps,
 * GradScaler's skip, back-off and growth, gradient clipping, gradient accumulation, checkpoints
 * and parameter groups.
 */
import { assert, describe, expect, it } from 'vitest';
import {
  AdamW,
  CrossEntropyLoss,
  GradScaler,
  LAMB,
  Linear,
  ReLU,
  ResNet18,
  SGD,
  Sequential,
  Tensor,
  clipGradNorm,
  gradNorm,
  parameterGroups,
  type Module,
  type Parameter,
} from '../lib/index.js';

const X = Tensor.randn([6, 4], { seed: 7 });
const LABELS = [0, 1, 2, 1, 0, 2];

function tinyModel(seed = 1): Linear {
  return new Linear({ inFeatures: 4, outFeatures: 3, seed }).to('cpu');
}

function values(model: Module): Float64Array[] {
  return model.parameters().map((p) => Float64Array.from(p.values()));
}

/** One forward and backward pass from zeroed gradients; returns the gradients per parameter. */
function backward(model: Module, loss: CrossEntropyLoss, x: Tensor = X, labels: number[] = LABELS): Float64Array[] {
  model.zeroGrad();
  loss.forward(model.forward(x), labels);
  model.backward(loss.backward());
  return model.parameters().map((p) => Float64Array.from(p.grad.toFloat32Array()));
}

function setGrad(p: Parameter, edit: (g: Float32Array) => void): void {
  const g = p.grad.toFloat32Array();
  edit(g);
  p.grad.raw.copyFromHost(g);
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

interface AdamSettings {
  lr: number;
  beta1: number;
  beta2: number;
  eps: number;
  weightDecay: number;
}

/** torch.optim.AdamW on one tensor, in float64. */
class AdamWReference {
  readonly m: Float64Array;
  readonly v: Float64Array;
  constructor(
    readonly p: Float64Array,
    readonly h: AdamSettings,
  ) {
    this.m = new Float64Array(p.length);
    this.v = new Float64Array(p.length);
  }

  step(g: ArrayLike<number>, t: number): void {
    const { lr, beta1, beta2, eps, weightDecay } = this.h;
    const bc1 = 1 - beta1 ** t;
    const bc2 = 1 - beta2 ** t;
    for (let i = 0; i < this.p.length; i++) {
      this.p[i] = this.p[i]! * (1 - lr * weightDecay);
      this.m[i] = beta1 * this.m[i]! + (1 - beta1) * g[i]!;
      this.v[i] = beta2 * this.v[i]! + (1 - beta2) * g[i]! ** 2;
      this.p[i] = this.p[i]! - (lr / bc1) * (this.m[i]! / (Math.sqrt(this.v[i]! / bc2) + eps));
    }
  }
}

/** LAMB (timm / FusedLAMB, bias correction on) on one tensor, in float64. */
class LambReference extends AdamWReference {
  constructor(
    p: Float64Array,
    h: AdamSettings,
    readonly adapt: boolean,
  ) {
    super(p, h);
  }

  override step(g: ArrayLike<number>, t: number): void {
    const { lr, beta1, beta2, eps, weightDecay } = this.h;
    const bc1 = 1 - beta1 ** t;
    const bc2 = 1 - beta2 ** t;
    const u = new Float64Array(this.p.length);
    let pp = 0;
    let uu = 0;
    for (let i = 0; i < this.p.length; i++) {
      this.m[i] = beta1 * this.m[i]! + (1 - beta1) * g[i]!;
      this.v[i] = beta2 * this.v[i]! + (1 - beta2) * g[i]! ** 2;
      u[i] = this.m[i]! / bc1 / (Math.sqrt(this.v[i]! / bc2) + eps) + weightDecay * this.p[i]!;
      pp += this.p[i]! ** 2;
      uu += u[i]! ** 2;
    }
    const ratio = this.adapt && pp > 0 && uu > 0 ? Math.sqrt(pp) / Math.sqrt(uu) : 1;
    for (let i = 0; i < this.p.length; i++) this.p[i] = this.p[i]! - lr * ratio * u[i]!;
  }
}

const ADAM: Omit<AdamSettings, 'weightDecay'> = { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8 };

describe('AdamW', () => {
  it('matches torch.optim.AdamW over three steps, with weight decay on the weight only', () => {
    const model = tinyModel();
    const loss = new CrossEntropyLoss();
    const opt = new AdamW(parameterGroups(model, { weightDecay: 0.1 }), {
      lr: ADAM.lr,
      betas: [ADAM.beta1, ADAM.beta2],
      eps: ADAM.eps,
    });
    const refs = values(model).map((p, i) => new AdamWReference(p, { ...ADAM, weightDecay: i === 0 ? 0.1 : 0 }));
    for (let t = 1; t <= 3; t++) {
      const grads = backward(model, loss);
      opt.step();
      refs.forEach((r, i) => r.step(grads[i]!, t));
      values(model).forEach((p, i) => expectClose(p, refs[i]!.p));
    }
    expect(opt.stepCount).toBe(3);
    const { expAvg, expAvgSq } = opt.state().buffers;
    assert.isDefined(expAvg, 'the state holds expAvg');
    assert.isDefined(expAvgSq, 'the state holds expAvgSq');
    const weight = model.weight;
    expectClose(expAvg.subarray(weight.offset, weight.offset + weight.numel), refs[0]!.m);
    expectClose(expAvgSq.subarray(weight.offset, weight.offset + weight.numel), refs[0]!.v);
  });

  it('defaults to PyTorch settings and rejects bad ones', () => {
    const opt = new AdamW(tinyModel(), { lr: 1e-3 });
    expect(opt.paramGroups[0]).toMatchObject({ lr: 1e-3, betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0.01 });
    expect(() => new AdamW(tinyModel(), { lr: 1e-3, betas: [1, 0.999] })).toThrow(/betas\[0\]/);
    expect(() => new AdamW(tinyModel(), { lr: 1e-3, eps: -1 })).toThrow(/eps/);
    expect(() => new AdamW(tinyModel(), { lr: 1e-3, momentum: 0.9 } as never)).toThrow(/Unknown option 'momentum'/);
  });
});

describe('LAMB', () => {
  it('matches the LAMB formula over three steps (trust ratio per tensor)', () => {
    const model = tinyModel(2);
    const loss = new CrossEntropyLoss();
    const settings = { ...ADAM, lr: 0.05, eps: 1e-6, weightDecay: 0.01 };
    const opt = new LAMB(model, { lr: settings.lr, weightDecay: settings.weightDecay });
    const refs = values(model).map((p) => new LambReference(p, settings, true));
    for (let t = 1; t <= 3; t++) {
      const grads = backward(model, loss);
      opt.step();
      refs.forEach((r, i) => r.step(grads[i]!, t));
      values(model).forEach((p, i) => expectClose(p, refs[i]!.p));
    }
  });

  it('takes the plain Adam step in groups without weight decay unless alwaysAdapt', () => {
    for (const alwaysAdapt of [false, true]) {
      const model = tinyModel(3);
      const loss = new CrossEntropyLoss();
      const settings = { ...ADAM, lr: 0.05, eps: 1e-6 };
      const opt = new LAMB(parameterGroups(model, { weightDecay: 0.02 }), { lr: settings.lr, alwaysAdapt });
      const refs = values(model).map(
        (p, i) => new LambReference(p, { ...settings, weightDecay: i === 0 ? 0.02 : 0 }, i === 0 || alwaysAdapt),
      );
      for (let t = 1; t <= 3; t++) {
        const grads = backward(model, loss);
        opt.step();
        refs.forEach((r, i) => r.step(grads[i]!, t));
        values(model).forEach((p, i) => expectClose(p, refs[i]!.p));
      }
    }
  });
});

describe('GradScaler', () => {
  it('skips the step and backs off on an inf gradient, then grows after growthInterval clean steps', () => {
    const model = tinyModel(4);
    const loss = new CrossEntropyLoss();
    const opt = new AdamW(model, { lr: 0.01, weightDecay: 0 });
    const scaler = new GradScaler({ initScale: 1024, growthInterval: 3 });
    const before = values(model);

    scaler.scale(loss);
    expect(loss.gradScale).toBe(1024);
    backward(model, loss);
    setGrad(model.weight, (g) => (g[5] = Infinity));
    scaler.step(opt);
    scaler.update();
    expect(scaler.skippedLastStep).toBe(true);
    expect(scaler.lossScale).toBe(512);
    expect(scaler.scaleValue()).toBe(512);
    expect(opt.stepCount).toBe(0);
    values(model).forEach((p, i) => expect(p).toEqual(before[i]));
    expect(Object.values(opt.state().buffers).every((b) => b.every((v) => v === 0))).toBe(true);

    // Clean steps: the update is AdamW's on the unscaled gradients, counted from t = 1 again.
    const refs = before.map((p) => new AdamWReference(p, { ...ADAM, weightDecay: 0 }));
    const scales: number[] = [];
    for (let t = 1; t <= 3; t++) {
      scaler.scale(loss);
      const scaled = backward(model, loss);
      const scale = loss.gradScale;
      scaler.step(opt);
      scaler.update();
      expect(scaler.skippedLastStep).toBe(false);
      scales.push(scaler.lossScale);
      refs.forEach((r, i) =>
        r.step(
          scaled[i]!.map((g) => g / scale),
          t,
        ),
      );
      values(model).forEach((p, i) => expectClose(p, refs[i]!.p));
    }
    expect(scales).toEqual([512, 512, 1024]);
    expect(opt.stepCount).toBe(3);
    expect(scaler.state()).toEqual({
      scale: 1024,
      growthFactor: 2,
      backoffFactor: 0.5,
      growthInterval: 3,
      growthTracker: 0,
    });
  });

  it('keeps SGD momentum starting from the first real step after a skipped one', () => {
    const model = tinyModel(5);
    const loss = new CrossEntropyLoss();
    const opt = new SGD(model, { lr: 0.1, momentum: 0.9, dampening: 0.5 });
    const scaler = new GradScaler({ initScale: 256 });
    const before = values(model);
    scaler.scale(loss);
    backward(model, loss);
    assert.isNotNull(model.bias, 'the model has a bias');
    setGrad(model.bias, (g) => (g[1] = NaN));
    scaler.step(opt);
    scaler.update();
    expect(scaler.lossScale).toBe(128);
    scaler.scale(loss);
    const scaled = backward(model, loss);
    scaler.step(opt);
    scaler.update();
    // First step: buf = d (not (1 - dampening) * d), p -= lr * buf.
    values(model).forEach((p, i) =>
      expectClose(
        p,
        before[i]!.map((v, j) => v - 0.1 * (scaled[i]![j]! / 128)),
      ),
    );
  });

  it('unscales before clipping, as in PyTorch', () => {
    const model = tinyModel(6);
    const loss = new CrossEntropyLoss();
    const opt = new SGD(model, { lr: 0.1 });
    const scaler = new GradScaler({ initScale: 2 ** 12 });
    const before = values(model);
    scaler.scale(loss);
    const scaled = backward(model, loss);
    scaler.unscale(opt);
    expect(() => scaler.unscale(opt)).toThrow(/already been called/);
    const grads = scaled.map((g) => g.map((v) => v / 2 ** 12));
    const norm = Math.sqrt(grads.reduce((s, g) => s + g.reduce((a, v) => a + v * v, 0), 0));
    const total = clipGradNorm(model, norm / 2);
    expectClose([total.item()], [norm]);
    scaler.step(opt);
    scaler.update();
    const coef = norm / 2 / (norm + 1e-6);
    values(model).forEach((p, i) =>
      expectClose(
        p,
        before[i]!.map((v, j) => v - 0.1 * coef * grads[i]![j]!),
      ),
    );
  });

  it('passes everything through when disabled, and rejects misuse', () => {
    const model = tinyModel(7);
    const loss = new CrossEntropyLoss();
    const opt = new SGD(model, { lr: 0.1 });
    const off = new GradScaler({ enabled: false });
    off.scale(loss);
    expect(loss.gradScale).toBe(1);
    const before = values(model);
    const grads = backward(model, loss);
    off.unscale(opt);
    off.step(opt);
    off.update();
    values(model).forEach((p, i) =>
      expectClose(
        p,
        before[i]!.map((v, j) => v - 0.1 * grads[i]![j]!),
      ),
    );
    const on = new GradScaler();
    expect(() => on.update()).toThrow(/no gradients were unscaled/);
    expect(() => new GradScaler({ growthFactor: 0.5 })).toThrow(/growthFactor/);
    expect(() => new GradScaler({ backoffFactor: 1 })).toThrow(/backoffFactor/);
  });

  it('restores its scale and growth tracker from a checkpoint', () => {
    const model = tinyModel(8);
    const loss = new CrossEntropyLoss();
    const opt = new SGD(model, { lr: 0.01 });
    const a = new GradScaler({ initScale: 64, growthInterval: 3 });
    for (let i = 0; i < 2; i++) {
      a.scale(loss);
      backward(model, loss);
      a.step(opt);
      a.update();
    }
    const saved = a.state();
    expect(saved).toMatchObject({ scale: 64, growthTracker: 2 });
    const b = new GradScaler({ initScale: 1, growthInterval: 3 });
    b.loadState(saved);
    expect(b.lossScale).toBe(64);
    b.scale(loss);
    backward(model, loss);
    b.step(opt);
    b.update();
    expect(b.lossScale).toBe(128); // the third clean step in a row grows the scale
  });
});

describe('gradient clipping', () => {
  it('scales the gradients by maxNorm / norm and gives the reference SGD update', () => {
    const model = tinyModel(9);
    const loss = new CrossEntropyLoss();
    const opt = new SGD(model, { lr: 0.5, momentum: 0.9 });
    const before = values(model);
    const grads = backward(model, loss);
    const norm = Math.sqrt(grads.reduce((s, g) => s + g.reduce((a, v) => a + v * v, 0), 0));
    expectClose([gradNorm(model).item()], [norm]);
    const maxNorm = norm / 4;
    const total = clipGradNorm(model, maxNorm);
    expectClose([total.item()], [norm]);
    opt.step();
    const coef = maxNorm / (norm + 1e-6);
    values(model).forEach((p, i) =>
      expectClose(
        p,
        before[i]!.map((v, j) => v - 0.5 * coef * grads[i]![j]!),
      ),
    );
    // A norm within maxNorm leaves the gradients as they are.
    const grads2 = backward(model, loss);
    clipGradNorm(model.arena(), 1e6);
    model.parameters().forEach((p, i) => expect(Float64Array.from(p.grad.toFloat32Array())).toEqual(grads2[i]));
  });
});

describe('gradient accumulation', () => {
  it('two half batches with gradScale 0.5 give the SGD update of the full batch', () => {
    const make = () =>
      new Sequential(
        new Linear({ inFeatures: 4, outFeatures: 5, seed: 1 }),
        new ReLU(),
        new Linear({ inFeatures: 5, outFeatures: 3, seed: 2 }),
      ).to('cpu');
    const full = make();
    const split = make();
    const x = Tensor.randn([8, 4], { seed: 3 });
    const host = x.toFloat32Array();
    const halves = [Tensor.from(host.subarray(0, 16), [4, 4]), Tensor.from(host.subarray(16), [4, 4])];
    const labels = [0, 2, 1, 1, 2, 0, 0, 1];
    const optFull = new SGD(full, { lr: 0.2, momentum: 0.9, weightDecay: 1e-3 });
    const optSplit = new SGD(split, { lr: 0.2, momentum: 0.9, weightDecay: 1e-3 });
    const lossFull = new CrossEntropyLoss();
    const lossSplit = new CrossEntropyLoss();
    lossSplit.gradScale = 0.5;
    for (let step = 0; step < 2; step++) {
      optFull.zeroGrad();
      lossFull.forward(full.forward(x), labels);
      full.backward(lossFull.backward());
      optFull.step();
      optSplit.zeroGrad();
      halves.forEach((h, k) => {
        lossSplit.forward(split.forward(h), labels.slice(4 * k, 4 * k + 4));
        split.backward(lossSplit.backward());
      });
      optSplit.step();
      values(split).forEach((p, i) => expectClose(p, values(full)[i]!, 1e-6));
    }
  });
});

describe('optimizer checkpoints', () => {
  it('state() and loadState() continue AdamW exactly where it stopped', () => {
    const loss = new CrossEntropyLoss();
    const a = tinyModel(10);
    const optA = new AdamW(a, { lr: 0.01 });
    for (let i = 0; i < 2; i++) {
      backward(a, loss);
      optA.step();
    }
    const saved = optA.state();
    expect(saved.step).toBe(2);
    expect(Object.keys(saved.buffers).sort()).toEqual(['expAvg', 'expAvgSq']);
    const b = tinyModel(11);
    b.loadStateDict(a.stateDict());
    const optB = new AdamW(b, { lr: 0.5 });
    optB.loadState(saved);
    expect(optB.paramGroups[0]!.lr).toBe(0.01);
    expect(optB.stepCount).toBe(2);
    backward(a, loss);
    optA.step();
    backward(b, loss);
    optB.step();
    values(b).forEach((p, i) => expect(p).toEqual(values(a)[i]));
    expect(() => optB.loadState({ ...saved, buffers: { expAvg: new Float32Array(3) } })).toThrow(/arena's size/);
    const { expAvg } = saved.buffers;
    assert.isDefined(expAvg, 'the state holds expAvg');
    expect(() => optB.loadState({ ...saved, buffers: { momentum: expAvg } })).toThrow(/expAvg, expAvgSq/);
  });

  it('round-trips SGD momentum', () => {
    const loss = new CrossEntropyLoss();
    const a = tinyModel(12);
    const optA = new SGD(a, { lr: 0.1, momentum: 0.9 });
    backward(a, loss);
    optA.step();
    const b = tinyModel(13);
    b.loadStateDict(a.stateDict());
    const optB = new SGD(b, { lr: 0.1, momentum: 0.9 });
    optB.loadState(optA.state());
    backward(a, loss);
    optA.step();
    backward(b, loss);
    optB.step();
    values(b).forEach((p, i) => expect(p).toEqual(values(a)[i]));
  });

  it('frees its state arenas with Symbol.dispose (as with `using`)', () => {
    const loss = new CrossEntropyLoss();
    const model = tinyModel(14);
    const optimizer = new AdamW(model, { lr: 0.01 });
    backward(model, loss);
    optimizer.step();
    expect(Object.keys(optimizer.state().buffers).sort()).toEqual(['expAvg', 'expAvgSq']);
    optimizer[Symbol.dispose]();
    expect(Object.keys(optimizer.state().buffers)).toEqual([]);
  });
});

describe('parameterGroups', () => {
  it('puts conv and linear weights in a decaying group and norms and biases in one without decay', () => {
    const model = ResNet18({ numClasses: 10, smallInput: true });
    const groups = parameterGroups(model, { weightDecay: 5e-4 });
    const decay = groups[0]!;
    const noDecay = groups[1]!;
    expect(decay.weightDecay).toBe(5e-4);
    expect(noDecay.weightDecay).toBe(0);
    expect(decay.params.every((p) => p.kind === 'weight')).toBe(true);
    expect(noDecay.params.every((p) => p.kind === 'norm' || p.kind === 'bias')).toBe(true);
    expect(decay.params.length + noDecay.params.length).toBe(model.parameters().length);
    // 20 convolutions and the classifier's weight; 20 batch norms (weight and bias) and its bias.
    expect(decay.params.length).toBe(21);
    expect(noDecay.params.length).toBe(41);
    const single = parameterGroups(model, { weightDecay: 1e-4, noWeightDecayOnNormAndBias: false });
    expect(single).toHaveLength(1);
    expect(single[0]!.params).toHaveLength(62);
    expect(() => parameterGroups(model, { weightDecay: -1 })).toThrow(/weightDecay/);
  });
});
