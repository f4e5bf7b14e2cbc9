/**
 * Training logs: a JSON-lines file of metrics (one object per line, readable while the run goes
 * on), a console progress bar, and a compact duration format.
 * @packageDocumentation
 */
import { closeSync, mkdirSync, openSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import { ResnetError, expectInt, expectNumber, expectOptions, invalid } from '../../errors.js';

/**
 * Appends one JSON object per line to a file, each written with one system call as soon as it is
 * logged, so `tail -f`, a crash or a concurrent reader sees every complete line. JSON has no NaN or
 * Infinity: such numbers are written as `null`, as `JSON.stringify` does.
 */
export class JsonLinesLogger {
  /** The file appended to. */
  readonly path: string;
  #fd: number | null;

  /**
   * Opens (creating it and its directory if needed) `path` for appending.
   * @param path - e.g. `runs/exp1/metrics.jsonl`.
   */
  constructor(path: string) {
    if (typeof path !== 'string' || path.length === 0) invalid('path', 'a non-empty file path', path);
    mkdirSync(dirname(path), { recursive: true });
    this.path = path;
    this.#fd = openSync(path, 'a');
  }

  /**
   * Writes `record` as one line.
   * @param record - a plain object, e.g. `{ epoch: 3, step: 1200, loss: 1.25, lr: 0.1 }`.
   */
  log(record: Record<string, unknown>): void {
    if (this.#fd === null) {
      throw new ResnetError('ERR_RC_DISPOSED', `JsonLinesLogger.log: the logger for ${this.path} has been closed`);
    }
    if (record === null || typeof record !== 'object' || Array.isArray(record)) {
      invalid('record', 'a plain object', record);
    }
    // A single write of the whole line keeps lines whole even with other appenders (O_APPEND).
    writeSync(this.#fd, JSON.stringify(record) + '\n');
  }

  /** Closes the file; closing again does nothing. */
  close(): void {
    if (this.#fd === null) return;
    closeSync(this.#fd);
    this.#fd = null;
  }

  /** Whether {@link JsonLinesLogger.close} has been called. */
  get closed(): boolean {
    return this.#fd === null;
  }
}

/**
 * A duration as `m:ss`, `h:mm:ss` or `Nd h:mm:ss`, rounded to the second (`formatDuration(3725)` is
 * `"1:02:05"`). Negative values count as 0; NaN and infinities (an unknown ETA) give `"--:--"`.
 * @param seconds - the duration in seconds.
 */
export function formatDuration(seconds: number): string {
  if (typeof seconds !== 'number') invalid('seconds', 'a number', seconds);
  if (!Number.isFinite(seconds)) return '--:--';
  let s = Math.max(0, Math.round(seconds));
  const days = Math.floor(s / 86400);
  s -= days * 86400;
  const h = Math.floor(s / 3600);
  s -= h * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  const ss = String(s).padStart(2, '0');
  if (days > 0) return `${days}d ${h}:${String(m).padStart(2, '0')}:${ss}`;
  if (h > 0) return `${h}:${String(m).padStart(2, '0')}:${ss}`;
  return `${m}:${ss}`;
}

/** Where a {@link ProgressBar} writes: `process.stderr` or anything with `write` (and, for a terminal, `isTTY`). */
export interface ProgressStream {
  write(text: string): unknown;
  /** True for a terminal, where the bar redraws one line in place. */
  isTTY?: boolean;
  /** Terminal width; lines are cut to fit so that redrawing in place works. */
  columns?: number;
}

/** What a {@link ProgressBar} line shows besides the step; every field is optional. */
export interface ProgressInfo {
  /** Current epoch, 1-based. */
  epoch?: number;
  /** Number of epochs. */
  epochs?: number;
  /** Latest (or smoothed) loss. */
  loss?: number;
  /** Current learning rate. */
  lr?: number;
  /** Throughput; when absent it is computed from the `batchSize` option. */
  imagesPerSec?: number;
  /** Further values to show, by name (e.g. `{ acc1: 0.71 }`). */
  metrics?: Record<string, number>;
}

/** Options of {@link ProgressBar}. */
export interface ProgressBarOptions {
  /** Steps in the run (or the epoch) being tracked. */
  total: number;
  /**
   * Steps already done before this bar started (a run resumed inside an epoch); img/s and the time
   * left count only the steps done since. Default 0.
   */
  initial?: number;
  /** Where to write; default `process.stderr`. */
  stream?: ProgressStream;
  /** Printed at the start of each line, e.g. "train" or "val". */
  label?: string;
  /**
   * When the stream is not a terminal, print a line every this many steps; 0 prints only the final
   * line. Default: about ten lines over `total`.
   */
  printEvery?: number;
  /** Images per step, to compute img/s when updates do not give `imagesPerSec`. */
  batchSize?: number;
  /** On a terminal, the least time between redraws in milliseconds; default 100. */
  minIntervalMs?: number;
  /** Clock in milliseconds; default `performance.now`. For tests. */
  now?: () => number;
}

const BAR_WIDTH = 20;

/**
 * A progress line for training or evaluation: epoch, step, loss, lr, img/s and the estimated time
 * left. On a terminal it redraws one line in place (throttled); otherwise (a log file, CI) it
 * prints a plain line every `printEvery` steps, and always a final line from
 * {@link ProgressBar.finish}.
 */
export class ProgressBar {
  readonly total: number;
  readonly printEvery: number;
  readonly label: string;
  #stream: ProgressStream;
  #tty: boolean;
  #batchSize: number | undefined;
  #minInterval: number;
  #now: () => number;
  #start: number;
  #initial: number;
  #lastDraw = -Infinity;
  #current = 0;
  #info: ProgressInfo = {};
  #finished = false;

  constructor(options: ProgressBarOptions) {
    const o = expectOptions<ProgressBarOptions>('ProgressBar options', options, [
      'total',
      'initial',
      'stream',
      'label',
      'printEvery',
      'batchSize',
      'minIntervalMs',
      'now',
    ]);
    this.total = expectInt('ProgressBar options.total', o.total, 1);
    this.#initial = expectInt('ProgressBar options.initial', o.initial ?? 0, 0, this.total);
    this.#current = this.#initial;
    this.#stream = o.stream ?? process.stderr;
    if (this.#stream === null || typeof this.#stream !== 'object' || typeof this.#stream.write !== 'function') {
      invalid('ProgressBar options.stream', 'a writable stream', o.stream);
    }
    this.#tty = this.#stream.isTTY === true;
    this.label = o.label ?? '';
    if (typeof this.label !== 'string') invalid('ProgressBar options.label', 'a string', o.label);
    this.printEvery = expectInt(
      'ProgressBar options.printEvery',
      o.printEvery ?? Math.max(1, Math.ceil(this.total / 10)),
      0,
    );
    this.#batchSize =
      o.batchSize === undefined ? undefined : expectInt('ProgressBar options.batchSize', o.batchSize, 1);
    this.#minInterval = expectNumber('ProgressBar options.minIntervalMs', o.minIntervalMs ?? 100, 0);
    if (o.now !== undefined && typeof o.now !== 'function') {
      invalid('ProgressBar options.now', 'a function returning milliseconds', o.now);
    }
    this.#now = o.now ?? (() => performance.now());
    this.#start = this.#now();
  }

  /**
   * Records progress and redraws or prints as the stream calls for.
   * @param current - steps done, 0 to `total`.
   * @param info - values to show; fields left out keep their previous values.
   */
  update(current: number, info?: ProgressInfo): void {
    if (this.#finished) {
      throw new ResnetError('ERR_RC_DISPOSED', 'ProgressBar.update: the bar has finished; create a new ProgressBar');
    }
    this.#current = expectInt('current', current, 0, this.total);
    if (info !== undefined) this.#merge(info);
    const now = this.#now();
    if (this.#tty) {
      if (now - this.#lastDraw < this.#minInterval && current !== this.total) return;
      this.#lastDraw = now;
      this.#stream.write(`\r${this.#cut(this.line(now))}\x1b[K`);
    } else if (this.printEvery > 0 && current > 0 && current % this.printEvery === 0 && current !== this.total) {
      // The step that completes the bar is left to finish(), which prints the final line once.
      this.#stream.write(this.line(now) + '\n');
    }
  }

  /**
   * Prints the final line (with the elapsed time instead of an ETA) and ends it; calling it again
   * does nothing.
   * @param info - last values to show.
   */
  finish(info?: ProgressInfo): void {
    if (this.#finished) return;
    if (info !== undefined) this.#merge(info);
    this.#finished = true;
    const text = this.line(this.#now(), true);
    this.#stream.write(this.#tty ? `\r${this.#cut(text)}\x1b[K\n` : `${text}\n`);
  }

  /**
   * The text of the current line (without the terminal's control characters).
   * @param now - the clock's time, default now.
   * @param final - show the elapsed time instead of the ETA.
   */
  line(now = this.#now(), final = false): string {
    const parts: string[] = [];
    if (this.label) parts.push(this.label);
    const info = this.#info;
    if (info.epoch !== undefined) {
      parts.push(info.epochs !== undefined ? `epoch ${info.epoch}/${info.epochs}` : `epoch ${info.epoch}`);
    }
    const width = String(this.total).length;
    parts.push(`step ${String(this.#current).padStart(width)}/${this.total}`);
    const fraction = this.#current / this.total;
    if (this.#tty) {
      const filled = Math.round(fraction * BAR_WIDTH);
      parts.push(`[${'#'.repeat(filled)}${'.'.repeat(BAR_WIDTH - filled)}]`);
    }
    parts.push(`${String(Math.floor(fraction * 100)).padStart(3)}%`);
    if (info.loss !== undefined) parts.push(`loss ${formatValue(info.loss)}`);
    if (info.lr !== undefined) parts.push(`lr ${formatLr(info.lr)}`);
    for (const [k, v] of Object.entries(info.metrics ?? {})) parts.push(`${k} ${formatValue(v)}`);
    const elapsed = Math.max(0, (now - this.#start) / 1000);
    const rate = elapsed > 0 ? (this.#current - this.#initial) / elapsed : NaN;
    const ips =
      info.imagesPerSec ??
      (this.#batchSize !== undefined && Number.isFinite(rate) ? rate * this.#batchSize : undefined);
    if (ips !== undefined && Number.isFinite(ips)) parts.push(`${Math.round(ips)} img/s`);
    if (final) parts.push(`time ${formatDuration(elapsed)}`);
    else parts.push(`ETA ${formatDuration(rate > 0 ? (this.total - this.#current) / rate : NaN)}`);
    return parts.join(' ');
  }

  #merge(info: ProgressInfo): void {
    if (info === null || typeof info !== 'object') invalid('info', 'an object of values to show', info);
    expectOptions<ProgressInfo>('info', info, ['epoch', 'epochs', 'loss', 'lr', 'imagesPerSec', 'metrics']);
    this.#info = { ...this.#info, ...info };
  }

  /** Cuts a line to the terminal's width, since a wrapped line cannot be redrawn in place. */
  #cut(text: string): string {
    const cols = this.#stream.columns;
    return cols !== undefined && cols > 1 && text.length > cols - 1 ? text.slice(0, cols - 1) : text;
  }
}

/** A loss or metric: four decimals, or exponent form when tiny or huge. */
function formatValue(v: number): string {
  if (!Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : v.toFixed(4);
}

/** A learning rate: three significant digits, exponent form below 1e-3. */
function formatLr(v: number): string {
  if (!Number.isFinite(v)) return String(v);
  return v !== 0 && Math.abs(v) < 1e-3 ? v.toExponential(2) : String(Number(v.toPrecision(3)));
}
