/**
 * `resnet-cuda eval`: loss, Acc@1 and Acc@5 of trained weights on a validation set, with the
 * per-class report and, on request, the confusion matrix as a PNG (train.py's `--test-only`).
 * @packageDocumentation
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { DataLoader, defaultWorkers } from '../data/loader.js';
import type { Interpolation } from '../data/transforms.js';
import { SGD } from '../optim/sgd.js';
import { writeFileAtomic } from '../train/checkpoint.js';
import { plotConfusionMatrix, writePng } from '../train/outputs/plots.js';
import { Trainer } from '../train/trainer.js';
import {
  DATASET_NAMES,
  SHARED_OPTIONS,
  ampOption,
  checkAmp,
  checkDevice,
  datasetDefaults,
  displayPath,
  locateData,
  openEvalData,
  percent,
  valTransform,
  type AmpName,
  type DatasetName,
  type ModelName,
} from './common.js';
import { checkModelSource, loadModel, modelSourceOptions } from './inference.js';
import { CliError, UsageError, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';

const SPEC: CommandSpec = {
  name: 'eval',
  summary: 'Evaluate a model.',
  description:
    "Evaluates trained weights on a validation set and prints the loss, Acc@1, Acc@5 and a per-class report (precision, recall, F1), like train.py's --test-only. " +
    'DATA is read as train reads it: for an image folder DATA/val (or, with train/ alone, the 10% train held out; or DATA itself when it holds the class folders); for CIFAR and MNIST their test files. ' +
    "Without DATA, the run's own validation data is used when the checkpoint or the weights' run folder records it, else the built-in dataset's validation images.",
  positionals: [{ name: 'DATA', help: 'The dataset folder: an image folder (DATA/val/<class>/<image>, or DATA/<class>/<image>), or with --dataset the CIFAR or MNIST files.', configKey: 'data' }],
  options: [
    ...modelSourceOptions('Model'),
    { name: 'dataset', type: 'choice', choices: DATASET_NAMES, valueName: 'KIND', defaultText: "the run's, else imagefolder with DATA and shapes without", help: 'What DATA holds.', section: 'Data' },
    { name: 'val-resize-size', type: 'int', min: 8, valueName: 'PX', defaultText: "the run's, else 256 for imagefolder and the crop size for the small datasets", help: 'Resize of the smaller edge.', section: 'Data' },
    { name: 'val-crop-size', type: 'int', min: 8, valueName: 'PX', defaultText: "the run's, else 224 for imagefolder, 32 for CIFAR and the built-in dataset, 28 for MNIST", help: 'Center crop size.', section: 'Data' },
    { name: 'interpolation', type: 'choice', choices: ['bilinear', 'bicubic', 'nearest', 'lanczos'], defaultText: "the run's, else bilinear", help: 'Resampling of the resize.', section: 'Data' },
    { name: 'batch-size', short: 'b', type: 'int', min: 1, default: 64, valueName: 'N', help: 'Images per batch.', section: 'Data' },
    { ...SHARED_OPTIONS.workers, section: 'Data' },
    { ...SHARED_OPTIONS.device, section: 'Run' },
    { ...SHARED_OPTIONS.amp, section: 'Run' },
    { name: 'output-dir', type: 'path', valueName: 'DIR', help: 'Also write confusion-matrix.png and classification-report.txt there.', section: 'Run' },
    { name: 'quiet', short: 'q', type: 'boolean', help: 'No progress line.', section: 'Run' },
    { ...SHARED_OPTIONS.json, section: 'Run' },
  ],
  examples: [
    'resnet-cuda eval --checkpoint runs/demo/checkpoints/best.safetensors',
    'resnet-cuda eval data/imagenet --weights resnet50.safetensors --device cuda --amp bf16 -b 256',
    'resnet-cuda eval data/pets --checkpoint runs/pets --output-dir runs/pets/eval --json',
  ],
};

interface EvalArgs {
  weights: string | undefined;
  checkpoint: string | undefined;
  model: ModelName | undefined;
  numClasses: number | undefined;
  dataset: DatasetName | undefined;
  valResizeSize: number | undefined;
  valCropSize: number | undefined;
  interpolation: Interpolation | undefined;
  batchSize: number;
  workers: number | undefined;
  device: string;
  amp: AmpName;
  outputDir: string | undefined;
  quiet: boolean;
  json: boolean;
}

async function run(parsed: ParsedCommand, io: CliIO): Promise<number> {
  const a = parsed.values as unknown as EvalArgs;
  const given = parsed.positionals[0];
  checkModelSource(a);
  if (given !== undefined) locateData(a.dataset ?? 'imagefolder', given, 'eval');
  if (a.valCropSize !== undefined && a.valResizeSize !== undefined && a.valCropSize > a.valResizeSize) {
    throw new UsageError(`--val-crop-size ${a.valCropSize} is larger than --val-resize-size ${a.valResizeSize}`);
  }
  const device = checkDevice(a.device);
  checkAmp(a.amp, device);

  const loaded = await loadModel(a, device, io.cwd);
  const { config } = loaded;
  // The data: as given; else the run's own (its DATA folder, or its generated data); else the built-in dataset.
  const fileKinds: DatasetName[] = ['imagefolder', 'cifar10', 'cifar100', 'mnist', 'fashion-mnist'];
  const runData = typeof config.options?.data === 'string' ? config.options.data : undefined;
  const runKind = config.dataset;
  const dataset: DatasetName = a.dataset ?? (given !== undefined ? (runKind !== undefined && fileKinds.includes(runKind) ? runKind : 'imagefolder') : (runKind ?? 'shapes'));
  const data = given ?? (fileKinds.includes(dataset) && runKind === dataset ? runData : undefined);
  const files = locateData(dataset, data, 'eval');
  const defaults = datasetDefaults(dataset);
  const sameData = config.dataset === dataset;
  const valCropSize = a.valCropSize ?? (sameData ? config.valCropSize : undefined) ?? (a.valResizeSize !== undefined ? Math.min(a.valResizeSize, defaults.valCropSize) : defaults.valCropSize);
  const settings = {
    valResizeSize: a.valResizeSize ?? (sameData ? config.valResizeSize : undefined) ?? Math.max(valCropSize, defaults.valResizeSize),
    valCropSize,
    mean: (sameData ? config.mean : undefined) ?? defaults.mean,
    std: (sameData ? config.std : undefined) ?? defaults.std,
    interpolation: a.interpolation ?? config.interpolation ?? 'bilinear',
  };
  if (settings.valCropSize > settings.valResizeSize) throw new UsageError(`--val-crop-size ${settings.valCropSize} is larger than the resize ${settings.valResizeSize}`);
  const evalData = await openEvalData(files, {
    seed: sameData ? (config.seed ?? 0) : 0,
    size: (sameData ? config.trainCropSize : undefined) ?? settings.valCropSize,
    numClasses: loaded.arch.numClasses >= 2 && loaded.arch.numClasses <= 6 && dataset === 'shapes' ? loaded.arch.numClasses : dataset === 'synthetic' ? loaded.arch.numClasses : 4,
    batchSize: a.batchSize,
  });
  if (evalData.classes.length > loaded.arch.numClasses) {
    throw new CliError(`the data has ${evalData.classes.length} classes but the model only ${loaded.arch.numClasses}`, 'Evaluate on data with the classes the model was trained on.');
  }
  const classNames = loaded.classes ?? (evalData.classes.length === loaded.arch.numClasses ? [...evalData.classes] : undefined);
  const notes: string[] = [];
  if (loaded.classes && evalData.classes.length === loaded.classes.length && evalData.classes.some((c, i) => c !== loaded.classes![i])) {
    notes.push(`note: the data's class names differ from the run's; labels are matched by position (${evalData.classes.slice(0, 3).join(', ')}… vs ${loaded.classes.slice(0, 3).join(', ')}…)`);
  }

  const loader = new DataLoader(evalData, { batchSize: a.batchSize, transform: valTransform(settings), workers: a.workers ?? defaultWorkers(), device });
  const trainer = new Trainer({
    model: loaded.model,
    // The Trainer is built around an optimizer; evaluation never steps it.
    optimizer: new SGD(loaded.model, { lr: 0 }),
    device,
    amp: ampOption(a.amp),
    progress: a.quiet || a.json ? false : io.stderr,
    tensorboard: false,
    jsonLog: false,
    plots: false,
    ...(classNames ? { classNames } : {}),
  });
  try {
    if (!a.quiet && !a.json) {
      io.stderr.write(`resnet-cuda eval: ${loaded.arch.model}, ${loaded.arch.numClasses} classes, from ${loaded.source}\n`);
      io.stderr.write(`on ${data !== undefined ? `${dataset} '${displayPath(data, io.cwd)}'` : 'the built-in dataset'}: ${evalData.length} images, resize ${settings.valResizeSize}, crop ${settings.valCropSize}, ${device}\n`);
      for (const note of notes) io.stderr.write(`${note}\n`);
    }
    const result = await trainer.evaluate(loader);
    const headline = `loss ${result.loss.toFixed(4)}  Acc@1 ${percent(result.acc1)}  Acc@5 ${percent(result.acc5)}  (${result.count} image${result.count === 1 ? '' : 's'})`;
    if (a.outputDir !== undefined) {
      mkdirSync(a.outputDir, { recursive: true });
      await writeFileAtomic(join(a.outputDir, 'classification-report.txt'), `${headline}\n\n${result.report}\n`);
      await writePng(join(a.outputDir, 'confusion-matrix.png'), await plotConfusionMatrix(result.confusion, classNames));
    }
    if (a.json) {
      const out = {
        loss: result.loss,
        acc1: result.acc1,
        acc5: result.acc5,
        count: result.count,
        model: loaded.arch.model,
        numClasses: loaded.arch.numClasses,
        classes: classNames ?? null,
        confusion: result.confusion.toArray(),
        report: result.report,
      };
      io.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
    } else {
      io.stdout.write(`${headline}\n\n${result.report}\n`);
      if (a.outputDir !== undefined) io.stdout.write(`wrote classification-report.txt and confusion-matrix.png to ${displayPath(a.outputDir, io.cwd)}\n`);
    }
    return 0;
  } finally {
    await trainer.dispose();
    await loader.close();
  }
}

/** The `eval` command. */
export const evalCommand: Command = { spec: SPEC, run };
