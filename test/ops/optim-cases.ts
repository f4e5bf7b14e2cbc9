/**
 * Cases for the optimizer and mixed-precision ops over the parameter arena: AdamW, LAMB, the
 * gradient norm, unscale-and-check, gradient clipping and the GradScaler's scale update, each
 * against the float64 reference in test/reference/optim.ts, plus the inputs they must reject.
 * @packageDocumentation
 */
import type { RawAdamArgs } from '../../lib/binding.js';
import {
  adamwStep,
  clipGradNorm,
  gradNorm,
  lambStep,
  scalerUpdate,
  unscaleAndCheck,
  type AdamGroup,
  type SgdSegment,
} from '../reference/index.js';
import { session, tolerance, type OpCase, type Session } from './harness.js';

const INVALID = 'ERR_RC_INVALID_ARGUMENT';

// Big enough that one segment spans several chunks of every backend (16384 elements on the CPU,
// 4096 on CUDA), so that the chunked reductions and the chunk-to-segment lookup are exercised.
const ARENA = 24000;
// Listed out of offset order, with an empty segment, and with gaps at [450, 500),
// [17500, 17520), [17770, 17800) and [22800, 24000) that must stay untouched.
const SEGMENTS: SgdSegment[] = [
  { offset: 17520, count: 250, group: 2 },
  { offset: 0, count: 300, group: 0 },
  { offset: 500, count: 17000, group: 0 },
  { offset: 22800, count: 0, group: 1 },
  { offset: 300, count: 150, group: 1 },
  { offset: 17800, count: 5000, group: 1 },
];
const SEGMENT_TEXT = `arena[${ARENA}] ${SEGMENTS.length} segments`;

function triples(segments: readonly SgdSegment[]): Int32Array {
  return Int32Array.from(segments.flatMap((seg) => [seg.offset, seg.count, seg.group]));
}

function insideMask(segments: readonly SgdSegment[]): Uint8Array {
  const mask = new Uint8Array(ARENA);
  for (const seg of segments) mask.fill(1, seg.offset, seg.offset + seg.count);
  return mask;
}

function pick(v: ArrayLike<number>, mask: Uint8Array, want: number): Float64Array {
  return Float64Array.from(v).filter((_, i) => mask[i] === want);
}

/** The hyperparameters as the op receives them: f32. */
function f32Groups(groups: readonly AdamGroup[]): Required<AdamGroup>[] {
  return groups.map((g) => ({
    lr: Math.fround(g.lr),
    beta1: Math.fround(g.beta1 ?? 0.9),
    beta2: Math.fround(g.beta2 ?? 0.999),
    eps: Math.fround(g.eps ?? 1e-8),
    weightDecay: Math.fround(g.weightDecay ?? 0),
    alwaysAdapt: g.alwaysAdapt ?? false,
  }));
}

interface AdamVariant {
  label: string;
  groups: AdamGroup[];
  step: number;
  /** undefined: no foundInf tensor. */
  foundInf: number | undefined;
  gradScaleInv: number;
  /** Segments whose parameters are all zero (LAMB: ‖p‖ = 0 gives the ratio 1). */
  zeroSegments?: number[];
}

