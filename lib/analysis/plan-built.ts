/**
 * The plan as built: what the CUDA backend executes for one training step with a set of fused
 * paths switched on (lib/fused-paths.ts), counted from the sources as the current plan is
 * (lib/analysis/plan-current.ts), whose ops it keeps wherever no fused path applies. Each path
 * replaces exactly the ops it replaces:
 *
 * - `optim` (GradScaler.stepAndZeroGrad, the Trainer's end of a step; fused_optim.cu): the
 *   unscale, SGD update, scale update and gradient zeroing become fused_sgd_kernel, which reads
 *   the gradients once and writes their zeros; under a GradScaler a read-only check pass
 *   (fused_first_pass_kernel) comes first, the found-inf flag is still cleared and the flags are
 *   still read back.
 * - `bn-add-relu` (Residual, BatchNorm2d.forwardDual; batchnorm.cu's dual kernels): a downsample
 *   block's two batch norms, the residual add and the ReLU in one statistics launch over both raw
 *   outputs, one finalize launch and one pass that reads both raw outputs and writes the block's
 *   output; backward, one reduction over both inputs and one pass writing both input gradients
 *   (no dResidual). The shortcut's batch norm runs nothing of its own.
 * - `conv-bn` (Conv2d, BatchNorm2d; fused_conv.cc, fused_conv_finalize.cu): a convolution that
 *   qualifies (bf16/f16, no bias, channel counts multiples of 8) writes its output's channel sums
 *   in its epilogue and still casts its f32 master weight to a low-precision copy on every call;
 *   the batch norm reading that output runs conv_bn_finalize_kernel and the normalisation
 *   (batchnorm_fwd_kernel over the batch statistics) instead of its statistics kernels. The
 *   rest of the design, whose parts {@link ConvBnBuilt} switches, is modelled as specified: the
 *   BN + ReLU between two such convolutions applied in the second one's prologue (the activation
 *   is never written), and its backward.
 * @packageDocumentation
 */
import { FUSED_PATH_NAMES, type FusedPath } from '../fused-paths.js';
import {
  bnBackward,
  bnForward,
  convBackward,
  convForward,
  inputOp,
  linearBackward,
  linearForward,
  lossOps,
  optimizerOps,
  poolBackward,
  poolForward,
  reductionRowBlocks,
  reluBackward,
  reluForward,
  residualGradAdd,
  weightCast,
  type PlanOptions,
} from './plan-current.js';
import { F32, op, type StepOp } from './step-ops.js';
import {
  blockBackwardParts,
  shapeNumel,
  type BlockLayer,
  type BnLayer,
  type ConvLayer,
  type StepLayer,
  type StepLayers,
} from './step-layers.js';

/**
 * Which parts of the `conv-bn` design the built plan counts (the path grows in parts; set these to
 * what the modules take). {@link CONV_BN_BUILT} is the whole design.
 */
export interface ConvBnBuilt {
  /**
   * In training, a batch norm with ReLU between two qualifying convolutions of one container (a
   * bottleneck's bn1 and bn2, a basic block's bn1) only finalizes its statistics; the next
   * convolution applies scale, shift and ReLU in its prologue (convBnForward with scale and
   * shift), so the activation is never written. Off: every batch norm normalises in its own pass.
   */
  prologue: boolean;
  /**
   * The backward of such a pair: convDgradDbn (backward data, ReLU mask and the batch norm's
   * backward sums in one graph: dy, w and the raw x read, dz written) and batchNormBackwardApply
   * (dz and the raw x read, dx written), as fused_dgrad.cc and fused_dgrad.cu run them. Off: the
   * activation recomputed (BatchNorm2d.recomputePrologueActivation), then the ordinary
   * backward data and batch-norm backward over it.
   */
  dgradDbn: boolean;
  /**
   * The weight gradient through the same prologue (convWgradSbr: the raw x and dy read, the f32
   * gradient accumulated), used with {@link ConvBnBuilt.dgradDbn}. Off: a pass recomputes the
   * activation (raw x read, activation written) for the ordinary backward filter.
   */
  wgradPrologue: boolean;
  /**
   * What a downsample block's convolutions' channel sums become when `bn-add-relu` is on too:
   * `consumed` (the dual pass finalizes both from them and skips its statistics launch),
   * `unused` (written, then the dual pass computes the statistics again, as when the two paths
   * do not know each other), or `not-written` (the two convolutions skip the epilogue).
   */
  shortcutSums: 'consumed' | 'unused' | 'not-written';
}

