/**
 * The layers of the ResNet family: Conv2d, BatchNorm2d (with fused residual add and ReLU), ReLU,
 * MaxPool2d, AdaptiveAvgPool2d, Flatten and Linear. Activations are NHWC.
 * @packageDocumentation
 */
import {
  addon,
  type RawAddon,
  type RawConv2dPlan,
  type RawDualBatchNormGradSide,
  type RawDualBatchNormSide,
  type RawLinearPlan,
  type RawPool2dPlan,
  type RawTensor,
} from '../binding.js';
import {
  ResnetError,
  defined,
  expectBool,
  expectInt,
  expectNumber,
  expectOptions,
  expectPair,
  invalid,
  mismatch,
} from '../errors.js';
import { fusedPathOn } from '../fused-paths.js';
import { opRecorder } from '../profile/hooks.js';
import { Random } from '../random.js';
import { Tensor, expectTensor } from '../tensor.js';
import { type ConvBnWindow, convBnAccepts } from './conv-bn-support.js';
import { FLOAT_DTYPES, Module, ShapeCache, disposeAll } from './module.js';
import { Parameter } from './parameter.js';

/** The largest size cuDNN, cuBLAS and our kernels take (32-bit ints); the native plans refuse more. */
const MAX_SIZE = 2 ** 31 - 1;

/** Refuses a size past {@link MAX_SIZE}, once it is known to be an integer of at least its minimum. */
function expectWithinLimit(name: string, value: number): number {
  if (value > MAX_SIZE) invalid(name, `an integer of at most ${MAX_SIZE} (the libraries' 32-bit limit)`, value);
  return value;
}

/** An integer size of at least `min` and at most {@link MAX_SIZE}. */
function expectSize(name: string, value: unknown, min: number): number {
  return expectWithinLimit(name, expectInt(name, value, min));
}

/** A pair-or-scalar size of at least `min` and at most {@link MAX_SIZE}. */
function expectSizePair(name: string, value: unknown, min: number): [number, number] {
  const pair = expectPair(name, value, min);
  pair.forEach((v, i) => expectWithinLimit(typeof value === 'number' ? name : `${name}[${i}]`, v));
  return pair;
}

/** Refuses a weight of more elements than the libraries take, naming the size that makes it so. */
function expectWeightSize(name: string, dims: readonly number[], text: string): void {
  const count = dims.reduce((a, b) => a * b, 1);
  if (count > MAX_SIZE) {
    mismatch(name, `a weight of at most ${MAX_SIZE} elements (${text})`, `${dims.join(' x ')} = ${count}`);
  }
}

function uniform(n: number, bound: number, rng: Random): Float32Array {
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = rng.uniform(-bound, bound);
  return out;
}

function backwardBeforeForward(name: string): never {
  throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `${name}.backward() was called before forward()`);
}

/**
 * Fake quantization around a convolution's or linear layer's plan, for quantization-aware training
 * (lib/nn/fake-quant.ts attaches one with {@link Conv2d.attachQuantizer}).
 */
export interface WeightedQuantizer {
  /** The input the plan sees (fake-quantized); updates the observer in training. */
  input(x: Tensor, training: boolean): Tensor;
  /** The weight the plan sees (fake-quantized per output channel), computed anew. */
  weight(weight: Tensor): Tensor;
  /** The weight the last {@link weight} call returned (the backward's, as the weight has not changed since). */
  quantizedWeight(): Tensor;
  /** The gradient of the layer's input from that of the quantized input (straight through; may work in place). */
  inputGrad(gradQuantized: Tensor): Tensor;
}

/**
 * A layer with a weight and an optional bias (convolution, linear) that can carry a
 * {@link WeightedQuantizer}: its forward and backward then go through it.
 */
export abstract class QuantizableLayer extends Module {
  abstract readonly weight: Parameter;
  abstract readonly bias: Parameter | null;

  /**
   * Fake quantization for quantization-aware training, or null; set by {@link attachQuantizer}.
   * @internal
   */
  quantizer: WeightedQuantizer | null = null;

  /**
   * Routes this layer's input and weight through `quantizer` (a module, registered as the child
   * `name`, so that its observer state is in the state dict). See `prepareQat`.
   * @internal
   */
  attachQuantizer(name: string, quantizer: Module & WeightedQuantizer): void {
    if (this.quantizer) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `${this.constructor.name} is already quantized`);
    }
    this.registerModule(name, quantizer);
    this.quantizer = quantizer;
    this.disposeCache();
  }
}

/** The plan interface that convolution and linear layers share. */
interface WeightedPlan {
  forward(args: { x: RawTensor; weight: RawTensor; bias?: RawTensor; y: RawTensor }): void;
  backwardData(args: { dy: RawTensor; weight: RawTensor; dx: RawTensor; accumulate?: boolean }): void;
  backwardWeights(args: { x: RawTensor; dy: RawTensor; dWeight: RawTensor; dBias?: RawTensor }): void;
  dispose(): void;
}

/** The names the profiler gives the three ops of a convolution or linear layer. */
interface WeightedOps {
  forward: string;
  backwardData: string;
  backwardWeights: string;
}

const CONV2D_OPS: WeightedOps = {
  forward: 'conv2d.forward',
  backwardData: 'conv2d.backward_data',
  backwardWeights: 'conv2d.backward_weights',
};

const LINEAR_OPS: WeightedOps = {
  forward: 'linear.forward',
  backwardData: 'linear.backward_data',
  backwardWeights: 'linear.backward_weights',
};

/** A layer's plan and buffers for one input shape. */
interface WeightedEntry<P extends WeightedPlan> {
  plan: P;
  y: Tensor;
  dx: Tensor | null;
  /** Receives the weight gradient the plan computes when the weight is frozen but the bias is not. */
  discard: Tensor | null;
  dispose(): void;
}

function weightedEntry<P extends WeightedPlan>(
  layer: Module,
  plan: P,
  x: Tensor,
  outShape: readonly number[],
): WeightedEntry<P> {
  const e: WeightedEntry<P> = {
    plan,
    y: layer.activationBuffer(outShape, x.dtype, x.device),
    dx: null,
    discard: null,
    dispose: () => disposeAll(plan, e.y, e.dx, e.discard),
  };
  return e;
}

// Returns the input the plan saw (the fake-quantized one under quantization-aware training), which
// the weight gradient needs.
function weightedForward(layer: QuantizableLayer, ops: WeightedOps, e: WeightedEntry<WeightedPlan>, x: Tensor): Tensor {
  const { bias, quantizer } = layer;
  const input = quantizer ? quantizer.input(x, layer.training) : x;
  const weight = quantizer ? quantizer.weight(layer.weight.data) : layer.weight.data;
  const recorder = opRecorder;
  const token = recorder ? recorder.begin(ops.forward, layer, x.device) : 0;
  e.plan.forward({ x: input.raw, weight: weight.raw, ...(bias ? { bias: bias.data.raw } : {}), y: e.y.raw });
  recorder?.end(token);
  return input;
}

