/**
 * What the ONNX export tests share: a model whose batch norms have non-trivial statistics,
 * normalised inputs (noise and the built-in shapes), layout conversion, the error measure, a run
 * through ONNX Runtime, and ONNX's checker when a Python with `onnx` is given.
 * @packageDocumentation
 */
import { spawnSync } from 'node:child_process';
import * as ort from 'onnxruntime-node';
import {
  IMAGENET_MEAN,
  IMAGENET_STD,
  Random,
  Tensor,
  generateShapes,
  type Module,
  type ResNet,
} from '../../lib/index.js';

/**
 * Gives every batch norm of `model` random affine parameters and running statistics (so that the
 * folding has something to fold) and puts the model in eval mode.
 */
export function randomizeBatchNorms(model: Module, seed: number): void {
  const rng = new Random(seed);
  const sd = model.stateDict();
  for (const [name, entry] of sd) {
    if (!(entry.data instanceof Float32Array)) continue;
    const draw: (() => number) | undefined = name.endsWith('running_mean')
      ? () => 0.2 * rng.normal()
      : name.endsWith('running_var')
        ? () => rng.uniform(0.5, 2)
        : /bn\d\.weight$|downsample\.1\.weight$/.test(name)
          ? () => rng.uniform(0.5, 1.5)
          : /bn\d\.bias$|downsample\.1\.bias$/.test(name)
            ? () => 0.1 * rng.normal()
            : undefined;
    if (draw) entry.data.forEach((_, i, a) => (a[i] = draw()));
  }
  model.loadStateDict(sd);
  model.eval();
}

/**
 * Makes the classifier of a randomly initialised ResNet a nearest-class-mean classifier of its
 * pooled features, from the labelled images `x` (`[n, size, size, 3]`): the logit of class `k` is
 * `f . (m_k - m) - |m_k|^2 / 2 + |m|^2 / 2` (`m_k` the mean feature of class `k`, `m` of all), which
 * orders the classes as the distance of `f` to their means does. A random network's own classifier
 * gives every image the same class; this one gives classes with margins like a trained model's.
 */
export function fitNearestMeanClassifier(model: ResNet, x: Float32Array, labels: Int32Array, size: number): void {
  const n = labels.length;
  const input = Tensor.from(x, [n, size, size, 3]);
  const features = model.forwardFeatures(input).toFloat32Array();
  input.dispose();
  const d = model.featureDim;
  const classes = model.numClasses;
  const means = new Float64Array(classes * d);
  const counts = new Array<number>(classes).fill(0);
  const all = new Float64Array(d);
  for (let b = 0; b < n; b++) {
    const k = labels[b]!;
    counts[k]!++;
    for (let i = 0; i < d; i++) {
      means[k * d + i] = means[k * d + i]! + features[b * d + i]!;
      all[i] = all[i]! + features[b * d + i]! / n;
    }
  }
  const sd = model.stateDict();
  const weight = sd.get('fc.weight')?.data;
  const bias = sd.get('fc.bias')?.data;
  if (!(weight instanceof Float32Array) || !(bias instanceof Float32Array)) throw new Error('the model has no fc');
  const allNorm = all.reduce((a, v) => a + v * v, 0);
  for (let k = 0; k < classes; k++) {
    if (counts[k] === 0) throw new Error(`no image of class ${k} to fit the classifier`);
    let norm = 0;
    for (let i = 0; i < d; i++) {
      const m = means[k * d + i]! / counts[k]!;
      weight[k * d + i] = m - all[i]!;
      norm += m * m;
    }
    bias[k] = (allNorm - norm) / 2;
  }
  model.loadStateDict(sd);
}

/** `count` NHWC images of Gaussian noise (already "normalised": mean 0, std 1). */
export function noiseImages(count: number, size: number, seed: number, channels = 3): Float32Array {
  const rng = new Random(seed);
  return Float32Array.from({ length: count * size * size * channels }, () => rng.normal());
}

/** `count` NHWC images of the built-in shapes dataset (6 classes), scaled to [0, 1] and normalised with ImageNet's mean and std. */
export function shapeImages(count: number, size: number, seed: number): Float32Array {
  return labelledShapeImages(count, size, seed).x;
}

