import { assert, describe, expect, it } from 'vitest';
import {
  BasicBlock,
  BatchNorm2d,
  Bottleneck,
  Conv2d,
  CrossEntropyLoss,
  Linear,
  ResNet,
  ResNet18,
  ResNet50,
  Random,
  SGD,
  Sequential,
  Tensor,
  type StateDict,
} from '../lib/index.js';
import { ohwiToOihw } from '../lib/nn/module.js';

/** The values of the f32 state-dict entry `key`. */
function f32Values(sd: StateDict, key: string): Float32Array {
  const data = sd.get(key)?.data;
  if (!(data instanceof Float32Array)) throw new Error(`the state dict has no f32 entry '${key}'`);
  return data;
}

/** Bitwise equality of two typed arrays (vitest's deep equality is slow on millions of elements). */
function sameBits(a: ArrayBufferView | undefined, b: ArrayBufferView | undefined): boolean {
  if (!a || !b) return false;
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}

// torchvision.models.resnetXX(num_classes=1000): sum(p.numel() for p in model.parameters())
const TORCHVISION_COUNTS = {
  18: 11_689_512,
  34: 21_797_672,
  50: 25_557_032,
  101: 44_549_160,
  152: 60_192_808,
} as const;

describe('ResNet family', () => {
  for (const [depth, count] of Object.entries(TORCHVISION_COUNTS)) {
    it(`ResNet-${depth} has torchvision's ${count.toLocaleString('en')} parameters`, () => {
      const model = new ResNet(Number(depth) as 18, { seed: 1 });
      expect(model.numParameters()).toBe(count);
      model.releaseBuffers();
    });
  }

  it("names and shapes state-dict entries as torchvision's resnet50 does", () => {
    const sd = ResNet50({ seed: 1 }).stateDict();
    // len(torchvision.models.resnet50().state_dict()) == 320
    expect(sd.size).toBe(320);
    const shape = (k: string) => sd.get(k)?.shape;
    expect(shape('conv1.weight')).toEqual([64, 3, 7, 7]);
    expect(shape('bn1.running_var')).toEqual([64]);
    expect(shape('layer1.0.conv2.weight')).toEqual([64, 64, 3, 3]);
    expect(shape('layer1.0.downsample.0.weight')).toEqual([256, 64, 1, 1]);
    expect(shape('layer1.0.downsample.1.running_mean')).toEqual([256]);
    expect(shape('layer2.0.conv2.weight')).toEqual([128, 128, 3, 3]);
    expect(shape('layer4.2.bn3.num_batches_tracked')).toEqual([]);
    expect(shape('fc.weight')).toEqual([1000, 2048]);
    expect(shape('fc.bias')).toEqual([1000]);
    expect(sd.get('layer3.5.bn2.num_batches_tracked')?.dtype).toBe('i64');
  });

  it('initialises as torchvision: He-normal fan_out convolutions, BN weight 1 and bias 0', () => {
    const model = ResNet50({ seed: 7 });
    const sd = model.stateDict();
    const w = f32Values(sd, 'layer3.0.conv2.weight'); // 256 x 256 x 3 x 3
    const mean = w.reduce((a, b) => a + b, 0) / w.length;
    const std = Math.sqrt(w.reduce((a, b) => a + (b - mean) ** 2, 0) / w.length);
    expect(std).toBeCloseTo(Math.sqrt(2 / (256 * 9)), 3);
    expect(Math.abs(mean)).toBeLessThan(1e-3);
    expect([...f32Values(sd, 'layer3.0.bn2.weight')].every((v) => v === 1)).toBe(true);
    expect([...f32Values(sd, 'layer3.0.bn2.bias')].every((v) => v === 0)).toBe(true);
    const zero = ResNet18({ zeroInitResidual: true, seed: 1 }).stateDict();
    expect([...f32Values(zero, 'layer2.1.bn2.weight')].every((v) => v === 0)).toBe(true);
    expect([...f32Values(zero, 'layer2.1.bn1.weight')].every((v) => v === 1)).toBe(true);
  });

  it('keeps every parameter in one arena with gradients beside them', () => {
    const model = ResNet18({ numClasses: 10, smallInput: true, seed: 2 });
    const arena = model.arena();
    const params = model.parameters();
    expect(params.every((p) => p.arena === arena)).toBe(true);
    expect(params.every((p) => p.data.raw.sharesStorage(arena.params.raw))).toBe(true);
    expect(arena.size).toBeGreaterThanOrEqual(model.numParameters());
    const offsets = params.map((p) => p.offset);
    for (let i = 1; i < offsets.length; i++) {
      expect(offsets[i]!).toBeGreaterThanOrEqual(offsets[i - 1]! + params[i - 1]!.numel);
    }
  });

  it('round-trips a state dict exactly, and the loaded model computes the same outputs', () => {
    const a = ResNet18({ numClasses: 5, smallInput: true, seed: 3 });
    const b = ResNet18({ numClasses: 5, smallInput: true, seed: 4 });
    const x = Tensor.randn([4, 16, 16, 3], { seed: 5 });
    a.forward(x); // moves the running statistics and the batch counter away from their initial values
    const saved = a.stateDict();
    b.loadStateDict(saved);
    const again = b.stateDict();
    expect([...again.keys()]).toEqual([...saved.keys()]);
    for (const [key, entry] of saved) {
      expect(again.get(key)?.shape, key).toEqual(entry.shape);
      expect(sameBits(again.get(key)?.data, entry.data), key).toBe(true);
    }
    a.eval();
    b.eval();
    expect(sameBits(b.forward(x).toFloat32Array(), a.forward(x).toFloat32Array())).toBe(true);
  });

  it('exports convolution weights in OIHW order', () => {
    const conv = new Conv2d({ inChannels: 3, outChannels: 2, kernelSize: [2, 3], seed: 1 });
    const internal = conv.weight.values();
    const exported = conv.stateDict().get('weight');
    assert.isDefined(exported, "the state dict's weight");
    expect(exported.shape).toEqual([2, 3, 2, 3]);
    // element [o=1, i=2, y=1, x=0] of OIHW is element [o=1, y=1, x=0, i=2] of OHWI
    expect((exported.data as Float32Array)[((1 * 3 + 2) * 2 + 1) * 3 + 0]).toBe(
      internal[((1 * 2 + 1) * 3 + 0) * 3 + 2],
    );
    expect(ohwiToOihw(internal, conv.weight.shape)).toEqual(exported.data);
  });

  it('rejects a state dict with a missing, mis-shaped or unknown key and changes nothing', () => {
    const model = ResNet18({ numClasses: 3, smallInput: true, seed: 1 });
    const before = model.stateDict();
    const missing: StateDict = new Map(before);
    missing.delete('layer1.0.conv1.weight');
    expect(() => model.loadStateDict(missing)).toThrow(/missing key 'layer1.0.conv1.weight'/);
    const misShaped: StateDict = new Map(before);
    misShaped.set('fc.weight', { shape: [4, 512], dtype: 'f32', data: new Float32Array(4 * 512) });
    expect(() => model.loadStateDict(misShaped)).toThrow(/'fc.weight' has shape \[4, 512\].*expects \[3, 512\]/);
    const unknown: StateDict = new Map(before);
    unknown.set('fc.extra', { shape: [1], dtype: 'f32', data: new Float32Array(1) });
    expect(() => model.loadStateDict(unknown)).toThrow(expect.objectContaining({ code: 'ERR_RC_STATE_DICT' }));
    model.loadStateDict(unknown, { strict: false });
    const after = model.stateDict();
    for (const [key, entry] of before) expect(sameBits(after.get(key)?.data, entry.data), key).toBe(true);
  });
});

