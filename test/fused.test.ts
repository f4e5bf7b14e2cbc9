/**
 * The fused paths against the paths they replace. The `optim` fused ops (fusedSgdStep,
 * fusedAdamwStep, fusedLambStep: the GradScaler's check, the update unscaling as it reads, the
 * scale update, the gradient zeroing) against unscaleAndCheck + the unfused step + scalerUpdate +
 * zeroing on the same device: on the CPU that is the backend's composed default, on the emulated
 * CUDA device the fused kernels, with the arguments of a captured step (the scale and the step
 * count read on the device) there. Then a small ResNet trained a few steps in bf16 and fp16 with
 * SGD, AdamW and LAMB with the switch on and off, a step with an inf gradient included, and the
 * Trainer's captured CUDA-graph step with the switch on against the eager unfused run. The
 * switch's parsing and its refusals.
 */
import { describe, expect, it, vi } from 'vitest';
import {
  AdamW,
  BatchNorm2d,
  CosineAnnealingLR,
  DataLoader,
  LAMB,
  ReLU,
  ShapesDataset,
  Trainer,
  type TrainerOptions,
  CrossEntropyLoss,
  Flatten,
  GradScaler,
  InputNormalize,
  Linear,
  SGD,
  Sequential,
  Tensor,
  AdaptiveAvgPool2d,
  clipGradNorm,
  listBackends,
} from '../lib/index.js';
import { addon, type RawAdamGroup, type RawSgdGroup } from '../lib/binding.js';
import { FUSED_ENV, FUSED_PATH_NAMES, fusedPathOn, fusedPaths } from '../lib/fused-paths.js';
import { Conv2d } from '../lib/nn/layers.js';
import type { Module } from '../lib/nn/module.js';
import type { Optimizer } from '../lib/optim/optimizer.js';
import { NORMALIZE, QUIET_TRAINER, lcgImages, lcgValues, smallResNet, withFused } from './helpers/fused-runs.js';

// In the test project on the emulated CUDA device the cases run on CUDA; in 'main' on the CPU.
const onlyCuda = process.env.RESNET_TEST_BACKENDS === 'cuda';
const DEVICE = onlyCuda ? 'cuda:0' : 'cpu';
const cuda = listBackends().find((b) => b.name === 'cuda');

// Segments across the kOptimChunk (4096) boundary, of one and of no element, out of order, with gaps
// (elements 0-2, 4100-4102 and the tail belong to no segment and must be left alone).
const ARENA = 4500;
const SEGMENTS = Int32Array.from([4103, 396, 1, 3, 4096, 0, 4099, 1, 1, 4100, 0, 1]);
const GROUPS: RawSgdGroup[] = [
  { lr: 0.1, momentum: 0.9, dampening: 0, weightDecay: 1e-3, nesterov: true },
  { lr: 0.05, momentum: 0.8, dampening: 0.25, weightDecay: 0, nesterov: false },
];

interface OptimState {
  params: Tensor;
  grads: Tensor;
  momentum: Tensor;
  flags: Tensor; // [scale, foundInf]
  tracker: Tensor;
}

function optimState(seed: number, badAt: number | null, scale: number, tracker: number): OptimState {
  const grads = lcgValues(ARENA, seed + 1).map((v) => v * scale);
  if (badAt !== null) grads[badAt] = badAt % 2 === 0 ? Infinity : NaN;
  return {
    params: Tensor.from(lcgValues(ARENA, seed), [ARENA], { device: DEVICE }),
    grads: Tensor.from(grads, [ARENA], { device: DEVICE }),
    momentum: Tensor.from(lcgValues(ARENA, seed + 2), [ARENA], { device: DEVICE }),
    flags: Tensor.from([scale, 0], [2], { device: DEVICE }),
    tracker: Tensor.from([tracker], [1], { dtype: 'i32', device: DEVICE }),
  };
}

interface Case {
  check: boolean;
  firstStep: boolean;
  badAt: number | null;
  tracker: number;
}

const SCALER = { growthFactor: 2, backoffFactor: 0.5, growthInterval: 3 };

