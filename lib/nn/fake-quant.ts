/**
 * Fake quantization for quantization-aware training: what a convolution or linear layer computes
 * with when it is trained for INT8 deployment. Its input is fake-quantized per tensor, with a scale
 * from a moving-average min/max observer (PyTorch's MovingAverageMinMaxObserver), and its weight per
 * output channel, with the symmetric abs-max scale recomputed every step; both round half to even,
 * as `torch.fake_quantize_per_tensor_affine` / `_per_channel_affine` and ONNX's QuantizeLinear do,
 * and their gradients pass straight through inside the representable range (zero outside), as
 * PyTorch's FakeQuantize defines
 * (https://pytorch.org/docs/stable/generated/torch.fake_quantize_per_tensor_affine.html,
 * https://pytorch.org/docs/stable/generated/torch.fake_quantize_per_channel_affine.html; the
 * observer: https://pytorch.org/docs/stable/generated/torch.ao.quantization.observer.MovingAverageMinMaxObserver.html).
 * Scales and observer state stay on the device: nothing here reads back to the host during a step.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { ResnetError, expectBool, expectNumber, expectOptions } from '../errors.js';
import { Tensor, expectTensor } from '../tensor.js';
import type { WeightedQuantizer } from './layers.js';
import { FLOAT_DTYPES, Module, ShapeCache, disposeAll, type BufferSlot } from './module.js';

/** The INT8 range of a signed value (weights, and inputs that may be negative). */
export const S8_RANGE = { qmin: -128, qmax: 127 } as const;
/** The INT8 range of a non-negative value (inputs that follow a ReLU). */
export const U8_RANGE = { qmin: 0, qmax: 255 } as const;

/**
 * The divisor of a symmetric scale: the largest magnitude maps to 127 (s8, so that -max and +max
 * are both representable) or 255 (u8).
 */
export function symmetricLevels(unsigned: boolean): number {
  return unsigned ? 255 : 127;
}

/** PyTorch's default averaging constant of MovingAverageMinMaxObserver. */
export const DEFAULT_AVERAGING_CONSTANT = 0.01;

/** Options of {@link FakeQuantizer}. */
export interface FakeQuantizerOptions {
  /** The input is non-negative (it follows a ReLU): u8, else s8. */
  unsigned: boolean;
  /** The observer's averaging constant, in (0, 1]; default 0.01 (PyTorch's). */
  averagingConstant?: number;
}

/** The fake-quantized copy of an input of one shape. */
interface InputEntry {
  xq: Tensor;
  dispose(): void;
}

/**
 * The fake quantization of one convolution or linear layer: its input (per tensor, observed) and
 * its weight (per output channel). As a module its forward fake-quantizes an input and its
 * backward is the straight-through gradient; the layer calls it through {@link WeightedQuantizer}.
 * Its state dict holds the observer's running `min_max` (`[+inf, -inf]` before the first
 * observation) and the input `scale`, so a checkpoint of a quantization-aware run keeps them.
 */
export class FakeQuantizer extends Module implements WeightedQuantizer {
  readonly unsigned: boolean;
  readonly averagingConstant: number;
  /** Whether a training-mode forward updates the observer (false once frozen). */
  observing = true;
  readonly #minMax: BufferSlot;
  readonly #scale: BufferSlot;
  readonly #inputs = new ShapeCache<InputEntry>();
  #input: Tensor | null = null;
  #weightScale: Tensor | null = null;
  #weightQ: Tensor | null = null;

  constructor(options: FakeQuantizerOptions) {
    super();
    const o = expectOptions<FakeQuantizerOptions>('FakeQuantizer options', options, ['unsigned', 'averagingConstant']);
    this.unsigned = expectBool('unsigned', o.unsigned);
    this.averagingConstant = expectNumber(
      'averagingConstant',
      o.averagingConstant ?? DEFAULT_AVERAGING_CONSTANT,
      Number.MIN_VALUE,
      1,
    );
    this.#minMax = this.registerBuffer('min_max', Float32Array.of(Infinity, -Infinity));
    // PyTorch's FakeQuantize also starts at scale 1 until its observer has seen data.
    this.#scale = this.registerBuffer('scale', Float32Array.of(1));
  }

