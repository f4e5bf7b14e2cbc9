/**
 * SGD over the parameter arena: one native multi-tensor step per call, with PyTorch's
 * `torch.optim.SGD` semantics (momentum, dampening, Nesterov, weight decay) and parameter groups.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { ResnetError, expectBool, expectNumber, expectOptions, invalid } from '../errors.js';
import { Module } from '../nn/module.js';
import { Parameter, type ParameterArena } from '../nn/parameter.js';
import { Tensor } from '../tensor.js';

/** Hyperparameters of {@link SGD}; each group may override them. */
export interface SGDOptions {
  lr: number;
  momentum?: number;
  dampening?: number;
  weightDecay?: number;
  nesterov?: boolean;
}

/** A parameter group as given to the constructor. */
export interface SGDGroupInput extends Partial<SGDOptions> {
  params: Parameter[];
}

/** A parameter group with every setting resolved; `lr` may be changed between steps. */
export interface SGDGroup extends Required<SGDOptions> {
  params: Parameter[];
}

const KEYS = ['lr', 'momentum', 'dampening', 'weightDecay', 'nesterov'] as const;

function checkHyper(where: string, o: Partial<SGDOptions>, defaults: Partial<SGDOptions>): Required<SGDOptions> {
  const lr = expectNumber(`${where}.lr`, o.lr ?? defaults.lr, 0);
  const momentum = expectNumber(`${where}.momentum`, o.momentum ?? defaults.momentum ?? 0, 0);
  const dampening = expectNumber(`${where}.dampening`, o.dampening ?? defaults.dampening ?? 0);
  const weightDecay = expectNumber(`${where}.weightDecay`, o.weightDecay ?? defaults.weightDecay ?? 0, 0);
  const nesterov = expectBool(`${where}.nesterov`, o.nesterov ?? defaults.nesterov ?? false);
  if (nesterov && (momentum <= 0 || dampening !== 0)) {
    throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `${where}: Nesterov momentum requires a momentum above 0 and zero dampening`);
  }
  return { lr, momentum, dampening, weightDecay, nesterov };
}

/** Stochastic gradient descent over a model's parameter arena. */
export class SGD {
  /** The parameter groups; change `lr` here to schedule the learning rate. */
  readonly paramGroups: SGDGroup[];
  #momentum: Tensor | null = null;
  #segments: Int32Array | null = null;
  #steps = 0;

  /**
   * @param params - a module (all its parameters), a list of parameters, or a list of groups
   *   `{ params, lr?, momentum?, ... }`.
   * @param options - defaults for every group.
   */
  constructor(params: Module | Parameter[] | SGDGroupInput[], options: SGDOptions) {
    const o = expectOptions<SGDOptions>('SGD options', options, KEYS);
    const defaults = checkHyper('SGD options', o, o);
    let groups: SGDGroupInput[];
    if (params instanceof Module) groups = [{ params: params.parameters() }];
    else if (Array.isArray(params) && params.every((p) => p instanceof Parameter)) groups = [{ params: params as Parameter[] }];
    else if (Array.isArray(params)) groups = params as SGDGroupInput[];
    else groups = invalid('params', 'a Module, an array of Parameters or an array of parameter groups', params);
    const seen = new Set<Parameter>();
    this.paramGroups = groups.map((g, i) => {
      const where = `paramGroups[${i}]`;
      if (g === null || typeof g !== 'object' || !Array.isArray(g.params)) invalid(where, 'an object with a params array', g);
      expectOptions<SGDGroupInput>(where, g, ['params', ...KEYS]);
      for (const p of g.params) {
        if (!(p instanceof Parameter)) invalid(`${where}.params`, 'an array of Parameters', p);
        if (seen.has(p)) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `${where}: a parameter appears in more than one group`);
        seen.add(p);
      }
      return { params: [...g.params], ...checkHyper(where, g, defaults) };
    });
  }

  /** Steps taken so far. */
  get stepCount(): number {
    return this.#steps;
  }

  /** Applies one update to every parameter that requires a gradient. */
  step(): void {
    const arena = this.#arena();
    // Rebuilt every step (a few hundred entries) so that freezing or unfreezing takes effect at once.
    this.#buildSegments(arena);
    const needsMomentum = this.paramGroups.some((g) => g.momentum !== 0);
    if (needsMomentum && (!this.#momentum || this.#momentum.device !== arena.device || this.#momentum.numel !== arena.size)) {
      this.#momentum?.dispose();
      this.#momentum = Tensor.zeros([arena.size], { device: arena.device });
    }
    const groups = this.paramGroups.map((g, i) => checkHyper(`paramGroups[${i}]`, g, g));
    addon().sgdStep({
      params: arena.params.raw, grads: arena.grads.raw, ...(this.#momentum ? { momentumBuffer: this.#momentum.raw } : {}),
      groups, segments: this.#segments!, firstStep: this.#steps === 0,
    });
    this.#steps++;
  }

  /** Sets the gradients of this optimizer's parameters to zero. */
  zeroGrad(): void {
    const arena = this.#arena();
    const all = this.paramGroups.reduce((n, g) => n + g.params.length, 0);
    if (all === arena.entries.length) {
      arena.zeroGrad();
      return;
    }
    for (const g of this.paramGroups) for (const p of g.params) addon().fill({ tensor: p.grad.raw, value: 0 });
  }

  #arena(): ParameterArena {
    const first = this.paramGroups.find((g) => g.params.length > 0)?.params[0];
    const arena = first?.arena;
    if (!first || !arena) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'SGD: the parameters have not been placed on a device; call model.to(device) first');
    for (const g of this.paramGroups) {
      for (const p of g.params) {
        if (p.arena !== arena) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'SGD: all parameters must belong to one model (one parameter arena); call model.to(device) on the whole model');
      }
    }
    return arena;
  }

  #buildSegments(_arena: ParameterArena): void {
    const triples: number[] = [];
    this.paramGroups.forEach((g, gi) => {
      for (const p of g.params) if (p.requiresGrad) triples.push(p.offset, p.numel, gi);
    });
    this.#segments = Int32Array.from(triples);
  }

  /** Frees the momentum buffer. */
  dispose(): void {
    this.#momentum?.dispose();
    this.#momentum = null;
  }
}