/** Directional derivative of sum(out * r) along a random direction, against backward(). */
function directionalCheck(
  model: Sequential | BasicBlock | Bottleneck,
  x: Tensor,
  seed: number,
  eps: number,
): { analytic: number; numeric: number } {
  const rng = new Random(seed);
  const out0 = model.forward(x);
  const r = Tensor.randn(out0.shape, { seed: seed + 1 });
  const rHost = r.toFloat32Array();
  const objective = () => {
    const y = model.forward(x).toFloat32Array();
    let s = 0;
    for (let i = 0; i < y.length; i++) s += y[i]! * rHost[i]!;
    return s;
  };
  model.zeroGrad();
  objective();
  const gradInput = model.backward(r);
  assert.isNotNull(gradInput, 'backward returns the gradient of the input');
  const dx = gradInput.toFloat32Array();
  const arena = model.arena();
  const theta = arena.params.toFloat32Array();
  const grads = arena.grads.toFloat32Array();
  const xHost = x.toFloat32Array();
  const vParams = theta.map(() => rng.normal());
  const vInput = xHost.map(() => rng.normal());
  let analytic = 0;
  for (let i = 0; i < theta.length; i++) analytic += grads[i]! * vParams[i]!;
  for (let i = 0; i < xHost.length; i++) analytic += dx[i]! * vInput[i]!;
  const evaluate = (sign: number) => {
    arena.params.raw.copyFromHost(theta.map((t, i) => t + sign * eps * vParams[i]!));
    x.raw.copyFromHost(xHost.map((t, i) => t + sign * eps * vInput[i]!));
    return objective();
  };
  const numeric = (evaluate(1) - evaluate(-1)) / (2 * eps);
  arena.params.raw.copyFromHost(theta);
  x.raw.copyFromHost(xHost);
  return { analytic, numeric };
}