/** The unfused sequence: unscaleAndCheck (with check), sgdStep, scalerUpdate (with check), zeroing the segments. */
function unfused(s: OptimState, c: Case, scale: number): void {
  const foundInf = s.flags.view(1, [1]);
  if (c.check) {
    addon().unscaleAndCheck({ grads: s.grads.raw, invScale: 1 / scale, foundInf: foundInf.raw, segments: SEGMENTS });
  }
  addon().sgdStep({
    params: s.params.raw,
    grads: s.grads.raw,
    momentumBuffer: s.momentum.raw,
    groups: GROUPS,
    segments: SEGMENTS,
    firstStep: c.firstStep,
    ...(c.check ? { foundInf: foundInf.raw } : { gradScaleInv: 1 / scale }),
  });
  if (c.check) {
    addon().scalerUpdate({
      scale: s.flags.view(0, [1]).raw,
      growthTracker: s.tracker.raw,
      foundInf: foundInf.raw,
      ...SCALER,
    });
  }
  for (let i = 0; i < SEGMENTS.length; i += 3) {
    if (SEGMENTS[i + 1]! > 0) addon().fill({ tensor: s.grads.view(SEGMENTS[i]!, [SEGMENTS[i + 1]!]).raw, value: 0 });
  }
}

function fused(s: OptimState, c: Case, scale: number): void {
  addon().fusedSgdStep({
    params: s.params.raw,
    grads: s.grads.raw,
    momentumBuffer: s.momentum.raw,
    groups: GROUPS,
    segments: SEGMENTS,
    firstStep: c.firstStep,
    gradScaleInv: 1 / scale,
    zeroGrads: true,
    ...(c.check
      ? {
          checkFinite: true,
          foundInf: s.flags.view(1, [1]).raw,
          scale: s.flags.view(0, [1]).raw,
          growthTracker: s.tracker.raw,
          ...SCALER,
        }
      : {}),
  });
}

function read(s: OptimState) {
  return {
    params: s.params.toFloat32Array(),
    grads: s.grads.toFloat32Array(),
    momentum: s.momentum.toFloat32Array(),
    flags: s.flags.toFloat32Array(),
    tracker: s.tracker.item(),
  };
}

function dispose(s: OptimState): void {
  for (const t of [s.params, s.grads, s.momentum, s.flags, s.tracker]) t.dispose();
}

describe(`the optim fused op on ${DEVICE}`, () => {
  const cases: [string, Case][] = [
    ['with the check, clean gradients', { check: true, firstStep: false, badAt: null, tracker: 0 }],
    ['with the check, the scale grows', { check: true, firstStep: false, badAt: null, tracker: 2 }],
    ['with the check, an inf skips the step', { check: true, firstStep: false, badAt: 4200, tracker: 1 }],
    ['with the check, a NaN in a one-element segment', { check: true, firstStep: false, badAt: 4099, tracker: 1 }],
    ['with the check, the first step', { check: true, firstStep: true, badAt: null, tracker: 0 }],
    ['without the check (bf16: no scaler)', { check: false, firstStep: false, badAt: null, tracker: 0 }],
  ];
  for (const [name, c] of cases) {
    it(`equals the unfused ops bit for bit: ${name}`, () => {
      const scale = c.check ? 1024 : 1;
      const a = optimState(11, c.badAt, scale, c.tracker);
      const b = optimState(11, c.badAt, scale, c.tracker);
      const before = read(a);
      unfused(a, c, scale);
      fused(b, c, scale);
      const want = read(a);
      const got = read(b);
      expect(got.params).toEqual(want.params);
      expect(got.momentum).toEqual(want.momentum);
      expect(got.grads).toEqual(want.grads);
      expect(got.flags).toEqual(want.flags);
      expect(got.tracker).toEqual(want.tracker);
      // Not a comparison of two no-ops: the gradients in the segments are zero, the ones outside
      // untouched, and the parameters moved unless the step was skipped.
      for (const i of [0, 1, 2, 4100, 4101, 4102, 4499]) expect(got.grads[i]).toBe(before.grads[i]);
      for (const i of [3, 4096, 4099, 4103, 4498]) expect(got.grads[i]).toBe(0);
      const moved = got.params.some((v, i) => v !== before.params[i]);
      expect(moved).toBe(c.badAt === null);
      if (c.check) expect(got.flags[1]).toBe(c.badAt === null ? 0 : 1);
      dispose(a);
      dispose(b);
    });
  }

  it('refuses a check or scale update without the flag, naming it', () => {
    const s = optimState(3, null, 1, 0);
    const base = {
      params: s.params.raw,
      grads: s.grads.raw,
      momentumBuffer: s.momentum.raw,
      groups: GROUPS,
      segments: SEGMENTS,
    };
    expect(() => addon().fusedSgdStep({ ...base, checkFinite: true })).toThrow(
      /fused sgd step: checkFinite needs foundInf/,
    );
    expect(() =>
      addon().fusedSgdStep({ ...base, foundInf: s.flags.view(1, [1]).raw, scale: s.flags.view(0, [1]).raw }),
    ).toThrow(/scale and growthTracker come together/);
    expect(() =>
      addon().fusedSgdStep({ ...base, scale: s.flags.view(0, [1]).raw, growthTracker: s.tracker.raw }),
    ).toThrow(/needs foundInf/);
    dispose(s);
  });
});

