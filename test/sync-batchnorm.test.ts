/**
 * SyncBatchNorm in one process: with a group of one rank (a stand-in and a real Gloo group) it is
 * BatchNorm2d bit for bit; with a mirror group (k ranks holding the same batch) it is BatchNorm2d
 * over the k copies; conversion keeps a model's values and state-dict names; bad groups and inputs
 * are refused.
 */
import { describe, expect, it } from 'vitest';
import { BatchNorm2d, Conv2d, Sequential, SyncBatchNorm, Tensor, convertSyncBatchNorm } from '../lib/index.js';
import { defined, lookup } from './helpers/defined.js';
import { mirrorGroup, repeatBatch } from './helpers/mirror-group.js';
import { soloGroup } from './gpu/solo-group.js';

interface Form {
  relu: boolean;
  residual: boolean;
}

const FORMS: Form[] = [
  { relu: false, residual: false },
  { relu: true, residual: false },
  { relu: false, residual: true },
  { relu: true, residual: true },
];

// In the test project that runs on the emulated CUDA device (RESNET_TEST_BACKENDS=cuda), the layer
// cases run on CUDA; in 'main' on the CPU.
const onlyCuda = process.env.RESNET_TEST_BACKENDS === 'cuda';
const DEVICE = onlyCuda ? 'cuda:0' : 'cpu';

/** A tensor of normal values on the case's device. */
function randn(shape: number[], seed: number): Tensor {
  return Tensor.randn(shape, { seed, device: DEVICE });
}

/** Non-trivial parameters and running statistics, the same for every layer built with `seed`. */
function setUp(bn: BatchNorm2d, seed: number): void {
  const c = bn.numFeatures;
  bn.to(DEVICE);
  const state = bn.stateDict();
  const pick = (k: number): Float32Array => Tensor.randn([c], { seed: seed + k }).toFloat32Array();
  state.set('weight', { shape: [c], dtype: 'f32', data: pick(1).map((v) => 1 + 0.3 * v) });
  state.set('bias', { shape: [c], dtype: 'f32', data: pick(2) });
  state.set('running_mean', { shape: [c], dtype: 'f32', data: pick(3) });
  state.set('running_var', { shape: [c], dtype: 'f32', data: pick(4).map((v) => 1 + 0.5 * Math.abs(v)) });
  bn.loadStateDict(state);
  bn.zeroGrad();
}

/** What a forward and backward leave: output, input gradients, parameter gradients, state. */
function run(bn: BatchNorm2d, x: Tensor, dy: Tensor, residual: Tensor | undefined) {
  const y = bn.forward(x, residual).toFloat32Array();
  const dx = bn.backward(dy)?.toFloat32Array();
  const dRes = bn.residualGrad?.toFloat32Array();
  const state = bn.stateDict();
  const values = (key: string): Float32Array => lookup(state, key).data as Float32Array;
  return {
    y,
    dx,
    dRes,
    dGamma: bn.weight.grad.toFloat32Array(),
    dBeta: bn.bias.grad.toFloat32Array(),
    runningMean: values('running_mean'),
    runningVar: values('running_var'),
    tracked: lookup(state, 'num_batches_tracked').data,
  };
}

function maxRelError(a: Float32Array, b: Float32Array): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.length; ++i) {
    num = Math.max(num, Math.abs(a[i]! - b[i]!));
    den = Math.max(den, Math.abs(b[i]!));
  }
  return num / Math.max(den, 1e-30);
}

describe(`SyncBatchNorm (${DEVICE}) with a group of one rank equals BatchNorm2d exactly`, () => {
  for (const form of FORMS) {
    it(`relu=${form.relu} residual=${form.residual}: outputs, gradients, running statistics`, () => {
      const group = mirrorGroup(1, DEVICE);
      const plain = new BatchNorm2d({ numFeatures: 6, relu: form.relu, momentum: 0.2 });
      const sync = new SyncBatchNorm({ numFeatures: 6, relu: form.relu, momentum: 0.2, group });
      setUp(plain, 10);
      setUp(sync, 10);
      for (let step = 0; step < 2; ++step) {
        const x = randn([3, 4, 4, 6], 20 + step);
        const dy = randn([3, 4, 4, 6], 30 + step);
        const residual = form.residual ? randn([3, 4, 4, 6], 40 + step) : undefined;
        const a = run(plain, x, dy, residual);
        const b = run(sync, x, dy, residual);
        expect(b).toEqual(a);
      }
      // No collective at all: a group of one runs BatchNorm2d's own ops.
      expect(group.calls).toEqual([]);
      sync.eval();
      plain.eval();
      const x = randn([2, 4, 4, 6], 50);
      expect(sync.forward(x).toFloat32Array()).toEqual(plain.forward(x).toFloat32Array());
    });
  }
});

