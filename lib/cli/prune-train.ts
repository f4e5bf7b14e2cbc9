/**
 * `train`'s gradual pruning options (`--prune-sparsity`, `--prune-start-epoch`,
 * `--prune-end-epoch`, `--prune-every`) and the callback they make: Zhu & Gupta's schedule over
 * optimizer steps, the mask applied after every step.
 * @packageDocumentation
 */
import type { Module } from '../nn/module.js';
import { PruningCallback } from '../nn/prune.js';
import { UsageError, type OptionSpec } from './options.js';

const SECTION = 'Pruning';

/** The option table entries. */
export const PRUNE_TRAIN_OPTIONS: readonly OptionSpec[] = [
  {
    name: 'prune-sparsity',
    type: 'number',
    min: 0,
    max: 1,
    valueName: 'FRACTION',
    help: 'Prune gradually to this global sparsity of the convolution and linear weights (magnitude, Zhu & Gupta schedule); pruned weights stay zero.',
    section: SECTION,
  },
  {
    name: 'prune-start-epoch',
    type: 'number',
    min: 0,
    default: 0,
    valueName: 'E',
    help: 'When pruning begins (fractional epochs allowed).',
    section: SECTION,
  },
  {
    name: 'prune-end-epoch',
    type: 'number',
    min: 0,
    valueName: 'E',
    defaultText: 'three quarters of --epochs',
    help: 'When --prune-sparsity is reached; training goes on at that sparsity to recover.',
    section: SECTION,
  },
  {
    name: 'prune-every',
    type: 'int',
    min: 1,
    valueName: 'STEPS',
    defaultText: 'a tenth of the pruning span',
    help: 'Optimizer steps between mask updates.',
    section: SECTION,
  },
];

/** The values of {@link PRUNE_TRAIN_OPTIONS}, by camelCase name. */
export interface PruneArgs {
  pruneSparsity: number | undefined;
  pruneStartEpoch: number;
  pruneEndEpoch: number | undefined;
  pruneEvery: number | undefined;
}

/** The options that only a run with `--prune-sparsity` reads, for `train`'s table of dependent options. */
export const PRUNE_DEPENDENT = {
  keys: ['pruneStartEpoch', 'pruneEndEpoch', 'pruneEvery'],
  applies: (a: { pruneSparsity: number | undefined }): boolean => a.pruneSparsity !== undefined,
  refusal: (_: unknown, flag: string): string => `${flag} needs --prune-sparsity`,
} as const;

/**
 * The pruning callback the options ask for, or undefined without `--prune-sparsity` (the options
 * that need it are refused by `train`'s table of dependent options, {@link PRUNE_DEPENDENT}).
 * @throws {@link UsageError} for an end before the start.
 */
export function trainPruning(
  a: PruneArgs,
  model: Module,
  run: { epochs: number; stepsPerEpoch: number },
): PruningCallback | undefined {
  const sparsity = a.pruneSparsity;
  if (sparsity === undefined) return undefined;
  const startEpoch = a.pruneStartEpoch;
  const endEpoch = a.pruneEndEpoch ?? Math.max(startEpoch, 0.75 * run.epochs);
  if (endEpoch < startEpoch) {
    throw new UsageError(`--prune-end-epoch ${endEpoch} is before --prune-start-epoch ${startEpoch}`);
  }
  const startStep = Math.round(startEpoch * run.stepsPerEpoch);
  const endStep = Math.round(endEpoch * run.stepsPerEpoch);
  const frequency = a.pruneEvery ?? Math.max(1, Math.round((endStep - startStep) / 10));
  return new PruningCallback(model, { finalSparsity: sparsity, startStep, endStep, frequency });
}
