/**
 * `resnet-cuda summary`: torchinfo's table for a model of the family, or for the model of a
 * weights file or checkpoint (a channel-pruned one included), without running it.
 * @packageDocumentation
 */
import type { ResNet } from '../nn/resnet.js';
import { SHARED_OPTIONS, buildModel, imageSizeOption, type AmpName, type ModelName } from './common.js';
import { loadModel, modelSourceOptions } from './inference.js';
import { UsageError, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';

const SPEC: CommandSpec = {
  name: 'summary',
  summary: 'Print a model summary.',
  description:
    "Prints a model's layers with their output shapes, parameters (trainable and frozen), multiply-accumulates and activation memory for an input size, and the totals, as torchinfo.summary does. " +
    'The shapes are worked out without running the model. The model is --model (with --num-classes and --stem), or the one a --weights file or --checkpoint holds.',
  positionals: [],
  options: [
    ...modelSourceOptions('Model').map((o) =>
      o.name === 'model'
        ? { ...o, defaultText: 'resnet50, or read from the file', help: 'The network.' }
        : o.name === 'num-classes'
          ? { ...o, defaultText: '1000, or read from the file' }
          : o,
    ),
    {
      name: 'stem',
      type: 'choice',
      choices: ['imagenet', 'small'],
      default: 'imagenet',
      help: 'The first layers: imagenet (7x7 stride-2 convolution and max pooling) or small (3x3 stride-1, no pooling).',
      section: 'Model',
    },
    imageSizeOption('input-size', 'Image height and width.', '224', 'Input'),
    {
      name: 'batch-size',
      short: 'b',
      type: 'int',
      min: 1,
      default: 1,
      valueName: 'N',
      help: 'Images per batch (activations and MACs scale with it).',
      section: 'Input',
    },
    {
      ...SHARED_OPTIONS.amp,
      section: 'Input',
      help: 'The activation dtype: none (f32), bf16 or fp16 (2 bytes); parameters stay f32.',
    },
    {
      name: 'depth',
      type: 'int',
      min: 0,
      default: 3,
      valueName: 'N',
      help: 'The deepest layers listed (1: the stages; 3: every convolution).',
      section: 'Output',
    },
    { ...SHARED_OPTIONS.json, section: 'Output' },
  ],
  examples: [
    'resnet-cuda summary --model resnet50',
    'resnet-cuda summary --model resnet18 --stem small --input-size 32 --num-classes 10 -b 128 --amp bf16',
    'resnet-cuda summary --checkpoint runs/pruned --depth 1',
  ],
};

interface SummaryArgs {
  weights: string | undefined;
  checkpoint: string | undefined;
  model: ModelName | undefined;
  numClasses: number | undefined;
  stem: 'imagenet' | 'small';
  inputSize: number | undefined;
  batchSize: number;
  amp: AmpName;
  depth: number;
  json: boolean;
}

async function run(parsed: ParsedCommand, io: CliIO): Promise<number> {
  const a = parsed.values as unknown as SummaryArgs;
  if (a.weights !== undefined && a.checkpoint !== undefined) {
    throw new UsageError('give either --weights or --checkpoint, not both');
  }
  if ((a.weights !== undefined || a.checkpoint !== undefined) && parsed.explicit.has('stem')) {
    throw new UsageError('--stem is read from the file with --weights or --checkpoint');
  }
  let model: ResNet;
  let inputSize = a.inputSize;
  if (a.weights !== undefined || a.checkpoint !== undefined) {
    const loaded = await loadModel(
      {
        ...(a.weights !== undefined ? { weights: a.weights } : {}),
        ...(a.checkpoint !== undefined ? { checkpoint: a.checkpoint } : {}),
        ...(a.model !== undefined ? { model: a.model } : {}),
        ...(a.numClasses !== undefined ? { numClasses: a.numClasses } : {}),
      },
      'cpu',
      io.cwd,
    );
    model = loaded.model;
    inputSize ??= loaded.config.valCropSize;
  } else {
    model = buildModel(
      { model: a.model ?? 'resnet50', numClasses: a.numClasses ?? 1000, smallInput: a.stem === 'small' },
      { device: 'cpu', seed: 0 },
    );
  }
  const dtype = a.amp === 'bf16' ? 'bf16' : a.amp === 'fp16' ? 'f16' : 'f32';
  const result = model.summary({ inputSize: inputSize ?? 224, batchSize: a.batchSize, dtype });
  model.dispose();
  io.stdout.write(a.json ? `${JSON.stringify(result.toJSON(), null, 2)}\n` : result.format({ depth: a.depth }));
  return 0;
}

/** The `summary` command. */
export const summaryCommand: Command = { spec: SPEC, run };
