/**
 * The ONNX graph of an {@link InferenceGraph}: each convolution node becomes Conv (weights OIHW,
 * the folded batch norm as its bias), then Add for the residual and Relu; max pooling MaxPool;
 * global pooling GlobalAveragePool and Flatten; the classifier Gemm. The input is NCHW as
 * torchvision's models take it, or NHWC with a Transpose to NCHW inside the graph. In f16 the
 * weights and the computation are half precision with Casts at the f32 input and output. Nodes
 * that carry INT8 quantization get QuantizeLinear/DequantizeLinear on their input and
 * DequantizeLinear on their s8 weights and s32 bias (the QDQ format that ONNX Runtime and
 * TensorRT turn into integer convolutions).
 * @packageDocumentation
 */
import { ResnetError } from '../errors.js';
import type { ConvNode, InferenceGraph, LinearNode, NodeQuantization } from '../inference/graph.js';
import { toFloat16 } from './float16.js';
import { biasScales, quantizeBias, quantizeWeights } from './onnx-qdq.js';
import {
  ONNX_ATTRIBUTE_TYPE,
  ONNX_DTYPE,
  type OnnxAttribute,
  type OnnxDataType,
  type OnnxDim,
  type OnnxModel,
  type OnnxNode,
  type OnnxTensor,
} from './onnx-schema.js';

/** The settings of one export, all resolved (see `OnnxExportOptions` for their meaning). */
export interface OnnxGraphSettings {
  opset: number;
  batch: 'dynamic' | number;
  layout: 'nchw' | 'nhwc';
  dtype: 'f32' | 'f16';
  inputSize: [number, number] | null;
  inputName: string;
  outputName: string;
  /** The model's name for the graph and the doc string (`ResNet-50`). */
  title: string;
  producerVersion: string;
  metadata: { key: string; value: string }[];
}

/**
 * The IR version that goes with each supported opset: the first IR version of the ONNX release
 * that introduced the opset (the table of https://github.com/onnx/onnx/blob/main/docs/Versioning.md).
 */
export const ONNX_IR_VERSIONS: Readonly<Record<number, number>> = {
  13: 7,
  14: 7,
  15: 8,
  16: 8,
  17: 8,
  18: 8,
  19: 9,
  20: 9,
  21: 10,
  22: 10,
  23: 11,
};

const attr = {
  int: (name: string, i: number): OnnxAttribute => ({ name, type: ONNX_ATTRIBUTE_TYPE.INT, i }),
  ints: (name: string, ints: readonly number[]): OnnxAttribute => ({
    name,
    type: ONNX_ATTRIBUTE_TYPE.INTS,
    ints: [...ints],
  }),
};

/** The little-endian bytes of a typed array (copied). */
function bytesOf(values: Float32Array | Uint16Array | Int8Array | Uint8Array | Int32Array): Uint8Array {
  return new Uint8Array(values.buffer.slice(values.byteOffset, values.byteOffset + values.byteLength));
}

/** Convolution weights OHWI (the graph's layout) to OIHW (ONNX's). */
function ohwiToOihw(w: Float32Array, o: number, h: number, wd: number, i: number): Float32Array {
  const out = new Float32Array(w.length);
  for (let a = 0; a < o; a++) {
    for (let y = 0; y < h; y++) {
      for (let x = 0; x < wd; x++) {
        for (let c = 0; c < i; c++) out[((a * i + c) * h + y) * wd + x] = w[((a * h + y) * wd + x) * i + c]!;
      }
    }
  }
  return out;
}

/** Accumulates the nodes and initializers of one graph, with unique value names. */
class GraphWriter {
  readonly nodes: OnnxNode[] = [];
  readonly initializers: OnnxTensor[] = [];
  readonly #names = new Set<string>();
  /** The dequantized tensor of each (value, scale, signedness) already quantized, for sharing. */
  readonly #qdq = new Map<string, string>();

  constructor(
    reserved: readonly string[],
    readonly dtype: 'f32' | 'f16',
  ) {
    for (const name of reserved) this.#names.add(name);
  }

