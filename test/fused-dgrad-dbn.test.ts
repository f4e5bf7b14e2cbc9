/**
 * The backward of the `conv-bn` prologue on CUDA (native/cuda/fused_dgrad.{cc,cu},
 * fused_conv_wgrad.cc), on the emulated device, in bf16 and f16. convDgradDbn (one cuDNN graph:
 * convolution backward data, ReLU backward on the recomputed batch norm output, the batch norm's
 * backward weights) and batchNormBackwardApply: against a host reference of the graph and against
 * the unfused composition (the convolution's backward data through Conv2dPlan, then
 * batchNormBackward with the ReLU of batchNormForward's output). convWgradSbr (the filter gradient
 * with the scale-bias-ReLU prologue): against a host reference and Conv2dPlan's backward filter of
 * the stored activation. Then a CUDA graph's capture and replay of the three ops, and the
 * refusals: bad arguments, each named, and a backend without the path. Runs in the
 * 'cuda-emulator-cases' project on the emulated device (test/cuda-emulator); without a usable CUDA
 * backend the CUDA cases are skipped.
 */
import { describe, expect, it } from 'vitest';
import { CudaGraph, Tensor, listBackends } from '../lib/index.js';
import { addon } from '../lib/binding.js';
import { lcgValues } from './helpers/fused-runs.js';

const cuda = listBackends().find((b) => b.name === 'cuda');
const onlyCuda = process.env.RESNET_TEST_BACKENDS === 'cuda';
const reason = cuda?.available ? undefined : (cuda?.reason ?? 'no CUDA backend');
const DEVICE = 'cuda:0';

// The forward was y [N, P, Q, K] = conv(relu(x * scale + shift), w), x [N, H, W, C], 3x3 filters,
// stride 2, pad 1.
const N = 2;
const H = 6;
const W = 6;
const C = 8;
const K = 16;
const P = 3;
const ROWS = N * H * W;

/** Rounds to bf16 or f16 as the device stores them (round to nearest even). */
function roundTo(dtype: 'bf16' | 'f16', v: ArrayLike<number>): Float32Array {
  const t = Tensor.from(Float32Array.from(v), [v.length], { dtype });
  try {
    return t.toFloat32Array();
  } finally {
    t.dispose();
  }
}

/** Element `i` of `v` (which must have it). */
function at(v: ArrayLike<number>, i: number): number {
  const e = v[i];
  if (e === undefined) throw new RangeError(`index ${i} outside ${v.length} elements`);
  return e;
}

/** The largest |a - b| over the largest |b|. */
function relativeMaxError(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let err = 0;
  let scale = 0;
  for (let i = 0; i < b.length; i++) {
    const want = at(b, i);
    err = Math.max(err, Math.abs((a[i] ?? Number.NaN) - want));
    scale = Math.max(scale, Math.abs(want));
  }
  return err / scale;
}

/** dx [N, H, W, C] = the convolution's backward data of dy with wt [K, 3, 3, C], in double precision. */
function backwardDataHost(dy: Float32Array, wt: Float32Array): Float64Array {
  const dx = new Float64Array(ROWS * C);
  for (let n = 0; n < N; n++) {
    for (let p = 0; p < P; p++) {
      for (let q = 0; q < P; q++) {
        for (let k = 0; k < K; k++) {
          const g = at(dy, ((n * P + p) * P + q) * K + k);
          for (let r = 0; r < 3; r++) {
            const h = p * 2 - 1 + r;
            if (h < 0 || h >= H) continue;
            for (let s = 0; s < 3; s++) {
              const w = q * 2 - 1 + s;
              if (w < 0 || w >= W) continue;
              for (let c = 0; c < C; c++) {
                const i = ((n * H + h) * W + w) * C + c;
                dx[i] = at(dx, i) + g * at(wt, ((k * 3 + r) * 3 + s) * C + c);
              }
            }
          }
        }
      }
    }
  }
  return dx;
}

