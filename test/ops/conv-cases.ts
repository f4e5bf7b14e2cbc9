/**
 * conv2d and linear cases: forward, backward data (overwriting, or accumulating when asked), and
 * backward weights (which accumulates).
 * @packageDocumentation
 */
import type { DTypeName } from '../../lib/binding.js';
import {
  conv2dBackwardData,
  conv2dBackwardWeights,
  conv2dForward,
  linearBackwardData,
  linearBackwardWeights,
  linearForward,
  resolveConv2d,
  type Conv2dGeometry,
  type LinearGeometry,
} from '../reference/index.js';
import { fmtShape, session, tolerance, type OpCase, type Session } from './harness.js';

const BOTH: DTypeName[] = ['f32', 'bf16'];

/**
 * Weight gradients reduce over N·OH·OW (conv) or N (linear) products, the longest reductions
 * here (up to 162 terms); f32 accumulation error grows like √length·2^-24 ≈ 1e-6 at worst, and
 * we measured ≤ 3e-7 over 20 runs, so the f32 tolerance stays 1e-5, not loosened.
 */
function weightGradTolerance(dtype: DTypeName): number {
  return tolerance(dtype);
}

interface ConvShape extends Conv2dGeometry {
  bias: boolean;
}

// Strides 1 and 2, padding 0/1/2/3, odd and non-square inputs, 1x1 and rectangular kernels,
// batch 1, dilation 2, with and without bias. The 1x1 strided ones run on AVX2 CPUs as stride-1
// convolutions of the pixels they read (native/cpu/conv.cc): the last of them with unequal strides
// and a last row and column that no output reads. On AVX2 CPUs the weight gradient of every kernel
// larger than 1x1 is computed over gathered patches, each thread on its share of the output pixels
// in chunks of 128: the 3x3 over 13x12 pixels takes more than one chunk per thread, the last shape
// has one output pixel, so a thread has none. The 1x1 shape with 260 channels does at least 128
// multiply-adds per element of x and dy, so on AVX2 CPUs its weight gradient reads x and dy copied
// into oneDNN's channel-blocked layout, with channel counts that are not multiples of its block of 8.
const CONV_SHAPES: ConvShape[] = [
  { n: 2, h: 17, w: 17, c: 3, k: 8, kernelH: 7, kernelW: 7, strideH: 2, strideW: 2, padH: 3, padW: 3, bias: false },
  { n: 2, h: 8, w: 8, c: 8, k: 16, kernelH: 3, kernelW: 3, padH: 1, padW: 1, bias: true },
  { n: 1, h: 9, w: 7, c: 5, k: 6, kernelH: 3, kernelW: 3, strideH: 2, strideW: 2, padH: 1, padW: 1, bias: true },
  { n: 2, h: 6, w: 6, c: 16, k: 8, kernelH: 1, kernelW: 1, bias: false },
  { n: 2, h: 7, w: 7, c: 8, k: 16, kernelH: 1, kernelW: 1, strideH: 2, strideW: 2, bias: true },
  { n: 1, h: 9, w: 9, c: 4, k: 4, kernelH: 3, kernelW: 3, padH: 2, padW: 2, dilationH: 2, dilationW: 2, bias: false },
  { n: 3, h: 7, w: 6, c: 4, k: 5, kernelH: 3, kernelW: 1, strideH: 2, strideW: 1, padH: 1, padW: 0, bias: true },
  { n: 2, h: 6, w: 6, c: 30, k: 34, kernelH: 3, kernelW: 3, padH: 1, padW: 1, bias: true },
  { n: 1, h: 4, w: 4, c: 260, k: 266, kernelH: 1, kernelW: 1, bias: false },
  { n: 2, h: 8, w: 7, c: 12, k: 20, kernelH: 1, kernelW: 1, strideH: 2, strideW: 3, bias: false },
  { n: 2, h: 13, w: 12, c: 5, k: 7, kernelH: 3, kernelW: 3, padH: 1, padW: 1, bias: true },
  { n: 1, h: 3, w: 3, c: 4, k: 6, kernelH: 3, kernelW: 3, bias: true },
];

