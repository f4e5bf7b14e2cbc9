/**
 * ONNX export: a trained network (or its inference graph) to an `.onnx` file that ONNX Runtime,
 * TensorRT and other ONNX consumers run. The file is the lowered inference graph
 * ({@link lowerForInference}: batch norm folded into the convolutions), encoded with protobufjs
 * from the schema in `onnx-schema.ts`. PyTorch's counterpart is `torch.onnx.export(model.eval(),
 * x, path, opset_version=17, input_names=['input'], output_names=['logits'],
 * dynamic_axes={'input': {0: 'batch'}, 'logits': {0: 'batch'}})`.
 * @packageDocumentation
 */
import { endianness } from 'node:os';
import { writeFile } from 'node:fs/promises';
import { ResnetError, expectInt, expectNumber, expectOneOf, expectOptions, expectPair, invalid } from '../errors.js';
import { lowerForInference, type InferenceGraph } from '../inference/graph.js';
import { packageVersion } from '../cli/options.js';
import { Module } from '../nn/module.js';
import { ResNet } from '../nn/resnet.js';
import { ONNX_IR_VERSIONS, buildOnnxModel, outputFeatures, type OnnxGraphSettings } from './onnx-graph.js';
import { encodeOnnxModel } from './onnx-schema.js';

/** The opsets the export writes (QDQ's per-channel DequantizeLinear needs 13). */
export const ONNX_OPSETS: readonly number[] = Object.keys(ONNX_IR_VERSIONS).map(Number);

/** The opset written when none is asked for (the default of `torch.onnx.export` since PyTorch 2.0). */
export const DEFAULT_ONNX_OPSET = 17;

/** Options of {@link exportOnnx} and {@link exportOnnxBytes}. */
export interface OnnxExportOptions {
  /** The ONNX operator set version, 13 to 23; default 17. */
  opset?: number;
  /** `'dynamic'` (a symbolic `batch` dimension, the default) or a fixed batch size. */
  batch?: 'dynamic' | number;
  /**
   * The input layout: `'nchw'` (`[N, C, H, W]`, torchvision's and most ONNX consumers', the
   * default) or `'nhwc'` (`[N, H, W, C]`, this package's; a Transpose inside the graph makes it NCHW).
   */
  layout?: 'nchw' | 'nhwc';
  /**
   * `'f32'` (default) or `'f16'`: weights and computation in half precision, with the input and
   * output still f32 (a Cast at each end), so that callers feed and read the same arrays.
   */
  dtype?: 'f32' | 'f16';
  /** A fixed input height and width (a number for a square); default symbolic `height` and `width`. */
  inputSize?: number | [number, number];
  /** The input's name; default `'input'`. */
  inputName?: string;
  /** The output's name; default `'logits'`. */
  outputName?: string;
  /** Class names in label order, stored in the metadata as `class_names` (a JSON array). */
  classNames?: readonly string[];
  /** Per-channel mean of the input normalisation (of values in [0, 1]), stored as metadata `mean`. */
  mean?: readonly number[];
  /** Per-channel standard deviation of the input normalisation, stored as metadata `std`. */
  std?: readonly number[];
}

/** What an export wrote. */
export interface OnnxExport {
  /** The `.onnx` file's bytes. */
  bytes: Uint8Array;
  opset: number;
  irVersion: number;
  /** The input's name and dims (a string for a symbolic dimension). */
  input: { name: string; shape: (number | string)[] };
  /** The output's name and dims. */
  output: { name: string; shape: (number | string)[] };
  /** Whether the graph carries INT8 quantization (QDQ nodes were written). */
  quantized: boolean;
}

const OPTION_KEYS = [
  'opset',
  'batch',
  'layout',
  'dtype',
  'inputSize',
  'inputName',
  'outputName',
  'classNames',
  'mean',
  'std',
];

function expectName(name: string, value: unknown, fallback: string): string {
  if (value === undefined) return fallback;
  if (typeof value !== 'string' || value === '') invalid(name, 'a non-empty string', value);
  return value;
}

function expectNumbers(name: string, value: unknown, length: number): number[] {
  if (!Array.isArray(value) || value.length !== length) invalid(name, `an array of ${length} numbers`, value);
  return value.map((v, i) => expectNumber(`${name}[${i}]`, v));
}

/** The graph to export and a title for it. */
function graphOf(source: Module | InferenceGraph): { graph: InferenceGraph; title: string } {
  if (source instanceof ResNet) {
    return { graph: lowerForInference(source), title: `ResNet-${source.depth} (${source.numClasses} classes)` };
  }
  if (source instanceof Module) return { graph: lowerForInference(source), title: source.constructor.name };
  if (
    source === null ||
    typeof source !== 'object' ||
    !Array.isArray((source as Partial<InferenceGraph>).nodes) ||
    typeof (source as Partial<InferenceGraph>).inChannels !== 'number'
  ) {
    invalid('model', 'a Module (a ResNet or a Sequential) or an InferenceGraph', source);
  }
  return { graph: source, title: 'network' };
}