/** The whole `conv-bn` design as the modules take it: prologue, fused backward data and weight gradient (convWgradSbr), the dual pass consuming the sums. */
export const CONV_BN_BUILT: Readonly<ConvBnBuilt> = Object.freeze({
  prologue: true,
  dgradDbn: true,
  wgradPrologue: true,
  shortcutSums: 'consumed',
});

/** What the built plan is counted for. */
export interface BuiltPlanOptions extends PlanOptions {
  /** The fused paths switched on. */
  fused: ReadonlySet<FusedPath>;
  /** The parts of `conv-bn` built (read only when `conv-bn` is on). */
  convBn: Readonly<ConvBnBuilt>;
}

/** The fused paths of `fused` in {@link FUSED_PATH_NAMES} order. */
export function orderedPaths(fused: ReadonlySet<FusedPath>): FusedPath[] {
  return FUSED_PATH_NAMES.filter((p) => fused.has(p));
}

/** The ops of the built plan for one training step of `step`. */
export function builtPlan(step: StepLayers, o: BuiltPlanOptions): StepOp[] {
  return new BuiltPlanner(step, o).plan();
}

/** How a batch norm's training forward (and so its backward) runs. */
type BnRoute =
  /** Its own statistics kernels (the current plan). */
  | { kind: 'stats' }
  /** conv_bn_finalize_kernel from the producing convolution's sums, then the normalisation. */
  | { kind: 'sums' }
  /** Finalize only; the next convolution (`to`) applies it in its prologue. */
  | { kind: 'prologue'; to: ConvLayer }
  /** The main branch's last batch norm of a dual pass with the shortcut's `other`. */
  | { kind: 'dual'; other: BnLayer; fromSums: boolean }
  /** The shortcut's batch norm of a dual pass: nothing of its own. */
  | { kind: 'dual-shortcut' };

class BuiltPlanner {
  readonly #step: StepLayers;
  readonly #o: BuiltPlanOptions;
  readonly #s: number;
  readonly #ops: StepOp[] = [];
  /** Convolutions that write their output's channel sums. */
  readonly #sums = new Set<ConvLayer>();
  /** Convolutions that read their input through a batch norm's prologue, with that batch norm. */
  readonly #prologueOf = new Map<ConvLayer, BnLayer>();
  readonly #bn = new Map<BnLayer, BnRoute>();

  constructor(step: StepLayers, o: BuiltPlanOptions) {
    this.#step = step;
    this.#o = o;
    this.#s = o.activationBytes;
    this.#route(step.layers);
  }

