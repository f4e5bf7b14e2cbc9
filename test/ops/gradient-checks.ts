/**
 * The float64 reference backward functions against central finite differences of the reference
 * forward functions, so that the op tests compare native code against something proven.
 * @packageDocumentation
 */
import {
  avgPool2dBackward,
  avgPool2dForward,
  batchNormBackward,
  batchNormInferenceBackward,
  batchNormInferenceForward,
  batchNormTrainingForward,
  conv2dBackwardData,
  conv2dBackwardWeights,
  conv2dForward,
  crossEntropy,
  distinctValues,
  dot,
  linearBackwardData,
  linearBackwardWeights,
  linearForward,
  maxPool2dBackward,
  maxPool2dForward,
  numericGradient,
  relError,
  resolveConv2d,
  resolvePool2d,
  Rng,
  type Conv2dGeometry,
  type Pool2dGeometry,
} from '../reference/index.js';
import type { GradientCheck } from './harness.js';

/**
 * Central differences with h = 1e-6 in float64 are exact for (piecewise) linear ops up to
 * rounding, ~1e-10 relative; smooth ops add O(h²) truncation. 1e-6 leaves a wide margin while
 * still catching any wrong term.
 */
const GRAD_TOL = 1e-6;

function compare(name: string, seed: number, what: string, analytic: Float64Array, numeric: Float64Array): void {
  const err = relError(analytic, numeric);
  if (!(err <= GRAD_TOL)) {
    throw new Error(
      `gradient check ${name} seed=${seed}: d loss/d ${what} from the reference backward differs from finite ` +
        `differences by ${err.toExponential(3)} (tolerance ${GRAD_TOL}) [replay: RESNET_TEST_SEED=${seed}]`,
    );
  }
}

function convCheck(name: string, geometry: Conv2dGeometry): GradientCheck {
  return {
    name: `conv2d ${name}`,
    run: ({ seed }) => {
      const rng = new Rng(seed);
      const g = resolveConv2d(geometry);
      const x = rng.normals(g.n * g.h * g.w * g.c);
      const w = rng.normals(g.k * g.kernelH * g.kernelW * g.c);
      const b = rng.normals(g.k);
      const dy = rng.normals(g.n * g.outH * g.outW * g.k);
      const loss = (): number => dot(conv2dForward(g, x, w, b), dy);
      const grads = conv2dBackwardWeights(g, x, dy);
      compare(name, seed, 'x', conv2dBackwardData(g, dy, w), numericGradient(x, loss));
      compare(name, seed, 'weight', grads.dWeight, numericGradient(w, loss));
      compare(name, seed, 'bias', grads.dBias, numericGradient(b, loss));
    },
  };
}

function poolCheck(kind: 'max' | 'avg', name: string, geometry: Pool2dGeometry): GradientCheck {
  return {
    name: `${kind}pool2d ${name}`,
    run: ({ seed }) => {
      const rng = new Rng(seed);
      const g = resolvePool2d(geometry);
      // Distinct values at least 2^-15 apart: no finite-difference step moves a max.
      const x = distinctValues(rng, g.n * g.h * g.w * g.c);
      const dy = rng.normals(g.n * g.outH * g.outW * g.c);
      const forward = (): Float64Array => (kind === 'max' ? maxPool2dForward(g, x).y : avgPool2dForward(g, x));
      const analytic = kind === 'max' ? maxPool2dBackward(g, x, dy) : avgPool2dBackward(g, dy);
      compare(
        name,
        seed,
        'x',
        analytic,
        numericGradient(x, () => dot(forward(), dy)),
      );
    },
  };
}

