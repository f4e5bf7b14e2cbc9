/**
 * What the Trainer watches after each evaluation: the best value of a metric (which picks the best
 * checkpoint) and early stopping. Both are plain state saved in checkpoints.
 * @packageDocumentation
 */

/** Whether a monitored metric is better when lower or higher. */
export type MetricMode = 'min' | 'max';

/** `'min'` for metrics ending in `loss`, else `'max'`. */
export function defaultMode(monitor: string): MetricMode {
  return monitor.endsWith('loss') ? 'min' : 'max';
}

/** Whether `value` beats `best` (none yet: any finite value does) by more than `minDelta`. */
export function improves(value: number, best: number | null, mode: MetricMode, minDelta: number): boolean {
  if (!Number.isFinite(value)) return false;
  if (best === null) return true;
  return mode === 'max' ? value > best + minDelta : value < best - minDelta;
}

/** The best value of a metric so far and the epoch that reached it. */
export interface BestValue {
  monitor: string;
  value: number;
  epoch: number;
}

/** Tracks the best value of one metric. */
export class BestMetric {
  #best: BestValue | null = null;

  constructor(
    readonly monitor: string,
    readonly mode: MetricMode,
  ) {}

  /** The best so far, or null. */
  get best(): BestValue | null {
    return this.#best;
  }

  /** Takes a saved best; one kept for another metric does not carry over. */
  restore(saved: BestValue | null): void {
    this.#best = saved?.monitor === this.monitor ? saved : null;
  }

  /** Records the epoch's metrics; true when the monitored one improved on the best. */
  update(metrics: Record<string, number>, epoch: number): boolean {
    const value = metrics[this.monitor];
    if (value === undefined || !improves(value, this.#best?.value ?? null, this.mode, 0)) return false;
    this.#best = { monitor: this.monitor, value, epoch };
    return true;
  }
}

/** Options of early stopping, resolved. */
export interface EarlyStoppingSettings {
  monitor: string;
  patience: number;
  minDelta: number;
  mode: MetricMode;
}

/** The state of early stopping: the best value seen and evaluations since it improved. */
export interface EarlyStoppingState {
  best: number | null;
  bad: number;
}

/** Stops a run when a metric has not improved by `minDelta` in `patience` evaluations. */
export class EarlyStopping {
  #state: EarlyStoppingState = { best: null, bad: 0 };

  constructor(readonly settings: EarlyStoppingSettings) {}

  get state(): EarlyStoppingState {
    return this.#state;
  }

  /** Takes a saved state when it was kept for the same metric, else starts over. */
  restore(saved: EarlyStoppingState | null, monitor: string | null): void {
    this.#state = saved && monitor === this.settings.monitor ? { ...saved } : { best: null, bad: 0 };
  }

  /** Records the epoch's metrics; true when the run should stop. */
  update(metrics: Record<string, number>): boolean {
    const value = metrics[this.settings.monitor];
    if (value === undefined) return false;
    const { best, bad } = this.#state;
    this.#state = improves(value, best, this.settings.mode, this.settings.minDelta)
      ? { best: value, bad: 0 }
      : { best, bad: bad + 1 };
    return this.#state.bad >= this.settings.patience;
  }
}