function convLabel(shape: ConvShape): string {
  const g = resolveConv2d(shape);
  const pair = (a: number, b: number): string => (a === b ? `${a}` : `${a}x${b}`);
  return (
    `x${fmtShape([g.n, g.h, g.w, g.c])} w${fmtShape([g.k, g.kernelH, g.kernelW, g.c])} s${pair(g.strideH, g.strideW)} ` +
    `p${pair(g.padH, g.padW)}${g.dilationH !== 1 || g.dilationW !== 1 ? ` d${pair(g.dilationH, g.dilationW)}` : ''}` +
    (shape.bias ? ' bias' : '')
  );
}

function convPlan(s: Session, shape: ConvShape) {
  const { bias, ...geometry } = shape;
  return s.own(new s.native.Conv2dPlan({ device: s.ctx.device, dtype: s.ctx.dtype, ...geometry, bias }));
}

// Master weights are f32 whatever the compute dtype; scaled by 1/sqrt(fan-in) so outputs are O(1).
function masterWeights(s: Session, count: number, fanIn: number): Float64Array {
  return s.q(s.rng.normals(count, 0, 1 / Math.sqrt(fanIn)), 'f32');
}

/**
 * The weights the plan computes with: a plan given f32 weights and a lower-precision dtype
 * converts them itself (round to nearest even), so the reference sees them rounded too.
 */
function computeWeights(s: Session, master: Float64Array): Float64Array {
  return s.q(master);
}

function convForwardCase(shape: ConvShape, weightsInComputeDtype = false): OpCase {
  const name = `conv2d.forward ${convLabel(shape)}${weightsInComputeDtype ? ' weights-in-dtype' : ''}`;
  return {
    name,
    dtypes: weightsInComputeDtype ? ['bf16'] : BOTH,
    run: (ctx) =>
      session(ctx, 'conv2d.forward', convLabel(shape), (s) => {
        const g = resolveConv2d(shape);
        const x = s.q(s.rng.normals(g.n * g.h * g.w * g.c));
        const master = masterWeights(s, g.k * g.kernelH * g.kernelW * g.c, g.kernelH * g.kernelW * g.c);
        const w = computeWeights(s, master);
        const bias = shape.bias ? s.q(s.rng.normals(g.k), 'f32') : undefined;
        const plan = convPlan(s, shape);
        const y = s.poisoned([g.n, g.outH, g.outW, g.k]);
        plan.forward({
          x: s.tensor([g.n, g.h, g.w, g.c], ctx.dtype, x),
          weight: weightsInComputeDtype
            ? s.tensor([g.k, g.kernelH, g.kernelW, g.c], ctx.dtype, w)
            : s.tensor([g.k, g.kernelH, g.kernelW, g.c], 'f32', master),
          ...(bias ? { bias: s.tensor([g.k], 'f32', bias) } : {}),
          y,
        });
        s.check('y', s.read(y), conv2dForward(g, x, w, bias), tolerance(ctx.dtype));
      }),
  };
}

/**
 * The input gradient, written over a poisoned dx, or with `accumulate` added into a dx that holds
 * values of the gradient's own magnitude (a residual block's sum; 1x1 stride-1 f32 layers add in
 * the matrix product's own pass on AVX-512 CPUs, native/cpu/conv.cc).
 */