/** Every reference backward against finite differences, on tiny shapes. */
export const gradientChecks: GradientCheck[] = [
  convCheck('3x3 stride 2 pad 1', {
    n: 1,
    h: 5,
    w: 5,
    c: 2,
    k: 3,
    kernelH: 3,
    kernelW: 3,
    strideH: 2,
    strideW: 2,
    padH: 1,
    padW: 1,
  }),
  convCheck('3x3 dilation 2 pad 2', {
    n: 2,
    h: 5,
    w: 6,
    c: 2,
    k: 2,
    kernelH: 3,
    kernelW: 3,
    padH: 2,
    padW: 2,
    dilationH: 2,
    dilationW: 2,
  }),
  convCheck('7x7 stride 2 pad 3', {
    n: 1,
    h: 7,
    w: 7,
    c: 1,
    k: 2,
    kernelH: 7,
    kernelW: 7,
    strideH: 2,
    strideW: 2,
    padH: 3,
    padW: 3,
  }),
  convCheck('1x3 stride 2x1', {
    n: 1,
    h: 4,
    w: 5,
    c: 3,
    k: 2,
    kernelH: 1,
    kernelW: 3,
    strideH: 2,
    strideW: 1,
    padH: 0,
    padW: 1,
  }),
  {
    name: 'linear',
    run: ({ seed }) => {
      const rng = new Rng(seed);
      const g = { n: 3, in: 4, out: 5 };
      const x = rng.normals(g.n * g.in);
      const w = rng.normals(g.out * g.in);
      const b = rng.normals(g.out);
      const dy = rng.normals(g.n * g.out);
      const loss = (): number => dot(linearForward(g, x, w, b), dy);
      const grads = linearBackwardWeights(g, x, dy);
      compare('linear', seed, 'x', linearBackwardData(g, dy, w), numericGradient(x, loss));
      compare('linear', seed, 'weight', grads.dWeight, numericGradient(w, loss));
      compare('linear', seed, 'bias', grads.dBias, numericGradient(b, loss));
    },
  },
  ...[false, true].map((fused): GradientCheck => ({
    name: `batchnorm training${fused ? ' +residual relu' : ''}`,
    run: ({ seed }) => {
      const name = `batchnorm training${fused ? ' +residual relu' : ''}`;
      const rng = new Rng(seed);
      const c = 3;
      const n = 2 * 2 * 3 * c;
      const runningMean = new Float64Array(c);
      const runningVar = new Float64Array(c).fill(1);
      // Redraw until no pre-activation is near the ReLU's kink, where differences would straddle it.
      for (let attempt = 0; attempt < 100; ++attempt) {
        const x = rng.normals(n, 1, 2);
        const gamma = rng.uniforms(c, 0.5, 1.5);
        const beta = rng.normals(c, 0, 0.5);
        const residual = fused ? rng.normals(n) : undefined;
        const dy = rng.normals(n);
        const forward = () =>
          batchNormTrainingForward(x, { channels: c, gamma, beta, runningMean, runningVar, residual, relu: fused });
        const fwd = forward();
        if (fused && fwd.preActivation.some((v) => Math.abs(v) < 1e-3)) continue;
        const ref = batchNormBackward(x, dy, {
          channels: c,
          gamma,
          saveMean: fwd.saveMean,
          saveInvStd: fwd.saveInvStd,
          y: fwd.y,
          relu: fused,
        });
        const loss = (): number => dot(forward().y, dy);
        compare(name, seed, 'x', ref.dx, numericGradient(x, loss));
        compare(name, seed, 'gamma', ref.dGamma, numericGradient(gamma, loss));
        compare(name, seed, 'beta', ref.dBeta, numericGradient(beta, loss));
        if (residual) compare(name, seed, 'residual', ref.dResidual, numericGradient(residual, loss));
        return;
      }
      throw new Error(`gradient check ${name} seed=${seed}: no draw without a pre-activation near 0 in 100 tries`);
    },
  })),
  ...[false, true].map((fused): GradientCheck => ({
    name: `batchnorm inference${fused ? ' +residual relu' : ''}`,
    run: ({ seed }) => {
      const name = `batchnorm inference${fused ? ' +residual relu' : ''}`;
      const rng = new Rng(seed);
      const c = 3;
      const n = 2 * 2 * 3 * c;
      for (let attempt = 0; attempt < 100; ++attempt) {
        const x = rng.normals(n, 1, 2);
        const gamma = rng.uniforms(c, 0.5, 1.5);
        const beta = rng.normals(c, 0, 0.5);
        const runningMean = rng.normals(c);
        const runningVar = rng.uniforms(c, 0.5, 2);
        const residual = fused ? rng.normals(n) : undefined;
        const dy = rng.normals(n);
        const forward = () =>
          batchNormInferenceForward(x, { channels: c, gamma, beta, runningMean, runningVar, residual, relu: fused });
        const y = forward();
        // Redraw when a pre-activation (the output without the ReLU) is near the kink.
        if (
          fused &&
          batchNormInferenceForward(x, { channels: c, gamma, beta, runningMean, runningVar, residual }).some(
            (v) => Math.abs(v) < 1e-3,
          )
        ) {
          continue;
        }
        const ref = batchNormInferenceBackward(x, dy, { channels: c, gamma, runningMean, runningVar, y, relu: fused });
        const loss = (): number => dot(forward(), dy);
        compare(name, seed, 'x', ref.dx, numericGradient(x, loss));
        compare(name, seed, 'gamma', ref.dGamma, numericGradient(gamma, loss));
        compare(name, seed, 'beta', ref.dBeta, numericGradient(beta, loss));
        if (residual) compare(name, seed, 'residual', ref.dResidual, numericGradient(residual, loss));
        return;
      }
      throw new Error(`gradient check ${name} seed=${seed}: no draw without a pre-activation near 0 in 100 tries`);
    },
  })),
  poolCheck('max', '3x3 stride 2 pad 1', {
    n: 1,
    h: 5,
    w: 5,
    c: 2,
    kernelH: 3,
    kernelW: 3,
    strideH: 2,
    strideW: 2,
    padH: 1,
    padW: 1,
  }),
  poolCheck('max', '2x2 stride 2', { n: 2, h: 4, w: 5, c: 2, kernelH: 2, kernelW: 2 }),
  poolCheck('avg', '3x3 stride 2 pad 1 (count_include_pad)', {
    n: 1,
    h: 5,
    w: 5,
    c: 2,
    kernelH: 3,
    kernelW: 3,
    strideH: 2,
    strideW: 2,
    padH: 1,
    padW: 1,
  }),
  poolCheck('avg', 'global 3x4', { n: 2, h: 3, w: 4, c: 2, kernelH: 3, kernelW: 4 }),
  ...[
    { labelSmoothing: 0, gradScale: 1 },
    { labelSmoothing: 0.1, gradScale: 8 },
  ].map((o): GradientCheck => ({
    name: `crossEntropy smoothing=${o.labelSmoothing} gradScale=${o.gradScale}`,
    run: ({ seed }) => {
      const rng = new Rng(seed);
      const n = 3;
      const k = 5;
      const logits = rng.normals(n * k, 0, 2);
      const labels = Array.from({ length: n }, () => rng.int(0, k));
      const { dLogits } = crossEntropy(logits, labels, { n, k, ...o });
      // dLogits carries gradScale: divide it out to get d loss / d logits.
      const analytic = dLogits.map((v) => v / o.gradScale);
      const numeric = numericGradient(logits, () => crossEntropy(logits, labels, { n, k, ...o }).loss);
      compare(`crossEntropy smoothing=${o.labelSmoothing}`, seed, 'logits', analytic, numeric);
    },
  })),
];
