/**
 * The fused path `bn-add-relu` (the dual batch norm of a downsample block) against the path it
 * replaces, on the emulated CUDA device: the op (training and evaluation forward, backward) against
 * batchNormForward of the shortcut followed by batchNormForward of the main branch with that
 * residual, and their two backwards, in f32, bf16 and f16; then a small ResNet trained a few steps
 * with the switch on and off. On the CPU the op is refused and the switch changes nothing.
 */
import { describe, expect, it, vi } from 'vitest';
import {
  BatchNorm2d,
  CrossEntropyLoss,
  DataLoader,
  InputNormalize,
  ResNet,
  SGD,
  ShapesDataset,
  Tensor,
  Trainer,
  convertSyncBatchNorm,
  listBackends,
} from '../lib/index.js';
import { addon, type DTypeName, type RawTensor } from '../lib/binding.js';
import type { Module } from '../lib/nn/module.js';
import { mirrorGroup } from './helpers/mirror-group.js';
import {
  NORMALIZE,
  QUIET_TRAINER,
  type SmallResNetShape,
  lcgImages,
  lcgValues,
  smallResNet,
  withFused,
} from './helpers/fused-runs.js';
import { TOLERANCE } from './ops/harness.js';

// In the test project on the emulated CUDA device the cases run on CUDA; in 'main' on the CPU.
const onlyCuda = process.env.RESNET_TEST_BACKENDS === 'cuda';
const cuda = listBackends().find((b) => b.name === 'cuda');
const onCuda = onlyCuda && cuda?.available === true;

/** ‖out − ref‖ / ‖ref‖, the measure of the op tables' tolerances. */
function relError(out: ArrayLike<number>, ref: ArrayLike<number>): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < ref.length; i++) {
    num += (out[i]! - ref[i]!) ** 2;
    den += ref[i]! ** 2;
  }
  return Math.sqrt(num) / Math.sqrt(den || 1);
}

function expectClose(what: string, out: ArrayLike<number>, ref: ArrayLike<number>, tol: number): void {
  expect(out.length, `${what}: length`).toBe(ref.length);
  const err = relError(out, ref);
  expect(err, `${what}: relative error ${err.toExponential(2)} (tolerance ${tol})`).toBeLessThanOrEqual(tol);
}

// ---- the op ------------------------------------------------------------------------------------

interface Side {
  x: Tensor;
  gamma: Tensor;
  beta: Tensor;
  runningMean: Tensor;
  runningVar: Tensor;
  saveMean: Tensor;
  saveInvStd: Tensor;
  dx: Tensor;
  dGamma: Tensor;
  dBeta: Tensor;
}

const MOMENTUM = [0.1, 0.25];
const EPS = [1e-5, 1e-3];

/** One batch norm's tensors; the inputs have means far from 0 (as after a convolution of ReLU outputs). */
function side(shape: number[], dtype: DTypeName, seed: number): Side {
  const c = shape[3]!;
  const n = shape.reduce((a, b) => a * b, 1);
  const raw = lcgValues(n, seed).map((v, i) => 1.5 + (i % c) * 0.1 + v * (1 + (i % 3)));
  const device = 'cuda:0';
  return {
    x: Tensor.from(raw, shape, { dtype, device }),
    gamma: Tensor.from(
      lcgValues(c, seed + 1).map((v) => 1 + 0.5 * v),
      [c],
      { device },
    ),
    beta: Tensor.from(
      lcgValues(c, seed + 2).map((v) => 0.5 * v),
      [c],
      { device },
    ),
    runningMean: Tensor.from(lcgValues(c, seed + 3), [c], { device }),
    runningVar: Tensor.from(
      lcgValues(c, seed + 4).map((v) => 1.2 + v),
      [c],
      { device },
    ),
    saveMean: Tensor.zeros([c], { device }),
    saveInvStd: Tensor.zeros([c], { device }),
    dx: Tensor.zeros(shape, { dtype, device }),
    dGamma: Tensor.from(lcgValues(c, seed + 5), [c], { device }),
    dBeta: Tensor.from(lcgValues(c, seed + 6), [c], { device }),
  };
}

function forwardSide(s: Side, i: number) {
  return {
    x: s.x.raw,
    gamma: s.gamma.raw,
    beta: s.beta.raw,
    runningMean: s.runningMean.raw,
    runningVar: s.runningVar.raw,
    saveMean: s.saveMean.raw,
    saveInvStd: s.saveInvStd.raw,
    momentum: MOMENTUM[i]!,
    eps: EPS[i]!,
  };
}

