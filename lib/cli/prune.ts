/**
 * `resnet-cuda prune`: prunes trained weights once, globally by magnitude (sparse weights, same
 * shapes) or by channels (a smaller dense ResNet), and writes the result as a weights file with the
 * run's config beside it, so that `eval`, `predict`, `summary` and `train --weights` take it.
 * @packageDocumentation
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { DataLoader } from '../data/loader.js';
import { Conv2d } from '../nn/layers.js';
import { MagnitudePruner, pruneChannels, weightSparsity } from '../nn/prune.js';
import type { ResNet } from '../nn/resnet.js';
import type { ModelSummary } from '../nn/summary.js';
import { saveWeights, writeFileAtomic } from '../train/checkpoint.js';
import {
  SHARED_OPTIONS,
  checkDevice,
  displayPath,
  imageSizeOption,
  locateData,
  openEvalData,
  percent,
  valTransform,
  workerCount,
  type DatasetName,
  type RunConfig,
} from './common.js';
import { EVAL_DATASET_OPTION, EVAL_DATA_POSITIONAL, resolveEvalData } from './eval-data.js';
import { checkModelSource, inferencePrecision, loadModel, modelSourceOptions, type LoadedModel } from './inference.js';
import { measureModel, type ModelMeasurement } from './prune-measure.js';
import { UsageError, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';

const SPEC: CommandSpec = {
  name: 'prune',
  summary: 'Prune trained weights (global magnitude, or channels).',
  description:
    'Prunes the model of a --weights file or --checkpoint. By default globally by magnitude, as torch.nn.utils.prune.global_unstructured with L1Unstructured: --amount of all convolution and linear weights (biases and BatchNorm excluded), those of smallest magnitude across the whole model, are set to zero; the shapes stay. ' +
    "With --structured, --amount of the output channels of every block's inner convolutions are removed (ranked by --criterion), which gives a smaller dense ResNet. " +
    'Writes DIR/model.safetensors and DIR/summary.json (the run config, with the pruned widths), and prints parameters and MACs before and after; ' +
    "with --eval also the accuracy over the evaluation data (DATA read as eval reads it; without DATA the run's own data, else the built-in dataset) and the time of an evaluation-mode forward of one batch, before and after. " +
    'Fine-tune the result with train --weights DIR/model.safetensors.',
  positionals: [EVAL_DATA_POSITIONAL],
  options: [
    ...modelSourceOptions('Model'),
    {
      name: 'amount',
      type: 'number',
      min: 0,
      max: 1,
      valueName: 'FRACTION',
      help: 'The fraction to prune: of all weights (unstructured), or of each inner convolution’s channels (--structured, below 1).',
      section: 'Pruning',
    },
    { name: 'structured', type: 'boolean', help: 'Remove channels instead of zeroing weights.', section: 'Pruning' },
    {
      name: 'criterion',
      type: 'choice',
      choices: ['l1', 'bn-scale'],
      default: 'l1',
      help: "--structured's ranking: l1 (filter L1 norm, Li et al. 2017) or bn-scale (|γ| of the BatchNorm, network slimming).",
      section: 'Pruning',
    },
    {
      name: 'exclude',
      type: 'strings',
      valueName: 'NAMES',
      help: 'Comma-separated weights to leave dense in unstructured pruning, e.g. conv1.weight,fc.weight.',
      section: 'Pruning',
    },
    imageSizeOption('input-size', 'The image size the MACs are counted for.', "the run's crop, else 224", 'Output'),
    {
      name: 'eval',
      type: 'boolean',
      help: 'Also evaluate the model before and after pruning (Acc@1, Acc@5, loss) and time its forward.',
      section: 'Evaluation',
    },
    { ...EVAL_DATASET_OPTION, section: 'Evaluation' },
    {
      name: 'batch-size',
      short: 'b',
      type: 'int',
      min: 1,
      default: 64,
      valueName: 'N',
      help: 'Images per batch of the evaluation and of the timed forward.',
      section: 'Evaluation',
    },
    {
      name: 'time-steps',
      type: 'int',
      min: 1,
      default: 5,
      valueName: 'N',
      help: 'Timed forwards of one batch (after one untimed); the median is reported.',
      section: 'Evaluation',
    },
    { ...SHARED_OPTIONS.workers, section: 'Evaluation' },
    {
      name: 'output-dir',
      type: 'path',
      valueName: 'DIR',
      help: 'Where to write model.safetensors and summary.json.',
      section: 'Output',
    },
    { ...SHARED_OPTIONS.device, section: 'Output' },
    { ...SHARED_OPTIONS.json, section: 'Output' },
  ],
  examples: [
    'resnet-cuda prune --checkpoint runs/r50 --amount 0.8 --output-dir runs/r50-sparse',
    'resnet-cuda prune --checkpoint runs/r50 --structured --amount 0.3 --output-dir runs/r50-slim',
    'resnet-cuda eval --weights runs/r50-slim/model.safetensors',
    'resnet-cuda prune data/pets --checkpoint runs/pets --structured --amount 0.5 --eval --output-dir runs/pets-slim',
  ],
};

interface PruneArgs {
  weights: string | undefined;
  checkpoint: string | undefined;
  model: RunConfig['model'] | undefined;
  numClasses: number | undefined;
  amount: number | undefined;
  structured: boolean;
  criterion: 'l1' | 'bn-scale';
  exclude: string[] | undefined;
  inputSize: number | undefined;
  eval: boolean;
  dataset: DatasetName | undefined;
  batchSize: number;
  timeSteps: number;
  workers: number | undefined;
  outputDir: string | undefined;
  device: string;
  json: boolean;
}

/** What `prune --json` prints. */
export interface PruneResult {
  method: 'magnitude' | 'channels';
  amount: number;
  output: string;
  before: { params: number; nonzeroParams: number; macs: number };
  after: { params: number; nonzeroParams: number; macs: number; weightSparsity: number };
  blockWidths?: number[][];
  /** With `--eval`: accuracy and forward time before and after. */
  evaluation?: {
    images: number;
    batch: number;
    crop: number;
    before: ModelMeasurement;
    after: ModelMeasurement;
  };
}

