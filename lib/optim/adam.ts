/**
 * AdamW and LAMB over the parameter arena: one native multi-tensor step per call (LAMB: one
 * reduction and one update pass), with parameter groups.
 * @packageDocumentation
 */
import { addon, type RawAdamArgs } from '../binding.js';
import type { Tensor } from '../tensor.js';
import { expectBool, expectNumber, expectOptions, invalid } from '../errors.js';
import {
  Optimizer,
  rawFusedStepEnd,
  type Group,
  type GroupInput,
  type ParamsInput,
  type StepContext,
} from './optimizer.js';

/** Hyperparameters of {@link AdamW}; each group may override them. */
export interface AdamWOptions {
  lr: number;
  /** Decay rates of the first and second moment estimates; default `[0.9, 0.999]`. */
  betas?: [number, number];
  /** Added to the denominator; default 1e-8. */
  eps?: number;
  /** Decoupled weight decay: `p *= 1 - lr * weightDecay` before the Adam step; default 0.01. */
  weightDecay?: number;
}

/** A parameter group of {@link AdamW} as given to the constructor. */
export type AdamWGroupInput = GroupInput<AdamWOptions>;
/** A parameter group of {@link AdamW} with every setting resolved. */
export type AdamWGroup = Group<AdamWOptions>;

/** Hyperparameters of {@link LAMB}; each group may override them. */
export interface LAMBOptions {
  lr: number;
  /** Decay rates of the first and second moment estimates; default `[0.9, 0.999]`. */
  betas?: [number, number];
  /** Added to the denominator; default 1e-6. */
  eps?: number;
  /** Weight decay, added to the update direction: `u = m̂ / (√v̂ + eps) + weightDecay * p`; default 0.01. */
  weightDecay?: number;
  /**
   * Apply the trust ratio even in groups without weight decay (timm's `always_adapt`). Default
   * false: like NVIDIA's FusedLAMB and timm's Lamb, such groups (typically norms and biases, see
   * {@link parameterGroups}) take the plain Adam step.
   */
  alwaysAdapt?: boolean;
}

/** A parameter group of {@link LAMB} as given to the constructor. */
export type LAMBGroupInput = GroupInput<LAMBOptions>;
/** A parameter group of {@link LAMB} with every setting resolved. */
export type LAMBGroup = Group<LAMBOptions>;

function checkBetas(where: string, value: unknown): [number, number] {
  if (!Array.isArray(value) || value.length !== 2) invalid(`${where}.betas`, 'a pair of numbers in [0, 1)', value);
  const [b1, b2] = value as unknown[];
  const check = (name: string, b: unknown) => {
    const n = expectNumber(name, b, 0, 1);
    if (n >= 1) invalid(name, 'a number in [0, 1)', b);
    return n;
  };
  return [check(`${where}.betas[0]`, b1), check(`${where}.betas[1]`, b2)];
}

function checkAdamW(where: string, o: Partial<AdamWOptions>, defaults: Partial<AdamWOptions>): Required<AdamWOptions> {
  return {
    lr: expectNumber(`${where}.lr`, o.lr ?? defaults.lr, 0),
    betas: checkBetas(where, o.betas ?? defaults.betas ?? [0.9, 0.999]),
    eps: expectNumber(`${where}.eps`, o.eps ?? defaults.eps ?? 1e-8, 0),
    weightDecay: expectNumber(`${where}.weightDecay`, o.weightDecay ?? defaults.weightDecay ?? 0.01, 0),
  };
}

function checkLamb(where: string, o: Partial<LAMBOptions>, defaults: Partial<LAMBOptions>): Required<LAMBOptions> {
  return {
    lr: expectNumber(`${where}.lr`, o.lr ?? defaults.lr, 0),
    betas: checkBetas(where, o.betas ?? defaults.betas ?? [0.9, 0.999]),
    eps: expectNumber(`${where}.eps`, o.eps ?? defaults.eps ?? 1e-6, 0),
    weightDecay: expectNumber(`${where}.weightDecay`, o.weightDecay ?? defaults.weightDecay ?? 0.01, 0),
    alwaysAdapt: expectBool(`${where}.alwaysAdapt`, o.alwaysAdapt ?? defaults.alwaysAdapt ?? false),
  };
}

const ADAMW_KEYS = ['lr', 'betas', 'eps', 'weightDecay'] as const;
const LAMB_KEYS = ['lr', 'betas', 'eps', 'weightDecay', 'alwaysAdapt'] as const;

