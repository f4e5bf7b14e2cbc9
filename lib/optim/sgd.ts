/**
 * SGD over the parameter arena: one native multi-tensor step per call, with PyTorch's
 * `torch.optim.SGD` semantics (momentum, dampening, Nesterov, weight decay) and parameter groups.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { ResnetError, expectBool, expectNumber, expectOptions } from '../errors.js';
import {
  Optimizer,
  rawFusedStepEnd,
  type Group,
  type GroupInput,
  type ParamsInput,
  type StepContext,
} from './optimizer.js';

/** Hyperparameters of {@link SGD}; each group may override them. */
export interface SGDOptions {
  lr: number;
  momentum?: number;
  dampening?: number;
  weightDecay?: number;
  nesterov?: boolean;
}

/** A parameter group as given to the constructor. */
export type SGDGroupInput = GroupInput<SGDOptions>;

/** A parameter group with every setting resolved; `lr` may be changed between steps. */
export type SGDGroup = Group<SGDOptions>;

const KEYS = ['lr', 'momentum', 'dampening', 'weightDecay', 'nesterov'] as const;

function checkHyper(where: string, o: Partial<SGDOptions>, defaults: Partial<SGDOptions>): Required<SGDOptions> {
  const lr = expectNumber(`${where}.lr`, o.lr ?? defaults.lr, 0);
  const momentum = expectNumber(`${where}.momentum`, o.momentum ?? defaults.momentum ?? 0, 0);
  const dampening = expectNumber(`${where}.dampening`, o.dampening ?? defaults.dampening ?? 0);
  const weightDecay = expectNumber(`${where}.weightDecay`, o.weightDecay ?? defaults.weightDecay ?? 0, 0);
  const nesterov = expectBool(`${where}.nesterov`, o.nesterov ?? defaults.nesterov ?? false);
  if (nesterov && (momentum <= 0 || dampening !== 0)) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `${where}: Nesterov momentum requires a momentum above 0 and zero dampening`,
    );
  }
  return { lr, momentum, dampening, weightDecay, nesterov };
}

/** Stochastic gradient descent over a model's parameter arena. */
export class SGD extends Optimizer<SGDOptions> {
  /**
   * @param params - a module (all its parameters), a list of parameters, or a list of groups
   *   `{ params, lr?, momentum?, ... }`.
   * @param options - defaults for every group.
   */
  constructor(params: ParamsInput<SGDOptions>, options: SGDOptions) {
    const o = expectOptions<SGDOptions>('SGD options', options, KEYS);
    super('SGD', params, checkHyper('SGD options', o, o), KEYS, checkHyper);
  }

  protected override bufferNames(): readonly string[] {
    return ['momentum'];
  }

  protected override applyStep(ctx: StepContext<SGDOptions>): void {
    const needsMomentum = ctx.groups.some((g) => g.momentum !== 0);
    // The buffers start as the first d_p: on the first step, or when there were none before
    // (momentum switched on later, or a checkpoint without them).
    const fresh = needsMomentum && !this.hasBuffer('momentum');
    if (fresh && ctx.tablesOnly) {
      // A captured step has no momentum buffer to point at: it must be captured again.
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'SGD: momentum was switched on after the step was captured in a CUDA graph; capture the step again',
      );
    }
    const momentum = needsMomentum ? this.buffer('momentum', ctx.arena) : undefined;
    const args = {
      params: ctx.arena.params.raw,
      grads: ctx.arena.grads.raw,
      ...(momentum ? { momentumBuffer: momentum.raw } : {}),
      groups: ctx.groups,
      segments: ctx.segments,
      firstStep: ctx.step === 1 || fresh,
      ...(ctx.foundInf ? { foundInf: ctx.foundInf.raw } : {}),
      gradScaleInv: ctx.gradScaleInv,
      ...(ctx.tablesOnly ? { tablesOnly: true } : {}),
    };
    const fused = ctx.fused;
    if (!fused) {
      addon().sgdStep(args);
      return;
    }
    addon().fusedSgdStep({ ...args, ...rawFusedStepEnd(fused) });
  }

  /** SGD's step can be captured in a CUDA graph (its learning rates are sent before each replay). */
  override get capturable(): boolean {
    return true;
  }

  /** True: SGD has the fused step of the `optim` fused path ({@link GradScaler.stepAndZeroGrad}). */
  override get supportsFusedStep(): boolean {
    return true;
  }
}