function adamCase(kind: 'adamw' | 'lamb', v: AdamVariant): OpCase {
  const op = kind === 'adamw' ? 'adamwStep' : 'lambStep';
  const text = `${SEGMENT_TEXT} ${v.groups.length} groups ${v.label}`;
  return {
    name: `${op} ${v.label}`,
    dtypes: ['f32'],
    run: (ctx) =>
      session(ctx, op, text, (s) => {
        const groups = f32Groups(v.groups);
        // Parameters of 0.1 keep their f32 rounding far below the update being compared.
        const params = s.q(s.rng.normals(ARENA, 0, 0.1), 'f32');
        for (const k of v.zeroSegments ?? []) {
          params.fill(0, SEGMENTS[k]!.offset, SEGMENTS[k]!.offset + SEGMENTS[k]!.count);
        }
        const grads = s.q(s.rng.normals(ARENA, 0, 1 / v.gradScaleInv), 'f32');
        const first = v.step === 1;
        const expAvg = first ? new Float64Array(ARENA) : s.q(s.rng.normals(ARENA, 0, 0.1), 'f32');
        const expAvgSq = first ? new Float64Array(ARENA) : s.q(s.rng.uniforms(ARENA, 0, 0.5), 'f32');
        const pT = s.tensor([ARENA], 'f32', params);
        const mT = s.tensor([ARENA], 'f32', expAvg);
        const vT = s.tensor([ARENA], 'f32', expAvgSq);
        const args: RawAdamArgs = {
          params: pT,
          grads: s.tensor([ARENA], 'f32', grads),
          expAvg: mT,
          expAvgSq: vT,
          groups,
          segments: triples(SEGMENTS),
          step: v.step,
          ...(v.foundInf !== undefined ? { foundInf: s.tensor([1], 'f32', [v.foundInf]) } : {}),
          gradScaleInv: v.gradScaleInv,
        };
        if (kind === 'adamw') s.native.adamwStep(args);
        else s.native.lambStep(args);
        const refArgs = {
          params,
          grads,
          expAvg,
          expAvgSq,
          groups,
          segments: SEGMENTS,
          step: v.step,
          foundInf: v.foundInf ?? 0,
          gradScaleInv: Math.fround(v.gradScaleInv),
        };
        const ref = kind === 'adamw' ? adamwStep(refArgs) : lambStep(refArgs);
        const after = s.read(pT);
        if (v.foundInf) {
          s.checkExact('params (step skipped)', after, params);
          s.checkExact('expAvg (step skipped)', s.read(mT), expAvg);
          s.checkExact('expAvgSq (step skipped)', s.read(vT), expAvgSq);
          return;
        }
        const inside = insideMask(SEGMENTS);
        // Compare the update, not the parameters: it is what the step computes, and much smaller.
        const delta = pick(
          after.map((p, i) => p - params[i]!),
          inside,
          1,
        );
        const refDelta = pick(
          ref.params.map((p, i) => p - params[i]!),
          inside,
          1,
        );
        s.check('params update (after - before)', delta, refDelta, tolerance('f32'));
        // Per segment too: a wrong trust ratio on a small segment hides in the global error.
        for (const seg of SEGMENTS) {
          if (seg.count === 0) continue;
          const range = (a: Float64Array) => a.subarray(seg.offset, seg.offset + seg.count);
          const d = range(after).map((p, i) => p - params[seg.offset + i]!);
          const rd = range(ref.params).map((p, i) => p - params[seg.offset + i]!);
          s.check(`params update of segment [${seg.offset}, +${seg.count})`, d, rd, tolerance('f32'));
        }
        const m = s.read(mT);
        const vv = s.read(vT);
        s.check('expAvg', pick(m, inside, 1), pick(ref.expAvg, inside, 1), tolerance('f32'));
        s.check('expAvgSq', pick(vv, inside, 1), pick(ref.expAvgSq, inside, 1), tolerance('f32'));
        s.checkExact('params outside every segment (untouched)', pick(after, inside, 0), pick(params, inside, 0));
        s.checkExact('expAvg outside every segment (untouched)', pick(m, inside, 0), pick(expAvg, inside, 0));
        s.checkExact('expAvgSq outside every segment (untouched)', pick(vv, inside, 0), pick(expAvgSq, inside, 0));
      }),
  };
}

const ADAMW_GROUPS: AdamGroup[] = [
  { lr: 0.05, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0.01 },
  { lr: 0.02, beta1: 0.8, beta2: 0.99, eps: 1e-6, weightDecay: 0 },
  { lr: 0.1, beta1: 0.95, beta2: 0.9999, eps: 1e-3, weightDecay: 0.1 },
];