function counts(model: ResNet, s: ModelSummary): { params: number; nonzeroParams: number; macs: number } {
  let zeros = 0;
  for (const p of model.parameters()) for (const v of p.values()) if (v === 0) zeros++;
  return { params: s.totalParams, nonzeroParams: s.totalParams - zeros, macs: s.macs };
}

/** Evaluates and times models over the data `eval` would read for `loaded`'s weights. */
async function openMeasure(
  a: PruneArgs,
  given: string | undefined,
  loaded: LoadedModel,
  device: string,
  io: CliIO,
): Promise<{
  measure: (model: ResNet) => Promise<ModelMeasurement>;
  close: () => Promise<void>;
  crop: number;
  batch: number;
}> {
  const { files, settings, generated } = resolveEvalData(
    { ...a, valResizeSize: undefined, valCropSize: undefined, interpolation: undefined },
    given,
    loaded,
    'eval',
  );
  const data = await openEvalData(files, generated);
  const workers = workerCount(a.workers, (text) => io.stderr.write(`${text}\n`));
  const loader = new DataLoader(data, { batchSize: a.batchSize, transform: valTransform(settings), workers, device });
  const amp = inferencePrecision(undefined, loaded.config.amp, device).amp;
  const stem = loaded.model.getSubmodule('conv1');
  const channels = stem instanceof Conv2d ? stem.inChannels : 3;
  const crop = settings.valCropSize;
  const batch = Math.min(a.batchSize, data.length);
  return {
    measure: (model) =>
      measureModel(model, { loader, device, amp, batchShape: [batch, crop, crop, channels], steps: a.timeSteps }),
    close: () => loader.close(),
    crop,
    batch,
  };
}