  /** `base`, or `base_2`, `base_3`... when taken. */
  unique(base: string): string {
    let name = base;
    for (let k = 2; this.#names.has(name); k++) name = `${base}_${k}`;
    this.#names.add(name);
    return name;
  }

  /** Adds a node; returns its (single) output's name. */
  node(opType: string, name: string, inputs: string[], attributes: OnnxAttribute[] = [], output?: string): string {
    const out = output ?? this.unique(name);
    this.nodes.push({
      input: inputs,
      output: [out],
      name: this.unique(`${name}/${opType}`),
      opType,
      attribute: attributes,
    });
    return out;
  }

  /** Adds an initializer; returns its name. */
  tensor(name: string, dims: number[], dataType: OnnxDataType, data: Uint8Array): string {
    const unique = this.unique(name);
    this.initializers.push({ name: unique, dims, dataType, rawData: data });
    return unique;
  }

  /** A floating-point initializer in the graph's compute precision. */
  float(name: string, dims: number[], values: Float32Array): string {
    return this.dtype === 'f16'
      ? this.tensor(name, dims, ONNX_DTYPE.FLOAT16, bytesOf(toFloat16(values)))
      : this.tensor(name, dims, ONNX_DTYPE.FLOAT, bytesOf(values));
  }

  /** `value` through QuantizeLinear and DequantizeLinear at the input quantization of `q` (shared per value and scale). */
  quantizeInput(value: string, q: NodeQuantization, owner: string): string {
    const key = `${value}\u0000${q.inputScale}\u0000${q.inputUnsigned}`;
    const known = this.#qdq.get(key);
    if (known !== undefined) return known;
    const scale = this.tensor(`${owner}.input_scale`, [], ONNX_DTYPE.FLOAT, bytesOf(new Float32Array([q.inputScale])));
    const zero = q.inputUnsigned
      ? this.tensor(`${owner}.input_zero_point`, [], ONNX_DTYPE.UINT8, new Uint8Array(1))
      : this.tensor(`${owner}.input_zero_point`, [], ONNX_DTYPE.INT8, new Uint8Array(1));
    const quantized = this.node('QuantizeLinear', `${owner}.input_quantized`, [value, scale, zero]);
    const dequantized = this.node('DequantizeLinear', `${owner}.input_dequantized`, [quantized, scale, zero]);
    this.#qdq.set(key, dequantized);
    return dequantized;
  }

  /** Weights `[rows, ...rest]` as s8 per-row values through DequantizeLinear (axis 0). */
  quantizedWeight(owner: string, dims: number[], values: Float32Array, q: NodeQuantization): string {
    const rows = dims[0]!;
    const w = this.tensor(
      `${owner}.weight_quantized`,
      dims,
      ONNX_DTYPE.INT8,
      bytesOf(quantizeWeights(values, q.weightScales)),
    );
    const scale = this.tensor(`${owner}.weight_scale`, [rows], ONNX_DTYPE.FLOAT, bytesOf(q.weightScales));
    const zero = this.tensor(`${owner}.weight_zero_point`, [rows], ONNX_DTYPE.INT8, new Uint8Array(rows));
    return this.node('DequantizeLinear', `${owner}.weight_dequantized`, [w, scale, zero], [attr.int('axis', 0)]);
  }

  /** The bias as s32 through DequantizeLinear when it is representable, else in floating point. */
  quantizedBias(owner: string, values: Float32Array, q: NodeQuantization): string {
    const ints = quantizeBias(values, q);
    if (ints === null) return this.float(`${owner}.bias`, [values.length], values);
    const b = this.tensor(`${owner}.bias_quantized`, [values.length], ONNX_DTYPE.INT32, bytesOf(ints));
    const scale = this.tensor(`${owner}.bias_scale`, [values.length], ONNX_DTYPE.FLOAT, bytesOf(biasScales(q)));
    const zero = this.tensor(
      `${owner}.bias_zero_point`,
      [values.length],
      ONNX_DTYPE.INT32,
      new Uint8Array(4 * values.length),
    );
    return this.node('DequantizeLinear', `${owner}.bias_dequantized`, [b, scale, zero], [attr.int('axis', 0)]);
  }
}

/** Conv (+ Add + Relu) of one convolution node; returns its output's name. */
function writeConv(g: GraphWriter, node: ConvNode, input: string, residual: string | null): string {
  const [kh, kw] = node.kernel;
  const dims = [node.outChannels, node.inChannels, kh, kw];
  const weight = ohwiToOihw(node.weight, node.outChannels, kh, kw, node.inChannels);
  const q = node.quant;
  const x = q ? g.quantizeInput(input, q, node.name) : input;
  const w = q ? g.quantizedWeight(node.name, dims, weight, q) : g.float(`${node.name}.weight`, dims, weight);
  const b = q ? g.quantizedBias(node.name, node.bias, q) : g.float(`${node.name}.bias`, [node.outChannels], node.bias);
  const [ph, pw] = node.padding;
  let out = g.node(
    'Conv',
    node.name,
    [x, w, b],
    [
      attr.ints('kernel_shape', node.kernel),
      attr.ints('strides', node.stride),
      attr.ints('pads', [ph, pw, ph, pw]),
      attr.ints('dilations', node.dilation),
      attr.int('group', 1),
    ],
  );
  if (residual !== null) out = g.node('Add', `${node.name}.add`, [out, residual]);
  if (node.relu) out = g.node('Relu', `${node.name}.relu`, [out]);
  return out;
}

/** Gemm of the classifier (`x W^T + b`); returns its output's name. */
function writeLinear(g: GraphWriter, node: LinearNode, input: string): string {
  const dims = [node.outFeatures, node.inFeatures];
  const q = node.quant;
  const x = q ? g.quantizeInput(input, q, node.name) : input;
  const w = q ? g.quantizedWeight(node.name, dims, node.weight, q) : g.float(`${node.name}.weight`, dims, node.weight);
  const b = q ? g.quantizedBias(node.name, node.bias, q) : g.float(`${node.name}.bias`, [node.outFeatures], node.bias);
  return g.node('Gemm', node.name, [x, w, b], [attr.int('transB', 1)]);
}

/** The input's dims in the file's layout. */
function inputDims(s: OnnxGraphSettings, channels: number): OnnxDim[] {
  const batch: OnnxDim = s.batch === 'dynamic' ? { dimParam: 'batch' } : { dimValue: s.batch };
  const [h, w]: [OnnxDim, OnnxDim] = s.inputSize
    ? [{ dimValue: s.inputSize[0] }, { dimValue: s.inputSize[1] }]
    : [{ dimParam: 'height' }, { dimParam: 'width' }];
  const c: OnnxDim = { dimValue: channels };
  return s.layout === 'nchw' ? [batch, c, h, w] : [batch, h, w, c];
}

/** The number of output features of the graph (the classes, or the pooled features without a classifier). */
export function outputFeatures(graph: InferenceGraph): number {
  let channels = graph.inChannels;
  const perValue = [channels];
  for (const node of graph.nodes) {
    if (node.op === 'conv') channels = node.outChannels;
    else if (node.op === 'linear') channels = node.outFeatures;
    else channels = perValue[node.input]!;
    perValue.push(channels);
  }
  return channels;
}

/**
 * The ONNX model of `graph` with the settings `s` (already validated), ready to encode.
 * @throws `ERR_RC_INVALID_ARGUMENT` when an input or output name is also a weight's name.
 */
export function buildOnnxModel(graph: InferenceGraph, s: OnnxGraphSettings): OnnxModel {
  const g = new GraphWriter([s.inputName, s.outputName], s.dtype);
  let x = s.inputName;
  if (s.dtype === 'f16') x = g.node('Cast', 'input.f16', [x], [attr.int('to', ONNX_DTYPE.FLOAT16)]);
  if (s.layout === 'nhwc') x = g.node('Transpose', 'input.nchw', [x], [attr.ints('perm', [0, 3, 1, 2])]);
  const values: string[] = [x];
  for (const node of graph.nodes) {
    const input = values[node.input]!;
    let out: string;
    switch (node.op) {
      case 'conv':
        out = writeConv(g, node, input, node.residual === null ? null : values[node.residual]!);
        break;
      case 'maxpool': {
        const [ph, pw] = node.padding;
        out = g.node(
          'MaxPool',
          'maxpool',
          [input],
          [
            attr.ints('kernel_shape', node.kernel),
            attr.ints('strides', node.stride),
            attr.ints('pads', [ph, pw, ph, pw]),
          ],
        );
        break;
      }
      case 'globalavgpool':
        out = g.node('Flatten', 'flatten', [g.node('GlobalAveragePool', 'avgpool', [input])], [attr.int('axis', 1)]);
        break;
      case 'linear':
        out = writeLinear(g, node, input);
        break;
    }
    values.push(out);
  }
  const last = g.nodes[g.nodes.length - 1];
  if (!last) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'exportOnnx: the inference graph has no nodes');
  if (s.dtype === 'f16') {
    g.node('Cast', 'output.f32', [last.output[0]!], [attr.int('to', ONNX_DTYPE.FLOAT)], s.outputName);
  } else last.output = [s.outputName];

  const batch: OnnxDim = s.batch === 'dynamic' ? { dimParam: 'batch' } : { dimValue: s.batch };
  const tensorType = (dim: OnnxDim[]) => ({ tensorType: { elemType: ONNX_DTYPE.FLOAT, shape: { dim } } });
  const quantized = graph.nodes.some((n) => (n.op === 'conv' || n.op === 'linear') && n.quant);
  return {
    irVersion: ONNX_IR_VERSIONS[s.opset]!,
    opsetImport: [{ domain: '', version: s.opset }],
    producerName: 'resnet-cuda',
    producerVersion: s.producerVersion,
    modelVersion: 1,
    docString:
      `${s.title}${quantized ? ' (INT8, QDQ)' : ''}, batch norm folded into the convolutions. ` +
      `Input ${s.layout.toUpperCase()} f32, normalised as metadata 'mean' and 'std' say; output logits f32.`,
    graph: {
      name: s.title,
      node: g.nodes,
      initializer: g.initializers,
      input: [{ name: s.inputName, type: tensorType(inputDims(s, graph.inChannels)) }],
      output: [{ name: s.outputName, type: tensorType([batch, { dimValue: outputFeatures(graph) }]) }],
    },
    metadataProps: s.metadata,
  };
}
