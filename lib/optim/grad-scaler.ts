/**
 * Dynamic loss scaling for mixed-precision training, with the API and semantics of
 * `torch.amp.GradScaler`: the scale, the found-inf flag and the growth tracker live on the
 * device, the optimizer skips a step with inf/NaN gradients on the device, and the scale backs off
 * on overflow and grows after a run of clean steps.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { ResnetError, defined, expectBool, expectInt, expectNumber, expectOptions, invalid } from '../errors.js';
import { fusedPathOn } from '../fused-paths.js';
import { opRecorder } from '../profile/hooks.js';
import { Tensor } from '../tensor.js';
import type { ParameterArena } from '../nn/parameter.js';
import type { FusedScaleUpdate, OptimizerStepOptions } from './optimizer.js';

/** Options of {@link GradScaler}, with PyTorch's defaults. */
export interface GradScalerOptions {
  /** The first scale; default 65536 (2^16). */
  initScale?: number;
  /** Multiplies the scale after `growthInterval` clean steps in a row; default 2. */
  growthFactor?: number;
  /** Multiplies the scale after a step with inf/NaN gradients; default 0.5. */
  backoffFactor?: number;
  /** Clean steps before the scale grows; default 2000. */
  growthInterval?: number;
  /** false: every method passes through (scale 1, no unscaling, plain steps); default true. */
  enabled?: boolean;
}

/** A GradScaler's checkpoint (PyTorch's `state_dict` keys, in camelCase). */
export interface GradScalerState {
  scale: number;
  growthFactor: number;
  backoffFactor: number;
  growthInterval: number;
  growthTracker: number;
}

/** What {@link GradScaler.stepAndZeroGrad} needs of an optimizer besides {@link ScalerOptimizer}; every {@link Optimizer} has it. */
export interface FusableOptimizer {
  /** Whether `step({ fused })` is taken. */
  readonly supportsFusedStep: boolean;
  /** Whether the stepped gradients are the whole arena's (so zeroing them is zeroGrad's work). */
  stepsWholeArena(): boolean;
  /** Zeroes the gradients of the optimizer's parameters. */
  zeroGrad(): void;
}

/** What the scaler needs of an optimizer; every {@link Optimizer} has it. */
export interface ScalerOptimizer {
  arena(): ParameterArena;
  segmentTable(): Int32Array;
  step(options?: OptimizerStepOptions): void;
  stepSkipped(): void;
}

/** A GradScaler's device state, as a captured step reads it. */
export interface ScalerDeviceState {
  /** f32[1]: the current scale. */
  scale: Tensor;
  /** f32[1]: 1 when the last unscaled gradients held inf/NaN, else 0. */
  foundInf: Tensor;
}

function positive(name: string, value: unknown): number {
  const n = expectNumber(name, value);
  if (!(n > 0)) invalid(name, 'a positive finite number', value);
  return n;
}

/** Anything whose loss gradient can be scaled, such as {@link CrossEntropyLoss}. */
export interface ScalableLoss {
  gradScale: number;
}

/** The GradScaler's device state (see the fields' comment). */
interface ScalerTensors {
  flags: Tensor;
  scaleView: Tensor;
  foundInfView: Tensor;
  tracker: Tensor;
}

/**
 * Loss scaling for fp16/bf16 training, in PyTorch's shape:
 *
 * ```ts
 * const scaler = new GradScaler();
 * // every step:
 * scaler.scale(loss);                    // loss.gradScale = the current scale
 * loss.forward(model.forward(x), labels);
 * model.backward(loss.backward());
 * scaler.unscale(optimizer);             // optional: only needed to clip
 * clipGradNorm(model, 1.0);
 * scaler.step(optimizer);                // skipped on the device if a gradient is inf/NaN
 * scaler.update();
 * optimizer.zeroGrad();
 * ```
 *
 * The scale, the found-inf flag and the growth tracker are device tensors, updated by
 * `scalerUpdate` on the device; unscaling and the skip happen on the device too. The loss takes
 * its gradient scale as a host number, though, so {@link GradScaler.update} reads the new scale
 * and the found-inf flag back (8 bytes, one host synchronisation per step, the same one PyTorch's
 * GradScaler makes in `step()` for optimizers without fused AMP support) into the host mirror
 * {@link GradScaler.lossScale}. That read also tells the optimizers whose step was skipped, so
 * that their step counts stay as PyTorch's. Not for CUDA graph capture.
 *
 * One found-inf flag serves all optimizers stepped in a step: an overflow in any gradient
 * unscaled in that step skips every optimizer stepped after it was unscaled.
 */
