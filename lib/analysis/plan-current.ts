/**
 * The plan the CUDA backend executes today for one training step, kernel by kernel, as the sources
 * are written: `InputNormalize` (convert_input_kernel), the layers' forward and backward
 * (lib/nn/layers.ts, lib/nn/containers.ts over native/cuda/conv.cc, linear.cc, batchnorm.cu,
 * elementwise.cu, pool.cu), the cross-entropy (loss.cu), then `SGD.step` (sgd.cu) and
 * `zeroGrad` (a memset of the gradient arena), with, under a GradScaler (the Trainer's default in
 * fp16), its unscale-and-check and scale update (optim.cu, lib/optim/grad-scaler.ts).
 * Activations are bf16 or fp16; parameters, their gradients and the optimizer state are f32.
 * @packageDocumentation
 */
import { ResnetError } from '../errors.js';
import { F32, op, type StepOp } from './step-ops.js';
import {
  blockBackwardParts,
  shapeNumel,
  type BlockLayer,
  type BnLayer,
  type ConvLayer,
  type LinearLayer,
  type PoolLayer,
  type ReluLayer,
  type StepLayer,
  type StepLayers,
} from './step-layers.js';

/** What both plans are built for. */
export interface PlanOptions {
  /** Bytes of an activation element (2: bf16 or fp16). */
  activationBytes: number;
  /** Whether a GradScaler unscales and checks the gradients (fp16 in the Trainer). */
  gradScaler: boolean;
}

/**
 * device_utils.cuh: the row partition of the two-stage per-channel reductions (kReduceBlocks 2048,
 * kReduceMinRows 32), which sizes the partials batchnorm and the bias gradient write and read.
 */
export function reductionRowBlocks(rows: number, channels: number): number {
  const maxBlocks = Math.max(1, Math.floor(2048 / Math.ceil(channels / 256)));
  const blocks = Math.max(1, Math.min(Math.ceil(rows / 32), maxBlocks));
  const rowsPerBlock = Math.max(1, Math.ceil(rows / blocks));
  return Math.ceil(rows / rowsPerBlock);
}

/** The ops of the current plan for one training step of `step`. */
export function currentPlan(step: StepLayers, o: PlanOptions): StepOp[] {
  const s = o.activationBytes;
  const ops: StepOp[] = [];
  ops.push(inputOp(step, s));
  forward(step.layers, s, ops);
  ops.push(...lossOps(step, s));
  backward(step.layers, s, ops);
  optimizerOps(step, o, ops);
  return ops;
}

function forward(layers: readonly StepLayer[], s: number, ops: StepOp[]): void {
  for (const l of layers) {
    switch (l.kind) {
      case 'block':
        // Residual.forward runs the shortcut first, then the main branch.
        forward(l.shortcut ?? [], s, ops);
        forward(l.main, s, ops);
        break;
      case 'conv':
        convForward(l, s, ops);
        break;
      case 'bn':
        bnForward(l, s, ops);
        break;
      case 'relu':
        ops.push(reluForward(l, s));
        break;
      case 'maxpool':
      case 'avgpool':
        poolForward(l, s, ops);
        break;
      case 'linear':
        linearForward(l, s, ops);
        break;
    }
  }
}

function backward(layers: readonly StepLayer[], s: number, ops: StepOp[]): void {
  for (let i = layers.length - 1; i >= 0; i--) {
    const l = layers[i]!;
    switch (l.kind) {
      case 'block':
        blockBackward(l, s, ops);
        break;
      case 'conv':
        convBackward(l, s, ops);
        break;
      case 'bn':
        bnBackward(l, s, ops);
        break;
      case 'relu':
        if (l.inputGrad) ops.push(reluBackward(l, s));
        break;
      case 'maxpool':
      case 'avgpool':
        poolBackward(l, s, ops);
        break;
      case 'linear':
        linearBackward(l, s, ops);
        break;
    }
  }
}

/** elementwise.cu relu_fwd_kernel over a stand-alone ReLU module's input. */
export function reluForward(l: ReluLayer, s: number): StepOp {
  const e = shapeNumel(l.shape);
  return op('relu', l.name, 'relu_fwd_kernel', e, s * e, s * e);
}

