/**
 * What the commands share: the model names, devices and precision, the datasets the command line
 * reads (where their files are, how they are opened, their transforms), reading the architecture
 * of a weights file, and the run configuration that training records for `eval` and `predict`.
 * @packageDocumentation
 */
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { availableParallelism, totalmem } from 'node:os';
import { readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { CifarDataset } from '../data/cifar.js';
import { IdxDataset } from '../data/idx.js';
import { ImageFolder } from '../data/image-folder.js';
import { ShapesDataset } from '../data/shapes-dataset.js';
import { defaultWorkers } from '../data/loader.js';
import { randomSplit } from '../data/split.js';
import { SyntheticDataset } from '../data/synthetic.js';
import {
  CenterCrop,
  Compose,
  Normalize,
  RandomHorizontalFlip,
  RandomResizedCrop,
  Resize,
  type Interpolation,
  type Transform,
} from '../data/transforms.js';
import type { Dataset } from '../data/types.js';
import { listBackends, parseDevice } from '../device.js';
import { IMAGENET_MEAN, IMAGENET_STD } from '../nn/input.js';
import type { StateDict } from '../nn/module.js';
import { RESNET_DEPTHS, ResNet, defaultBlockWidths, type ResNetDepth } from '../nn/resnet.js';
import { decodeSafetensors } from '../train/checkpoint.js';
import { Trainer } from '../train/trainer.js';
import { CliError, UsageError, requirePath, type OptionSpec } from './options.js';

/** The models `--model` names. */
export const MODEL_NAMES = ['resnet18', 'resnet34', 'resnet50', 'resnet101', 'resnet152'] as const;
/** A model name. */
export type ModelName = (typeof MODEL_NAMES)[number];

/** The depth of a model name (`resnet50` → 50). */
export function modelDepth(name: ModelName): ResNetDepth {
  return Number(name.slice('resnet'.length)) as ResNetDepth;
}

/** The dataset kinds `--dataset` names. */
export const DATASET_NAMES = [
  'imagefolder',
  'cifar10',
  'cifar100',
  'mnist',
  'fashion-mnist',
  'synthetic',
  'shapes',
] as const;
/** A dataset kind. */
export type DatasetName = (typeof DATASET_NAMES)[number];

/** The `--amp` values. */
export const AMP_NAMES = ['none', 'bf16', 'fp16'] as const;
/** An `--amp` value. */
export type AmpName = (typeof AMP_NAMES)[number];

/** The Trainer's `amp` option for an `--amp` value. */
export function ampOption(amp: AmpName): 'bf16' | 'fp16' | false {
  return amp === 'none' ? false : amp;
}

/** Fashion-MNIST's class names, by label. */
export const FASHION_MNIST_CLASSES: readonly string[] = [
  'T-shirt/top',
  'Trouser',
  'Pullover',
  'Dress',
  'Coat',
  'Sandal',
  'Shirt',
  'Sneaker',
  'Bag',
  'Ankle boot',
];

/** The built-in dataset's sizes: training images (50 batches of 32) and validation images. */
export const SHAPES_TRAIN_LENGTH = 1600;
/** Validation images of the built-in dataset. */
export const SHAPES_VAL_LENGTH = 512;

/** Per-dataset defaults: image sizes, normalisation, and whether training flips images. */
export interface DatasetDefaults {
  trainCropSize: number;
  valResizeSize: number;
  valCropSize: number;
  mean: number[];
  std: number[];
  /** Left-right flips as augmentation (not for digits). */
  flip: boolean;
  /** RandomResizedCrop's scale range, or null to take the whole image (small images). */
  cropScale: [number, number] | null;
}

/** The defaults of each dataset kind. */
export function datasetDefaults(kind: DatasetName): DatasetDefaults {
  const imagenet = { mean: [...IMAGENET_MEAN], std: [...IMAGENET_STD] };
  switch (kind) {
    case 'imagefolder':
    case 'synthetic':
      return {
        trainCropSize: 224,
        valResizeSize: 256,
        valCropSize: 224,
        ...imagenet,
        flip: true,
        cropScale: kind === 'synthetic' ? null : [0.08, 1],
      };
    case 'cifar10':
    case 'cifar100':
      return {
        trainCropSize: 32,
        valResizeSize: 32,
        valCropSize: 32,
        mean: [0.4914, 0.4822, 0.4465],
        std: [0.247, 0.2435, 0.2616],
        flip: true,
        cropScale: [0.6, 1],
      };
    case 'mnist':
      return {
        trainCropSize: 28,
        valResizeSize: 28,
        valCropSize: 28,
        mean: [0.1307],
        std: [0.3081],
        flip: false,
        cropScale: null,
      };
    case 'fashion-mnist':
      return {
        trainCropSize: 28,
        valResizeSize: 28,
        valCropSize: 28,
        mean: [0.286],
        std: [0.353],
        flip: true,
        cropScale: null,
      };
    case 'shapes':
      return {
        trainCropSize: 32,
        valResizeSize: 32,
        valCropSize: 32,
        mean: [0.5],
        std: [0.25],
        flip: true,
        cropScale: null,
      };
  }
}

/**
 * The largest image size the options take: the generated datasets' limit, 16 times ImageNet's
 * crop. A larger one would fail later, in the middle of the work, with a message about `size`.
 */
export const MAX_IMAGE_SIZE = 4096;

/** An image-size option (`--train-crop-size`, `--crop`...): an integer from 8 to {@link MAX_IMAGE_SIZE} pixels. */
export function imageSizeOption(name: string, help: string, defaultText: string, section: string): OptionSpec {
  return { name, type: 'int', min: 8, max: MAX_IMAGE_SIZE, valueName: 'PX', defaultText, help, section };
}

/**
 * The validation resize for a crop, in torchvision's ratio (resize 256 for crop 224), so that a
 * model trained on small crops is evaluated on images of the scale it saw.
 */
export function valResizeFor(crop: number): number {
  return Math.round((crop * 256) / 224);
}

/** Sizes and normalisation of a run's transforms. */
export interface TransformSettings {
  trainCropSize: number;
  valResizeSize: number;
  valCropSize: number;
  mean: number[];
  std: number[];
  interpolation: Interpolation;
}

/**
 * The training transform: torchvision's `RandomResizedCrop` + `RandomHorizontalFlip` +
 * `Normalize` for photographs; for the small fixed-size datasets, a resize to the crop size (a
 * no-op at their native size), a milder crop for CIFAR, and no flip for digits.
 */
export function trainTransform(kind: DatasetName, s: TransformSettings): Compose {
  const d = datasetDefaults(kind);
  const steps: Transform[] = [];
  if (d.cropScale) {
    steps.push(new RandomResizedCrop({ size: s.trainCropSize, scale: d.cropScale, interpolation: s.interpolation }));
  } else {
    steps.push(
      new Resize({ size: s.trainCropSize, interpolation: s.interpolation }),
      new CenterCrop({ size: s.trainCropSize }),
    );
  }
  if (d.flip) steps.push(new RandomHorizontalFlip());
  steps.push(new Normalize({ mean: s.mean, std: s.std }));
  return new Compose(steps);
}

/** The evaluation transform: `Resize(valResizeSize)` + `CenterCrop(valCropSize)` + `Normalize`. */
export function valTransform(
  s: Pick<TransformSettings, 'valResizeSize' | 'valCropSize' | 'mean' | 'std' | 'interpolation'>,
): Compose {
  return new Compose([
    new Resize({ size: s.valResizeSize, interpolation: s.interpolation }),
    new CenterCrop({ size: s.valCropSize }),
    new Normalize({ mean: s.mean, std: s.std }),
  ]);
}

/**
 * Checks a device name and that the device can be used now.
 * @throws {@link UsageError} for a name that is not a device; {@link CliError} for a CUDA device
 *   this machine or build cannot use (with the backend's own reason).
 */
export function checkDevice(device: string, option = '--device'): string {
  let canonical: string;
  try {
    canonical = parseDevice(device);
  } catch {
    throw new UsageError(`${option} expects cpu, cuda or cuda:N, got '${device}'`);
  }
  if (canonical.startsWith('cuda')) {
    const cuda = listBackends().find((b) => b.name === 'cuda');
    if (!cuda?.available) {
      throw new CliError(
        `${option} ${device}: CUDA is not available: ${cuda?.reason ?? 'this build has no CUDA backend'}`,
        "Run 'resnet-cuda doctor' for what to fix, or use --device cpu.",
      );
    }
    const index = Number(canonical.slice(5));
    if (index >= cuda.deviceCount) {
      throw new CliError(
        `${option} ${device}: there ${cuda.deviceCount === 1 ? 'is 1 CUDA device' : `are ${cuda.deviceCount} CUDA devices`} (cuda:0${cuda.deviceCount > 1 ? `..cuda:${cuda.deviceCount - 1}` : ''})`,
      );
    }
  }
  return canonical;
}

/** How the logs name a precision: `fp32`, `amp bf16`. */
export function precisionText(amp: AmpName): string {
  return amp === 'none' ? 'fp32' : `amp ${amp}`;
}

/** Rejects `--amp fp16` on the CPU, which has no fp16 kernels for training. */
export function checkAmp(amp: AmpName, device: string): void {
  if (amp === 'fp16' && !device.startsWith('cuda')) {
    throw new UsageError(
      `--amp fp16 needs a CUDA device, but --device is ${device}`,
      'On the CPU use --amp bf16 (fast on CPUs with AVX-512 BF16 or AMX) or --amp none.',
    );
  }
}

/**
 * Warns when `--amp bf16` on the CPU will compute in f32: oneDNN has bf16 kernels only on CPUs
 * with AVX-512, and on some of those (Xeons without AMX) they are slower than its f32 ones, so the
 * run works and halves the activations' memory but is no faster than `--amp none`.
 */
export function warnBf16ComputedInF32(amp: AmpName, device: string, warn: (text: string) => void): void {
  if (amp !== 'bf16' || device !== 'cpu') return;
  const cpu = listBackends().find((b) => b.name === 'cpu');
  if (cpu?.properties?.bf16 !== 'computed in f32') return;
  warn(
    `warning: --amp bf16 computes its convolutions in f32 on this CPU (${cpu.properties.bf16Reason ?? cpu.properties.isa ?? 'no AVX-512'}) and is no faster than --amp none`,
  );
}

/** The file layout each dataset kind reads, for messages. */
export const DATA_LAYOUTS: Record<DatasetName, string> = {
  imagefolder:
    'DATA/train/<class>/<image> and DATA/val/<class>/<image> (torchvision ImageFolder; without val/, a stratified 10% of train/ is held out)',
  cifar10:
    'the folder of the CIFAR-10 binary version: data_batch_1.bin … data_batch_5.bin and test_batch.bin (cifar-10-batches-bin)',
  cifar100: 'the folder of the CIFAR-100 binary version: train.bin and test.bin (cifar-100-binary)',
  mnist:
    'a folder of the MNIST IDX files: train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (optionally .gz)',
  'fashion-mnist':
    "a folder of the Fashion-MNIST IDX files (named as MNIST's: train-images-idx3-ubyte, …, optionally .gz)",
  synthetic: 'no DATA: random images and labels, generated',
  shapes: 'no DATA: the built-in generated dataset of coloured shapes',
};

/** The files a dataset kind reads, found under DATA. */
export type DataFiles =
  | { kind: 'imagefolder'; train: string; val: string | null }
  | { kind: 'cifar10' | 'cifar100'; train: string[]; test: string[] }
  | {
      kind: 'mnist' | 'fashion-mnist';
      trainImages: string;
      trainLabels: string;
      testImages: string;
      testLabels: string;
    }
  | { kind: 'synthetic' | 'shapes' };

function firstExisting(candidates: readonly string[]): string | undefined {
  return candidates.find((c) => existsSync(c));
}

/** The folder under `root` (itself, or a conventional sub-folder) that holds `probe`. */
function findFolder(root: string, subfolders: readonly string[], probe: (dir: string) => boolean): string | undefined {
  return [root, ...subfolders.map((s) => join(root, s))].find(
    (dir) => existsSync(dir) && statSync(dir).isDirectory() && probe(dir),
  );
}

function idxFile(dir: string, stem: string): string | undefined {
  return firstExisting([join(dir, stem), join(dir, `${stem}.gz`)]);
}

/**
 * Finds the files of a dataset under `root` without reading them, so that a wrong path is a
 * usage error before any work.
 * @param split - `'train'` needs the training files (and takes the validation ones when present);
 *   `'eval'` needs only the evaluation files (an image folder may then be the class folders themselves).
 * @throws {@link UsageError} naming what is missing and the layout expected.
 */
export function locateData(kind: DatasetName, root: string | undefined, split: 'train' | 'eval'): DataFiles {
  if (kind === 'synthetic' || kind === 'shapes') {
    if (root !== undefined) throw new UsageError(`--dataset ${kind} takes no DATA argument, got '${root}'`);
    return { kind };
  }
  if (root === undefined) throw new UsageError(`--dataset ${kind} needs DATA: ${DATA_LAYOUTS[kind]}`);
  const hint = `DATA for --dataset ${kind} is ${DATA_LAYOUTS[kind]}.`;
  requirePath(root, 'dir', 'DATA folder', hint);
  switch (kind) {
    case 'imagefolder': {
      const train = join(root, 'train');
      const val = join(root, 'val');
      const hasVal = existsSync(val) && statSync(val).isDirectory();
      const hasTrain = existsSync(train) && statSync(train).isDirectory();
      if (split === 'eval') {
        if (hasVal) return { kind, train, val };
        // train/ alone: the held-out part, as training split it; else DATA is the class folders.
        return hasTrain ? { kind, train, val: null } : { kind, train: root, val: root };
      }
      if (!hasTrain) {
        throw new UsageError(
          `DATA folder '${root}' has no train/ sub-folder`,
          `${hint} For CIFAR, MNIST or generated data, pass --dataset.`,
        );
      }
      return { kind, train, val: hasVal ? val : null };
    }
    case 'cifar10':
    case 'cifar100': {
      const names =
        kind === 'cifar10'
          ? { train: [1, 2, 3, 4, 5].map((i) => `data_batch_${i}.bin`), test: ['test_batch.bin'] }
          : { train: ['train.bin'], test: ['test.bin'] };
      const wanted = split === 'train' ? [...names.train, ...names.test] : names.test;
      const dir = findFolder(root, kind === 'cifar10' ? ['cifar-10-batches-bin'] : ['cifar-100-binary'], (d) =>
        wanted.every((n) => existsSync(join(d, n))),
      );
      if (!dir) throw new UsageError(`DATA folder '${root}' does not hold ${wanted.join(', ')}`, hint);
      return { kind, train: names.train.map((n) => join(dir, n)), test: names.test.map((n) => join(dir, n)) };
    }
    case 'mnist':
    case 'fashion-mnist': {
      const stems = [
        'train-images-idx3-ubyte',
        'train-labels-idx1-ubyte',
        't10k-images-idx3-ubyte',
        't10k-labels-idx1-ubyte',
      ];
      const wanted = split === 'train' ? stems : stems.slice(2);
      const sub = kind === 'mnist' ? 'MNIST' : 'FashionMNIST';
      const dir = findFolder(root, ['raw', join(sub, 'raw')], (d) => wanted.every((s) => idxFile(d, s) !== undefined));
      if (!dir) {
        throw new UsageError(`DATA folder '${root}' does not hold the IDX files ${wanted.join(', ')} (or .gz)`, hint);
      }
      const [trainImages, trainLabels, testImages, testLabels] = stems.map((s) => idxFile(dir, s) ?? join(dir, s)) as [
        string,
        string,
        string,
        string,
      ];
      return { kind, trainImages, trainLabels, testImages, testLabels };
    }
  }
}

/** What {@link openTrainData} opens. */
export interface TrainData {
  train: Dataset;
  val: Dataset;
  classes: readonly string[];
  /** A sentence for the log when the validation data was held out of the training data. */
  note?: string;
}

/** Options of the generated datasets. */
export interface GeneratedDataOptions {
  seed: number;
  /** Image size (the training crop size). */
  size: number;
  /** Classes: 2 to 6 for shapes, any for synthetic. */
  numClasses: number;
  /** Batch size, which sizes the synthetic dataset (100 batches per epoch, 10 for validation). */
  batchSize: number;
}

/** The built-in dataset's two splits (training images from `seed`, validation from `seed + 1`). */
export function shapesSplits(o: { seed: number; size: number; numClasses: number }): {
  train: ShapesDataset;
  val: ShapesDataset;
} {
  return {
    train: new ShapesDataset({ length: SHAPES_TRAIN_LENGTH, size: o.size, classes: o.numClasses, seed: o.seed }),
    val: new ShapesDataset({ length: SHAPES_VAL_LENGTH, size: o.size, classes: o.numClasses, seed: o.seed + 1 }),
  };
}

/** Opens the training and validation data of a run. */
export async function openTrainData(files: DataFiles, generated: GeneratedDataOptions): Promise<TrainData> {
  switch (files.kind) {
    case 'shapes': {
      const { train, val } = shapesSplits({
        seed: generated.seed,
        size: generated.size,
        numClasses: generated.numClasses,
      });
      return { train, val, classes: train.classes };
    }
    case 'synthetic': {
      const make = (length: number, seed: number) =>
        new SyntheticDataset({
          length,
          height: generated.size,
          width: generated.size,
          classes: generated.numClasses,
          seed,
        });
      const train = make(generated.batchSize * 100, generated.seed);
      return { train, val: make(generated.batchSize * 10, generated.seed + 1), classes: train.classes };
    }
    case 'imagefolder': {
      const train = await ImageFolder.open(files.train);
      if (files.val === null) {
        const [kept, held] = randomSplit(train, [0.9, 0.1], { seed: generated.seed, stratified: true });
        if (kept === undefined || held === undefined) {
          throw new Error('unreachable: randomSplit returns one subset per fraction');
        }
        return {
          train: kept,
          val: held,
          classes: train.classes,
          note: `no val/ folder: holding out ${held.length} of the ${train.length} training images for validation`,
        };
      }
      const val = await ImageFolder.open(files.val);
      if (val.classes.join('\n') !== train.classes.join('\n')) {
        throw new CliError(
          `the class folders of train/ (${train.classes.length}) and val/ (${val.classes.length}) differ`,
          'Both must hold the same class sub-folders, so that labels mean the same in both.',
        );
      }
      return { train, val, classes: train.classes };
    }
    case 'cifar10':
    case 'cifar100': {
      const train = await CifarDataset.open(files.train, { variant: files.kind });
      const val = await CifarDataset.open(files.test, { variant: files.kind });
      return { train, val, classes: train.classes };
    }
    case 'mnist':
    case 'fashion-mnist': {
      const classes = files.kind === 'fashion-mnist' ? { classes: FASHION_MNIST_CLASSES } : { classes: 10 };
      const train = await IdxDataset.open(files.trainImages, files.trainLabels, classes);
      const val = await IdxDataset.open(files.testImages, files.testLabels, classes);
      return { train, val, classes: train.classes };
    }
  }
}

/** Opens the evaluation data of a dataset (the validation or test split). */
export async function openEvalData(files: DataFiles, generated: GeneratedDataOptions): Promise<Dataset> {
  switch (files.kind) {
    case 'imagefolder':
      return files.val === null ? (await openTrainData(files, generated)).val : ImageFolder.open(files.val);
    case 'cifar10':
    case 'cifar100':
      return CifarDataset.open(files.test, { variant: files.kind });
    case 'mnist':
    case 'fashion-mnist':
      return IdxDataset.open(files.testImages, files.testLabels, {
        classes: files.kind === 'fashion-mnist' ? FASHION_MNIST_CLASSES : 10,
      });
    case 'shapes':
    case 'synthetic':
      return (await openTrainData(files, generated)).val;
  }
}

/** A model's architecture, as recorded in a run's config or read from a weights file. */
export interface Architecture {
  model: ModelName;
  numClasses: number;
  smallInput: boolean;
  /** The blocks' inner widths of a channel-pruned model (`ResNetOptions.blockWidths`); absent for torchvision's. */
  blockWidths?: number[][];
}

/**
 * Reads the architecture from a state dict's names and shapes (torchvision's): the block type from
 * `layer1.0.conv3`, the depth from the number of blocks in `layer3`, the classes from `fc.weight`,
 * the stem from `conv1.weight` (3x3: the small-image stem). Returns undefined when the names are
 * not a ResNet's.
 */
export function architectureOf(tensors: StateDict): Architecture | undefined {
  const get = (name: string) => tensors.get(name);
  const fc = get('fc.weight');
  const conv1 = get('conv1.weight');
  if (!fc || !conv1 || fc.shape.length !== 2 || conv1.shape.length !== 4) return undefined;
  let blocks = 0;
  while (get(`layer3.${blocks}.conv1.weight`)) blocks++;
  const bottleneck = get('layer1.0.conv3.weight') !== undefined;
  const table: Record<string, ModelName> = {
    'basic-2': 'resnet18',
    'basic-6': 'resnet34',
    'bottleneck-6': 'resnet50',
    'bottleneck-23': 'resnet101',
    'bottleneck-36': 'resnet152',
  };
  const model = table[`${bottleneck ? 'bottleneck' : 'basic'}-${blocks}`];
  if (!model) return undefined;
  const arch: Architecture = { model, numClasses: fc.shape[0]!, smallInput: conv1.shape[2] === 3 };
  const widths = blockWidthsOf(tensors, modelDepth(model));
  if (widths) arch.blockWidths = widths;
  return arch;
}

/**
 * The inner widths of every block from the output channels of its `conv1` (and `conv2` in a
 * Bottleneck), or undefined when they are torchvision's (or a block is missing: the state-dict
 * check names it then).
 */
function blockWidthsOf(tensors: StateDict, depth: ResNetDepth): number[][] | undefined {
  const spec = RESNET_DEPTHS[depth];
  const inner = spec.block === 'bottleneck' ? [1, 2] : [1];
  const widths: number[][] = [];
  for (const [stage, blocks] of spec.layers.entries()) {
    for (let b = 0; b < blocks; b++) {
      const w = inner.map((i) => tensors.get(`layer${stage + 1}.${b}.conv${i}.weight`)?.shape[0]);
      if (w.some((v) => v === undefined)) return undefined;
      widths.push(w as number[]);
    }
  }
  return widths.flat().join(',') === defaultBlockWidths(depth).flat().join(',') ? undefined : widths;
}

/** Reads a safetensors file's tensors, as a {@link CliError} naming the file when it cannot. */
export async function readSafetensors(path: string): Promise<{ tensors: StateDict; metadata: Record<string, string> }> {
  let bytes: Uint8Array;
  try {
    bytes = await readFile(path);
  } catch (error) {
    throw new CliError(`cannot read '${path}': ${(error as Error).message}`);
  }
  return decodeSafetensors(bytes, path);
}

/** Builds a ResNet of the given architecture on `device`. */
export function buildModel(arch: Architecture, options: { device: string; seed?: number }): ResNet {
  return new ResNet(modelDepth(arch.model), {
    numClasses: arch.numClasses,
    smallInput: arch.smallInput,
    ...(arch.blockWidths ? { blockWidths: arch.blockWidths } : {}),
    device: options.device,
    ...(options.seed !== undefined ? { seed: options.seed } : {}),
  });
}

/**
 * What `train` records of a run (in checkpoints, `summary.json` and `config.json`), so that
 * `eval`, `predict` and `--resume` can rebuild the model and its input pipeline.
 */
export interface RunConfig {
  model: ModelName;
  numClasses: number;
  smallInput: boolean;
  /** The blocks' inner widths of a channel-pruned model; absent for torchvision's. */
  blockWidths?: number[][];
  classes: string[];
  dataset: DatasetName;
  seed: number;
  trainCropSize: number;
  valResizeSize: number;
  valCropSize: number;
  interpolation: Interpolation;
  mean: number[];
  std: number[];
  /** The precision the run trained (and evaluated) in. */
  amp: AmpName;
  /** The options of the run, resolved (defaults included), re-runnable with `--config`. */
  options: Record<string, unknown>;
}

/** Reads the fields of a {@link RunConfig} that are present and well-typed in `value`. */
export function partialRunConfig(value: unknown): Partial<RunConfig> {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return {};
  const v = value as Record<string, unknown>;
  const out: Partial<RunConfig> = {};
  if (typeof v.model === 'string' && (MODEL_NAMES as readonly string[]).includes(v.model)) {
    out.model = v.model as ModelName;
  }
  if (typeof v.numClasses === 'number' && Number.isInteger(v.numClasses) && v.numClasses > 0) {
    out.numClasses = v.numClasses;
  }
  if (typeof v.smallInput === 'boolean') out.smallInput = v.smallInput;
  if (
    Array.isArray(v.blockWidths) &&
    v.blockWidths.every((w) => Array.isArray(w) && w.every((x) => Number.isInteger(x) && (x as number) > 0))
  ) {
    out.blockWidths = v.blockWidths as number[][];
  }
  if (Array.isArray(v.classes) && v.classes.every((c) => typeof c === 'string')) out.classes = v.classes;
  if (typeof v.dataset === 'string' && (DATASET_NAMES as readonly string[]).includes(v.dataset)) {
    out.dataset = v.dataset as DatasetName;
  }
  for (const key of ['seed', 'trainCropSize', 'valResizeSize', 'valCropSize'] as const) {
    if (typeof v[key] === 'number' && Number.isInteger(v[key])) out[key] = v[key];
  }
  if (typeof v.interpolation === 'string' && ['nearest', 'bilinear', 'bicubic', 'lanczos'].includes(v.interpolation)) {
    out.interpolation = v.interpolation as Interpolation;
  }
  for (const key of ['mean', 'std'] as const) {
    const a = v[key];
    if (
      Array.isArray(a) &&
      (a.length === 1 || a.length === 3) &&
      a.every((x) => typeof x === 'number' && Number.isFinite(x))
    ) {
      out[key] = a as number[];
    }
  }
  if (v.options !== null && typeof v.options === 'object' && !Array.isArray(v.options)) {
    out.options = v.options as Record<string, unknown>;
  }
  // Runs recorded before the precision had its own field kept it among the options, when given.
  const amp = v.amp ?? out.options?.amp ?? (out.options !== undefined ? 'none' : undefined);
  if (typeof amp === 'string' && (AMP_NAMES as readonly string[]).includes(amp)) out.amp = amp as AmpName;
  return out;
}

/**
 * The run config recorded beside a weights file by `train`: in the `summary.json` of its folder
 * (written at the end of a run), else in the folder's latest checkpoint.
 */
export async function runConfigBeside(
  weightsFile: string,
): Promise<{ file: string; config: Partial<RunConfig> } | undefined> {
  const dir = dirname(weightsFile);
  const summary = join(dir, 'summary.json');
  if (existsSync(summary)) {
    try {
      const config = partialRunConfig((JSON.parse(readFileSync(summary, 'utf8')) as { config?: unknown }).config);
      if (config.model !== undefined) return { file: summary, config };
    } catch {
      // An unreadable summary is not an error: the checkpoint or the options say the rest.
    }
  }
  if (existsSync(join(dir, 'checkpoints', 'latest.json'))) {
    try {
      const info = await Trainer.readCheckpointInfo(join(dir, 'checkpoints'));
      const config = partialRunConfig(info.config);
      if (config.model !== undefined) return { file: info.file, config };
    } catch {
      // As above.
    }
  }
  return undefined;
}

/** The newest run folder under `root` that holds a checkpoint pointer, for `--resume` without an output folder. */
export function latestRun(root: string): string | undefined {
  if (!existsSync(root)) return undefined;
  const runs = readdirSync(root, { withFileTypes: true })
    .filter((e) => e.isDirectory() && existsSync(join(root, e.name, 'checkpoints', 'latest.json')))
    .map((e) => ({ dir: join(root, e.name), time: statSync(join(root, e.name, 'checkpoints', 'latest.json')).mtimeMs }))
    .sort((a, b) => b.time - a.time);
  return runs[0]?.dir;
}

/** A run folder name from the time: `2024-05-01_12-30-05`. */
export function timestampName(date = new Date()): string {
  const p = (n: number) => String(n).padStart(2, '0');
  return `${date.getFullYear()}-${p(date.getMonth() + 1)}-${p(date.getDate())}_${p(date.getHours())}-${p(date.getMinutes())}-${p(date.getSeconds())}`;
}

/** Reads a class-names file: one name per line, blank lines and surrounding spaces ignored. */
export function readClassNames(path: string): string[] {
  const names = readFileSync(path, 'utf8')
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter((l) => l.length > 0);
  if (names.length === 0) throw new UsageError(`--classes file '${path}' holds no class names (one per line)`);
  return names;
}

/** Formats a fraction as a percentage with two decimals. */
export function percent(fraction: number): string {
  return `${(100 * fraction).toFixed(2)}%`;
}

/** Option table entries several commands share. */
export const SHARED_OPTIONS = {
  device: {
    name: 'device',
    type: 'string',
    default: 'cpu',
    valueName: 'DEVICE',
    help: 'Where to run: cpu, cuda (the first GPU) or cuda:N.',
  },
  amp: {
    name: 'amp',
    type: 'choice',
    choices: AMP_NAMES,
    default: 'none',
    help: 'Mixed precision: bf16 or fp16 activations over fp32 weights (fp16 needs CUDA and uses loss scaling).',
  },
  workers: {
    name: 'workers',
    short: 'j',
    type: 'int',
    min: 0,
    valueName: 'N',
    defaultText: 'CPU cores - 1',
    help: 'Data-loading worker threads, at most one per CPU core; 0 loads in the main thread.',
  },
  interpolation: {
    name: 'interpolation',
    type: 'choice',
    choices: ['bilinear', 'bicubic', 'nearest', 'lanczos'],
    help: 'Resampling of the resizes.',
  },
  json: { name: 'json', type: 'boolean', help: 'Print the result as JSON on stdout instead of text.' },
} satisfies Record<string, OptionSpec>;

/** The name a file is shown by in output: relative to `cwd` when inside it. */
export function displayPath(path: string, cwd: string): string {
  return path.startsWith(cwd + '/') ? path.slice(cwd.length + 1) : path === cwd ? '.' : path;
}

/**
 * The data-loading workers for `requested` (the default when undefined): more threads than CPU
 * cores only compete with each other and the training loop, so a larger count is capped, with a
 * warning through `warn`.
 */
export function workerCount(requested: number | undefined, warn: (text: string) => void): number {
  if (requested === undefined) return defaultWorkers();
  const cores = availableParallelism();
  if (requested <= cores) return requested;
  warn(
    `warning: --workers ${requested} is more than the ${cores} CPU core${cores === 1 ? '' : 's'} here; using ${cores}`,
  );
  return cores;
}

/**
 * Refuses a batch whose pixels alone (RGB bytes) would not fit in this machine's memory (the
 * loader's buffers hold at least one batch), before anything is built, with the size and what to try.
 * @throws {@link CliError} with code `ERR_RC_OUT_OF_MEMORY`.
 */
export function checkBatchMemory(batchSize: number, size: number): void {
  const bytes = batchSize * size * size * 3;
  const total = totalmem();
  if (bytes <= total) return;
  throw new CliError(
    `out of memory: a batch of ${batchSize.toLocaleString('en-US')} images of ${size}x${size} px needs ${formatGiB(bytes)} for its pixels alone, ` +
      `more than this machine's ${formatGiB(total)}`,
    'Use a smaller -b/--batch-size; --accumulate K (train) keeps the effective batch with K smaller ones per step.',
    'ERR_RC_OUT_OF_MEMORY',
  );
}

function formatGiB(bytes: number): string {
  return `${(bytes / 2 ** 30).toFixed(1)} GiB`;
}