describe('containers derive backward from their children', () => {
  // BN without ReLU keeps the objective smooth, so f32 central differences are accurate.
  it('Sequential(Conv2d, BatchNorm2d, Conv2d, Linear-free head) matches finite differences', () => {
    const model = new Sequential(
      new Conv2d({ inChannels: 3, outChannels: 6, kernelSize: 3, stride: 2, padding: 1, bias: true, seed: 1 }),
      new BatchNorm2d({ numFeatures: 6 }),
      new Conv2d({ inChannels: 6, outChannels: 4, kernelSize: 1, seed: 2 }),
    );
    const x = Tensor.randn([3, 7, 7, 3], { seed: 3 });
    const { analytic, numeric } = directionalCheck(model, x, 11, 1e-3);
    expect(Math.abs(analytic - numeric) / Math.abs(numeric)).toBeLessThan(2e-3);
  });

  it('a Bottleneck block with a downsample shortcut matches finite differences', () => {
    const downsample = new Sequential(
      new Conv2d({ inChannels: 8, outChannels: 16, kernelSize: 1, stride: 2, seed: 1 }),
      new BatchNorm2d({ numFeatures: 16 }),
    );
    const block = new Bottleneck(8, 4, 2, downsample, new Random(2));
    const x = Tensor.randn([2, 6, 6, 8], { seed: 4 });
    // A small step keeps ReLU units from crossing their kink between the two evaluations, which
    // would make central differences inexact; f32 rounding is still far below the tolerance.
    const { analytic, numeric } = directionalCheck(block, x, 12, 1e-4);
    expect(Math.abs(analytic - numeric) / Math.abs(numeric)).toBeLessThan(1e-2);
  });

  it('a Bottleneck in evaluation mode (frozen batch-norm statistics, as in fine-tuning) matches finite differences', () => {
    const downsample = new Sequential(
      new Conv2d({ inChannels: 8, outChannels: 16, kernelSize: 1, stride: 2, seed: 1 }),
      new BatchNorm2d({ numFeatures: 16 }),
    );
    const block = new Bottleneck(8, 4, 2, downsample, new Random(2));
    // Running statistics away from their initial 0 and 1.
    for (let i = 0; i < 3; i++) {
      const batch = Tensor.randn([2, 6, 6, 8], { seed: 20 + i });
      block.forward(batch);
      batch.dispose();
    }
    block.eval();
    const x = Tensor.randn([2, 6, 6, 8], { seed: 4 });
    const { analytic, numeric } = directionalCheck(block, x, 14, 1e-4);
    expect(Math.abs(analytic - numeric) / Math.abs(numeric)).toBeLessThan(1e-2);
    block.dispose();
  });

  it('a Bottleneck block with the identity shortcut matches finite differences', () => {
    const block = new Bottleneck(16, 4, 1, null, new Random(5));
    const x = Tensor.randn([2, 5, 5, 16], { seed: 6 });
    const { analytic, numeric } = directionalCheck(block, x, 15, 1e-4);
    expect(Math.abs(analytic - numeric) / Math.abs(numeric)).toBeLessThan(1e-2);
  });

  // The first convolution adds the main branch's input gradient into the shortcut's; with its
  // backward replaced on the instance the block adds the two in a pass of its own.
  it.each([
    ['the identity', 16, 1, false],
    ['a downsample', 8, 2, true],
  ] as const)(
    'a Bottleneck with %s shortcut gets the same gradients with the add in its first convolution',
    (_, inplanes, stride, down) => {
      const run = (ownAdd: boolean) => {
        const downsample = down
          ? new Sequential(
              new Conv2d({ inChannels: inplanes, outChannels: 16, kernelSize: 1, stride, seed: 1 }),
              new BatchNorm2d({ numFeatures: 16 }),
            )
          : null;
        const block = new Bottleneck(inplanes, 4, stride, downsample, new Random(7));
        if (ownAdd) {
          const conv1 = block.main[0] as Conv2d;
          conv1.backward = (g) => Conv2d.prototype.backward.call(conv1, g);
        }
        const x = Tensor.randn([2, 6, 6, inplanes], { seed: 8 });
        const y = block.forward(x);
        const dy = Tensor.randn(y.shape, { seed: 9 });
        block.zeroGrad();
        const dx = block.backward(dy);
        assert.isNotNull(dx);
        if (!ownAdd && !down) expect(dx).toBe((block.main[5] as BatchNorm2d).residualGrad);
        const result = { dx: dx.toFloat32Array(), grads: block.arena().grads.toFloat32Array() };
        block.dispose();
        return result;
      };
      const fused = run(false);
      const separate = run(true);
      for (const [got, want] of [
        [fused.dx, separate.dx],
        [fused.grads, separate.grads],
      ] as const) {
        let worst = 0;
        for (let i = 0; i < want.length; i++) {
          worst = Math.max(worst, Math.abs(got[i]! - want[i]!) / (1 + Math.abs(want[i]!)));
        }
        expect(worst).toBeLessThan(1e-5);
      }
    },
  );

  it('a BasicBlock with the identity shortcut matches finite differences', () => {
    const block = new BasicBlock(4, 4, 1, null, new Random(3));
    const x = Tensor.randn([2, 5, 5, 4], { seed: 5 });
    const { analytic, numeric } = directionalCheck(block, x, 13, 1e-4);
    expect(Math.abs(analytic - numeric) / Math.abs(numeric)).toBeLessThan(1e-2);
  });
});

