/**
 * The inference graph: a trained network lowered to what a deployment runs. Batch norm is folded
 * into the convolution before it (its running statistics and affine parameters become the
 * convolution's weight scale and bias), the ReLU and the residual add become part of the
 * convolution that produces them, and the flatten after global average pooling disappears. The
 * native inference plans, the ONNX export and INT8 quantization all start from this one lowering.
 *
 * Values are numbered: value 0 is the network's input (NHWC), and node `i` produces value `i + 1`.
 * Nodes are in execution order and read only earlier values.
 * @packageDocumentation
 */
import { ResnetError, invalid } from '../errors.js';
import { Chain, Residual } from '../nn/containers.js';
import { AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU } from '../nn/layers.js';
import type { Module } from '../nn/module.js';

/**
 * INT8 quantization of a convolution or linear node (symmetric, zero points 0): the input is
 * `inputScale * q` with `q` in u8 when `inputUnsigned` (the input follows a ReLU) else s8, and the
 * weights of output channel `k` are `weightScales[k] * q` with `q` in s8. The bias, the residual and
 * the output stay in floating point.
 */
export interface NodeQuantization {
  /** Scale of the input activation (per tensor). */
  inputScale: number;
  /** The input is non-negative (u8); otherwise signed (s8). */
  inputUnsigned: boolean;
  /** Scales of the weights, one per output channel. */
  weightScales: Float32Array;
}

/** A convolution with its folded batch norm: `y = relu?(conv(x, weight) + bias + residual?)`. */
export interface ConvNode {
  op: 'conv';
  /** The name of the convolution in the state dict (`layer1.0.conv1`). */
  name: string;
  /** The value read. */
  input: number;
  inChannels: number;
  outChannels: number;
  kernel: [number, number];
  stride: [number, number];
  padding: [number, number];
  dilation: [number, number];
  /** Weights `[outChannels, kh, kw, inChannels]` (OHWI), batch norm folded in. */
  weight: Float32Array;
  /** Bias `[outChannels]`, batch norm folded in (zeros when neither the convolution nor a batch norm has one). */
  bias: Float32Array;
  /** A value of the output's shape added before the ReLU (the residual shortcut), or null. */
  residual: number | null;
  /** A ReLU follows (after the residual add). */
  relu: boolean;
  /** INT8 quantization, when the graph is quantized. */
  quant?: NodeQuantization;
}

/** Max pooling, PyTorch's semantics (padding is -infinity). */
export interface MaxPoolNode {
  op: 'maxpool';
  input: number;
  kernel: [number, number];
  stride: [number, number];
  padding: [number, number];
}

/** Average over all spatial positions: `[N, H, W, C]` to `[N, C]` (pooling to 1x1, then flatten). */
export interface GlobalAvgPoolNode {
  op: 'globalavgpool';
  input: number;
}

/** A fully connected layer on `[N, inFeatures]`: `y = x weight^T + bias`. */
export interface LinearNode {
  op: 'linear';
  /** The name in the state dict (`fc`). */
  name: string;
  input: number;
  inFeatures: number;
  outFeatures: number;
  /** Weights `[outFeatures, inFeatures]`. */
  weight: Float32Array;
  /** Bias `[outFeatures]` (zeros when the layer has none). */
  bias: Float32Array;
  /** INT8 quantization, when the graph is quantized. */
  quant?: NodeQuantization;
}

/** One operation of an {@link InferenceGraph}. */
export type InferenceNode = ConvNode | MaxPoolNode | GlobalAvgPoolNode | LinearNode;

/** A network lowered for inference; see the module documentation for the value numbering. */
export interface InferenceGraph {
  /** Channels of the NHWC input. */
  inChannels: number;
  /** The nodes in execution order; the last one's value is the output (`[N, classes]`). */
  nodes: InferenceNode[];
}

/** What the lowering knows at a point of the walk: the value that holds the current activation and its channels. */
interface Cursor {
  value: number;
  channels: number;
  /** The activation is `[N, C]` (after global pooling), not `[N, H, W, C]`. */
  flat: boolean;
}