/** elementwise.cu relu_bwd_kernel: the output (for the mask) and dy read, dx written. */
export function reluBackward(l: ReluLayer, s: number): StepOp {
  const e = shapeNumel(l.shape);
  return op('relu', l.name, 'relu_bwd_kernel', e, 2 * s * e, s * e);
}

// Residual.backward (blockBackwardParts): main branch (its last BN also writes dResidual),
// shortcut, then the add of the two input gradients (elementwise.cu add_kernel) when the block
// passes a gradient on, unless the main branch's first convolution adds them in its backward data.
function blockBackward(b: BlockLayer, s: number, ops: StepOp[]): void {
  for (const part of blockBackwardParts(b)) backward(part, s, ops);
  if (b.inputGrad && !b.sumInFirstConv) ops.push(residualGradAdd(b, s));
}

/** elementwise.cu add_kernel: a block's main-branch and shortcut input gradients added. */
export function residualGradAdd(b: BlockLayer, s: number): StepOp {
  const e = shapeNumel(b.input);
  return op('add', b.name, 'add_kernel', e, 2 * s * e, s * e);
}

/**
 * conv.cc computeWeight: a low-precision plan casts the f32 master weight into its own buffer
 * before every forward and every backward data (elementwise.cu cast_kernel).
 */
export function weightCast(layer: string, weight: number, s: number): StepOp {
  return op('weight cast', layer, 'cast_kernel', 0, F32 * weight, s * weight);
}

/** A convolution's forward: the weight cast (low precision), cuDNN's forward, the bias added in place. */
export function convForward(l: ConvLayer, s: number, ops: StepOp[]): void {
  const x = shapeNumel(l.input);
  const y = shapeNumel(l.output);
  if (s < F32) ops.push(weightCast(l.name, l.weight, s));
  ops.push(op('conv fwd', l.name, 'cudnnConvolutionForward', 2 * l.macs, s * (x + l.weight), s * y));
  // elementwise.cu add_bias_kernel, in place.
  if (l.bias) ops.push(op('bias', l.name, 'add_bias_kernel', y, s * y + F32 * l.channels, s * y));
}

/** A convolution's backward: backward filter and its f32 accumulation (and the bias gradient), then the weight cast and backward data. */
export function convBackward(l: ConvLayer, s: number, ops: StepOp[]): void {
  const x = shapeNumel(l.input);
  const y = shapeNumel(l.output);
  if (l.weightGrad) {
    // conv.cc backwardWeights: a low-precision filter gradient (beta 0) into the plan's buffer,
    // then accumulate_f32_kernel adds it to the f32 master gradient.
    ops.push(op('conv wgrad', l.name, 'cudnnConvolutionBackwardFilter', 2 * l.macs, s * (x + y), s * l.weight));
    ops.push(op('grad accumulate', l.name, 'accumulate_f32_kernel', l.weight, (s + F32) * l.weight, F32 * l.weight));
    if (l.bias) ops.push(...biasGrad(l.name, y / l.channels, l.channels, s));
  }
  if (l.inputGrad) {
    // Adding into dx (beta 1) reads it too.
    const reads = s * (y + l.weight + (l.addsInputGrad ? x : 0));
    ops.push(weightCast(l.name, l.weight, s));
    ops.push(op('conv dgrad', l.name, 'cudnnConvolutionBackwardData', 2 * l.macs, reads, s * x));
  }
}

/**
 * elementwise.cu accumulateBiasGrad: bias_grad_partial_kernel (per row block) and
 * bias_grad_finalize_kernel (adds the blocks into the f32 gradient).
 */
export function biasGrad(layer: string, rows: number, channels: number, s: number): StepOp[] {
  const partial = F32 * channels * reductionRowBlocks(rows, channels);
  return [
    op('bias', layer, 'bias_grad_partial_kernel', rows * channels, s * rows * channels, partial),
    op('bias', layer, 'bias_grad_finalize_kernel', partial / F32, partial + F32 * channels, F32 * channels),
  ];
}