// Group 0 adapts through its weight decay, group 1 has none (ratio 1, as FusedLAMB and timm),
// group 2 has none but always adapts.
const LAMB_GROUPS: AdamGroup[] = [
  { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-6, weightDecay: 0.01 },
  { lr: 0.05, beta1: 0.85, beta2: 0.99, eps: 1e-6, weightDecay: 0 },
  { lr: 0.2, beta1: 0.9, beta2: 0.999, eps: 1e-6, weightDecay: 0, alwaysAdapt: true },
];

const adamCases: OpCase[] = [
  adamCase('adamw', {
    label: 'first step, grad scale 1/256, foundInf=0',
    groups: ADAMW_GROUPS,
    step: 1,
    foundInf: 0,
    gradScaleInv: 1 / 256,
  }),
  adamCase('adamw', {
    label: 'step 7 with moments',
    groups: ADAMW_GROUPS,
    step: 7,
    foundInf: undefined,
    gradScaleInv: 1,
  }),
  adamCase('adamw', { label: 'skipped on foundInf', groups: ADAMW_GROUPS, step: 3, foundInf: 1, gradScaleInv: 1 / 64 }),
  adamCase('lamb', {
    label: 'first step, grad scale 1/128, foundInf=0',
    groups: LAMB_GROUPS,
    step: 1,
    foundInf: 0,
    gradScaleInv: 1 / 128,
  }),
  adamCase('lamb', {
    label: 'step 4 with moments, a zero parameter tensor',
    groups: LAMB_GROUPS,
    step: 4,
    foundInf: undefined,
    gradScaleInv: 1,
    // Segment 1 (group 0, adapting) and segment 0 (group 2, always adapting) are all zeros: ratio 1.
    zeroSegments: [0, 1],
  }),
  adamCase('lamb', { label: 'skipped on foundInf', groups: LAMB_GROUPS, step: 2, foundInf: 1, gradScaleInv: 1 }),
];

/** Random gradients with `specials` written at the given indices. */
function gradients(s: Session, specials: [number, number][] = []): Float64Array {
  const g = s.q(s.rng.normals(ARENA), 'f32');
  for (const [i, value] of specials) g[i] = value;
  return g;
}

interface NormVariant {
  label: string;
  segments: SgdSegment[] | undefined;
  specials?: [number, number][];
  /** undefined: no foundInf tensor; else its value before the op. */
  foundInf?: number;
}

function normCase(v: NormVariant): OpCase {
  const text = `${v.segments ? SEGMENT_TEXT : `arena[${ARENA}] whole`} ${v.label}`;
  return {
    name: `gradNorm ${v.label}`,
    dtypes: ['f32'],
    run: (ctx) =>
      session(ctx, 'gradNorm', text, (s) => {
        const grads = gradients(s, v.specials);
        const out = s.poisoned([1], 'f32');
        const flag = v.foundInf !== undefined ? s.tensor([1], 'f32', [v.foundInf]) : undefined;
        s.native.gradNorm({
          grads: s.tensor([ARENA], 'f32', grads),
          out,
          ...(flag ? { foundInf: flag } : {}),
          ...(v.segments ? { segments: triples(v.segments) } : {}),
        });
        const ref = gradNorm(grads, v.segments);
        const norm = s.read(out)[0]!;
        if (Number.isFinite(ref.norm)) s.check('norm', [norm], [ref.norm], tolerance('f32'));
        else s.checkExact('norm (not finite)', [norm], [ref.norm]);
        if (flag && v.foundInf !== undefined) s.checkExact('foundInf', s.read(flag), [ref.nonFinite ? 1 : v.foundInf]);
      }),
  };
}

const normCases: OpCase[] = [
  normCase({ label: 'whole arena', segments: undefined }),
  normCase({ label: 'segments, finite, foundInf stays 0', segments: SEGMENTS, foundInf: 0 }),
  normCase({ label: 'segments, inf inside a segment', segments: SEGMENTS, specials: [[9000, Infinity]], foundInf: 0 }),
  normCase({
    label: 'segments, NaN in a gap ignored',
    segments: SEGMENTS,
    specials: [
      [17510, NaN],
      [23999, Infinity],
    ],
    foundInf: 0,
  }),
];