function pair(v: readonly number[]): [number, number] {
  return [v[0]!, v[1]!];
}

function unsupported(what: string): never {
  throw new ResnetError(
    'ERR_RC_INVALID_ARGUMENT',
    `lowerForInference: ${what} has no inference lowering (supported: Conv2d followed by BatchNorm2d, ReLU, MaxPool2d, AdaptiveAvgPool2d(1), Flatten, Linear, and residual blocks of them)`,
  );
}

/** Host values of a parameter or buffer of `m` by its state-dict name. */
function stateValues(m: Module, name: string): Float32Array {
  const entry = m.stateDict().get(name);
  if (!entry || !(entry.data instanceof Float32Array)) unsupported(`a module without '${name}'`);
  return entry.data;
}

/** `conv` followed by `bn` (or by nothing) as one node with the batch norm folded in. */
function foldConv(conv: Conv2d, name: string, bn: BatchNorm2d | null, input: number): ConvNode {
  const weight = conv.weight.values().slice();
  const k = conv.outChannels;
  const bias = conv.bias ? conv.bias.values().slice() : new Float32Array(k);
  if (bn) {
    if (bn.numFeatures !== k) unsupported(`a BatchNorm2d of ${bn.numFeatures} features after a convolution of ${k}`);
    const gamma = stateValues(bn, 'weight');
    const beta = stateValues(bn, 'bias');
    const mean = stateValues(bn, 'running_mean');
    const variance = stateValues(bn, 'running_var');
    const per = weight.length / k;
    for (let o = 0; o < k; o++) {
      const scale = gamma[o]! / Math.sqrt(variance[o]! + bn.eps);
      for (let i = 0; i < per; i++) weight[o * per + i] = weight[o * per + i]! * scale;
      bias[o] = beta[o]! + (bias[o]! - mean[o]!) * scale;
    }
  }
  return {
    op: 'conv',
    name,
    input,
    inChannels: conv.inChannels,
    outChannels: k,
    kernel: pair(conv.kernelSize),
    stride: pair(conv.stride),
    padding: pair(conv.padding),
    dilation: pair(conv.dilation),
    weight,
    bias,
    residual: null,
    relu: bn?.relu ?? false,
  };
}

/** Lowers a chain of named children, in order, from `at`; returns the cursor after the last. */
function lowerSequence(
  children: readonly (readonly [string, Module])[],
  prefix: string,
  at: Cursor,
  nodes: InferenceNode[],
  residual: number | null,
): Cursor {
  let cur = at;
  for (let i = 0; i < children.length; i++) {
    const [name, m] = children[i]!;
    const full = prefix + name;
    if (m instanceof Conv2d) {
      if (cur.flat) unsupported(`${full}: a Conv2d after global pooling`);
      if (m.inChannels !== cur.channels) {
        unsupported(`${full}: a Conv2d of ${m.inChannels} inputs on ${cur.channels} channels`);
      }
      const next = children[i + 1]?.[1];
      const bn = next instanceof BatchNorm2d ? next : null;
      if (bn) i++;
      const node = foldConv(m, full, bn, cur.value);
      if (bn && residual !== null && i === children.length - 1) node.residual = residual;
      nodes.push(node);
      cur = { value: nodes.length, channels: node.outChannels, flat: false };
    } else if (m instanceof ReLU) {
      const last = nodes[nodes.length - 1];
      if (last?.op !== 'conv' || cur.value !== nodes.length || last.relu) {
        unsupported(`${full}: a ReLU not right after a convolution`);
      }
      last.relu = true;
    } else if (m instanceof MaxPool2d) {
      if (cur.flat) unsupported(`${full}: a MaxPool2d after global pooling`);
      nodes.push({
        op: 'maxpool',
        input: cur.value,
        kernel: pair(m.kernelSize),
        stride: pair(m.stride),
        padding: pair(m.padding),
      });
      cur = { ...cur, value: nodes.length };
    } else if (m instanceof AdaptiveAvgPool2d) {
      // AdaptiveAvgPool2d supports only 1x1 outputs: global average pooling.
      nodes.push({ op: 'globalavgpool', input: cur.value });
      cur = { value: nodes.length, channels: cur.channels, flat: true };
    } else if (m instanceof Flatten) {
      if (!cur.flat) unsupported(`${full}: a Flatten before global pooling`);
    } else if (m instanceof Linear) {
      if (!cur.flat) unsupported(`${full}: a Linear before global pooling`);
      if (m.inFeatures !== cur.channels) {
        unsupported(`${full}: a Linear of ${m.inFeatures} inputs on ${cur.channels} features`);
      }
      nodes.push({
        op: 'linear',
        name: full,
        input: cur.value,
        inFeatures: m.inFeatures,
        outFeatures: m.outFeatures,
        weight: m.weight.values().slice(),
        bias: m.bias ? m.bias.values().slice() : new Float32Array(m.outFeatures),
      });
      cur = { value: nodes.length, channels: m.outFeatures, flat: true };
    } else if (m instanceof Residual) {
      cur = lowerResidual(m, `${full}.`, cur, nodes);
    } else if (m instanceof Chain) {
      cur = lowerSequence(m.children(), `${full}.`, cur, nodes, null);
    } else if (m instanceof BatchNorm2d) {
      unsupported(`${full}: a BatchNorm2d not right after a convolution`);
    } else {
      unsupported(`${full}: ${m.constructor.name}`);
    }
  }
  return cur;
}