/** {@link shapeImages} with their labels. */
export function labelledShapeImages(
  count: number,
  size: number,
  seed: number,
): { x: Float32Array; labels: Int32Array } {
  const { images, labels } = generateShapes({ count, size, classes: 6, seed });
  const x = new Float32Array(images.length);
  for (let i = 0; i < images.length; i++) x[i] = (images[i]! / 255 - IMAGENET_MEAN[i % 3]!) / IMAGENET_STD[i % 3]!;
  return { x, labels };
}

/** NHWC `[n, h, w, c]` values in NCHW order. */
export function nhwcToNchw(x: Float32Array, n: number, h: number, w: number, c: number): Float32Array {
  const out = new Float32Array(x.length);
  for (let b = 0; b < n; b++) {
    for (let y = 0; y < h; y++) {
      for (let xx = 0; xx < w; xx++) {
        for (let k = 0; k < c; k++) out[((b * c + k) * h + y) * w + xx] = x[((b * h + y) * w + xx) * c + k]!;
      }
    }
  }
  return out;
}

/**
 * The relative error of `got` against `want`: the largest absolute difference over the largest
 * magnitude of `want` (the max-norm of the difference over the max-norm of the reference).
 */
export function relativeError(got: ArrayLike<number>, want: ArrayLike<number>): number {
  if (got.length !== want.length) throw new Error(`lengths differ: ${got.length} and ${want.length}`);
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < want.length; i++) {
    diff = Math.max(diff, Math.abs(got[i]! - want[i]!));
    scale = Math.max(scale, Math.abs(want[i]!));
  }
  return diff / scale;
}

/** The argmax of each row of `[rows, cols]` values. */
export function argmaxRows(values: ArrayLike<number>, cols: number): number[] {
  const out: number[] = [];
  for (let r = 0; r < values.length / cols; r++) {
    let best = 0;
    for (let c = 1; c < cols; c++) if (values[r * cols + c]! > values[r * cols + best]!) best = c;
    out.push(best);
  }
  return out;
}

/** The logits of the model's eval forward on NHWC images `[n, size, size, c]`. */
export function eagerLogits(model: Module, x: Float32Array, n: number, size: number, c = 3): Float32Array {
  const input = Tensor.from(x, [n, size, size, c]);
  const out = model.forward(input).toFloat32Array();
  input.dispose();
  return out;
}

/** Runs one input through an ONNX Runtime session; returns the output's values. */
export async function runOnnx(
  session: ort.InferenceSession,
  x: Float32Array,
  dims: number[],
  names: { input: string; output: string } = { input: 'input', output: 'logits' },
): Promise<Float32Array> {
  const result = await session.run({ [names.input]: new ort.Tensor('float32', x, dims) });
  const out = result[names.output];
  if (!out) throw new Error(`the session has no output '${names.output}'`);
  return out.data as Float32Array;
}

/** The Python that has `onnx` (RESNET_TEST_PYTHON), or why ONNX's checker is not run. */
export function checkerPython(): { python: string } | { reason: string } {
  const python = process.env.RESNET_TEST_PYTHON;
  if (!python) return { reason: 'set RESNET_TEST_PYTHON to a Python with the onnx package' };
  const probe = spawnSync(python, ['-c', 'import onnx'], { encoding: 'utf8' });
  if (probe.status !== 0) return { reason: `${python} cannot import onnx: ${probe.stderr.trim().split('\n').pop()}` };
  return { python };
}

/**
 * Runs `onnx.checker.check_model(full_check=True)` (which also infers every shape) on `files`;
 * returns the checker's complaint, or '' when every file passes.
 */
export function runChecker(python: string, files: string[]): string {
  const script =
    'import sys, onnx\n' +
    'for path in sys.argv[1:]:\n' +
    '    onnx.checker.check_model(onnx.load(path), full_check=True)\n';
  const run = spawnSync(python, ['-c', script, ...files], { encoding: 'utf8' });
  return run.status === 0 ? '' : `${run.stderr}${run.stdout}`.trim();
}