/** The metadata entries: the preprocessing and the class names a consumer needs. */
function metadataOf(
  o: Partial<OnnxExportOptions>,
  channels: number,
  classes: number,
): { key: string; value: string }[] {
  const out: { key: string; value: string }[] = [];
  if (o.classNames !== undefined) {
    if (!Array.isArray(o.classNames) || o.classNames.some((c) => typeof c !== 'string')) {
      invalid('options.classNames', 'an array of strings', o.classNames);
    }
    if (o.classNames.length !== classes) {
      invalid('options.classNames', `${classes} class names (one per output)`, o.classNames);
    }
    out.push({ key: 'class_names', value: JSON.stringify(o.classNames) });
  }
  if (o.mean !== undefined) {
    out.push({ key: 'mean', value: JSON.stringify(expectNumbers('options.mean', o.mean, channels)) });
  }
  if (o.std !== undefined) {
    out.push({ key: 'std', value: JSON.stringify(expectNumbers('options.std', o.std, channels)) });
  }
  return out;
}

/**
 * The `.onnx` bytes of `model` (a ResNet, a Sequential of supported layers, or an already lowered
 * {@link InferenceGraph}, whose INT8 quantization, if any, is written as QDQ) and a description
 * of its input and output. The model is read, not changed.
 * @throws `ERR_RC_INVALID_ARGUMENT` for a bad option (the message names it) or a network that
 *   has no inference lowering.
 */
export function exportOnnxBytes(model: Module | InferenceGraph, options: OnnxExportOptions = {}): OnnxExport {
  const o = expectOptions<OnnxExportOptions>('exportOnnx options', options, OPTION_KEYS);
  const opset = expectOneOf('options.opset', o.opset ?? DEFAULT_ONNX_OPSET, ONNX_OPSETS);
  const batch = o.batch === undefined || o.batch === 'dynamic' ? 'dynamic' : expectInt('options.batch', o.batch, 1);
  const layout = expectOneOf('options.layout', o.layout ?? 'nchw', ['nchw', 'nhwc'] as const);
  const dtype = expectOneOf('options.dtype', o.dtype ?? 'f32', ['f32', 'f16'] as const);
  const inputSize = o.inputSize === undefined ? null : expectPair('options.inputSize', o.inputSize, 1);
  const inputName = expectName('options.inputName', o.inputName, 'input');
  const outputName = expectName('options.outputName', o.outputName, 'logits');
  if (inputName === outputName) {
    invalid('options.outputName', `a name other than the input's ('${inputName}')`, outputName);
  }
  if (endianness() !== 'LE') {
    throw new ResnetError('ERR_RC_INTERNAL', 'exportOnnx writes tensors from little-endian memory');
  }

  const { graph, title } = graphOf(model);
  const classes = outputFeatures(graph);
  const quantized = graph.nodes.some((n) => (n.op === 'conv' || n.op === 'linear') && n.quant !== undefined);
  if (quantized && dtype === 'f16') {
    invalid('options.dtype', "'f32' for an INT8-quantized graph (its QDQ scales are f32)", dtype);
  }
  const settings: OnnxGraphSettings = {
    opset,
    batch,
    layout,
    dtype,
    inputSize,
    inputName,
    outputName,
    title,
    producerVersion: packageVersion(),
    metadata: metadataOf(o, graph.inChannels, classes),
  };
  const onnx = buildOnnxModel(graph, settings);
  const shapeOf = (dims: ({ dimValue: number } | { dimParam: string })[]) =>
    dims.map((d) => ('dimValue' in d ? d.dimValue : d.dimParam));
  return {
    bytes: encodeOnnxModel(onnx),
    opset,
    irVersion: onnx.irVersion,
    input: { name: inputName, shape: shapeOf(onnx.graph.input[0]!.type.tensorType.shape.dim) },
    output: { name: outputName, shape: shapeOf(onnx.graph.output[0]!.type.tensorType.shape.dim) },
    quantized,
  };
}

/**
 * Writes `model` as an ONNX file at `path` (see {@link exportOnnxBytes} for what is written) and
 * resolves to the description of what was written.
 */
export async function exportOnnx(
  model: Module | InferenceGraph,
  path: string,
  options: OnnxExportOptions = {},
): Promise<OnnxExport> {
  if (typeof path !== 'string' || path === '') invalid('path', 'a file path', path);
  const result = exportOnnxBytes(model, options);
  await writeFile(path, result.bytes);
  return result;
}