// ---- AdamW and LAMB ------------------------------------------------------------------------------

// Group 0 decays (LAMB adapts it); group 1 does not decay but adapts (alwaysAdapt).
const ADAM_GROUPS: RawAdamGroup[] = [
  { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0.01, alwaysAdapt: false },
  { lr: 0.02, beta1: 0.8, beta2: 0.99, eps: 1e-6, weightDecay: 0, alwaysAdapt: true },
];

interface AdamState {
  params: Tensor;
  grads: Tensor;
  expAvg: Tensor;
  expAvgSq: Tensor;
  flags: Tensor; // [scale, foundInf]
  tracker: Tensor;
  stepCount: Tensor;
}

interface AdamCase {
  kind: 'adamw' | 'lamb';
  check: boolean;
  /** The arguments of a captured step: the scale and the step count read on the device. */
  onDevice: boolean;
  badAt: number | null;
  tracker: number;
}

const STEPS_DONE = 4;

function adamState(seed: number, c: AdamCase, scale: number): AdamState {
  const grads = lcgValues(ARENA, seed + 1).map((v) => v * scale);
  if (c.badAt !== null) grads[c.badAt] = c.badAt % 2 === 0 ? Infinity : NaN;
  return {
    params: Tensor.from(lcgValues(ARENA, seed), [ARENA], { device: DEVICE }),
    grads: Tensor.from(grads, [ARENA], { device: DEVICE }),
    expAvg: Tensor.from(
      lcgValues(ARENA, seed + 2).map((v) => v * 0.1),
      [ARENA],
      { device: DEVICE },
    ),
    expAvgSq: Tensor.from(
      lcgValues(ARENA, seed + 3).map((v) => v * v * 0.01),
      [ARENA],
      { device: DEVICE },
    ),
    flags: Tensor.from([scale, 0], [2], { device: DEVICE }),
    tracker: Tensor.from([c.tracker], [1], { dtype: 'i32', device: DEVICE }),
    stepCount: Tensor.from([STEPS_DONE], [1], { dtype: 'i32', device: DEVICE }),
  };
}

function adamBase(s: AdamState) {
  return {
    params: s.params.raw,
    grads: s.grads.raw,
    expAvg: s.expAvg.raw,
    expAvgSq: s.expAvgSq.raw,
    groups: ADAM_GROUPS,
    segments: SEGMENTS,
    step: STEPS_DONE + 1,
  };
}

/** The unfused sequence: unscaleAndCheck (with check), the step, scalerUpdate (with check), zeroing the segments. */
function unfusedAdam(s: AdamState, c: AdamCase, scale: number): void {
  const foundInf = s.flags.view(1, [1]);
  const scaleView = s.flags.view(0, [1]);
  if (c.check) {
    addon().unscaleAndCheck({
      grads: s.grads.raw,
      invScale: 1 / scale,
      foundInf: foundInf.raw,
      segments: SEGMENTS,
      ...(c.onDevice ? { scale: scaleView.raw } : {}),
    });
  }
  const args = {
    ...adamBase(s),
    ...(c.check ? { foundInf: foundInf.raw } : { gradScaleInv: 1 / scale }),
    ...(c.onDevice ? { stepCount: s.stepCount.raw } : {}),
  };
  if (c.kind === 'lamb') addon().lambStep(args);
  else addon().adamwStep(args);
  if (c.check) {
    addon().scalerUpdate({ scale: scaleView.raw, growthTracker: s.tracker.raw, foundInf: foundInf.raw, ...SCALER });
  }
  for (let i = 0; i < SEGMENTS.length; i += 3) {
    if (SEGMENTS[i + 1]! > 0) addon().fill({ tensor: s.grads.view(SEGMENTS[i]!, [SEGMENTS[i + 1]!]).raw, value: 0 });
  }
}

