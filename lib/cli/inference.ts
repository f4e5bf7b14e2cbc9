/**
 * Rebuilding a trained model for `eval` and `predict`: from a training checkpoint (whose run
 * config names the architecture, the classes and the input pipeline) or from a weights file
 * (whose tensor names and shapes give the architecture; the run config is taken from its run
 * folder when it has one), with `--model` and `--num-classes` as checks or, for foreign files,
 * as the missing facts.
 * @packageDocumentation
 */
import { existsSync } from 'node:fs';
import type { Interpolation } from '../data/transforms.js';
import { defined } from '../errors.js';
import type { StateDict } from '../nn/module.js';
import { readWeightsFile } from '../nn/pretrained.js';
import type { ResNet } from '../nn/resnet.js';
import { SGD } from '../optim/sgd.js';
import { Trainer } from '../train/trainer.js';
import { hasQatState, prepareQat } from '../train/qat.js';
import {
  MODEL_NAMES,
  SHARED_OPTIONS,
  ampOption,
  architectureOf,
  buildModel,
  checkAmp,
  displayPath,
  imageSizeOption,
  partialRunConfig,
  readSafetensors,
  runConfigBeside,
  type AmpName,
  type Architecture,
  type ModelName,
  type RunConfig,
} from './common.js';
import { CliError, UsageError, type CliStream, type OptionSpec } from './options.js';

/** The options that say which model to load, shared by `eval` and `predict`. */
export function modelSourceOptions(section: string): OptionSpec[] {
  return [
    {
      name: 'weights',
      type: 'path',
      mustExist: 'file',
      valueName: 'FILE',
      help: "A weights file: safetensors (train's model.safetensors) or PyTorch's .pth/.pt (torch.save of a state dict, such as torchvision's model zoo files, or a training checkpoint holding one under model).",
      section,
    },
    {
      name: 'checkpoint',
      type: 'path',
      valueName: 'FILE',
      help: 'A training checkpoint (checkpoints/*.safetensors), or a run folder for its latest; the model, classes and input sizes are read from it.',
      section,
    },
    {
      name: 'model',
      type: 'choice',
      choices: MODEL_NAMES,
      defaultText: 'read from the file',
      help: 'The network; needed only when the file does not say.',
      section,
    },
    {
      name: 'num-classes',
      type: 'int',
      min: 1,
      valueName: 'N',
      defaultText: 'read from the file',
      help: 'Output classes; a check when the file says.',
      section,
    },
  ];
}

/** What {@link loadModel} returns. */
export interface LoadedModel {
  model: ResNet;
  arch: Architecture;
  /** The training run's config, as far as it is known. */
  config: Partial<RunConfig>;
  /** Class names from the checkpoint or run, when known. */
  classes: string[] | undefined;
  /** A phrase naming where the model came from, for the log. */
  source: string;
}

/** Checks that exactly one of `--weights` and `--checkpoint` is given. */
export function checkModelSource(values: { weights?: string; checkpoint?: string }): void {
  if (values.weights === undefined && values.checkpoint === undefined) {
    throw new UsageError(
      'give the model to use with --weights FILE or --checkpoint FILE',
      "Train one with 'resnet-cuda train'; its folder holds model.safetensors and checkpoints/.",
    );
  }
  if (values.weights !== undefined && values.checkpoint !== undefined) {
    throw new UsageError('give either --weights or --checkpoint, not both');
  }
  if (values.checkpoint !== undefined && !existsSync(values.checkpoint)) {
    throw new UsageError(`--checkpoint '${values.checkpoint}' does not exist`);
  }
}

function stripPrefix(tensors: StateDict, prefix: string): StateDict {
  const out: StateDict = new Map();
  for (const [name, entry] of tensors) if (name.startsWith(prefix)) out.set(name.slice(prefix.length), entry);
  return out;
}

/**
 * Builds the model of a weights file or checkpoint on `device` and loads its weights.
 * @throws {@link UsageError} when `--model` or `--num-classes` contradict the file;
 *   {@link CliError} when the file is not a ResNet's or cannot be read.
 */
export async function loadModel(
  source: { weights?: string; checkpoint?: string; model?: ModelName; numClasses?: number },
  device: string,
  cwd: string,
): Promise<LoadedModel> {
  let config: Partial<RunConfig> = {};
  let classes: string[] | undefined;
  let tensors: StateDict;
  let file: string;
  let what: string;
  if (source.checkpoint !== undefined) {
    const info = await Trainer.readCheckpointInfo(source.checkpoint);
    file = info.file;
    config = partialRunConfig(info.config);
    classes = info.classNames ?? config.classes;
    tensors = stripPrefix((await readSafetensors(file)).tensors, 'model.');
    what = `checkpoint ${displayPath(file, cwd)} (epoch ${info.epoch}, step ${info.step})`;
  } else {
    file = defined(source.weights, 'the weights file (neither weights nor checkpoint was given)');
    tensors = readWeightsFile(file);
    const beside = await runConfigBeside(file);
    if (beside) {
      config = beside.config;
      classes = config.classes;
    }
    what = `weights ${displayPath(file, cwd)}${beside ? ` (run config from ${displayPath(beside.file, cwd)})` : ''}`;
  }
  const found = architectureOf(tensors);
  if (!found) {
    throw new CliError(
      `'${file}' does not hold ResNet weights with torchvision's names (conv1.weight, layer1.0…, fc.weight)`,
    );
  }
  if (source.model !== undefined && source.model !== found.model) {
    throw new UsageError(`--model ${source.model} does not match '${file}', which holds a ${found.model}`);
  }
  if (source.numClasses !== undefined && source.numClasses !== found.numClasses) {
    throw new UsageError(
      `--num-classes ${source.numClasses} does not match '${file}', whose classifier has ${found.numClasses} classes`,
    );
  }
  if (classes !== undefined && classes.length !== found.numClasses) classes = undefined;
  const model = buildModel(found, { device });
  // The weights of a quantization-aware run: the model computes as it was trained, fake-quantized.
  if (hasQatState(tensors)) prepareQat(model);
  model.loadStateDict(tensors);
  model.eval();
  return { model, arch: found, config, classes, source: what };
}