/**
 * batchnorm.cu batchNormForwardTraining: batchnorm_stats_kernel (Welford over row blocks: x read
 * once, partial means and M2 written), batchnorm_stats_finalize_kernel (one warp per channel:
 * merges the partials, writes saveMean/saveInvStd, updates the running statistics),
 * batchnorm_fwd_kernel (x read again, the residual read, y written).
 */
export function bnForward(l: BnLayer, s: number, ops: StepOp[]): void {
  const c = l.shape[3]!;
  const e = shapeNumel(l.shape);
  const rows = e / c;
  const partial = 2 * F32 * c * reductionRowBlocks(rows, c);
  const residual = l.residual ? 1 : 0;
  const relu = l.relu ? 1 : 0;
  ops.push(op('bn fwd', l.name, 'batchnorm_stats_kernel', 6 * e, s * e, partial));
  ops.push(
    op('bn fwd', l.name, 'batchnorm_stats_finalize_kernel', (4 * partial) / F32, partial + 2 * F32 * c, 4 * F32 * c),
  );
  ops.push(
    op(
      'bn fwd',
      l.name,
      'batchnorm_fwd_kernel',
      (2 + residual + relu) * e,
      s * e * (1 + residual) + 4 * F32 * c,
      s * e,
    ),
  );
}

/**
 * batchnorm.cu batchNormBackward: batchnorm_bwd_stats_kernel (x, dy and, with the fused ReLU, y
 * for its mask), batchnorm_bwd_finalize_kernel (dGamma/dBeta accumulated, per-channel
 * coefficients), batchnorm_bwd_kernel (x, dy, y again; dx and, for a block's last BN, dResidual).
 * Always run (dx too), as BatchNorm2d.backward does.
 */
export function bnBackward(l: BnLayer, s: number, ops: StepOp[]): void {
  const c = l.shape[3]!;
  const e = shapeNumel(l.shape);
  const rows = e / c;
  const partial = 2 * F32 * c * reductionRowBlocks(rows, c);
  const reads = 2 + (l.relu ? 1 : 0);
  ops.push(op('bn bwd', l.name, 'batchnorm_bwd_stats_kernel', 5 * e, s * e * reads + 2 * F32 * c, partial));
  ops.push(op('bn bwd', l.name, 'batchnorm_bwd_finalize_kernel', partial / F32, partial + 3 * F32 * c, 4 * F32 * c));
  ops.push(
    op('bn bwd', l.name, 'batchnorm_bwd_kernel', 6 * e, s * e * reads + 5 * F32 * c, s * e * (l.residual ? 2 : 1)),
  );
}

/**
 * pool.cu: max pooling writes an int32 argmax per output (the plan's workspace) and its backward
 * gathers through it; average pooling reads and writes the tensors only.
 */
export function poolForward(l: PoolLayer, s: number, ops: StepOp[]): void {
  const x = shapeNumel(l.input);
  const y = shapeNumel(l.output);
  const window = l.kernel[0] * l.kernel[1];
  if (l.kind === 'maxpool') ops.push(op('pool', l.name, 'maxpool_fwd_kernel', y * window, s * x, (s + 4) * y));
  else ops.push(op('pool', l.name, 'avgpool_fwd_kernel', y * window, s * x, s * y));
}

/** Pooling's backward, when its input gradient is needed. */
export function poolBackward(l: PoolLayer, s: number, ops: StepOp[]): void {
  if (!l.inputGrad) return;
  const x = shapeNumel(l.input);
  const y = shapeNumel(l.output);
  if (l.kind === 'maxpool') ops.push(op('pool', l.name, 'maxpool_bwd_kernel', x, (s + 4) * y, s * x));
  else ops.push(op('pool', l.name, 'avgpool_bwd_kernel', x, s * y, s * x));
}

/**
 * linear.cc: the weight cast before the forward and the backward data GEMMs; the bias added by
 * add_bias_kernel; the weight gradient written straight into the f32 gradient with beta 1 (read
 * and written), the bias gradient by accumulateBiasGrad.
 */
