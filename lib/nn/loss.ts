/**
 * Softmax cross-entropy with label smoothing, loss and gradient computed in one pass.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { ResnetError, expectNumber, expectOptions, invalid, isArray, mismatch } from '../errors.js';
import { opRecorder } from '../profile/hooks.js';
import { Tensor, expectTensor } from '../tensor.js';
import { FLOAT_DTYPES, disposeAll } from './module.js';

/** Options of {@link CrossEntropyLoss}, as in `torch.nn.CrossEntropyLoss`. */
export interface CrossEntropyLossOptions {
  /** Mixes the one-hot target with the uniform distribution: `(1 - s) * onehot + s / K`. */
  labelSmoothing?: number;
}

/** The labels a loss takes: an i32 tensor `[N]` on the logits' device, or host integers. */
export type LossLabels = Tensor | Int32Array | readonly number[];

/** The buffers a fused loss op writes: the labels on the device, the loss, and the logits' gradient. */
export interface LossOutputs {
  labels: Tensor;
  loss: Tensor;
  dLogits: Tensor;
}

/**
 * What the losses computed by one fused native op over logits `[N, K]` share: the loss, gradient
 * and label buffers, owned and reused across calls, the gradient scale, `backward` and `dispose`.
 */
export abstract class LogitsLoss {
  /** Multiplies the gradient (loss scaling for fp16, 1/k for accumulation over k steps). */
  gradScale = 1;
  /**
   * An f32[1] tensor on the logits' device whose value, read by the device when the op runs,
   * multiplies the gradient instead of `gradScale` (a GradScaler's scale inside a captured CUDA
   * graph); null (default) uses `gradScale`. Only {@link CrossEntropyLoss} reads it.
   */
  gradScaleFrom: Tensor | null = null;
  #loss: Tensor | null = null;
  #grad: Tensor | null = null;
  #labels: Tensor | null = null;
  #ready = false;

  /** The class's name, for messages. */
  protected abstract readonly lossName: string;

  /** Checks that `logits` is a `[N, K]` tensor of a floating-point dtype. */
  protected static checkLogits(logits: Tensor): void {
    expectTensor('logits', logits, { rank: 2, dtype: FLOAT_DTYPES });
  }

  /**
   * Checks `labels` against `logits` (already checked), sizes the buffers, and runs the op `run`
   * into them, timed as `op` by a running profiler. Returns the loss.
   */
  protected compute(logits: Tensor, labels: LossLabels, op: string, run: (outputs: LossOutputs) => void): Tensor {
    const resolved = labelsOnDevice(labels, logits, this.#labels);
    this.#labels = resolved.cache;
    const loss = (this.#loss = lossBuffer(logits, this.#loss));
    const dLogits = (this.#grad = gradBuffer(logits, this.#grad));
    expectNumber('gradScale', this.gradScale, 0);
    const recorder = opRecorder;
    const token = recorder ? recorder.begin(op, 'loss', logits.device) : 0;
    run({ labels: resolved.labels, loss, dLogits });
    recorder?.end(token);
    this.#ready = true;
    return loss;
  }

  /** The gradient with respect to the logits of the last `forward` (times `gradScale`). */
  backward(): Tensor {
    if (!this.#ready || !this.#grad) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `${this.lossName}.backward() was called before forward()`);
    }
    return this.#grad;
  }

  /** Frees the loss's buffers. */
  dispose(): void {
    disposeAll(this.#loss, this.#grad, this.#labels);
    this.#loss = this.#grad = this.#labels = null;
    this.#ready = false;
  }
}

/**
 * Mean softmax cross-entropy over a batch of logits `[N, K]` and integer labels. `forward` also
 * computes the gradient of the loss (times `gradScale`) with respect to the logits, which
 * `backward` returns; both tensors are owned by the loss and reused.
 */
export class CrossEntropyLoss extends LogitsLoss {
  /** The label smoothing factor. */
  readonly labelSmoothing: number;
  protected readonly lossName = 'CrossEntropyLoss';

  constructor(options: CrossEntropyLossOptions = {}) {
    super();
    const o = expectOptions<CrossEntropyLossOptions>('CrossEntropyLoss options', options, ['labelSmoothing']);
    this.labelSmoothing = expectNumber('labelSmoothing', o.labelSmoothing ?? 0, 0, 1);
  }

  /**
   * The mean loss as a one-element f32 tensor on the logits' device (read it with `item()`, which
   * waits for the device). `labels` is an i32 tensor `[N]` on the same device, or host integers.
   */
  forward(logits: Tensor, labels: LossLabels): Tensor {
    LogitsLoss.checkLogits(logits);
    return this.compute(logits, labels, 'cross_entropy', (out) => {
      addon().crossEntropy({
        logits: logits.raw,
        labels: out.labels.raw,
        loss: out.loss.raw,
        dLogits: out.dLogits.raw,
        labelSmoothing: this.labelSmoothing,
        gradScale: this.gradScale,
        ...(this.gradScaleFrom ? { gradScaleFrom: this.gradScaleFrom.raw } : {}),
      });
    });
  }
}

/**
 * The labels of a batch of logits `[N, K]` as an i32 tensor on the logits' device: `labels` itself
 * when it is such a tensor (checked), else host integers (checked to lie in `[0, K)`) copied into
 * `cache`, which is reused when it fits and replaced otherwise. Returns the label tensor and the
 * cache to keep.
 */
function labelsOnDevice(
  labels: Tensor | Int32Array | readonly number[],
  logits: Tensor,
  cache: Tensor | null,
): { labels: Tensor; cache: Tensor | null } {
  const [n, k] = logits.shape as [number, number];
  if (labels instanceof Tensor) {
    expectTensor('labels', labels, { rank: 1, dtype: 'i32', device: logits.device });
    if (labels.shape[0] !== n) mismatch('labels', `${n} labels (one per row of logits)`, `${labels.shape[0]} labels`);
    return { labels, cache };
  }
  if (!isArray(labels) && !(labels instanceof Int32Array)) {
    invalid('labels', 'an i32 Tensor, an Int32Array or an array of integers', labels);
  }
  if (labels.length !== n) mismatch('labels', `${n} labels (one per row of logits)`, `${labels.length} labels`);
  for (let i = 0; i < labels.length; i++) {
    const v = labels[i]!;
    if (!Number.isInteger(v) || v < 0 || v >= k) {
      mismatch(`labels[${i}]`, `an integer class index in [0, ${k})`, String(v));
    }
  }
  let out = cache;
  if (out?.shape[0] !== n || out.device !== logits.device) {
    out?.dispose();
    out = Tensor.empty([n], { dtype: 'i32', device: logits.device });
  }
  out.raw.copyFromHost(labels instanceof Int32Array ? labels : Int32Array.from(labels));
  return { labels: out, cache: out };
}

/** A one-element f32 loss tensor on the logits' device: `cache` when it is there, else a new one. */
function lossBuffer(logits: Tensor, cache: Tensor | null): Tensor {
  if (cache?.device === logits.device) return cache;
  cache?.dispose();
  return Tensor.zeros([1], { device: logits.device });
}

/** A gradient tensor of the logits' shape, dtype and device: `cache` when it fits, else a new one. */
function gradBuffer(logits: Tensor, cache: Tensor | null): Tensor {
  if (
    cache?.dtype === logits.dtype &&
    cache.device === logits.device &&
    cache.shape.length === logits.shape.length &&
    cache.shape.every((d, i) => d === logits.shape[i])
  ) {
    return cache;
  }
  cache?.dispose();
  return Tensor.empty(logits.shape, { dtype: logits.dtype, device: logits.device });
}
