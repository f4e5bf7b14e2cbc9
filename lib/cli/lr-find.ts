/**
 * `resnet-cuda lr-find`: the learning-rate range test (fastai's `lr_find`, pytorch-lr-finder) on
 * the data and model `train` would use: sweeps the learning rate, prints the suggestion and writes
 * `lr-find.png` and `lr-find.json`. The model and optimizer are thrown away afterwards; nothing is
 * trained for good.
 * @packageDocumentation
 */
import { join } from 'node:path';
import { DataLoader } from '../data/loader.js';
import type { Interpolation } from '../data/transforms.js';
import { writeLrFinder, type LrFinderResult } from '../train/lr-finder.js';
import { Trainer } from '../train/trainer.js';
import {
  DATASET_NAMES,
  DATA_LAYOUTS,
  MODEL_NAMES,
  SHARED_OPTIONS,
  ampOption,
  buildModel,
  checkAmp,
  warnBf16ComputedInF32,
  checkBatchMemory,
  checkDevice,
  datasetDefaults,
  displayPath,
  imageSizeOption,
  locateData,
  openTrainData,
  precisionText,
  timestampName,
  trainTransform,
  workerCount,
  type AmpName,
  type DatasetName,
  type ModelName,
} from './common.js';
import { UsageError, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';
import { OPTIMIZERS, buildOptimizer } from './train.js';

const S_DATA = 'Data and model';
const S_OPT = 'Optimizer and step';
const S_SWEEP = 'Sweep';

const SPEC: CommandSpec = {
  name: 'lr-find',
  summary: 'Find a learning rate with the range test (fastai lr_find, pytorch-lr-finder).',
  description:
    'Runs the learning-rate range test (Smith, arXiv:1506.01186): --num-iter training steps while the learning rate grows from --start-lr to --end-lr, ' +
    'on the data, model, optimizer and precision train would use. The loss is smoothed (bias-corrected moving average, --beta) and the sweep stops once it passes --diverge-threshold times its lowest value. ' +
    'Prints the suggestion, the learning rate where the smoothed loss falls fastest against log(lr) (as pytorch-lr-finder and fastai suggest), and the minimum/10 rule; ' +
    'writes lr-find.png (the loss against the learning rate, log axis, suggestions marked) and lr-find.json (every step) to --output-dir.',
  positionals: [
    {
      name: 'DATA',
      help: `The dataset folder, as for train. imagefolder: ${DATA_LAYOUTS.imagefolder}; nothing for synthetic and shapes (the default without DATA).`,
      configKey: 'data',
    },
  ],
  options: [
    {
      name: 'dataset',
      type: 'choice',
      choices: DATASET_NAMES,
      valueName: 'KIND',
      defaultText: 'imagefolder with DATA, else shapes (the built-in dataset)',
      help: 'What DATA holds.',
      section: S_DATA,
    },
    { ...SHARED_OPTIONS.workers, section: S_DATA },
    imageSizeOption(
      'train-crop-size',
      'Training crop size.',
      '224; 32 for CIFAR and the built-in dataset, 28 for MNIST',
      S_DATA,
    ),
    { ...SHARED_OPTIONS.interpolation, default: 'bilinear', section: S_DATA },
    { name: 'model', type: 'choice', choices: MODEL_NAMES, default: 'resnet18', help: 'The network.', section: S_DATA },
    {
      name: 'num-classes',
      type: 'int',
      min: 1,
      valueName: 'N',
      defaultText: "the dataset's classes; 4 for the built-in dataset, 1000 for synthetic",
      help: 'Output classes.',
      section: S_DATA,
    },
    {
      name: 'seed',
      type: 'int',
      min: 0,
      max: 2 ** 31 - 1,
      default: 0,
      valueName: 'N',
      help: 'Seed of the initialisation, shuffling and augmentation.',
      section: S_DATA,
    },
    { name: 'opt', type: 'choice', choices: OPTIMIZERS, default: 'sgd', help: 'The optimizer.', section: S_OPT },
    {
      name: 'momentum',
      type: 'number',
      min: 0,
      max: 1,
      default: 0.9,
      valueName: 'M',
      help: 'SGD momentum.',
      section: S_OPT,
    },
    {
      name: 'weight-decay',
      aliases: ['wd'],
      type: 'number',
      min: 0,
      default: 1e-4,
      valueName: 'WD',
      help: 'Weight decay.',
      section: S_OPT,
    },
    {
      name: 'label-smoothing',
      type: 'number',
      min: 0,
      max: 1,
      default: 0,
      valueName: 'S',
      help: 'Label smoothing of the loss.',
      section: S_OPT,
    },
    { ...SHARED_OPTIONS.device, section: S_OPT },
    {
      name: 'batch-size',
      short: 'b',
      type: 'int',
      min: 1,
      default: 32,
      valueName: 'N',
      help: 'Images per batch.',
      section: S_OPT,
    },
    { ...SHARED_OPTIONS.amp, section: S_OPT },
    {
      name: 'accumulate',
      type: 'int',
      min: 1,
      default: 1,
      valueName: 'K',
      help: 'Batches per optimizer step.',
      section: S_OPT,
    },
    {
      name: 'start-lr',
      type: 'number',
      min: 0,
      exclusiveMin: true,
      default: 1e-7,
      valueName: 'LR',
      help: 'Learning rate of the first step.',
      section: S_SWEEP,
    },
    {
      name: 'end-lr',
      type: 'number',
      min: 0,
      exclusiveMin: true,
      default: 10,
      valueName: 'LR',
      help: 'Learning rate of the last step.',
      section: S_SWEEP,
    },
    {
      name: 'num-iter',
      type: 'int',
      min: 2,
      default: 100,
      valueName: 'N',
      help: 'Steps of the sweep.',
      section: S_SWEEP,
    },
    {
      name: 'step-mode',
      type: 'choice',
      choices: ['exp', 'linear'],
      default: 'exp',
      help: 'How the learning rate grows.',
      section: S_SWEEP,
    },
    {
      name: 'beta',
      type: 'number',
      min: 0,
      max: 0.999,
      default: 0.98,
      valueName: 'B',
      help: 'Smoothing of the loss.',
      section: S_SWEEP,
    },
    {
      name: 'diverge-threshold',
      type: 'number',
      min: 1,
      exclusiveMin: true,
      default: 4,
      valueName: 'F',
      help: 'Stop when the smoothed loss exceeds F times its lowest value.',
      section: S_SWEEP,
    },
    {
      name: 'output-dir',
      type: 'path',
      valueName: 'DIR',
      defaultText: 'runs/lr-find_<date>_<time>',
      help: 'Where lr-find.png and lr-find.json go.',
      section: S_SWEEP,
    },
    { ...SHARED_OPTIONS.json, section: S_SWEEP },
    { name: 'quiet', short: 'q', type: 'boolean', help: 'No progress line.', section: S_SWEEP },
  ],
  examples: [
    'resnet-cuda lr-find                                 # ResNet-18 on the built-in dataset',
    'resnet-cuda lr-find data/imagenet --model resnet50 --device cuda --amp bf16 -b 256 --num-iter 200',
    'resnet-cuda lr-find --opt adamw --start-lr 1e-6 --end-lr 1 --output-dir runs/lr-adamw --json',
  ],
};

/** The options of `lr-find`, by camelCase name. */
interface LrFindArgs {
  dataset: DatasetName | undefined;
  workers: number | undefined;
  trainCropSize: number | undefined;
  interpolation: Interpolation;
  model: ModelName;
  numClasses: number | undefined;
  seed: number;
  opt: (typeof OPTIMIZERS)[number];
  momentum: number;
  weightDecay: number;
  labelSmoothing: number;
  device: string;
  batchSize: number;
  amp: AmpName;
  accumulate: number;
  startLr: number;
  endLr: number;
  numIter: number;
  stepMode: 'exp' | 'linear';
  beta: number;
  divergeThreshold: number;
  outputDir: string | undefined;
  json: boolean;
  quiet: boolean;
}

/** How a learning rate is printed: three significant digits, in exponent form below 0.001 (`7.02e-5`). */
function lrText(lr: number): string {
  return lr >= 1e-3 && lr < 1e4 ? String(Number(lr.toPrecision(3))) : lr.toExponential(2);
}

async function run(parsed: ParsedCommand, io: CliIO): Promise<number> {
  const a = parsed.values as unknown as LrFindArgs;
  const data = parsed.positionals[0];
  const dataset = a.dataset ?? (data === undefined ? 'shapes' : 'imagefolder');
  if (a.endLr <= a.startLr) throw new UsageError(`--end-lr ${a.endLr} must be above --start-lr ${a.startLr}`);
  if (parsed.explicit.has('momentum') && a.opt !== 'sgd' && a.opt !== 'sgd-nesterov') {
    throw new UsageError(`--momentum applies to --opt sgd and sgd-nesterov, not ${a.opt}`);
  }
  const files = locateData(dataset, data, 'train');
  const device = checkDevice(a.device);
  checkAmp(a.amp, device);
  warnBf16ComputedInF32(a.amp, device, (text) => io.stderr.write(`${text}\n`));
  const size = a.trainCropSize ?? datasetDefaults(dataset).trainCropSize;
  checkBatchMemory(a.batchSize, size);
  if (dataset === 'shapes' && a.numClasses !== undefined && (a.numClasses < 2 || a.numClasses > 6)) {
    throw new UsageError(`--num-classes must be 2 to 6 with the built-in dataset, got ${a.numClasses}`);
  }
  const outDir = a.outputDir ?? join(io.cwd, 'runs', `lr-find_${timestampName()}`);
  const say = (text: string): void => {
    if (!a.quiet && !a.json) io.stderr.write(`${text}\n`);
  };

  const opened = await openTrainData(files, {
    seed: a.seed,
    size,
    numClasses: a.numClasses ?? (dataset === 'synthetic' ? 1000 : 4),
    batchSize: a.batchSize,
  });
  const numClasses = opened.classes.length;
  if (a.numClasses !== undefined && a.numClasses !== numClasses) {
    throw new UsageError(`--num-classes ${a.numClasses} does not match the dataset, which has ${numClasses} classes`);
  }
  const smallInput = size <= 64;
  const model = buildModel({ model: a.model, numClasses, smallInput }, { device, seed: a.seed });
  const optimizer = buildOptimizer({ ...a, normWeightDecay: undefined }, model, a.startLr);
  const defaults = datasetDefaults(dataset);
  const loader = new DataLoader(opened.train, {
    batchSize: a.batchSize,
    transform: trainTransform(dataset, {
      trainCropSize: size,
      valResizeSize: size,
      valCropSize: size,
      mean: defaults.mean,
      std: defaults.std,
      interpolation: a.interpolation,
    }),
    shuffle: true,
    seed: a.seed,
    workers: workerCount(a.workers, (text) => io.stderr.write(`${text}\n`)),
    persistentWorkers: true,
    device,
  });
  const trainer = new Trainer({
    model,
    optimizer,
    device,
    amp: ampOption(a.amp),
    accumulate: a.accumulate,
    labelSmoothing: a.labelSmoothing,
    progress: a.quiet || a.json ? false : io.stderr,
  });
  try {
    say(
      `resnet-cuda lr-find: ${a.model}${smallInput ? ' (small-image stem)' : ''}, ${numClasses} classes, ${opened.train.length} training images, ` +
        `${device}, batch ${a.batchSize}${a.accumulate > 1 ? ` x ${a.accumulate}` : ''}, ${precisionText(a.amp)}, ${a.opt}`,
    );
    say(`sweep: ${a.numIter} steps, lr ${lrText(a.startLr)} to ${lrText(a.endLr)} (${a.stepMode})`);
    const result = await trainer.findLr(loader, {
      startLr: a.startLr,
      endLr: a.endLr,
      numIter: a.numIter,
      mode: a.stepMode,
      beta: a.beta,
      divergeThreshold: a.divergeThreshold,
    });
    const written = await writeLrFinder(result, outDir);
    if (a.json) {
      io.stdout.write(`${JSON.stringify({ ...summaryOf(result), png: written.png, json: written.json }, null, 2)}\n`);
    } else {
      io.stdout.write(report(result));
      io.stdout.write(`wrote ${displayPath(written.png, io.cwd)} and ${displayPath(written.json, io.cwd)}\n`);
    }
    return 0;
  } finally {
    await trainer.dispose();
    await loader.close();
  }
}

/** What `lr-find --json` prints besides the file paths. */
function summaryOf(result: LrFinderResult): Record<string, unknown> {
  return {
    suggestion: result.suggestion?.lr ?? null,
    rule: 'steepest descent of the smoothed loss against log(lr)',
    minimumOverTen: result.minimum?.lrOverTen ?? null,
    minimumLr: result.minimum?.lr ?? null,
    bestLoss: result.bestLoss,
    steps: result.lrs.length,
    diverged: result.diverged,
    settings: result.settings,
  };
}

/** The text report: the suggestions, then how the sweep went. */
function report(result: LrFinderResult): string {
  const lines: string[] = [];
  if (result.suggestion) {
    lines.push(
      `suggested learning rate: ${lrText(result.suggestion.lr)} (steepest descent of the smoothed loss against log(lr))`,
    );
  } else {
    lines.push('no suggestion: too few steps after leaving out the first 10 and the last 5; raise --num-iter');
  }
  if (result.minimum) {
    lines.push(
      `minimum/10 rule: ${lrText(result.minimum.lrOverTen)} (lowest smoothed loss in the same window ${(result.smoothedLosses[result.minimum.index] ?? NaN).toFixed(4)} at lr ${lrText(result.minimum.lr)})`,
    );
  }
  const last = result.lrs.at(-1) ?? result.settings.startLr;
  lines.push(
    result.diverged
      ? `the loss diverged at lr ${lrText(last)}, after ${result.lrs.length} of ${result.settings.numIter} steps`
      : `${result.lrs.length} steps up to lr ${lrText(last)} without divergence`,
  );
  return lines.join('\n') + '\n';
}

/** The `lr-find` command. */
export const lrFindCommand: Command = { spec: SPEC, run };