  /** The INT8 range of the input. */
  get inputRange(): { qmin: number; qmax: number } {
    return this.unsigned ? U8_RANGE : S8_RANGE;
  }

  #slot(slot: BufferSlot, name: string): Tensor {
    if (!slot.tensor) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `FakeQuantizer: its ${name} is not on a device yet; place the model (model.to(device)) after prepareQat`,
      );
    }
    return slot.tensor;
  }

  /** Fake-quantizes `x`; in training mode the observer first takes `x` in (unless frozen). */
  override forward(x: Tensor): Tensor {
    this.prepare(x, 'FakeQuantizer');
    return this.input(x, this.training);
  }

  /** The straight-through gradient of the last forward's input. */
  override backward(gradOutput: Tensor): Tensor | null {
    return this.backwardOnce('FakeQuantizer', () => this.inputGrad(gradOutput));
  }

  input(x: Tensor, training: boolean): Tensor {
    this.assertUsable('input');
    expectTensor('FakeQuantizer input', x, { dtype: FLOAT_DTYPES });
    const scale = this.#slot(this.#scale, 'scale');
    const entry = this.#inputs.get(x, () => {
      const xq = this.activationBuffer(x.shape, x.dtype, x.device);
      return { xq, dispose: () => xq.dispose() };
    });
    if (training && this.observing) {
      addon().observeMinMax({
        x: x.raw,
        minMax: this.#slot(this.#minMax, 'min_max').raw,
        scale: scale.raw,
        averagingConstant: this.averagingConstant,
        qmax: symmetricLevels(this.unsigned),
      });
    }
    addon().fakeQuantize({ x: x.raw, scale: scale.raw, y: entry.xq.raw, ...this.inputRange });
    this.#input = x;
    return entry.xq;
  }

  weight(weight: Tensor): Tensor {
    this.assertUsable('weight');
    let scale = this.#weightScale;
    let quantized = this.#weightQ;
    if (!scale || quantized?.device !== weight.device || quantized.numel !== weight.numel) {
      disposeAll(scale, quantized);
      scale = this.#weightScale = Tensor.empty([weight.shape[0]!], { device: weight.device });
      quantized = this.#weightQ = Tensor.empty(weight.shape, { device: weight.device });
    }
    addon().absMaxScale({ x: weight.raw, scale: scale.raw, qmax: symmetricLevels(false) });
    addon().fakeQuantize({ x: weight.raw, scale: scale.raw, y: quantized.raw, ...S8_RANGE });
    return quantized;
  }

  quantizedWeight(): Tensor {
    if (!this.#weightQ) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'FakeQuantizer: no weight was quantized yet');
    return this.#weightQ;
  }

  inputGrad(gradQuantized: Tensor): Tensor {
    const x = this.#input;
    if (!x) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'FakeQuantizer.backward() was called before forward()');
    expectTensor('FakeQuantizer gradOutput', gradQuantized, { shape: x.shape, dtype: x.dtype, device: x.device });
    const scale = this.#slot(this.#scale, 'scale');
    addon().fakeQuantizeBackward({
      x: x.raw,
      scale: scale.raw,
      dy: gradQuantized.raw,
      dx: gradQuantized.raw,
      ...this.inputRange,
    });
    return gradQuantized;
  }

  /**
   * The observer's state on the host (read once, after training): the running min and max and the
   * input scale. `observed` is false while the observer has seen nothing.
   */
  observerState(): { min: number; max: number; scale: number; observed: boolean } {
    const [min, max] = this.#slot(this.#minMax, 'min_max').toFloat32Array() as unknown as [number, number];
    const scale = this.#slot(this.#scale, 'scale').toFloat32Array()[0]!;
    return { min, max, scale, observed: !(min === Infinity && max === -Infinity) };
  }

  protected override disposeCache(): void {
    this.#inputs.clear();
    disposeAll(this.#weightScale, this.#weightQ);
    this.#weightScale = null;
    this.#weightQ = null;
    this.#input = null;
  }
}
