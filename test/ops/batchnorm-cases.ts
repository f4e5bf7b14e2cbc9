/**
 * Batch normalisation cases: training forward (every residual/ReLU combination), inference
 * forward, and backward.
 * @packageDocumentation
 */
import type { DTypeName } from '../../lib/binding.js';
import {
  batchNormBackward,
  batchNormInferenceBackward,
  batchNormInferenceForward,
  batchNormTrainingForward,
} from '../reference/index.js';
import { checkAccumulated, rms } from './conv-cases.js';
import { fmtShape, session, tolerance, type OpCase, type Session } from './harness.js';

const BOTH: DTypeName[] = ['f32', 'bf16'];

// The op takes these as f32; the reference uses the same f32 values.
const MOMENTUM = Math.fround(0.1);
const EPS = Math.fround(1e-5);

/**
 * BN parameters, statistics and their gradients are f32 and computed in double from the
 * (already rounded) inputs, so they get the f32 tolerance whatever the activation dtype.
 */
const STATS_TOL = tolerance('f32');

interface BnVariant {
  shape: [number, number, number, number];
  residual: boolean;
  relu: boolean;
  /** Centre and spread of the per-channel means of x (default 2 and 1) and its std range (default 0.5..2). */
  mean?: [number, number];
  std?: [number, number];
}

function label(v: BnVariant): string {
  const spread = v.mean ? ` mean~${v.mean[0]} std~${v.std?.[0] ?? 0.5}` : '';
  return `x${fmtShape(v.shape)}${v.residual ? ' +residual' : ''}${v.relu ? ' relu' : ''}${spread}`;
}

function count(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

// Inputs with a mean far from 0 relative to their spread, as after a ReLU: exercises the
// variance computation's cancellation.
function inputs(s: Session, v: BnVariant) {
  const c = v.shape[3];
  const n = count(v.shape);
  const channelMean = s.rng.normals(c, v.mean?.[0] ?? 2, v.mean?.[1] ?? 1);
  const channelStd = s.rng.uniforms(c, v.std?.[0] ?? 0.5, v.std?.[1] ?? 2);
  const xRaw = new Float64Array(n);
  for (let i = 0; i < n; ++i) xRaw[i] = channelMean[i % c]! + channelStd[i % c]! * s.rng.normal();
  return {
    c,
    n,
    x: s.q(xRaw),
    gamma: s.q(s.rng.uniforms(c, 0.5, 1.5), 'f32'),
    beta: s.q(s.rng.normals(c, 0, 0.5), 'f32'),
    residual: v.residual ? s.q(s.rng.normals(n)) : undefined,
    runningMean: s.q(s.rng.normals(c), 'f32'),
    runningVar: s.q(s.rng.uniforms(c, 0.5, 2), 'f32'),
  };
}

function trainingForwardCase(v: BnVariant): OpCase {
  return {
    name: `batchnorm.forward.training ${label(v)}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'batchnorm.forward.training', label(v), (s) => {
        const i = inputs(s, v);
        const runningMean = s.tensor([i.c], 'f32', i.runningMean);
        const runningVar = s.tensor([i.c], 'f32', i.runningVar);
        const saveMean = s.poisoned([i.c], 'f32');
        const saveInvStd = s.poisoned([i.c], 'f32');
        const y = s.poisoned(v.shape);
        s.native.batchNormForward({
          x: s.tensor(v.shape, ctx.dtype, i.x),
          gamma: s.tensor([i.c], 'f32', i.gamma),
          beta: s.tensor([i.c], 'f32', i.beta),
          ...(i.residual ? { residual: s.tensor(v.shape, ctx.dtype, i.residual) } : {}),
          y,
          runningMean,
          runningVar,
          saveMean,
          saveInvStd,
          training: true,
          relu: v.relu,
          momentum: MOMENTUM,
          eps: EPS,
        });
        const ref = batchNormTrainingForward(i.x, { channels: i.c, ...i, relu: v.relu, momentum: MOMENTUM, eps: EPS });
        s.check('y', s.read(y), ref.y, tolerance(ctx.dtype));
        s.check('saveMean', s.read(saveMean), ref.saveMean, STATS_TOL);
        s.check('saveInvStd', s.read(saveInvStd), ref.saveInvStd, STATS_TOL);
        s.check('runningMean', s.read(runningMean), ref.runningMean, STATS_TOL);
        s.check('runningVar (unbiased)', s.read(runningVar), ref.runningVar, STATS_TOL);
      }),
  };
}

function inferenceForwardCase(v: BnVariant): OpCase {
  return {
    name: `batchnorm.forward.inference ${label(v)}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'batchnorm.forward.inference', label(v), (s) => {
        const i = inputs(s, v);
        // Centre x on the running statistics so that y is O(1), as in a trained network.
        const x = new Float64Array(i.n);
        for (let j = 0; j < i.n; ++j) {
          x[j] = i.runningMean[j % i.c]! + Math.sqrt(i.runningVar[j % i.c]!) * s.rng.normal();
        }
        const xq = s.q(x);
        const runningMean = s.tensor([i.c], 'f32', i.runningMean);
        const runningVar = s.tensor([i.c], 'f32', i.runningVar);
        const y = s.poisoned(v.shape);
        s.native.batchNormForward({
          x: s.tensor(v.shape, ctx.dtype, xq),
          gamma: s.tensor([i.c], 'f32', i.gamma),
          beta: s.tensor([i.c], 'f32', i.beta),
          ...(i.residual ? { residual: s.tensor(v.shape, ctx.dtype, i.residual) } : {}),
          y,
          runningMean,
          runningVar,
          training: false,
          relu: v.relu,
          eps: EPS,
        });
        s.check(
          'y',
          s.read(y),
          batchNormInferenceForward(xq, { channels: i.c, ...i, relu: v.relu, eps: EPS }),
          tolerance(ctx.dtype),
        );
        // Inference must leave the running statistics alone.
        s.checkExact('runningMean (unchanged)', s.read(runningMean), i.runningMean);
        s.checkExact('runningVar (unchanged)', s.read(runningVar), i.runningVar);
      }),
  };
}