// The fields adamwStep and lambStep share; the moments are the optimizer's state arenas.
function nativeArgs(
  ctx: StepContext<AdamWOptions> | StepContext<LAMBOptions>,
  expAvg: Tensor,
  expAvgSq: Tensor,
): RawAdamArgs {
  const groups = ctx.groups as readonly (Required<AdamWOptions> & { alwaysAdapt?: boolean })[];
  return {
    params: ctx.arena.params.raw,
    grads: ctx.arena.grads.raw,
    expAvg: expAvg.raw,
    expAvgSq: expAvgSq.raw,
    groups: groups.map((g) => ({
      lr: g.lr,
      beta1: g.betas[0],
      beta2: g.betas[1],
      eps: g.eps,
      weightDecay: g.weightDecay,
      alwaysAdapt: g.alwaysAdapt ?? false,
    })),
    segments: ctx.segments,
    step: ctx.step,
    ...(ctx.foundInf ? { foundInf: ctx.foundInf.raw } : {}),
    gradScaleInv: ctx.gradScaleInv,
    ...(ctx.stepCount ? { stepCount: ctx.stepCount.raw } : {}),
    ...(ctx.tablesOnly ? { tablesOnly: true } : {}),
  };
}

/**
 * AdamW with `torch.optim.AdamW`'s semantics (amsgrad off): decoupled weight decay, then
 * `m = β1 m + (1-β1) g`, `v = β2 v + (1-β2) g²` and
 * `p -= lr / (1-β1^t) * m / (√v / √(1-β2^t) + eps)`.
 */
export class AdamW extends Optimizer<AdamWOptions> {
  /**
   * @param params - a module, a list of parameters, or a list of groups `{ params, lr?, betas?, ... }`
   *   (see {@link parameterGroups}).
   * @param options - defaults for every group.
   */
  constructor(params: ParamsInput<AdamWOptions>, options: AdamWOptions) {
    const o = expectOptions<AdamWOptions>('AdamW options', options, ADAMW_KEYS);
    super('AdamW', params, checkAdamW('AdamW options', o, o), ADAMW_KEYS, checkAdamW);
  }

  protected override bufferNames(): readonly string[] {
    return ['expAvg', 'expAvgSq'];
  }

  protected override applyStep(ctx: StepContext<AdamWOptions>): void {
    const args = nativeArgs(ctx, this.buffer('expAvg', ctx.arena), this.buffer('expAvgSq', ctx.arena));
    if (ctx.fused) addon().fusedAdamwStep({ ...args, ...rawFusedStepEnd(ctx.fused) });
    else addon().adamwStep(args);
  }

  /** AdamW's step can be captured in a CUDA graph (t is counted on the device). */
  override get capturable(): boolean {
    return true;
  }

  /** True: AdamW has the fused step of the `optim` fused path ({@link GradScaler.stepAndZeroGrad}). */
  override get supportsFusedStep(): boolean {
    return true;
  }
}

/**
 * LAMB (You et al., 2019) as NVIDIA's FusedLAMB and timm's Lamb compute it, with bias
 * correction: Adam moments, the direction `u = m̂ / (√v̂ + eps) + weightDecay * p`, and per
 * parameter tensor the trust ratio `r = ‖p‖ / ‖u‖` (1 when either norm is 0, or in groups
 * without weight decay unless `alwaysAdapt`); then `p -= lr * r * u`. There is no built-in
 * gradient clipping: call {@link clipGradNorm} before the step for FusedLAMB's `max_grad_norm`.
 */
export class LAMB extends Optimizer<LAMBOptions> {
  /**
   * @param params - a module, a list of parameters, or a list of groups (see {@link parameterGroups}).
   * @param options - defaults for every group.
   */
  constructor(params: ParamsInput<LAMBOptions>, options: LAMBOptions) {
    const o = expectOptions<LAMBOptions>('LAMB options', options, LAMB_KEYS);
    super('LAMB', params, checkLamb('LAMB options', o, o), LAMB_KEYS, checkLamb);
  }

  protected override bufferNames(): readonly string[] {
    return ['expAvg', 'expAvgSq'];
  }

  protected override applyStep(ctx: StepContext<LAMBOptions>): void {
    const args = nativeArgs(ctx, this.buffer('expAvg', ctx.arena), this.buffer('expAvgSq', ctx.arena));
    if (ctx.fused) addon().fusedLambStep({ ...args, ...rawFusedStepEnd(ctx.fused) });
    else addon().lambStep(args);
  }

  /** LAMB's step can be captured in a CUDA graph (t is counted on the device). */
  override get capturable(): boolean {
    return true;
  }

  /** True: LAMB has the fused step of the `optim` fused path ({@link GradScaler.stepAndZeroGrad}). */
  override get supportsFusedStep(): boolean {
    return true;
  }
}