function fusedAdam(s: AdamState, c: AdamCase, scale: number): void {
  const args = {
    ...adamBase(s),
    // A factor read on the device makes the host's one irrelevant: a wrong one shows it is not used.
    gradScaleInv: c.onDevice ? 0.5 : 1 / scale,
    zeroGrads: true,
    ...(c.onDevice ? { stepCount: s.stepCount.raw, scaleFromDevice: true } : {}),
    ...(c.check
      ? {
          checkFinite: true,
          foundInf: s.flags.view(1, [1]).raw,
          scale: s.flags.view(0, [1]).raw,
          growthTracker: s.tracker.raw,
          ...SCALER,
        }
      : {}),
  };
  if (c.kind === 'lamb') addon().fusedLambStep(args);
  else addon().fusedAdamwStep(args);
}

function readAdam(s: AdamState) {
  return {
    params: s.params.toFloat32Array(),
    grads: s.grads.toFloat32Array(),
    expAvg: s.expAvg.toFloat32Array(),
    expAvgSq: s.expAvgSq.toFloat32Array(),
    flags: s.flags.toFloat32Array(),
    tracker: s.tracker.item(),
    stepCount: s.stepCount.item(),
  };
}

function disposeAdam(s: AdamState): void {
  for (const t of [s.params, s.grads, s.expAvg, s.expAvgSq, s.flags, s.tracker, s.stepCount]) t.dispose();
}

describe(`the optim fused op of AdamW and LAMB on ${DEVICE}`, () => {
  const cases: [string, Omit<AdamCase, 'kind'>][] = [
    ['with the check, clean gradients', { check: true, onDevice: false, badAt: null, tracker: 0 }],
    ['with the check, the scale grows', { check: true, onDevice: false, badAt: null, tracker: 2 }],
    [
      'with the check, an inf skips the step and halves the scale',
      { check: true, onDevice: false, badAt: 4200, tracker: 1 },
    ],
    ['without the check (bf16: no scaler)', { check: false, onDevice: false, badAt: null, tracker: 0 }],
    ['a captured step: scale and step count on the device', { check: true, onDevice: true, badAt: null, tracker: 0 }],
    ['a captured step with a NaN: the step count stays', { check: true, onDevice: true, badAt: 4099, tracker: 1 }],
  ];
  for (const kind of ['adamw', 'lamb'] as const) {
    for (const [name, partial] of cases) {
      const c: AdamCase = { kind, ...partial };
      // The CPU backend refuses the values read on the device (they exist for CUDA graphs).
      it.skipIf(c.onDevice && !onlyCuda)(`${kind}: equals the unfused ops bit for bit: ${name}`, () => {
        const scale = c.check ? 1024 : 1;
        const a = adamState(17, c, scale);
        const b = adamState(17, c, scale);
        const before = readAdam(a);
        unfusedAdam(a, c, scale);
        fusedAdam(b, c, scale);
        const want = readAdam(a);
        const got = readAdam(b);
        expect(got.params).toEqual(want.params);
        expect(got.expAvg).toEqual(want.expAvg);
        expect(got.expAvgSq).toEqual(want.expAvgSq);
        expect(got.grads).toEqual(want.grads);
        expect(got.flags).toEqual(want.flags);
        expect(got.tracker).toBe(want.tracker);
        expect(got.stepCount).toBe(want.stepCount);
        // Not a comparison of two no-ops.
        for (const i of [0, 1, 2, 4100, 4101, 4102, 4499]) expect(got.grads[i]).toBe(before.grads[i]);
        for (const i of [3, 4096, 4099, 4103, 4498]) expect(got.grads[i]).toBe(0);
        const clean = c.badAt === null;
        expect(got.params.some((v, i) => v !== before.params[i])).toBe(clean);
        expect(got.expAvg.some((v, i) => v !== before.expAvg[i])).toBe(clean);
        if (c.check) {
          expect(got.flags[1]).toBe(clean ? 0 : 1);
          expect(got.flags[0]).toBe(!clean ? scale / 2 : c.tracker === 2 ? scale * 2 : scale);
        }
        expect(got.stepCount).toBe(c.onDevice && clean ? STEPS_DONE + 1 : STEPS_DONE);
        disposeAdam(a);
        disposeAdam(b);
      });
    }
  }

  it('refuses the scale read on the device without the check, naming it', () => {
    const c: AdamCase = { kind: 'adamw', check: true, onDevice: false, badAt: null, tracker: 0 };
    const s = adamState(3, c, 1);
    const flags = { foundInf: s.flags.view(1, [1]).raw, scale: s.flags.view(0, [1]).raw, growthTracker: s.tracker.raw };
    expect(() => addon().fusedAdamwStep({ ...adamBase(s), ...flags, scaleFromDevice: true })).toThrow(
      /fused adamw step: scaleFromDevice needs scale and checkFinite/,
    );
    expect(() => addon().fusedLambStep({ ...adamBase(s), checkFinite: true })).toThrow(
      /fused lamb step: checkFinite needs foundInf/,
    );
    disposeAdam(s);
  });
});

