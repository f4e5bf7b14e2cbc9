/**
 * The inference plan's GPU check (a row of test/gpu/cases.ts) and the helpers it shares with
 * test/inference-cuda.test.ts: a model whose batch norms have random statistics (so that folding
 * them matters), the training modules' eval forward on the CPU as the reference, and the error
 * measure, the largest difference relative to the reference logits' largest magnitude.
 */
import { ResNet18, ResNet50, Tensor, synchronize, type Module } from '../../lib/index.js';
import { Predictor, type PredictorDType } from '../../lib/inference/predictor.js';
import { BatchNorm2d } from '../../lib/nn/layers.js';
import { Random } from '../../lib/random.js';
import type { GpuCheck } from './cases.js';

/** An NHWC f32 batch on the host. */
export interface HostBatch {
  data: Float32Array;
  shape: [number, number, number, number];
}

/** The tolerances of the issue: f32 1e-5, bf16 and f16 1e-2, relative to the logits' scale. */
export const INFERENCE_TOLERANCE: Record<Exclude<PredictorDType, 'int8'>, number> = {
  f32: 1e-5,
  bf16: 1e-2,
  f16: 1e-2,
};

/** Gives every batch norm random affine parameters and running statistics (seeded). */
export function randomizeBatchNorms(model: Module, seed: number): void {
  const rng = new Random(seed);
  const state = model.stateDict();
  for (const [name, m] of model.namedModules()) {
    if (!(m instanceof BatchNorm2d)) continue;
    const set = (key: string, f: () => number): void => {
      const entry = state.get(`${name}.${key}`);
      if (!entry) throw new Error(`no ${name}.${key} in the state dict`);
      const data = entry.data as Float32Array;
      for (let i = 0; i < data.length; i++) data[i] = f();
    };
    set('weight', () => 0.5 + rng.next());
    set('bias', () => rng.next() - 0.5);
    set('running_mean', () => 0.4 * (rng.next() - 0.5));
    set('running_var', () => 0.5 + rng.next());
  }
  model.loadStateDict(state);
}

/** n images of size x size x 3 with values in [-1, 1) (seeded). */
export function hostBatch(n: number, size: number, seed: number): HostBatch {
  const rng = new Random(seed);
  const data = new Float32Array(n * size * size * 3);
  for (let i = 0; i < data.length; i++) data[i] = 2 * rng.next() - 1;
  return { data, shape: [n, size, size, 3] };
}

/** The training modules' eval forward on the CPU (the model must be on the CPU). */
export function evalForward(model: Module, x: HostBatch): Float32Array {
  model.eval();
  const input = Tensor.from(x.data, x.shape);
  const y = model.forward(input);
  const out = y.toFloat32Array();
  input.dispose();
  y.dispose();
  return out;
}

/** A predictor's logits for the batch on `device`. */
export function predictOn(predictor: Predictor, x: HostBatch): Float32Array {
  const input = Tensor.from(x.data, x.shape, { device: predictor.device });
  try {
    const y = predictor.predict(input);
    const out = y.toFloat32Array();
    y.dispose();
    return out;
  } finally {
    input.dispose();
  }
}

/** max |actual - expected| / max |expected|. */
export function maxRelativeError(actual: Float32Array, expected: Float32Array): number {
  if (actual.length !== expected.length) throw new Error(`${actual.length} logits against ${expected.length}`);
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < expected.length; i++) {
    diff = Math.max(diff, Math.abs((actual[i] ?? NaN) - (expected[i] ?? NaN)));
    scale = Math.max(scale, Math.abs(expected[i] ?? NaN));
  }
  if (!(scale > 0)) throw new Error('the reference logits are all zero');
  return diff / scale;
}

/** Images per second of `predictor` at batch n (inputs on the device, outputs left there). */
function throughput(predictor: Predictor, n: number, size: number, iterations: number): number {
  const x = Tensor.from(hostBatch(n, size, n).data, [n, size, size, 3], { device: predictor.device });
  const run = (): void => predictor.predict(x).dispose();
  for (let i = 0; i < 2; i++) run();
  synchronize(predictor.device);
  const start = performance.now();
  for (let i = 0; i < iterations; i++) run();
  synchronize(predictor.device);
  const seconds = (performance.now() - start) / 1e3;
  x.dispose();
  return (n * iterations) / seconds;
}

/**
 * The CUDA inference plan: a ResNet-50 (ResNet-18 at the small size) with random batch-norm
 * statistics through the Predictor equals the CPU eval forward in f32, bf16 and f16; then its
 * throughput at batch 1 and 256 (1 and 4 at the small size) in each dtype.
 */
export const inferencePlanCheck: GpuCheck = {
  name: 'the inference plan (fused cuDNN convolutions) equals the eval forward; its throughput at batch 1 and 256',
  run: ({ device, scale, log }) => {
    const full = scale === 'full';
    const size = full ? 224 : 16;
    const model = full
      ? ResNet50({ numClasses: 1000, seed: 51 })
      : ResNet18({ numClasses: 10, smallInput: true, seed: 51 });
    randomizeBatchNorms(model, 52);
    const x = hostBatch(2, size, 53);
    const expected = evalForward(model, x);
    const failures: string[] = [];
    try {
      for (const dtype of ['f32', 'bf16', 'f16'] as const) {
        const predictor = new Predictor(model, { device, dtype });
        try {
          const error = maxRelativeError(predictOn(predictor, x), expected);
          log(
            `${dtype}: ${predictor.implementation(x.shape)}; max |difference| / max |logit| ${error.toExponential(2)}`,
          );
          if (!(error <= INFERENCE_TOLERANCE[dtype])) {
            failures.push(`${dtype}: error ${error.toExponential(2)} above ${INFERENCE_TOLERANCE[dtype]}`);
          }
          for (const n of full ? [1, 256] : [1, 4]) {
            const rate = throughput(predictor, n, size, full ? (n === 1 ? 50 : 10) : 1);
            log(`${dtype} batch ${n} at ${size} px: ${rate.toFixed(1)} img/s`);
          }
        } finally {
          predictor.dispose();
        }
      }
    } finally {
      model.dispose();
    }
    if (failures.length > 0) {
      throw new Error(`the inference plan differs from the eval forward: ${failures.join('; ')}`);
    }
  },
};
