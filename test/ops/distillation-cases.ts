/**
 * Cases for the knowledge-distillation loss: loss and gradient against the float64 reference for
 * several temperatures, mixing weights and label smoothings; alpha = 0 against the cross-entropy
 * op bit for bit; the arguments it must refuse; and the reference against finite differences.
 * @packageDocumentation
 */
import type { DTypeName } from '../../lib/binding.js';
import { distillationLoss, numericGradient, relError, Rng } from '../reference/index.js';
import { fmtShape, session, tolerance, type GradientCheck, type OpCase, type Session } from './harness.js';

const ALL: DTypeName[] = ['f32', 'bf16', 'f16'];
const INVALID = 'ERR_RC_INVALID_ARGUMENT';

interface KdVariant {
  n: number;
  k: number;
  temperature: number;
  alpha: number;
  labelSmoothing: number;
  gradScale: number;
  /** Standard deviation of the teacher's logits (large: a confident teacher whose softmax underflows). */
  teacherSpread?: number;
  withGrad?: boolean;
}

function describe(v: KdVariant): string {
  return (
    `logits${fmtShape([v.n, v.k])} T=${v.temperature} alpha=${v.alpha} smoothing=${v.labelSmoothing} ` +
    `gradScale=${v.gradScale}${v.teacherSpread ? ` teacher-spread=${v.teacherSpread}` : ''}${v.withGrad === false ? ' loss-only' : ''}`
  );
}

function kdCase(v: KdVariant): OpCase {
  const text = describe(v);
  return {
    name: `distillationLoss ${text}`,
    dtypes: ALL,
    run: (ctx) =>
      session(ctx, 'distillationLoss', text, (s) => {
        const logits = s.q(s.rng.normals(v.n * v.k, 0, 3));
        const teacher = s.q(s.rng.normals(v.n * v.k, 0, v.teacherSpread ?? 3));
        const labels = Array.from({ length: v.n }, () => s.rng.int(0, v.k));
        const loss = s.poisoned([1], 'f32');
        const dLogits = v.withGrad === false ? undefined : s.poisoned([v.n, v.k]);
        s.native.distillationLoss({
          logits: s.tensor([v.n, v.k], ctx.dtype, logits),
          teacherLogits: s.tensor([v.n, v.k], ctx.dtype, teacher),
          labels: s.tensor([v.n], 'i32', labels),
          loss,
          ...(dLogits ? { dLogits } : {}),
          temperature: v.temperature,
          alpha: v.alpha,
          labelSmoothing: v.labelSmoothing,
          gradScale: v.gradScale,
        });
        // The op receives its scalars as f32.
        const ref = distillationLoss(logits, teacher, labels, {
          n: v.n,
          k: v.k,
          temperature: Math.fround(v.temperature),
          alpha: Math.fround(v.alpha),
          labelSmoothing: Math.fround(v.labelSmoothing),
          gradScale: Math.fround(v.gradScale),
        });
        // The loss is f32, computed from the stored logits: f32 tolerance for any dtype.
        s.check('loss', s.read(loss), [ref.loss], tolerance('f32'));
        if (dLogits) s.check('dLogits', s.read(dLogits), ref.dLogits, tolerance(ctx.dtype));
      }),
  };
}

/** alpha = 0 must be the cross-entropy op exactly: same loss bits, same gradient bits. */
function alphaZeroCase(n: number, k: number, labelSmoothing: number): OpCase {
  const text = `logits${fmtShape([n, k])} smoothing=${labelSmoothing}`;
  return {
    name: `distillationLoss alpha=0 equals crossEntropy ${text}`,
    dtypes: ['f32', 'bf16'],
    run: (ctx) =>
      session(ctx, 'distillationLoss alpha=0', text, (s) => {
        const logits = s.tensor([n, k], ctx.dtype, s.q(s.rng.normals(n * k, 0, 3)));
        const teacherLogits = s.tensor([n, k], ctx.dtype, s.q(s.rng.normals(n * k, 0, 3)));
        const labels = s.tensor(
          [n],
          'i32',
          Array.from({ length: n }, () => s.rng.int(0, k)),
        );
        const kd = { loss: s.poisoned([1], 'f32'), dLogits: s.poisoned([n, k]) };
        const ce = { loss: s.poisoned([1], 'f32'), dLogits: s.poisoned([n, k]) };
        s.native.distillationLoss({
          logits,
          teacherLogits,
          labels,
          ...kd,
          temperature: 4,
          alpha: 0,
          labelSmoothing,
          gradScale: 2,
        });
        s.native.crossEntropy({ logits, labels, ...ce, labelSmoothing, gradScale: 2 });
        s.checkExact('loss', s.read(kd.loss), s.read(ce.loss));
        s.checkExact('dLogits', s.read(kd.dLogits), s.read(ce.dLogits));
      }),
  };
}

