/**
 * Cases for the light ops: relu, add, mul, lerp, cross entropy, SGD, input conversion and casts.
 * @packageDocumentation
 */
import type { DTypeName } from '../../lib/binding.js';
import {
  add,
  bf16BitsToF32,
  convertInput,
  crossEntropy,
  f16BitsToF32,
  f32FromBits,
  f32ToBf16Bits,
  f32ToF16Bits,
  lerp,
  mul,
  relu,
  reluBackward,
  sgdStep,
  type SgdGroup,
  type SgdSegment,
} from '../reference/index.js';
import { fmtShape, session, tolerance, type OpCase } from './harness.js';

const BOTH: DTypeName[] = ['f32', 'bf16'];

function count(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

const RELU_SHAPE = [2, 5, 5, 8];
const ADD_SHAPE = [3, 7, 7, 5];
// Larger than one CPU chunk (16384) and not a multiple of any vector width.
const MUL_SHAPE = [3, 7, 11, 97];

const eltwiseCases: OpCase[] = [
  {
    name: `relu.forward x${fmtShape(RELU_SHAPE)}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'relu.forward', `x${fmtShape(RELU_SHAPE)}`, (s) => {
        const x = s.q(s.rng.normals(count(RELU_SHAPE)));
        const y = s.poisoned(RELU_SHAPE);
        s.native.relu({ x: s.tensor(RELU_SHAPE, ctx.dtype, x), y });
        s.check('y', s.read(y), relu(x), tolerance(ctx.dtype));
      }),
  },
  {
    name: `relu.backward x${fmtShape(RELU_SHAPE)}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'relu.backward', `x${fmtShape(RELU_SHAPE)}`, (s) => {
        const y = relu(s.q(s.rng.normals(count(RELU_SHAPE))));
        const dy = s.q(s.rng.normals(count(RELU_SHAPE)));
        const dx = s.poisoned(RELU_SHAPE);
        s.native.reluBackward({ y: s.tensor(RELU_SHAPE, ctx.dtype, y), dy: s.tensor(RELU_SHAPE, ctx.dtype, dy), dx });
        s.check('dx', s.read(dx), reluBackward(y, dy), tolerance(ctx.dtype));
      }),
  },
  {
    name: `add x${fmtShape(ADD_SHAPE)}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'add', `x${fmtShape(ADD_SHAPE)}`, (s) => {
        const a = s.q(s.rng.normals(count(ADD_SHAPE)));
        const b = s.q(s.rng.normals(count(ADD_SHAPE)));
        const out = s.poisoned(ADD_SHAPE);
        s.native.add({ a: s.tensor(ADD_SHAPE, ctx.dtype, a), b: s.tensor(ADD_SHAPE, ctx.dtype, b), out });
        s.check('out', s.read(out), add(a, b), tolerance(ctx.dtype));
      }),
  },
  {
    name: `mul x${fmtShape(MUL_SHAPE)}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'mul', `x${fmtShape(MUL_SHAPE)}`, (s) => {
        const a = s.q(s.rng.normals(count(MUL_SHAPE)));
        const b = s.q(s.rng.normals(count(MUL_SHAPE)));
        const out = s.poisoned(MUL_SHAPE);
        s.native.mul({ a: s.tensor(MUL_SHAPE, ctx.dtype, a), b: s.tensor(MUL_SHAPE, ctx.dtype, b), out });
        s.check('out', s.read(out), mul(a, b), tolerance(ctx.dtype));
      }),
  },
  {
    // The pruning masks' use: in place, with a 0/1 mask, so kept values are unchanged and pruned ones exactly 0.
    name: `mul in place by a 0/1 mask x${fmtShape(MUL_SHAPE)}`,
    dtypes: ['f32'],
    run: (ctx) =>
      session(ctx, 'mul', `in place x${fmtShape(MUL_SHAPE)}`, (s) => {
        const a = s.q(s.rng.normals(count(MUL_SHAPE)), 'f32');
        const mask = Float64Array.from(s.rng.normals(count(MUL_SHAPE)), (v) => (v > 0 ? 1 : 0));
        const aT = s.tensor(MUL_SHAPE, 'f32', a);
        s.native.mul({ a: aT, b: s.tensor(MUL_SHAPE, 'f32', mask), out: aT });
        s.checkExact('a (masked in place)', s.read(aT), mul(a, mask));
      }),
  },
];

