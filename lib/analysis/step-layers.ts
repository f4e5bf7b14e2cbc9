/**
 * The layers of one training step of a model, with their shapes, as the roofline plans need them:
 * the module tree walked the way `lib/nn/summary.ts` walks it (shapes propagated analytically, NHWC),
 * plus what backward computes for each layer: whether it passes an input gradient on (as
 * `Chain.backward` and `Residual.backward` set `requiresInputGrad`) and whether it has parameter
 * gradients. Nothing runs on a device.
 * @packageDocumentation
 */
import { ResnetError } from '../errors.js';
import { Chain, Residual } from '../nn/containers.js';
import { AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU } from '../nn/layers.js';
import type { Module } from '../nn/module.js';
import { refuseShape, windowOut } from '../nn/summary.js';

/** A convolution (cuDNN forward, backward data, backward filter). */
export interface ConvLayer {
  kind: 'conv';
  name: string;
  /** NHWC input and output shapes. */
  input: number[];
  output: number[];
  /** Weight elements (`K x R x S x C`). */
  weight: number;
  /** Output channels (bias elements when it has one). */
  channels: number;
  bias: boolean;
  /** Multiply-accumulates of the forward (as `summary` counts them). */
  macs: number;
  /** Whether backward computes the input gradient (backward data). */
  inputGrad: boolean;
  /** Whether backward computes the filter gradient (the weight or the bias is trained). */
  weightGrad: boolean;
  /**
   * Whether backward data adds into the gradient already there (reading it too) instead of
   * writing it: a residual block's first convolution summing the block's input gradients.
   */
  addsInputGrad: boolean;
}

/** A batch normalisation, with its fused residual add and ReLU. */
export interface BnLayer {
  kind: 'bn';
  name: string;
  /** The NHWC shape of its input and output. */
  shape: number[];
  relu: boolean;
  /** Whether it adds the residual of its block (the last BN of a block's main branch). */
  residual: boolean;
}

/** A stand-alone ReLU module. */
export interface ReluLayer {
  kind: 'relu';
  name: string;
  shape: number[];
  inputGrad: boolean;
}

/** Max pooling or global average pooling. */
export interface PoolLayer {
  kind: 'maxpool' | 'avgpool';
  name: string;
  input: number[];
  output: number[];
  kernel: [number, number];
  inputGrad: boolean;
}

/** A linear layer (cuBLAS GEMMs). */
export interface LinearLayer {
  kind: 'linear';
  name: string;
  /** `[N, in]` and `[N, out]`. */
  input: number[];
  output: number[];
  weight: number;
  bias: boolean;
  macs: number;
  inputGrad: boolean;
  weightGrad: boolean;
  /** Whether the bias is trained (its gradient is a separate reduction). */
  biasGrad: boolean;
}

/** A residual block: its main branch, its shortcut (null: identity) and its input. */
export interface BlockLayer {
  kind: 'block';
  name: string;
  /** The NHWC shape of the block's input. */
  input: number[];
  main: StepLayer[];
  shortcut: StepLayer[] | null;
  /** Whether the block passes an input gradient on (the sum of the main branch's and the shortcut's). */
  inputGrad: boolean;
  /**
   * Whether the main branch's first convolution adds its input gradient into the shortcut's
   * (`Residual`'s backward, {@link ConvLayer.addsInputGrad}), instead of an add of its own.
   */
  sumInFirstConv: boolean;
}

/** One layer of the step (Flatten, a view, has none). */
export type StepLayer = ConvLayer | BnLayer | ReluLayer | PoolLayer | LinearLayer | BlockLayer;

/** The layers of a model's training step and its parameter count. */
export interface StepLayers {
  /** The input shape, NHWC. */
  input: number[];
  /** The layers in forward order (blocks nested). */
  layers: StepLayer[];
  /** The output shape (`[N, classes]` for a classifier). */
  output: number[];
  /** All parameters (the arena the optimizer and the gradient zeroing cover). */
  params: number;
  /** Parameters with `requiresGrad`. */
  trainableParams: number;
  /** Elements of the weights that the forward casts to the activation dtype (convolution and linear weights). */
  castWeights: number;
}

function refuse(name: string, what: string, shape: readonly number[]): never {
  refuseShape('roofline', name, what, shape);
}

function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** Walks the module tree for an NHWC input shape; appends layers in forward order, returns the output shape. */
class Walker {
  readonly #names: Map<Module, string>;

  constructor(root: Module) {
    this.#names = new Map(root.namedModules().map(([name, m]) => [m, name]));
  }

  walk(m: Module, x: number[], inputGrad: boolean, out: StepLayer[]): number[] {
    const name = this.#names.get(m) ?? '?';
    if (m instanceof Residual) {
      const main: StepLayer[] = [];
      let h = x;
      m.main.forEach((c, i) => {
        h = this.walk(c, h, i > 0 || inputGrad, main);
      });
      const shortcut: StepLayer[] | null = m.shortcut ? [] : null;
      const identity = m.shortcut && shortcut ? this.walk(m.shortcut, x, inputGrad, shortcut) : x;
      if (identity.join(',') !== h.join(',')) {
        refuse(name, `a shortcut of the main branch's shape [${h.join(', ')}]`, identity);
      }
      const last = main[main.length - 1];
      if (last?.kind === 'bn') last.residual = true;
      const first = main[0];
      const sumInFirstConv = inputGrad && m.addsInFirstConv && first?.kind === 'conv';
      if (sumInFirstConv) first.addsInputGrad = true;
      out.push({ kind: 'block', name, input: x, main, shortcut, inputGrad, sumInFirstConv });
      return h;
    }
    if (m instanceof Chain) {
      if (m.runner) {
        throw new ResnetError(
          'ERR_RC_INVALID_ARGUMENT',
          `roofline: ${name || 'the model'} is checkpointed (its forward runs again in backward), which the model does not count; turn it off with setCheckpointing(model, false)`,
        );
      }
      let h = x;
      m.modules.forEach((c, i) => {
        h = this.walk(c, h, i > 0 || inputGrad, out);
      });
      return h;
    }
    return this.leaf(m, name, x, inputGrad, out);
  }

