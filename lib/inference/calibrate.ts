/**
 * INT8 post-training calibration: runs a trained network's eval forward over a few hundred images,
 * records the inputs of its convolutions and its fully connected layer, and returns the network's
 * inference graph ({@link lowerForInference}) with every convolution and linear node quantized
 * (`quant` set): per-output-channel symmetric weight scales from the batch-norm-folded weights, and a
 * per-tensor symmetric scale for each node's input chosen by min-max, a percentile of `|x|`, or the
 * entropy (KL-divergence) search. {@link Predictor} with `dtype: 'int8'` runs the result.
 *
 * ```ts
 * const graph = await calibrate(model, loader, { method: 'entropy', normalize, limit: 512 });
 * const int8 = new Predictor(graph, { dtype: 'int8' });
 * ```
 * @packageDocumentation
 */
import type { Batch } from '../data/loader.js';
import { expectInt, expectNumber, expectOneOf, expectOptions, invalid } from '../errors.js';
import { Conv2d, Linear } from '../nn/layers.js';
import { InputNormalize } from '../nn/input.js';
import type { Module } from '../nn/module.js';
import { Tensor, expectTensor } from '../tensor.js';
import { lowerForInference, type InferenceGraph, type InferenceNode } from './graph.js';
import {
  AbsHistogram,
  WEIGHT_BITS,
  entropyThreshold,
  percentileThreshold,
  scaleOf,
  weightScales,
  type WeightBits,
} from './quant-math.js';

/** How an activation's clipping threshold is chosen. */
export const CALIBRATION_METHODS = ['minmax', 'percentile', 'entropy'] as const;

/**
 * `'minmax'`: the largest `|x|` seen (nothing clipped; outliers cost resolution). `'percentile'`:
 * the `percentile`-th percentile of `|x|`. `'entropy'`: the threshold whose quantized distribution
 * loses the least information (KL divergence), TensorRT's default calibrator.
 */
export type CalibrationMethod = (typeof CALIBRATION_METHODS)[number];

/** One calibration batch: a normalized f32 NHWC tensor, a u8 NHWC tensor, or a {@link DataLoader} batch (both normalized with `normalize`). */
export type CalibrationBatch = Tensor | Batch;

/** Where calibration images come from: a {@link DataLoader}, an array, or any (async) iterable of batches. */
export type CalibrationSamples = Iterable<CalibrationBatch> | AsyncIterable<CalibrationBatch>;

/** Options of {@link calibrate}. */
export interface CalibrateOptions {
  /** How activation thresholds are chosen; default `'entropy'`. */
  method?: CalibrationMethod;
  /** The percentile of `|x|` for `method: 'percentile'`, in (0, 100]; default 99.99. */
  percentile?: number;
  /** Use at most this many images (the last batch is cut); default: all the samples give. */
  limit?: number;
  /** Turns u8 images (u8 tensors and DataLoader batches) into the network's input; required for them. */
  normalize?: InputNormalize;
  /** The device DataLoader batches are moved to; default `'cpu'`. */
  device?: string;
  /** Names of convolutions or linear layers to leave in floating point (e.g. `['conv1', 'fc']`). */
  exclude?: readonly string[];
  /**
   * Width of the quantized weights; default 8. With 7 (ONNX Runtime's `reduce_range`), the plan's
   * integer arithmetic is exact on CPUs without VNNI too, whose int8 kernels otherwise saturate
   * (and, for signed inputs, halve the weights): see `listBackends()`'s `int8` property.
   */
  weightBits?: WeightBits;
}

/** The activations seen at one graph value (the input of one or more quantized nodes). */
interface Observer {
  value: number;
  unsigned: boolean;
  hist: AbsHistogram;
}

/**
 * Which values hold only non-negative numbers by construction: the outputs of convolutions that end
 * in a ReLU, and max or average pooling of such values. They are quantized to u8, the rest to s8.
 */
export function nonNegativeValues(graph: InferenceGraph): boolean[] {
  const out = [false];
  for (const node of graph.nodes) {
    if (node.op === 'conv') out.push(node.relu);
    else if (node.op === 'linear') out.push(false);
    else out.push(out[node.input]!);
  }
  return out;
}

function isBatch(x: unknown): x is Batch {
  return typeof x === 'object' && x !== null && typeof (x as Batch).toTensors === 'function';
}

