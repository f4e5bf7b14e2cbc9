/**
 * The profiler: per-op timing of training steps, as torch.profiler records them. While it runs,
 * every op call site (the layers' forward and backward ops, the loss, the input conversion, the
 * optimizer and the gradient scaler) reports its calls with the op's type and the path of the
 * layer that ran it. On the CPU ops run synchronously, so the host timestamps around a call are
 * the op's time. On CUDA each op is bracketed by two timing events on the device's stream,
 * recorded without waiting and read once when the profiler stops, and by an NVTX range named after
 * the op, which Nsight Systems shows.
 * @packageDocumentation
 */
import { performance } from 'node:perf_hooks';
import { addon } from '../binding.js';
import { ResnetError, expectInt, expectOptions, invalid } from '../errors.js';
import { Module } from '../nn/module.js';
import { opRecorder, setOpRecorder, type OpRecorder } from './hooks.js';
import { formatProfileTable, summarizeProfile, type ProfileSummary, type ProfileTableOptions } from './report.js';
import { chromeTrace, writeChromeTrace, type ChromeTrace } from './chrome-trace.js';

/** Options of {@link Profiler}. */
export interface ProfilerOptions {
  /**
   * The model whose layers are named by their path (`layer1.0.conv1`), as `namedModules()` gives
   * it. Modules outside it are named by their class. When the model is on a CUDA device, `start()`
   * also waits for that device once, so that device times line up with host times.
   */
  model?: Module;
  /** The number given to the first profiled step (the trainer's step number); default 0. */
  firstStep?: number;
}

/** One recorded op call. Times are in milliseconds since {@link Profiler.start}. */
export interface ProfiledOp {
  /** The op's type, e.g. `conv2d.forward`, `batchnorm.backward`, `sgd.step`. */
  op: string;
  /** The module path (`layer1.0.conv1`), or `loss`, `input`, `optimizer`, `grad_scaler`. */
  layer: string;
  /** Where it ran (`cpu`, `cuda:0`). */
  device: string;
  /** The step it belongs to (see {@link Profiler.step}). */
  step: number;
  /** When the host called it. */
  hostStart: number;
  /** When the call returned (on CUDA: once the op was enqueued). */
  hostEnd: number;
  /** When it ran: the host call on the CPU, the op's begin event on CUDA. */
  start: number;
  /** How long it ran: the host call on the CPU, the time between its two events on CUDA. */
  duration: number;
}

/** One profiled step. Times are in milliseconds since {@link Profiler.start}. */
export interface ProfiledStep {
  /** Its number (`firstStep` + steps before it). */
  step: number;
  /** Between the step's boundaries on the host. */
  hostStart: number;
  hostEnd: number;
  /**
   * The step's time on its device: on CUDA from its first op's begin event to its last op's end
   * event; on the CPU the host span.
   */
  start: number;
  duration: number;
}

/** What a stopped profiler recorded. */
export interface ProfileResult {
  ops: ProfiledOp[];
  steps: ProfiledStep[];
  /** The devices ops ran on. */
  devices: string[];
}

/** A CUDA device's marks of the current window: the host time of its first mark, the anchor. */
interface DeviceWindow {
  anchorHost: number;
}

/**
 * Records per-op timings between {@link Profiler.start} and {@link Profiler.stop}; `step()`
 * separates steps. Only one profiler runs at a time. Without a running profiler the op call sites
 * cost one null check each.
 *
 * ```ts
 * const prof = new Profiler({ model });
 * prof.start();
 * for (let i = 0; i < 3; i++) { trainStep(); prof.step(); }
 * prof.stop();
 * console.log(prof.table());
 * prof.writeChromeTrace('trace.json');
 * ```
 */
