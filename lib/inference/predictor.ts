/**
 * The inference path: a network lowered once ({@link lowerForInference}) and run by a native
 * inference plan per input shape, with batch norm folded, the ReLU and residual add fused into the
 * convolutions, the weights laid out once for the backend, and no gradient buffers.
 * @packageDocumentation
 */
import { addon, type RawInferenceNode, type RawInferencePlan } from '../binding.js';
import { parseDevice } from '../device.js';
import { ResnetError, expectOneOf, expectOptions, invalid } from '../errors.js';
import type { Module } from '../nn/module.js';
import { Tensor, expectTensor } from '../tensor.js';
import {
  graphOutputFeatures,
  lowerForInference,
  type InferenceGraph,
  type InferenceNode,
  type NodeQuantization,
} from './graph.js';

/** The compute precisions of an inference plan. */
export const PREDICTOR_DTYPES = ['f32', 'bf16', 'f16', 'int8'] as const;

/** A compute precision: floating point, or INT8 for the nodes a calibration quantized (the rest in f32). */
export type PredictorDType = (typeof PREDICTOR_DTYPES)[number];

/** Options of a {@link Predictor}. */
export interface PredictorOptions {
  /** Device the plans run on; default `'cpu'`. */
  device?: string;
  /** Compute precision; default `'f32'`. `'int8'` needs a graph whose nodes carry `quant`. */
  dtype?: PredictorDType;
}

/** The native window fields of a convolution or max pooling. */
function windowFields(node: { kernel: [number, number]; stride: [number, number]; padding: [number, number] }) {
  const [kernelH, kernelW] = node.kernel;
  const [strideH, strideW] = node.stride;
  const [padH, padW] = node.padding;
  return { kernelH, kernelW, strideH, strideW, padH, padW };
}

/** The native form of a graph node (the INT8 fields only when it carries a quantization). */
export function rawInferenceNode(node: InferenceNode): RawInferenceNode {
  switch (node.op) {
    case 'conv':
      return {
        op: 'conv',
        input: node.input,
        residual: node.residual ?? -1,
        relu: node.relu,
        inChannels: node.inChannels,
        outChannels: node.outChannels,
        ...windowFields(node),
        dilationH: node.dilation[0],
        dilationW: node.dilation[1],
        weight: node.weight,
        bias: node.bias,
        ...(node.quant ? quantFields(node.quant) : {}),
      };
    case 'maxpool':
      return {
        op: 'maxpool',
        input: node.input,
        ...windowFields(node),
      };
    case 'globalavgpool':
      return { op: 'globalavgpool', input: node.input };
    case 'linear':
      return {
        op: 'linear',
        input: node.input,
        inChannels: node.inFeatures,
        outChannels: node.outFeatures,
        weight: node.weight,
        bias: node.bias,
        ...(node.quant ? quantFields(node.quant) : {}),
      };
  }
}

function quantFields(q: NodeQuantization): Partial<RawInferenceNode> {
  return { inputScale: q.inputScale, inputUnsigned: q.inputUnsigned, weightScales: q.weightScales };
}

/** A node without its INT8 fields, for a floating-point plan. */
function floatNode(node: RawInferenceNode): RawInferenceNode {
  const out = { ...node };
  delete out.inputScale;
  delete out.inputUnsigned;
  delete out.weightScales;
  return out;
}

/**
 * Runs a network for inference: `predict(x)` maps an NHWC f32 batch to its logits. A plan is made
 * for each input shape the first time it is seen (the weights are converted and laid out then) and
 * reused after; `dispose()` frees them.
 */
export class Predictor {
  /** The lowered network the plans run. */
  readonly graph: InferenceGraph;
  /** The device the plans run on (`'cpu'`, `'cuda:N'`). */
  readonly device: string;
  /** The compute precision. */
  readonly dtype: PredictorDType;
  readonly #nodes: RawInferenceNode[];
  readonly #plans = new Map<string, RawInferencePlan>();
  #disposed = false;

  /** @param source - a network (lowered now, with its batch-norm statistics) or a graph already lowered. */
  constructor(source: Module | InferenceGraph, options: PredictorOptions = {}) {
    const o = expectOptions<PredictorOptions>('Predictor options', options, ['device', 'dtype']);
    this.device = parseDevice(o.device ?? 'cpu', 'options.device');
    this.dtype = expectOneOf('options.dtype', o.dtype ?? 'f32', PREDICTOR_DTYPES);
    this.graph = 'nodes' in source && Array.isArray(source.nodes) ? source : lowerForInference(source as Module);
    if (this.dtype === 'int8' && !this.graph.nodes.some((n) => (n.op === 'conv' || n.op === 'linear') && n.quant)) {
      invalid('options.dtype', "a graph with quantized nodes for 'int8' (calibrate it first)", this.dtype);
    }
    this.#nodes = this.graph.nodes.map(rawInferenceNode);
  }

  /** The logits `[N, classes]` (f32, on the predictor's device) of an NHWC f32 batch on that device. */
  predict(x: Tensor): Tensor {
    if (this.#disposed) throw new ResnetError('ERR_RC_DISPOSED', 'Predictor was disposed and cannot be used');
    expectTensor('x', x, { dtype: 'f32', device: this.device });
    if (x.shape.length !== 4 || x.shape[3] !== this.graph.inChannels) {
      invalid('x', `an [N, H, W, ${this.graph.inChannels}] batch`, `[${x.shape.join(', ')}]`);
    }
    const [n, h, w, c] = x.shape as [number, number, number, number];
    const plan = this.#plan(n, h, w, c);
    const classes = graphOutputFeatures(this.graph);
    const y = Tensor.empty([n, classes], { dtype: 'f32', device: this.device });
    plan.run({ x: x.raw, y: y.raw });
    return y;
  }

  /** The implementation of the plan for an input shape (creating it if needed), for logs and benchmarks. */
  implementation(shape: readonly [number, number, number, number]): string {
    return this.#plan(...shape).implementation();
  }

  /** Frees the plans; the predictor cannot be used afterwards. */
  dispose(): void {
    for (const plan of this.#plans.values()) plan.dispose();
    this.#plans.clear();
    this.#disposed = true;
  }

  #plan(n: number, h: number, w: number, c: number): RawInferencePlan {
    const key = `${n}x${h}x${w}x${c}`;
    let plan = this.#plans.get(key);
    if (!plan) {
      const int8 = this.dtype === 'int8';
      plan = new (addon().InferencePlan)({
        device: this.device,
        dtype: int8 ? 'f32' : this.dtype,
        int8,
        n,
        h,
        w,
        c,
        nodes: int8 ? this.#nodes : this.#nodes.map(floatNode),
      });
      this.#plans.set(key, plan);
    }
    return plan;
  }
}