describe('Optimizer.step({ fused })', () => {
  it('is refused by optimizers without a fused step, and without the flag it needs', () => {
    const model = new Linear({ inFeatures: 4, outFeatures: 3, seed: 1 }).to(DEVICE);
    const adamw = new AdamW(model, { lr: 0.01 });
    expect(adamw.supportsFusedStep).toBe(true);
    expect(new LAMB(model, { lr: 0.01 }).supportsFusedStep).toBe(true);
    expect(() => adamw.step({ fused: { checkFinite: true, zeroGrads: true } })).toThrow(/foundInf/);
    expect(adamw.stepCount).toBe(0);
    const sgd = new SGD(model, { lr: 0.1 });
    expect(sgd.supportsFusedStep).toBe(true);
    expect(sgd.stepsWholeArena()).toBe(true);
    expect(() => sgd.step({ fused: { checkFinite: true, zeroGrads: true } })).toThrow(/foundInf/);
    const flag = Tensor.from([0], [1], { device: DEVICE });
    const scale = Tensor.from([1], [1], { device: DEVICE });
    expect(() =>
      sgd.step({
        foundInf: flag,
        fused: {
          checkFinite: true,
          zeroGrads: true,
          scaleUpdate: { scale, growthTracker: scale, growthFactor: 2, backoffFactor: 0.5, growthInterval: 1 },
        },
      }),
    ).toThrow(/fused\.scaleUpdate\.growthTracker/);
    // The scale read on the device needs the check and the scale update.
    expect(() =>
      sgd.step({ foundInf: flag, fused: { checkFinite: true, zeroGrads: true, scaleFromDevice: true } }),
    ).toThrow(/fused\.scaleFromDevice/);
    expect(sgd.stepCount).toBe(0);
    // Frozen parameters: the stepped gradients are not the whole arena.
    model.parameters()[1]!.requiresGrad = false;
    expect(new SGD(model, { lr: 0.1 }).stepsWholeArena()).toBe(false);
    flag.dispose();
    scale.dispose();
    model.dispose();
  });
});

describe('the fused-path switch', () => {
  it('reads names, all and nothing from RESNET_CUDA_FUSED, and refuses unknown names', () => {
    expect([...fusedPaths({})]).toEqual([]);
    expect([...fusedPaths({ [FUSED_ENV]: ' ' })]).toEqual([]);
    expect([...fusedPaths({ [FUSED_ENV]: 'optim' })]).toEqual(['optim']);
    expect([...fusedPaths({ [FUSED_ENV]: 'all,' })]).toEqual([...FUSED_PATH_NAMES]);
    expect(() => fusedPaths({ [FUSED_ENV]: 'optim,bn-add-rleu' })).toThrow(
      new RegExp(`RESNET_CUDA_FUSED: unknown fused path 'bn-add-rleu'; known: ${FUSED_PATH_NAMES.join(', ')}, all`),
    );
    expect(fusedPathOn('optim', 'cuda:0', { [FUSED_ENV]: 'optim' })).toBe(true);
    expect(fusedPathOn('optim', 'cpu', { [FUSED_ENV]: 'optim' })).toBe(false);
    expect(fusedPathOn('optim', 'cuda:0', {})).toBe(false);
  });
});

// ---- a small ResNet, trained with the switch on and off ------------------------------------------

const SIZE = 8;
const BATCH = 4;
const CLASSES = 3;

/** Parameters after each of `steps` steps (step 1 with an inf gradient under a scaler), and the scales. */
type MakeOptimizer = (model: Module) => Optimizer<{ lr: number }>;

const sgdOf: MakeOptimizer = (m) => new SGD(m, { lr: 0.05, momentum: 0.9, nesterov: true, weightDecay: 5e-4 });