/** The network input of one calibration batch (normalized f32 NHWC). */
function inputOf(item: unknown, index: number, o: Partial<CalibrateOptions>, device: string): Tensor {
  let images: Tensor;
  if (item instanceof Tensor) images = item;
  else if (isBatch(item)) images = item.toTensors(device).images;
  else invalid(`samples[${index}]`, 'a Tensor or a DataLoader batch', item);
  if (images.shape.length !== 4) invalid(`samples[${index}]`, 'an NHWC batch', `shape [${images.shape.join(', ')}]`);
  if (images.dtype === 'u8') {
    if (!o.normalize) {
      invalid('options.normalize', `an InputNormalize for the u8 images of samples[${index}]`, o.normalize);
    }
    return o.normalize.forward(images);
  }
  if (images.dtype !== 'f32') invalid(`samples[${index}]`, 'f32 (normalized) or u8 images', images.dtype);
  return images;
}

/** The threshold of one observer by the chosen method. */
function thresholdOf(obs: Observer, method: CalibrationMethod, percentile: number): number {
  switch (method) {
    case 'minmax':
      return obs.hist.max;
    case 'percentile':
      return percentileThreshold(obs.hist, percentile);
    case 'entropy':
      return entropyThreshold(obs.hist, obs.unsigned ? 256 : 128);
  }
}

/** Options of a {@link Calibrator}: how the thresholds are chosen and which layers stay in floating point. */
export type CalibratorOptions = Pick<CalibrateOptions, 'method' | 'percentile' | 'exclude' | 'weightBits'>;

/**
 * Calibration one batch at a time (what {@link calibrate} drives over its samples): `observe` runs
 * the model's eval forward on a normalized f32 NHWC batch and records the inputs of the quantized
 * layers; `finish` chooses the thresholds and returns the quantized graph. Each layer's forward is
 * wrapped only during `observe`, so the model is its own again between calls.
 */
export class Calibrator {
  /** The method thresholds are chosen by. */
  readonly method: CalibrationMethod;
  /** The percentile of `method: 'percentile'`. */
  readonly percentile: number;
  /** The width of the quantized weights. */
  readonly weightBits: WeightBits;
  readonly #model: Module;
  readonly #graph: InferenceGraph;
  readonly #quantized: (InferenceNode & { op: 'conv' | 'linear' })[] = [];
  readonly #unsigned: boolean[];
  readonly #observerOf = new Map<Module, Observer>();
  #images = 0;