function gradSide(s: Side) {
  return {
    x: s.x.raw,
    gamma: s.gamma.raw,
    saveMean: s.saveMean.raw,
    saveInvStd: s.saveInvStd.raw,
    dx: s.dx.raw,
    dGamma: s.dGamma.raw,
    dBeta: s.dBeta.raw,
  };
}

interface SideResult {
  runningMean: Float32Array;
  runningVar: Float32Array;
  saveMean: Float32Array;
  saveInvStd: Float32Array;
  dx: Float32Array;
  dGamma: Float32Array;
  dBeta: Float32Array;
}

interface OpResult {
  y: Float32Array;
  sides: SideResult[];
}

/**
 * Forward then backward of one tail, fused (dual ops) or unfused (the shortcut's batch norm, the
 * main one with its output as the residual, then their backwards), on fresh tensors. `maskFrom`
 * (unfused only): the output the backward masks with instead of its own forward's, so that a
 * ReLU mask flipped by rounding (an output within the dtype's rounding of 0, which the unfused
 * path rounds once more) does not count against the backward. `y` is the forward's own output.
 */
function runTail(
  fused: boolean,
  shape: number[],
  dtype: DTypeName,
  training: boolean,
  relu: boolean,
  maskFrom: Float32Array | null = null,
): OpResult {
  const a = side(shape, dtype, 11);
  const b = side(shape, dtype, 23);
  const device = 'cuda:0';
  const y = Tensor.zeros(shape, { dtype, device });
  const dy = Tensor.from(lcgValues(y.numel, 37), shape, { dtype, device });
  const extra: Tensor[] = [];
  const native = addon();
  let yForward: Float32Array;
  if (fused) {
    native.dualBatchNormForward({ a: forwardSide(a, 0), b: forwardSide(b, 1), y: y.raw, training, relu });
    yForward = y.toFloat32Array();
    native.dualBatchNormBackward({
      a: gradSide(a),
      b: gradSide(b),
      ...(relu ? { y: y.raw } : {}),
      dy: dy.raw,
      relu,
      training,
    });
  } else {
    const yb = Tensor.zeros(shape, { dtype, device });
    const g = Tensor.zeros(shape, { dtype, device });
    extra.push(yb, g);
    const fwd = (s: Side, i: number, out: RawTensor, residual: RawTensor | null, withRelu: boolean) =>
      native.batchNormForward({
        ...forwardSide(s, i),
        ...(residual ? { residual } : {}),
        y: out,
        training,
        relu: withRelu,
      });
    fwd(b, 1, yb.raw, null, false);
    fwd(a, 0, y.raw, yb.raw, relu);
    yForward = y.toFloat32Array();
    if (maskFrom) {
      // The backward masks with the other path's output, so that both backwards see one ReLU mask.
      const other = Tensor.from(maskFrom, shape, { dtype, device });
      y.raw.copyFrom(other.raw);
      other.dispose();
    }
    const bwd = (s: Side, out: RawTensor, grad: RawTensor, dResidual: RawTensor | null, withRelu: boolean) =>
      native.batchNormBackward({
        x: s.x.raw,
        y: out,
        dy: grad,
        gamma: s.gamma.raw,
        saveMean: s.saveMean.raw,
        saveInvStd: s.saveInvStd.raw,
        dx: s.dx.raw,
        dGamma: s.dGamma.raw,
        dBeta: s.dBeta.raw,
        ...(dResidual ? { dResidual } : {}),
        relu: withRelu,
        training,
      });
    bwd(a, y.raw, dy.raw, g.raw, relu);
    bwd(b, yb.raw, g.raw, null, false);
  }
  const read = (t: Tensor) => t.toFloat32Array();
  const out: OpResult = {
    y: yForward,
    sides: [a, b].map((s): SideResult => ({
      runningMean: read(s.runningMean),
      runningVar: read(s.runningVar),
      saveMean: read(s.saveMean),
      saveInvStd: read(s.saveInvStd),
      dx: read(s.dx),
      dGamma: read(s.dGamma),
      dBeta: read(s.dBeta),
    })),
  };
  for (const s of [a, b]) for (const t of Object.values(s)) (t as Tensor).dispose();
  for (const t of [y, dy, ...extra]) t.dispose();
  return out;
}