/** The names and help defaults of the input options of `eval` and `predict`, which differ. */
export interface InputOptionNames {
  resize: string;
  crop: string;
  resizeDefault: string;
  cropDefault: string;
  batchSize: number;
}

/**
 * The options that shape the input of `eval` and `predict`: resize, crop, interpolation and batch
 * size, then the device and the precision (by default the run's).
 */
export function inputOptions(names: InputOptionNames, section: string, runSection: string): OptionSpec[] {
  return [
    imageSizeOption(names.resize, 'Resize of the smaller edge.', names.resizeDefault, section),
    imageSizeOption(names.crop, 'Center crop size.', names.cropDefault, section),
    { ...SHARED_OPTIONS.interpolation, defaultText: "the run's, else bilinear", section },
    {
      name: 'batch-size',
      short: 'b',
      type: 'int',
      min: 1,
      default: names.batchSize,
      valueName: 'N',
      help: 'Images per batch.',
      section,
    },
    { ...SHARED_OPTIONS.device, section: runSection },
    {
      ...SHARED_OPTIONS.amp,
      default: undefined,
      defaultText: "the run's (as train evaluated), else none",
      section: runSection,
    },
  ];
}

/** What {@link inputSettings} resolves: the evaluation transform's settings. */
export interface InputSettings {
  valResizeSize: number;
  valCropSize: number;
  mean: number[];
  std: number[];
  interpolation: Interpolation;
}

/**
 * The evaluation input pipeline: each setting as given, else the run's, else the fallback's (a
 * given resize alone caps the fallback crop; a given crop alone raises the fallback resize).
 * @throws {@link UsageError} when the crop is larger than the resize, naming the option given.
 */
export function inputSettings(
  given: { resize: number | undefined; crop: number | undefined; interpolation: Interpolation | undefined },
  run: Partial<RunConfig>,
  fallback: { resize: number; crop: number; mean: number[]; std: number[] },
  names: Pick<InputOptionNames, 'resize' | 'crop'>,
): InputSettings {
  const crop =
    given.crop ??
    run.valCropSize ??
    (given.resize !== undefined ? Math.min(given.resize, fallback.crop) : fallback.crop);
  const resize = given.resize ?? run.valResizeSize ?? Math.max(crop, fallback.resize);
  if (crop > resize) {
    throw new UsageError(
      given.crop !== undefined
        ? `--${names.crop} ${crop} is larger than ${given.resize !== undefined ? `--${names.resize}` : "the run's resize"} ${resize}`
        : `--${names.resize} ${resize} is smaller than the run's crop ${crop}`,
    );
  }
  return {
    valResizeSize: resize,
    valCropSize: crop,
    mean: run.mean ?? fallback.mean,
    std: run.std ?? fallback.std,
    interpolation: given.interpolation ?? run.interpolation ?? 'bilinear',
  };
}

/**
 * The precision of evaluation: `--amp` when given; else the run's, so that `eval` reports what
 * `train` reported (except fp16 off CUDA, which falls back to fp32 with a note); else none.
 */
export function inferencePrecision(
  given: AmpName | undefined,
  run: AmpName | undefined,
  device: string,
): { amp: AmpName; note?: string } {
  if (given !== undefined) {
    checkAmp(given, device);
    return { amp: given };
  }
  if (run === 'fp16' && !device.startsWith('cuda')) {
    return {
      amp: 'none',
      note: `note: the run trained with --amp fp16, which needs CUDA; running in fp32 on ${device} (choose with --amp)`,
    };
  }
  return { amp: run ?? 'none' };
}

/** A Trainer that only evaluates and predicts: no optimizer steps, no files. */
export function inferenceTrainer(
  model: ResNet,
  o: { device: string; amp: AmpName; progress: CliStream | false; classNames?: readonly string[] | undefined },
): Trainer {
  return new Trainer({
    model,
    // The Trainer is built around an optimizer; evaluation never steps it.
    optimizer: new SGD(model, { lr: 0 }),
    device: o.device,
    amp: ampOption(o.amp),
    progress: o.progress,
    tensorboard: false,
    jsonLog: false,
    plots: false,
    ...(o.classNames ? { classNames: [...o.classNames] } : {}),
  });
}