describe('a plain training step', () => {
  it('accumulates gradients until zeroGrad, as PyTorch does', () => {
    const model = new Linear({ inFeatures: 4, outFeatures: 3, seed: 1 });
    const loss = new CrossEntropyLoss();
    const x = Tensor.randn([5, 4], { seed: 2 });
    const labels = [0, 1, 2, 0, 1];
    loss.forward(model.forward(x), labels);
    model.backward(loss.backward());
    const once = model.weight.grad.toFloat32Array();
    loss.forward(model.forward(x), labels);
    model.backward(loss.backward());
    const twice = model.weight.grad.toFloat32Array();
    once.forEach((v, i) => expect(twice[i]).toBeCloseTo(2 * v, 6));
    model.zeroGrad();
    expect(model.weight.grad.toFloat32Array().every((v) => v === 0)).toBe(true);
  });

  it('SGD with momentum and weight decay updates the arena as torch.optim.SGD', () => {
    const model = new Linear({ inFeatures: 3, outFeatures: 2, seed: 1 });
    model.to('cpu');
    const opt = new SGD(model, { lr: 0.1, momentum: 0.9, weightDecay: 0.01 });
    const p0 = model.weight.values();
    const g = Float32Array.from([0.5, -1, 2, 0.25, 0, -0.75]);
    model.weight.grad.raw.copyFromHost(g);
    opt.step();
    const p1 = model.weight.values();
    const buf = p0.map((p, i) => g[i]! + 0.01 * p);
    p1.forEach((v, i) => expect(v).toBeCloseTo(p0[i]! - 0.1 * buf[i]!, 6));
    opt.step(); // same gradient again: buf = 0.9 * buf + d
    const p2 = model.weight.values();
    p2.forEach((v, i) => {
      const d = g[i]! + 0.01 * p1[i]!;
      expect(v).toBeCloseTo(p1[i]! - 0.1 * (0.9 * buf[i]! + d), 6);
    });
  });

  it('leaves frozen parameters unchanged', () => {
    const model = new Sequential(
      new Linear({ inFeatures: 3, outFeatures: 3, seed: 1 }),
      new Linear({ inFeatures: 3, outFeatures: 2, seed: 2 }),
    );
    const first = model.parameters()[0]!;
    first.requiresGrad = false;
    const before = first.values();
    const opt = new SGD(model, { lr: 0.5 });
    const loss = new CrossEntropyLoss();
    loss.forward(model.forward(Tensor.randn([4, 3], { seed: 3 })), [0, 1, 1, 0]);
    model.backward(loss.backward());
    opt.step();
    expect(first.values()).toEqual(before);
  });
});

describe('Module.getSubmodule', () => {
  it('finds modules by dotted path, freezes a stage through it, and names the children on a wrong path', () => {
    const model = ResNet18({ numClasses: 3, smallInput: true, seed: 1 });
    expect(model.getSubmodule('')).toBe(model);
    const conv = model.getSubmodule('layer2.0.conv1');
    expect(model.namedParameters().find(([name]) => name === 'layer2.0.conv1.weight')?.[1]).toBe(conv.parameters()[0]);
    model.getSubmodule('layer1').setRequiresGrad(false);
    const frozen = model
      .namedParameters()
      .filter(([, p]) => !p.requiresGrad)
      .map(([name]) => name);
    expect(frozen.length).toBeGreaterThan(0);
    expect(frozen.every((name) => name.startsWith('layer1.'))).toBe(true);
    expect(() => model.getSubmodule('layer9')).toThrow(
      /No submodule 'layer9' in the model; its children are conv1, bn1, layer1/,
    );
    expect(() => model.getSubmodule('layer1.5')).toThrow(/No submodule '5' in 'layer1'; its children are 0, 1/);
  });
});
