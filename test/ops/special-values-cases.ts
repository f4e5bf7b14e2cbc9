/**
 * NaN and ±inf through every op with PyTorch's semantics: a NaN input gives NaN where PyTorch
 * gives NaN (torch.relu(nan) is nan, a max-pooling window holding a NaN gives NaN and routes its
 * gradient to the NaN, batch statistics of a channel holding a NaN are NaN, a logit of +inf makes
 * its row's loss NaN), and never a number that hides it.
 * @packageDocumentation
 */
import type { DTypeName } from '../../lib/binding.js';
import {
  avgPool2dBackward,
  avgPool2dForward,
  batchNormBackward,
  batchNormInferenceForward,
  batchNormTrainingForward,
  adamwStep,
  crossEntropy,
  distinctValues,
  linearForward,
  maxPool2dBackward,
  maxPool2dForward,
  relu,
  reluBackward,
  resolvePool2d,
  sgdStep,
  withSpecials,
  type Pool2dGeometry,
} from '../reference/index.js';
import { fmtShape, session, tolerance, type OpCase } from './harness.js';

const BOTH: DTypeName[] = ['f32', 'bf16'];

function count(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

const SHAPE = [2, 5, 5, 8];

const reluCases: OpCase[] = [
  {
    name: `relu.forward NaN/inf x${fmtShape(SHAPE)}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'relu.forward NaN/inf', `x${fmtShape(SHAPE)}`, (s) => {
        const x = withSpecials(s.rng, s.q(s.rng.normals(count(SHAPE))), 30);
        const y = s.poisoned(SHAPE);
        s.native.relu({ x: s.tensor(SHAPE, ctx.dtype, x), y });
        s.checkSpecials('y', s.read(y), relu(x), tolerance(ctx.dtype));
      }),
  },
  {
    name: `relu.backward NaN/inf x${fmtShape(SHAPE)}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'relu.backward NaN/inf', `x${fmtShape(SHAPE)}`, (s) => {
        const y = relu(withSpecials(s.rng, s.q(s.rng.normals(count(SHAPE))), 30));
        const dy = withSpecials(s.rng, s.q(s.rng.normals(count(SHAPE))), 30);
        const dx = s.poisoned(SHAPE);
        s.native.reluBackward({ y: s.tensor(SHAPE, ctx.dtype, y), dy: s.tensor(SHAPE, ctx.dtype, dy), dx });
        s.checkSpecials('dx', s.read(dx), reluBackward(y, dy), tolerance(ctx.dtype));
      }),
  },
];

const POOL: Pool2dGeometry = {
  n: 2,
  h: 9,
  w: 9,
  c: 4,
  kernelH: 3,
  kernelW: 3,
  strideH: 2,
  strideW: 2,
  padH: 1,
  padW: 1,
};