// C = 16 takes the 16-byte packs in every dtype; C = 6 the scalar fallback.
const OP_CASES: { dtype: DTypeName; shape: number[]; training: boolean; relu: boolean }[] = [
  { dtype: 'f32', shape: [2, 3, 3, 16], training: true, relu: true },
  { dtype: 'f32', shape: [2, 3, 5, 6], training: true, relu: false },
  { dtype: 'f32', shape: [2, 3, 3, 16], training: false, relu: true },
  { dtype: 'bf16', shape: [2, 3, 3, 16], training: true, relu: true },
  { dtype: 'bf16', shape: [2, 3, 3, 16], training: false, relu: true },
  { dtype: 'f16', shape: [2, 3, 3, 16], training: true, relu: true },
  { dtype: 'f16', shape: [3, 2, 2, 6], training: true, relu: true },
];

describe('the dual batch norm op against the two batch norms it fuses', () => {
  for (const c of OP_CASES) {
    const label = `${c.dtype} [${c.shape.join('x')}] ${c.training ? 'training' : 'evaluation'}${c.relu ? ' relu' : ''}`;
    it.skipIf(!onCuda)(`gives the same output, statistics and gradients: ${label}`, () => {
      const out = runTail(true, c.shape, c.dtype, c.training, c.relu);
      const ref = runTail(false, c.shape, c.dtype, c.training, c.relu, out.y);
      const tol = TOLERANCE[c.dtype as 'f32' | 'bf16' | 'f16'];
      expectClose('y', out.y, ref.y, tol);
      for (const [i, name] of ['a (main)', 'b (shortcut)'].entries()) {
        const o = out.sides[i]!;
        const r = ref.sides[i]!;
        // Statistics: f32 from the same inputs, so the f32 tolerance whatever the activations' dtype;
        // so are the parameter gradients, but for the shortcut's in bf16/f16, which the unfused
        // path sums from g rounded to the dtype (the fused path from g in f32).
        for (const key of ['runningMean', 'runningVar', 'saveMean', 'saveInvStd'] as const) {
          expectClose(`${name} ${key}`, o[key], r[key], TOLERANCE.f32);
        }
        const gradTol = i === 1 ? tol : TOLERANCE.f32;
        expectClose(`${name} dGamma`, o.dGamma, r.dGamma, gradTol);
        expectClose(`${name} dBeta`, o.dBeta, r.dBeta, gradTol);
        expectClose(`${name} dx`, o.dx, r.dx, tol);
      }
      // The evaluation forward leaves the running statistics alone and saves them as constants.
      if (!c.training) {
        const a = side(c.shape, c.dtype, 11);
        const main = out.sides[0]!;
        expectClose('running mean kept', main.runningMean, a.runningMean.toFloat32Array(), 0);
        expectClose('saved mean = running mean', main.saveMean, a.runningMean.toFloat32Array(), 0);
        for (const t of Object.values(a)) (t as Tensor).dispose();
      }
    });
  }

  it.skipIf(!onCuda)('refuses inputs of different shapes, naming them', () => {
    const a = side([2, 2, 2, 8], 'f32', 1);
    const b = side([2, 2, 4, 8], 'f32', 2);
    const y = Tensor.zeros([2, 2, 2, 8], { device: 'cuda:0' });
    expect(() =>
      addon().dualBatchNormForward({ a: forwardSide(a, 0), b: forwardSide(b, 1), y: y.raw, training: true }),
    ).toThrow(/a\.x and b\.x must match/);
    for (const s of [a, b]) for (const t of Object.values(s)) (t as Tensor).dispose();
    y.dispose();
  });
});

describe.skipIf(onlyCuda)('the dual batch norm on the CPU', () => {
  it('is refused: the CPU runs the two batch norms', () => {
    const t = (shape: number[]) => Tensor.zeros(shape).raw;
    const s = () => ({ x: t([2, 1, 1, 4]), gamma: t([4]), beta: t([4]), runningMean: t([4]), runningVar: t([4]) });
    expect(() => addon().dualBatchNormForward({ a: s(), b: s(), y: t([2, 1, 1, 4]), training: false })).toThrow(
      /dual batch norm is a fused path of CUDA devices/,
    );
  });
});

// ---- the module path ---------------------------------------------------------------------------

const SIZE = 8;
const BATCH = 4;
const CLASSES = 3;

/** A stem and two blocks: one with the identity shortcut, one downsampling (the dual pass). */
const MODEL: SmallResNetShape = { stem: 8, identityBlock: true, width: 16, classes: CLASSES };

interface RunResult {
  losses: number[];
  state: Map<string, Float32Array | BigInt64Array>;
  evalLogits: Float32Array;
}