function backwardCase(v: BnVariant): OpCase {
  const text = `x${fmtShape(v.shape)}${v.residual ? ' dResidual' : ''}${v.relu ? ' relu' : ''}`;
  return {
    name: `batchnorm.backward ${text}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'batchnorm.backward', text, (s) => {
        const i = inputs(s, v);
        const fwd = batchNormTrainingForward(i.x, { channels: i.c, ...i, relu: v.relu, momentum: MOMENTUM, eps: EPS });
        // What the forward saved and produced, as stored: f32 statistics, y in the dtype.
        const saveMean = s.q(fwd.saveMean, 'f32');
        const saveInvStd = s.q(fwd.saveInvStd, 'f32');
        const y = s.q(fwd.y);
        const dy = s.q(s.rng.normals(i.n));
        const ref = batchNormBackward(i.x, dy, {
          channels: i.c,
          gamma: i.gamma,
          saveMean,
          saveInvStd,
          y,
          relu: v.relu,
        });
        const gBefore = s.q(s.rng.normals(i.c, 0, rms(ref.dGamma)), 'f32');
        const bBefore = s.q(s.rng.normals(i.c, 0, rms(ref.dBeta)), 'f32');
        const dGamma = s.tensor([i.c], 'f32', gBefore);
        const dBeta = s.tensor([i.c], 'f32', bBefore);
        const dx = s.poisoned(v.shape);
        const dResidual = v.residual ? s.poisoned(v.shape) : undefined;
        s.native.batchNormBackward({
          x: s.tensor(v.shape, ctx.dtype, i.x),
          ...(v.relu ? { y: s.tensor(v.shape, ctx.dtype, y) } : {}),
          dy: s.tensor(v.shape, ctx.dtype, dy),
          gamma: s.tensor([i.c], 'f32', i.gamma),
          saveMean: s.tensor([i.c], 'f32', saveMean),
          saveInvStd: s.tensor([i.c], 'f32', saveInvStd),
          dx,
          dGamma,
          dBeta,
          ...(dResidual ? { dResidual } : {}),
          relu: v.relu,
        });
        s.check('dx', s.read(dx), ref.dx, tolerance(ctx.dtype));
        checkAccumulated(s, 'dGamma', s.read(dGamma), gBefore, ref.dGamma, STATS_TOL);
        checkAccumulated(s, 'dBeta', s.read(dBeta), bBefore, ref.dBeta, STATS_TOL);
        if (dResidual) s.check('dResidual', s.read(dResidual), ref.dResidual, tolerance(ctx.dtype));
      }),
  };
}

/**
 * Backward after an inference forward (fine-tuning with frozen statistics): the forward saves the
 * running statistics as its constants, and the backward runs with training=false.
 */
function inferenceBackwardCase(v: BnVariant): OpCase {
  const text = `x${fmtShape(v.shape)}${v.residual ? ' dResidual' : ''}${v.relu ? ' relu' : ''}`;
  return {
    name: `batchnorm.backward.inference ${text}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'batchnorm.backward.inference', text, (s) => {
        const i = inputs(s, v);
        const x = new Float64Array(i.n);
        for (let j = 0; j < i.n; ++j) {
          x[j] = i.runningMean[j % i.c]! + Math.sqrt(i.runningVar[j % i.c]!) * s.rng.normal();
        }
        const xq = s.q(x);
        const xT = s.tensor(v.shape, ctx.dtype, xq);
        const gammaT = s.tensor([i.c], 'f32', i.gamma);
        const saveMean = s.poisoned([i.c], 'f32');
        const saveInvStd = s.poisoned([i.c], 'f32');
        const yT = s.poisoned(v.shape);
        s.native.batchNormForward({
          x: xT,
          gamma: gammaT,
          beta: s.tensor([i.c], 'f32', i.beta),
          ...(i.residual ? { residual: s.tensor(v.shape, ctx.dtype, i.residual) } : {}),
          y: yT,
          runningMean: s.tensor([i.c], 'f32', i.runningMean),
          runningVar: s.tensor([i.c], 'f32', i.runningVar),
          saveMean,
          saveInvStd,
          training: false,
          relu: v.relu,
          eps: EPS,
        });
        s.checkExact('saveMean (the running mean)', s.read(saveMean), i.runningMean);
        s.check(
          'saveInvStd (1/sqrt(running var + eps))',
          s.read(saveInvStd),
          i.runningVar.map((rv) => 1 / Math.sqrt(rv + EPS)),
          STATS_TOL,
        );
        const y = s.read(yT);
        const dy = s.q(s.rng.normals(i.n));
        const ref = batchNormInferenceBackward(xq, dy, {
          channels: i.c,
          gamma: i.gamma,
          runningMean: i.runningMean,
          runningVar: i.runningVar,
          eps: EPS,
          y,
          relu: v.relu,
        });
        const gBefore = s.q(s.rng.normals(i.c, 0, rms(ref.dGamma)), 'f32');
        const bBefore = s.q(s.rng.normals(i.c, 0, rms(ref.dBeta)), 'f32');
        const dGamma = s.tensor([i.c], 'f32', gBefore);
        const dBeta = s.tensor([i.c], 'f32', bBefore);
        const dx = s.poisoned(v.shape);
        const dResidual = v.residual ? s.poisoned(v.shape) : undefined;
        s.native.batchNormBackward({
          x: xT,
          ...(v.relu ? { y: yT } : {}),
          dy: s.tensor(v.shape, ctx.dtype, dy),
          gamma: gammaT,
          saveMean,
          saveInvStd,
          dx,
          dGamma,
          dBeta,
          ...(dResidual ? { dResidual } : {}),
          relu: v.relu,
          training: false,
        });
        s.check('dx', s.read(dx), ref.dx, tolerance(ctx.dtype));
        checkAccumulated(s, 'dGamma', s.read(dGamma), gBefore, ref.dGamma, STATS_TOL);
        checkAccumulated(s, 'dBeta', s.read(dBeta), bBefore, ref.dBeta, STATS_TOL);
        if (dResidual) s.check('dResidual', s.read(dResidual), ref.dResidual, tolerance(ctx.dtype));
      }),
  };
}

