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
import { DataLoader } from '../data/loader.js';
import type { Interpolation } from '../data/transforms.js';
import { IMAGENET_MEAN, IMAGENET_STD } from '../nn/input.js';
import { SGD } from '../optim/sgd.js';
import { Trainer } from '../train/trainer.js';
import { SHARED_OPTIONS, ampOption, checkAmp, checkDevice, displayPath, readClassNames, valTransform, type AmpName, type ModelName } from './common.js';
import { checkModelSource, loadModel, modelSourceOptions } from './inference.js';
import { UsageError, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';

const SPEC: CommandSpec = {
  name: 'predict',
  summary: 'Classify images.',
  description:
    'Classifies image files (JPEG, PNG, WebP) and prints the --topk most likely classes of each with their probabilities. A folder stands for the images directly in it. ' +
    'The resize, crop and normalisation are those the model was trained with when the checkpoint (or the run folder of the weights) records them.',
  positionals: [{ name: 'IMAGE', help: 'Image files or folders of images.', variadic: true, required: true, configKey: 'images' }],
  options: [
    ...modelSourceOptions('Model'),
    { name: 'classes', type: 'path', mustExist: 'file', valueName: 'FILE', defaultText: 'the run\'s class names, else the class indices', help: 'Class names, one per line, in label order.', section: 'Model' },
    { name: 'topk', type: 'int', min: 1, default: 5, valueName: 'K', help: 'Classes to print per image (at most the number of classes).', section: 'Output' },
    { ...SHARED_OPTIONS.json, section: 'Output' },
    { name: 'resize', type: 'int', min: 8, valueName: 'PX', defaultText: "the run's validation resize, else 256 (32 for small-stem models)", help: 'Resize of the smaller edge.', section: 'Input' },
    { name: 'crop', type: 'int', min: 8, valueName: 'PX', defaultText: "the run's validation crop, else 224 (32 for small-stem models)", help: 'Center crop size.', section: 'Input' },
    { name: 'interpolation', type: 'choice', choices: ['bilinear', 'bicubic', 'nearest', 'lanczos'], defaultText: "the run's, else bilinear", help: 'Resampling of the resize.', section: 'Input' },
    { name: 'batch-size', short: 'b', type: 'int', min: 1, default: 32, valueName: 'N', help: 'Images per batch.', section: 'Input' },
    { ...SHARED_OPTIONS.device, section: 'Run' },
    { ...SHARED_OPTIONS.amp, section: 'Run' },
  ],
  examples: ['resnet-cuda predict --weights runs/demo/model.safetensors shapes/*.png', 'resnet-cuda predict --checkpoint runs/pets --topk 3 --json photos/'],
};

interface PredictArgs {
  weights: string | undefined;
  checkpoint: string | undefined;
  model: ModelName | undefined;
  numClasses: number | undefined;
  classes: string | undefined;
  topk: number;
  json: boolean;
  resize: number | undefined;
  crop: number | undefined;
  interpolation: Interpolation | undefined;
  batchSize: number;
  device: string;
  amp: AmpName;
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
  checkModelSource(a);
  const files = expandImages(parsed.positionals);
  const classFile = a.classes !== undefined ? readClassNames(a.classes) : undefined;
  if (a.crop !== undefined && a.resize !== undefined && a.crop > a.resize) throw new UsageError(`--crop ${a.crop} is larger than --resize ${a.resize}`);
  const device = checkDevice(a.device);
  checkAmp(a.amp, device);

  const loaded = await loadModel(a, device, io.cwd);
  const { config, arch } = loaded;
  if (classFile !== undefined && classFile.length !== arch.numClasses) {
    throw new UsageError(`--classes '${a.classes}' names ${classFile.length} classes but the model has ${arch.numClasses}`);
  }
  const classes = classFile ?? loaded.classes;
  const small = arch.smallInput;
  const crop = a.crop ?? config.valCropSize ?? (a.resize !== undefined ? Math.min(a.resize, small ? 32 : 224) : small ? 32 : 224);
  const resize = a.resize ?? config.valResizeSize ?? Math.max(crop, small ? 32 : 256);
  if (crop > resize) throw new UsageError(`--crop ${crop} is larger than the resize ${resize}`);
  const transform = {
    valResizeSize: resize,
    valCropSize: crop,
    mean: config.mean ?? [...IMAGENET_MEAN],
    std: config.std ?? [...IMAGENET_STD],
    interpolation: a.interpolation ?? config.interpolation ?? 'bilinear',
  };

  const images = await ImageFiles.open(files);
  // One worker: decoding overlaps the forward passes without competing with them for cores.
  const loader = new DataLoader(images, { batchSize: a.batchSize, transform: valTransform(transform), workers: files.length > a.batchSize ? 1 : 0, device });
  const trainer = new Trainer({
    model: loaded.model,
    optimizer: new SGD(loaded.model, { lr: 0 }),
    device,
    amp: ampOption(a.amp),
    progress: false,
    tensorboard: false,
    jsonLog: false,
    plots: false,
  });
  try {
    const result = await trainer.predict(loader, { topk: a.topk });
    const name = (c: number) => classes?.[c] ?? String(c);
    const rows = Array.from({ length: files.length }, (_, s) => {
      const at = result.indices[s]!;
      return {
        file: files[at]!,
        predictions: Array.from({ length: result.topk }, (_, j) => ({
          index: result.classes[s * result.topk + j]!,
          class: name(result.classes[s * result.topk + j]!),
          probability: result.probabilities[s * result.topk + j]!,
        })),
      };
    });
    if (a.json) {
      io.stdout.write(`${JSON.stringify({ model: arch.model, numClasses: arch.numClasses, resize, crop, images: rows }, null, 2)}\n`);
    } else {
      for (const row of rows) {
        io.stdout.write(`${displayPath(row.file, io.cwd)}\n`);
        for (const p of row.predictions) io.stdout.write(`  ${(100 * p.probability).toFixed(2).padStart(6)}%  ${p.class}\n`);
      }
    }
    return 0;
  } finally {
    await trainer.dispose();
    await loader.close();
  }
}

/** The `predict` command. */
export const predictCommand: Command = { spec: SPEC, run };