interface UnscaleVariant {
  label: string;
  segments: SgdSegment[] | undefined;
  invScale: number;
  specials?: [number, number][];
  /** foundInf before the op: never cleared by it. */
  foundInf: number;
}

function unscaleCase(v: UnscaleVariant): OpCase {
  const text = `${v.segments ? SEGMENT_TEXT : `arena[${ARENA}] whole`} ${v.label}`;
  return {
    name: `unscaleAndCheck ${v.label}`,
    dtypes: ['f32'],
    run: (ctx) =>
      session(ctx, 'unscaleAndCheck', text, (s) => {
        const grads = gradients(s, v.specials).map((g) => Math.fround(g / v.invScale));
        const gT = s.tensor([ARENA], 'f32', grads);
        const flag = s.tensor([1], 'f32', [v.foundInf]);
        const invScale = Math.fround(v.invScale);
        s.native.unscaleAndCheck({
          grads: gT,
          invScale,
          foundInf: flag,
          ...(v.segments ? { segments: triples(v.segments) } : {}),
        });
        const ref = unscaleAndCheck(grads, invScale, v.segments);
        // An f32 product is the double product rounded once: the result is exact.
        s.checkExact('grads', s.read(gT), ref.grads.map(Math.fround));
        s.checkExact('foundInf', s.read(flag), [ref.foundInf ? 1 : v.foundInf]);
      }),
  };
}

const unscaleCases: OpCase[] = [
  unscaleCase({ label: 'whole arena, 1/1024', segments: undefined, invScale: 1 / 1024, foundInf: 0 }),
  unscaleCase({ label: 'segments, foundInf=1 is kept', segments: SEGMENTS, invScale: 1 / 65536, foundInf: 1 }),
  unscaleCase({
    label: 'segments, -inf and NaN inside',
    segments: SEGMENTS,
    invScale: 1 / 3,
    specials: [
      [17600, -Infinity],
      [20000, NaN],
    ],
    foundInf: 0,
  }),
  unscaleCase({
    label: 'segments, inf in a gap ignored',
    segments: SEGMENTS,
    invScale: 0.5,
    specials: [[460, Infinity]],
    foundInf: 0,
  }),
];

interface ClipVariant {
  label: string;
  segments: SgdSegment[] | undefined;
  /** The norm given to the op as a multiple of the true one; 'device': gradNorm's output. */
  norm: number | 'device' | 'nan';
  maxNorm: number;
}

function clipCase(v: ClipVariant): OpCase {
  const text = `${v.segments ? SEGMENT_TEXT : `arena[${ARENA}] whole`} maxNorm=${v.maxNorm} ${v.label}`;
  return {
    name: `clipGradNorm ${v.label}`,
    dtypes: ['f32'],
    run: (ctx) =>
      session(ctx, 'clipGradNorm', text, (s) => {
        const grads = gradients(s);
        const gT = s.tensor([ARENA], 'f32', grads);
        const segments = v.segments ? { segments: triples(v.segments) } : {};
        const trueNorm = gradNorm(grads, v.segments).norm;
        let norm: number;
        const normT = s.tensor([1], 'f32');
        if (v.norm === 'device') {
          s.native.gradNorm({ grads: gT, out: normT, ...segments });
          norm = Math.fround(trueNorm);
        } else {
          norm = v.norm === 'nan' ? NaN : Math.fround(trueNorm * v.norm);
          normT.copyFromHost(Float32Array.of(norm));
        }
        const maxNorm = Math.fround(v.maxNorm);
        s.native.clipGradNorm({ grads: gT, norm: normT, maxNorm, ...segments });
        const ref = clipGradNorm(grads, norm, maxNorm, v.segments);
        const after = s.read(gT);
        if (v.norm === 'nan') {
          s.checkExact('grads (NaN norm)', after, ref);
          return;
        }
        if (maxNorm >= norm) {
          s.checkExact('grads (norm within maxNorm: unchanged)', after, grads);
          return;
        }
        s.check('grads', after, ref, tolerance('f32'));
        const inside = v.segments ? insideMask(v.segments) : new Uint8Array(ARENA).fill(1);
        s.checkExact('grads outside every segment (untouched)', pick(after, inside, 0), pick(grads, inside, 0));
        const clippedNorm = gradNorm(after, v.segments).norm;
        s.check('norm after clipping', [clippedNorm], [(trueNorm * maxNorm) / (norm + 1e-6)], tolerance('f32'));
      }),
  };
}