/** `steps` SGD steps of the small ResNet (the last one with frozen statistics when asked), then an evaluation forward. */
function trainRun(
  fusedOn: boolean,
  device: string,
  dtype: 'f32' | 'bf16',
  steps: number,
  frozenNorms = false,
): RunResult {
  return withFused(fusedOn ? 'bn-add-relu' : null, () => {
    const model: Module = smallResNet(31, MODEL).to(device);
    if (frozenNorms) {
      // Frozen affine parameters of every batch norm (their gradients go to scratch), as in fine-tuning.
      for (const [, m] of model.namedModules()) if (m instanceof BatchNorm2d) m.setRequiresGrad(false);
    }
    const normalize = new InputNormalize({ ...NORMALIZE, dtype });
    const loss = new CrossEntropyLoss();
    const optimizer = new SGD(model, { lr: 0.05, momentum: 0.9, weightDecay: 5e-4 });
    const images = lcgImages(BATCH, SIZE, 5, device);
    const labels = [0, 1, 2, 1];
    const losses: number[] = [];
    for (let s = 0; s < steps; s++) {
      // The last step fine-tunes with frozen statistics (evaluation-mode batch norms).
      if (s === steps - 1) model.eval();
      else model.train();
      losses.push(loss.forward(model.forward(normalize.forward(images)), labels).item());
      model.backward(loss.backward());
      optimizer.step();
      optimizer.zeroGrad();
    }
    model.eval();
    const evalLogits = model.forward(normalize.forward(images)).toFloat32Array();
    const state = new Map([...model.stateDict()].map(([k, v]) => [k, v.data]));
    images.dispose();
    model.dispose();
    return { losses, state, evalLogits };
  });
}

function expectSameRun(out: RunResult, ref: RunResult, tol: number): void {
  expectClose('losses', out.losses, ref.losses, tol);
  expectClose('evaluation logits', out.evalLogits, ref.evalLogits, tol);
  expect([...out.state.keys()]).toEqual([...ref.state.keys()]);
  for (const [key, value] of ref.state) {
    const got = out.state.get(key);
    if (value instanceof BigInt64Array) expect(got, key).toEqual(value);
    else if (got instanceof Float32Array) expectClose(key, got, value, tol);
    else throw new Error(`${key}: expected a Float32Array`);
  }
}

/** `body`'s result and the dual ops it ran (counted by spies on the addon, which run them as before). */
function countDualOps<T>(body: () => T): { result: T; calls: { forward: number; backward: number } } {
  const native = addon();
  const forward = vi.spyOn(native, 'dualBatchNormForward');
  const backward = vi.spyOn(native, 'dualBatchNormBackward');
  try {
    const result = body();
    return { result, calls: { forward: forward.mock.calls.length, backward: backward.mock.calls.length } };
  } finally {
    forward.mockRestore();
    backward.mockRestore();
  }
}

describe('a small ResNet with the bn-add-relu fused path on and off', () => {
  for (const dtype of ['f32', 'bf16'] as const) {
    it.skipIf(!onCuda)(`trains to the same losses, parameters and running statistics (${dtype})`, () => {
      const ref = trainRun(false, 'cuda:0', dtype, 3);
      // One downsample block: one dual forward per step and for the last evaluation, one backward per step.
      const out = countDualOps(() => trainRun(true, 'cuda:0', dtype, 3));
      expect(out.calls).toEqual({ forward: 4, backward: 3 });
      expectSameRun(out.result, ref, dtype === 'f32' ? 1e-4 : 2e-2);
    });
  }

  it.skipIf(!onCuda)('trains as the unfused path with frozen batch-norm parameters (f32)', () => {
    const ref = trainRun(false, 'cuda:0', 'f32', 2, true);
    const out = countDualOps(() => trainRun(true, 'cuda:0', 'f32', 2, true));
    expect(out.calls).toEqual({ forward: 3, backward: 2 });
    expectSameRun(out.result, ref, 1e-4);
  });

  it.skipIf(!onCuda)('keeps the two passes for synchronised batch norms in training, not in evaluation', () => {
    const run = () =>
      withFused('bn-add-relu', () => {
        const model = convertSyncBatchNorm(smallResNet(31, MODEL).to('cuda:0'), mirrorGroup(2, 'cuda:0'));
        const x = Tensor.from(lcgValues(BATCH * SIZE * SIZE * 3, 9), [BATCH, SIZE, SIZE, 3], { device: 'cuda:0' });
        const loss = new CrossEntropyLoss();
        const training = countDualOps(() => {
          model.train();
          const l = loss.forward(model.forward(x), [0, 1, 2, 1]).item();
          model.backward(loss.backward());
          return l;
        });
        // Evaluation uses the running statistics: nothing to synchronise, so the dual pass runs.
        const evaluation = countDualOps(() => {
          model.eval();
          return model.forward(x).toFloat32Array();
        });
        x.dispose();
        model.dispose();
        return { training, evaluation };
      });
    const { training, evaluation } = run();
    expect(training.calls).toEqual({ forward: 0, backward: 0 });
    expect(evaluation.calls).toEqual({ forward: 1, backward: 0 });
    expect(Number.isFinite(training.result)).toBe(true);
  });

  it.skipIf(onlyCuda)('changes nothing on the CPU', () => {
    const ref = trainRun(false, 'cpu', 'f32', 2);
    const out = trainRun(true, 'cpu', 'f32', 2);
    expectSameRun(out, ref, 0);
  });
});

