/**
 * The data that `eval` and `embed` run trained weights over: as given (DATA and `--dataset`), else
 * the run's own (its DATA folder or its generated data), else the built-in dataset; read at the
 * run's input settings when it is the run's kind of data.
 * @packageDocumentation
 */
import type { Interpolation } from '../data/transforms.js';
import {
  DATASET_NAMES,
  checkBatchMemory,
  datasetDefaults,
  locateData,
  type DataFiles,
  type DatasetName,
  type GeneratedDataOptions,
} from './common.js';
import { inputSettings, type InputSettings, type LoadedModel } from './inference.js';
import type { OptionSpec } from './options.js';

/** The names and defaults of the evaluation input options, for `inputOptions`. */
export const EVAL_INPUT_NAMES = {
  resize: 'val-resize-size',
  crop: 'val-crop-size',
  resizeDefault: "the run's, else 256 for imagefolder and the crop size for the small datasets",
  cropDefault: "the run's, else 224 for imagefolder, 32 for CIFAR and the built-in dataset, 28 for MNIST",
  batchSize: 64,
};

/** The `DATA` positional of the commands that read data as `eval` does. */
export const EVAL_DATA_POSITIONAL = {
  name: 'DATA',
  help: 'The dataset folder: an image folder (DATA/val/<class>/<image>, or DATA/<class>/<image>), or with --dataset the CIFAR or MNIST files.',
  configKey: 'data',
};

/** `--dataset` of the commands that read data as `eval` does. */
export const EVAL_DATASET_OPTION: OptionSpec = {
  name: 'dataset',
  type: 'choice',
  choices: DATASET_NAMES,
  valueName: 'KIND',
  defaultText: "the run's, else imagefolder with DATA and shapes without",
  help: 'What DATA holds.',
  section: 'Data',
};

/** The options {@link resolveEvalData} reads. */
export interface EvalDataArgs {
  dataset: DatasetName | undefined;
  valResizeSize: number | undefined;
  valCropSize: number | undefined;
  interpolation: Interpolation | undefined;
  batchSize: number;
}

/** The data chosen, where it is, and how to read it. */
export interface EvalData {
  dataset: DatasetName;
  /** The folder read, or undefined for generated data. */
  data: string | undefined;
  files: DataFiles;
  settings: InputSettings;
  /** How generated data (shapes, synthetic) is made, as the run made it when it is the run's. */
  generated: GeneratedDataOptions;
}

const FILE_KINDS: readonly DatasetName[] = ['imagefolder', 'cifar10', 'cifar100', 'mnist', 'fashion-mnist'];

/**
 * Chooses the data for `loaded`'s weights: `given` (DATA) of `a.dataset`'s kind, else the run's
 * own, else the built-in dataset; its `split` files; and the input settings, which are the run's
 * for its own kind of data (its resampling applies to any).
 * @throws {@link UsageError} for missing or malformed data and contradicting sizes.
 */
export function resolveEvalData(
  a: EvalDataArgs,
  given: string | undefined,
  loaded: LoadedModel,
  split: 'eval' | 'train',
): EvalData {
  const { config } = loaded;
  const runData = typeof config.options?.data === 'string' ? config.options.data : undefined;
  const runKind = config.dataset;
  const dataset: DatasetName =
    a.dataset ??
    (given !== undefined
      ? runKind !== undefined && FILE_KINDS.includes(runKind)
        ? runKind
        : 'imagefolder'
      : (runKind ?? 'shapes'));
  const data = given ?? (FILE_KINDS.includes(dataset) && runKind === dataset ? runData : undefined);
  const files = locateData(dataset, data, split);
  const defaults = datasetDefaults(dataset);
  const sameData = config.dataset === dataset;
  const settings = inputSettings(
    { resize: a.valResizeSize, crop: a.valCropSize, interpolation: a.interpolation },
    sameData ? config : { ...(config.interpolation !== undefined ? { interpolation: config.interpolation } : {}) },
    { resize: defaults.valResizeSize, crop: defaults.valCropSize, mean: defaults.mean, std: defaults.std },
    EVAL_INPUT_NAMES,
  );
  checkBatchMemory(a.batchSize, settings.valCropSize);
  const classes = loaded.arch.numClasses;
  const generated = {
    seed: sameData ? (config.seed ?? 0) : 0,
    size: (sameData ? config.trainCropSize : undefined) ?? settings.valCropSize,
    numClasses: (dataset === 'shapes' && classes >= 2 && classes <= 6) || dataset === 'synthetic' ? classes : 4,
    batchSize: a.batchSize,
  };
  return { dataset, data, files, settings, generated };
}