export function linearForward(l: LinearLayer, s: number, ops: StepOp[]): void {
  const x = shapeNumel(l.input);
  const y = shapeNumel(l.output);
  if (s < F32) ops.push(weightCast(l.name, l.weight, s));
  ops.push(op('gemm', l.name, 'cublasGemmEx (forward)', 2 * l.macs, s * (x + l.weight), s * y));
  if (l.bias) ops.push(op('bias', l.name, 'add_bias_kernel', y, s * y + F32 * l.output[1]!, s * y));
}

/** The linear layer's backward: the weight gradient GEMM (and the bias gradient), then the weight cast and the input gradient GEMM. */
export function linearBackward(l: LinearLayer, s: number, ops: StepOp[]): void {
  const x = shapeNumel(l.input);
  const y = shapeNumel(l.output);
  if (l.weightGrad || l.biasGrad) {
    ops.push(
      op('gemm', l.name, 'cublasGemmEx (weight gradient)', 2 * l.macs, s * (x + y) + F32 * l.weight, F32 * l.weight),
    );
    if (l.biasGrad) ops.push(...biasGrad(l.name, l.output[0]!, l.output[1]!, s));
  }
  if (l.inputGrad) {
    ops.push(weightCast(l.name, l.weight, s));
    ops.push(op('gemm', l.name, 'cublasGemmEx (input gradient)', 2 * l.macs, s * (y + l.weight), s * x));
  }
}

/**
 * elementwise.cu convert_input_kernel: u8 in, `x * scale + shift` out; the mean/std table is
 * uploaded once (CudaContext::upload resends only a changed table). Both plans start with it.
 */
export function inputOp(step: StepLayers, s: number): StepOp {
  const image = shapeNumel(step.input);
  return op('input', 'input', 'convert_input_kernel', 2 * image, image, s * image);
}

/**
 * loss.cu crossEntropy: cross_entropy_kernel (one block per row: logits read, dLogits written, one
 * partial loss per block, at most 1024 blocks) and cross_entropy_mean_kernel. Both plans run it.
 */
export function lossOps(step: StepLayers, s: number): StepOp[] {
  if (step.output.length !== 2) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `roofline: the model's output must be [N, classes] logits for the cross-entropy, but it is [${step.output.join(', ')}]`,
    );
  }
  const [n, k] = step.output as [number, number];
  const blocks = Math.min(n, 1024);
  return [
    op('loss', 'loss', 'cross_entropy_kernel', 6 * n * k, s * n * k + 4 * n, s * n * k + F32 * blocks),
    op('loss', 'loss', 'cross_entropy_mean_kernel', blocks, F32 * blocks, F32),
  ];
}

/**
 * sgd.cu sgd_step_kernel (momentum, Nesterov, weight decay: param, grad and momentum read, param and
 * momentum written; the gradient scale folded in); Optimizer.zeroGrad: one cudaMemsetAsync of the
 * whole gradient arena. Under a GradScaler: the found-inf flag cleared (a memset), unscale_kernel
 * (gradients read and written), scaler_update_kernel, and the flags read back (one copy).
 */
export function optimizerOps(step: StepLayers, o: PlanOptions, ops: StepOp[]): void {
  const p = step.trainableParams;
  if (o.gradScaler) {
    ops.push(op('scaler', 'step', 'cudaMemsetAsync (found inf)', 0, 0, F32));
    ops.push(op('scaler', 'step', 'unscale_kernel', p, F32 * p, F32 * p));
  }
  ops.push(op('optimizer', 'step', 'sgd_step_kernel', 8 * p, 3 * F32 * p, 2 * F32 * p));
  if (o.gradScaler) {
    ops.push(op('scaler', 'step', 'scaler_update_kernel', 4, 3 * F32, 2 * F32));
    ops.push(op('scaler', 'step', 'cudaMemcpyAsync (scale, found inf to host)', 0, 2 * F32, 0));
  }
  ops.push(op('zero grad', 'step', 'cudaMemsetAsync (gradient arena)', 0, 0, F32 * step.params));
}