  plan(): StepOp[] {
    const s = this.#s;
    this.#ops.push(inputOp(this.#step, s));
    this.#forward(this.#step.layers);
    this.#ops.push(...lossOps(this.#step, s));
    this.#backward(this.#step.layers);
    if (this.#o.fused.has('optim')) this.#fusedOptimizer();
    else optimizerOps(this.#step, this.#o, this.#ops);
    return this.#ops;
  }

  // ---- which path each layer takes -------------------------------------------------------------

  /** Conv2d's #takesConvBn in training: 16-bit activations, no bias, channels multiples of 8. */
  #takesConvBn(l: ConvLayer): boolean {
    return this.#o.fused.has('conv-bn') && this.#s < F32 && !l.bias && l.input[3]! % 8 === 0 && l.channels % 8 === 0;
  }

  /** Routes the convolutions and batch norms of one container's layers (and of the blocks in it). */
  #route(layers: readonly StepLayer[]): void {
    const cb = this.#o.convBn;
    layers.forEach((l, i) => {
      if (l.kind === 'block') {
        this.#route(l.main);
        this.#route(l.shortcut ?? []);
        this.#routeDual(l);
        return;
      }
      if (l.kind === 'conv' && this.#takesConvBn(l)) this.#sums.add(l);
      if (l.kind !== 'bn') return;
      const producer = layers[i - 1];
      if (producer?.kind !== 'conv' || !this.#takesConvBn(producer)) {
        this.#bn.set(l, { kind: 'stats' });
        return;
      }
      const next = layers[i + 1];
      if (cb.prologue && l.relu && !l.residual && next?.kind === 'conv' && next.inputGrad && this.#takesConvBn(next)) {
        this.#bn.set(l, { kind: 'prologue', to: next });
        this.#prologueOf.set(next, l);
      } else {
        this.#bn.set(l, { kind: 'sums' });
      }
    });
  }

  /** Containers.ts' #dualShortcutNorm: a shortcut ending in a batch norm without ReLU. */
  #routeDual(b: BlockLayer): void {
    if (!this.#o.fused.has('bn-add-relu') || !b.shortcut) return;
    const other = b.shortcut[b.shortcut.length - 1];
    const main = b.main[b.main.length - 1];
    if (other?.kind !== 'bn' || other.relu || main?.kind !== 'bn') return;
    const producers = [b.main[b.main.length - 2], b.shortcut[b.shortcut.length - 2]].filter(
      (p): p is ConvLayer => p?.kind === 'conv' && this.#sums.has(p),
    );
    const mode = this.#o.convBn.shortcutSums;
    if (mode === 'not-written') producers.forEach((p) => this.#sums.delete(p));
    const fromSums = mode === 'consumed' && producers.length === 2;
    this.#bn.set(main, { kind: 'dual', other, fromSums });
    this.#bn.set(other, { kind: 'dual-shortcut' });
  }

  // ---- forward ----------------------------------------------------------------------------------

  #forward(layers: readonly StepLayer[]): void {
    const s = this.#s;
    for (const l of layers) {
      switch (l.kind) {
        case 'block':
          this.#forward(l.shortcut ?? []);
          this.#forward(l.main);
          break;
        case 'conv':
          if (this.#sums.has(l) || this.#prologueOf.has(l)) this.#convBnForward(l);
          else convForward(l, s, this.#ops);
          break;
        case 'bn':
          this.#bnForward(l);
          break;
        case 'relu':
          this.#ops.push(reluForward(l, s));
          break;
        case 'maxpool':
        case 'avgpool':
          poolForward(l, s, this.#ops);
          break;
        case 'linear':
          linearForward(l, s, this.#ops);
          break;
      }
    }
  }

  /**
   * fused_conv.cc ConvBnGraph::run: the f32 master weight cast to the graph's low-precision copy
   * (every call), then one cuDNN graph: the raw input through scale-bias-ReLU when a batch norm's
   * prologue feeds it, the convolution, the channel sum and sum of squares (f32[K] each).
   */
  #convBnForward(l: ConvLayer): void {
    const s = this.#s;
    const x = shapeNumel(l.input);
    const y = shapeNumel(l.output);
    const prologue = this.#prologueOf.has(l);
    const sums = this.#sums.has(l);
    const parts = [prologue ? 'scale-bias-relu' : '', 'conv', sums ? 'genstats' : ''].filter(Boolean).join(' + ');
    this.#ops.push(weightCast(l.name, l.weight, s));
    this.#ops.push(
      op(
        'conv fwd',
        l.name,
        `convBnForward (${parts})`,
        2 * l.macs + (prologue ? 3 * x : 0) + (sums ? 3 * y : 0),
        s * (x + l.weight) + (prologue ? 2 * F32 * l.input[3]! : 0),
        s * y + (sums ? 2 * F32 * l.channels : 0),
      ),
    );
  }

  #bnForward(l: BnLayer): void {
    const route = this.#bn.get(l) ?? { kind: 'stats' };
    switch (route.kind) {
      case 'stats':
        bnForward(l, this.#s, this.#ops);
        break;
      case 'sums':
        this.#ops.push(finalize(l));
        this.#ops.push(normalise(l, this.#s));
        break;
      case 'prologue':
        this.#ops.push(finalize(l));
        break;
      case 'dual':
        this.#dualForward(l, route.other, route.fromSums);
        break;
      case 'dual-shortcut':
        break;
    }
  }

  /**
   * batchnorm.cu dualBatchNormForward: the statistics of both raw outputs in one launch
   * (gridDim.z 2) and one finalize launch, then batchnorm_fwd_kernel<kDual> reads both and writes
   * relu(bn(a) + bn(b)). From the convolutions' sums: a finalize per batch norm, then the same
   * pass over the finalized batch statistics.
   */
  #dualForward(main: BnLayer, other: BnLayer, fromSums: boolean): void {
    const s = this.#s;
    const c = main.shape[3]!;
    const e = shapeNumel(main.shape);
    const relu = main.relu ? 1 : 0;
    if (fromSums) {
      this.#ops.push(finalize(main), finalize(other));
    } else {
      const partial = 2 * F32 * c * reductionRowBlocks(e / c, c);
      this.#ops.push(op('bn fwd', main.name, 'batchnorm_stats_kernel (dual)', 12 * e, 2 * s * e, 2 * partial));
      this.#ops.push(
        op(
          'bn fwd',
          main.name,
          'batchnorm_stats_finalize_kernel (dual)',
          (8 * partial) / F32,
          2 * partial + 4 * F32 * c,
          8 * F32 * c,
        ),
      );
    }
    this.#ops.push(
      op('bn fwd', main.name, 'batchnorm_fwd_kernel (dual)', (5 + relu) * e, 2 * s * e + 8 * F32 * c, s * e),
    );
  }

