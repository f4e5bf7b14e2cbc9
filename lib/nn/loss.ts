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

/**
 * Mean softmax cross-entropy over a batch of logits `[N, K]` and integer labels. `forward` also
 * computes the gradient of the loss (times `gradScale`) with respect to the logits, which
 * `backward` returns; both tensors are owned by the loss and reused.
 */
export class CrossEntropyLoss {
  /** The label smoothing factor. */
  readonly labelSmoothing: number;
  /** Multiplies the gradient (loss scaling for fp16, 1/k for accumulation over k steps). */
  gradScale = 1;
  #loss: Tensor | null = null;
  #grad: Tensor | null = null;
  #labels: Tensor | null = null;
  #ready = false;

  constructor(options: CrossEntropyLossOptions = {}) {
    const o = expectOptions<CrossEntropyLossOptions>('CrossEntropyLoss options', options, ['labelSmoothing']);
    this.labelSmoothing = expectNumber('labelSmoothing', o.labelSmoothing ?? 0, 0, 1);
  }

  /**
   * The mean loss as a one-element f32 tensor on the logits' device (read it with `item()`, which
   * waits for the device). `labels` is an i32 tensor `[N]` on the same device, or host integers.
   */
  forward(logits: Tensor, labels: Tensor | Int32Array | readonly number[]): Tensor {
    expectTensor('logits', logits, { rank: 2, dtype: FLOAT_DTYPES });
    const [n, k] = logits.shape as [number, number];
    let labelTensor: Tensor;
    if (labels instanceof Tensor) {
      labelTensor = expectTensor('labels', labels, { rank: 1, dtype: 'i32', device: logits.device });
      if (labels.shape[0] !== n) mismatch('labels', `${n} labels (one per row of logits)`, `${labels.shape[0]} labels`);
    } else {
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
      if (!this.#labels || this.#labels.shape[0] !== n || this.#labels.device !== logits.device) {
        this.#labels?.dispose();
        this.#labels = Tensor.empty([n], { dtype: 'i32', device: logits.device });
      }
      this.#labels.raw.copyFromHost(labels instanceof Int32Array ? labels : Int32Array.from(labels));
      labelTensor = this.#labels;
    }
    if (!this.#loss || this.#loss.device !== logits.device) {
      this.#loss?.dispose();
      this.#loss = Tensor.zeros([1], { device: logits.device });
    }
    if (
      !this.#grad ||
      this.#grad.dtype !== logits.dtype ||
      this.#grad.device !== logits.device ||
      this.#grad.shape.some((d, i) => d !== logits.shape[i])
    ) {
      this.#grad?.dispose();
      this.#grad = Tensor.empty(logits.shape, { dtype: logits.dtype, device: logits.device });
    }
    expectNumber('gradScale', this.gradScale, 0);
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('cross_entropy', 'loss', logits.device) : 0;
    addon().crossEntropy({
      logits: logits.raw,
      labels: labelTensor.raw,
      loss: this.#loss.raw,
      dLogits: this.#grad.raw,
      labelSmoothing: this.labelSmoothing,
      gradScale: this.gradScale,
    });
    recorder?.end(token);
    this.#ready = true;
    return this.#loss;
  }

  /** The gradient with respect to the logits of the last `forward` (times `gradScale`). */
  backward(): Tensor {
    if (!this.#ready || !this.#grad) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'CrossEntropyLoss.backward() was called before forward()');
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
