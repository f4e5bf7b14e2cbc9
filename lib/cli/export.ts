/**
 * `resnet-cuda export`: a trained model (a weights file or a checkpoint, as `eval` and `predict`
 * take them) written in a deployment format. Each format is one entry of {@link FORMATS}: the
 * options that belong to it and the function that writes it.
 * @packageDocumentation
 */
import { mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import { DEFAULT_ONNX_OPSET, ONNX_OPSETS, exportOnnx, type OnnxExport } from '../export/onnx.js';
import { IMAGENET_MEAN, IMAGENET_STD } from '../nn/input.js';
import { isQatPrepared, quantizedGraph } from '../train/qat.js';
import { displayPath, MAX_IMAGE_SIZE, SHARED_OPTIONS, type ModelName } from './common.js';
import {
  ARTIFACT_EXPORT_KEYS,
  artifactExportOptions,
  exportArtifact,
  type ArtifactExportValues,
} from './export-artifact.js';
import { checkModelSource, loadModel, modelSourceOptions, type LoadedModel } from './inference.js';
import { UsageError, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';

interface ExportArgs extends ArtifactExportValues {
  format: string;
  weights: string | undefined;
  checkpoint: string | undefined;
  model: ModelName | undefined;
  numClasses: number | undefined;
  output: string | undefined;
  /** A choice, so a string. */
  opset: string;
  batch: string;
  layout: 'nchw' | 'nhwc';
  dtype: 'f32' | 'f16';
  imageSize: string | undefined;
  json: boolean;
}

/** What `export --json` prints. */
export interface ExportResult {
  format: string;
  output: string;
  bytes: number;
  source: string;
  /** The format's own description of what it wrote (for ONNX: opset, input and output). */
  details: Record<string, unknown>;
}

/** A format: the options that apply to it only, and how it writes the model. */
interface ExportFormat {
  /** The camelCase keys of its own options (refused with any other format). */
  options: readonly (keyof ExportArgs)[];
  /** Writes the model; returns the result and a line describing what was written. */
  write(loaded: LoadedModel, file: string, a: ExportArgs, cwd: string): Promise<{ result: ExportResult; line: string }>;
}

/** `--batch`: `dynamic` or a positive integer. */
function parseBatch(value: string): 'dynamic' | number {
  if (value === 'dynamic') return value;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) {
    throw new UsageError(`--batch must be 'dynamic' or a positive integer, got '${value}'`);
  }
  return n;
}

/** `--image-size`: `dynamic`, a size in pixels, or (absent) the run's validation crop when known. */
function parseImageSize(value: string | undefined, loaded: LoadedModel): number | null {
  if (value === undefined) return loaded.config.valCropSize ?? null;
  if (value === 'dynamic') return null;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 8 || n > MAX_IMAGE_SIZE) {
    throw new UsageError(`--image-size must be 'dynamic' or an integer from 8 to ${MAX_IMAGE_SIZE}, got '${value}'`);
  }
  return n;
}

async function writeOnnx(
  loaded: LoadedModel,
  file: string,
  a: ExportArgs,
  cwd: string,
): Promise<{ result: ExportResult; line: string }> {
  const size = parseImageSize(a.imageSize, loaded);
  // A quantization-aware run's model exports as its INT8 graph (QDQ).
  const source = isQatPrepared(loaded.model) ? quantizedGraph(loaded.model) : loaded.model;
  const result: OnnxExport = await exportOnnx(source, file, {
    opset: Number(a.opset),
    batch: parseBatch(a.batch),
    layout: a.layout,
    dtype: a.dtype,
    ...(size !== null ? { inputSize: size } : {}),
    ...(loaded.classes ? { classNames: loaded.classes } : {}),
    mean: loaded.config.mean ?? [...IMAGENET_MEAN],
    std: loaded.config.std ?? [...IMAGENET_STD],
  });
  const details = {
    opset: result.opset,
    irVersion: result.irVersion,
    dtype: a.dtype,
    layout: a.layout,
    input: result.input,
    output: result.output,
  };
  return {
    result: {
      format: 'onnx',
      output: displayPath(file, cwd),
      bytes: result.bytes.length,
      source: loaded.source,
      details,
    },
    line:
      `opset ${result.opset}, ${a.dtype}; input '${result.input.name}' ${result.input.shape.join(' x ')} ` +
      `(${a.layout.toUpperCase()}), output '${result.output.name}' ${result.output.shape.join(' x ')}`,
  };
}

