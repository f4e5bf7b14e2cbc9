/**
 * Feature extraction: the pooled features of a ResNet (the global average pool's output that `fc`
 * reads, 512 values for ResNet-18/34 and 2048 for ResNet-50/101/152) for every sample a
 * DataLoader yields, in evaluation mode, with the labels and, for datasets of files, the file
 * names. The batches go through the same path as the Trainer's evaluation (`loaderBatches`, then
 * the input normalization on the device).
 * @packageDocumentation
 */
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { ImageFiles } from '../data/image-files.js';
import { ImageFolder } from '../data/image-folder.js';
import type { DataLoader } from '../data/loader.js';
import { Subset } from '../data/split.js';
import type { Dataset } from '../data/types.js';
import { ResnetError, expectOneOf, expectOptions, invalid } from '../errors.js';
import { IMAGENET_MEAN, IMAGENET_STD, InputNormalize } from '../nn/input.js';
import type { StateDict } from '../nn/module.js';
import { ResNet } from '../nn/resnet.js';
import { checkSignal, throwIfAborted } from '../train/abort.js';
import { isLoader, loaderBatches } from '../train/batches.js';
import { encodeSafetensors, writeFileAtomic } from '../train/checkpoint.js';
import { encodeNpy } from './npy.js';

/** Options of {@link extractFeatures}. */
export interface ExtractFeaturesOptions {
  /**
   * The activations' dtype: `f32`, or `bf16`/`f16` to run the network in that precision (the
   * features come back as f32 either way); default `f32`.
   */
  dtype?: 'f32' | 'bf16' | 'f16';
  /** Stops at the next batch with an `AbortError`. */
  signal?: AbortSignal;
  /** Called after each batch with the batches done and the loader's length. */
  onBatch?: (done: number, total: number) => void;
}

/** What {@link extractFeatures} returns: one row per sample, in the loader's order. */
export interface ExtractedFeatures {
  /** `[count, dims]`, row-major. */
  features: Float32Array;
  /** Samples. */
  count: number;
  /** Values per sample: the model's `featureDim`. */
  dims: number;
  /** The class label of each sample. */
  labels: Int32Array;
  /** The dataset index of each sample. */
  indices: Int32Array;
  /** The file of each sample, for datasets of files (`ImageFolder`, `ImageFiles`, subsets of them); else null. */
  files: string[] | null;
  /** The dataset's class names by label (empty when it has none). */
  classes: readonly string[];
}

/**
 * The file behind sample `index` of `dataset`, through subsets, or undefined for a dataset that is
 * not read from files.
 */
export function sampleFile(dataset: Dataset, index: number): string | undefined {
  if (dataset instanceof ImageFolder) return dataset.path(index);
  if (dataset instanceof ImageFiles) return dataset.files[index];
  if (dataset instanceof Subset) return sampleFile(dataset.dataset, dataset.indices[index]!);
  return undefined;
}

/**
 * Runs `model` in evaluation mode up to its global average pooling (`forwardFeatures`) over every
 * batch of `loader`'s next epoch, on the model's device, and returns the features with the labels.
 * The input normalization is the loader transform's (ImageNet's when it has none), as the
 * Trainer's evaluation does. The model's training mode is restored afterwards.
 *
 * PyTorch equivalent: a forward hook on `avgpool`, or
 * `torch.nn.Sequential(*list(model.children())[:-1])` under `torch.no_grad()` and `model.eval()`.
 * A distributed loader yields this rank's share of the samples, and so do the features.
 * @throws `ERR_RC_INVALID_ARGUMENT` for a model that is not a ResNet, a loader that is not a
 *   DataLoader, an empty loader, or bad options.
 */
