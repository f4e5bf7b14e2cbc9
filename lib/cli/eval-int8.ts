/**
 * `eval --int8`: calibrates the model on training images ({@link calibrate}), then runs the
 * evaluation images through the f32 model and its INT8 plan and reports both top-1 accuracies, the
 * change, and the throughput of each.
 * @packageDocumentation
 */
import { DataLoader } from '../data/loader.js';
import type { Dataset } from '../data/types.js';
import { ResnetError } from '../errors.js';
import { CALIBRATION_METHODS, calibrate, type CalibrationMethod } from '../inference/calibrate.js';
import { lowerForInference } from '../inference/graph.js';
import { Predictor } from '../inference/predictor.js';
import type { WeightBits } from '../inference/quant-math.js';
import { InputNormalize } from '../nn/input.js';
import type { ResNet } from '../nn/resnet.js';
import type { Tensor } from '../tensor.js';
import { percent, valTransform } from './common.js';
import type { InputSettings } from './inference.js';
import { UsageError, type OptionSpec } from './options.js';

/** The options `eval` gains for INT8. */
export const INT8_EVAL_OPTIONS: OptionSpec[] = [
  {
    name: 'int8',
    type: 'boolean',
    help: 'Also calibrate INT8 quantization on training images and report the INT8 top-1, its change against f32, and the speed-up (CPU).',
    section: 'INT8',
  },
  {
    name: 'calibration-samples',
    type: 'int',
    min: 1,
    default: 512,
    valueName: 'N',
    help: 'Training images the INT8 calibration runs over.',
    section: 'INT8',
  },
  {
    name: 'calibration-method',
    type: 'choice',
    choices: CALIBRATION_METHODS,
    default: 'entropy',
    valueName: 'METHOD',
    help: 'How activation ranges are chosen: minmax, percentile (99.99th of |x|), or entropy (least KL divergence).',
    section: 'INT8',
  },
  {
    name: 'int8-weight-bits',
    type: 'int',
    min: 7,
    max: 8,
    default: 8,
    valueName: 'BITS',
    help: 'Width of the quantized weights: 8, or 7 for the exact integer arithmetic on CPUs without VNNI (doctor says which).',
    section: 'INT8',
  },
];

/** The values of {@link INT8_EVAL_OPTIONS}. */
export interface Int8EvalArgs {
  int8: boolean;
  calibrationSamples: number;
  calibrationMethod: CalibrationMethod;
  int8WeightBits: number;
}

/** What `eval --int8` measured. */
export interface Int8Report {
  method: CalibrationMethod;
  weightBits: WeightBits;
  calibrationImages: number;
  images: number;
  f32Acc1: number;
  int8Acc1: number;
  /** What the f32 throughput was measured on: the f32 inference plan, or the modules' eval forward. */
  f32Path: 'predictor' | 'modules';
  f32ImagesPerSecond: number;
  int8ImagesPerSecond: number;
  /** The INT8 plan's implementation line. */
  implementation: string;
}

/** Refuses `--int8` where it cannot run and the INT8 options without `--int8` (`given`: the explicit options' camelCase keys). */
export function checkInt8Args(a: Int8EvalArgs, given: ReadonlySet<string>, device: string): void {
  if (!a.int8) {
    if (given.has('calibrationSamples')) throw new UsageError('--calibration-samples needs --int8');
    if (given.has('calibrationMethod')) throw new UsageError('--calibration-method needs --int8');
    if (given.has('int8WeightBits')) throw new UsageError('--int8-weight-bits needs --int8');
    return;
  }
  if (device !== 'cpu') throw new UsageError(`--int8 runs on the CPU backend; got --device ${device}`);
}

function top1(logits: Float32Array, labels: Int32Array, classes: number): number {
  let correct = 0;
  for (let i = 0; i < labels.length; i++) {
    let best = 0;
    for (let k = 1; k < classes; k++) if (logits[i * classes + k]! > logits[i * classes + best]!) best = k;
    if (best === labels[i]) correct++;
  }
  return correct;
}

/** An f32 forward to compare with. */
interface F32Runner {
  /** The f32 inference plan, or the modules' eval forward where this build's backend has no plan. */
  path: 'predictor' | 'modules';
  /** The logits of a batch, on the host. */
  run(x: Tensor): Float32Array;
  dispose(): void;
}