describe(`SyncBatchNorm (${DEVICE}) with k ranks holding the same batch equals BatchNorm2d over the k copies`, () => {
  for (const form of FORMS) {
    it(`relu=${form.relu} residual=${form.residual}, 3 ranks`, () => {
      const k = 3;
      const group = mirrorGroup(k, DEVICE);
      const whole = new BatchNorm2d({ numFeatures: 5, relu: form.relu });
      const sync = new SyncBatchNorm({ numFeatures: 5, relu: form.relu, group });
      setUp(whole, 60);
      setUp(sync, 60);
      const x = randn([2, 3, 3, 5], 70);
      const dy = randn([2, 3, 3, 5], 71);
      const residual = form.residual ? randn([2, 3, 3, 5], 72) : undefined;
      const a = run(whole, repeatBatch(x, k), repeatBatch(dy, k), residual && repeatBatch(residual, k));
      const b = run(sync, x, dy, residual);
      const n = x.numel;
      // f32: the merged statistics and the summed gradient terms round differently from one pass.
      const tol = 1e-5;
      expect(maxRelError(b.y, a.y.subarray(0, n))).toBeLessThan(tol);
      expect(maxRelError(defined(b.dx, 'dx'), defined(a.dx, 'dx').subarray(0, n))).toBeLessThan(tol);
      if (form.residual) {
        const dRes = defined(a.dRes, 'the whole batch dResidual').subarray(0, n);
        expect(maxRelError(defined(b.dRes, 'dResidual'), dRes)).toBeLessThan(tol);
      }
      expect(maxRelError(b.runningMean, a.runningMean)).toBeLessThan(tol);
      // The unbiased variance uses the global count k·n, not this rank's n.
      expect(maxRelError(b.runningVar, a.runningVar)).toBeLessThan(tol);
      // dγ and dβ stay local (DistributedDataParallel averages them): 1/k of the whole batch's.
      expect(
        maxRelError(
          b.dGamma,
          a.dGamma.map((v) => v / k),
        ),
      ).toBeLessThan(tol);
      expect(
        maxRelError(
          b.dBeta,
          a.dBeta.map((v) => v / k),
        ),
      ).toBeLessThan(tol);
      expect(group.calls).toEqual(['allGather', 'wait', 'allReduce:sum', 'wait']);
    });
  }

  it('a single sample of a single pixel per rank is enough when the group holds more', () => {
    const group = mirrorGroup(2, DEVICE);
    const sync = new SyncBatchNorm({ numFeatures: 3, group });
    const plain = new BatchNorm2d({ numFeatures: 3 });
    const x = randn([1, 1, 1, 3], 80);
    expect(() => plain.forward(x)).toThrow(/more than one value per channel/);
    // Two identical values per channel: zero variance, so y = beta = 0, up to the f32 rounding of
    // x·scale + shift with scale = 1/sqrt(eps) ≈ 316.
    for (const v of sync.forward(x).toFloat32Array()) expect(Math.abs(v)).toBeLessThan(1e-4);
  });
});

describe.skipIf(onlyCuda)('convertSyncBatchNorm', () => {
  function model(): Sequential {
    return new Sequential(
      new Conv2d({ inChannels: 3, outChannels: 4, kernelSize: 3, padding: 1, seed: 1 }),
      new BatchNorm2d({ numFeatures: 4, relu: true }),
      new Conv2d({ inChannels: 4, outChannels: 4, kernelSize: 1, seed: 2 }),
      new BatchNorm2d({ numFeatures: 4 }),
    );
  }

  it('synchronises every BatchNorm2d in place, keeping values, names and the parameter arena', () => {
    const m = model().to('cpu');
    const x = Tensor.randn([2, 5, 5, 3], { seed: 3 });
    m.forward(x);
    const before = m.stateDict();
    const arena = m.arena();
    const group = mirrorGroup(2);
    expect(convertSyncBatchNorm(m, group)).toBe(m);
    const bns = m.namedModules().flatMap(([name, c]) => (c instanceof BatchNorm2d ? [[name, c] as const] : []));
    expect(bns.map(([name]) => name)).toEqual(['1', '3']);
    for (const [, bn] of bns) expect(bn.sync?.active).toBe(true);
    expect(m.arena()).toBe(arena);
    const after = m.stateDict();
    expect([...after.keys()]).toEqual([...before.keys()]);
    for (const [key, entry] of before) expect(after.get(key)).toEqual(entry);
    m.forward(x);
    expect(group.calls.filter((c) => c === 'allGather')).toHaveLength(2);
  });

  it('with a real Gloo group of one rank, a converted model trains as the unconverted one, bit for bit', () => {
    const group = soloGroup('gloo', undefined, 30);
    try {
      const plain = model().to('cpu');
      const synced = convertSyncBatchNorm(model().to('cpu'), group);
      for (let step = 0; step < 2; ++step) {
        const x = Tensor.randn([2, 5, 5, 3], { seed: 10 + step });
        const dy = Tensor.randn([2, 5, 5, 4], { seed: 20 + step });
        for (const m of [plain, synced]) {
          m.zeroGrad();
          m.forward(x);
          m.backward(dy);
        }
        expect(synced.stateDict()).toEqual(plain.stateDict());
        expect([...synced.arena().grads.toFloat32Array()]).toEqual([...plain.arena().grads.toFloat32Array()]);
      }
    } finally {
      group.destroy();
    }
  });

  it('a SyncBatchNorm checkpoint loads into BatchNorm2d and back', () => {
    const sync = new SyncBatchNorm({ numFeatures: 4, group: mirrorGroup(2) });
    sync.forward(Tensor.randn([2, 3, 3, 4], { seed: 5 }));
    const plain = new BatchNorm2d({ numFeatures: 4 });
    plain.loadStateDict(sync.stateDict());
    expect(plain.stateDict()).toEqual(sync.stateDict());
  });

  it('refuses what is not a process group, and inputs off the group device', () => {
    expect(() => convertSyncBatchNorm(model(), {} as never)).toThrow(/group/);
    expect(() => new SyncBatchNorm({ numFeatures: 4 } as never)).toThrow(/group/);
    expect(() => new SyncBatchNorm({ numFeatures: 4, group: mirrorGroup(2), affine: true } as never)).toThrow(
      /Unknown option 'affine'/,
    );
    const elsewhere = { ...mirrorGroup(2), device: 'cuda:0' };
    const bn = new SyncBatchNorm({ numFeatures: 4, group: elsewhere });
    expect(() => bn.forward(Tensor.randn([2, 3, 3, 4], { seed: 6 }))).toThrow(/process group's device/);
  });
});
