/**
 * `train`'s gradual pruning options (`--prune-sparsity`, `--prune-start-epoch`,
 * `--prune-end-epoch`, `--prune-every`) and the callback they make: Zhu & Gupta's schedule over
 * optimizer steps, the mask applied after every step.
 * @packageDocumentation
 */
import type { Module } from '../nn/module.js';
import { PruningCallback } from '../nn/prune.js';
import { UsageError, type OptionSpec, type OptionValue } from './options.js';

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

/**
 * The pruning callback the options ask for, or undefined without `--prune-sparsity`.
 * @throws {@link UsageError} for pruning options without `--prune-sparsity`, or an end before the start.
 */
export function trainPruning(
  values: Record<string, OptionValue | undefined>,
  explicit: ReadonlySet<string>,
  model: Module,
  run: { epochs: number; stepsPerEpoch: number },
): PruningCallback | undefined {
  const sparsity = values.pruneSparsity as number | undefined;
  if (sparsity === undefined) {
    const stray = ['pruneStartEpoch', 'pruneEndEpoch', 'pruneEvery'].find((k) => explicit.has(k));
    if (stray !== undefined) {
      throw new UsageError(`--${stray.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)} needs --prune-sparsity`);
    }
    return undefined;
  }
  const startEpoch = values.pruneStartEpoch as number;
  const endEpoch = (values.pruneEndEpoch as number | undefined) ?? Math.max(startEpoch, 0.75 * run.epochs);
  if (endEpoch < startEpoch) {
    throw new UsageError(`--prune-end-epoch ${endEpoch} is before --prune-start-epoch ${startEpoch}`);
  }
  const startStep = Math.round(startEpoch * run.stepsPerEpoch);
  const endStep = Math.round(endEpoch * run.stepsPerEpoch);
  const frequency = (values.pruneEvery as number | undefined) ?? Math.max(1, Math.round((endStep - startStep) / 10));
  return new PruningCallback(model, { finalSparsity: sparsity, startStep, endStep, frequency });
}