export class GradScaler {
  /** Whether scaling is on. */
  readonly enabled: boolean;
  readonly #growthFactor: number;
  readonly #backoffFactor: number;
  readonly #growthInterval: number;
  #scale: number;
  #growthTracker = 0;
  #skipped = false;
  // Device state, made on first use on the optimizer's device: [scale, foundInf] in one f32[2]
  // tensor so that update() reads both with one copy; the growth tracker as i32[1].
  #dev: ScalerTensors | null = null;
  readonly #unscaled = new Set<ScalerOptimizer>();
  readonly #stepped = new Set<ScalerOptimizer>();

  constructor(options: GradScalerOptions = {}) {
    const o = expectOptions<GradScalerOptions>('GradScaler options', options, [
      'initScale',
      'growthFactor',
      'backoffFactor',
      'growthInterval',
      'enabled',
    ]);
    this.#scale = Math.fround(positive('initScale', o.initScale ?? 65536));
    this.#growthFactor = expectNumber('growthFactor', o.growthFactor ?? 2, 1);
    if (this.#growthFactor <= 1) invalid('growthFactor', 'a number above 1', o.growthFactor);
    this.#backoffFactor = positive('backoffFactor', o.backoffFactor ?? 0.5);
    if (this.#backoffFactor >= 1) invalid('backoffFactor', 'a number in (0, 1)', o.backoffFactor);
    this.#growthInterval = expectInt('growthInterval', o.growthInterval ?? 2000, 1, 0x7fffffff);
    this.enabled = expectBool('enabled', o.enabled ?? true);
  }

  /**
   * The current scale as a host number (1 when disabled); no synchronisation. It is refreshed
   * by every {@link GradScaler.update}, so it is exact at the start of each step.
   */
  get lossScale(): number {
    return this.enabled ? this.#scale : 1;
  }

  /** Sets `loss.gradScale` to the current scale times `multiplier` (e.g. 1/k when accumulating k micro-batches). */
  scale(loss: ScalableLoss, multiplier = 1): void {
    if (loss === null || typeof loss !== 'object' || typeof loss.gradScale !== 'number') {
      invalid('loss', 'a loss with a numeric gradScale', loss);
    }
    loss.gradScale = this.lossScale * expectNumber('multiplier', multiplier, 0);
  }

  /**
   * Divides the optimizer's gradients by the scale in place and records whether any is inf or
   * NaN (on the device). Call it before clipping; {@link GradScaler.step} calls it otherwise.
   */
  unscale(optimizer: ScalerOptimizer): void {
    if (!this.enabled) return;
    if (this.#unscaled.has(optimizer)) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'GradScaler.unscale() has already been called on this optimizer since the last update()',
      );
    }
    if (this.#stepped.has(optimizer)) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'GradScaler.unscale() must come before step() for this optimizer',
      );
    }
    const arena = optimizer.arena();
    const dev = this.#ensureDevice(arena.device);
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('amp.unscale', 'grad_scaler', arena.device) : 0;
    // The flag is cleared once per step, by the first unscale after update().
    if (this.#unscaled.size === 0) addon().fill({ tensor: dev.foundInfView.raw, value: 0 });
    addon().unscaleAndCheck({
      grads: arena.grads.raw,
      invScale: 1 / this.#scale,
      foundInf: dev.foundInfView.raw,
      segments: optimizer.segmentTable(),
    });
    recorder?.end(token);
    this.#unscaled.add(optimizer);
  }

  /**
   * Unscales the gradients (unless {@link GradScaler.unscale} already did) and steps the
   * optimizer, which skips the update on the device when a gradient was inf or NaN.
   */
  step(optimizer: ScalerOptimizer): void {
    if (!this.enabled) {
      optimizer.step();
      return;
    }
    if (this.#stepped.has(optimizer)) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'GradScaler.step() has already been called on this optimizer since the last update()',
      );
    }
    if (!this.#unscaled.has(optimizer)) this.unscale(optimizer);
    optimizer.step({ foundInf: this.#unscaledState().foundInfView });
    this.#stepped.add(optimizer);
  }

  /**
   * Updates the scale on the device (back off after inf/NaN, grow after `growthInterval` clean
   * steps), or sets it to `newScale`; then reads the scale and the found-inf flag to the host
   * (one synchronisation), refreshing {@link GradScaler.lossScale}.
   */
  update(newScale?: number): void {
    if (!this.enabled) return;
    if (this.#unscaled.size === 0) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'GradScaler.update(): no gradients were unscaled since the last update(); call step() first',
      );
    }
    const dev = this.#unscaledState();
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('amp.update_scale', 'grad_scaler', dev.scaleView.device) : 0;
    if (newScale !== undefined) {
      addon().fill({ tensor: dev.scaleView.raw, value: positive('newScale', newScale) });
    } else {
      this.#updateScaleOnDevice(dev);
    }
    this.#settle(dev, recorder, token);
  }

  /**
   * {@link GradScaler.step}, {@link GradScaler.update} and `optimizer.zeroGrad()` in one call,
   * the end of a training step. With the `optim` fused path on (see lib/fused-paths.ts), a CUDA
   * arena and an optimizer that has a fused step (SGD, AdamW, LAMB), the check, the update, the
   * scale update and the zeroing run as one fused op (a check pass and the update pass, LAMB's
   * three; without loss scaling the update passes alone); otherwise the three calls run as they
   * are. Either way the parameters, the optimizer state, the scale and the gradients end the same
   * (bit for bit on the emulated device; within f32 rounding of a fused multiply-add on a GPU).
   */
  stepAndZeroGrad(optimizer: ScalerOptimizer & FusableOptimizer): void {
    const arena = optimizer.arena();
    if (!fusedPathOn('optim', arena.device) || !optimizer.supportsFusedStep) {
      this.step(optimizer);
      this.update();
      optimizer.zeroGrad();
      return;
    }
    const zeroGrads = optimizer.stepsWholeArena();
    if (!this.enabled) {
      optimizer.step({ fused: { checkFinite: false, zeroGrads } });
    } else {
      if (this.#stepped.has(optimizer)) {
        throw new ResnetError(
          'ERR_RC_INVALID_ARGUMENT',
          'GradScaler.stepAndZeroGrad(): step() has already been called on this optimizer since the last update()',
        );
      }
      const dev = this.#ensureDevice(arena.device);
      const unscaled = this.#unscaled.has(optimizer);
      const recorder = opRecorder;
      const token = recorder ? recorder.begin('amp.fused_step', 'grad_scaler', arena.device) : 0;
      if (this.#unscaled.size === 0) addon().fill({ tensor: dev.foundInfView.raw, value: 0 });
      optimizer.step({
        foundInf: dev.foundInfView,
        // Gradients unscale() has already unscaled (and checked) are read as they are.
        gradScaleInv: unscaled ? 1 : 1 / this.#scale,
        fused: {
          checkFinite: !unscaled,
          zeroGrads,
          scaleUpdate: this.#scaleUpdate(dev),
        },
      });
      this.#unscaled.add(optimizer);
      this.#stepped.add(optimizer);
      this.#settle(dev, recorder, token);
    }
    if (!zeroGrads) optimizer.zeroGrad();
  }

  // The end of update(): the scale and the found-inf flag read back (one synchronisation), the
  // skipped steps uncounted, the step's bookkeeping cleared.
  #settle(dev: ScalerTensors, recorder: typeof opRecorder, token: number): void {
    const flags = dev.flags.toFloat32Array();
    recorder?.end(token);
    this.#scale = flags[0]!;
    this.#skipped = flags[1]! !== 0;
    if (this.#skipped) for (const optimizer of this.#stepped) optimizer.stepSkipped();
    this.#unscaled.clear();
    this.#stepped.clear();
  }

  /**
   * Forgets a step left half-way (after `unscale` or `step`, before `update`), e.g. by an error in
   * a training loop, so that the next step starts clean. The gradients stay as they are: zero them.
   */
  abandonStep(): void {
    this.#unscaled.clear();
    this.#stepped.clear();
  }

  /**
   * The device tensors of the scale and the found-inf flag on `device` (made there when missing),
   * for a step captured in a CUDA graph: the loss reads its gradient scale from `scale`
   * (`gradScaleFrom`) and {@link GradScaler.stepOnDevice} does the rest.
   */
  deviceState(device: string): ScalerDeviceState {
    const dev = this.#ensureDevice(device);
    return { scale: dev.scaleView, foundInf: dev.foundInfView };
  }

  /**
   * The whole update of a step with nothing read back, so that it can be captured in a CUDA graph:
   * clears the found-inf flag, unscales the gradients by the device's scale, steps the optimizer
   * (skipped on the device on inf/NaN) and updates the scale on the device. `afterUnscale` runs
   * between the unscale and the optimizer step (gradient clipping); `stepCount` goes to the
   * optimizer's step. The host mirror {@link GradScaler.lossScale} and the
   * optimizer's skipped steps are brought up to date by {@link GradScaler.refreshFromDevice}.
   * Disabled, it steps the optimizer only.
   */
  stepOnDevice(optimizer: ScalerOptimizer, options: { stepCount?: Tensor; afterUnscale?: () => void } = {}): void {
    const { afterUnscale, ...stepOptions } = options;
    if (!this.enabled) {
      afterUnscale?.();
      optimizer.step(stepOptions);
      return;
    }
    this.#checkNoStepInProgress('stepOnDevice');
    const dev = this.#ensureDevice(optimizer.arena().device);
    addon().fill({ tensor: dev.foundInfView.raw, value: 0 });
    this.#unscaleOnDevice(optimizer, dev);
    afterUnscale?.();
    optimizer.step({ ...stepOptions, foundInf: dev.foundInfView });
    this.#updateScaleOnDevice(dev);
  }

  /**
   * {@link GradScaler.stepOnDevice} and `optimizer.zeroGrad()`, the end of a step captured in a CUDA
   * graph. With the `optim` fused path on, a CUDA arena and an optimizer that has a fused step,
   * the check, the unscale by the device's scale, the update, the scale update and the zeroing
   * run as one fused op (with `afterUnscale`, the unscale runs before it as it does unfused, and
   * the fused op reads the unscaled gradients); the result is the unfused sequence's.
   */
  stepOnDeviceAndZeroGrad(
    optimizer: ScalerOptimizer & FusableOptimizer,
    options: { stepCount?: Tensor; afterUnscale?: () => void } = {},
  ): void {
    const arena = optimizer.arena();
    if (!fusedPathOn('optim', arena.device) || !optimizer.supportsFusedStep) {
      this.stepOnDevice(optimizer, options);
      optimizer.zeroGrad();
      return;
    }
    const { afterUnscale, stepCount } = options;
    const zeroGrads = optimizer.stepsWholeArena();
    const count = stepCount ? { stepCount } : {};
    if (!this.enabled) {
      afterUnscale?.();
      optimizer.step({ ...count, fused: { checkFinite: false, zeroGrads } });
    } else {
      this.#checkNoStepInProgress('stepOnDeviceAndZeroGrad');
      const dev = this.#ensureDevice(arena.device);
      addon().fill({ tensor: dev.foundInfView.raw, value: 0 });
      if (afterUnscale) {
        this.#unscaleOnDevice(optimizer, dev);
        afterUnscale();
      }
      optimizer.step({
        ...count,
        foundInf: dev.foundInfView,
        fused: {
          checkFinite: !afterUnscale,
          zeroGrads,
          scaleUpdate: this.#scaleUpdate(dev),
          scaleFromDevice: !afterUnscale,
        },
      });
    }
    if (!zeroGrads) optimizer.zeroGrad();
  }

  /**
   * Reads the scale and the last step's found-inf flag from the device (one synchronisation) into
   * {@link GradScaler.lossScale} and {@link GradScaler.skippedLastStep}, after steps that ran on the
   * device alone ({@link GradScaler.stepOnDevice} in a replayed graph).
   */
  refreshFromDevice(): void {
    if (!this.enabled || !this.#dev) return;
    const flags = this.#dev.flags.toFloat32Array();
    this.#scale = flags[0]!;
    this.#skipped = flags[1]! !== 0;
  }

  /** Whether the last updated step found inf/NaN gradients (and its optimizer steps were skipped). */
  get skippedLastStep(): boolean {
    return this.#skipped;
  }

  /** The scale read from the device (a synchronisation), for logging. */
  scaleValue(): number {
    if (!this.enabled) return 1;
    return this.#dev ? this.#dev.scaleView.item() : this.#scale;
  }

  /** A checkpoint (reads the device state, a synchronisation). */
  state(): GradScalerState {
    return {
      scale: this.scaleValue(),
      growthFactor: this.#growthFactor,
      backoffFactor: this.#backoffFactor,
      growthInterval: this.#growthInterval,
      growthTracker: this.#dev ? this.#dev.tracker.item() : this.#growthTracker,
    };
  }

  /** Restores the scale and growth tracker of a {@link GradScaler.state} checkpoint. */
  loadState(state: GradScalerState): void {
    if (state === null || typeof state !== 'object') invalid('state', 'a GradScaler state object', state);
    const scale = positive('state.scale', state.scale);
    const tracker = expectInt('state.growthTracker', state.growthTracker ?? 0, 0, 0x7fffffff);
    if (this.#unscaled.size > 0) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'GradScaler.loadState() in the middle of a step (after unscale or step, before update)',
      );
    }
    this.#scale = Math.fround(scale);
    this.#growthTracker = tracker;
    if (this.#dev) {
      this.#dev.scaleView.raw.copyFromHost(Float32Array.of(this.#scale));
      this.#dev.tracker.raw.copyFromHost(Int32Array.of(tracker));
    }
  }

  /** Frees the device state. */
  dispose(): void {
    const dev = this.#dev;
    if (dev) for (const t of [dev.scaleView, dev.foundInfView, dev.flags, dev.tracker]) t.dispose();
    this.#dev = null;
  }

  // Creates the device state on `device`, or moves it there (keeping the scale and tracker).
  #ensureDevice(device: string): ScalerTensors {
    if (this.#dev && this.#dev.flags.device === device) return this.#dev;
    if (this.#dev) {
      this.#growthTracker = this.#dev.tracker.item();
      this.dispose();
    }
    const flags = Tensor.from([this.#scale, 0], [2], { device });
    return (this.#dev = {
      flags,
      scaleView: flags.view(0, [1]),
      foundInfView: flags.view(1, [1]),
      tracker: Tensor.from([this.#growthTracker], [1], { dtype: 'i32', device }),
    });
  }

  // The scale update on the device from the found-inf flag (growth after growthInterval clean steps, backoff on inf).
  #updateScaleOnDevice(dev: ScalerTensors): void {
    addon().scalerUpdate({
      scale: dev.scaleView.raw,
      growthTracker: dev.tracker.raw,
      foundInf: dev.foundInfView.raw,
      growthFactor: this.#growthFactor,
      backoffFactor: this.#backoffFactor,
      growthInterval: this.#growthInterval,
    });
  }

  // The scale update of a fused step, on the device state `dev`.
  #scaleUpdate(dev: ScalerTensors): FusedScaleUpdate {
    return {
      scale: dev.scaleView,
      growthTracker: dev.tracker,
      growthFactor: this.#growthFactor,
      backoffFactor: this.#backoffFactor,
      growthInterval: this.#growthInterval,
    };
  }

  // A captured step's unscale: by the scale on the device, raising the found-inf flag.
  #unscaleOnDevice(optimizer: ScalerOptimizer, dev: ScalerTensors): void {
    addon().unscaleAndCheck({
      grads: optimizer.arena().grads.raw,
      scale: dev.scaleView.raw,
      foundInf: dev.foundInfView.raw,
      segments: optimizer.segmentTable(),
    });
  }

  // Refuses a step on the device while an eager step is half-way (unscale or step without update).
  #checkNoStepInProgress(method: string): void {
    if (this.#unscaled.size > 0 || this.#stepped.size > 0) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `GradScaler.${method}(): a step is in progress (unscale or step called without update)`,
      );
    }
  }

  // The device state during a step: unscale() has made it.
  #unscaledState(): ScalerTensors {
    return defined(this.#dev, "the GradScaler's device state");
  }
}