/** dw [K, 3, 3, C] = the convolution's backward filter of x [N, H, W, C] with dy, in double precision. */
function backwardFilterHost(x: ArrayLike<number>, dy: Float32Array): Float64Array {
  const dw = new Float64Array(K * 9 * C);
  for (let n = 0; n < N; n++) {
    for (let p = 0; p < P; p++) {
      for (let q = 0; q < P; q++) {
        for (let k = 0; k < K; k++) {
          const g = at(dy, ((n * P + p) * P + q) * K + k);
          for (let r = 0; r < 3; r++) {
            const h = p * 2 - 1 + r;
            if (h < 0 || h >= H) continue;
            for (let s = 0; s < 3; s++) {
              const w = q * 2 - 1 + s;
              if (w < 0 || w >= W) continue;
              for (let c = 0; c < C; c++) {
                const i = ((k * 3 + r) * 3 + s) * C + c;
                dw[i] = at(dw, i) + g * at(x, ((n * H + h) * W + w) * C + c);
              }
            }
          }
        }
      }
    }
  }
  return dw;
}

/** The inputs of one case, on the device, and their host copies. */
function problem(dtype: 'bf16' | 'f16') {
  const opts = { device: DEVICE, dtype };
  const f32 = { device: DEVICE };
  const xHost = roundTo(dtype, lcgValues(ROWS * C, 11));
  const dyHost = roundTo(dtype, lcgValues(N * P * P * K, 12));
  const wHost = lcgValues(K * 9 * C, 13).map((v) => v * 0.3);
  const gammaHost = lcgValues(C, 14).map((v) => 1 + 0.5 * v);
  const betaHost = lcgValues(C, 15).map((v) => 0.2 * v);
  return {
    opts,
    f32,
    xHost,
    dyHost,
    wHost,
    gammaHost,
    betaHost,
    x: Tensor.from(xHost, [N, H, W, C], opts),
    dy: Tensor.from(dyHost, [N, P, P, K], opts),
    w: Tensor.from(wHost, [K, 3, 3, C], f32),
    gamma: Tensor.from(gammaHost, [C], f32),
    beta: Tensor.from(betaHost, [C], f32),
  };
}

/** The unfused plan of the problem's convolution (3x3, stride 2, padding 1), in `opts`' dtype. */
function convPlan(opts: { device: string; dtype: 'bf16' | 'f16' }) {
  return new (addon().Conv2dPlan)({
    ...opts,
    n: N,
    h: H,
    w: W,
    c: C,
    k: K,
    kernelH: 3,
    kernelW: 3,
    strideH: 2,
    strideW: 2,
    padH: 1,
    padW: 1,
  });
}

/**
 * The forward's batch norm over the problem's x (training, ReLU) and what the prologue takes from
 * it: a = relu(bn(x)), the saved statistics, scale = gamma * invStd and shift = beta - mean * scale,
 * on the device and on the host. Disposing it frees the device tensors.
 */
function bnForward(pr: ReturnType<typeof problem>) {
  const { opts, f32 } = pr;
  const a = Tensor.zeros([N, H, W, C], opts);
  using rm = Tensor.zeros([C], f32);
  using rv = Tensor.from(new Float32Array(C).fill(1), [C], f32);
  const saveMean = Tensor.zeros([C], f32);
  const saveInvStd = Tensor.zeros([C], f32);
  addon().batchNormForward({
    x: pr.x.raw,
    gamma: pr.gamma.raw,
    beta: pr.beta.raw,
    y: a.raw,
    runningMean: rm.raw,
    runningVar: rv.raw,
    saveMean: saveMean.raw,
    saveInvStd: saveInvStd.raw,
    training: true,
    relu: true,
  });
  const meanHost = saveMean.toFloat32Array();
  const invStdHost = saveInvStd.toFloat32Array();
  const scaleHost = Float32Array.from(pr.gammaHost, (g, c) => g * at(invStdHost, c));
  const shiftHost = Float32Array.from(pr.betaHost, (b, c) => b - at(meanHost, c) * at(scaleHost, c));
  const scale = Tensor.from(scaleHost, [C], f32);
  const shift = Tensor.from(shiftHost, [C], f32);
  return {
    a,
    saveMean,
    saveInvStd,
    scale,
    shift,
    meanHost,
    invStdHost,
    scaleHost,
    shiftHost,
    [Symbol.dispose]() {
      for (const t of [a, saveMean, saveInvStd, scale, shift]) t.dispose();
    },
  };
}