function convBackwardDataCase(shape: ConvShape, accumulate = false): OpCase {
  const label = `${convLabel(shape)}${accumulate ? ' accumulate' : ''}`;
  return {
    name: `conv2d.backwardData ${label}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'conv2d.backwardData', label, (s) => {
        const g = resolveConv2d(shape);
        const dy = s.q(s.rng.normals(g.n * g.outH * g.outW * g.k));
        const master = masterWeights(s, g.k * g.kernelH * g.kernelW * g.c, g.k * g.kernelH * g.kernelW);
        const plan = convPlan(s, shape);
        const ref = conv2dBackwardData(g, dy, computeWeights(s, master));
        const dxShape = [g.n, g.h, g.w, g.c];
        const before = accumulate ? s.q(s.rng.normals(ref.length, 0, rms(ref))) : null;
        // Poisoned when overwritten: dx is written whole, including the elements no window reads
        // (1x1 stride 2).
        const dx = before ? s.tensor(dxShape, ctx.dtype, before) : s.poisoned(dxShape);
        plan.backwardData({
          dy: s.tensor([g.n, g.outH, g.outW, g.k], ctx.dtype, dy),
          weight: s.tensor([g.k, g.kernelH, g.kernelW, g.c], 'f32', master),
          dx,
          ...(accumulate ? { accumulate } : {}),
        });
        if (before) checkAccumulated(s, 'dx', s.read(dx), before, ref, tolerance(ctx.dtype));
        else s.check('dx', s.read(dx), ref, tolerance(ctx.dtype));
      }),
  };
}

function convBackwardWeightsCase(shape: ConvShape): OpCase {
  return {
    name: `conv2d.backwardWeights ${convLabel(shape)}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'conv2d.backwardWeights', convLabel(shape), (s) => {
        const g = resolveConv2d(shape);
        const x = s.q(s.rng.normals(g.n * g.h * g.w * g.c));
        const dy = s.q(s.rng.normals(g.n * g.outH * g.outW * g.k));
        const ref = conv2dBackwardWeights(g, x, dy);
        const wShape = [g.k, g.kernelH, g.kernelW, g.c];
        // Gradients accumulate (+=): start from values of the gradient's own magnitude.
        const wBefore = s.q(s.rng.normals(ref.dWeight.length, 0, rms(ref.dWeight)), 'f32');
        const bBefore = s.q(s.rng.normals(g.k, 0, rms(ref.dBias)), 'f32');
        const dWeight = s.tensor(wShape, 'f32', wBefore);
        const dBias = shape.bias ? s.tensor([g.k], 'f32', bBefore) : undefined;
        convPlan(s, shape).backwardWeights({
          x: s.tensor([g.n, g.h, g.w, g.c], ctx.dtype, x),
          dy: s.tensor([g.n, g.outH, g.outW, g.k], ctx.dtype, dy),
          dWeight,
          ...(dBias ? { dBias } : {}),
        });
        checkAccumulated(s, 'dWeight', s.read(dWeight), wBefore, ref.dWeight, weightGradTolerance(ctx.dtype));
        if (dBias) checkAccumulated(s, 'dBias', s.read(dBias), bBefore, ref.dBias, weightGradTolerance(ctx.dtype));
      }),
  };
}

/** Root mean square, at least 1e-3 so that an all-zero gradient still gets a non-zero start. */
export function rms(v: ArrayLike<number> & Iterable<number>): number {
  let s = 0;
  for (const x of v) s += x * x;
  return Math.max(Math.sqrt(s / Math.max(v.length, 1)), 1e-3);
}

/**
 * Checks after = before + grad twice: on the whole tensor, and on the increment after − before,
 * which is what an overwrite instead of += would get wrong.
 */
export function checkAccumulated(
  s: Session,
  what: string,
  after: Float64Array,
  before: Float64Array,
  grad: Float64Array,
  tol: number,
): void {
  const expected = new Float64Array(grad.length);
  const increment = new Float64Array(grad.length);
  for (let i = 0; i < grad.length; ++i) {
    expected[i] = before[i]! + grad[i]!;
    increment[i] = after[i]! - before[i]!;
  }
  s.check(`${what} (accumulated)`, after, expected, tol);
  s.check(`${what} increment (after - before)`, increment, grad, tol);
}

interface LinearShape extends LinearGeometry {
  bias: boolean;
}

const LINEAR_SHAPES: LinearShape[] = [
  { n: 4, in: 32, out: 10, bias: true },
  { n: 1, in: 17, out: 5, bias: false },
  { n: 7, in: 64, out: 33, bias: true },
];