/** Loss and gradient of the distillation op on the reference, several settings and dtypes. */
export const distillationCases: OpCase[] = [
  kdCase({ n: 8, k: 10, temperature: 4, alpha: 0.9, labelSmoothing: 0, gradScale: 1 }),
  kdCase({ n: 5, k: 37, temperature: 2, alpha: 0.5, labelSmoothing: 0.1, gradScale: 1024 }),
  kdCase({ n: 1, k: 1000, temperature: 1, alpha: 0.3, labelSmoothing: 0.1, gradScale: 0.5 }),
  // More classes than a block has threads, and alpha = 1 (the labels play no part).
  kdCase({ n: 3, k: 1500, temperature: 8, alpha: 1, labelSmoothing: 0, gradScale: 1 }),
  // More rows than the CUDA grid has blocks: blocks stride over the rows.
  kdCase({ n: 1100, k: 4, temperature: 3, alpha: 0.7, labelSmoothing: 0.05, gradScale: 1 }),
  // A confident teacher at T = 1: most of its probabilities underflow to 0 and add nothing.
  kdCase({ n: 6, k: 20, temperature: 1, alpha: 0.5, labelSmoothing: 0, gradScale: 1, teacherSpread: 40 }),
  kdCase({ n: 16, k: 10, temperature: 5, alpha: 0.5, labelSmoothing: 0.1, gradScale: 1, withGrad: false }),
  alphaZeroCase(8, 10, 0),
  alphaZeroCase(5, 37, 0.1),
];

function rejectCase(name: string, body: (s: Session) => void): OpCase {
  return { name: `reject ${name}`, dtypes: ['f32'], run: (ctx) => session(ctx, `reject ${name}`, '', body) };
}

type KdArgs = Parameters<Session['native']['distillationLoss']>[0];

function kdArgs(s: Session, overrides: Partial<KdArgs> = {}): KdArgs {
  return {
    logits: s.tensor([4, 10], 'f32', new Float64Array(40)),
    teacherLogits: s.tensor([4, 10], 'f32', new Float64Array(40)),
    labels: s.tensor([4], 'i32', [0, 3, 5, 9]),
    loss: s.tensor([1], 'f32'),
    temperature: 2,
    alpha: 0.5,
    ...overrides,
  };
}

/** Arguments the distillation op must refuse with a typed error. */
export const distillationBadInputCases: OpCase[] = [
  rejectCase('distillationLoss temperature and alpha out of range', (s) => {
    for (const temperature of [0, -1, Infinity, NaN]) {
      s.expectThrow(`temperature ${temperature}`, INVALID, () => s.native.distillationLoss(kdArgs(s, { temperature })));
    }
    for (const alpha of [-0.1, 1.5, NaN]) {
      s.expectThrow(`alpha ${alpha}`, INVALID, () => s.native.distillationLoss(kdArgs(s, { alpha })));
    }
    s.expectThrow('labelSmoothing 2', INVALID, () => s.native.distillationLoss(kdArgs(s, { labelSmoothing: 2 })));
  }),
  rejectCase('distillationLoss teacher logits of another shape or dtype', (s) => {
    s.expectThrow('teacher [4,9] for student [4,10]', INVALID, () =>
      s.native.distillationLoss(kdArgs(s, { teacherLogits: s.tensor([4, 9], 'f32') })),
    );
    s.expectThrow('bf16 teacher for an f32 student', INVALID, () =>
      s.native.distillationLoss(kdArgs(s, { teacherLogits: s.tensor([4, 10], 'bf16') })),
    );
  }),
  rejectCase('distillationLoss labels out of range', (s) => {
    const loss = s.tensor([1], 'f32');
    s.expectThrow('label 10 with 10 classes', INVALID, () => {
      s.native.distillationLoss(kdArgs(s, { labels: s.tensor([4], 'i32', [0, 10, 2, 3]), loss }));
      s.read(loss);
    });
    s.read(loss);
  }),
];

/** Central differences are O(h²) accurate on this smooth loss; 1e-6 catches any wrong term. */
const GRAD_TOL = 1e-6;

/** The float64 reference's gradient against finite differences of its loss. */
export const distillationGradientChecks: GradientCheck[] = [
  { temperature: 1, alpha: 0.5, labelSmoothing: 0, gradScale: 1 },
  { temperature: 4, alpha: 0.9, labelSmoothing: 0.1, gradScale: 8 },
  { temperature: 0.5, alpha: 1, labelSmoothing: 0, gradScale: 1 },
  { temperature: 3, alpha: 0, labelSmoothing: 0.2, gradScale: 1 },
].map((o): GradientCheck => ({
  name: `distillationLoss T=${o.temperature} alpha=${o.alpha} smoothing=${o.labelSmoothing}`,
  run: ({ seed }) => {
    const rng = new Rng(seed);
    const n = 3;
    const k = 5;
    const logits = rng.normals(n * k, 0, 2);
    const teacher = rng.normals(n * k, 0, 2);
    const labels = Array.from({ length: n }, () => rng.int(0, k));
    const analytic = distillationLoss(logits, teacher, labels, { n, k, ...o }).dLogits.map((v) => v / o.gradScale);
    const numeric = numericGradient(logits, () => distillationLoss(logits, teacher, labels, { n, k, ...o }).loss);
    const err = relError(analytic, numeric);
    if (!(err <= GRAD_TOL)) {
      throw new Error(
        `gradient check distillationLoss T=${o.temperature} seed=${seed}: the reference gradient differs from ` +
          `finite differences by ${err.toExponential(3)} (tolerance ${GRAD_TOL}) [replay: RESNET_TEST_SEED=${seed}]`,
      );
    }
  },
}));