  // ---- backward ---------------------------------------------------------------------------------

  #backward(layers: readonly StepLayer[]): void {
    const s = this.#s;
    for (let i = layers.length - 1; i >= 0; i--) {
      const l = layers[i]!;
      switch (l.kind) {
        case 'block':
          for (const part of blockBackwardParts(l)) this.#backward(part);
          if (l.inputGrad && !l.sumInFirstConv) this.#ops.push(residualGradAdd(l, s));
          break;
        case 'conv': {
          const bn = this.#prologueOf.get(l);
          if (bn) this.#prologueConvBackward(l, bn);
          else convBackward(l, s, this.#ops);
          break;
        }
        case 'bn':
          this.#bnBackward(l);
          break;
        case 'relu':
          if (l.inputGrad) this.#ops.push(reluBackward(l, s));
          break;
        case 'maxpool':
        case 'avgpool':
          poolBackward(l, s, this.#ops);
          break;
        case 'linear':
          linearBackward(l, s, this.#ops);
          break;
      }
    }
  }

  /**
   * The backward of a convolution fed by batch norm `bn`'s prologue. The activation is recomputed
   * (relu(bn(x)) from the raw x and the batch statistics, written) when the ordinary backward
   * filter or the ordinary batch-norm backward needs it; convDgradDbn casts the f32 weight as
   * convBnForward does and reads the raw x for the ReLU mask and x-hat.
   */
  #prologueConvBackward(l: ConvLayer, bn: BnLayer): void {
    const s = this.#s;
    const cb = this.#o.convBn;
    const x = shapeNumel(l.input);
    const y = shapeNumel(l.output);
    const c = l.input[3]!;
    const sbrWgrad = cb.dgradDbn && cb.wgradPrologue;
    const recompute = !cb.dgradDbn || (l.weightGrad && !sbrWgrad);
    if (recompute) {
      this.#ops.push(op('bn fwd', bn.name, 'batchnorm_fwd_kernel (recompute)', 3 * x, s * x + 4 * F32 * c, s * x));
    }
    if (!cb.dgradDbn) {
      convBackward(l, s, this.#ops);
      return;
    }
    if (l.weightGrad) {
      if (sbrWgrad) {
        // fused_conv_wgrad.cc: one graph (the raw x with scale and shift, and dy read; dw written in
        // the activations' dtype), then accumulate_f32_kernel adds dw to the f32 master gradient.
        this.#ops.push(
          op('conv wgrad', l.name, 'convWgradSbr', 2 * l.macs + 3 * x, s * (x + y) + 2 * F32 * c, s * l.weight),
        );
        this.#ops.push(
          op('grad accumulate', l.name, 'accumulate_f32_kernel', l.weight, (s + F32) * l.weight, F32 * l.weight),
        );
      } else {
        convBackward({ ...l, inputGrad: false }, s, this.#ops);
      }
    }
    // fused_dgrad.cc DgradDbnGraph::run: the weight cast, one graph (dy, the weight and the raw x
    // read with scale, shift, mean, inv std and gamma; dz, dScale, dBias and dx's three per-channel
    // coefficients written), then accumulate_bn_grads_kernel adds dScale and dBias to dGamma and dBeta.
    this.#ops.push(weightCast(l.name, l.weight, s));
    this.#ops.push(
      op(
        'conv dgrad',
        l.name,
        'convDgradDbn',
        2 * l.macs + 8 * x,
        s * (y + l.weight + x) + 5 * F32 * c,
        s * x + 5 * F32 * c,
      ),
    );
    this.#ops.push(op('bn bwd', bn.name, 'accumulate_bn_grads_kernel', 2 * c, 4 * F32 * c, 2 * F32 * c));
  }

