/**
 * `train`'s fine-tuning options beside `--pretrained`: `--freeze-backbone` (only the new
 * classifier trains) and `--backbone-lr-scale` (the backbone at a fraction of `--lr`), their
 * checks, and what they do to the model and the optimizer's parameter groups.
 * @packageDocumentation
 */
import type { Module } from '../nn/module.js';
import { backboneGroups, freezeBackbone, type FineTuneGroup } from '../optim/fine-tune.js';
import { UsageError, type OptionSpec } from './options.js';

const SECTION = 'Fine-tuning';

/** The option table entries. */
export const FINE_TUNE_OPTIONS: readonly OptionSpec[] = [
  {
    name: 'freeze-backbone',
    type: 'boolean',
    help: "Train only the classifier fc: every other parameter keeps the --pretrained values (torchvision's feature extraction; BatchNorm statistics still follow the data).",
    section: SECTION,
  },
  {
    name: 'backbone-lr-scale',
    type: 'number',
    min: 0,
    max: 1,
    exclusiveMin: true,
    valueName: 'F',
    help: "Train everything but fc at --lr times F (e.g. 0.1), fc at --lr: one parameter group each, as PyTorch's per-group lr. The schedule scales both.",
    section: SECTION,
  },
];

/** The values of {@link FINE_TUNE_OPTIONS}, by camelCase name. */
export interface FineTuneArgs {
  freezeBackbone: boolean;
  backboneLrScale: number | undefined;
}

/**
 * The options that only a run from pretrained weights reads (or its resumption, which keeps
 * them), for `train`'s table of dependent options.
 */
export const FINE_TUNE_DEPENDENT = {
  keys: ['freezeBackbone', 'backboneLrScale'],
  applies: (a: { weights: string | undefined; resume: string | undefined }): boolean =>
    a.weights !== undefined || a.resume !== undefined,
  refusal: (_: unknown, flag: string): string =>
    `${flag} needs --pretrained FILE: the weights whose backbone it keeps (a random backbone is no starting point)`,
} as const;

/**
 * Checks the fine-tuning options together.
 * @throws {@link UsageError} for a frozen backbone with a learning rate of its own.
 */
export function checkFineTune(a: FineTuneArgs): void {
  if (a.freezeBackbone && a.backboneLrScale !== undefined) {
    throw new UsageError(
      '--freeze-backbone and --backbone-lr-scale contradict each other: a frozen backbone has no learning rate',
      'Give one of them: --freeze-backbone trains only fc, --backbone-lr-scale trains the backbone slower.',
    );
  }
}

/** Freezes the backbone when asked; returns the note for the log, if any. */
export function applyFreezeBackbone(a: FineTuneArgs, model: Module): string | undefined {
  if (!a.freezeBackbone) return undefined;
  const frozen = freezeBackbone(model);
  return `froze the backbone: only fc trains (${frozen.toLocaleString('en-US')} parameters frozen)`;
}

/**
 * The optimizer's parameter groups under `--backbone-lr-scale`: `groups` (or all parameters)
 * split into fc's at `lr` and the backbone's at `lr * scale`; unchanged without the option.
 */
export function fineTuneParams(
  a: Pick<FineTuneArgs, 'backboneLrScale'>,
  model: Module,
  groups: FineTuneGroup[] | undefined,
  lr: number,
): FineTuneGroup[] | undefined {
  if (a.backboneLrScale === undefined) return groups;
  return backboneGroups(model, { backboneLr: lr * a.backboneLrScale, ...(groups ? { groups } : {}) });
}
