/**
 * `resnet-cuda eval`: loss, Acc@1 and Acc@5 of trained weights on a validation set, with the
 * per-class report and, on request, the confusion matrix as a PNG (train.py's `--test-only`).
 * @packageDocumentation
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { DataLoader } from '../data/loader.js';
import type { Interpolation } from '../data/transforms.js';
import { writeFileAtomic } from '../train/checkpoint.js';
import { plotConfusionMatrix, writePng } from '../train/outputs/plots.js';
import {
  SHARED_OPTIONS,
  checkDevice,
  displayPath,
  locateData,
  openEvalData,
  openTrainData,
  percent,
  precisionText,
  valTransform,
  workerCount,
  type AmpName,
  type DatasetName,
} from './common.js';
import { engineOption, openEngine, type EngineName } from './engine.js';
import { inferencePrecision, inputOptions } from './inference.js';
import {
  checkModelChoice,
  loadModelSource,
  modelSourceOptionsWithArtifact,
  resolveSourceEvalData,
} from './model-source.js';
import { INT8_EVAL_OPTIONS, checkInt8Args, evaluateInt8, int8ReportText, type Int8EvalArgs } from './eval-int8.js';
import { EVAL_DATASET_OPTION, EVAL_DATA_POSITIONAL, EVAL_INPUT_NAMES } from './eval-data.js';
import { CliError, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';

const SPEC: CommandSpec = {
  name: 'eval',
  summary: 'Evaluate a model.',
  description:
    "Evaluates trained weights on a validation set and prints the loss, Acc@1, Acc@5 and a per-class report (precision, recall, F1), like train.py's --test-only. " +
    'DATA is read as train reads it: for an image folder DATA/val (or, with train/ alone, the 10% train held out; or DATA itself when it holds the class folders); for CIFAR and MNIST their test files. ' +
    "Without DATA, the run's own validation data is used when the checkpoint or the weights' run folder records it, else the built-in dataset's validation images.",
  positionals: [EVAL_DATA_POSITIONAL],
  options: [
    ...modelSourceOptionsWithArtifact('Model'),
    EVAL_DATASET_OPTION,
    ...inputOptions(EVAL_INPUT_NAMES, 'Data', 'Run'),
    engineOption('Run'),
    { ...SHARED_OPTIONS.workers, section: 'Data' },
    {
      name: 'output-dir',
      type: 'path',
      valueName: 'DIR',
      help: 'Also write confusion-matrix.png and classification-report.txt there.',
      section: 'Run',
    },
    { name: 'quiet', short: 'q', type: 'boolean', help: 'No progress line.', section: 'Run' },
    { ...SHARED_OPTIONS.json, section: 'Run' },
    ...INT8_EVAL_OPTIONS,
  ],
  examples: [
    'resnet-cuda eval --checkpoint runs/demo/checkpoints/best.safetensors',
    'resnet-cuda eval data/imagenet --weights resnet50.safetensors --device cuda --amp bf16 -b 256',
    'resnet-cuda eval data/pets --checkpoint runs/pets --output-dir runs/pets/eval --json',
    'resnet-cuda eval data/pets --checkpoint runs/pets --int8 --calibration-samples 512 --calibration-method entropy',
  ],
};

interface EvalArgs extends Int8EvalArgs {
  weights: string | undefined;
  checkpoint: string | undefined;
  model: string | undefined;
  numClasses: number | undefined;
  dataset: DatasetName | undefined;
  valResizeSize: number | undefined;
  valCropSize: number | undefined;
  interpolation: Interpolation | undefined;
  batchSize: number;
  workers: number | undefined;
  device: string;
  amp: AmpName | undefined;
  engine: EngineName | undefined;
  outputDir: string | undefined;
  quiet: boolean;
  json: boolean;
}

async function run(parsed: ParsedCommand, io: CliIO): Promise<number> {
  const a = parsed.values as unknown as EvalArgs;
  const given = parsed.positionals[0];
  const choice = checkModelChoice(a, io.cwd);
  if (given !== undefined) locateData(a.dataset ?? 'imagefolder', given, 'eval');
  const device = checkDevice(a.device);
  checkInt8Args(a, parsed.explicit, device);
  const workers = workerCount(a.workers, (text) => io.stderr.write(`${text}\n`));

  const loaded = await loadModelSource(a, choice, device, io.cwd);
  const { config } = loaded;
  const precision = inferencePrecision(a.amp, config.amp, device);
  const { dataset, data, files, settings, generated } = resolveSourceEvalData(a, given, loaded, 'eval');
  const evalData = await openEvalData(files, generated);
  if (evalData.classes.length > loaded.arch.numClasses) {
    throw new CliError(
      `the data has ${evalData.classes.length} classes but the model only ${loaded.arch.numClasses}`,
      'Evaluate on data with the classes the model was trained on.',
    );
  }
  const classNames =
    loaded.classes ?? (evalData.classes.length === loaded.arch.numClasses ? [...evalData.classes] : undefined);
  const notes: string[] = precision.note !== undefined ? [precision.note] : [];
  const runClasses = loaded.classes;
  if (runClasses?.length === evalData.classes.length && evalData.classes.some((c, i) => c !== runClasses[i])) {
    notes.push(
      `note: the data's class names differ from the run's; labels are matched by position (${evalData.classes.slice(0, 3).join(', ')}… vs ${runClasses.slice(0, 3).join(', ')}…)`,
    );
  }

  const { engine, note } = openEngine(loaded.model, {
    engine: a.engine,
    device,
    amp: precision.amp,
    progress: a.quiet || a.json ? false : io.stderr,
    classNames,
    batchShape: [Math.min(a.batchSize, evalData.length), settings.valCropSize, settings.valCropSize, 3],
  });
  if (note !== undefined) notes.push(note);
  const loader = new DataLoader(evalData, {
    batchSize: a.batchSize,
    transform: valTransform(settings),
    workers,
    device,
  });
  try {
    if (!a.quiet && !a.json) {
      io.stderr.write(
        `resnet-cuda eval: ${loaded.arch.model}, ${loaded.arch.numClasses} classes, from ${loaded.source}, ${engine.name} engine\n`,
      );
      io.stderr.write(
        `on ${data !== undefined ? `${dataset} '${displayPath(data, io.cwd)}'` : 'the built-in dataset'}: ${evalData.length} images, resize ${settings.valResizeSize}, crop ${settings.valCropSize}, ${device}, ${precisionText(precision.amp)}\n`,
      );
      for (const note of notes) io.stderr.write(`${note}\n`);
    }
    const result = await engine.evaluate(loader);
    const int8 = a.int8
      ? await evaluateInt8(
          loaded.model,
          a,
          {
            train: (await openTrainData(resolveSourceEvalData(a, given, loaded, 'train').files, generated)).train,
            eval: evalData,
            settings,
            workers,
          },
          loaded.arch.numClasses,
        )
      : undefined;
    const headline = `loss ${result.loss.toFixed(4)}  Acc@1 ${percent(result.acc1)}  Acc@5 ${percent(result.acc5)}  (${result.count} image${result.count === 1 ? '' : 's'})`;
    if (a.outputDir !== undefined) {
      mkdirSync(a.outputDir, { recursive: true });
      await writeFileAtomic(join(a.outputDir, 'classification-report.txt'), `${headline}\n\n${result.report}\n`);
      await writePng(
        join(a.outputDir, 'confusion-matrix.png'),
        await plotConfusionMatrix(result.confusion, classNames),
      );
    }
    if (a.json) {
      const out = {
        loss: result.loss,
        acc1: result.acc1,
        acc5: result.acc5,
        count: result.count,
        model: loaded.arch.model,
        numClasses: loaded.arch.numClasses,
        amp: precision.amp,
        engine: engine.name,
        classes: classNames ?? null,
        confusion: result.confusion.toArray(),
        report: result.report,
        ...(int8 ? { int8 } : {}),
      };
      io.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
    } else {
      io.stdout.write(`${headline}\n\n${result.report}\n`);
      if (int8) io.stdout.write(`\n${int8ReportText(int8)}\n`);
      if (a.outputDir !== undefined) {
        io.stdout.write(
          `wrote classification-report.txt and confusion-matrix.png to ${displayPath(a.outputDir, io.cwd)}\n`,
        );
      }
    }
    return 0;
  } finally {
    await engine.dispose();
    await loader.close();
  }
}

/** The `eval` command. */
export const evalCommand: Command = { spec: SPEC, run };
