/**
 * The model `eval` and `predict` run, from `--weights`, `--checkpoint` or an inference artifact
 * (`--model DIR`: the folder `export --format artifact` writes), whose manifest gives the
 * architecture, the input pipeline and the class names in place of a run's config.
 * @packageDocumentation
 */
import { statSync } from 'node:fs';
import { resolve } from 'node:path';
import { loadInferenceArtifact } from '../inference/artifact.js';
import type { ArtifactPreprocessing } from '../inference/artifact-manifest.js';
import { MODEL_NAMES, displayPath, type Architecture, type ModelName } from './common.js';
import { resolveEvalData, type EvalData, type EvalDataArgs } from './eval-data.js';
import { checkModelSource, loadModel, modelSourceOptions, type LoadedModel } from './inference.js';
import { UsageError, type OptionSpec } from './options.js';

/** The values of the model-source options as the commands parse them. */
export interface ModelSourceValues {
  weights: string | undefined;
  checkpoint: string | undefined;
  /** A model name, or the path of an artifact folder. */
  model: string | undefined;
  numClasses: number | undefined;
}

/** The model-source options with `--model` taking a network name or an artifact folder. */
export function modelSourceOptionsWithArtifact(section: string): OptionSpec[] {
  return modelSourceOptions(section).map((option) =>
    option.name === 'model'
      ? {
          name: 'model',
          type: 'string',
          valueName: 'NAME|DIR',
          defaultText: 'read from the file',
          help: `The network (${MODEL_NAMES.join(', ')}), needed only when the weights file does not say; or an inference artifact folder (model.json and model.safetensors, written by export --format artifact) to run instead of --weights or --checkpoint.`,
          section,
        }
      : option,
  );
}

/** What `--model` names: a network, or an artifact folder (its absolute path). */
export type ModelChoice = { name: ModelName } | { artifact: string };

/**
 * Reads `--model` and checks that one model source is given.
 * @throws {@link UsageError} for a `--model` that is neither a network nor a folder, an artifact
 *   given with `--weights` or `--checkpoint`, or no source at all.
 */
export function checkModelChoice(values: ModelSourceValues, cwd: string): ModelChoice | undefined {
  const model = values.model;
  let choice: ModelChoice | undefined;
  if (model !== undefined) {
    if ((MODEL_NAMES as readonly string[]).includes(model)) {
      choice = { name: model as ModelName };
    } else {
      const path = resolve(cwd, model);
      if (!statSync(path, { throwIfNoEntry: false })?.isDirectory()) {
        throw new UsageError(
          `--model expects one of ${MODEL_NAMES.join(', ')} or an inference artifact folder, got '${model}'`,
          'Write an artifact with: resnet-cuda export --format artifact --weights FILE --output DIR',
        );
      }
      choice = { artifact: path };
    }
  }
  if (choice && 'artifact' in choice) {
    if (values.weights !== undefined || values.checkpoint !== undefined) {
      throw new UsageError(
        `give either an artifact (--model ${model}) or --${values.weights !== undefined ? 'weights' : 'checkpoint'}, not both`,
      );
    }
    return choice;
  }
  if (values.weights === undefined && values.checkpoint === undefined) {
    throw new UsageError(
      'give the model to use with --weights FILE or --checkpoint FILE, or an inference artifact with --model DIR',
      "Train one with 'resnet-cuda train'; its folder holds model.safetensors and checkpoints/.",
    );
  }
  checkModelSource(values);
  return choice;
}

/** A loaded model, with the preprocessing of its artifact when it comes from one. */
export interface LoadedSource extends LoadedModel {
  /** The artifact's input pipeline: part of the model, whatever the data. */
  preprocessing?: ArtifactPreprocessing;
}

/** Loads the model of an artifact folder as a {@link LoadedModel}, its preprocessing as the run's config. */
async function loadArtifactModel(
  dir: string,
  numClasses: number | undefined,
  device: string,
  cwd: string,
): Promise<LoadedSource> {
  const artifact = await loadInferenceArtifact(dir, { device });
  const { architecture: a, preprocessing: p } = artifact;
  if (numClasses !== undefined && numClasses !== a.numClasses) {
    artifact.dispose();
    throw new UsageError(
      `--num-classes ${numClasses} does not match the artifact, whose model has ${a.numClasses} classes`,
    );
  }
  const arch: Architecture = {
    model: `resnet${a.depth}`,
    numClasses: a.numClasses,
    smallInput: a.smallInput,
    ...(a.blockWidths ? { blockWidths: a.blockWidths } : {}),
  };
  return {
    model: artifact.model,
    arch,
    config: {
      ...arch,
      ...(artifact.classes ? { classes: artifact.classes } : {}),
      valResizeSize: p.resize,
      valCropSize: p.crop,
      interpolation: p.interpolation,
      mean: p.mean,
      std: p.std,
    },
    classes: artifact.classes ?? undefined,
    source: `artifact ${displayPath(dir, cwd)}`,
    preprocessing: p,
  };
}

/** Builds the model that the options name on `device`: from an artifact, or as {@link loadModel} does. */
export async function loadModelSource(
  values: ModelSourceValues,
  choice: ModelChoice | undefined,
  device: string,
  cwd: string,
): Promise<LoadedSource> {
  if (choice && 'artifact' in choice) return loadArtifactModel(choice.artifact, values.numClasses, device, cwd);
  return loadModel(
    {
      ...(values.weights !== undefined ? { weights: values.weights } : {}),
      ...(values.checkpoint !== undefined ? { checkpoint: values.checkpoint } : {}),
      ...(choice ? { model: choice.name } : {}),
      ...(values.numClasses !== undefined ? { numClasses: values.numClasses } : {}),
    },
    device,
    cwd,
  );
}

/**
 * {@link resolveEvalData} for a loaded source: an artifact's resize, crop, interpolation, mean and
 * std apply to any data (a run's apply only to the run's own kind of data), each unless its option
 * is given.
 */
export function resolveSourceEvalData(
  a: EvalDataArgs,
  given: string | undefined,
  loaded: LoadedSource,
  split: 'eval' | 'train',
): EvalData {
  const p = loaded.preprocessing;
  if (p === undefined) return resolveEvalData(a, given, loaded, split);
  const crop = a.valCropSize ?? p.crop;
  const resolved = resolveEvalData(
    {
      ...a,
      valCropSize: crop,
      valResizeSize: a.valResizeSize ?? (crop <= p.resize ? p.resize : undefined),
      interpolation: a.interpolation ?? p.interpolation,
    },
    given,
    loaded,
    split,
  );
  return { ...resolved, settings: { ...resolved.settings, mean: [...p.mean], std: [...p.std] } };
}