const clipCases: OpCase[] = [
  clipCase({
    label: 'whole arena, norm from gradNorm on the device',
    segments: undefined,
    norm: 'device',
    maxNorm: 10,
  }),
  clipCase({ label: 'segments, norm 3x the true one', segments: SEGMENTS, norm: 3, maxNorm: 5 }),
  clipCase({ label: 'segments, within maxNorm', segments: SEGMENTS, norm: 1, maxNorm: 1e6 }),
  clipCase({ label: 'segments, NaN norm', segments: SEGMENTS, norm: 'nan', maxNorm: 1 }),
];

interface ScalerVariant {
  label: string;
  scale: number;
  growthTracker: number;
  foundInf: number;
  growthFactor: number;
  backoffFactor: number;
  growthInterval: number;
}

function scalerCase(v: ScalerVariant): OpCase {
  const text = `scale=${v.scale} tracker=${v.growthTracker} foundInf=${v.foundInf} growth=${v.growthFactor} backoff=${v.backoffFactor} interval=${v.growthInterval}`;
  return {
    name: `scalerUpdate ${v.label}`,
    dtypes: ['f32'],
    run: (ctx) =>
      session(ctx, 'scalerUpdate', text, (s) => {
        const scale = s.tensor([1], 'f32', [v.scale]);
        const growthTracker = s.tensor([1], 'i32', [v.growthTracker]);
        const foundInf = s.tensor([1], 'f32', [v.foundInf]);
        const growthFactor = Math.fround(v.growthFactor);
        const backoffFactor = Math.fround(v.backoffFactor);
        s.native.scalerUpdate({
          scale,
          growthTracker,
          foundInf,
          growthFactor,
          backoffFactor,
          growthInterval: v.growthInterval,
        });
        const ref = scalerUpdate({ ...v, scale: Math.fround(v.scale), growthFactor, backoffFactor });
        s.checkExact('scale', s.read(scale), [ref.scale]);
        s.checkExact('growthTracker', s.read(growthTracker), [ref.growthTracker]);
        s.checkExact('foundInf (read only)', s.read(foundInf), [v.foundInf]);
      }),
  };
}

const scalerCases: OpCase[] = [
  scalerCase({
    label: 'backs off on inf',
    scale: 65536,
    growthTracker: 5,
    foundInf: 1,
    growthFactor: 2,
    backoffFactor: 0.5,
    growthInterval: 2000,
  }),
  scalerCase({
    label: 'counts a clean step',
    scale: 1024,
    growthTracker: 0,
    foundInf: 0,
    growthFactor: 2,
    backoffFactor: 0.5,
    growthInterval: 3,
  }),
  scalerCase({
    label: 'grows at the interval',
    scale: 1024,
    growthTracker: 2,
    foundInf: 0,
    growthFactor: 2,
    backoffFactor: 0.5,
    growthInterval: 3,
  }),
  scalerCase({
    label: 'grows every step with interval 1',
    scale: 3,
    growthTracker: 0,
    foundInf: 0,
    growthFactor: 1.5,
    backoffFactor: 0.25,
    growthInterval: 1,
  }),
  scalerCase({
    label: 'never grows to inf',
    scale: 3e38,
    growthTracker: 9,
    foundInf: 0,
    growthFactor: 2,
    backoffFactor: 0.5,
    growthInterval: 10,
  }),
  scalerCase({
    label: 'custom backoff',
    scale: 3,
    growthTracker: 1,
    foundInf: 1,
    growthFactor: 2,
    backoffFactor: 0.125,
    growthInterval: 10,
  }),
];