/**
 * Channels 1-4 of {@link recomputedReluCase}: x = 0 and running mean 0, so that the pre-activation
 * is beta exactly, a tiny positive value that f16 (2^-25 a tie to 0, 3*2^-26 up to 2^-24) or bf16
 * (2^-134 a tie to 0, 2^-133 its smallest) stores as zero or not.
 */
const AT_STORED_ZERO = [2 ** -25, 3 * 2 ** -26, 2 ** -134, 2 ** -133];

/**
 * Backward after the op's own forward with a ReLU and no residual, given beta: a backend may then
 * recompute the ReLU's output from x instead of reading y (the CPU does). The gradients must equal
 * those masked with y bit for bit, including where the pre-activation rounds to about zero (channel
 * 0 constant, with beta 0) and where it is a value the dtype stores as zero or as its smallest
 * (AT_STORED_ZERO), and match the reference.
 */
function recomputedReluCase(shape: BnVariant['shape'], training: boolean): OpCase {
  const text = `x${fmtShape(shape)} relu${training ? '' : ' after an inference forward'}`;
  return {
    name: `batchnorm.backward.beta ${text}`,
    // f16 too: its stored zero covers far more pre-activations than bf16's or f32's.
    dtypes: ['f32', 'bf16', 'f16'],
    run: (ctx) =>
      session(ctx, 'batchnorm.backward.beta', text, (s) => {
        const i = inputs(s, { shape, residual: false, relu: true });
        const atZero = (k: number) => k >= 1 && k <= AT_STORED_ZERO.length;
        const x = Float64Array.from(i.x, (value, j) => (j % i.c === 0 ? i.x[0]! : atZero(j % i.c) ? 0 : value));
        const beta = Float64Array.from(i.beta, (value, k) =>
          k === 0 ? 0 : atZero(k) ? AT_STORED_ZERO[k - 1]! : value,
        );
        const runningMean = Float64Array.from(i.runningMean, (value, k) => (atZero(k) ? 0 : value));
        const xT = s.tensor(shape, ctx.dtype, x);
        const gammaT = s.tensor([i.c], 'f32', i.gamma);
        const betaT = s.tensor([i.c], 'f32', beta);
        const saveMean = s.poisoned([i.c], 'f32');
        const saveInvStd = s.poisoned([i.c], 'f32');
        const yT = s.poisoned(shape);
        s.native.batchNormForward({
          x: xT,
          gamma: gammaT,
          beta: betaT,
          y: yT,
          runningMean: s.tensor([i.c], 'f32', runningMean),
          runningVar: s.tensor([i.c], 'f32', i.runningVar),
          saveMean,
          saveInvStd,
          training,
          relu: true,
          momentum: MOMENTUM,
          eps: EPS,
        });
        const dy = s.q(s.rng.normals(i.n));
        const dyT = s.tensor(shape, ctx.dtype, dy);
        const backward = (withBeta: boolean) => {
          const dx = s.poisoned(shape);
          const dGamma = s.tensor([i.c], 'f32', new Float64Array(i.c));
          const dBeta = s.tensor([i.c], 'f32', new Float64Array(i.c));
          s.native.batchNormBackward({
            x: xT,
            y: yT,
            dy: dyT,
            gamma: gammaT,
            ...(withBeta ? { beta: betaT } : {}),
            saveMean,
            saveInvStd,
            dx,
            dGamma,
            dBeta,
            relu: true,
            training,
          });
          return { dx: s.read(dx), dGamma: s.read(dGamma), dBeta: s.read(dBeta) };
        };
        const masked = backward(false);
        const recomputed = backward(true);
        s.checkExact('dx (ReLU output recomputed, against masked with y)', recomputed.dx, masked.dx);
        s.checkExact('dGamma (ReLU output recomputed, against masked with y)', recomputed.dGamma, masked.dGamma);
        s.checkExact('dBeta (ReLU output recomputed, against masked with y)', recomputed.dBeta, masked.dBeta);
        const y = s.read(yT);
        const ref = training
          ? batchNormBackward(x, dy, {
              channels: i.c,
              gamma: i.gamma,
              saveMean: s.read(saveMean),
              saveInvStd: s.read(saveInvStd),
              y,
              relu: true,
            })
          : batchNormInferenceBackward(x, dy, { channels: i.c, ...i, runningMean, eps: EPS, y, relu: true });
        s.check('dx', recomputed.dx, ref.dx, tolerance(ctx.dtype));
        s.check('dGamma', recomputed.dGamma, ref.dGamma, STATS_TOL);
        s.check('dBeta', recomputed.dBeta, ref.dBeta, STATS_TOL);
      }),
  };
}