describe('the conv-bn prologue backward without CUDA', () => {
  it.skipIf(onlyCuda)('the CPU backend refuses the fused ops, naming the device they need', () => {
    using z = Tensor.zeros([1, 2, 2, 8], { dtype: 'bf16' });
    using x = Tensor.zeros([1, 2, 2, 8], { dtype: 'bf16' });
    using dy = Tensor.zeros([1, 2, 2, 8], { dtype: 'bf16' });
    using w = Tensor.zeros([8, 1, 1, 8]);
    using v = Tensor.zeros([8]);
    expect(() =>
      addon().batchNormBackwardApply({ dz: z.raw, x: x.raw, eqDz: v.raw, eqX: v.raw, eqBias: v.raw, dx: z.raw }),
    ).toThrow(/needs a CUDA device/);
    const per = { scale: v.raw, shift: v.raw, gamma: v.raw, saveMean: v.raw, saveInvStd: v.raw };
    const grads = { dGamma: v.raw, dBeta: v.raw, eqDz: v.raw, eqX: v.raw, eqBias: v.raw };
    expect(() => addon().convDgradDbn({ dy: dy.raw, weight: w.raw, x: x.raw, dz: z.raw, ...per, ...grads })).toThrow(
      /needs a CUDA device/,
    );
    expect(() => addon().convWgradSbr({ x: x.raw, dy: dy.raw, scale: v.raw, shift: v.raw, dWeight: w.raw })).toThrow(
      /needs a CUDA device/,
    );
  });
});