async function run(parsed: ParsedCommand, io: CliIO): Promise<number> {
  const a = parsed.values as unknown as PruneArgs;
  const given = parsed.positionals[0];
  checkModelSource(a);
  if (!a.eval) {
    for (const [key, flag] of [
      ['dataset', 'dataset'],
      ['batchSize', 'batch-size'],
      ['timeSteps', 'time-steps'],
      ['workers', 'workers'],
    ] as const) {
      if (parsed.explicit.has(key)) throw new UsageError(`--${flag} applies to --eval only`);
    }
    if (given !== undefined) throw new UsageError(`DATA ('${given}') is read with --eval only`);
  } else if (given !== undefined) {
    locateData(a.dataset ?? 'imagefolder', given, 'eval');
  }
  if (a.amount === undefined) throw new UsageError('--amount is required: the fraction to prune, e.g. --amount 0.5');
  if (a.outputDir === undefined) throw new UsageError('--output-dir is required: where to write the pruned weights');
  if (a.structured && a.amount >= 1) throw new UsageError(`--structured --amount must be below 1, got ${a.amount}`);
  if (a.structured && a.exclude !== undefined) throw new UsageError('--exclude applies to unstructured pruning only');
  if (!a.structured && parsed.explicit.has('criterion')) {
    throw new UsageError('--criterion applies to --structured pruning only');
  }
  const device = checkDevice(a.device);
  const loaded = await loadModel(
    {
      ...(a.weights !== undefined ? { weights: a.weights } : {}),
      ...(a.checkpoint !== undefined ? { checkpoint: a.checkpoint } : {}),
      ...(a.model !== undefined ? { model: a.model } : {}),
      ...(a.numClasses !== undefined ? { numClasses: a.numClasses } : {}),
    },
    device,
    io.cwd,
  );
  const size = a.inputSize ?? loaded.config.valCropSize ?? 224;
  const model = loaded.model;
  const before = counts(model, model.summary({ inputSize: size }));
  const measuring = a.eval ? await openMeasure(a, given, loaded, device, io) : null;
  let evaluation: PruneResult['evaluation'];
  let pruned: ResNet;
  let after: PruneResult['after'];
  try {
    // Magnitude pruning changes the model in place: the model is measured first.
    const measuredBefore = measuring ? await measuring.measure(model) : null;
    if (a.structured) {
      pruned = pruneChannels(model, { amount: a.amount, criterion: a.criterion });
    } else {
      const pruner = new MagnitudePruner(model, { exclude: a.exclude ?? [] });
      pruner.prune(a.amount);
      pruner.dispose();
      pruned = model;
    }
    after = { ...counts(pruned, pruned.summary({ inputSize: size })), weightSparsity: weightSparsity(pruned) };
    if (measuring && measuredBefore) {
      const measuredAfter = await measuring.measure(pruned);
      evaluation = {
        images: measuredAfter.count,
        batch: measuring.batch,
        crop: measuring.crop,
        before: measuredBefore,
        after: measuredAfter,
      };
    }
  } finally {
    await measuring?.close();
  }

  mkdirSync(a.outputDir, { recursive: true });
  const file = join(a.outputDir, 'model.safetensors');
  await saveWeights(file, pruned);
  const config: Partial<RunConfig> = {
    ...loaded.config,
    model: loaded.arch.model,
    numClasses: loaded.arch.numClasses,
    smallInput: loaded.arch.smallInput,
    ...(loaded.classes ? { classes: loaded.classes } : {}),
  };
  delete config.blockWidths;
  if (pruned.pruned) config.blockWidths = pruned.blockWidths.map((w) => [...w]);
  const result: PruneResult = {
    method: a.structured ? 'channels' : 'magnitude',
    amount: a.amount,
    output: displayPath(file, io.cwd),
    before,
    after,
    ...(config.blockWidths ? { blockWidths: config.blockWidths } : {}),
    ...(evaluation ? { evaluation } : {}),
  };
  await writeFileAtomic(
    join(a.outputDir, 'summary.json'),
    JSON.stringify({ config, pruning: { ...result, source: loaded.source } }, null, 2) + '\n',
  );
  if (pruned !== model) pruned.dispose();
  model.dispose();

  if (a.json) {
    io.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
    return 0;
  }
  const n = (v: number) => v.toLocaleString('en-US');
  const g = (v: number) => `${(v / 1e9).toFixed(3)} G`;
  io.stdout.write(
    `pruned ${loaded.source}: ${a.structured ? `${a.amount} of the inner channels (${a.criterion})` : `${a.amount} of the weights (global magnitude)`}\n` +
      `parameters          ${n(before.params)} -> ${n(after.params)}\n` +
      `non-zero parameters ${n(before.nonzeroParams)} -> ${n(after.nonzeroParams)} (weight sparsity ${(100 * after.weightSparsity).toFixed(2)}%)\n` +
      `MACs at ${size} px     ${g(before.macs)} -> ${g(after.macs)}\n` +
      (evaluation ? evaluationText(evaluation) : '') +
      `wrote ${result.output} and summary.json\n`,
  );
  return 0;
}

/** The `--eval` lines of the text report. */
function evaluationText(e: NonNullable<PruneResult['evaluation']>): string {
  const ms = (m: ModelMeasurement) => `${m.forwardMs.toFixed(1)} ms`;
  return (
    `Acc@1 (${e.images} images) ${percent(e.before.acc1)} -> ${percent(e.after.acc1)}, Acc@5 ${percent(e.before.acc5)} -> ${percent(e.after.acc5)}\n` +
    `forward of ${e.batch} at ${e.crop} px ${ms(e.before)} -> ${ms(e.after)} (${(e.before.forwardMs / e.after.forwardMs).toFixed(2)}x), ` +
    `${e.before.imagesPerSecond.toFixed(0)} -> ${e.after.imagesPerSecond.toFixed(0)} images/s\n`
  );
}

/** The `prune` command. */
export const pruneCommand: Command = { spec: SPEC, run };