  constructor(model: Module, options: CalibratorOptions = {}) {
    const o = expectOptions<CalibratorOptions>('Calibrator options', options, [
      'method',
      'percentile',
      'exclude',
      'weightBits',
    ]);
    this.method = expectOneOf('options.method', o.method ?? 'entropy', CALIBRATION_METHODS);
    this.weightBits = expectOneOf('options.weightBits', o.weightBits ?? 8, WEIGHT_BITS);
    this.percentile = o.percentile === undefined ? 99.99 : expectNumber('options.percentile', o.percentile, 0, 100);
    if (this.percentile === 0) invalid('options.percentile', 'a percentile in (0, 100]', this.percentile);
    if (o.exclude !== undefined && !Array.isArray(o.exclude)) {
      invalid('options.exclude', 'an array of layer names', o.exclude);
    }
    this.#model = model;
    this.#graph = lowerForInference(model);
    const layers = new Map<string, InferenceNode & { op: 'conv' | 'linear' }>();
    for (const node of this.#graph.nodes) if (node.op === 'conv' || node.op === 'linear') layers.set(node.name, node);
    const exclude = new Set<string>(o.exclude ?? []);
    for (const name of exclude) {
      if (!layers.has(name)) {
        invalid(
          'options.exclude',
          `names of the model's convolutions and linear layers (such as '${[...layers.keys()][0]}')`,
          name,
        );
      }
    }
    this.#unsigned = nonNegativeValues(this.#graph);
    const observers = new Map<number, Observer>();
    for (const [name, m] of model.namedModules()) {
      const node = layers.get(name);
      if (!node || exclude.has(name) || !(m instanceof Conv2d || m instanceof Linear)) continue;
      let obs = observers.get(node.input);
      if (!obs) {
        obs = { value: node.input, unsigned: this.#unsigned[node.input]!, hist: new AbsHistogram() };
        observers.set(node.input, obs);
      }
      this.#observerOf.set(m, obs);
      this.#quantized.push(node);
    }
  }

  /** Images observed so far. */
  get images(): number {
    return this.#images;
  }

  /**
   * Runs the eval forward on `x` (normalized f32 NHWC, on the model's device) and records the
   * quantized layers' inputs (copied to the host, once per value when several layers read it). The
   * model's training mode is restored afterwards.
   */
  observe(x: Tensor): void {
    expectTensor('x', x, { rank: 4, dtype: 'f32' });
    const seen = new Set<Observer>();
    const wrapped: Module[] = [];
    const wasTraining = this.#model.training;
    try {
      for (const [m, obs] of this.#observerOf) {
        const own = m.forward.bind(m);
        m.forward = (input: Tensor): Tensor => {
          if (!seen.has(obs)) {
            seen.add(obs);
            obs.hist.add(input.toFloat32Array());
          }
          return own(input);
        };
        wrapped.push(m);
      }
      this.#model.eval();
      this.#model.forward(x);
      this.#images += x.shape[0]!;
    } finally {
      for (const m of wrapped) delete (m as { forward?: unknown }).forward;
      if (wasTraining) this.#model.train();
    }
  }

  /**
   * The model's inference graph with `quant` on every observed layer: the input scale from its
   * threshold by the method, the weight scales from the folded weights.
   * @throws ERR_RC_INVALID_ARGUMENT when nothing was observed.
   */
  finish(): InferenceGraph {
    if (this.#images === 0) invalid('samples', 'at least one image', 'none');
    const scales = new Map<number, number>();
    for (const obs of new Set(this.#observerOf.values())) {
      scales.set(obs.value, scaleOf(thresholdOf(obs, this.method, this.percentile), obs.unsigned));
    }
    for (const node of this.#quantized) {
      const outChannels = node.op === 'conv' ? node.outChannels : node.outFeatures;
      node.quant = {
        inputScale: scales.get(node.input) ?? 1,
        inputUnsigned: this.#unsigned[node.input]!,
        weightScales: weightScales(node.weight, outChannels, this.weightBits),
      };
    }
    return this.#graph;
  }
}

/**
 * Calibrates `model` (a trained network: a ResNet or a Sequential of the supported layers) on
 * `samples` and returns its quantized inference graph: every convolution and linear node not named
 * in `options.exclude` gets `quant`. The model's eval forward runs over the images (its training
 * mode is restored afterwards); its weights and statistics do not change. The inputs of
 * convolutions that follow a ReLU (or a pooling of one) are u8, the others (the network input, the
 * fc after pooling a residual sum without ReLU) s8. Nodes reading the same value get the same
 * scale, so a convolution can write its output already quantized for all its readers.
 * @throws ERR_RC_INVALID_ARGUMENT for bad options, batches that are not images, or no images at all.
 */
export async function calibrate(
  model: Module,
  samples: CalibrationSamples,
  options: CalibrateOptions = {},
): Promise<InferenceGraph> {
  const o = expectOptions<CalibrateOptions>('calibrate options', options, [
    'method',
    'percentile',
    'limit',
    'normalize',
    'device',
    'exclude',
    'weightBits',
  ]);
  const limit = o.limit === undefined ? Infinity : expectInt('options.limit', o.limit, 1);
  if (o.normalize !== undefined && !(o.normalize instanceof InputNormalize)) {
    invalid('options.normalize', 'an InputNormalize', o.normalize);
  }
  const device = o.device ?? 'cpu';
  if (
    samples === null ||
    typeof samples !== 'object' ||
    !(Symbol.iterator in samples || Symbol.asyncIterator in samples)
  ) {
    invalid('samples', 'a DataLoader, an array or an (async) iterable of image batches', samples);
  }
  const calibrator = new Calibrator(model, {
    ...(o.method !== undefined ? { method: o.method } : {}),
    ...(o.percentile !== undefined ? { percentile: o.percentile } : {}),
    ...(o.exclude !== undefined ? { exclude: o.exclude } : {}),
    ...(o.weightBits !== undefined ? { weightBits: o.weightBits } : {}),
  });
  let index = 0;
  for await (const item of samples as AsyncIterable<CalibrationBatch>) {
    let x = inputOf(item, index++, o, device);
    const take = Math.min(x.shape[0]!, limit - calibrator.images);
    if (take < x.shape[0]!) x = x.view(0, [take, ...x.shape.slice(1)]);
    calibrator.observe(x);
    if (calibrator.images >= limit) break;
  }
  return calibrator.finish();
}