export class Profiler implements OpRecorder {
  readonly #names = new Map<Module, string>();
  readonly #firstStep: number;
  readonly #model: Module | null;
  #state: 'new' | 'running' | 'stopped' = 'new';
  #origin = 0;
  #step = 0;
  #stepBounds: number[] = [];
  #open = -1;
  // The calls, column by column: appending numbers and shared strings keeps recording cheap.
  #ops: string[] = [];
  #layers: string[] = [];
  #devices: string[] = [];
  #stepOf: number[] = [];
  #hostStart: number[] = [];
  #hostEnd: number[] = [];
  #markBegin: number[] = [];
  #markEnd: number[] = [];
  readonly #windows = new Map<string, DeviceWindow>();
  #result: ProfileResult | null = null;

  constructor(options: ProfilerOptions = {}) {
    const o = expectOptions<ProfilerOptions>('Profiler options', options, ['model', 'firstStep']);
    if (o.model !== undefined && !(o.model instanceof Module)) invalid('model', 'a Module', o.model);
    this.#model = o.model ?? null;
    this.#firstStep = expectInt('firstStep', o.firstStep ?? 0, 0);
    if (this.#model) {
      for (const [path, m] of this.#model.namedModules()) this.#names.set(m, path === '' ? m.constructor.name : path);
    }
  }

  /** Whether it is recording. */
  get running(): boolean {
    return this.#state === 'running';
  }

  /** Starts recording. A profiler records one window: create another for the next. */
  start(): this {
    if (this.#state !== 'new') {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `Profiler.start(): this profiler has already ${this.#state === 'running' ? 'started' : 'recorded its window'}; create a new Profiler`,
      );
    }
    if (opRecorder !== null) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'Profiler.start(): another profiler is running; stop it first (one profiler records at a time)',
      );
    }
    this.#origin = performance.now();
    const device = this.#model?.device;
    if (device?.startsWith('cuda')) this.#openWindow(device);
    this.#stepBounds = [0];
    this.#state = 'running';
    setOpRecorder(this);
    return this;
  }

  /** Ends the current step and begins the next (as torch.profiler's `step()`). */
  step(): void {
    this.#expectRunning('step');
    this.#closeOpen();
    this.#stepBounds.push(performance.now() - this.#origin);
    this.#step++;
  }

  /**
   * Stops recording. On CUDA this is where the host waits for the device, once per device, and
   * reads the ops' events. A step begun since the last `step()` that ran no op is dropped.
   */
  stop(): ProfileResult {
    this.#expectRunning('stop');
    // Uninstalled first, so that a device error while closing leaves no recorder behind.
    setOpRecorder(null);
    this.#state = 'stopped';
    this.#closeOpen();
    const now = performance.now() - this.#origin;
    const times = new Map<string, Float64Array>();
    for (const device of this.#windows.keys()) times.set(device, addon().profileRead({ device }));
    const ops = this.#collectOps(times);
    let steps = this.#collectSteps(ops, now);
    const lastHasOps = ops.some((op) => op.step === this.#firstStep + this.#step);
    if (!lastHasOps && steps.length > 1) steps = steps.slice(0, -1);
    this.#result = { ops, steps, devices: [...new Set(this.#devices)] };
    this.#ops = this.#layers = this.#devices = [];
    this.#stepOf = this.#hostStart = this.#hostEnd = this.#markBegin = this.#markEnd = [];
    return this.#result;
  }

  /** What was recorded (after {@link Profiler.stop}). */
  result(): ProfileResult {
    if (!this.#result) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'Profiler.result(): call stop() first');
    }
    return this.#result;
  }

  /** Totals by op type and by layer, with each one's share of the step time. */
  summary(): ProfileSummary {
    return summarizeProfile(this.result());
  }

  /** The summary as a printable table: op types (calls, total ms, % of step), then the top layers. */
  table(options: ProfileTableOptions = {}): string {
    return formatProfileTable(this.summary(), options);
  }

  /** The recording in Chrome's Trace Event Format, which Perfetto and chrome://tracing open. */
  chromeTrace(): ChromeTrace {
    return chromeTrace(this.result());
  }

  /** Writes {@link Profiler.chromeTrace} to `path` as JSON (atomically: a temporary file, then a rename). */
  writeChromeTrace(path: string): void {
    writeChromeTrace(path, this.chromeTrace());
  }

  /** @internal Called by op call sites through {@link opRecorder}. */
  begin(op: string, layer: Module | string, device: string): number {
    if (this.#open >= 0) this.#closeOpen();
    const name = typeof layer === 'string' ? layer : this.#nameOf(layer);
    let mark = -1;
    if (device !== 'cpu') {
      // First, so that a refused mark (during graph capture) leaves no half-recorded op.
      if (!this.#windows.has(device)) this.#openWindow(device);
      mark = addon().profileMark({ device, push: `${op} ${name}` });
    }
    const index = this.#ops.length;
    this.#ops.push(op);
    this.#layers.push(name);
    this.#devices.push(device);
    this.#stepOf.push(this.#step);
    this.#hostEnd.push(NaN);
    this.#markBegin.push(mark);
    this.#markEnd.push(-1);
    this.#open = index;
    this.#hostStart.push(performance.now() - this.#origin);
    return index;
  }

  /** @internal Called by op call sites through {@link opRecorder}. */
  end(token: number): void {
    const now = performance.now() - this.#origin;
    if (token !== this.#open) return;
    this.#hostEnd[token] = now;
    const device = this.#devices[token]!;
    if (device !== 'cpu') this.#markEnd[token] = addon().profileMark({ device, pop: true });
    this.#open = -1;
  }

  /** Ends an op whose `end` never came (it threw), so that its NVTX range closes too. */
  #closeOpen(): void {
    if (this.#open >= 0) this.end(this.#open);
  }

  /**
   * Waits for `device` once and records the window's first mark, whose device time is then the
   * host's: every later mark is placed on the host's clock from its time after this one.
   */
  #openWindow(device: string): void {
    addon().synchronize({ device });
    const anchorHost = performance.now() - this.#origin;
    addon().profileMark({ device });
    this.#windows.set(device, { anchorHost });
  }

  #nameOf(module: Module): string {
    let name = this.#names.get(module);
    if (name === undefined) {
      name = module.constructor.name;
      this.#names.set(module, name);
    }
    return name;
  }

  #collectOps(times: Map<string, Float64Array>): ProfiledOp[] {
    const ops: ProfiledOp[] = [];
    for (let i = 0; i < this.#ops.length; i++) {
      const device = this.#devices[i]!;
      const hostStart = this.#hostStart[i]!;
      const hostEnd = this.#hostEnd[i]!;
      let start = hostStart;
      let duration = hostEnd - hostStart;
      const deviceTimes = times.get(device);
      if (deviceTimes) {
        const anchor = this.#windows.get(device)?.anchorHost ?? 0;
        const begin = deviceTimes[this.#markBegin[i]!] ?? NaN;
        const end = deviceTimes[this.#markEnd[i]!] ?? NaN;
        start = anchor + begin;
        duration = end - begin;
      }
      ops.push({
        op: this.#ops[i]!,
        layer: this.#layers[i]!,
        device,
        step: this.#firstStep + this.#stepOf[i]!,
        hostStart,
        hostEnd,
        start,
        duration,
      });
    }
    return ops;
  }

  #collectSteps(ops: readonly ProfiledOp[], now: number): ProfiledStep[] {
    const bounds = [...this.#stepBounds, now];
    const steps: ProfiledStep[] = [];
    for (let i = 0; i + 1 < bounds.length; i++) {
      const step = this.#firstStep + i;
      const hostStart = bounds[i]!;
      const hostEnd = bounds[i + 1]!;
      let start = hostStart;
      let end = hostEnd;
      const onDevice = ops.filter((op) => op.step === step && op.device !== 'cpu');
      if (onDevice.length > 0) {
        start = Math.min(...onDevice.map((op) => op.start));
        end = Math.max(...onDevice.map((op) => op.start + op.duration));
      }
      steps.push({ step, hostStart, hostEnd, start, duration: end - start });
    }
    return steps;
  }

  #expectRunning(what: string): void {
    if (this.#state !== 'running') {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `Profiler.${what}(): the profiler is not running (${this.#state === 'new' ? 'call start() first' : 'it was stopped'})`,
      );
    }
  }
}