  #bnBackward(l: BnLayer): void {
    const s = this.#s;
    const route = this.#bn.get(l) ?? { kind: 'stats' };
    if (route.kind === 'dual-shortcut') return;
    if (route.kind === 'dual') {
      this.#dualBackward(l);
      return;
    }
    if (route.kind === 'prologue' && this.#o.convBn.dgradDbn) {
      // fused_dgrad.cu bn_backward_apply_kernel: dx = eqDz * dz + eqX * x + eqBias per channel.
      const e = shapeNumel(l.shape);
      const c = l.shape[3]!;
      this.#ops.push(op('bn bwd', l.name, 'batchNormBackwardApply', 4 * e, 2 * s * e + 3 * F32 * c, s * e));
      return;
    }
    bnBackward(l, s, this.#ops);
  }

  /**
   * batchnorm.cu dualBatchNormBackward: batchnorm_bwd_stats_kernel<kDual> (both raw inputs, dy
   * and the output for the ReLU mask; three sums), the finalize of both batch norms' gradients,
   * batchnorm_bwd_kernel<kDual> (the same tensors again; both input gradients written).
   */
  #dualBackward(l: BnLayer): void {
    const s = this.#s;
    const c = l.shape[3]!;
    const e = shapeNumel(l.shape);
    const partial = 3 * F32 * c * reductionRowBlocks(e / c, c);
    const reads = 3 + (l.relu ? 1 : 0);
    this.#ops.push(
      op('bn bwd', l.name, 'batchnorm_bwd_stats_kernel (dual)', 8 * e, s * e * reads + 4 * F32 * c, partial),
    );
    this.#ops.push(
      op('bn bwd', l.name, 'batchnorm_bwd_finalize_kernel (dual)', partial / F32, partial + 6 * F32 * c, 7 * F32 * c),
    );
    this.#ops.push(op('bn bwd', l.name, 'batchnorm_bwd_kernel (dual)', 12 * e, s * e * reads + 9 * F32 * c, 2 * s * e));
  }

  // ---- optimizer --------------------------------------------------------------------------------

  /**
   * GradScaler.stepAndZeroGrad with `optim` on (fused_optim.cu fusedSgdStep): under a GradScaler
   * the flag cleared, fused_first_pass_kernel (gradients read), fused_sgd_kernel (parameters,
   * gradients, momentum read; parameters, momentum and the gradients' zeros written; the scale
   * update by one thread), the flags read back. The zeroing covers the trained segments: the rest
   * of the arena is zeroed by Optimizer.zeroGrad's memset as before.
   */
  #fusedOptimizer(): void {
    const p = this.#step.trainableParams;
    const scaler = this.#o.gradScaler;
    if (scaler) {
      this.#ops.push(op('scaler', 'step', 'cudaMemsetAsync (found inf)', 0, 0, F32));
      this.#ops.push(op('scaler', 'step', 'fused_first_pass_kernel (check)', p, F32 * p, 0));
    }
    this.#ops.push(
      op(
        'optimizer',
        'step',
        scaler ? 'fused_sgd_kernel (unscale + SGD + scale update + zero)' : 'fused_sgd_kernel (SGD + zero)',
        8 * p + (scaler ? 4 : 0),
        3 * F32 * p + (scaler ? 3 * F32 : 0),
        3 * F32 * p + (scaler ? 2 * F32 : 0),
      ),
    );
    if (scaler) this.#ops.push(op('scaler', 'step', 'cudaMemcpyAsync (scale, found inf to host)', 0, 2 * F32, 0));
    if (this.#step.params !== p) {
      this.#ops.push(op('zero grad', 'step', 'cudaMemsetAsync (gradient arena)', 0, 0, F32 * this.#step.params));
    }
  }
}

/**
 * fused_conv_finalize.cu conv_bn_finalize_kernel, one thread per channel: sum, sum of squares,
 * gamma, beta and the running statistics read; saveMean, saveInvStd, the batch variance, scale,
 * shift and the running statistics written.
 */
function finalize(l: BnLayer): StepOp {
  const c = l.shape[3]!;
  return op('bn fwd', l.name, 'conv_bn_finalize_kernel', 10 * c, 6 * F32 * c, 7 * F32 * c);
}

/**
 * BatchNorm2d's #fusedForward: batchNormForward with training false over the saved mean and the
 * batch variance, batchnorm_fwd_kernel alone (x and the residual read, y written).
 */
function normalise(l: BnLayer, s: number): StepOp {
  const c = l.shape[3]!;
  const e = shapeNumel(l.shape);
  const residual = l.residual ? 1 : 0;
  const relu = l.relu ? 1 : 0;
  return op(
    'bn fwd',
    l.name,
    'batchnorm_fwd_kernel (finalized statistics)',
    (2 + residual + relu) * e,
    s * e * (1 + residual) + 4 * F32 * c,
    s * e,
  );
}
