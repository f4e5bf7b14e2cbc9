/**
 * Rebuilding a trained model for `eval` and `predict`: from a training checkpoint (whose run
 * config names the architecture, the classes and the input pipeline) or from a weights file
 * (whose tensor names and shapes give the architecture; the run config is taken from its run
 * folder when it has one), with `--model` and `--num-classes` as checks or, for foreign files,
 * as the missing facts.
 * @packageDocumentation
 */
import { existsSync } from 'node:fs';
import type { StateDict } from '../nn/module.js';
import type { ResNet } from '../nn/resnet.js';
import { Trainer } from '../train/trainer.js';
import {
  MODEL_NAMES,
  architectureOf,
  buildModel,
  displayPath,
  partialRunConfig,
  readSafetensors,
  runConfigBeside,
  type Architecture,
  type ModelName,
  type RunConfig,
} from './common.js';
import { CliError, UsageError, type OptionSpec } from './options.js';

/** The options that say which model to load, shared by `eval` and `predict`. */
export function modelSourceOptions(section: string): OptionSpec[] {
  return [
    { name: 'weights', type: 'path', mustExist: 'file', valueName: 'FILE', help: "A safetensors weights file (train's model.safetensors, or torchvision's weights converted to safetensors).", section },
    { name: 'checkpoint', type: 'path', valueName: 'FILE', help: 'A training checkpoint (checkpoints/*.safetensors), or a run folder for its latest; the model, classes and input sizes are read from it.', section },
    { name: 'model', type: 'choice', choices: MODEL_NAMES, defaultText: 'read from the file', help: 'The network; needed only when the file does not say.', section },
    { name: 'num-classes', type: 'int', min: 1, valueName: 'N', defaultText: 'read from the file', help: 'Output classes; a check when the file says.', section },
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
    throw new UsageError('give the model to use with --weights FILE or --checkpoint FILE', "Train one with 'resnet-cuda train'; its folder holds model.safetensors and checkpoints/.");
  }
  if (values.weights !== undefined && values.checkpoint !== undefined) throw new UsageError('give either --weights or --checkpoint, not both');
  if (values.checkpoint !== undefined && !existsSync(values.checkpoint)) throw new UsageError(`--checkpoint '${values.checkpoint}' does not exist`);
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
    file = source.weights!;
    tensors = (await readSafetensors(file)).tensors;
    const beside = await runConfigBeside(file);
    if (beside) {
      config = beside.config;
      classes = config.classes;
    }
    what = `weights ${displayPath(file, cwd)}${beside ? ` (run config from ${displayPath(beside.file, cwd)})` : ''}`;
  }
  const found = architectureOf(tensors);
  if (!found) {
    throw new CliError(`'${file}' does not hold ResNet weights with torchvision's names (conv1.weight, layer1.0…, fc.weight)`);
  }
  if (source.model !== undefined && source.model !== found.model) throw new UsageError(`--model ${source.model} does not match '${file}', which holds a ${found.model}`);
  if (source.numClasses !== undefined && source.numClasses !== found.numClasses) {
    throw new UsageError(`--num-classes ${source.numClasses} does not match '${file}', whose classifier has ${found.numClasses} classes`);
  }
  if (classes !== undefined && classes.length !== found.numClasses) classes = undefined;
  const model = buildModel(found, { device });
  model.loadStateDict(tensors);
  model.eval();
  return { model, arch: found, config, classes, source: what };
}