  leaf(m: Module, name: string, x: number[], inputGrad: boolean, out: StepLayer[]): number[] {
    if (m instanceof Conv2d) {
      const [n, h, w, c] = x as [number, number, number, number];
      if (x.length !== 4 || c !== m.inChannels) refuse(name, `NHWC input with ${m.inChannels} channels`, x);
      const oh = windowOut(h, m.kernelSize[0], m.stride[0], m.padding[0], m.dilation[0]);
      const ow = windowOut(w, m.kernelSize[1], m.stride[1], m.padding[1], m.dilation[1]);
      if (oh <= 0 || ow <= 0) refuse(name, 'a spatial size at least its kernel size', x);
      const output = [n, oh, ow, m.outChannels];
      const weight = m.outChannels * m.kernelSize[0] * m.kernelSize[1] * c;
      out.push({
        kind: 'conv',
        name,
        input: x,
        output,
        weight,
        channels: m.outChannels,
        bias: m.bias !== null,
        macs: (numel(output) * weight) / m.outChannels,
        inputGrad,
        weightGrad: m.weight.requiresGrad || (m.bias?.requiresGrad ?? false),
        addsInputGrad: false,
      });
      return output;
    }
    if (m instanceof BatchNorm2d) {
      if (x.length !== 4 || x[3] !== m.numFeatures) refuse(name, `NHWC input with ${m.numFeatures} channels`, x);
      out.push({ kind: 'bn', name, shape: x, relu: m.relu, residual: false });
      return x;
    }
    if (m instanceof ReLU) {
      out.push({ kind: 'relu', name, shape: x, inputGrad });
      return x;
    }
    if (m instanceof MaxPool2d || m instanceof AdaptiveAvgPool2d) {
      const [n, h, w, c] = x as [number, number, number, number];
      if (x.length !== 4) refuse(name, 'NHWC input', x);
      const max = m instanceof MaxPool2d;
      const kernel: [number, number] = max ? m.kernelSize : [h, w];
      const oh = max ? windowOut(h, m.kernelSize[0], m.stride[0], m.padding[0], 1) : 1;
      const ow = max ? windowOut(w, m.kernelSize[1], m.stride[1], m.padding[1], 1) : 1;
      if (oh <= 0 || ow <= 0) refuse(name, 'a spatial size at least its kernel size', x);
      const output = [n, oh, ow, c];
      out.push({ kind: max ? 'maxpool' : 'avgpool', name, input: x, output, kernel, inputGrad });
      return output;
    }
    if (m instanceof Flatten) return [x[0]!, numel(x.slice(1))];
    if (m instanceof Linear) {
      if (x.length !== 2 || x[1] !== m.inFeatures) refuse(name, `[N, ${m.inFeatures}] input`, x);
      const output = [x[0]!, m.outFeatures];
      out.push({
        kind: 'linear',
        name,
        input: x,
        output,
        weight: m.inFeatures * m.outFeatures,
        bias: m.bias !== null,
        macs: x[0]! * m.inFeatures * m.outFeatures,
        inputGrad,
        weightGrad: m.weight.requiresGrad,
        biasGrad: m.bias?.requiresGrad ?? false,
      });
      return output;
    }
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `roofline: cannot model ${name || 'the model'} (${m.constructor.name}); it knows the layers, Chain, Sequential and Residual`,
    );
  }
}

/** The layers of `model`'s training step for an NHWC `input` shape. */
export function stepLayers(model: Module, input: readonly number[]): StepLayers {
  const layers: StepLayer[] = [];
  const output = new Walker(model).walk(model, [...input], model.requiresInputGrad, layers);
  let params = 0;
  let trainableParams = 0;
  for (const p of model.parameters()) {
    params += p.numel;
    if (p.requiresGrad) trainableParams += p.numel;
  }
  let castWeights = 0;
  for (const [, m] of model.namedModules()) {
    if (m instanceof Conv2d || m instanceof Linear) castWeights += m.weight.numel;
  }
  return { input: [...input], layers, output, params, trainableParams, castWeights };
}

/**
 * The parts of a block in the order `Residual.backward` runs them, each part's layers in reverse:
 * the main branch then the shortcut; or, where the first convolution sums the two input gradients,
 * the last batch norm, the shortcut, then the rest of the main branch down to that convolution.
 */
export function blockBackwardParts(b: BlockLayer): StepLayer[][] {
  if (!b.sumInFirstConv) return [b.main, b.shortcut ?? []];
  return [b.main.slice(-1), b.shortcut ?? [], b.main.slice(0, -1)];
}

/** The layers in forward order with blocks opened (main branch, then shortcut). */
export function flatLayers(layers: readonly StepLayer[]): Exclude<StepLayer, BlockLayer>[] {
  const out: Exclude<StepLayer, BlockLayer>[] = [];
  for (const l of layers) {
    if (l.kind === 'block') out.push(...flatLayers(l.main), ...flatLayers(l.shortcut ?? []));
    else out.push(l);
  }
  return out;
}

/** Elements of a shape. */
export { numel as shapeNumel };
