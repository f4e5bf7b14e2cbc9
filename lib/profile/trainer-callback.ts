/**
 * Profiling a range of a Trainer's steps: a callback that starts a {@link Profiler} at the first
 * step of the range, ends a profiled step at each optimizer step, and at the last one stops,
 * writes the Chrome trace and hands over the table. `resnet-cuda train --profile-steps A:B` uses it.
 * @packageDocumentation
 */
import { join } from 'node:path';
import { ResnetError, expectOptions, invalid } from '../errors.js';
import type { Trainer } from '../train/trainer.js';
import type { Callback } from '../train/trainer-types.js';
import { Profiler } from './profiler.js';

/** A range of optimizer steps, 1-based and inclusive, as `--profile-steps A:B` gives it. */
export interface StepRange {
  first: number;
  last: number;
}

/**
 * Reads `A:B` (steps A to B, 1-based, inclusive) or `A` (step A alone). Throws
 * `ERR_RC_INVALID_ARGUMENT` naming `name` and what was wrong.
 */
export function parseStepRange(text: string, name = '--profile-steps'): StepRange {
  if (typeof text !== 'string') invalid(name, "a step range such as '10:12'", text);
  const match = /^\s*(\d+)\s*(?::\s*(\d+)\s*)?$/.exec(text);
  const first = match ? Number(match[1]) : NaN;
  const last = match?.[2] !== undefined ? Number(match[2]) : first;
  if (!match || !Number.isSafeInteger(first) || !Number.isSafeInteger(last)) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `${name} expects A:B, the first and last optimizer step to profile (1-based, e.g. 10:12), or one step A; got '${text}'`,
    );
  }
  if (first < 1) {
    throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `${name}: steps count from 1; got '${text}'`);
  }
  if (last < first) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `${name}: the last step (${last}) comes before the first (${first}); got '${text}'`,
    );
  }
  return { first, last };
}

/** Options of {@link ProfileStepsCallback}. */
export interface ProfileStepsOptions {
  /** The steps to profile. */
  steps: StepRange;
  /** Where `trace.json` goes; the trace is not written without it. */
  outDir?: string;
  /** Receives the table and the trace's path once the range is profiled (or the run ends inside it). */
  report?: (text: string) => void;
}

/** A Trainer callback that profiles a range of optimizer steps (see the file's description). */
export class ProfileStepsCallback implements Callback {
  readonly #steps: StepRange;
  readonly #outDir: string | undefined;
  readonly #report: (text: string) => void;
  #profiler: Profiler | null = null;
  #done: Profiler | null = null;

  constructor(options: ProfileStepsOptions) {
    const o = expectOptions<ProfileStepsOptions>('ProfileStepsCallback options', options, [
      'steps',
      'outDir',
      'report',
    ]);
    const steps = o.steps;
    if (
      typeof steps !== 'object' ||
      !Number.isSafeInteger(steps.first) ||
      !Number.isSafeInteger(steps.last) ||
      steps.first < 1 ||
      steps.last < steps.first
    ) {
      invalid('steps', '{ first, last } with 1 <= first <= last', steps);
    }
    if (o.outDir !== undefined && typeof o.outDir !== 'string') invalid('outDir', 'a folder path', o.outDir);
    if (o.report !== undefined && typeof o.report !== 'function') invalid('report', 'a function', o.report);
    this.#steps = { first: steps.first, last: steps.last };
    this.#outDir = o.outDir;
    this.#report = o.report ?? (() => undefined);
  }

  /** The profiler of the range, once it has been recorded (null before). */
  get profiler(): Profiler | null {
    return this.#done;
  }

  onStepBegin(trainer: Trainer, info: { step: number }): void {
    if (info.step !== this.#steps.first || this.#profiler) return;
    this.#profiler = new Profiler({ model: trainer.model, firstStep: info.step }).start();
  }

  onStepEnd(_trainer: Trainer, info: { step: number }): void {
    const profiler = this.#profiler;
    if (!profiler) return;
    if (info.step >= this.#steps.last) this.#finish(profiler);
    else profiler.step();
  }

  /**
   * Stops a profiler that a failed run left recording (a run that fails calls no `onFitEnd`),
   * without reporting; nothing happens otherwise.
   */
  abandon(): void {
    const profiler = this.#profiler;
    this.#profiler = null;
    try {
      profiler?.stop();
    } catch {
      // The run's own error says what went wrong.
    }
  }

  /** A run that ends inside the range reports the steps it profiled. */
  onFitEnd(): void {
    if (this.#profiler) this.#finish(this.#profiler);
  }

  #finish(profiler: Profiler): void {
    this.#profiler = null;
    profiler.stop();
    this.#done = profiler;
    let text = profiler.table();
    if (this.#outDir !== undefined) {
      const path = join(this.#outDir, 'trace.json');
      profiler.writeChromeTrace(path);
      text += `trace: ${path} (open it in https://ui.perfetto.dev or chrome://tracing)\n`;
    }
    this.#report(text);
  }
}
