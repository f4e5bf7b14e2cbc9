/**
 * SyncBatchNorm's four ops, rank by rank, against the float64 batch norm of the whole batch (the
 * ranks' rows concatenated): the collectives between them are played by the case, which stacks
 * the ranks' statistics (the all-gather) and adds their backward sums (the all-reduce), each
 * rounded to f32 as the tensors carry them.
 * @packageDocumentation
 */
import type { DTypeName } from '../../lib/binding.js';
import {
  batchNormBackward,
  batchNormTrainingForward,
  syncBatchNormBackwardSums,
  syncBatchNormStats,
} from '../reference/index.js';
import { checkAccumulated, rms } from './conv-cases.js';
import { session, tolerance, type OpCase, type Session } from './harness.js';

const BOTH: DTypeName[] = ['f32', 'bf16'];
const MOMENTUM = Math.fround(0.1);
const EPS = Math.fround(1e-5);
/** Statistics and parameter gradients are f32 computed in double from the rounded inputs. */
const STATS_TOL = tolerance('f32');
const INVALID = 'ERR_RC_INVALID_ARGUMENT';

interface SyncVariant {
  /** Samples per rank (uneven sizes are allowed); every rank's x is [n, h, w, c]. */
  batches: number[];
  hwc: [number, number, number];
  residual: boolean;
  relu: boolean;
  /** Centre and spread of the channel means (default 2, 1) and the std range (default 0.5..2). */
  mean?: [number, number];
  std?: [number, number];
}

function label(v: SyncVariant): string {
  const spread = v.mean ? ` mean~${v.mean[0]} std~${v.std?.[0] ?? 0.5}` : '';
  return (
    `ranks[${v.batches.join(',')}]x[${v.hwc.join(',')}]` +
    `${v.residual ? ' +residual' : ''}${v.relu ? ' relu' : ''}${spread}`
  );
}

/** Every rank's inputs and the whole batch's float64 forward and backward. */
function world(s: Session, v: SyncVariant) {
  const [h, w, c] = v.hwc;
  const perSample = h * w * c;
  const total = v.batches.reduce((a, b) => a + b, 0) * perSample;
  const channelMean = s.rng.normals(c, v.mean?.[0] ?? 2, v.mean?.[1] ?? 1);
  const channelStd = s.rng.uniforms(c, v.std?.[0] ?? 0.5, v.std?.[1] ?? 2);
  const raw = new Float64Array(total);
  for (let i = 0; i < total; ++i) raw[i] = channelMean[i % c]! + channelStd[i % c]! * s.rng.normal();
  const x = s.q(raw);
  const gamma = s.q(s.rng.uniforms(c, 0.5, 1.5), 'f32');
  const beta = s.q(s.rng.normals(c, 0, 0.5), 'f32');
  const residual = v.residual ? s.q(s.rng.normals(total)) : undefined;
  const runningMean = s.q(s.rng.normals(c), 'f32');
  const runningVar = s.q(s.rng.uniforms(c, 0.5, 2), 'f32');
  const fwd = batchNormTrainingForward(x, {
    channels: c,
    gamma,
    beta,
    residual,
    runningMean,
    runningVar,
    relu: v.relu,
    momentum: MOMENTUM,
    eps: EPS,
  });
  // What the forward leaves for the backward, as stored: f32 statistics, y in the dtype.
  const saveMean = s.q(fwd.saveMean, 'f32');
  const saveInvStd = s.q(fwd.saveInvStd, 'f32');
  const y = s.q(fwd.y);
  const dy = s.q(s.rng.normals(total));
  const bwd = batchNormBackward(x, dy, { channels: c, gamma, saveMean, saveInvStd, y, relu: v.relu });
  let first = 0;
  const ranks = v.batches.map((n) => {
    const range = [first, first + n * perSample] as const;
    first += n * perSample;
    const cut = (a: Float64Array): Float64Array => a.subarray(...range);
    return { shape: [n, h, w, c], x: cut(x), y: cut(y), dy: cut(dy), residual: residual && cut(residual), cut };
  });
  return { c, x, gamma, beta, runningMean, runningVar, fwd, saveMean, saveInvStd, y, dy, bwd, ranks };
}