export async function extractFeatures(
  model: ResNet,
  loader: DataLoader,
  options: ExtractFeaturesOptions = {},
): Promise<ExtractedFeatures> {
  if (!(model instanceof ResNet)) invalid('model', 'a ResNet', model);
  if (!isLoader(loader)) invalid('loader', 'a DataLoader', loader);
  const o = expectOptions<ExtractFeaturesOptions>('extractFeatures options', options, ['dtype', 'signal', 'onBatch']);
  const dtype = expectOneOf('dtype', o.dtype ?? 'f32', ['f32', 'bf16', 'f16'] as const);
  const signal = checkSignal('signal', o.signal);
  if (o.onBatch !== undefined && typeof o.onBatch !== 'function') invalid('onBatch', 'a function', o.onBatch);
  const device = model.device;
  if (device === null) invalid('model', 'a model placed on a device', model);

  const dims = model.featureDim;
  const total = loader.length;
  const stats = loader.normalization() ?? { mean: [...IMAGENET_MEAN], std: [...IMAGENET_STD] };
  const normalize = new InputNormalize({ ...stats, dtype });
  const chunks: { features: Float32Array; labels: Int32Array; indices: Int32Array }[] = [];
  const wasTraining = model.training;
  model.eval();
  try {
    let done = 0;
    for await (const batch of loaderBatches(loader, device, loader.epoch, 0)) {
      throwIfAborted(signal, 'extractFeatures');
      const pooled = model.forwardFeatures(normalize.forward(batch.images, batch.flips));
      chunks.push({ features: pooled.toFloat32Array(), labels: batch.hostLabels, indices: batch.indices });
      o.onBatch?.(++done, total);
    }
  } finally {
    model.train(wasTraining);
    normalize.dispose();
  }
  const count = chunks.reduce((n, c) => n + c.labels.length, 0);
  if (count === 0) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'extractFeatures: the loader yields no samples');
  const features = new Float32Array(count * dims);
  const labels = new Int32Array(count);
  const indices = new Int32Array(count);
  let at = 0;
  for (const c of chunks) {
    features.set(c.features, at * dims);
    labels.set(c.labels, at);
    indices.set(c.indices, at);
    at += c.labels.length;
  }
  const dataset = loader.dataset;
  const named = Array.from(indices, (i) => sampleFile(dataset, i));
  const files = named.every((f): f is string => f !== undefined) ? named : null;
  return { features, count, dims, labels, indices, files, classes: dataset.classes };
}

/** Options of {@link saveFeatures}. */
export interface SaveFeaturesOptions {
  /**
   * `'npy'`: `features.npy` (float32 `[N, D]`), `labels.npy` and `indices.npy` (int64 `[N]`);
   * `'safetensors'`: `features.safetensors` with the tensors `features`, `labels` and `indices` and
   * the class names (and file names) as JSON metadata; `'both'`; default `'npy'`.
   */
  format?: 'npy' | 'safetensors' | 'both';
}

/**
 * Writes extracted features into the folder `dir` (created when missing), each file atomically,
 * with `classes.txt` (one class name per line, when the dataset has names) and `files.txt` (one
 * file per sample, when the samples are files). Returns the paths written.
 *
 * In Python: `np.load('features.npy')`, or `safetensors.numpy.load_file('features.safetensors')`.
 */
export async function saveFeatures(
  dir: string,
  extracted: ExtractedFeatures,
  options: SaveFeaturesOptions = {},
): Promise<string[]> {
  if (typeof dir !== 'string' || dir.length === 0) invalid('dir', 'a folder path', dir);
  const o = expectOptions<SaveFeaturesOptions>('saveFeatures options', options, ['format']);
  const format = expectOneOf('format', o.format ?? 'npy', ['npy', 'safetensors', 'both'] as const);
  const { features, count, dims, labels, indices, files, classes } = extracted;
  if (!(features instanceof Float32Array) || features.length !== count * dims) {
    invalid('extracted.features', `a Float32Array of count * dims = ${count * dims} values`, features);
  }
  if (!(labels instanceof Int32Array) || labels.length !== count || !(indices instanceof Int32Array)) {
    invalid('extracted.labels', `Int32Arrays of ${count} labels and indices`, labels);
  }
  await mkdir(dir, { recursive: true });
  const written: string[] = [];
  const write = async (name: string, data: Uint8Array | string): Promise<void> => {
    const path = join(dir, name);
    await writeFileAtomic(path, data);
    written.push(path);
  };
  const labels64 = BigInt64Array.from(labels, (v) => BigInt(v));
  const indices64 = BigInt64Array.from(indices, (v) => BigInt(v));
  if (format !== 'safetensors') {
    await write('features.npy', encodeNpy(features, [count, dims]));
    await write('labels.npy', encodeNpy(labels64, [count]));
    await write('indices.npy', encodeNpy(indices64, [count]));
  }
  if (format !== 'npy') {
    const tensors: StateDict = new Map([
      ['features', { shape: [count, dims], dtype: 'f32', data: features }],
      ['labels', { shape: [count], dtype: 'i64', data: labels64 }],
      ['indices', { shape: [count], dtype: 'i64', data: indices64 }],
    ]);
    const metadata: Record<string, string> = { classes: JSON.stringify(classes) };
    if (files) metadata.files = JSON.stringify(files);
    await write('features.safetensors', encodeSafetensors(tensors, metadata));
  }
  if (classes.length > 0) await write('classes.txt', `${classes.join('\n')}\n`);
  if (files) await write('files.txt', `${files.join('\n')}\n`);
  return written;
}