// Parameter gradients accumulate unless the parameter is frozen (its gradient is then left as it
// is); the input gradient only when asked for, written to the layer's buffer or, with `into`
// (a convolution's only), added into that tensor.
// Under quantization-aware training `x` is the fake-quantized input and the plan's weight the
// fake-quantized one; the weight's straight-through gradient is the identity (its per-channel
// abs-max scale never clips), so the plan writes it straight into the weight's gradient.
function weightedBackward(
  layer: QuantizableLayer,
  ops: WeightedOps,
  e: WeightedEntry<WeightedPlan> | null,
  x: Tensor | null,
  gradOutput: Tensor,
  into: Tensor | null = null,
): Tensor | null {
  const name = layer.constructor.name;
  if (!e || !x) return backwardBeforeForward(name);
  expectTensor(`${name} gradOutput`, gradOutput, { shape: e.y.shape, dtype: e.y.dtype, device: e.y.device });
  const bias = layer.bias?.requiresGrad ? layer.bias : null;
  const recorder = opRecorder;
  if (layer.weight.requiresGrad || bias) {
    // The plan always computes the weight gradient: a frozen weight's goes to a scratch tensor.
    const dWeight = layer.weight.requiresGrad
      ? layer.weight.grad
      : (e.discard ??= Tensor.zeros(layer.weight.shape, { device: x.device }));
    const token = recorder ? recorder.begin(ops.backwardWeights, layer, x.device) : 0;
    e.plan.backwardWeights({
      x: x.raw,
      dy: gradOutput.raw,
      dWeight: dWeight.raw,
      ...(bias ? { dBias: bias.grad.raw } : {}),
    });
    recorder?.end(token);
  }
  if (!layer.requiresInputGrad) return null;
  const dx = into ?? (e.dx = layer.gradientBuffer(e.dx, x.shape, x.dtype, x.device));
  const token = recorder ? recorder.begin(ops.backwardData, layer, x.device) : 0;
  const weight = layer.quantizer ? layer.quantizer.quantizedWeight() : layer.weight.data;
  e.plan.backwardData({ dy: gradOutput.raw, weight: weight.raw, dx: dx.raw, ...(into ? { accumulate: true } : {}) });
  recorder?.end(token);
  return layer.quantizer ? layer.quantizer.inputGrad(dx) : dx;
}

/**
 * The channel sums a convolution wrote with its output on the `conv-bn` fused path, for the
 * batch norm that reads that output: keyed by the convolution's output buffer, taken (and
 * removed) by the batch norm's training forward, and removed when the convolution runs unfused.
 */
interface PendingStats {
  sum: Tensor;
  sqSum: Tensor;
  count: number;
}
const pendingStats = new WeakMap<Tensor, PendingStats>();

/**
 * A batch norm's output handed to the next convolution's prologue on the `conv-bn` fused path
 * ({@link BatchNorm2d.forwardPrologue} to {@link Conv2d.forwardPrologue}): the convolution reads
 * `relu(x * scale + shift)` of the batch norm's input `x`, in forward and in its weight gradient,
 * so the normalised activation is never written (`lib/nn/prologue.ts`).
 * @internal
 */
export interface PrologueInput {
  /** The batch norm that finalised its statistics into `scale` and `shift`. */
  readonly norm: BatchNorm2d;
  /** The batch norm's input (the previous convolution's raw output). */
  readonly x: Tensor;
  /** `gamma * invStd` per channel (f32). */
  readonly scale: Tensor;
  /** `beta - mean * scale` per channel (f32). */
  readonly shift: Tensor;
}

/** The error of a prologue pair used other than through its container. */
function prologueMisuse(what: string): never {
  throw new ResnetError(
    'ERR_RC_INVALID_ARGUMENT',
    `${what}: on the conv-bn fused path a batch norm fed the next convolution's prologue and did not write its ` +
      'output; the pair runs only through its container (Chain or Residual), which runs its backward as one step',
  );
}

/** Options of {@link Conv2d}, as in `torch.nn.Conv2d`. */
export interface Conv2dOptions {
  inChannels: number;
  outChannels: number;
  kernelSize: number | [number, number];
  stride?: number | [number, number];
  padding?: number | [number, number];
  dilation?: number | [number, number];
  /** Default false (ResNets use none; PyTorch's default is true). */
  bias?: boolean;
  /** Seed of the initialisation. */
  seed?: number;
}

type ConvEntry = WeightedEntry<RawConv2dPlan>;

/** A convolution window's stride, padding and dilation, as the native ops name them. */
export interface ConvWindow {
  strideH: number;
  strideW: number;
  padH: number;
  padW: number;
  dilationH: number;
  dilationW: number;
}

/**
 * 2-D convolution over NHWC input `[N, H, W, inChannels]`. The weight is stored `[out, kh, kw, in]`
 * and appears in state dicts as torchvision's `[out, in, kh, kw]`. Initialised as PyTorch does
 * (`kaiming_uniform_(a=sqrt(5))`).
 */
export class Conv2d extends QuantizableLayer {
  readonly inChannels: number;
  readonly outChannels: number;
  readonly kernelSize: [number, number];
  readonly stride: [number, number];
  readonly padding: [number, number];
  readonly dilation: [number, number];
  readonly weight: Parameter;
  readonly bias: Parameter | null;
  readonly #cache = new ShapeCache<ConvEntry>();
  #input: Tensor | null = null;
  #entry: ConvEntry | null = null;
  /** The channel sums of the output on the `conv-bn` fused path (f32[outChannels]). */
  #sums: { sum: Tensor; sqSum: Tensor } | null = null;
  /** The batch norm output that fed the last forward's prologue ({@link forwardPrologue}), or null. */
  #prologue: PrologueInput | null = null;

  constructor(options: Conv2dOptions) {
    super();
    const o = expectOptions<Conv2dOptions>('Conv2d options', options, [
      'inChannels',
      'outChannels',
      'kernelSize',
      'stride',
      'padding',
      'dilation',
      'bias',
      'seed',
    ]);
    this.inChannels = expectSize('inChannels', o.inChannels, 1);
    this.outChannels = expectSize('outChannels', o.outChannels, 1);
    this.kernelSize = expectSizePair('kernelSize', o.kernelSize, 1);
    this.stride = expectSizePair('stride', o.stride ?? 1, 1);
    this.padding = expectSizePair('padding', o.padding ?? 0, 0);
    this.dilation = expectSizePair('dilation', o.dilation ?? 1, 1);
    const rng = new Random(o.seed);
    const [kh, kw] = this.kernelSize;
    expectWeightSize(
      'outChannels',
      [this.outChannels, kh, kw, this.inChannels],
      'outChannels x kernelSize x inChannels',
    );
    const fanIn = this.inChannels * kh * kw;
    const bound = 1 / Math.sqrt(fanIn);
    const shape = [this.outChannels, kh, kw, this.inChannels];
    this.weight = this.registerParameter(
      'weight',
      new Parameter(shape, uniform(this.outChannels * fanIn, bound, rng), 'ohwi', 'weight'),
    );
    this.bias = expectBool('bias', o.bias ?? false)
      ? this.registerParameter(
          'bias',
          new Parameter([this.outChannels], uniform(this.outChannels, bound, rng), 'plain', 'bias'),
        )
      : null;
  }

