/**
 * The fused plan, the step to be built on cuDNN's graph API, with the same
 * accounting as the current plan (lib/analysis/plan-current.ts):
 *
 * - Forward: each convolution writes its raw output and, in its epilogue, the per-channel sums its
 *   batch norm needs (conv-genstats); a small finalize kernel turns them into scale and bias; the
 *   next convolution applies scale, bias and ReLU in its prologue while loading (scale-bias-relu-
 *   conv), so a normalised activation is never written. Where no convolution consumes it (a
 *   block's output, the stem before max pooling) one pass applies BN + residual add (with the
 *   shortcut's own BN folded in) + ReLU, or BN + ReLU + pooling.
 * - Backward: each convolution's backward data ends in the ReLU mask and the batch-norm gradient
 *   sums of the activation it produces (dgrad-drelu-dbn), reading the raw output that activation
 *   came from; the block's residual gradient is added in the same epilogue. The BN input gradient
 *   `dx = a * g + b * x + c` (per channel) is applied in the prologues of the convolutions that
 *   read it (backward data and backward filter), which read `g` and the raw `x` instead of a
 *   materialised `dx`; backward filter applies the forward's scale-bias-ReLU to its input the
 *   same way, and accumulates into the f32 gradient.
 * - Global average pooling's backward carries the last block's ReLU mask and BN sums; max pooling's
 *   backward the stem's. The linear layer uses cuBLASLt epilogues (bias, bias gradient).
 * - One multi-tensor kernel: SGD update (unscaling as it reads), the scale update, the bf16/fp16
 *   copies of the weights the next step's convolutions read, and the gradient zeroing; under a
 *   GradScaler (fp16) a read-only check pass over the gradients before it. Channels-last throughout.
 *
 * Assumed sizes of what the epilogues leave for the finalize kernels: per-channel sum and sum of
 * squares (f32) per tile of {@link STATS_TILE_ROWS} output rows.
 * @packageDocumentation
 */
import { ResnetError } from '../errors.js';
import { inputOp, lossOps, type PlanOptions } from './plan-current.js';
import { F32, op, type StepOp } from './step-ops.js';
import {
  shapeNumel,
  type BlockLayer,
  type BnLayer,
  type ConvLayer,
  type StepLayer,
  type StepLayers,
} from './step-layers.js';

/** Rows (output pixels) of the tile each epilogue reduces into one partial per channel. */
export const STATS_TILE_ROWS = 128;

/** Bytes of the per-tile partial sums (two f32 per channel) over `elems` elements of `channels` channels. */
function statsBytes(elems: number, channels: number): number {
  return 2 * F32 * channels * Math.ceil(elems / channels / STATS_TILE_ROWS);
}

/** Where a materialised activation came from: what its gradient must go through next. */
type Producer =
  | { kind: 'input' }
  /** Max pooling over relu(bn(raw)): the raw conv output's elements and channels, the pool's argmax. */
  | { kind: 'pool'; layer: string; raw: number; channels: number; bn: string; out: number }
  /** A block's relu(bn(main) + shortcut): the raw outputs its backward reads. */
  | { kind: 'block'; layer: string; bns: string[] }
  /** relu(bn(raw)) written by a pass of its own. */
  | { kind: 'bnrelu'; layer: string; bn: string };

/** The activation flowing forward: materialised, or a raw conv output whose BN (+ ReLU) is pending. */
type Activation =
  | { kind: 'materialised'; elems: number; channels: number; producer: Producer }
  | { kind: 'pending'; elems: number; channels: number; bn: string };

function unsupported(what: string): never {
  throw new ResnetError(
    'ERR_RC_INVALID_ARGUMENT',
    `roofline: the fused plan models networks whose every convolution feeds a BatchNorm2d (the ResNet family); ${what}`,
  );
}

/** The ops of the fused plan for one training step of `step`. */
export function fusedPlan(step: StepLayers, o: PlanOptions): StepOp[] {
  return new FusedPlanner(o).plan(step);
}

class FusedPlanner {
  readonly #s: number;
  readonly #o: PlanOptions;
  readonly #ops: StepOp[] = [];
  /** Backward work, in forward order; run in reverse. */
  readonly #backward: (() => void)[] = [];

  constructor(o: PlanOptions) {
    this.#o = o;
    this.#s = o.activationBytes;
  }

