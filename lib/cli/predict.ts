/**
 * `resnet-cuda predict`: the top-k classes of image files, decoded and resized by the same
 * transform pipeline as evaluation, through a DataLoader over an `ImageFiles` dataset.
 * @packageDocumentation
 */
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { compareCodePoints } from '../data/dataset.js';
import { IMG_EXTENSIONS } from '../data/image-folder.js';
import { ImageFiles } from '../data/image-files.js';
import { DataLoader, DataLoaderError } from '../data/loader.js';
import type { Compose, Interpolation } from '../data/transforms.js';
import { defined } from '../errors.js';
import { IMAGENET_MEAN, IMAGENET_STD } from '../nn/input.js';
import {
  SHARED_OPTIONS,
  checkBatchMemory,
  checkDevice,
  displayPath,
  readClassNames,
  valTransform,
  type AmpName,
} from './common.js';
import { engineOption, openEngine, type EngineName, type InferenceEngine } from './engine.js';
import { inferencePrecision, inputOptions, inputSettings } from './inference.js';
import { checkModelChoice, loadModelSource, modelSourceOptionsWithArtifact } from './model-source.js';
import { UsageError, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';

const INPUT_NAMES = {
  resize: 'resize',
  crop: 'crop',
  resizeDefault: "the run's validation resize, else 256 (32 for small-stem models)",
  cropDefault: "the run's validation crop, else 224 (32 for small-stem models)",
  batchSize: 32,
};

/** Files per data loader: a bad file costs at most this many files' work again. */
const FILES_PER_PASS = 256;

const SPEC: CommandSpec = {
  name: 'predict',
  summary: 'Classify images.',
  description:
    'Classifies image files (JPEG, PNG, WebP) and prints the --topk most likely classes of each with their probabilities. A folder stands for the images directly in it. ' +
    'The resize, crop and normalisation are those the model was trained with when the checkpoint (or the run folder of the weights) records them, or those an inference artifact (--model DIR) records. ' +
    'A file that cannot be read or decoded gets an error line (with its code) on stderr, the others their classes, and the exit code is then 1.',
  positionals: [
    { name: 'IMAGE', help: 'Image files or folders of images.', variadic: true, required: true, configKey: 'images' },
  ],
  options: [
    ...modelSourceOptionsWithArtifact('Model'),
    {
      name: 'classes',
      type: 'path',
      mustExist: 'file',
      valueName: 'FILE',
      defaultText: "the run's class names, else the class indices",
      help: 'Class names, one per line, in label order.',
      section: 'Model',
    },
    {
      name: 'topk',
      type: 'int',
      min: 1,
      default: 5,
      valueName: 'K',
      help: 'Classes to print per image (at most the number of classes).',
      section: 'Output',
    },
    { ...SHARED_OPTIONS.json, section: 'Output' },
    ...inputOptions(INPUT_NAMES, 'Input', 'Run'),
    engineOption('Run'),
  ],
  examples: [
    'resnet-cuda predict --weights runs/demo/model.safetensors shapes/*.png',
    'resnet-cuda predict --checkpoint runs/pets --topk 3 --json photos/',
    'resnet-cuda predict --model deploy/pets photos/',
  ],
};

interface PredictArgs {
  weights: string | undefined;
  checkpoint: string | undefined;
  model: string | undefined;
  numClasses: number | undefined;
  classes: string | undefined;
  topk: number;
  json: boolean;
  resize: number | undefined;
  crop: number | undefined;
  interpolation: Interpolation | undefined;
  batchSize: number;
  device: string;
  amp: AmpName | undefined;
  engine: EngineName | undefined;
}

/** One image's top-k classes. */
interface Prediction {
  file: string;
  predictions: { index: number; class: string; probability: number }[];
}

/** A file that could not be classified. */
interface Failure {
  file: string;
  code: string;
  message: string;
}

/**
 * Classifies `files`, a pass of at most {@link FILES_PER_PASS} files at a time; a file the loader
 * cannot read or decode is set aside with its error and its pass is run again without it, so that
 * every other file still gets its classes.
 */
async function classify(
  files: readonly string[],
  o: {
    engine: InferenceEngine;
    transform: Compose;
    batchSize: number;
    device: string;
    topk: number;
    name: (c: number) => string;
  },
): Promise<{ rows: Prediction[]; failures: Failure[] }> {
  const rows: Prediction[] = [];
  const failures: Failure[] = [];
  for (let start = 0; start < files.length; start += FILES_PER_PASS) {
    let pending = files.slice(start, start + FILES_PER_PASS);
    while (pending.length > 0) {
      const images = await ImageFiles.open(pending);
      // One worker: decoding overlaps the forward passes without competing with them for cores.
      const loader = new DataLoader(images, {
        batchSize: o.batchSize,
        transform: o.transform,
        workers: pending.length > o.batchSize ? 1 : 0,
        device: o.device,
      });
      try {
        const result = await o.engine.predict(loader, o.topk);
        for (let s = 0; s < pending.length; s++) {
          const at = (j: number) => s * result.topk + j;
          rows.push({
            file: pending[result.indices[s]!]!,
            predictions: Array.from({ length: result.topk }, (_, j) => ({
              index: result.classes[at(j)]!,
              class: o.name(result.classes[at(j)]!),
              probability: result.probabilities[at(j)]!,
            })),
          });
        }
        pending = [];
      } catch (error) {
        if (!(error instanceof DataLoaderError) || error.index === undefined) throw error;
        const bad = error.index;
        failures.push({ file: pending[bad]!, code: error.code, message: error.message });
        pending = pending.filter((_, i) => i !== bad);
      } finally {
        await loader.close();
      }
    }
  }
  const order = new Map(files.map((file, i) => [file, i]));
  const position = (file: string): number => defined(order.get(file), `the position of ${file}`);
  rows.sort((a, b) => position(a.file) - position(b.file));
  return { rows, failures };
}

/** The image files named: files as given, folders by their images (sorted). */
function expandImages(paths: readonly string[]): string[] {
  const out: string[] = [];
  for (const path of paths) {
    const found = statSync(path, { throwIfNoEntry: false });
    if (found === undefined) throw new UsageError(`IMAGE '${path}' does not exist`);
    if (!found.isDirectory()) {
      out.push(path);
      continue;
    }
    const images = readdirSync(path, { withFileTypes: true })
      .filter((e) => e.isFile() && IMG_EXTENSIONS.some((ext) => e.name.toLowerCase().endsWith(ext)))
      .map((e) => e.name)
      .sort(compareCodePoints)
      .map((name) => join(path, name));
    if (images.length === 0) throw new UsageError(`IMAGE folder '${path}' holds no ${IMG_EXTENSIONS.join(', ')} files`);
    out.push(...images);
  }
  return out;
}

async function run(parsed: ParsedCommand, io: CliIO): Promise<number> {
  const a = parsed.values as unknown as PredictArgs;
  const choice = checkModelChoice(a, io.cwd);
  const files = expandImages(parsed.positionals);
  const classFile = a.classes !== undefined ? readClassNames(a.classes) : undefined;
  const device = checkDevice(a.device);

  const loaded = await loadModelSource(a, choice, device, io.cwd);
  const { config, arch } = loaded;
  const precision = inferencePrecision(a.amp, config.amp, device);
  if (precision.note !== undefined) io.stderr.write(`${precision.note}\n`);
  if (classFile !== undefined && classFile.length !== arch.numClasses) {
    throw new UsageError(
      `--classes '${a.classes}' names ${classFile.length} classes but the model has ${arch.numClasses}`,
    );
  }
  const classes = classFile ?? loaded.classes;
  const small = arch.smallInput;
  const settings = inputSettings(
    { resize: a.resize, crop: a.crop, interpolation: a.interpolation },
    config,
    { resize: small ? 32 : 256, crop: small ? 32 : 224, mean: [...IMAGENET_MEAN], std: [...IMAGENET_STD] },
    INPUT_NAMES,
  );
  checkBatchMemory(a.batchSize, settings.valCropSize);

  const { engine, note } = openEngine(loaded.model, {
    engine: a.engine,
    device,
    amp: precision.amp,
    progress: false,
    batchShape: [Math.min(a.batchSize, files.length), settings.valCropSize, settings.valCropSize, 3],
  });
  if (note !== undefined) io.stderr.write(`${note}\n`);
  try {
    const name = (c: number) => classes?.[c] ?? String(c);
    const { rows, failures } = await classify(files, {
      engine,
      transform: valTransform(settings),
      batchSize: a.batchSize,
      device,
      topk: a.topk,
      name,
    });
    const resize = settings.valResizeSize;
    const crop = settings.valCropSize;
    if (a.json) {
      io.stdout.write(
        `${JSON.stringify({ model: arch.model, numClasses: arch.numClasses, resize, crop, engine: engine.name, images: rows, failed: failures }, null, 2)}\n`,
      );
    } else {
      for (const row of rows) {
        io.stdout.write(`${displayPath(row.file, io.cwd)}\n`);
        for (const p of row.predictions) {
          io.stdout.write(`  ${(100 * p.probability).toFixed(2).padStart(6)}%  ${p.class}\n`);
        }
      }
    }
    for (const failure of failures) {
      io.stderr.write(
        `resnet-cuda predict: ${displayPath(failure.file, io.cwd)}: ${failure.code}: ${failure.message}\n`,
      );
    }
    return failures.length > 0 ? 1 : 0;
  } finally {
    await engine.dispose();
  }
}

/** The `predict` command. */
export const predictCommand: Command = { spec: SPEC, run };
