/**
 * The Trainer's training step as one CUDA graph: captured once after eager warm-up steps and
 * replayed for every later step, with the next batch copied into the captured input buffers.
 *
 * What changes from step to step without a recapture lives on the device: the learning rates
 * (the optimizer's group table, sent again before each replay), the GradScaler's scale and
 * found-inf flag (read by the loss gradient, the unscale and the optimizer when they run), the
 * optimizer's step count (advanced on the device unless the step is skipped, read by AdamW's bias
 * corrections) and the loss sums of the log window. The host learns the step count and the scale
 * only when it synchronises ({@link CapturedStep.sync}), which the Trainer does at log points,
 * checkpoints, epoch ends and before any eager step.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { CudaGraph } from '../cuda.js';
import type { DistributedDataParallel } from '../distributed/ddp.js';
import { ResnetError } from '../errors.js';
import type { InputNormalize } from '../nn/input.js';
import type { CrossEntropyLoss } from '../nn/loss.js';
import type { Module } from '../nn/module.js';
import { clipGradNorm } from '../optim/clip.js';
import type { GradScaler } from '../optim/grad-scaler.js';
import type { Optimizer } from '../optim/optimizer.js';
import { Tensor } from '../tensor.js';
import type { DeviceBatch } from './batches.js';

/** The Trainer's parts that one training step uses. */
export interface StepParts {
  /** The model (its host counters follow the replays). */
  model: Module;
  /** What runs forward and backward: the model, or its data-parallel wrapper. */
  net: { forward(x: Tensor): Tensor; backward(gradOutput: Tensor): unknown };
  ddp: DistributedDataParallel | null;
  normalize: InputNormalize;
  loss: CrossEntropyLoss;
  optimizer: Optimizer<{ lr: number }>;
  scaler: GradScaler;
  /** Gradient clipping's max norm, or null. */
  clip: number | null;
  /** f32[1]: the loss summed over the log window. */
  lossSum: Tensor;
  /** f32[1]: the step's loss (zeroed by the Trainer before each step). */
  stepLoss: Tensor;
  device: string;
}

/** The static input buffers a captured step reads. */
interface Inputs {
  images: Tensor;
  labels: Tensor;
  flips: Tensor;
}

/** One captured training step and what its replays need; see the module documentation. */
export class CapturedStep {
  readonly #parts: StepParts;
  readonly #graph: CudaGraph;
  readonly #inputs: Inputs;
  /** i32[1]: the optimizer's step count on the device. */
  readonly #stepCount: Tensor;
  /** f32[1]: the steps skipped on the device (found inf/NaN) since the last synchronisation. */
  readonly #skips: Tensor;
  /** The host counters (BatchNorm's num_batches_tracked) one forward adds to. */
  readonly #counterDeltas: bigint[];
  /** The parameter table and group count at the capture: a change needs a new capture. */
  readonly #segments: Int32Array;
  readonly #groups: number;
  #replays = 0;
  #sinceSync = 0;
  #stepsAtSync = 0;
  #synced = true;
  #disposed = false;

  private constructor(parts: StepParts, graph: CudaGraph, inputs: Inputs, state: CaptureState) {
    this.#parts = parts;
    this.#graph = graph;
    this.#inputs = inputs;
    this.#stepCount = state.stepCount;
    this.#skips = state.skips;
    this.#counterDeltas = state.counterDeltas;
    this.#segments = parts.optimizer.segmentTable();
    this.#groups = parts.optimizer.paramGroups.length;
  }

  /**
   * Captures the step for batches shaped like `batch`. The host must be synchronised (an eager
   * step ran last). Nothing runs: {@link CapturedStep.run} replays it. Throws with the capture's
   * error when the step cannot be captured, leaving the Trainer's state as it was.
   */
  static capture(parts: StepParts, batch: DeviceBatch): CapturedStep {
    const { device, optimizer, model } = parts;
    const inputs: Inputs = {
      images: Tensor.empty(batch.images.shape, { dtype: 'u8', device }),
      labels: Tensor.empty([batch.size], { dtype: 'i32', device }),
      flips: Tensor.zeros([batch.size], { dtype: 'u8', device }),
    };
    const stepCount = Tensor.zeros([1], { dtype: 'i32', device });
    const skips = Tensor.zeros([1], { device });
    const stepsBefore = optimizer.stepCount;
    const countersBefore = model.counterValues();
    let countersAfter = countersBefore;
    try {
      // The current learning rates go to the device first: a table that changed during the
      // capture could not be sent (the capture records the table's address, not its contents).
      optimizer.step({ tablesOnly: true });
      // The scaler's device state must exist before the capture (making it copies from the host).
      if (parts.scaler.enabled) parts.scaler.deviceState(optimizer.arena().device);
      const graph = CudaGraph.capture(device, () => {
        try {
          recordStep(parts, inputs, stepCount, skips);
        } finally {
          countersAfter = model.counterValues();
        }
      });
      const counterDeltas = countersAfter.map((v, i) => v - countersBefore[i]!);
      return new CapturedStep(parts, graph, inputs, { stepCount, skips, counterDeltas });
    } catch (error) {
      for (const t of [inputs.images, inputs.labels, inputs.flips, stepCount, skips]) t.dispose();
      throw error;
    } finally {
      // The capture ran nothing: undo what the host counted while recording.
      optimizer.setStepCount(stepsBefore);
      model.addToCounters(
        countersAfter.map((v, i) => v - countersBefore[i]!),
        -1n,
      );
      parts.loss.gradScaleFrom = null;
    }
  }

