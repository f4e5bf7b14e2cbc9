/**
 * The optimizer side of fine-tuning a pretrained network (torchvision's transfer-learning
 * recipe): train only the new classifier (a frozen backbone), or train everything with the
 * backbone at a lower learning rate than the classifier, through parameter groups.
 * @packageDocumentation
 */
import { ResnetError, expectNumber, invalid, isArray } from '../errors.js';
import { Module } from '../nn/module.js';
import type { Parameter } from '../nn/parameter.js';

/** A parameter group as {@link backboneGroups} takes and makes it (the optimizers' group input). */
export interface FineTuneGroup {
  params: Parameter[];
  weightDecay?: number;
  lr?: number;
}

/** The parameters of the classifier `head` (a child module's name, `fc` for a ResNet). */
function headParameters(model: Module, head: string): Set<Parameter> {
  if (!(model instanceof Module)) invalid('model', 'a Module', model);
  if (typeof head !== 'string' || head.length === 0) invalid('head', "a submodule name such as 'fc'", head);
  const params = model.getSubmodule(head).parameters();
  if (params.length === 0) {
    throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `The head '${head}' has no parameters to train`);
  }
  return new Set(params);
}

/**
 * Freezes everything but the classifier `head` (default `fc`), as torchvision's feature-extraction
 * recipe does with `requires_grad = False` on the backbone: only the head gets gradients and
 * optimizer updates. Batch-norm statistics of the backbone still follow the data in training mode,
 * as in PyTorch (call `eval()` on a submodule to keep them).
 * @returns the number of parameter values frozen.
 */
export function freezeBackbone(model: Module, head = 'fc'): number {
  const keep = headParameters(model, head);
  let frozen = 0;
  for (const p of model.parameters()) {
    const train = keep.has(p);
    if (!train && p.requiresGrad) frozen += p.numel;
    p.requiresGrad = train;
  }
  return frozen;
}

/**
 * Parameter groups that train the backbone at `backboneLr` and the classifier `head` at the
 * optimizer's learning rate (PyTorch's per-group `lr`:
 * `SGD([{'params': backbone, 'lr': lr * 0.1}, {'params': model.fc.parameters()}], lr=lr)`).
 * `groups` (default: one group of all parameters) is split in two, keeping each group's other
 * settings; the head's groups come first, so the learning rate a Trainer reports (the first
 * group's) is the head's. Empty groups are left out. Schedules scale every group's learning rate
 * by the same factor, so the ratio holds throughout.
 *
 * ```ts
 * const model = ResNet18({ smallInput: true, numClasses: 10 });
 * const opt = new SGD(backboneGroups(model, { backboneLr: 0.001 }), { lr: 0.01, momentum: 0.9 });
 * ```
 */
export function backboneGroups(
  model: Module,
  options: { backboneLr: number; head?: string; groups?: readonly FineTuneGroup[] },
): FineTuneGroup[] {
  if (options === null || typeof options !== 'object') invalid('options', 'an options object', options);
  const backboneLr = expectNumber('backboneLr', options.backboneLr, 0);
  const head = headParameters(model, options.head ?? 'fc');
  const groups = options.groups ?? [{ params: model.parameters() }];
  if (!isArray(groups)) invalid('groups', 'an array of parameter groups', groups);
  const heads: FineTuneGroup[] = [];
  const bodies: FineTuneGroup[] = [];
  for (const group of groups) {
    const inHead = group.params.filter((p) => head.has(p));
    const inBody = group.params.filter((p) => !head.has(p));
    if (inHead.length > 0) heads.push({ ...group, params: inHead });
    if (inBody.length > 0) bodies.push({ ...group, params: inBody, lr: backboneLr });
  }
  return [...heads, ...bodies];
}