/** Training forward with all four residual/ReLU combinations, inference, and backward likewise. */
export const batchNormCases: OpCase[] = [
  trainingForwardCase({ shape: [2, 5, 5, 8], residual: false, relu: false }),
  trainingForwardCase({ shape: [1, 7, 7, 16], residual: false, relu: true }),
  trainingForwardCase({ shape: [3, 4, 4, 4], residual: true, relu: false }),
  trainingForwardCase({ shape: [2, 6, 6, 8], residual: true, relu: true }),
  // Many rows: statistics reduced over several blocks and threads.
  trainingForwardCase({ shape: [4, 14, 14, 8], residual: false, relu: false }),
  // |mean| / std ≈ 50: sums of squares would cancel badly without a shift. Much larger ratios
  // would fail y for a reason shared with PyTorch, not a bug: y = x·scale + shift in f32 cancels.
  trainingForwardCase({ shape: [2, 8, 8, 4], residual: false, relu: true, mean: [25, 1], std: [0.4, 0.6] }),
  inferenceForwardCase({ shape: [2, 5, 5, 8], residual: false, relu: false }),
  inferenceForwardCase({ shape: [2, 4, 4, 8], residual: true, relu: true }),
  backwardCase({ shape: [2, 5, 5, 8], residual: false, relu: false }),
  backwardCase({ shape: [2, 6, 6, 8], residual: false, relu: true }),
  backwardCase({ shape: [1, 5, 5, 4], residual: true, relu: false }),
  backwardCase({ shape: [3, 4, 4, 16], residual: true, relu: true }),
  backwardCase({ shape: [4, 14, 14, 8], residual: false, relu: true }),
  inferenceBackwardCase({ shape: [2, 5, 5, 8], residual: false, relu: false }),
  inferenceBackwardCase({ shape: [2, 6, 6, 8], residual: false, relu: true }),
  inferenceBackwardCase({ shape: [3, 4, 4, 16], residual: true, relu: true }),
  inferenceBackwardCase({ shape: [4, 14, 14, 8], residual: true, relu: false }),
  recomputedReluCase([2, 6, 6, 8], true),
  recomputedReluCase([4, 14, 14, 16], true),
  recomputedReluCase([2, 6, 6, 8], false),
];