/** Two SGD steps of a small-input ResNet-18, checkpointed or not, with the fused path on. */
function resnet18Run(checkpointed: boolean): RunResult {
  return withFused('bn-add-relu', () => {
    const device = 'cuda:0';
    const model = new ResNet(18, { numClasses: 3, smallInput: true, seed: 7, device });
    if (checkpointed) model.checkpointing({ segments: { every: 1 } });
    const loss = new CrossEntropyLoss();
    const optimizer = new SGD(model, { lr: 0.1, momentum: 0.9 });
    const x = Tensor.randn([2, 4, 4, 3], { seed: 11, device });
    const losses: number[] = [];
    for (let step = 0; step < 2; step++) {
      model.train();
      losses.push(loss.forward(model.forward(x), [0, 2]).item());
      model.backward(loss.backward());
      optimizer.step();
      optimizer.zeroGrad();
    }
    model.eval();
    const evalLogits = model.forward(x).toFloat32Array();
    const state = new Map([...model.stateDict()].map(([k, v]) => [k, v.data]));
    optimizer.dispose();
    loss.dispose();
    x.dispose();
    model.dispose();
    return { losses, state, evalLogits };
  });
}

describe('the bn-add-relu fused path under gradient checkpointing and CUDA graphs', () => {
  it.skipIf(!onCuda)('ResNet-18 checkpointed block by block trains bit for bit as without', () => {
    const plain = resnet18Run(false);
    // Three downsample blocks (layer2..layer4), each recomputed once in its segment's backward,
    // and one evaluation forward.
    const checkpointed = countDualOps(() => resnet18Run(true));
    expect(checkpointed.calls).toEqual({ forward: 3 * (2 * 2 + 1), backward: 3 * 2 });
    expectSameRun(checkpointed.result, plain, 0);
    expect(plain.state.get('layer2.0.downsample.1.num_batches_tracked')).toEqual(BigInt64Array.of(2n));
  });

  it.skipIf(!onCuda)('a step captured as a CUDA graph trains as the eager one', async () => {
    const run = async (cudaGraph: boolean) => {
      const model = smallResNet(41, MODEL).to('cuda:0');
      const optimizer = new SGD(model, { lr: 0.05, momentum: 0.9 });
      const loader = new DataLoader(new ShapesDataset({ length: 16, size: SIZE, classes: CLASSES, seed: 3 }), {
        batchSize: BATCH,
        workers: 0,
        shuffle: false,
      });
      const losses: number[] = [];
      const trainer = new Trainer({
        model,
        optimizer,
        device: 'cuda:0',
        ...QUIET_TRAINER,
        cudaGraph,
        callbacks: [
          {
            onStepEnd: (_t, info) => {
              losses.push(info.loss());
            },
          },
        ],
      });
      try {
        await trainer.fit(loader, { epochs: 1 });
        return { losses, params: model.arena().params.toFloat32Array(), stats: trainer.cudaGraphStats };
      } finally {
        await loader.close();
      }
    };
    const eager = await withFused('bn-add-relu', () => run(false));
    const native = addon();
    const forward = vi.spyOn(native, 'dualBatchNormForward');
    let calls = 0;
    const graph = await withFused('bn-add-relu', () => run(true)).finally(() => {
      calls = forward.mock.calls.length;
      forward.mockRestore();
    });
    // Eager warm-up steps and the captured one call the op; replays run the graph.
    expect(calls).toBeGreaterThan(0);
    expect(graph.stats?.captures).toBe(1);
    expect(graph.stats?.replays).toBeGreaterThan(0);
    expectClose('losses', graph.losses, eager.losses, 1e-6);
    expectClose('parameters', graph.params, eager.params, 1e-6);
  });
});