/** The f32 inference plan when the backend has one (tried on `x`), else the modules' eval forward. */
function f32Runner(model: ResNet, x: Tensor): F32Runner {
  const predictor = new Predictor(model);
  const run = (t: Tensor): Float32Array => {
    const y = predictor.predict(t);
    const host = y.toFloat32Array();
    y.dispose();
    return host;
  };
  try {
    run(x);
    return { path: 'predictor', run, dispose: () => predictor.dispose() };
  } catch (e) {
    predictor.dispose();
    if (!(e instanceof ResnetError) || e.code !== 'ERR_RC_BACKEND_UNAVAILABLE') throw e;
    return { path: 'modules', run: (t) => model.forward(t).toFloat32Array(), dispose: () => undefined };
  }
}

/**
 * Calibrates `model` on the first `a.calibrationSamples` images of `train` (shuffled with seed 0),
 * then evaluates `evalData` in f32 and INT8, timing both.
 */
export async function evaluateInt8(
  model: ResNet,
  a: Int8EvalArgs & { batchSize: number },
  data: { train: Dataset; eval: Dataset; settings: InputSettings; workers: number },
  classes: number,
): Promise<Int8Report> {
  // One mean and std for all channels (the grey datasets' settings) apply to each of the model's.
  const channels = lowerForInference(model).inChannels;
  const perChannel = (v: readonly number[]): number[] =>
    v.length === 1 ? new Array<number>(channels).fill(v[0]!) : [...v];
  const normalize = new InputNormalize({ mean: perChannel(data.settings.mean), std: perChannel(data.settings.std) });
  const transform = valTransform(data.settings);
  model.eval();
  const calibrationLoader = new DataLoader(data.train, {
    batchSize: Math.min(a.batchSize, a.calibrationSamples),
    transform,
    workers: data.workers,
    shuffle: true,
    seed: 0,
  });
  let graph;
  try {
    graph = await calibrate(model, calibrationLoader, {
      method: a.calibrationMethod,
      normalize,
      limit: a.calibrationSamples,
      weightBits: a.int8WeightBits as WeightBits,
    });
  } finally {
    await calibrationLoader.close();
  }
  const calibrationImages = Math.min(a.calibrationSamples, data.train.length);
  const int8 = new Predictor(graph, { dtype: 'int8' });
  const loader = new DataLoader(data.eval, { batchSize: a.batchSize, transform, workers: data.workers });
  let f32: F32Runner | null = null;
  let images = 0;
  let f32Correct = 0;
  let int8Correct = 0;
  let f32Ms = 0;
  let int8Ms = 0;
  let implementation = '';
  try {
    for await (const batch of loader) {
      const x = normalize.forward(batch.toTensors('cpu').images);
      if (f32 === null) {
        f32 = f32Runner(model, x);
        implementation = int8.implementation(x.shape as [number, number, number, number]);
        int8.predict(x).dispose(); // the first batch size's plan is made outside the timing
      }
      let t = performance.now();
      const yf = f32.run(x);
      f32Ms += performance.now() - t;
      t = performance.now();
      const out = int8.predict(x);
      const yq = out.toFloat32Array();
      int8Ms += performance.now() - t;
      out.dispose();
      f32Correct += top1(yf, batch.labels, classes);
      int8Correct += top1(yq, batch.labels, classes);
      images += batch.size;
    }
  } finally {
    f32?.dispose();
    int8.dispose();
    await loader.close();
  }
  return {
    method: a.calibrationMethod,
    weightBits: a.int8WeightBits as WeightBits,
    calibrationImages,
    images,
    f32Acc1: images > 0 ? f32Correct / images : 0,
    int8Acc1: images > 0 ? int8Correct / images : 0,
    f32Path: f32?.path ?? 'modules',
    f32ImagesPerSecond: (images * 1000) / Math.max(f32Ms, 1e-9),
    int8ImagesPerSecond: (images * 1000) / Math.max(int8Ms, 1e-9),
    implementation,
  };
}

/** The report as lines of text. */
export function int8ReportText(r: Int8Report): string {
  const change = (r.int8Acc1 - r.f32Acc1) * 100;
  return [
    `INT8 (calibrated with ${r.method} on ${r.calibrationImages} training images, ${r.weightBits}-bit weights; ${r.images} evaluation images):`,
    `  f32 Acc@1 ${percent(r.f32Acc1)}  int8 Acc@1 ${percent(r.int8Acc1)}  change ${change >= 0 ? '+' : ''}${change.toFixed(2)} points`,
    `  f32 ${r.f32ImagesPerSecond.toFixed(1)} img/s (${r.f32Path === 'predictor' ? 'inference plan' : 'modules eval forward'})  int8 ${r.int8ImagesPerSecond.toFixed(1)} img/s  speed-up ${(r.int8ImagesPerSecond / r.f32ImagesPerSecond).toFixed(2)}x`,
    `  ${r.implementation}`,
  ].join('\n');
}