function poolCase(kind: 'max' | 'avg', pass: 'forward' | 'backward'): OpCase {
  const g = resolvePool2d(POOL);
  const text = `x${fmtShape([g.n, g.h, g.w, g.c])} k3x3 s2x2 p1x1`;
  const op = `${kind}pool2d.${pass} NaN/inf`;
  return {
    name: `${op} ${text}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, op, text, (s) => {
        const plan = s.own(new s.native.Pool2dPlan({ device: ctx.device, dtype: ctx.dtype, kind, ...POOL }));
        const bytes = plan.workspaceBytes();
        const workspace = bytes > 0 ? s.tensor([bytes], 'u8') : undefined;
        const xCount = g.n * g.h * g.w * g.c;
        const x = withSpecials(s.rng, kind === 'max' ? distinctValues(s.rng, xCount) : s.q(s.rng.normals(xCount)), 40);
        // The window of output (0, 1, 1) in channel 0 holds a NaN and an inf; (0, 1, 2) two NaNs
        // (the last one takes the gradient) and (0, 2, 2) only -inf (its first element takes it).
        const at = (h: number, w: number): number => (h * g.w + w) * g.c;
        x[at(1, 1)] = NaN;
        x[at(2, 2)] = Infinity;
        x[at(1, 4)] = NaN;
        x[at(3, 5)] = NaN;
        for (const h of [3, 4, 5]) for (const w of [3, 4, 5]) x[at(h, w) + 1] = -Infinity;
        const y = s.poisoned([g.n, g.outH, g.outW, g.c]);
        const xT = s.tensor([g.n, g.h, g.w, g.c], ctx.dtype, x);
        plan.forward({ x: xT, y, ...(workspace ? { workspace } : {}) });
        if (pass === 'forward') {
          s.checkSpecials(
            'y',
            s.read(y),
            kind === 'max' ? maxPool2dForward(g, x).y : avgPool2dForward(g, x),
            tolerance(ctx.dtype),
          );
          return;
        }
        const dy = withSpecials(s.rng, s.q(s.rng.normals(g.n * g.outH * g.outW * g.c)), 6);
        const dx = s.poisoned([g.n, g.h, g.w, g.c]);
        plan.backward({
          dy: s.tensor([g.n, g.outH, g.outW, g.c], ctx.dtype, dy),
          dx,
          ...(workspace ? { workspace } : {}),
        });
        s.checkSpecials(
          'dx',
          s.read(dx),
          kind === 'max' ? maxPool2dBackward(g, x, dy) : avgPool2dBackward(g, dy),
          tolerance(ctx.dtype),
        );
      }),
  };
}

const BN_SHAPE: [number, number, number, number] = [2, 4, 4, 6];
const MOMENTUM = Math.fround(0.1);
const EPS = Math.fround(1e-5);

// x with a NaN in channel 0, +inf in channel 1 and -inf in channel 2; channels 3.. stay finite.
function bnInput(
  rng: { normals(n: number, mean?: number, std?: number): Float64Array },
  q: (v: ArrayLike<number>) => Float64Array,
) {
  const c = BN_SHAPE[3];
  const x = q(rng.normals(count(BN_SHAPE), 1, 2));
  x[5 * c + 0] = NaN;
  x[7 * c + 1] = Infinity;
  x[2 * c + 2] = -Infinity;
  return x;
}

function bnCase(mode: 'training' | 'inference', fused: boolean): OpCase {
  const text = `x${fmtShape(BN_SHAPE)}${fused ? ' +residual relu' : ''}`;
  const op = `batchnorm.forward.${mode} NaN/inf`;
  return {
    name: `${op} ${text}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, op, text, (s) => {
        const c = BN_SHAPE[3];
        const n = count(BN_SHAPE);
        const x = bnInput(s.rng, (v) => s.q(v));
        const gamma = s.q(s.rng.uniforms(c, 0.5, 1.5), 'f32');
        const beta = s.q(s.rng.normals(c, 0, 0.5), 'f32');
        const residual = fused ? withSpecials(s.rng, s.q(s.rng.normals(n)), 6) : undefined;
        const runningMean = s.q(s.rng.normals(c), 'f32');
        const runningVar = s.q(s.rng.uniforms(c, 0.5, 2), 'f32');
        const rm = s.tensor([c], 'f32', runningMean);
        const rv = s.tensor([c], 'f32', runningVar);
        const saveMean = s.poisoned([c], 'f32');
        const saveInvStd = s.poisoned([c], 'f32');
        const y = s.poisoned(BN_SHAPE);
        const training = mode === 'training';
        s.native.batchNormForward({
          x: s.tensor(BN_SHAPE, ctx.dtype, x),
          gamma: s.tensor([c], 'f32', gamma),
          beta: s.tensor([c], 'f32', beta),
          ...(residual ? { residual: s.tensor(BN_SHAPE, ctx.dtype, residual) } : {}),
          y,
          runningMean: rm,
          runningVar: rv,
          ...(training ? { saveMean, saveInvStd } : {}),
          training,
          relu: fused,
          momentum: MOMENTUM,
          eps: EPS,
        });
        const o = {
          channels: c,
          gamma,
          beta,
          runningMean,
          runningVar,
          residual,
          relu: fused,
          momentum: MOMENTUM,
          eps: EPS,
        };
        if (training) {
          const ref = batchNormTrainingForward(x, o);
          s.checkSpecials('y', s.read(y), ref.y, tolerance(ctx.dtype));
          // The mean of a channel holding an infinity is that infinity when summed directly (PyTorch
          // on CPU) and NaN through shifted or running sums (PyTorch's Welford on CUDA, our pivot):
          // either way it is not finite, which is what must hold.
          const mean = s
            .read(rm)
            .map((v, k) => (!Number.isFinite(v) && !Number.isFinite(ref.runningMean[k]!) ? ref.runningMean[k]! : v));
          s.checkSpecials('runningMean', mean, ref.runningMean, tolerance('f32'));
          s.checkSpecials('runningVar', s.read(rv), ref.runningVar, tolerance('f32'));
        } else {
          s.checkSpecials('y', s.read(y), batchNormInferenceForward(x, o), tolerance(ctx.dtype));
        }
      }),
  };
}