  plan(step: StepLayers): StepOp[] {
    this.#ops.push(inputOp(step, this.#s));
    const input: Activation = {
      kind: 'materialised',
      elems: shapeNumel(step.input),
      channels: step.input[3]!,
      producer: { kind: 'input' },
    };
    this.#sequence(step.layers, input);
    this.#ops.push(...lossOps(step, this.#s));
    for (let i = this.#backward.length - 1; i >= 0; i--) this.#backward[i]!();
    this.#optimizer(step);
    return this.#ops;
  }

  /** Plans a top-level sequence; returns the activation it leaves. */
  #sequence(layers: readonly StepLayer[], start: Activation): Activation {
    let a = start;
    for (let i = 0; i < layers.length; i++) {
      const l = layers[i]!;
      if (l.kind === 'conv') {
        const bn = layers[i + 1];
        if (bn?.kind !== 'bn') unsupported(`${l.name} is not followed by one`);
        if (bn.residual) unsupported(`${bn.name} adds a residual outside a block`);
        a = this.#convBn(l, bn, a, true);
        i++;
      } else if (l.kind === 'block') {
        a = this.#block(l, a);
      } else if (l.kind === 'maxpool' || l.kind === 'avgpool') {
        a = this.#pool(l.kind, l.name, l.output, l.kernel, l.inputGrad, a);
      } else if (l.kind === 'linear') {
        this.#materialise(a);
        a = this.#linear(l);
      } else {
        unsupported(`${l.name} (${l.kind}) stands on its own`);
      }
    }
    return a;
  }