function statsCase(v: SyncVariant): OpCase {
  return {
    name: `syncbatchnorm.stats ${label(v)}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'syncbatchnorm.stats', label(v), (s) => {
        const wd = world(s, v);
        wd.ranks.forEach((r, i) => {
          const stats = s.poisoned([3, wd.c], 'f32');
          s.native.syncBatchNormStats({ x: s.tensor(r.shape, ctx.dtype, r.x), stats });
          const out = s.read(stats);
          const ref = syncBatchNormStats(r.x, wd.c);
          const row = (a: Float64Array, k: number): Float64Array => a.subarray(k * wd.c, (k + 1) * wd.c);
          s.checkExact(`rank ${i} count`, row(out, 0), row(ref, 0));
          s.check(`rank ${i} mean`, row(out, 1), row(ref, 1), STATS_TOL);
          s.check(`rank ${i} M2`, row(out, 2), row(ref, 2), STATS_TOL);
        });
      }),
  };
}

function forwardCase(v: SyncVariant): OpCase {
  return {
    name: `syncbatchnorm.forward ${label(v)}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'syncbatchnorm.forward', label(v), (s) => {
        const wd = world(s, v);
        // The all-gather: every rank's statistics, as f32, rank after rank.
        const gathered = s.q(
          wd.ranks.flatMap((r) => [...syncBatchNormStats(r.x, wd.c)]),
          'f32',
        );
        const stats = s.tensor([wd.ranks.length, 3, wd.c], 'f32', gathered);
        const gamma = s.tensor([wd.c], 'f32', wd.gamma);
        const beta = s.tensor([wd.c], 'f32', wd.beta);
        wd.ranks.forEach((r, i) => {
          const runningMean = s.tensor([wd.c], 'f32', wd.runningMean);
          const runningVar = s.tensor([wd.c], 'f32', wd.runningVar);
          const saveMean = s.poisoned([wd.c], 'f32');
          const saveInvStd = s.poisoned([wd.c], 'f32');
          const y = s.poisoned(r.shape);
          s.native.syncBatchNormForward({
            x: s.tensor(r.shape, ctx.dtype, r.x),
            gamma,
            beta,
            ...(r.residual ? { residual: s.tensor(r.shape, ctx.dtype, r.residual) } : {}),
            y,
            stats,
            runningMean,
            runningVar,
            saveMean,
            saveInvStd,
            relu: v.relu,
            momentum: MOMENTUM,
            eps: EPS,
          });
          s.check(`rank ${i} y (its rows of the whole batch's)`, s.read(y), r.cut(wd.fwd.y), tolerance(ctx.dtype));
          s.check(`rank ${i} saveMean (global)`, s.read(saveMean), wd.fwd.saveMean, STATS_TOL);
          s.check(`rank ${i} saveInvStd (global)`, s.read(saveInvStd), wd.fwd.saveInvStd, STATS_TOL);
          s.check(`rank ${i} runningMean`, s.read(runningMean), wd.fwd.runningMean, STATS_TOL);
          s.check(`rank ${i} runningVar (global, unbiased)`, s.read(runningVar), wd.fwd.runningVar, STATS_TOL);
        });
      }),
  };
}

function backwardReduceCase(v: SyncVariant): OpCase {
  return {
    name: `syncbatchnorm.backward.reduce ${label(v)}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'syncbatchnorm.backward.reduce', label(v), (s) => {
        const wd = world(s, v);
        const saveMean = s.tensor([wd.c], 'f32', wd.saveMean);
        const saveInvStd = s.tensor([wd.c], 'f32', wd.saveInvStd);
        wd.ranks.forEach((r, i) => {
          const ref = syncBatchNormBackwardSums(r.x, r.dy, {
            channels: wd.c,
            saveMean: wd.saveMean,
            saveInvStd: wd.saveInvStd,
            y: r.y,
            relu: v.relu,
          });
          const row = (a: Float64Array, k: number): Float64Array => a.subarray(k * wd.c, (k + 1) * wd.c);
          const gBefore = s.q(s.rng.normals(wd.c, 0, rms(row(ref, 1))), 'f32');
          const bBefore = s.q(s.rng.normals(wd.c, 0, rms(row(ref, 0))), 'f32');
          const dGamma = s.tensor([wd.c], 'f32', gBefore);
          const dBeta = s.tensor([wd.c], 'f32', bBefore);
          const sums = s.poisoned([3, wd.c], 'f32');
          s.native.syncBatchNormBackwardReduce({
            x: s.tensor(r.shape, ctx.dtype, r.x),
            ...(v.relu ? { y: s.tensor(r.shape, ctx.dtype, r.y) } : {}),
            dy: s.tensor(r.shape, ctx.dtype, r.dy),
            saveMean,
            saveInvStd,
            sums,
            dGamma,
            dBeta,
            relu: v.relu,
          });
          const out = s.read(sums);
          s.check(`rank ${i} sum(g)`, row(out, 0), row(ref, 0), STATS_TOL);
          s.check(`rank ${i} sum(g * xhat)`, row(out, 1), row(ref, 1), STATS_TOL);
          s.checkExact(`rank ${i} count`, row(out, 2), row(ref, 2));
          checkAccumulated(s, `rank ${i} dGamma (local)`, s.read(dGamma), gBefore, row(ref, 1), STATS_TOL);
          checkAccumulated(s, `rank ${i} dBeta (local)`, s.read(dBeta), bBefore, row(ref, 0), STATS_TOL);
        });
      }),
  };
}

function backwardElementwiseCase(v: SyncVariant): OpCase {
  return {
    name: `syncbatchnorm.backward.elementwise ${label(v)}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'syncbatchnorm.backward.elementwise', label(v), (s) => {
        const wd = world(s, v);
        // The all-reduce: every rank's sums (as f32) added, then stored as f32.
        const total = new Float64Array(3 * wd.c);
        for (const r of wd.ranks) {
          const part = s.q(
            syncBatchNormBackwardSums(r.x, r.dy, {
              channels: wd.c,
              saveMean: wd.saveMean,
              saveInvStd: wd.saveInvStd,
              y: r.y,
              relu: v.relu,
            }),
            'f32',
          );
          part.forEach((value, k) => (total[k]! += value));
        }
        const sums = s.tensor([3, wd.c], 'f32', s.q(total, 'f32'));
        const gamma = s.tensor([wd.c], 'f32', wd.gamma);
        const saveMean = s.tensor([wd.c], 'f32', wd.saveMean);
        const saveInvStd = s.tensor([wd.c], 'f32', wd.saveInvStd);
        wd.ranks.forEach((r, i) => {
          const dx = s.poisoned(r.shape);
          const dResidual = v.residual ? s.poisoned(r.shape) : undefined;
          s.native.syncBatchNormBackwardElementwise({
            x: s.tensor(r.shape, ctx.dtype, r.x),
            ...(v.relu ? { y: s.tensor(r.shape, ctx.dtype, r.y) } : {}),
            dy: s.tensor(r.shape, ctx.dtype, r.dy),
            gamma,
            saveMean,
            saveInvStd,
            sums,
            dx,
            ...(dResidual ? { dResidual } : {}),
            relu: v.relu,
          });
          s.check(`rank ${i} dx (its rows of the whole batch's)`, s.read(dx), r.cut(wd.bwd.dx), tolerance(ctx.dtype));
          if (dResidual) {
            s.check(`rank ${i} dResidual`, s.read(dResidual), r.cut(wd.bwd.dResidual), tolerance(ctx.dtype));
          }
        });
      }),
  };
}