function bnBackwardCase(fused: boolean): OpCase {
  const text = `x${fmtShape(BN_SHAPE)}${fused ? ' dResidual relu' : ''}`;
  const op = 'batchnorm.backward NaN/inf';
  return {
    name: `${op} ${text}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, op, text, (s) => {
        const c = BN_SHAPE[3];
        const n = count(BN_SHAPE);
        // Finite x and statistics; the specials come in through dy, as from a NaN loss.
        const x = s.q(s.rng.normals(n, 1, 2));
        const gamma = s.q(s.rng.uniforms(c, 0.5, 1.5), 'f32');
        const beta = s.q(s.rng.normals(c, 0, 0.5), 'f32');
        const fwd = batchNormTrainingForward(x, {
          channels: c,
          gamma,
          beta,
          runningMean: new Float64Array(c),
          runningVar: new Float64Array(c).fill(1),
          relu: fused,
        });
        const saveMean = s.q(fwd.saveMean, 'f32');
        const saveInvStd = s.q(fwd.saveInvStd, 'f32');
        const y = s.q(fwd.y);
        const dy = new Float64Array(s.q(s.rng.normals(n)));
        dy[3 * c + 0] = NaN;
        dy[4 * c + 1] = Infinity;
        const ref = batchNormBackward(x, dy, { channels: c, gamma, saveMean, saveInvStd, y, relu: fused });
        const dGamma = s.tensor([c], 'f32', new Float64Array(c));
        const dBeta = s.tensor([c], 'f32', new Float64Array(c));
        const dx = s.poisoned(BN_SHAPE);
        const dResidual = fused ? s.poisoned(BN_SHAPE) : undefined;
        s.native.batchNormBackward({
          x: s.tensor(BN_SHAPE, ctx.dtype, x),
          ...(fused ? { y: s.tensor(BN_SHAPE, ctx.dtype, y) } : {}),
          dy: s.tensor(BN_SHAPE, ctx.dtype, dy),
          gamma: s.tensor([c], 'f32', gamma),
          saveMean: s.tensor([c], 'f32', saveMean),
          saveInvStd: s.tensor([c], 'f32', saveInvStd),
          dx,
          dGamma,
          dBeta,
          ...(dResidual ? { dResidual } : {}),
          relu: fused,
        });
        s.checkSpecials('dx', s.read(dx), ref.dx, tolerance(ctx.dtype));
        s.checkSpecials('dGamma', s.read(dGamma), ref.dGamma, tolerance('f32'));
        s.checkSpecials('dBeta', s.read(dBeta), ref.dBeta, tolerance('f32'));
        if (dResidual) s.checkSpecials('dResidual', s.read(dResidual), ref.dResidual, tolerance(ctx.dtype));
      }),
  };
}

function crossEntropyCase(labelSmoothing: number): OpCase {
  const n = 6;
  const k = 10;
  const text = `logits${fmtShape([n, k])} smoothing=${labelSmoothing}`;
  const op = 'crossEntropy NaN/inf';
  return {
    name: `${op} ${text}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, op, text, (s) => {
        const labels = Array.from({ length: n }, () => s.rng.int(0, k));
        const logits = new Float64Array(s.q(s.rng.normals(n * k, 0, 3)));
        // Row 0 a NaN, row 1 a +inf (its loss is NaN as in PyTorch: inf - inf), row 2 -inf away
        // from its label (finite without smoothing), row 3 -inf at its label (an infinite loss).
        logits[0 * k + ((labels[0]! + 1) % k)] = NaN;
        logits[1 * k + ((labels[1]! + 2) % k)] = Infinity;
        logits[2 * k + ((labels[2]! + 3) % k)] = -Infinity;
        logits[3 * k + labels[3]!] = -Infinity;
        const gradScale = 1;
        const loss = s.poisoned([1], 'f32');
        const dLogits = s.poisoned([n, k]);
        s.native.crossEntropy({
          logits: s.tensor([n, k], ctx.dtype, logits),
          labels: s.tensor([n], 'i32', labels),
          loss,
          dLogits,
          labelSmoothing,
          gradScale,
        });
        const ref = crossEntropy(logits, labels, { n, k, labelSmoothing: Math.fround(labelSmoothing), gradScale });
        s.checkSpecials('loss', s.read(loss), [ref.loss], tolerance('f32'));
        s.checkSpecials('dLogits', s.read(dLogits), ref.dLogits, tolerance(ctx.dtype));
        // Each row alone, so that a NaN row cannot hide another row's infinite loss.
        for (let row = 0; row < 4; ++row) {
          const one = s.poisoned([1], 'f32');
          const rowLogits = logits.subarray(row * k, (row + 1) * k);
          s.native.crossEntropy({
            logits: s.tensor([1, k], ctx.dtype, rowLogits),
            labels: s.tensor([1], 'i32', [labels[row]!]),
            loss: one,
            labelSmoothing,
            gradScale,
          });
          const rowRef = crossEntropy(rowLogits, [labels[row]!], {
            n: 1,
            k,
            labelSmoothing: Math.fround(labelSmoothing),
            gradScale,
          });
          s.checkSpecials(`loss of row ${row}`, s.read(one), [rowRef.loss], tolerance('f32'));
        }
      }),
  };
}