/** The formats, by `--format` name. */
const FORMATS: Record<string, ExportFormat> = {
  onnx: { options: ['opset', 'batch', 'layout', 'dtype', 'imageSize'], write: writeOnnx },
  artifact: { options: ARTIFACT_EXPORT_KEYS, write: exportArtifact },
};

const SPEC: CommandSpec = {
  name: 'export',
  summary: 'Export a trained model for deployment (ONNX, or an inference artifact folder).',
  description:
    'Writes the model of a --weights file or --checkpoint in a deployment format. ' +
    '--format onnx: an ONNX file of the inference graph (batch norm folded into the convolutions) that ONNX Runtime and TensorRT (trtexec --onnx=FILE) run; ' +
    "its input is the normalised image, NCHW by default, and its metadata holds the class names and the normalisation's mean and std. " +
    "PyTorch's equivalent is torch.onnx.export(model.eval(), x, FILE, opset_version=17, dynamic_axes={'input': {0: 'batch'}, 'logits': {0: 'batch'}}). " +
    '--format artifact: a folder (model.safetensors, model.json with the architecture, preprocessing and class names, and on --with-onnx model.onnx) that predict --model DIR and loadInferenceArtifact run, as a TorchScript file is run in PyTorch.',
  positionals: [],
  options: [
    {
      name: 'format',
      type: 'choice',
      choices: Object.keys(FORMATS),
      default: 'onnx',
      help: 'The format to write.',
      section: 'Output',
    },
    ...modelSourceOptions('Model'),
    {
      name: 'output',
      short: 'o',
      type: 'path',
      valueName: 'PATH',
      help: 'The file to write (the folder, for --format artifact).',
      section: 'Output',
    },
    { ...SHARED_OPTIONS.json, section: 'Output' },
    {
      name: 'opset',
      type: 'choice',
      choices: ONNX_OPSETS.map(String),
      default: String(DEFAULT_ONNX_OPSET),
      valueName: 'N',
      help: 'The ONNX operator set version.',
      section: 'ONNX',
    },
    {
      name: 'batch',
      type: 'string',
      default: 'dynamic',
      valueName: 'dynamic|N',
      help: 'The batch dimension: symbolic (any batch size) or fixed.',
      section: 'ONNX',
    },
    {
      name: 'layout',
      type: 'choice',
      choices: ['nchw', 'nhwc'],
      default: 'nchw',
      help: "The input layout: nchw ([N, 3, H, W], torchvision's) or nhwc ([N, H, W, 3]).",
      section: 'ONNX',
    },
    {
      name: 'dtype',
      type: 'choice',
      choices: ['f32', 'f16'],
      default: 'f32',
      help: 'Weights and computation in f32 or f16 (the input and output stay f32).',
      section: 'ONNX',
    },
    {
      name: 'image-size',
      type: 'string',
      valueName: 'PX|dynamic',
      defaultText: "the run's validation crop, else dynamic",
      help: 'A fixed input height and width, or dynamic (any size).',
      section: 'ONNX',
    },
    ...artifactExportOptions('Artifact'),
  ],
  examples: [
    'resnet-cuda export --checkpoint runs/r50 --output r50.onnx',
    'resnet-cuda export --weights runs/r50/model.safetensors --output r50-fp16.onnx --dtype f16 --batch 8 --image-size 224',
    'resnet-cuda export --format artifact --checkpoint runs/pets --output deploy/pets',
  ],
};

async function run(parsed: ParsedCommand, io: CliIO): Promise<number> {
  const a = parsed.values as unknown as ExportArgs;
  const format = FORMATS[a.format];
  if (!format) throw new UsageError(`unknown --format '${a.format}'`);
  for (const [name, f] of Object.entries(FORMATS)) {
    if (name === a.format) continue;
    for (const key of f.options) {
      if (parsed.explicit.has(key) && !format.options.includes(key)) {
        const flag = key.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
        throw new UsageError(`--${flag} applies to --format ${name} only`);
      }
    }
  }
  checkModelSource(a);
  if (a.output === undefined) throw new UsageError('--output is required: the file to write, e.g. --output model.onnx');
  parseBatch(a.batch);
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
  let written: { result: ExportResult; line: string };
  try {
    mkdirSync(dirname(a.output), { recursive: true });
    written = await format.write(loaded, a.output, a, io.cwd);
  } finally {
    loaded.model.dispose();
  }
  const { result, line } = written;
  if (a.json) {
    io.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
    return 0;
  }
  io.stdout.write(
    `exported ${result.source} to ${result.output} (${result.format}, ${(result.bytes / 1e6).toFixed(1)} MB)\n${line}\n`,
  );
  return 0;
}

/** The `export` command. */
export const exportCommand: Command = { spec: SPEC, run };