  /** Replays so far. */
  get replays(): number {
    return this.#replays;
  }

  /** The image batch shape the graph takes. */
  get inputShape(): readonly number[] {
    return this.#inputs.images.shape;
  }

  /**
   * Whether the same parameters train, in the same groups, as at the capture (freezing a layer
   * changes the optimizer's table, which the graph would not see).
   */
  sameParameters(): boolean {
    const segments = this.#parts.optimizer.segmentTable();
    return (
      this.#parts.optimizer.paramGroups.length === this.#groups &&
      segments.length === this.#segments.length &&
      segments.every((v, i) => v === this.#segments[i])
    );
  }

  /**
   * One training step on `batch` (of {@link CapturedStep.inputShape}, with
   * {@link CapturedStep.sameParameters}): the batch is copied into
   * the captured buffers, the current learning rates are sent, and the graph is replayed.
   */
  run(batch: DeviceBatch): void {
    if (this.#disposed) throw new ResnetError('ERR_RC_DISPOSED', 'This captured step was disposed');
    const { optimizer, model } = this.#parts;
    if (this.#synced) {
      // Eager steps may have run since the last replay: the host's step count is the truth now.
      this.#stepCount.copyFromHost(Int32Array.of(optimizer.stepCount));
      addon().fill({ tensor: this.#skips.raw, value: 0 });
      this.#stepsAtSync = optimizer.stepCount;
      this.#sinceSync = 0;
      this.#synced = false;
    }
    this.#inputs.images.copyFrom(batch.images);
    this.#inputs.labels.copyFrom(batch.labels);
    this.#inputs.flips.copyFromHost(batch.flips);
    optimizer.step({ tablesOnly: true });
    this.#graph.replay();
    model.addToCounters(this.#counterDeltas, 1n);
    this.#replays++;
    this.#sinceSync++;
  }

  /**
   * Brings the host up to date after replays (one synchronisation): the optimizer's step count
   * (less the steps skipped on the device) and the GradScaler's scale and last skip.
   */
  sync(): void {
    if (this.#synced) return;
    const { optimizer, scaler } = this.#parts;
    const skipped = this.#skips.item();
    optimizer.setStepCount(this.#stepsAtSync + this.#sinceSync - skipped);
    scaler.refreshFromDevice();
    this.#synced = true;
  }

  /** Frees the graph and its buffers (waits for the device). */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    this.#graph.dispose();
    for (const t of [this.#inputs.images, this.#inputs.labels, this.#inputs.flips, this.#stepCount, this.#skips]) {
      t.dispose();
    }
  }
}

/** The device state a capture makes. */
interface CaptureState {
  stepCount: Tensor;
  skips: Tensor;
  counterDeltas: bigint[];
}

/**
 * The device work of one step, as the eager step does it (accumulate 1): input conversion,
 * forward, loss into the sums, backward (all-reduced), unscale and clip, update, scale update,
 * gradient zeroing. Run inside a capture.
 */
function recordStep(parts: StepParts, inputs: Inputs, stepCount: Tensor, skips: Tensor): void {
  const { net, ddp, normalize, loss, optimizer, scaler, clip, lossSum, stepLoss, model } = parts;
  // The scaler's state lives on the arena's device, by its canonical name (cuda:0 for cuda).
  const scalerState = scaler.enabled ? scaler.deviceState(optimizer.arena().device) : null;
  scaler.scale(loss, 1);
  loss.gradScaleFrom = scalerState?.scale ?? null;
  const logits = net.forward(normalize.forward(inputs.images, inputs.flips));
  const value = loss.forward(logits, inputs.labels);
  addon().add({ a: lossSum.raw, b: value.raw, out: lossSum.raw });
  addon().add({ a: stepLoss.raw, b: value.raw, out: stepLoss.raw });
  net.backward(loss.backward());
  ddp?.finishGradientSync();
  scaler.stepOnDeviceAndZeroGrad(optimizer, {
    stepCount,
    ...(clip !== null ? { afterUnscale: () => void clipGradNorm(model, clip) } : {}),
  });
  if (scalerState) addon().add({ a: skips.raw, b: scalerState.foundInf.raw, out: skips.raw });
}