const LINEAR = { n: 5, in: 16, out: 7 };

// Through oneDNN's and cuBLAS's GEMM: a NaN input makes its row NaN, an infinity its row ±inf (or
// NaN where infinities of both signs meet), exactly as the float64 sum does.
const linearCase: OpCase = {
  name: `linear.forward NaN/inf x${fmtShape([LINEAR.n, LINEAR.in])} w${fmtShape([LINEAR.out, LINEAR.in])} bias`,
  dtypes: ['f32'],
  run: (ctx) =>
    session(ctx, 'linear.forward NaN/inf', `x${fmtShape([LINEAR.n, LINEAR.in])}`, (s) => {
      const g = LINEAR;
      const x = s.q(s.rng.normals(g.n * g.in));
      x[0 * g.in + 3] = NaN;
      x[1 * g.in + 5] = Infinity;
      x[2 * g.in + 1] = -Infinity;
      x[3 * g.in + 2] = Infinity;
      x[3 * g.in + 9] = -Infinity;
      const w = s.q(s.rng.normals(g.out * g.in, 0, 0.3), 'f32');
      const bias = s.q(s.rng.normals(g.out), 'f32');
      const y = s.poisoned([g.n, g.out]);
      const plan = s.own(new s.native.LinearPlan({ device: ctx.device, dtype: ctx.dtype, ...g, bias: true }));
      plan.forward({
        x: s.tensor([g.n, g.in], ctx.dtype, x),
        weight: s.tensor([g.out, g.in], 'f32', w),
        bias: s.tensor([g.out], 'f32', bias),
        y,
      });
      s.checkSpecials('y', s.read(y), linearForward(g, x, w, bias), tolerance(ctx.dtype));
    }),
};

const ARENA = 4096;
// Non-finite gradients inside the arena; the rest of it steps as usual.
const BAD_GRADS: readonly [number, number][] = [
  [17, NaN],
  [1000, Infinity],
  [2049, -Infinity],
  [4000, NaN],
];

function badGrads(s: {
  rng: { normals(n: number): Float64Array };
  q(v: ArrayLike<number>, d: DTypeName): Float64Array;
}): Float64Array {
  const grads = new Float64Array(s.q(s.rng.normals(ARENA), 'f32'));
  for (const [at, v] of BAD_GRADS) grads[at] = v;
  return grads;
}

