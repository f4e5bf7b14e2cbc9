/**
 * The Trainer's `cudaGraph` option: which steps run as a replayed CUDA graph and which eagerly,
 * and why. The configuration is checked once per `fit` (a CPU device, gradient accumulation, a
 * moving average... train eagerly, said once); the first `warmup` steps run eagerly (algorithm
 * choice, buffers, the first momentum), then the step is captured and replayed. A batch of another
 * shape (a ragged last batch) runs eagerly and the graph is reused afterwards. A capture that fails
 * leaves the run eager, with the capture's message. Every reason is said once.
 * @packageDocumentation
 */
import type { DeviceBatch } from './batches.js';
import { CapturedStep, type StepParts } from './graph-step.js';

/** What CUDA graph training did in the last (or current) `fit`. */
export interface CudaGraphStats {
  /** Captures made (one, unless the trained parameters changed). */
  captures: number;
  /** Steps run by replaying the graph. */
  replays: number;
  /** Steps run eagerly (warm-up, batches of another shape, or all of them when not captured). */
  eagerSteps: number;
  /** Why steps ran eagerly, each once, in the order they were first met. */
  reasons: string[];
}

/** Decides and runs the graphed steps of a `fit`; see the module documentation. */
export class GraphMode {
  readonly #warmup: number;
  readonly #notify: (reason: string) => void;
  #blocked: string | null = null;
  #captured: CapturedStep | null = null;
  #stats: CudaGraphStats = { captures: 0, replays: 0, eagerSteps: 0, reasons: [] };

  /**
   * @param warmup - eager steps before the capture (at least 1).
   * @param notify - tells the user a reason for eager steps (called once per reason).
   */
  constructor(warmup: number, notify: (reason: string) => void) {
    this.#warmup = warmup;
    this.#notify = notify;
  }

  /** What this fit did so far. */
  get stats(): CudaGraphStats {
    return { ...this.#stats, reasons: [...this.#stats.reasons] };
  }

  /**
   * Starts a `fit`: `blocker` is why its configuration cannot be captured (null when it can), said
   * once; every step of the fit then runs eagerly.
   */
  begin(blocker: string | null): void {
    this.end();
    this.#stats = { captures: 0, replays: 0, eagerSteps: 0, reasons: [] };
    this.#blocked = blocker;
    if (blocker !== null) this.#say(blocker);
  }

  /**
   * Runs the step of `batch` as a replayed graph, capturing it first when due; false when this step
   * must run eagerly (the host is then synchronised with the replays before it, so the eager step
   * sees their step count and scale). `stepsDone` is the optimizer steps the fit ran so far;
   * `parts` makes the step's parts (called only to capture).
   */
  tryStep(batch: DeviceBatch, parts: () => StepParts, optimizerSteps: number): boolean {
    if (this.#blocked !== null || this.#stats.eagerSteps < this.#warmup || optimizerSteps === 0) {
      return this.#eager();
    }
    let captured = this.#captured;
    if (captured && !sameShape(captured, batch)) {
      this.#say(
        `cudaGraph: a batch of shape [${batch.images.shape.join(', ')}] runs eagerly (the captured step takes [${captured.inputShape.join(', ')}])`,
      );
      return this.#eager();
    }
    if (captured && !captured.sameParameters()) {
      // The trained parameters or their groups changed: the graph's optimizer table is stale.
      this.#say('cudaGraph: the trained parameters changed (freezing, groups); the step is captured again');
      captured.sync();
      captured.dispose();
      this.#captured = captured = null;
    }
    if (!captured) {
      try {
        captured = this.#captured = CapturedStep.capture(parts(), batch);
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        this.#blocked = `cudaGraph: the step could not be captured (${message}); training eagerly`;
        this.#say(this.#blocked);
        return this.#eager();
      }
      this.#stats.captures++;
    }
    captured.run(batch);
    this.#stats.replays++;
    return true;
  }

  /** Brings the host up to date with the replays (step count, loss scale); one synchronisation when any ran. */
  sync(): void {
    this.#captured?.sync();
  }

  /** Ends the fit's graph: synchronises and frees it. */
  end(): void {
    const captured = this.#captured;
    this.#captured = null;
    if (!captured) return;
    try {
      captured.sync();
    } finally {
      captured.dispose();
    }
  }

  #eager(): false {
    this.#captured?.sync();
    this.#stats.eagerSteps++;
    return false;
  }

  #say(reason: string): void {
    if (this.#stats.reasons.includes(reason)) return;
    this.#stats.reasons.push(reason);
    this.#notify(reason);
  }
}

function sameShape(captured: CapturedStep, batch: DeviceBatch): boolean {
  const shape = captured.inputShape;
  const other = batch.images.shape;
  if (shape.length !== other.length) return false;
  return shape.every((d, i) => d === other[i]);
}