// Larger than one CPU chunk (16384) and not a multiple of any vector width; `b` has another shape
// of the same element count, which the op allows.
const LERP_A = [3, 7, 2003];
const LERP_B = [42063];

function lerpCase(weight: number): OpCase {
  const text = `a${fmtShape(LERP_A)} b${fmtShape(LERP_B)} weight=${weight}`;
  return {
    name: `lerp ${text}`,
    dtypes: ['f32'],
    run: (ctx) =>
      session(ctx, 'lerp', text, (s) => {
        const n = count(LERP_A);
        const a = s.q(s.rng.normals(n, 0, 2), 'f32');
        const b = s.q(s.rng.normals(n, 1, 3), 'f32');
        const aT = s.tensor(LERP_A, 'f32', a);
        s.native.lerp({ a: aT, b: s.tensor(LERP_B, 'f32', b), weight });
        const got = s.read(aT);
        // Weight 1 is the EMA's first update: it must copy, not merely come close.
        if (weight === 1) s.checkExact('a (weight 1 copies b)', got, b);
        else if (weight === 0) s.checkExact('a (weight 0 leaves a)', got, a);
        else s.check('a', got, lerp(a, b, Math.fround(weight)), tolerance('f32'));
      }),
  };
}

const lerpCases: OpCase[] = [
  lerpCase(1e-4),
  lerpCase(0.25),
  lerpCase(0.75),
  lerpCase(1),
  lerpCase(0),
  {
    name: 'lerp of a tensor with itself',
    dtypes: ['f32'],
    run: (ctx) =>
      session(ctx, 'lerp', 'a[100] b=a weight=0.5', (s) => {
        const a = s.q(s.rng.normals(100), 'f32');
        const aT = s.tensor([100], 'f32', a);
        s.native.lerp({ a: aT, b: aT, weight: 0.5 });
        s.checkExact('a', s.read(aT), a);
      }),
  },
];

interface CeVariant {
  n: number;
  k: number;
  labelSmoothing: number;
  gradScale: number;
  withGrad: boolean;
}