// Without the found-inf flag (no GradScaler) a non-finite gradient reaches its parameter and its
// optimizer state, as in torch.optim; the others step as usual.
const sgdCase: OpCase = {
  name: `sgdStep NaN/inf gradients arena[${ARENA}] momentum`,
  dtypes: ['f32'],
  run: (ctx) =>
    session(ctx, 'sgdStep NaN/inf', `arena[${ARENA}]`, (s) => {
      const group = {
        lr: Math.fround(0.1),
        momentum: Math.fround(0.9),
        dampening: 0,
        weightDecay: Math.fround(1e-2),
        nesterov: true,
      };
      const params = s.q(s.rng.normals(ARENA), 'f32');
      const buffer = s.q(s.rng.normals(ARENA), 'f32');
      const grads = badGrads(s);
      const pT = s.tensor([ARENA], 'f32', params);
      const bT = s.tensor([ARENA], 'f32', buffer);
      const segments = [{ offset: 0, count: ARENA, group: 0 }];
      s.native.sgdStep({
        params: pT,
        grads: s.tensor([ARENA], 'f32', grads),
        momentumBuffer: bT,
        groups: [group],
        segments: Int32Array.of(0, ARENA, 0),
        firstStep: false,
        gradScaleInv: 1,
      });
      const ref = sgdStep({
        params,
        grads,
        momentumBuffer: buffer,
        groups: [group],
        segments,
        firstStep: false,
        foundInf: 0,
        gradScaleInv: 1,
      });
      s.checkSpecials('params', s.read(pT), ref.params, tolerance('f32'));
      if (ref.momentumBuffer === undefined) throw new Error('sgdStep (reference) dropped the momentum buffer');
      s.checkSpecials('momentumBuffer', s.read(bT), ref.momentumBuffer, tolerance('f32'));
    }),
};

const adamwCase: OpCase = {
  name: `adamwStep NaN/inf gradients arena[${ARENA}]`,
  dtypes: ['f32'],
  run: (ctx) =>
    session(ctx, 'adamwStep NaN/inf', `arena[${ARENA}]`, (s) => {
      const group = {
        lr: Math.fround(1e-2),
        beta1: Math.fround(0.9),
        beta2: Math.fround(0.999),
        eps: Math.fround(1e-8),
        weightDecay: Math.fround(1e-2),
        alwaysAdapt: false,
      };
      const params = s.q(s.rng.normals(ARENA, 0, 0.1), 'f32');
      const expAvg = s.q(s.rng.normals(ARENA, 0, 0.1), 'f32');
      const expAvgSq = s.q(s.rng.uniforms(ARENA, 0, 0.5), 'f32');
      const grads = badGrads(s);
      const pT = s.tensor([ARENA], 'f32', params);
      const mT = s.tensor([ARENA], 'f32', expAvg);
      const vT = s.tensor([ARENA], 'f32', expAvgSq);
      s.native.adamwStep({
        params: pT,
        grads: s.tensor([ARENA], 'f32', grads),
        expAvg: mT,
        expAvgSq: vT,
        groups: [group],
        segments: Int32Array.of(0, ARENA, 0),
        step: 3,
        gradScaleInv: 1,
      });
      const ref = adamwStep({
        params,
        grads,
        expAvg,
        expAvgSq,
        groups: [group],
        segments: [{ offset: 0, count: ARENA, group: 0 }],
        step: 3,
        foundInf: 0,
        gradScaleInv: 1,
      });
      // Compare the update where it is finite: the parameters are 0.1 and the update 1e-2.
      const after = s.read(pT);
      s.checkSpecials(
        'params update (after - before)',
        after.map((p, i) => p - params[i]!),
        ref.params.map((p, i) => p - params[i]!),
        tolerance('f32'),
      );
      s.checkSpecials('expAvg', s.read(mT), ref.expAvg, tolerance('f32'));
      s.checkSpecials('expAvgSq', s.read(vT), ref.expAvgSq, tolerance('f32'));
    }),
};

/** Every op with NaN and ±inf in its inputs. */
export const specialValueCases: OpCase[] = [
  ...reluCases,
  poolCase('max', 'forward'),
  poolCase('max', 'backward'),
  poolCase('avg', 'forward'),
  poolCase('avg', 'backward'),
  bnCase('training', false),
  bnCase('training', true),
  bnCase('inference', false),
  bnCase('inference', true),
  bnBackwardCase(false),
  bnBackwardCase(true),
  crossEntropyCase(0),
  crossEntropyCase(0.1),
  linearCase,
  sgdCase,
  adamwCase,
];