function rejectCase(name: string, body: (s: Session) => void): OpCase {
  return { name: `reject ${name}`, dtypes: ['f32'], run: (ctx) => session(ctx, `reject ${name}`, '', body) };
}

function adamArgs(s: Session, overrides: Partial<RawAdamArgs> = {}): RawAdamArgs {
  const t = () => s.tensor([100], 'f32', new Float64Array(100));
  return {
    params: t(),
    grads: t(),
    expAvg: t(),
    expAvgSq: t(),
    groups: [{ lr: 0.1 }],
    segments: Int32Array.from([0, 100, 0]),
    step: 1,
    ...overrides,
  };
}

/** Inputs the optimizer ops must reject with a typed error. */
export const optimBadInputCases: OpCase[] = [
  rejectCase('adamwStep step 0, overlapping segments, missing moments', (s) => {
    s.expectThrow('step 0', INVALID, () => s.native.adamwStep(adamArgs(s, { step: 0 })));
    s.expectThrow('segments [0, +60) and [50, +50)', INVALID, () =>
      s.native.adamwStep(adamArgs(s, { segments: Int32Array.from([0, 60, 0, 50, 50, 0]) })),
    );
    s.expectThrow('expAvgSq of 99 elements', INVALID, () =>
      s.native.adamwStep(adamArgs(s, { expAvgSq: s.tensor([99], 'f32') })),
    );
    s.expectThrow('beta2 = 1', INVALID, () => s.native.adamwStep(adamArgs(s, { groups: [{ lr: 0.1, beta2: 1 }] })));
  }),
  rejectCase('lambStep segment naming a missing group, i32 foundInf', (s) => {
    s.expectThrow('group 1 of 1', INVALID, () =>
      s.native.lambStep(adamArgs(s, { segments: Int32Array.from([0, 10, 1]) })),
    );
    s.expectThrow('i32 foundInf', INVALID, () =>
      s.native.lambStep(adamArgs(s, { foundInf: s.tensor([1], 'i32', [0]) })),
    );
  }),
  rejectCase('gradNorm, unscaleAndCheck and clipGradNorm with bad tensors', (s) => {
    const grads = s.tensor([100], 'f32');
    s.expectThrow('gradNorm out of 2 elements', INVALID, () => s.native.gradNorm({ grads, out: s.tensor([2], 'f32') }));
    s.expectThrow('gradNorm segment outside the arena', INVALID, () =>
      s.native.gradNorm({ grads, out: s.tensor([1], 'f32'), segments: Int32Array.from([95, 10, 0]) }),
    );
    s.expectThrow('unscaleAndCheck bf16 grads', INVALID, () =>
      s.native.unscaleAndCheck({ grads: s.tensor([100], 'bf16'), invScale: 1, foundInf: s.tensor([1], 'f32') }),
    );
    s.expectThrow('clipGradNorm negative maxNorm', INVALID, () =>
      s.native.clipGradNorm({ grads, norm: s.tensor([1], 'f32', [1]), maxNorm: -1 }),
    );
  }),
  rejectCase('scalerUpdate f32 growthTracker, interval 0', (s) => {
    const f = (v: number) => s.tensor([1], 'f32', [v]);
    s.expectThrow('f32 growthTracker', INVALID, () =>
      s.native.scalerUpdate({
        scale: f(1),
        growthTracker: f(0),
        foundInf: f(0),
        growthFactor: 2,
        backoffFactor: 0.5,
        growthInterval: 10,
      }),
    );
    s.expectThrow('growthInterval 0', INVALID, () =>
      s.native.scalerUpdate({
        scale: f(1),
        growthTracker: s.tensor([1], 'i32', [0]),
        foundInf: f(0),
        growthFactor: 2,
        backoffFactor: 0.5,
        growthInterval: 0,
      }),
    );
  }),
];

/** AdamW, LAMB, gradNorm, unscaleAndCheck, clipGradNorm and scalerUpdate. */
export const optimCases: OpCase[] = [...adamCases, ...normCases, ...unscaleCases, ...clipCases, ...scalerCases];