  /**
   * A convolution and the BN after it: conv-genstats (reading its input through the pending BN's
   * scale-bias-ReLU prologue when there is one) and the BN's finalize. Backward: dgrad-drelu-dbn
   * and wgrad, both applying this BN's gradient in their prologue.
   */
  #convBn(conv: ConvLayer, bn: BnLayer, input: Activation, relu: boolean): Activation {
    if (!relu && bn.relu) unsupported(`${bn.name} applies a ReLU on the shortcut`);
    const s = this.#s;
    const x = shapeNumel(conv.input);
    const y = shapeNumel(conv.output);
    const k = conv.channels;
    const prologue = input.kind === 'pending' ? 2 * F32 * input.channels : 0;
    const prologueFlops = input.kind === 'pending' ? 3 * x : 0;
    const stats = statsBytes(y, k);
    this.#ops.push(
      op(
        'conv fwd',
        conv.name,
        input.kind === 'pending' ? 'scale-bias-relu-conv-genstats' : 'conv-genstats',
        2 * conv.macs + prologueFlops + 3 * y,
        s * (x + conv.weight) + prologue,
        s * y + stats,
      ),
    );
    this.#bnFinalize(bn.name, 'bn finalize', stats, k, 'bn fwd');
    this.#backward.push(() => {
      // The output gradient is (g, raw y) plus per-channel coefficients, applied in the prologues.
      const dy = 2 * s * y + 3 * F32 * k;
      if (conv.weightGrad) {
        this.#ops.push(
          op(
            'conv wgrad',
            conv.name,
            input.kind === 'pending' ? 'dbn-apply + scale-bias-relu wgrad' : 'dbn-apply wgrad',
            2 * conv.macs + 3 * y + prologueFlops,
            dy + s * x + prologue + F32 * conv.weight,
            F32 * conv.weight,
          ),
        );
      }
      if (conv.inputGrad) this.#dgrad(conv, input, dy, 3 * y);
    });
    return { kind: 'pending', elems: y, channels: k, bn: bn.name };
  }

  /** Backward data of `conv` into `input`, with the epilogue its input's producer needs. */
  #dgrad(
    conv: ConvLayer,
    input: Activation,
    dyBytes: number,
    dyFlops: number,
    extra?: { read: number; name: string },
  ): void {
    const s = this.#s;
    const x = shapeNumel(conv.input);
    const base = { flops: 2 * conv.macs + dyFlops, read: dyBytes + s * conv.weight + (extra?.read ?? 0) };
    const kernel = `dbn-apply dgrad${extra ? ` + ${extra.name}` : ''}`;
    if (input.kind === 'pending') {
      // dgrad-drelu-dbn: the raw input read for the mask and x-hat; g and the BN sums written.
      const stats = statsBytes(x, input.channels);
      this.#ops.push(
        op('conv dgrad', conv.name, `${kernel} + drelu-dbn`, base.flops + 5 * x, base.read + s * x, s * x + stats),
      );
      this.#bnFinalize(input.bn, 'dbn finalize', stats, input.channels, 'bn bwd');
      return;
    }
    const epilogue = this.#producerEpilogue(input);
    this.#ops.push(
      op(
        'conv dgrad',
        conv.name,
        `${kernel}${epilogue.name}`,
        base.flops + epilogue.flops,
        base.read + epilogue.read,
        s * x + epilogue.written,
      ),
    );
    epilogue.after();
  }

  /**
   * What the kernel that completes a materialised activation's gradient also does for its
   * producer: a block's or a BN-ReLU pass's ReLU mask and BN sums (then their finalize kernels);
   * nothing for max pooling (its backward kernel does it) or the image.
   */
  #producerEpilogue(a: Activation & { kind: 'materialised' }): {
    name: string;
    flops: number;
    read: number;
    written: number;
    after: () => void;
  } {
    const s = this.#s;
    const e = a.elems;
    const p = a.producer;
    if (p.kind === 'block' || p.kind === 'bnrelu') {
      const bns = p.kind === 'block' ? p.bns : [p.bn];
      const stats = statsBytes(e, a.channels);
      return {
        name: ' + drelu-dbn',
        flops: 5 * e * bns.length,
        // The output (ReLU mask) of a block, and the raw output under each of its BNs.
        read: s * e * ((p.kind === 'block' ? 1 : 0) + bns.length),
        written: stats * bns.length,
        after: () => {
          for (const bn of bns) this.#bnFinalize(bn, 'dbn finalize', stats, a.channels, 'bn bwd');
        },
      };
    }
    return { name: '', flops: 0, read: 0, written: 0, after: () => undefined };
  }

  /** A BN's finalize kernel: partial sums in, per-channel scale/bias (and running statistics) out. */
  #bnFinalize(layer: string, kernel: string, stats: number, channels: number, type: 'bn fwd' | 'bn bwd'): void {
    this.#ops.push(op(type, layer, kernel, stats / F32, stats + 2 * F32 * channels, 6 * F32 * channels));
  }

  /** A residual block: conv-BN pairs on the main branch, an optional conv-BN shortcut, BN + add + ReLU. */
  #block(b: BlockLayer, start: Activation): Activation {
    const s = this.#s;
    const input = this.#materialise(start);
    const pairs = (layers: readonly StepLayer[], where: string): [ConvLayer, BnLayer][] => {
      if (layers.length % 2 !== 0) unsupported(`the ${where} of ${b.name} is not conv-BN pairs`);
      const out: [ConvLayer, BnLayer][] = [];
      for (let i = 0; i < layers.length; i += 2) {
        const c = layers[i]!;
        const n = layers[i + 1]!;
        if (c.kind !== 'conv' || n.kind !== 'bn') unsupported(`the ${where} of ${b.name} is not conv-BN pairs`);
        out.push([c, n]);
      }
      return out;
    };
    const main = pairs(b.main, 'main branch');
    const shortcut = b.shortcut ? pairs(b.shortcut, 'shortcut') : [];
    if (shortcut.length > 1) unsupported(`the shortcut of ${b.name} has more than one convolution`);
    // Forward in order; backward closures run in reverse: main from its end, then the shortcut
    // (whose dgrad, or the main branch's first one, completes the input gradient).
    const backwardAt = this.#backward.length;
    let a: Activation = input;
    main.forEach(([conv, bn], i) => {
      a = this.#convBn(conv, bn, a, i < main.length - 1 || bn.relu);
    });
    const last = main[main.length - 1]![1];
    const out = a.elems;
    const c = a.channels;
    let residualRead = s * input.elems;
    const bns = [last.name];
    if (shortcut[0]) {
      const [conv, bn] = shortcut[0];
      this.#convBn(conv, bn, input, false);
      residualRead = s * out + 2 * F32 * c;
      bns.push(bn.name);
    }
    this.#ops.push(
      op(
        'bn fwd',
        last.name,
        shortcut[0] ? 'dual-bn-add-relu' : 'bn-add-relu',
        (shortcut[0] ? 6 : 4) * out,
        s * out + residualRead + 2 * F32 * c,
        s * out,
      ),
    );
    this.#reorderBlockBackward(backwardAt, b, main, shortcut[0]?.[0], input);
    return { kind: 'materialised', elems: out, channels: c, producer: { kind: 'block', layer: b.name, bns } };
  }

  /**
   * Replaces the block's backward closures with one that runs them in the block's backward order
   * and has the last input-gradient dgrad add the other contribution (the first one's output, or
   * the identity's g) before its producer epilogue.
   */
  #reorderBlockBackward(
    at: number,
    b: BlockLayer,
    main: [ConvLayer, BnLayer][],
    shortcutConv: ConvLayer | undefined,
    input: Activation & { kind: 'materialised' },
  ): void {
    const closures = this.#backward.splice(at);
    const s = this.#s;
    const first = main[0]![0];
    this.#backward.push(() => {
      // Main branch from its last pair down to (not including) the first conv's dgrad.
      for (let i = main.length - 1; i >= 1; i--) closures[i]!();
      const dy = (conv: ConvLayer) => 2 * s * shapeNumel(conv.output) + 3 * F32 * conv.channels;
      const wgrad = (conv: ConvLayer, from: Activation) => {
        if (!conv.weightGrad) return;
        const x = shapeNumel(conv.input);
        const y = shapeNumel(conv.output);
        const prologue = from.kind === 'pending' ? 2 * F32 * from.channels : 0;
        this.#ops.push(
          op(
            'conv wgrad',
            conv.name,
            'dbn-apply wgrad',
            2 * conv.macs + 3 * y,
            dy(conv) + s * x + prologue + F32 * conv.weight,
            F32 * conv.weight,
          ),
        );
      };
      wgrad(first, input);
      if (shortcutConv) wgrad(shortcutConv, input);
      if (!b.inputGrad) return;
      const x = shapeNumel(first.input);
      if (shortcutConv) {
        // conv1's dgrad writes its part of dX; the shortcut's dgrad adds it and completes dX.
        this.#ops.push(
          op(
            'conv dgrad',
            first.name,
            'dbn-apply dgrad',
            2 * first.macs + 3 * shapeNumel(first.output),
            dy(first) + s * first.weight,
            s * x,
          ),
        );
        this.#dgrad(shortcutConv, input, dy(shortcutConv), 3 * shapeNumel(shortcutConv.output), {
          read: s * x,
          name: 'add',
        });
      } else {
        // The identity's gradient is the block output's g: added in conv1's dgrad epilogue.
        this.#dgrad(first, input, dy(first), 3 * shapeNumel(first.output), { read: s * x, name: 'add' });
      }
    });
  }

  /** Writes a pending BN-ReLU out when something other than a convolution reads it. */
  #materialise(a: Activation): Activation & { kind: 'materialised' } {
    if (a.kind === 'materialised') return a;
    const s = this.#s;
    this.#ops.push(op('bn fwd', a.bn, 'bn-relu', 3 * a.elems, s * a.elems + 2 * F32 * a.channels, s * a.elems));
    return { ...a, kind: 'materialised', producer: { kind: 'bnrelu', layer: a.bn, bn: a.bn } };
  }

  /** Max pooling (fused with a pending BN-ReLU before it) or global average pooling. */
  #pool(
    kind: 'maxpool' | 'avgpool',
    name: string,
    output: readonly number[],
    kernel: [number, number],
    inputGrad: boolean,
    a: Activation,
  ): Activation {
    const s = this.#s;
    const y = shapeNumel(output);
    const window = kernel[0] * kernel[1];
    if (kind === 'maxpool' && a.kind === 'pending') {
      // bn-relu-maxpool: the raw stem output in, the pooled output and a one-byte window index out.
      this.#ops.push(
        op('pool', name, 'bn-relu-maxpool', 3 * a.elems + y * window, s * a.elems + 2 * F32 * a.channels, (s + 1) * y),
      );
      const pending = a;
      this.#backward.push(() => {
        if (!inputGrad) return;
        const stats = statsBytes(pending.elems, pending.channels);
        // maxpool backward + drelu-dbn: dy and the index in; the raw output for mask and x-hat; g out.
        this.#ops.push(
          op(
            'pool',
            name,
            'maxpool-bwd + drelu-dbn',
            6 * pending.elems,
            (s + 1) * y + s * pending.elems,
            s * pending.elems + stats,
          ),
        );
        this.#bnFinalize(pending.bn, 'dbn finalize', stats, pending.channels, 'bn bwd');
      });
      return {
        kind: 'materialised',
        elems: y,
        channels: output[3]!,
        producer: { kind: 'pool', layer: name, raw: pending.elems, channels: pending.channels, bn: pending.bn, out: y },
      };
    }
    const m = this.#materialise(a);
    this.#ops.push(
      op(
        'pool',
        name,
        kind === 'maxpool' ? 'maxpool_fwd_kernel' : 'avgpool_fwd_kernel',
        y * window,
        s * m.elems,
        (kind === 'maxpool' ? s + 4 : s) * y,
      ),
    );
    this.#backward.push(() => {
      if (!inputGrad) return;
      const epilogue = this.#producerEpilogue(m);
      const index = kind === 'maxpool' ? 4 * y : 0;
      this.#ops.push(
        op(
          'pool',
          name,
          `${kind === 'maxpool' ? 'maxpool' : 'avgpool'}-bwd${epilogue.name}`,
          m.elems + epilogue.flops,
          s * y + index + epilogue.read,
          s * m.elems + epilogue.written,
        ),
      );
      epilogue.after();
    });
    return { kind: 'materialised', elems: y, channels: output[3]!, producer: { kind: 'input' } };
  }

  /** The classifier: cuBLASLt GEMMs with the bias in the forward's epilogue and the bias gradient in the weight gradient's. */
  #linear(l: StepLayer & { kind: 'linear' }): Activation {
    const s = this.#s;
    const x = shapeNumel(l.input);
    const y = shapeNumel(l.output);
    const bias = l.bias ? F32 * l.output[1]! : 0;
    this.#ops.push(
      op(
        'gemm',
        l.name,
        'cublasLt matmul + bias epilogue',
        2 * l.macs + (l.bias ? y : 0),
        s * (x + l.weight) + bias,
        s * y,
      ),
    );
    this.#backward.push(() => {
      if (l.weightGrad || l.biasGrad) {
        this.#ops.push(
          op(
            'gemm',
            l.name,
            'cublasLt matmul (weight gradient) + bias-gradient epilogue',
            2 * l.macs + y,
            s * (x + y) + F32 * l.weight + bias,
            F32 * l.weight + bias,
          ),
        );
      }
      if (l.inputGrad) {
        this.#ops.push(op('gemm', l.name, 'cublasLt matmul (input gradient)', 2 * l.macs, s * (y + l.weight), s * x));
      }
    });
    return { kind: 'materialised', elems: y, channels: l.output[1]!, producer: { kind: 'input' } };
  }

  /**
   * The multi-tensor step, as native/cuda/fused_optim.cu does it: gradients, parameters and
   * momentum read; parameters, momentum and zeroed gradients written, with the scale update in the
   * same kernel; the low-precision weight copies the next step's convolutions read are planned in
   * that pass too. Under a GradScaler the flag is cleared, and a read-only pass over the gradients
   * comes first (the check must see all of them before the first update, and blocks cannot wait
   * for each other), then the flags are copied to the host.
   */
  #optimizer(step: StepLayers): void {
    const p = step.trainableParams;
    if (this.#o.gradScaler) {
      this.#ops.push(op('scaler', 'step', 'cudaMemsetAsync (found inf)', 0, 0, F32));
      this.#ops.push(op('scaler', 'step', 'fused_first_pass_kernel (check)', p, F32 * p, 0));
    }
    this.#ops.push(
      op(
        'optimizer',
        'step',
        this.#o.gradScaler
          ? 'fused_sgd_kernel (unscale + SGD + scale update + zero; weight cast planned)'
          : 'fused_sgd_kernel (SGD + zero; weight cast planned)',
        8 * p,
        3 * F32 * p,
        2 * F32 * p + this.#s * step.castWeights + F32 * step.params,
      ),
    );
    if (this.#o.gradScaler) {
      this.#ops.push(op('scaler', 'step', 'cudaMemcpyAsync (scale, found inf to host)', 0, 2 * F32, 0));
    }
  }
}
