/**
 * `resnet-cuda prune`: prunes trained weights once, globally by magnitude (sparse weights, same
 * shapes) or by channels (a smaller dense ResNet), and writes the result as a weights file with the
 * run's config beside it, so that `eval`, `predict`, `summary` and `train --weights` take it.
 * @packageDocumentation
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { MagnitudePruner, pruneChannels, weightSparsity } from '../nn/prune.js';
import type { ResNet } from '../nn/resnet.js';
import type { ModelSummary } from '../nn/summary.js';
import { saveWeights, writeFileAtomic } from '../train/checkpoint.js';
import { SHARED_OPTIONS, checkDevice, displayPath, imageSizeOption, type RunConfig } from './common.js';
import { checkModelSource, loadModel, modelSourceOptions } from './inference.js';
import { UsageError, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';

const SPEC: CommandSpec = {
  name: 'prune',
  summary: 'Prune trained weights (global magnitude, or channels).',
  description:
    'Prunes the model of a --weights file or --checkpoint. By default globally by magnitude, as torch.nn.utils.prune.global_unstructured with L1Unstructured: --amount of all convolution and linear weights (biases and BatchNorm excluded), those of smallest magnitude across the whole model, are set to zero; the shapes stay. ' +
    "With --structured, --amount of the output channels of every block's inner convolutions are removed (ranked by --criterion), which gives a smaller dense ResNet. " +
    'Writes DIR/model.safetensors and DIR/summary.json (the run config, with the pruned widths), and prints parameters and MACs before and after. Fine-tune the result with train --weights DIR/model.safetensors.',
  positionals: [],
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
}

function counts(model: ResNet, s: ModelSummary): { params: number; nonzeroParams: number; macs: number } {
  let zeros = 0;
  for (const p of model.parameters()) for (const v of p.values()) if (v === 0) zeros++;
  return { params: s.totalParams, nonzeroParams: s.totalParams - zeros, macs: s.macs };
}

async function run(parsed: ParsedCommand, io: CliIO): Promise<number> {
  const a = parsed.values as unknown as PruneArgs;
  checkModelSource(a);
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
  let pruned: ResNet;
  if (a.structured) {
    pruned = pruneChannels(model, { amount: a.amount, criterion: a.criterion });
  } else {
    const pruner = new MagnitudePruner(model, { exclude: a.exclude ?? [] });
    pruner.prune(a.amount);
    pruner.dispose();
    pruned = model;
  }
  const after = { ...counts(pruned, pruned.summary({ inputSize: size })), weightSparsity: weightSparsity(pruned) };

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
      `wrote ${result.output} and summary.json\n`,
  );
  return 0;
}

/** The `prune` command. */
export const pruneCommand: Command = { spec: SPEC, run };