function rejectCase(name: string, body: (s: Session) => void): OpCase {
  return { name: `reject ${name}`, dtypes: ['f32'], run: (ctx) => session(ctx, `reject ${name}`, '', body) };
}

const VARIANTS: SyncVariant[] = [
  { batches: [2, 2], hwc: [3, 3, 8], residual: false, relu: false },
  // Uneven ranks, one of a single sample; many rows per rank (several reduction blocks).
  { batches: [1, 3, 2], hwc: [7, 7, 8], residual: false, relu: true },
  { batches: [2, 1], hwc: [4, 4, 4], residual: true, relu: false },
  { batches: [3, 2], hwc: [5, 5, 16], residual: true, relu: true },
  // |mean| / std ≈ 50: merging per-rank sums of squares in f32 would cancel badly.
  { batches: [2, 3], hwc: [6, 6, 4], residual: false, relu: false, mean: [25, 1], std: [0.4, 0.6] },
];

/** The four ops over several rank splits, and their rejected inputs. */
export const syncBatchNormCases: OpCase[] = [
  ...VARIANTS.map(statsCase),
  ...VARIANTS.map(forwardCase),
  ...VARIANTS.map(backwardReduceCase),
  ...VARIANTS.map(backwardElementwiseCase),
];

/** Statistics tensors of the wrong shape must be refused, naming the tensor. */
export const syncBatchNormBadInputCases: OpCase[] = [
  rejectCase('syncbatchnorm.stats stats of the wrong shape', (s) => {
    s.expectThrow('stats [2, 4] for 4 channels', INVALID, () =>
      s.native.syncBatchNormStats({ x: s.tensor([1, 2, 2, 4], 'f32'), stats: s.tensor([2, 4], 'f32') }),
    );
  }),
  rejectCase('syncbatchnorm.forward stats of another channel count', (s) => {
    const c4 = (): ReturnType<Session['tensor']> => s.tensor([4], 'f32', [1, 1, 1, 1]);
    s.expectThrow('stats [2, 3, 5] for 4 channels', INVALID, () =>
      s.native.syncBatchNormForward({
        x: s.tensor([1, 2, 2, 4], 'f32'),
        gamma: c4(),
        beta: c4(),
        y: s.tensor([1, 2, 2, 4], 'f32'),
        stats: s.tensor([2, 3, 5], 'f32'),
        runningMean: c4(),
        runningVar: c4(),
        saveMean: c4(),
        saveInvStd: c4(),
      }),
    );
  }),
  rejectCase('syncbatchnorm.backward.elementwise sums of the wrong shape', (s) => {
    const c4 = (): ReturnType<Session['tensor']> => s.tensor([4], 'f32', [1, 1, 1, 1]);
    s.expectThrow('sums [2, 4]', INVALID, () =>
      s.native.syncBatchNormBackwardElementwise({
        x: s.tensor([1, 2, 2, 4], 'f32'),
        dy: s.tensor([1, 2, 2, 4], 'f32'),
        gamma: c4(),
        saveMean: c4(),
        saveInvStd: c4(),
        sums: s.tensor([2, 4], 'f32'),
        dx: s.tensor([1, 2, 2, 4], 'f32'),
      }),
    );
  }),
];