function linearLabel(shape: LinearShape): string {
  return `x${fmtShape([shape.n, shape.in])} w${fmtShape([shape.out, shape.in])}${shape.bias ? ' bias' : ''}`;
}

function linearPlan(s: Session, shape: LinearShape) {
  return s.own(new s.native.LinearPlan({ device: s.ctx.device, dtype: s.ctx.dtype, ...shape }));
}

function linearCases(shape: LinearShape): OpCase[] {
  const label = linearLabel(shape);
  const g = shape;
  return [
    {
      name: `linear.forward ${label}`,
      dtypes: BOTH,
      run: (ctx) =>
        session(ctx, 'linear.forward', label, (s) => {
          const x = s.q(s.rng.normals(g.n * g.in));
          const master = masterWeights(s, g.out * g.in, g.in);
          const bias = g.bias ? s.q(s.rng.normals(g.out), 'f32') : undefined;
          const y = s.poisoned([g.n, g.out]);
          linearPlan(s, shape).forward({
            x: s.tensor([g.n, g.in], ctx.dtype, x),
            weight: s.tensor([g.out, g.in], 'f32', master),
            ...(bias ? { bias: s.tensor([g.out], 'f32', bias) } : {}),
            y,
          });
          s.check('y', s.read(y), linearForward(g, x, computeWeights(s, master), bias), tolerance(ctx.dtype));
        }),
    },
    {
      name: `linear.backwardData ${label}`,
      dtypes: BOTH,
      run: (ctx) =>
        session(ctx, 'linear.backwardData', label, (s) => {
          const dy = s.q(s.rng.normals(g.n * g.out));
          const master = masterWeights(s, g.out * g.in, g.out);
          const dx = s.poisoned([g.n, g.in]);
          linearPlan(s, shape).backwardData({
            dy: s.tensor([g.n, g.out], ctx.dtype, dy),
            weight: s.tensor([g.out, g.in], 'f32', master),
            dx,
          });
          s.check('dx', s.read(dx), linearBackwardData(g, dy, computeWeights(s, master)), tolerance(ctx.dtype));
        }),
    },
    {
      name: `linear.backwardWeights ${label}`,
      dtypes: BOTH,
      run: (ctx) =>
        session(ctx, 'linear.backwardWeights', label, (s) => {
          const x = s.q(s.rng.normals(g.n * g.in));
          const dy = s.q(s.rng.normals(g.n * g.out));
          const ref = linearBackwardWeights(g, x, dy);
          const wBefore = s.q(s.rng.normals(ref.dWeight.length, 0, rms(ref.dWeight)), 'f32');
          const bBefore = s.q(s.rng.normals(g.out, 0, rms(ref.dBias)), 'f32');
          const dWeight = s.tensor([g.out, g.in], 'f32', wBefore);
          const dBias = g.bias ? s.tensor([g.out], 'f32', bBefore) : undefined;
          linearPlan(s, shape).backwardWeights({
            x: s.tensor([g.n, g.in], ctx.dtype, x),
            dy: s.tensor([g.n, g.out], ctx.dtype, dy),
            dWeight,
            ...(dBias ? { dBias } : {}),
          });
          checkAccumulated(s, 'dWeight', s.read(dWeight), wBefore, ref.dWeight, weightGradTolerance(ctx.dtype));
          if (dBias) checkAccumulated(s, 'dBias', s.read(dBias), bBefore, ref.dBias, weightGradTolerance(ctx.dtype));
        }),
    },
  ];
}

/** conv2d forward / backward data / backward weights over every shape, then linear likewise. */
export const convCases: OpCase[] = [
  ...CONV_SHAPES.map((shape) => convForwardCase(shape)),
  // bf16 weights handed over directly (no conversion inside the plan).
  convForwardCase(CONV_SHAPES[1]!, true),
  ...CONV_SHAPES.map((shape) => convBackwardDataCase(shape)),
  ...CONV_SHAPES.map((shape) => convBackwardDataCase(shape, true)),
  ...CONV_SHAPES.map(convBackwardWeightsCase),
  ...LINEAR_SHAPES.flatMap(linearCases),
];