function trainRun(fusedOn: boolean, dtype: 'bf16' | 'f16', steps: number, clip = false, make = sgdOf) {
  return withFused(fusedOn ? 'optim' : null, () => {
    const model: Module = smallResNet(21, { stem: 4, identityBlock: false, width: 8, classes: CLASSES }).to('cuda:0');
    model.train();
    const normalize = new InputNormalize({ ...NORMALIZE, dtype });
    const loss = new CrossEntropyLoss();
    const optimizer = make(model);
    const scaler = new GradScaler({ enabled: dtype === 'f16', initScale: 256, growthInterval: 2 });
    const images = lcgImages(BATCH, SIZE, 5, 'cuda:0');
    const labels = [0, 1, 2, 1];
    const out: { params: Float32Array[]; scale: number; skipped: boolean; grads: number }[] = [];
    for (let s = 0; s < steps; s++) {
      scaler.scale(loss);
      loss.forward(model.forward(normalize.forward(images)), labels);
      model.backward(loss.backward());
      if (s === 1 && scaler.enabled) {
        const p = model.parameters()[0]!;
        const g = p.grad.toFloat32Array();
        g[2] = Infinity;
        p.grad.raw.copyFromHost(g);
      }
      if (clip) {
        // Unscaled (and checked) before the step, as the Trainer does when it clips.
        scaler.unscale(optimizer);
        clipGradNorm(model, 0.5);
      }
      scaler.stepAndZeroGrad(optimizer);
      const gradAbs = model
        .parameters()
        .reduce((n, p) => n + p.grad.toFloat32Array().reduce((a, v) => a + Math.abs(v), 0), 0);
      out.push({
        params: model.parameters().map((p) => p.values()),
        scale: scaler.lossScale,
        skipped: scaler.skippedLastStep,
        grads: gradAbs,
      });
    }
    images.dispose();
    model.dispose();
    return out;
  });
}

describe('a small ResNet trained with the optim fused path on and off', () => {
  const optimizers: [string, MakeOptimizer, 'fusedSgdStep' | 'fusedAdamwStep' | 'fusedLambStep'][] = [
    ['SGD', sgdOf, 'fusedSgdStep'],
    ['AdamW', (m) => new AdamW(m, { lr: 0.01, weightDecay: 0.05 }), 'fusedAdamwStep'],
    ['LAMB', (m) => new LAMB(m, { lr: 0.02, weightDecay: 0.01 }), 'fusedLambStep'],
  ];
  for (const [optimizerName, make, op] of optimizers) {
    for (const [dtype, clip] of [
      ['bf16', false],
      ['f16', false],
      ['f16', true],
    ] as const) {
      // SGD runs every variant; AdamW and LAMB the fp16 run with its inf step, and bf16.
      if (optimizerName !== 'SGD' && clip) continue;
      it.skipIf(!onlyCuda || !cuda?.available)(
        `${optimizerName}: ends every step with the same parameters, scale and zero gradients (${dtype}${clip ? ', clipped' : ''})`,
        () => {
          const steps = 3;
          const spy = vi.spyOn(addon(), op);
          const off = trainRun(false, dtype, steps, clip, make);
          expect(spy).not.toHaveBeenCalled();
          const on = trainRun(true, dtype, steps, clip, make);
          // The switch took the fused op, once per step.
          expect(spy).toHaveBeenCalledTimes(steps);
          spy.mockRestore();
          for (let s = 0; s < steps; s++) {
            expect(on[s]!.scale).toBe(off[s]!.scale);
            expect(on[s]!.skipped).toBe(off[s]!.skipped);
            expect(on[s]!.grads).toBe(0);
            on[s]!.params.forEach((p, i) => expect(p).toEqual(off[s]!.params[i]));
          }
          if (dtype === 'f16') {
            // 256 after a clean step, 128 after the inf step, 128 after one clean step of the two it takes to grow.
            expect(off.map((r) => r.skipped)).toEqual([false, true, false]);
            expect(off.map((r) => r.scale)).toEqual([256, 128, 128]);
          }
          // The parameters moved on the clean steps.
          expect(on[2]!.params[0]).not.toEqual(on[0]!.params[0]);
        },
      );
    }
  }
});

// ---- the Trainer's captured step with the fused path ---------------------------------------------