  /** The convolution window's stride, padding and dilation, as the native ops name them. */
  #window(): ConvWindow {
    const [strideH, strideW] = this.stride;
    const [padH, padW] = this.padding;
    const [dilationH, dilationW] = this.dilation;
    return { strideH, strideW, padH, padW, dilationH, dilationW };
  }
  /** The output shape for an NHWC input shape. */
  outputShape(input: readonly number[]): number[] {
    const [n, h, w] = input as [number, number, number];
    const size = (axis: 0 | 1, length: number): number =>
      addon().windowOutputSize({
        size: length,
        kernel: this.kernelSize[axis],
        stride: this.stride[axis],
        pad: this.padding[axis],
        dilation: this.dilation[axis],
      });
    return [n, size(0, h), size(1, w), this.outChannels];
  }

  override forward(x: Tensor): Tensor {
    this.prepare(x, 'Conv2d');
    const entry = this.#entryFor(x);
    this.#entry = entry;
    this.#prologue = null;
    if (this.#takesConvBn(x)) {
      this.#convBnForward(x, entry, null);
      this.#input = x;
    } else {
      pendingStats.delete(entry.y);
      this.#input = weightedForward(this, CONV2D_OPS, entry, x);
    }
    return entry.y;
  }

  /**
   * Whether {@link forwardPrologue} takes the batch norm output of input `x` (same shape and
   * dtype): the conditions of the `conv-bn` path, and `x` of this convolution's input channels.
   * @internal
   */
  takesPrologue(x: Tensor): boolean {
    return (
      x.shape.length === 4 &&
      x.shape[3] === this.inChannels &&
      this.#takesConvBn(x) &&
      convBnAccepts(x, this.#convBnWindow(), true)
    );
  }

  /**
   * The forward of `relu(p.x * p.scale + p.shift)` that the batch norm before this convolution
   * handed over ({@link BatchNorm2d.forwardPrologue}): one convBnForward applies the batch norm
   * and ReLU in its prologue and writes this output's channel sums in its epilogue. The activation
   * it reads is not written; the pair's backward is {@link backwardPrologue} and the batch norm's
   * {@link BatchNorm2d.backwardPrologue} (`lib/nn/prologue.ts`).
   * @internal
   */
  forwardPrologue(p: PrologueInput): Tensor {
    this.prepare(p.x, 'Conv2d');
    const entry = this.#entryFor(p.x);
    if (!this.takesPrologue(p.x)) prologueMisuse('Conv2d.forwardPrologue (the conv-bn path does not apply)');
    this.#entry = entry;
    this.#convBnForward(p.x, entry, p);
    this.#input = null;
    this.#prologue = p;
    return entry.y;
  }

  /**
   * The weight and window of the last {@link forwardPrologue}, for the batch norm's backward
   * through this convolution (convDgradDbn).
   * @internal
   */
  prologueGradArgs(): { weight: RawTensor } & ConvWindow {
    if (!this.#prologue) prologueMisuse('Conv2d.prologueGradArgs (the last forward was not fed by a prologue)');
    return { weight: this.weight.data.raw, ...this.#window() };
  }

  /** Checks input `x` and returns the plan and buffers of its shape. */
  #entryFor(x: Tensor): ConvEntry {
    expectTensor('Conv2d input', x, { rank: 4, dtype: FLOAT_DTYPES });
    if (x.shape[3] !== this.inChannels) {
      mismatch(
        'Conv2d input',
        `an NHWC tensor with ${this.inChannels} channels (last dimension)`,
        `shape [${x.shape.join(', ')}]`,
      );
    }
    const out = this.outputShape(x.shape);
    if (out[1]! <= 0 || out[2]! <= 0) {
      mismatch('Conv2d input', 'a spatial size at least the kernel size', `shape [${x.shape.join(', ')}]`);
    }
    return this.#cache.get(x, () => {
      const [n, h, w, c] = x.shape as [number, number, number, number];
      const plan = new (addon().Conv2dPlan)({
        device: x.device,
        dtype: x.dtype,
        n,
        h,
        w,
        c,
        k: this.outChannels,
        kernelH: this.kernelSize[0],
        kernelW: this.kernelSize[1],
        ...this.#window(),
        bias: this.bias !== null,
      });
      return weightedEntry(this, plan, x, out);
    });
  }

  /**
   * Whether this forward takes the `conv-bn` fused path: switched on for a CUDA device, in
   * training, bf16 or f16, no bias and no quantizer, channel counts that are multiples of 8, and
   * cuDNN accepts the shape's graph with the statistics epilogue (else it runs unfused, with a
   * warning: lib/nn/conv-bn-support.ts).
   */
  #takesConvBn(x: Tensor): boolean {
    return (
      this.training &&
      this.bias === null &&
      this.quantizer === null &&
      (x.dtype === 'bf16' || x.dtype === 'f16') &&
      this.inChannels % 8 === 0 &&
      this.outChannels % 8 === 0 &&
      x.shape.length === 4 &&
      fusedPathOn('conv-bn', x.device) &&
      convBnAccepts(x, this.#convBnWindow(), false)
    );
  }

  /** This convolution's output channels and window, as convBnSupport takes them. */
  #convBnWindow(): ConvBnWindow {
    return { k: this.outChannels, kernelH: this.kernelSize[0], kernelW: this.kernelSize[1], ...this.#window() };
  }

  /**
   * The convolution with the statistics epilogue (the batch norm reading `e.y` takes the sums),
   * and with the scale-bias-ReLU prologue of `prologue` when given.
   */
  #convBnForward(x: Tensor, e: ConvEntry, prologue: PrologueInput | null): void {
    const k = [this.outChannels];
    const sums = (this.#sums ??= {
      sum: this.activationBuffer(k, 'f32', x.device),
      sqSum: this.activationBuffer(k, 'f32', x.device),
    });
    const recorder = opRecorder;
    const token = recorder ? recorder.begin(CONV2D_OPS.forward, this, x.device) : 0;
    addon().convBnForward({
      x: x.raw,
      weight: this.weight.data.raw,
      y: e.y.raw,
      sum: sums.sum.raw,
      sqSum: sums.sqSum.raw,
      ...(prologue ? { scale: prologue.scale.raw, shift: prologue.shift.raw } : {}),
      ...this.#window(),
    });
    recorder?.end(token);
    pendingStats.set(e.y, { sum: sums.sum, sqSum: sums.sqSum, count: e.y.numel / this.outChannels });
  }

  override backward(gradOutput: Tensor): Tensor | null {
    if (this.#prologue) prologueMisuse('Conv2d.backward()');
    return this.backwardOnce(this.constructor.name, () =>
      weightedBackward(this, CONV2D_OPS, this.#entry, this.#input, gradOutput),
    );
  }

  /**
   * The backward of the last forward with the input gradient added into `into` (a tensor of the
   * input's shape, dtype and device) instead of written to a buffer of its own: a residual block
   * sums its main branch's input gradient with its shortcut's in this convolution's own pass
   * (a matrix product whose sum post-op adds, or cuDNN's beta = 1). Returns `into`. Not under
   * quantization-aware training, whose quantizer maps the whole input gradient.
   * @internal
   */
  backwardInto(gradOutput: Tensor, into: Tensor): Tensor {
    if (this.#prologue) prologueMisuse('Conv2d.backwardInto()');
    if (this.quantizer) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'Conv2d.backwardInto(): a quantized convolution maps its whole input gradient; use backward() and add',
      );
    }
    const input = this.#input;
    if (input) {
      expectTensor('Conv2d.backwardInto target', into, {
        shape: input.shape,
        dtype: input.dtype,
        device: input.device,
      });
    }
    this.requiresInputGrad = true;
    this.backwardOnce(this.constructor.name, () =>
      weightedBackward(this, CONV2D_OPS, this.#entry, this.#input, gradOutput, into),
    );
    return into;
  }

  /**
   * The weight gradient of a {@link forwardPrologue}: `dW += wgrad(relu(x * scale + shift), dy)`
   * in one convWgradSbr, the activation applied as the batch norm's input is loaded. The input
   * gradient is the batch norm's {@link BatchNorm2d.backwardPrologue}; this returns null.
   * @internal
   */
  backwardPrologue(gradOutput: Tensor): null {
    return this.backwardOnce(this.constructor.name, () => {
      const p = this.#prologue;
      const e = this.#entry;
      if (!p || !e) return prologueMisuse('Conv2d.backwardPrologue (the last forward was not fed by a prologue)');
      expectTensor('Conv2d gradOutput', gradOutput, { shape: e.y.shape, dtype: e.y.dtype, device: e.y.device });
      if (!this.weight.requiresGrad) return null;
      const recorder = opRecorder;
      const token = recorder ? recorder.begin(CONV2D_OPS.backwardWeights, this, p.x.device) : 0;
      addon().convWgradSbr({
        x: p.x.raw,
        dy: gradOutput.raw,
        scale: p.scale.raw,
        shift: p.shift.raw,
        dWeight: this.weight.grad.raw,
        ...this.#window(),
      });
      recorder?.end(token);
      return null;
    });
  }

  /** The implementation oneDNN/cuDNN chose for the last input shape (for logs and benchmarks). */
  implementation(): string {
    return this.#entry?.plan.implementation() ?? 'not yet planned';
  }

  protected override disposeCache(): void {
    this.#cache.clear();
    this.#entry = null;
    this.#input = null;
    this.#prologue = null;
    disposeAll(this.#sums?.sum, this.#sums?.sqSum);
    this.#sums = null;
  }
}

/** Options of {@link BatchNorm2d}. */
export interface BatchNorm2dOptions {
  numFeatures: number;
  eps?: number;
  momentum?: number;
  /** Apply ReLU to the output (after the residual, when one is given), fused into the same pass. */
  relu?: boolean;
}

/** The arguments of a training forward, as the native batch-norm forward takes them. */
export type BatchNormForwardArgs = Parameters<RawAddon['batchNormForward']>[0];
/** The arguments of its backward, likewise. */
export type BatchNormBackwardArgs = Parameters<RawAddon['batchNormBackward']>[0];

/**
 * Batch statistics shared with other processes (SyncBatchNorm attaches one to a
 * {@link BatchNorm2d}): while {@link BatchNormSync.active}, a training-mode forward and its
 * backward run through it rather than through the local ops.
 */
export interface BatchNormSync {
  /** Whether training-mode passes synchronise (false in a group of one process). */
  readonly active: boolean;
  /** Checks that `x` can take part (its device is the group's); throws a ResnetError otherwise. */
  checkInput(x: Tensor): void;
  /** The training forward with statistics over every process's batch. */
  forward(args: BatchNormForwardArgs): void;
  /** Its backward, with the gradient sums over every process's batch. */
  backward(args: BatchNormBackwardArgs): void;
  /** Frees its per-shape scratch (the layer's cache is being cleared). */
  release(): void;
}

interface BnEntry {
  /** The output, allocated on first access. */
  readonly y: Tensor;
  saveMean: Tensor;
  saveInvStd: Tensor;
  dx: Tensor | null;
  dResidual: Tensor | null;
  /** Receive the gradients of a frozen weight and bias, which the native op always computes. */
  discardGamma: Tensor | null;
  discardBeta: Tensor | null;
  /** The `conv-bn` finalize's outputs besides the saved statistics (f32[C] each). */
  fused: { scale: Tensor; shift: Tensor; variance: Tensor } | null;
  /** The input gradient's per-channel coefficients from convDgradDbn (f32[C] each). */
  eq: { dz: Tensor; x: Tensor; bias: Tensor } | null;
  dispose(): void;
}

/**
 * Batch normalisation over `[N, H, W, C]` per channel, with PyTorch's semantics: batch statistics
 * in training (running averages updated with `momentum`, unbiased variance), running statistics
 * in evaluation. Optionally fuses a residual add and a ReLU: `y = relu(bn(x) + residual)`.
 */
export class BatchNorm2d extends Module {
  readonly numFeatures: number;
  readonly eps: number;
  readonly momentum: number;
  readonly relu: boolean;
  readonly weight: Parameter;
  readonly bias: Parameter;
  readonly #runningMean;
  readonly #runningVar;
  readonly #cache = new ShapeCache<BnEntry>();
  #input: Tensor | null = null;
  #residual: Tensor | null = null;
  #entry: BnEntry | null = null;
  /** The mode of the last forward, which decides its backward (batch or running statistics). */
  #forwardTraining = true;
  /** Where a recomputed training forward writes its running-average update, which is discarded. */
  #discardedRunning: { mean: Tensor; var: Tensor } | null = null;
  /** Statistics shared with other processes (SyncBatchNorm), or null for a local batch norm. */
  #sync: BatchNormSync | null = null;
  /** The sync that ran the last forward, which then runs its backward; null when it ran locally. */
  #forwardSync: BatchNormSync | null = null;
  /** Set by {@link deferNextForward}: the next forward records its input and leaves the output alone. */
  #deferNext = false;
  /** The shortcut batch norm whose pass the last forward ran with its own (a dual batch norm), or null. */
  #dualShortcut: BatchNorm2d | null = null;
  /** The main-branch batch norm whose dual pass normalised this one's last input, or null. */
  #dualMain: BatchNorm2d | null = null;
  /** The last forward was deferred and no dual pass has normalised its input yet. */
  #dualPending = false;
  /** Whether the dual backward of {@link #dualMain} has computed this one's gradients for the last forward. */
  #dualGradReady = false;
  /** 'unwritten' when the last forward fed the next convolution's prologue ({@link forwardPrologue}). */
  #output: 'written' | 'unwritten' = 'written';
  /**
   * Set while gradient checkpointing recomputes a forward that already ran: a training-mode
   * forward then uses the batch statistics as usual but leaves the running statistics and
   * `num_batches_tracked` as they are, so that they are updated once per step.
   * @internal
   */
  recomputing = false;

  constructor(options: BatchNorm2dOptions) {
    super();
    const o = expectOptions<BatchNorm2dOptions>('BatchNorm2d options', options, [
      'numFeatures',
      'eps',
      'momentum',
      'relu',
    ]);
    this.numFeatures = expectSize('numFeatures', o.numFeatures, 1);
    this.eps = expectNumber('eps', o.eps ?? 1e-5, Number.MIN_VALUE);
    this.momentum = expectNumber('momentum', o.momentum ?? 0.1, 0, 1);
    this.relu = expectBool('relu', o.relu ?? false);
    const c = this.numFeatures;
    this.weight = this.registerParameter('weight', new Parameter([c], new Float32Array(c).fill(1), 'plain', 'norm'));
    this.bias = this.registerParameter('bias', new Parameter([c], new Float32Array(c), 'plain', 'norm'));
    this.#runningMean = this.registerBuffer('running_mean', new Float32Array(c));
    this.#runningVar = this.registerBuffer('running_var', new Float32Array(c).fill(1));
    this.registerCounter('num_batches_tracked');
  }

  /**
   * Shares the batch statistics of training-mode passes with other processes through `sync` (null
   * makes the layer local again). Parameters, buffers and their names stay as they are.
   * @internal
   */
  attachSync(sync: BatchNormSync | null): void {
    this.#sync?.release();
    this.#sync = sync;
  }

  /** The statistics sharing attached by SyncBatchNorm, or null. */
  get sync(): BatchNormSync | null {
    return this.#sync;
  }

  /** Normalises `x`; adds `residual` (same shape) before the optional ReLU. */
  override forward(x: Tensor, residual?: Tensor): Tensor {
    const sync = this.#checkInput(x);
    if (residual !== undefined) {
      expectTensor('BatchNorm2d residual', residual, { shape: x.shape, dtype: x.dtype, device: x.device });
    }
    const entry = this.#entryFor(x);
    if (this.#deferNext) {
      // A dual pass of the main branch's batch norm (forwardDual) normalises this input.
      this.#deferNext = false;
      // The channel sums of x, if its convolution wrote them, stay for the dual pass.
      this.#recordForward(x, null, entry, null, null, true);
      // Nothing reads this output; x (same shape) stands in for it, so no buffer is allocated.
      return x;
    }
    const discard = this.training && this.recomputing ? this.#discardRunning(x.device) : null;
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('batchnorm.forward', this, x.device) : 0;
    const args: BatchNormForwardArgs = {
      x: x.raw,
      gamma: this.weight.data.raw,
      beta: this.bias.data.raw,
      ...(residual ? { residual: residual.raw } : {}),
      y: entry.y.raw,
      runningMean: (discard?.mean ?? defined(this.#runningMean.tensor, 'the BatchNorm2d running mean')).raw,
      runningVar: (discard?.var ?? defined(this.#runningVar.tensor, 'the BatchNorm2d running variance')).raw,
      saveMean: entry.saveMean.raw,
      saveInvStd: entry.saveInvStd.raw,
      training: this.training,
      relu: this.relu,
      momentum: this.momentum,
      eps: this.eps,
    };
    // The convolution that made x wrote its channel sums (the `conv-bn` fused path): no pass over
    // x for the statistics.
    const stats = this.training && !sync ? pendingStats.get(x) : undefined;
    pendingStats.delete(x);
    if (sync) sync.forward(args);
    else if (stats) this.#fusedForward(args, stats, entry, x.device);
    else addon().batchNormForward(args);
    recorder?.end(token);
    if (this.training && !discard) this.bumpCounter('num_batches_tracked');
    this.#recordForward(x, residual ?? null, entry, sync, null);
    return entry.y;
  }

  /**
   * Whether {@link forwardPrologue} takes input `x`: training mode, ReLU, local (not synchronised),
   * no deferred forward pending, and the channel sums of `x` written by the convolution that made
   * it (the `conv-bn` path).
   * @internal
   */
  feedsPrologue(x: Tensor): boolean {
    return (
      this.training &&
      this.relu &&
      !this.#deferNext &&
      this.#sync?.active !== true &&
      pendingStats.has(x) &&
      fusedPathOn('conv-bn', x.device)
    );
  }

  /**
   * The training forward of `relu(bn(x))` for the next convolution's prologue (the `conv-bn` fused
   * path): from the channel sums of `x`, the finalize writes the saved statistics, the running
   * statistics' update and the prologue's scale and shift; the output is NOT written. Only the
   * containers call it (`lib/nn/prologue.ts`), for an adjacent batch norm and convolution where
   * nothing else reads the batch norm's output; their backward runs as one step.
   * @internal
   */
  forwardPrologue(x: Tensor): PrologueInput {
    const sync = this.#checkInput(x);
    const stats = pendingStats.get(x);
    if (sync || !stats || !this.feedsPrologue(x)) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'BatchNorm2d.forwardPrologue: needs training mode, relu: true, a local batch norm and the channel sums of ' +
          'its input from a convolution on the conv-bn fused path',
      );
    }
    pendingStats.delete(x);
    const entry = this.#entryFor(x);
    const discard = this.recomputing ? this.#discardRunning(x.device) : null;
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('batchnorm.forward', this, x.device) : 0;
    const running = {
      mean: (discard?.mean ?? defined(this.#runningMean.tensor, 'the BatchNorm2d running mean')).raw,
      var: (discard?.var ?? defined(this.#runningVar.tensor, 'the BatchNorm2d running variance')).raw,
    };
    const f = this.#finalize(stats, entry, running, x.device);
    recorder?.end(token);
    if (!discard) this.bumpCounter('num_batches_tracked');
    this.#recordForward(x, null, entry, null, null);
    this.#output = 'unwritten';
    return { norm: this, x, scale: f.scale, shift: f.shift };
  }

  /**
   * The backward of a {@link forwardPrologue} from the gradient of the output of `conv`, the
   * convolution it fed: one convDgradDbn computes that convolution's data gradient, masks it by
   * the ReLU of the recomputed `x * scale + shift` into `dz`, accumulates dγ and dβ, and yields the
   * coefficients of this batch norm's input gradient, which batchNormBackwardApply writes (in
   * place of `dz`) when {@link requiresInputGrad}. The convolution's weight gradient is its own
   * {@link Conv2d.backwardPrologue}.
   * @internal
   */
  backwardPrologue(gradOutput: Tensor, conv: Conv2d): Tensor | null {
    return this.backwardOnce('BatchNorm2d', () => {
      const e = this.#entry;
      const x = this.#input;
      const f = e?.fused;
      if (this.#output !== 'unwritten' || !e || !x || !f) {
        throw new ResnetError(
          'ERR_RC_INVALID_ARGUMENT',
          'BatchNorm2d.backwardPrologue: the last forward did not feed a convolution prologue',
        );
      }
      const c = [this.numFeatures];
      const eq = (e.eq ??= {
        dz: this.activationBuffer(c, 'f32', x.device),
        x: this.activationBuffer(c, 'f32', x.device),
        bias: this.activationBuffer(c, 'f32', x.device),
      });
      const dz = (e.dx = this.gradientBuffer(e.dx, x.shape, x.dtype, x.device));
      const recorder = opRecorder;
      let token = recorder ? recorder.begin('conv2d.backward_data', conv, x.device) : 0;
      addon().convDgradDbn({
        dy: gradOutput.raw,
        ...conv.prologueGradArgs(),
        x: x.raw,
        scale: f.scale.raw,
        shift: f.shift.raw,
        gamma: this.weight.data.raw,
        saveMean: e.saveMean.raw,
        saveInvStd: e.saveInvStd.raw,
        dz: dz.raw,
        ...this.#paramGrads(x.device, e),
        eqDz: eq.dz.raw,
        eqX: eq.x.raw,
        eqBias: eq.bias.raw,
      });
      recorder?.end(token);
      if (!this.requiresInputGrad) return null;
      token = recorder ? recorder.begin('batchnorm.backward', this, x.device) : 0;
      addon().batchNormBackwardApply({
        dz: dz.raw,
        x: x.raw,
        eqDz: eq.dz.raw,
        eqX: eq.x.raw,
        eqBias: eq.bias.raw,
        dx: dz.raw,
      });
      recorder?.end(token);
      return dz;
    });
  }

  /**
   * Makes the next {@link forward} only check and record its input and return it unchanged (its
   * output is not computed): the main branch's batch norm normalises that input in its dual pass
   * ({@link forwardDual}).
   * Residual sets it on a downsample shortcut's batch norm when the fused path `bn-add-relu` is on.
   * @internal
   */
  deferNextForward(defer = true): void {
    this.#deferNext = defer;
  }

  /**
   * `y = relu?(bn(x) + shortcut(s))` in one dual pass, `s` being the input the shortcut batch norm
   * recorded in its deferred forward (see {@link deferNextForward}); both batch norms in the same
   * mode, neither synchronised. Each one's running statistics and `num_batches_tracked` are
   * updated (unless it is recomputing, as in {@link forward}), and its backward computes both
   * batch norms' gradients.
   * @internal
   */
  forwardDual(x: Tensor, shortcut: BatchNorm2d): Tensor {
    const sync = this.#checkInput(x);
    const pending = shortcut instanceof BatchNorm2d && shortcut !== this && shortcut.#dualPending;
    const s = pending ? shortcut.#input : null;
    const sEntry = pending ? shortcut.#entry : null;
    if (!s || !sEntry) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'BatchNorm2d.forwardDual: the shortcut batch norm must have run a deferred forward for this pass',
      );
    }
    if (sync || (shortcut.training && shortcut.#sync?.active) || shortcut.training !== this.training) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'BatchNorm2d.forwardDual: both batch norms must be local (not synchronised) and in the same mode',
      );
    }
    expectTensor('BatchNorm2d dual shortcut input', s, { shape: x.shape, dtype: x.dtype, device: x.device });
    const entry = this.#entryFor(x);
    // With the channel sums of both inputs from their convolutions (the `conv-bn` path), each
    // side's statistics are finalised from them and the dual pass only normalises; otherwise it
    // computes both inputs' statistics itself.
    const statsA = this.training ? pendingStats.get(x) : undefined;
    const statsB = shortcut.training ? pendingStats.get(s) : undefined;
    const sums = statsA && statsB ? { a: statsA, b: statsB } : null;
    pendingStats.delete(x);
    pendingStats.delete(s);
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('batchnorm.forward', this, x.device) : 0;
    const a = this.#dualSide(x, entry, sums?.a ?? null);
    const b = shortcut.#dualSide(s, sEntry, sums?.b ?? null);
    addon().dualBatchNormForward({
      a: a.side,
      b: b.side,
      y: entry.y.raw,
      training: this.training && !sums,
      relu: this.relu,
    });
    recorder?.end(token);
    if (this.training && !a.discarded) this.bumpCounter('num_batches_tracked');
    if (shortcut.training && !b.discarded) shortcut.bumpCounter('num_batches_tracked');
    this.#recordForward(x, null, entry, null, shortcut);
    return entry.y;
  }

  /**
   * This batch norm's side of a dual forward of input `x`. With `stats` (the channel sums of `x`)
   * the statistics are finalised here and the side carries the batch mean and variance for a pass
   * that only normalises (as {@link #fusedForward} does for a single batch norm).
   */
  #dualSide(x: Tensor, entry: BnEntry, stats: PendingStats | null): { side: RawDualBatchNormSide; discarded: boolean } {
    const discard = this.training && this.recomputing ? this.#discardRunning(x.device) : null;
    const runningMean = (discard?.mean ?? defined(this.#runningMean.tensor, 'the BatchNorm2d running mean')).raw;
    const runningVar = (discard?.var ?? defined(this.#runningVar.tensor, 'the BatchNorm2d running variance')).raw;
    const common = { x: x.raw, gamma: this.weight.data.raw, beta: this.bias.data.raw, eps: this.eps };
    if (stats) {
      const f = this.#finalize(stats, entry, { mean: runningMean, var: runningVar }, x.device);
      const side = { ...common, runningMean: entry.saveMean.raw, runningVar: f.variance.raw };
      return { side, discarded: discard !== null };
    }
    const side: RawDualBatchNormSide = {
      ...common,
      runningMean,
      runningVar,
      saveMean: entry.saveMean.raw,
      saveInvStd: entry.saveInvStd.raw,
      momentum: this.momentum,
    };
    return { side, discarded: discard !== null };
  }

  /** Checks `x` and places the layer; returns the sync that runs a training pass, or null. */
  #checkInput(x: Tensor): BatchNormSync | null {
    this.prepare(x, 'BatchNorm2d');
    expectTensor('BatchNorm2d input', x, { rank: 4, dtype: FLOAT_DTYPES });
    if (x.shape[3] !== this.numFeatures) {
      mismatch(
        'BatchNorm2d input',
        `an NHWC tensor with ${this.numFeatures} channels (last dimension)`,
        `shape [${x.shape.join(', ')}]`,
      );
    }
    const sync = this.training && this.#sync?.active ? this.#sync : null;
    sync?.checkInput(x);
    // Synchronised, a process may hold a single value per channel: the count that matters is global.
    if (this.training && !sync && x.numel / this.numFeatures <= 1) {
      mismatch(
        'BatchNorm2d input',
        'more than one value per channel in training mode',
        `shape [${x.shape.join(', ')}]`,
      );
    }
    return sync;
  }

  /**
   * The cached output and saved statistics for `x`'s shape. The output buffer is allocated on first
   * use: a batch norm that feeds a convolution's prologue or a dual pass never writes it.
   */
  #entryFor(x: Tensor): BnEntry {
    return this.#cache.get(x, () => {
      const c = [this.numFeatures];
      let y: Tensor | null = null;
      const allocateY = () => this.activationBuffer(x.shape, x.dtype, x.device);
      const e: BnEntry = {
        get y() {
          return (y ??= allocateY());
        },
        saveMean: this.activationBuffer(c, 'f32', x.device),
        saveInvStd: this.activationBuffer(c, 'f32', x.device),
        dx: null,
        dResidual: null,
        discardGamma: null,
        discardBeta: null,
        fused: null,
        eq: null,
        dispose: () =>
          disposeAll(
            y,
            e.saveMean,
            e.saveInvStd,
            e.dx,
            e.dResidual,
            e.discardGamma,
            e.discardBeta,
            e.fused?.scale,
            e.fused?.shift,
            e.fused?.variance,
            e.eq?.dz,
            e.eq?.x,
            e.eq?.bias,
          ),
      };
      return e;
    });
  }

  /** What the backward of this forward needs; a deferred forward (no sync) pairs with its main. */
  #recordForward(
    x: Tensor,
    residual: Tensor | null,
    entry: BnEntry,
    sync: BatchNormSync | null,
    dualShortcut: BatchNorm2d | null,
    deferred = false,
  ): void {
    this.#forwardTraining = this.training;
    this.#forwardSync = sync;
    this.#input = x;
    this.#residual = residual;
    this.#entry = entry;
    this.#dualShortcut = dualShortcut;
    this.#dualMain = null;
    this.#dualGradReady = false;
    this.#dualPending = deferred;
    this.#output = 'written';
    if (dualShortcut) {
      dualShortcut.#dualMain = this;
      dualShortcut.#dualPending = false;
    }
  }

  /**
   * A training forward from a convolution's channel sums: the finalize writes the saved statistics,
   * the running statistics' update and the batch variance; the normalisation (with the residual
   * and ReLU) then runs with those batch statistics, as the evaluation-mode forward runs with the
   * running ones.
   */
  #fusedForward(args: BatchNormForwardArgs, stats: PendingStats, e: BnEntry, device: string): void {
    const f = this.#finalize(stats, e, { mean: args.runningMean, var: args.runningVar }, device);
    addon().batchNormForward({
      x: args.x,
      gamma: args.gamma,
      beta: args.beta,
      ...(args.residual ? { residual: args.residual } : {}),
      y: args.y,
      runningMean: e.saveMean.raw,
      runningVar: f.variance.raw,
      training: false,
      relu: this.relu,
      eps: this.eps,
    });
  }

  /**
   * The batch statistics from a convolution's channel sums (batchNormFinalize): the saved
   * statistics, the prologue's scale and shift and the batch variance into the entry, the running
   * statistics' update into `running` (the layer's own, or scratch while recomputing).
   */
  #finalize(
    stats: PendingStats,
    e: BnEntry,
    running: { mean: RawTensor; var: RawTensor },
    device: string,
  ): { scale: Tensor; shift: Tensor; variance: Tensor } {
    const c = [this.numFeatures];
    const f = (e.fused ??= {
      scale: this.activationBuffer(c, 'f32', device),
      shift: this.activationBuffer(c, 'f32', device),
      variance: this.activationBuffer(c, 'f32', device),
    });
    addon().batchNormFinalize({
      sum: stats.sum.raw,
      sqSum: stats.sqSum.raw,
      gamma: this.weight.data.raw,
      beta: this.bias.data.raw,
      runningMean: running.mean,
      runningVar: running.var,
      saveMean: e.saveMean.raw,
      saveInvStd: e.saveInvStd.raw,
      scale: f.scale.raw,
      shift: f.shift.raw,
      variance: f.variance.raw,
      count: stats.count,
      momentum: this.momentum,
      eps: this.eps,
    });
    return f;
  }

  /** Scratch running statistics for a recomputed forward (zeros and ones, so the update stays finite). */
  #discardRunning(device: string): { mean: Tensor; var: Tensor } {
    const c = [this.numFeatures];
    this.#discardedRunning ??= { mean: Tensor.zeros(c, { device }), var: Tensor.full(c, 1, { device }) };
    return this.#discardedRunning;
  }

  /**
   * The gradient with respect to the residual of the last forward, after `backward`. In a
   * {@link Residual} with the identity shortcut, after the block's backward it holds the block's
   * input gradient: the main branch's first convolution adds its input gradient into it.
   */
  get residualGrad(): Tensor | null {
    return this.#residual ? (this.#entry?.dResidual ?? null) : null;
  }

  /**
   * Gradients of the last forward. After a training-mode forward they go through the batch
   * statistics; after an evaluation-mode forward (fine-tuning with frozen statistics) the running
   * statistics are constants, as in PyTorch: dx = dy·γ/√(running_var + ε), and dγ, dβ from x̂
   * normalised with the running statistics.
   */
  override backward(gradOutput: Tensor): Tensor | null {
    return this.backwardOnce('BatchNorm2d', () => this.#backward(gradOutput));
  }

  #backward(gradOutput: Tensor): Tensor | null {
    const e = this.#entry;
    const x = this.#input;
    if (!e || !x) return backwardBeforeForward('BatchNorm2d');
    if (this.#output !== 'written') prologueMisuse('BatchNorm2d.backward()');
    expectTensor('BatchNorm2d gradOutput', gradOutput, { shape: e.y.shape, dtype: e.y.dtype, device: e.y.device });
    if (this.#dualMain || this.#dualPending) return this.#shortcutGrad(e);
    e.dx = this.gradientBuffer(e.dx, x.shape, x.dtype, x.device);
    if (this.#dualShortcut) return this.#dualBackward(gradOutput, x, e, this.#dualShortcut);
    const dResidual = this.#residual
      ? (e.dResidual = this.gradientBuffer(e.dResidual, x.shape, x.dtype, x.device))
      : null;
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('batchnorm.backward', this, x.device) : 0;
    const args: BatchNormBackwardArgs = {
      x: x.raw,
      y: e.y.raw,
      dy: gradOutput.raw,
      gamma: this.weight.data.raw,
      beta: this.bias.data.raw,
      saveMean: e.saveMean.raw,
      saveInvStd: e.saveInvStd.raw,
      dx: e.dx.raw,
      ...this.#paramGrads(x.device, e),
      relu: this.relu,
      training: this.#forwardTraining,
      ...(dResidual ? { dResidual: dResidual.raw } : {}),
    };
    if (this.#forwardSync) this.#forwardSync.backward(args);
    else addon().batchNormBackward(args);
    recorder?.end(token);
    return e.dx;
  }

  /** Where dγ and dβ accumulate: the parameters' gradients, or scratch for a frozen parameter. */
  #paramGrads(device: string, e: BnEntry): { dGamma: RawTensor; dBeta: RawTensor } {
    const c = [this.numFeatures];
    return {
      dGamma: this.weight.requiresGrad ? this.weight.grad.raw : (e.discardGamma ??= Tensor.zeros(c, { device })).raw,
      dBeta: this.bias.requiresGrad ? this.bias.grad.raw : (e.discardBeta ??= Tensor.zeros(c, { device })).raw,
    };
  }

  /**
   * The backward of a dual forward ({@link forwardDual}): one op computes this batch norm's and the
   * shortcut's gradients from `gradOutput` masked by the ReLU; the shortcut's backward then hands
   * out its input gradient.
   */
  #dualBackward(gradOutput: Tensor, x: Tensor, e: BnEntry, shortcut: BatchNorm2d): Tensor {
    const s = defined(shortcut.#input, 'the input of the dual shortcut batch norm');
    const se = defined(shortcut.#entry, 'the saved statistics of the dual shortcut batch norm');
    se.dx = shortcut.gradientBuffer(se.dx, s.shape, s.dtype, s.device);
    const dx = defined(e.dx, 'the BatchNorm2d input gradient');
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('batchnorm.backward', this, x.device) : 0;
    addon().dualBatchNormBackward({
      a: this.#gradSide(x, e, dx),
      b: shortcut.#gradSide(s, se, se.dx),
      y: e.y.raw,
      dy: gradOutput.raw,
      relu: this.relu,
      training: this.#forwardTraining,
    });
    recorder?.end(token);
    shortcut.#dualGradReady = true;
    return dx;
  }

  /** This batch norm's side of a dual backward. */
  #gradSide(x: Tensor, e: BnEntry, dx: Tensor): RawDualBatchNormGradSide {
    return {
      x: x.raw,
      gamma: this.weight.data.raw,
      saveMean: e.saveMean.raw,
      saveInvStd: e.saveInvStd.raw,
      dx: dx.raw,
      ...this.#paramGrads(x.device, e),
    };
  }

  /**
   * The backward of a shortcut batch norm whose forward a dual pass ran: its gradients were
   * computed by the main branch's batch norm's backward (which must have run), so its own
   * `gradOutput` is only checked for its shape.
   */
  #shortcutGrad(e: BnEntry): Tensor {
    if (!this.#dualMain || !this.#dualGradReady || !e.dx) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'BatchNorm2d.backward(): this batch norm ran in a dual pass (fused path bn-add-relu); the backward of ' +
          'the batch norm that ran that pass computes its gradients and must run first',
      );
    }
    return e.dx;
  }

  protected override disposeCache(): void {
    this.#cache.clear();
    this.#entry = null;
    this.#input = null;
    this.#residual = null;
    disposeAll(this.#discardedRunning?.mean, this.#discardedRunning?.var);
    this.#discardedRunning = null;
    this.#forwardSync = null;
    this.#dualShortcut = null;
    this.#dualMain = null;
    this.#dualPending = false;
    this.#dualGradReady = false;
    this.#deferNext = false;
    this.#output = 'written';
    this.#sync?.release();
  }
}

/** A ReLU's (no plan) or a pooling layer's cached tensors for one input shape. */
interface UnaryEntry<P extends RawPool2dPlan | null> {
  y: Tensor;
  dx: Tensor | null;
  workspace: Tensor | null;
  plan: P;
  dispose(): void;
}

function unaryEntry<P extends RawPool2dPlan | null>(
  layer: Module,
  x: Tensor,
  outShape: readonly number[],
  plan: P,
): UnaryEntry<P> {
  const bytes = plan?.workspaceBytes() ?? 0;
  const e: UnaryEntry<P> = {
    y: layer.activationBuffer(outShape, x.dtype, x.device),
    dx: null,
    workspace: bytes > 0 ? layer.activationBuffer([bytes], 'u8', x.device) : null,
    plan,
    dispose: () => disposeAll(e.y, e.dx, e.workspace, e.plan),
  };
  return e;
}

/** Element-wise `max(x, 0)`. (In ResNets it is fused into BatchNorm2d instead.) */
export class ReLU extends Module {
  readonly #cache = new ShapeCache<UnaryEntry<null>>();
  #entry: UnaryEntry<null> | null = null;

  override forward(x: Tensor): Tensor {
    this.prepare(x, 'ReLU');
    expectTensor('ReLU input', x, { dtype: FLOAT_DTYPES });
    const entry = this.#cache.get(x, () => unaryEntry(this, x, x.shape, null));
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('relu.forward', this, x.device) : 0;
    addon().relu({ x: x.raw, y: entry.y.raw });
    recorder?.end(token);
    this.#entry = entry;
    return entry.y;
  }

  override backward(gradOutput: Tensor): Tensor | null {
    return this.backwardOnce('ReLU', () => this.#backward(gradOutput));
  }

  #backward(gradOutput: Tensor): Tensor | null {
    const e = this.#entry;
    if (!e) return backwardBeforeForward('ReLU');
    expectTensor('ReLU gradOutput', gradOutput, { shape: e.y.shape, dtype: e.y.dtype, device: e.y.device });
    if (!this.requiresInputGrad) return null;
    e.dx = this.gradientBuffer(e.dx, e.y.shape, e.y.dtype, e.y.device);
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('relu.backward', this, e.y.device) : 0;
    addon().reluBackward({ y: e.y.raw, dy: gradOutput.raw, dx: e.dx.raw });
    recorder?.end(token);
    return e.dx;
  }

  protected override disposeCache(): void {
    this.#cache.clear();
    this.#entry = null;
  }
}

/** The names the profiler gives the pooling ops. */
const POOL_OPS = {
  max: { forward: 'max_pool2d.forward', backward: 'max_pool2d.backward' },
  avg: { forward: 'avg_pool2d.forward', backward: 'avg_pool2d.backward' },
} as const;

/** Shared forward/backward of the pooling layers. */
export abstract class Pool2d extends Module {
  readonly #cache = new ShapeCache<UnaryEntry<RawPool2dPlan>>();
  #entry: UnaryEntry<RawPool2dPlan> | null = null;
  #inputShape: readonly number[] = [];
  #kind: 'max' | 'avg' = 'max';

  protected abstract geometry(x: Tensor): {
    kind: 'max' | 'avg';
    kernel: [number, number];
    stride: [number, number];
    padding: [number, number];
  };

  override forward(x: Tensor): Tensor {
    const name = this.constructor.name;
    this.prepare(x, name);
    expectTensor(`${name} input`, x, { rank: 4, dtype: FLOAT_DTYPES });
    const g = this.geometry(x);
    const [n, h, w, c] = x.shape as [number, number, number, number];
    const size = (axis: 0 | 1, length: number): number =>
      addon().windowOutputSize({
        size: length,
        kernel: g.kernel[axis],
        stride: g.stride[axis],
        pad: g.padding[axis],
        dilation: 1,
      });
    const oh = size(0, h);
    const ow = size(1, w);
    if (oh <= 0 || ow <= 0) {
      mismatch(`${name} input`, 'a spatial size at least the kernel size', `shape [${x.shape.join(', ')}]`);
    }
    const entry = this.#cache.get(x, () => {
      const plan = new (addon().Pool2dPlan)({
        device: x.device,
        dtype: x.dtype,
        kind: g.kind,
        n,
        h,
        w,
        c,
        kernelH: g.kernel[0],
        kernelW: g.kernel[1],
        strideH: g.stride[0],
        strideW: g.stride[1],
        padH: g.padding[0],
        padW: g.padding[1],
      });
      return unaryEntry(this, x, [n, oh, ow, c], plan);
    });
    const recorder = opRecorder;
    const token = recorder ? recorder.begin(POOL_OPS[g.kind].forward, this, x.device) : 0;
    entry.plan.forward({ x: x.raw, y: entry.y.raw, ...(entry.workspace ? { workspace: entry.workspace.raw } : {}) });
    recorder?.end(token);
    this.#kind = g.kind;
    this.#entry = entry;
    this.#inputShape = x.shape;
    return entry.y;
  }

  override backward(gradOutput: Tensor): Tensor | null {
    return this.backwardOnce(this.constructor.name, () => this.#backward(gradOutput));
  }

  #backward(gradOutput: Tensor): Tensor | null {
    const e = this.#entry;
    const name = this.constructor.name;
    if (!e) return backwardBeforeForward(name);
    expectTensor(`${name} gradOutput`, gradOutput, { shape: e.y.shape, dtype: e.y.dtype, device: e.y.device });
    if (!this.requiresInputGrad) return null;
    e.dx = this.gradientBuffer(e.dx, this.#inputShape, e.y.dtype, e.y.device);
    const recorder = opRecorder;
    const token = recorder ? recorder.begin(POOL_OPS[this.#kind].backward, this, e.y.device) : 0;
    e.plan.backward({ dy: gradOutput.raw, dx: e.dx.raw, ...(e.workspace ? { workspace: e.workspace.raw } : {}) });
    recorder?.end(token);
    return e.dx;
  }

  protected override disposeCache(): void {
    this.#cache.clear();
    this.#entry = null;
  }
}

/** Options of {@link MaxPool2d}, as in `torch.nn.MaxPool2d` (floor mode). */
export interface MaxPool2dOptions {
  kernelSize: number | [number, number];
  /** Default: the kernel size. */
  stride?: number | [number, number];
  padding?: number | [number, number];
}

/** 2-D max pooling over NHWC input. */
export class MaxPool2d extends Pool2d {
  readonly kernelSize: [number, number];
  readonly stride: [number, number];
  readonly padding: [number, number];

  constructor(options: MaxPool2dOptions) {
    super();
    const o = expectOptions<MaxPool2dOptions>('MaxPool2d options', options, ['kernelSize', 'stride', 'padding']);
    this.kernelSize = expectPair('kernelSize', o.kernelSize, 1);
    this.stride = expectPair('stride', o.stride ?? this.kernelSize, 1);
    this.padding = expectPair('padding', o.padding ?? 0, 0);
    if (this.padding[0] * 2 > this.kernelSize[0] || this.padding[1] * 2 > this.kernelSize[1]) {
      mismatch('padding', 'at most half the kernel size (as PyTorch requires)', `[${this.padding.join(', ')}]`);
    }
  }

  protected geometry() {
    return { kind: 'max' as const, kernel: this.kernelSize, stride: this.stride, padding: this.padding };
  }
}

/** Average pooling to a 1x1 output (`torch.nn.AdaptiveAvgPool2d(1)`), `[N,H,W,C]` to `[N,1,1,C]`. */
export class AdaptiveAvgPool2d extends Pool2d {
  /** @param outputSize - only 1 (or [1, 1]) is supported, which is what ResNets use. */
  constructor(outputSize: number | [number, number] = 1) {
    super();
    const size = expectPair('outputSize', outputSize, 1);
    if (size[0] !== 1 || size[1] !== 1) {
      mismatch('outputSize', '1 (only global average pooling is supported)', `[${size.join(', ')}]`);
    }
  }

  protected geometry(x: Tensor) {
    const kernel: [number, number] = [x.shape[1]!, x.shape[2]!];
    return { kind: 'avg' as const, kernel, stride: kernel, padding: [0, 0] as [number, number] };
  }
}

/** Flattens `[N, ...]` to `[N, prod(...)]` without copying (NHWC order). */
export class Flatten extends Module {
  #inputShape: readonly number[] | null = null;

  override forward(x: Tensor): Tensor {
    this.prepare(x, 'Flatten');
    expectTensor('Flatten input', x);
    if (x.shape.length < 1) mismatch('Flatten input', 'a tensor of rank at least 1', 'a scalar');
    this.#inputShape = x.shape;
    return x.reshape([x.shape[0]!, x.numel / Math.max(x.shape[0]!, 1)]);
  }

  override backward(gradOutput: Tensor): Tensor | null {
    return this.backwardOnce('Flatten', () => {
      if (!this.#inputShape) return backwardBeforeForward('Flatten');
      if (!this.requiresInputGrad) return null;
      return gradOutput.reshape(this.#inputShape);
    });
  }
}

/** Options of {@link Linear}, as in `torch.nn.Linear`. */
export interface LinearOptions {
  inFeatures: number;
  outFeatures: number;
  /** Default true. */
  bias?: boolean;
  /** Seed of the initialisation. */
  seed?: number;
}

type LinearEntry = WeightedEntry<RawLinearPlan>;

/** `y = x W^T + b` over `[N, inFeatures]`, W `[out, in]`; initialised as PyTorch does. */
export class Linear extends QuantizableLayer {
  readonly inFeatures: number;
  readonly outFeatures: number;
  readonly weight: Parameter;
  readonly bias: Parameter | null;
  readonly #cache = new ShapeCache<LinearEntry>();
  #input: Tensor | null = null;
  #entry: LinearEntry | null = null;

  constructor(options: LinearOptions) {
    super();
    const o = expectOptions<LinearOptions>('Linear options', options, ['inFeatures', 'outFeatures', 'bias', 'seed']);
    this.inFeatures = expectSize('inFeatures', o.inFeatures, 1);
    this.outFeatures = expectSize('outFeatures', o.outFeatures, 1);
    expectWeightSize('outFeatures', [this.outFeatures, this.inFeatures], 'outFeatures x inFeatures');
    const rng = new Random(o.seed);
    const bound = 1 / Math.sqrt(this.inFeatures);
    this.weight = this.registerParameter(
      'weight',
      new Parameter(
        [this.outFeatures, this.inFeatures],
        uniform(this.outFeatures * this.inFeatures, bound, rng),
        'plain',
        'weight',
      ),
    );
    this.bias = expectBool('bias', o.bias ?? true)
      ? this.registerParameter(
          'bias',
          new Parameter([this.outFeatures], uniform(this.outFeatures, bound, rng), 'plain', 'bias'),
        )
      : null;
  }

  override forward(x: Tensor): Tensor {
    this.prepare(x, 'Linear');
    expectTensor('Linear input', x, { rank: 2, dtype: FLOAT_DTYPES });
    if (x.shape[1] !== this.inFeatures) {
      mismatch('Linear input', `a [N, ${this.inFeatures}] tensor`, `shape [${x.shape.join(', ')}]`);
    }
    const entry = this.#cache.get(x, () => {
      const n = x.shape[0]!;
      const plan = new (addon().LinearPlan)({
        device: x.device,
        dtype: x.dtype,
        n,
        in: this.inFeatures,
        out: this.outFeatures,
        bias: this.bias !== null,
      });
      return weightedEntry(this, plan, x, [n, this.outFeatures]);
    });
    this.#entry = entry;
    this.#input = weightedForward(this, LINEAR_OPS, entry, x);
    return entry.y;
  }

  override backward(gradOutput: Tensor): Tensor | null {
    return this.backwardOnce(this.constructor.name, () =>
      weightedBackward(this, LINEAR_OPS, this.#entry, this.#input, gradOutput),
    );
  }

  protected override disposeCache(): void {
    this.#cache.clear();
    this.#entry = null;
    this.#input = null;
  }
}