/** A residual block: the shortcut first (its value is the residual), then the main branch, whose last convolution adds it. */
function lowerResidual(block: Residual, prefix: string, at: Cursor, nodes: InferenceNode[]): Cursor {
  const children = block.children();
  const nameOf = (m: Module): string =>
    children.find(([, c]) => c === m)?.[0] ?? unsupported(`${prefix}: an unnamed child`);
  let identity = at;
  if (block.shortcut) identity = lowerSequence([[nameOf(block.shortcut), block.shortcut]], prefix, at, nodes, null);
  const main = block.main.map((m) => [nameOf(m), m] as const);
  const out = lowerSequence(main, prefix, at, nodes, identity.value);
  const last = nodes[nodes.length - 1];
  if (last?.op !== 'conv' || last.residual !== identity.value) {
    unsupported(`${prefix.slice(0, -1)}: a residual block whose main branch does not end in Conv2d + BatchNorm2d`);
  }
  if (out.channels !== identity.channels) {
    unsupported(`${prefix.slice(0, -1)}: a shortcut of ${identity.channels} channels added to ${out.channels}`);
  }
  return out;
}

/**
 * Lowers a network (a ResNet, or any chain of the supported layers) to its inference graph with
 * the batch-norm running statistics folded in. The module is read, not changed; the graph holds
 * copies of the weights.
 */
export function lowerForInference(model: Module, options: { inChannels?: number } = {}): InferenceGraph {
  if (!(model instanceof Chain)) invalid('model', 'a Chain (a ResNet or a Sequential)', model);
  const first = [...model.namedModules()].find(([, m]) => m instanceof Conv2d)?.[1] as Conv2d | undefined;
  const inChannels = options.inChannels ?? first?.inChannels;
  if (inChannels === undefined) {
    invalid('options.inChannels', 'the input channels (the model has no convolution)', inChannels);
  }
  const nodes: InferenceNode[] = [];
  const out = lowerSequence(model.children(), '', { value: 0, channels: inChannels, flat: false }, nodes, null);
  if (!out.flat) unsupported('a network that does not end in global pooling (and a Linear)');
  return { inChannels, nodes };
}

/** The channels (features after global pooling) of every value of a graph; index 0 is the input. */
export function graphValueChannels(graph: InferenceGraph): number[] {
  const channels = [graph.inChannels];
  for (const node of graph.nodes) {
    if (node.op === 'conv') channels.push(node.outChannels);
    else if (node.op === 'linear') channels.push(node.outFeatures);
    else channels.push(channels[node.input]!);
  }
  return channels;
}

/** The features of a graph's output (the classes of a classifier). */
export function graphOutputFeatures(graph: InferenceGraph): number {
  return graphValueChannels(graph)[graph.nodes.length]!;
}