/** Trains a tiny net with the Trainer; returns the parameters, the step counts and the scale. */
/** Trainer options; `schedule: 'cosine'` stands for a fresh cosine schedule per run (schedules keep state). */
type RunOptions = Omit<Partial<TrainerOptions>, 'schedule'> & { schedule?: 'cosine' };

async function trainerRun(fusedOn: boolean, make: MakeOptimizer, runOptions: RunOptions) {
  const { schedule, ...options } = runOptions;
  return withFused(fusedOn ? 'optim' : null, async () => {
    const model = new Sequential(
      new Conv2d({ inChannels: 3, outChannels: 4, kernelSize: 3, padding: 1, seed: 1 }),
      new BatchNorm2d({ numFeatures: 4 }),
      new ReLU(),
      new AdaptiveAvgPool2d(),
      new Flatten(),
      new Linear({ inFeatures: 4, outFeatures: 4, seed: 3 }),
    ).to('cuda');
    const optimizer = make(model);
    const loader = new DataLoader(new ShapesDataset({ length: 20, size: 8, classes: 4, seed: 3 }), {
      batchSize: 4,
      workers: 0,
      shuffle: true,
      seed: 5,
    });
    const trainer = new Trainer({
      model,
      optimizer,
      device: 'cuda',
      ...QUIET_TRAINER,
      ...options,
      ...(schedule ? { schedule: new CosineAnnealingLR({ tMax: 8, minLr: 0.001 }) } : {}),
    });
    try {
      const result = await trainer.fit(loader, { epochs: 1 });
      return {
        params: model.arena().params.toFloat32Array(),
        grads: model.arena().grads.toFloat32Array(),
        optimizerSteps: optimizer.stepCount,
        steps: result.steps,
        scale: trainer.scaler.scaleValue(),
        graph: trainer.cudaGraphStats,
      };
    } finally {
      await loader.close();
      await trainer.dispose();
    }
  });
}

describe("the Trainer's CUDA-graph step with the optim fused path", () => {
  // fp16 with a scale that overflows every other step (skips inside the replays), with and
  // without clipping (the unscale before the fused op, or inside it by the device's scale).
  const overflowing: RunOptions = {
    amp: 'fp16',
    gradScaler: { initScale: 1024, growthFactor: 4096, backoffFactor: 1 / 4096, growthInterval: 2 },
  };
  const cases: [string, MakeOptimizer, 'fusedSgdStep' | 'fusedAdamwStep' | 'fusedLambStep', RunOptions][] = [
    [
      'AdamW, fp16, overflows, a learning rate that changes every step',
      (m) => new AdamW(m, { lr: 0.01 }),
      'fusedAdamwStep',
      { ...overflowing, schedule: 'cosine' },
    ],
    [
      'LAMB, fp16, overflows, clipped',
      (m) => new LAMB(m, { lr: 0.01 }),
      'fusedLambStep',
      { ...overflowing, clipGradNorm: 1 },
    ],
    ['LAMB, bf16 (no scaler)', (m) => new LAMB(m, { lr: 0.01 }), 'fusedLambStep', { amp: 'bf16' }],
    [
      'SGD, fp16, overflows, a learning rate that changes every step',
      (m) => new SGD(m, { lr: 0.05, momentum: 0.9 }),
      'fusedSgdStep',
      { ...overflowing, schedule: 'cosine' },
    ],
  ];
  for (const [name, make, op, options] of cases) {
    it.skipIf(!onlyCuda || !cuda?.available)(
      `${name}: captured and replayed, the eager unfused run's result`,
      async () => {
        const eager = await trainerRun(false, make, options);
        const spy = vi.spyOn(addon(), op);
        const graph = await trainerRun(true, make, { ...options, cudaGraph: { warmup: 1 } });
        // One eager warm-up step and the capture call the fused op; the replays run it on the device.
        expect(spy).toHaveBeenCalledTimes(2);
        spy.mockRestore();
        expect(graph.graph).toEqual({ captures: 1, replays: 4, eagerSteps: 1, reasons: [] });
        expect(graph.steps).toBe(eager.steps);
        expect(graph.optimizerSteps).toBe(eager.optimizerSteps);
        expect(graph.scale).toBe(eager.scale);
        expect(graph.grads.every((v) => v === 0)).toBe(true);
        expect(graph.params).toEqual(eager.params);
        if (options.amp === 'fp16') expect(eager.optimizerSteps).toBeLessThan(eager.steps);
      },
    );
  }
});