function ceCase(v: CeVariant): OpCase {
  const text = `logits${fmtShape([v.n, v.k])} smoothing=${v.labelSmoothing} gradScale=${v.gradScale}${v.withGrad ? '' : ' loss-only'}`;
  return {
    name: `crossEntropy ${text}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'crossEntropy', text, (s) => {
        // Spread logits, so that the softmax is far from uniform.
        const logits = s.q(s.rng.normals(v.n * v.k, 0, 3));
        const labels = Array.from({ length: v.n }, () => s.rng.int(0, v.k));
        const loss = s.poisoned([1], 'f32');
        const dLogits = v.withGrad ? s.poisoned([v.n, v.k]) : undefined;
        s.native.crossEntropy({
          logits: s.tensor([v.n, v.k], ctx.dtype, logits),
          labels: s.tensor([v.n], 'i32', labels),
          loss,
          ...(dLogits ? { dLogits } : {}),
          labelSmoothing: v.labelSmoothing,
          gradScale: v.gradScale,
        });
        const ref = crossEntropy(logits, labels, {
          n: v.n,
          k: v.k,
          labelSmoothing: Math.fround(v.labelSmoothing),
          gradScale: Math.fround(v.gradScale),
        });
        // The loss is f32, computed in double from the stored logits: f32 tolerance for any dtype.
        s.check('loss', s.read(loss), [ref.loss], tolerance('f32'));
        if (dLogits) s.check('dLogits', s.read(dLogits), ref.dLogits, tolerance(ctx.dtype));
      }),
  };
}

const crossEntropyCases: OpCase[] = [
  ceCase({ n: 8, k: 10, labelSmoothing: 0, gradScale: 1, withGrad: true }),
  ceCase({ n: 5, k: 37, labelSmoothing: 0.1, gradScale: 1024, withGrad: true }),
  ceCase({ n: 1, k: 1000, labelSmoothing: 0.1, gradScale: 0.5, withGrad: true }),
  ceCase({ n: 16, k: 10, labelSmoothing: 0, gradScale: 1, withGrad: false }),
];

interface SgdVariant {
  label: string;
  groups: SgdGroup[];
  firstStep: boolean;
  /** undefined: no foundInf tensor. */
  foundInf: number | undefined;
  gradScaleInv: number;
  /** Groups all without momentum: no buffer is passed at all. */
  noBuffer?: boolean;
  /** The arena and its segments; the small layout below when omitted. */
  layout?: SgdLayout;
}

interface SgdLayout {
  arena: number;
  segments: SgdSegment[];
}

const ARENA = 1000;
// Gaps at [450, 500), [700, 720) and [970, 1000) must stay untouched.
const SEGMENTS: SgdSegment[] = [
  { offset: 0, count: 300, group: 0 },
  { offset: 300, count: 150, group: 1 },
  { offset: 500, count: 200, group: 0 },
  { offset: 720, count: 250, group: 2 },
];
const SMALL: SgdLayout = { arena: ARENA, segments: SEGMENTS };
// Segments longer than one CPU work chunk (16384 elements): each is cut into several chunks, and
// every chunk must step with its own segment's group. Gaps at [37000, 37010) and [49010, 50000)
// must stay untouched.
const CHUNKED: SgdLayout = {
  arena: 50000,
  segments: [
    { offset: 0, count: 20000, group: 0 },
    { offset: 20000, count: 17000, group: 1 },
    { offset: 37010, count: 12000, group: 2 },
  ],
};
const MIXED_GROUPS: SgdGroup[] = [
  { lr: 0.1, momentum: 0.9, weightDecay: 5e-2, nesterov: true },
  { lr: 0.05, momentum: 0.8, dampening: 0.1 },
  { lr: 0.2, weightDecay: 1e-2 },
];

function sgdCase(v: SgdVariant): OpCase {
  const { arena, segments } = v.layout ?? SMALL;
  const text = `arena[${arena}] ${segments.length} segments ${v.groups.length} groups ${v.label}`;
  return {
    name: `sgdStep ${v.label}`,
    dtypes: ['f32'],
    run: (ctx) =>
      session(ctx, 'sgdStep', text, (s) => {
        // The op receives hyperparameters as f32.
        const groups = v.groups.map((g) => ({
          lr: Math.fround(g.lr),
          momentum: Math.fround(g.momentum ?? 0),
          dampening: Math.fround(g.dampening ?? 0),
          weightDecay: Math.fround(g.weightDecay ?? 0),
          nesterov: g.nesterov ?? false,
        }));
        const params = s.q(s.rng.normals(arena), 'f32');
        const grads = s.q(s.rng.normals(arena, 0, 1 / v.gradScaleInv), 'f32');
        const momentumIndex = new Uint8Array(arena);
        for (const seg of segments) {
          if (groups[seg.group]!.momentum !== 0) momentumIndex.fill(1, seg.offset, seg.offset + seg.count);
        }
        // On a first step the buffer must not be read: NaN there would spread into params.
        const buffer = v.firstStep ? new Float64Array(arena).fill(NaN) : s.q(s.rng.normals(arena), 'f32');
        const pT = s.tensor([arena], 'f32', params);
        const bT = v.noBuffer ? undefined : s.tensor([arena], 'f32', buffer);
        s.native.sgdStep({
          params: pT,
          grads: s.tensor([arena], 'f32', grads),
          ...(bT ? { momentumBuffer: bT } : {}),
          groups,
          segments: Int32Array.from(segments.flatMap((seg) => [seg.offset, seg.count, seg.group])),
          firstStep: v.firstStep,
          ...(v.foundInf !== undefined ? { foundInf: s.tensor([1], 'f32', [v.foundInf]) } : {}),
          gradScaleInv: v.gradScaleInv,
        });
        const ref = sgdStep({
          params,
          grads,
          momentumBuffer: v.noBuffer ? undefined : buffer,
          groups,
          segments,
          firstStep: v.firstStep,
          foundInf: v.foundInf ?? 0,
          gradScaleInv: Math.fround(v.gradScaleInv),
        });
        const after = s.read(pT);
        if (v.foundInf) {
          s.checkExact('params (step skipped)', after, params);
          if (bT) s.checkExact('momentumBuffer (step skipped)', s.read(bT), buffer);
          return;
        }
        // Compare the update, not the parameters: it is what the step computes, and much smaller.
        const delta = after.map((p, i) => p - params[i]!);
        const refDelta = ref.params.map((p, i) => p - params[i]!);
        s.check('params update (after - before)', delta, refDelta, tolerance('f32'));
        s.checkExact(
          'params outside every segment (untouched)',
          untouched(after, segments),
          untouched(params, segments),
        );
        if (bT && ref.momentumBuffer) {
          const got = s.read(bT);
          s.check(
            'momentumBuffer',
            pick(got, momentumIndex, 1),
            pick(ref.momentumBuffer, momentumIndex, 1),
            tolerance('f32'),
          );
          s.checkExact(
            'momentumBuffer without momentum (untouched)',
            pick(got, momentumIndex, 0),
            pick(buffer, momentumIndex, 0),
          );
        }
      }),
  };
}

function untouched(v: Float64Array, segments: readonly SgdSegment[]): Float64Array {
  const inSegment = new Uint8Array(v.length);
  for (const seg of segments) inSegment.fill(1, seg.offset, seg.offset + seg.count);
  return pick(v, inSegment, 0);
}

function pick(v: Float64Array, mask: Uint8Array, want: number): Float64Array {
  return v.filter((_, i) => mask[i] === want);
}

const sgdCases: OpCase[] = [
  sgdCase({
    label: 'first step, grad scale 1/256, foundInf=0',
    groups: MIXED_GROUPS,
    firstStep: true,
    foundInf: 0,
    gradScaleInv: 1 / 256,
  }),
  sgdCase({ label: 'later step', groups: MIXED_GROUPS, firstStep: false, foundInf: undefined, gradScaleInv: 1 }),
  sgdCase({ label: 'skipped on foundInf', groups: MIXED_GROUPS, firstStep: false, foundInf: 1, gradScaleInv: 1 / 128 }),
  sgdCase({
    label: 'no momentum, no buffer',
    groups: [{ lr: 0.1, weightDecay: 1e-4 }, { lr: 0.01 }, { lr: 0.3, weightDecay: 1e-2 }],
    firstStep: false,
    foundInf: undefined,
    gradScaleInv: 1,
    noBuffer: true,
  }),
  sgdCase({
    label: 'segments across work chunks',
    groups: MIXED_GROUPS,
    firstStep: false,
    foundInf: undefined,
    gradScaleInv: 1 / 64,
    layout: CHUNKED,
  }),
];

const IMAGE: [number, number, number, number] = [3, 5, 7, 3];
const MEAN = [0.485, 0.456, 0.406];
const STD = [0.229, 0.224, 0.225];

function convertInputCase(withFlip: boolean): OpCase {
  const text = `u8${fmtShape(IMAGE)}${withFlip ? ' flip=[1,0,1]' : ''}`;
  return {
    name: `convertInput ${text}`,
    dtypes: ['f32', 'bf16', 'f16'],
    run: (ctx) =>
      session(ctx, 'convertInput', text, (s) => {
        const src = Array.from({ length: count(IMAGE) }, () => s.rng.int(0, 256));
        src[0] = 0;
        src[1] = 255;
        const flip = [1, 0, 1];
        const dst = s.poisoned(IMAGE);
        s.native.convertInput({
          src: s.tensor(IMAGE, 'u8', src),
          dst,
          ...(withFlip ? { flip: s.tensor([IMAGE[0]], 'u8', flip) } : {}),
          mean: MEAN,
          std: STD,
        });
        const f32 = (v: number[]): number[] => v.map(Math.fround);
        const ref = convertInput(src, IMAGE, f32(MEAN), f32(STD), withFlip ? flip : undefined);
        s.check('dst', s.read(dst), ref, tolerance(ctx.dtype));
      }),
  };
}

// Rounding corner cases: ties to even in bf16 and f16, f16 overflow and subnormals, signed zero,
// infinities, NaN and the largest finite values.
const CAST_SPECIALS = [
  0,
  -0,
  1,
  -1,
  1 + 2 ** -8,
  1 + 3 * 2 ** -8,
  -(1 + 2 ** -8),
  1 + 2 ** -11,
  1 + 3 * 2 ** -11,
  65504,
  65519,
  65520,
  1e-6,
  -3e-7,
  2 ** -24,
  2 ** -25,
  3 * 2 ** -26,
  Infinity,
  -Infinity,
  NaN,
  3.3e38,
  f32FromBits(0x7f7fffff),
  1e-40,
];

function castCase(): OpCase {
  const shape = [4, 64];
  return {
    name: `cast f32->dtype->f32 ${fmtShape(shape)}`,
    dtypes: ['f32', 'bf16', 'f16'],
    run: (ctx) =>
      session(ctx, 'cast', `${fmtShape(shape)} f32->${ctx.dtype}->f32`, (s) => {
        const n = count(shape);
        const randomCount = n - CAST_SPECIALS.length;
        const values = s.q(
          [...s.rng.normals(randomCount).map((v, i) => v * 2 ** ((i % 24) - 12)), ...CAST_SPECIALS],
          'f32',
        );
        const src = s.tensor(shape, 'f32', values);
        const mid = s.poisoned(shape);
        const back = s.poisoned(shape, 'f32');
        s.native.cast({ src, dst: mid });
        s.native.cast({ src: mid, dst: back });
        const midBits = s.readRaw(mid);
        const backValues = s.read(back);
        // Casts are specified exactly (round to nearest even), so compare bits, not errors.
        const toBits = ctx.dtype === 'bf16' ? f32ToBf16Bits : ctx.dtype === 'f16' ? f32ToF16Bits : undefined;
        const fromBits = ctx.dtype === 'bf16' ? bf16BitsToF32 : f16BitsToF32;
        for (let i = 0; i < n; ++i) {
          const v = values[i]!;
          const got = toBits ? fromBits(Number(midBits[i]!)) : Number(midBits[i]!);
          const want = toBits ? fromBits(toBits(v)) : v;
          const same = Number.isNaN(want) ? Number.isNaN(got) : Object.is(got, want);
          if (!same) s.fail(`f32 ${v} cast to ${ctx.dtype} gave ${got}, expected ${want} (round to nearest even)`);
          if (!Object.is(backValues[i], got) && !(Number.isNaN(got) && Number.isNaN(backValues[i]!))) {
            s.fail(`${ctx.dtype} ${got} cast back to f32 gave ${backValues[i]}, expected it unchanged`);
          }
        }
        s.check(
          'round trip of the random values',
          backValues.subarray(0, randomCount),
          values.subarray(0, randomCount),
          tolerance(ctx.dtype),
        );
      }),
  };
}

/** relu, add, lerp, cross entropy, SGD, convertInput and cast. */
export const miscCases: OpCase[] = [
  ...eltwiseCases,
  ...lerpCases,
  ...crossEntropyCases,
  ...sgdCases,
  convertInputCase(true),
  convertInputCase(false),
  castCase(),
];