describe.skipIf(reason !== undefined)(
  `conv-bn prologue backward on CUDA${reason ? ` (skipped: ${reason})` : ''}`,
  () => {
    for (const dtype of ['bf16', 'f16'] as const) {
      it(`convDgradDbn + batchNormBackwardApply against the host graph and the unfused path (${dtype})`, () => {
        const pr = problem(dtype);
        const { opts, f32 } = pr;
        using x = pr.x;
        using dy = pr.dy;
        using w = pr.w;
        using gamma = pr.gamma;
        using _beta = pr.beta; // read through pr by bnForward

        // The forward's batch norm (training, ReLU): its statistics, and a = relu(bn(x)).
        using bn = bnForward(pr);
        const { a, saveMean, saveInvStd, scale, shift, meanHost, invStdHost, scaleHost, shiftHost } = bn;
        // dGamma and dBeta accumulate: both paths start from the same non-zero values.
        const dGamma0 = lcgValues(C, 16);
        const dBeta0 = lcgValues(C, 17);

        // Unfused: the backward data of the convolution, then the batch norm's backward through the ReLU.
        const plan = convPlan(opts);
        using dA = Tensor.zeros([N, H, W, C], opts);
        using dx = Tensor.zeros([N, H, W, C], opts);
        using dGamma = Tensor.from(dGamma0, [C], f32);
        using dBeta = Tensor.from(dBeta0, [C], f32);
        plan.backwardData({ dy: dy.raw, weight: w.raw, dx: dA.raw });
        plan.dispose();
        addon().batchNormBackward({
          x: x.raw,
          y: a.raw,
          dy: dA.raw,
          gamma: gamma.raw,
          saveMean: saveMean.raw,
          saveInvStd: saveInvStd.raw,
          dx: dx.raw,
          dGamma: dGamma.raw,
          dBeta: dBeta.raw,
          relu: true,
        });

        // Fused: the graph, then dx in place of dz.
        using dz = Tensor.zeros([N, H, W, C], opts);
        using fdGamma = Tensor.from(dGamma0, [C], f32);
        using fdBeta = Tensor.from(dBeta0, [C], f32);
        using eqDz = Tensor.zeros([C], f32);
        using eqX = Tensor.zeros([C], f32);
        using eqBias = Tensor.zeros([C], f32);
        addon().convDgradDbn({
          dy: dy.raw,
          weight: w.raw,
          x: x.raw,
          scale: scale.raw,
          shift: shift.raw,
          gamma: gamma.raw,
          saveMean: saveMean.raw,
          saveInvStd: saveInvStd.raw,
          dz: dz.raw,
          dGamma: fdGamma.raw,
          dBeta: fdBeta.raw,
          eqDz: eqDz.raw,
          eqX: eqX.raw,
          eqBias: eqBias.raw,
          strideH: 2,
          strideW: 2,
          padH: 1,
          padW: 1,
        });
        const dzHost = dz.toFloat32Array();
        const eqDzHost = eqDz.toFloat32Array();
        const eqXHost = eqX.toFloat32Array();
        const eqBiasHost = eqBias.toFloat32Array();
        addon().batchNormBackwardApply({
          dz: dz.raw,
          x: x.raw,
          eqDz: eqDz.raw,
          eqX: eqX.raw,
          eqBias: eqBias.raw,
          dx: dz.raw,
        });

        // dz against the host graph: the backward data of bf16/f16 weights in double, rounded to the
        // f32 virtual tensor, masked where the recomputed f32 (x - mean) * invStd * gamma + beta is not
        // positive (beta formed on the device as shift + mean * scale),
        // stored in bf16/f16 (the emulator sums in another order, which may move an f32 rounding;
        // measured: equal).
        const dAHost = backwardDataHost(pr.dyHost, roundTo(dtype, pr.wHost));
        const betaDevice = Float32Array.from(shiftHost, (v, c) => v + Math.fround(at(meanHost, c) * at(scaleHost, c)));
        const dzWant = roundTo(
          dtype,
          Array.from(dAHost, (v, i) => {
            const c = i % C;
            const centered = Math.fround(at(pr.xHost, i) - at(meanHost, c));
            const normalized = Math.fround(Math.fround(centered * at(invStdHost, c)) * at(pr.gammaHost, c));
            return Math.fround(normalized + at(betaDevice, c)) > 0 ? Math.fround(v) : 0;
          }),
        );
        expect(relativeMaxError(dzHost, dzWant)).toBeLessThan(1e-6);
        expect(dzHost.some((v) => v === 0) && dzHost.some((v) => v !== 0)).toBe(true);

        // The coefficients and the accumulated gradients against the algebra of batchNormBackward, in
        // double precision over the stored dz (f32 results: measured within 6e-8).
        const sumDz = new Float64Array(C);
        const sumDzXc = new Float64Array(C);
        dzHost.forEach((g, i) => {
          const c = i % C;
          sumDz[c] = at(sumDz, c) + g;
          sumDzXc[c] = at(sumDzXc, c) + g * (at(pr.xHost, i) - at(meanHost, c));
        });
        const want = { eqDz: [] as number[], eqX: [] as number[], eqBias: [] as number[], dG: [] as number[] };
        const wantDBeta: number[] = [];
        for (let c = 0; c < C; c++) {
          const is = at(invStdHost, c);
          const g = at(pr.gammaHost, c);
          const ex = (-g * is * is * is * at(sumDzXc, c)) / ROWS;
          want.eqDz.push(g * is);
          want.eqX.push(ex);
          want.eqBias.push(-ex * at(meanHost, c) - (g * is * at(sumDz, c)) / ROWS);
          want.dG.push(at(dGamma0, c) + at(sumDzXc, c) * is);
          wantDBeta.push(at(dBeta0, c) + at(sumDz, c));
        }
        expect(relativeMaxError(eqDzHost, want.eqDz)).toBeLessThan(1e-6);
        expect(relativeMaxError(eqXHost, want.eqX)).toBeLessThan(1e-5);
        expect(relativeMaxError(eqBiasHost, want.eqBias)).toBeLessThan(1e-5);
        expect(relativeMaxError(fdGamma.toFloat32Array(), want.dG)).toBeLessThan(1e-5);
        expect(relativeMaxError(fdBeta.toFloat32Array(), wantDBeta)).toBeLessThan(1e-5);

        // dx = eqDz * dz + eqX * x + eqBias in f32, stored in bf16/f16: the apply kernel's own
        // arithmetic, within one unit in the last place of the largest value (it may contract to
        // fused multiply-adds, which may move a rounding of bf16/f16; measured: equal).
        const dxApplied = dz.toFloat32Array();
        const dxWant = roundTo(
          dtype,
          Array.from(dzHost, (g, i) => {
            const c = i % C;
            return at(eqDzHost, c) * g + at(eqXHost, c) * at(pr.xHost, i) + at(eqBiasHost, c);
          }),
        );
        const ulp = dtype === 'bf16' ? 2 ** -8 : 2 ** -11;
        expect(relativeMaxError(dxApplied, dxWant)).toBeLessThanOrEqual(ulp);

        // Against the unfused path, which rounds dA to bf16/f16 before the ReLU (the graph rounds it
        // to f32, then dz to bf16/f16) and sums in its own order: dx within two roundings of the
        // largest value (measured: equal in both dtypes), dGamma and dBeta as f32 sums of the same
        // terms (measured: 1.2e-7 and 0 in bf16, 7.7e-8 and 0 in f16).
        expect(relativeMaxError(dxApplied, dx.toFloat32Array())).toBeLessThanOrEqual(2 * ulp);
        expect(relativeMaxError(fdGamma.toFloat32Array(), dGamma.toFloat32Array())).toBeLessThan(1e-5);
        expect(relativeMaxError(fdBeta.toFloat32Array(), dBeta.toFloat32Array())).toBeLessThan(1e-5);
      });
    }

    for (const dtype of ['bf16', 'f16'] as const) {
      it(`convWgradSbr against the host graph and the unfused path (${dtype})`, () => {
        const pr = problem(dtype);
        const { opts, f32 } = pr;
        pr.w.dispose(); // the filter gradient does not read the weights
        using x = pr.x;
        using dy = pr.dy;
        using _gamma = pr.gamma; // read through pr by bnForward
        using _beta = pr.beta;
        using bn = bnForward(pr);
        const { a, scale, shift, scaleHost, shiftHost } = bn;
        // The f32 master gradient accumulates: both paths start from the same values.
        const dW0 = lcgValues(K * 9 * C, 18).map((v) => 0.1 * v);

        // Unfused: the backward filter of the stored activation relu(bn(x)).
        const plan = convPlan(opts);
        using dW = Tensor.from(dW0, [K, 3, 3, C], f32);
        plan.backwardWeights({ x: a.raw, dy: dy.raw, dWeight: dW.raw });
        plan.dispose();

        using fdW = Tensor.from(dW0, [K, 3, 3, C], f32);
        addon().convWgradSbr({
          x: x.raw,
          dy: dy.raw,
          scale: scale.raw,
          shift: shift.raw,
          dWeight: fdW.raw,
          strideH: 2,
          strideW: 2,
          padH: 1,
          padW: 1,
        });
        const got = fdW.toFloat32Array();

        // The host graph: the activation in f32 (virtual tensors), the backward filter in double,
        // stored in bf16/f16 and added to the f32 gradient (measured: equal).
        const activated = Array.from(pr.xHost, (v, i) =>
          Math.max(0, Math.fround(Math.fround(v * at(scaleHost, i % C)) + at(shiftHost, i % C))),
        );
        const dwLow = roundTo(dtype, backwardFilterHost(activated, pr.dyHost));
        const want = Array.from(dwLow, (v, i) => Math.fround(v + at(dW0, i)));
        expect(relativeMaxError(got, want)).toBeLessThan(1e-6);
        // Against the unfused path, which rounds the activation to bf16/f16 before the convolution
        // (measured: 3.1e-3 in bf16, 7.7e-4 in f16, about one rounding of the activation).
        expect(relativeMaxError(got, dW.toFloat32Array())).toBeLessThan(dtype === 'bf16' ? 1e-2 : 2e-3);
      });
    }

    it('batchNormBackwardApply on a channel count without 16-byte packs (6), into a separate dx', () => {
      const opts = { device: DEVICE, dtype: 'f16' as const };
      const f32 = { device: DEVICE };
      const c6 = 6;
      const dzHost = roundTo('f16', lcgValues(5 * c6, 31));
      const xHost = roundTo('f16', lcgValues(5 * c6, 32));
      const ca = lcgValues(c6, 33);
      const cb = lcgValues(c6, 34);
      const ck = lcgValues(c6, 35);
      using dz = Tensor.from(dzHost, [5, c6], opts);
      using x = Tensor.from(xHost, [5, c6], opts);
      using dx = Tensor.zeros([5, c6], opts);
      using eqDz = Tensor.from(ca, [c6], f32);
      using eqX = Tensor.from(cb, [c6], f32);
      using eqBias = Tensor.from(ck, [c6], f32);
      addon().batchNormBackwardApply({
        dz: dz.raw,
        x: x.raw,
        eqDz: eqDz.raw,
        eqX: eqX.raw,
        eqBias: eqBias.raw,
        dx: dx.raw,
      });
      const want = roundTo(
        'f16',
        Array.from(dzHost, (g, i) => at(ca, i % c6) * g + at(cb, i % c6) * at(xHost, i) + at(ck, i % c6)),
      );
      expect(relativeMaxError(dx.toFloat32Array(), want)).toBeLessThanOrEqual(2 ** -11);
      expect(dz.toFloat32Array()).toEqual(dzHost);
    });

    it('captures into a CUDA graph after a warm-up run, and the replay computes what the eager run did', () => {
      const pr = problem('bf16');
      const { opts, f32 } = pr;
      using x = pr.x;
      using dy = pr.dy;
      using w = pr.w;
      using gamma = pr.gamma;
      pr.beta.dispose(); // the backward reads the statistics and the prologue's affine map only
      const vec = (seed: number, offset: number) =>
        Tensor.from(
          lcgValues(C, seed).map((v) => offset + 0.5 * v),
          [C],
          f32,
        );
      using scale = vec(21, 1);
      using shift = vec(22, 0);
      using mean = vec(23, 0);
      using invStd = vec(24, 1);
      using dz = Tensor.zeros([N, H, W, C], opts);
      using dGamma = Tensor.zeros([C], f32);
      using dBeta = Tensor.zeros([C], f32);
      using eqDz = Tensor.zeros([C], f32);
      using eqX = Tensor.zeros([C], f32);
      using eqBias = Tensor.zeros([C], f32);
      using dW = Tensor.zeros([K, 3, 3, C], f32);
      const window = { strideH: 2, strideW: 2, padH: 1, padW: 1 };
      const step = (): void => {
        addon().convDgradDbn({
          dy: dy.raw,
          weight: w.raw,
          x: x.raw,
          scale: scale.raw,
          shift: shift.raw,
          gamma: gamma.raw,
          saveMean: mean.raw,
          saveInvStd: invStd.raw,
          dz: dz.raw,
          dGamma: dGamma.raw,
          dBeta: dBeta.raw,
          eqDz: eqDz.raw,
          eqX: eqX.raw,
          eqBias: eqBias.raw,
          ...window,
        });
        addon().convWgradSbr({ x: x.raw, dy: dy.raw, scale: scale.raw, shift: shift.raw, dWeight: dW.raw, ...window });
        addon().batchNormBackwardApply({
          dz: dz.raw,
          x: x.raw,
          eqDz: eqDz.raw,
          eqX: eqX.raw,
          eqBias: eqBias.raw,
          dx: dz.raw,
        });
      };
      const outputs = [dz, dGamma, dBeta, eqDz, eqX, eqBias, dW];
      step();
      const eager = outputs.map((t) => t.toFloat32Array());
      for (const t of outputs) addon().fill({ tensor: t.raw, value: 0 });
      const graph = CudaGraph.capture(DEVICE, step);
      try {
        // Capturing ran nothing: the outputs are still zero.
        expect(dz.toFloat32Array().every((v) => v === 0)).toBe(true);
        graph.replay();
        outputs.forEach((t, i) => expect(t.toFloat32Array()).toEqual(eager[i]));
        expect(dW.toFloat32Array().some((v) => v !== 0)).toBe(true);
      } finally {
        graph.dispose();
      }
    });

    it('refuses bad arguments, naming them', () => {
      const pr = problem('bf16');
      const { opts, f32 } = pr;
      using x = pr.x;
      using dy = pr.dy;
      using w = pr.w;
      using gamma = pr.gamma;
      using beta = pr.beta;
      using v = Tensor.from(new Float32Array(C).fill(1), [C], f32);
      using dz = Tensor.zeros([N, H, W, C], opts);
      const args = {
        dy: dy.raw,
        weight: w.raw,
        x: x.raw,
        scale: v.raw,
        shift: v.raw,
        gamma: gamma.raw,
        saveMean: beta.raw,
        saveInvStd: v.raw,
        dz: dz.raw,
        dGamma: v.raw,
        dBeta: v.raw,
        eqDz: v.raw,
        eqX: v.raw,
        eqBias: v.raw,
        strideH: 2,
        strideW: 2,
        padH: 1,
        padW: 1,
      };
      using x32 = Tensor.zeros([N, H, W, C], f32);
      expect(() => addon().convDgradDbn({ ...args, x: x32.raw })).toThrow(/bf16 or f16/);
      expect(() => addon().convDgradDbn({ ...args, strideH: 1, strideW: 1 })).toThrow(/dy must have shape/);
      using v12 = Tensor.zeros([12], f32);
      expect(() => addon().convDgradDbn({ ...args, eqX: v12.raw })).toThrow(/eqX must have shape/);
      using vHalf = Tensor.zeros([C], opts);
      expect(() => addon().convDgradDbn({ ...args, dGamma: vHalf.raw })).toThrow(/dGamma must be f32/);
      expect(() => addon().convDgradDbn({ ...args, dz: x.raw })).toThrow(/dz must not share memory/);
      using dz16 = Tensor.zeros([N, H, W, C], { device: DEVICE, dtype: 'f16' });
      expect(() => addon().convDgradDbn({ ...args, dz: dz16.raw })).toThrow(/dz must be bf16/);
      // Six input channels: the fusion engines need multiples of 8.
      using x6 = Tensor.zeros([N, H, W, 6], opts);
      using w6 = Tensor.zeros([K, 3, 3, 6], f32);
      using dz6 = Tensor.zeros([N, H, W, 6], opts);
      using v6 = Tensor.zeros([6], f32);
      const six = { scale: v6.raw, shift: v6.raw, gamma: v6.raw, saveMean: v6.raw, saveInvStd: v6.raw };
      const sixOut = { dGamma: v6.raw, dBeta: v6.raw, eqDz: v6.raw, eqX: v6.raw, eqBias: v6.raw };
      expect(() =>
        addon().convDgradDbn({ ...args, ...six, ...sixOut, x: x6.raw, weight: w6.raw, dz: dz6.raw }),
      ).toThrow(/multiples of 8/);

      const wgrad = { x: x.raw, dy: dy.raw, scale: v.raw, shift: v.raw, dWeight: w.raw, strideH: 2, strideW: 2 };
      using wLow = Tensor.zeros([K, 3, 3, C], opts);
      expect(() => addon().convWgradSbr({ ...wgrad, padH: 1, padW: 1, dWeight: wLow.raw })).toThrow(
        /dWeight must be f32/,
      );
      expect(() => addon().convWgradSbr({ ...wgrad, padH: 1, padW: 1, shift: v12.raw })).toThrow(
        /shift must have shape/,
      );
      expect(() => addon().convWgradSbr(wgrad)).toThrow(/dy must have shape/);
      expect(() => addon().convWgradSbr({ ...wgrad, padH: 1, padW: 1, x: x32.raw })).toThrow(/bf16 or f16/);

      const apply = { dz: dz.raw, x: x.raw, eqDz: v.raw, eqX: v.raw, eqBias: v.raw, dx: dz.raw };
      expect(() => addon().batchNormBackwardApply({ ...apply, eqBias: v12.raw })).toThrow(/eqBias must have shape/);
      expect(() => addon().batchNormBackwardApply({ ...apply, dx: x.raw })).toThrow(/dx must not share memory/);
      expect(() => addon().batchNormBackwardApply({ ...apply, dx: dz16.raw })).toThrow(/dx must be bf16/);
    });
  },
);
