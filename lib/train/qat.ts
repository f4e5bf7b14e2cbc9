/**
 * Quantization-aware training (QAT), PyTorch's `torch.ao.quantization.prepare_qat` and `convert` for
 * this package: {@link prepareQat} attaches fake quantization to every convolution and linear layer
 * of a network, training then learns weights that survive INT8 rounding, and
 * {@link quantizedGraph} lowers the trained network to the same INT8 {@link InferenceGraph} that
 * post-training calibration produces (and so to the same QDQ ONNX).
 *
 * What is quantized is what the INT8 graph quantizes: each convolution's and the classifier's input
 * per tensor (u8 after a ReLU, s8 otherwise, symmetric, zero point 0) and their weights per output
 * channel (s8 symmetric). Batch norm: the weights are fake-quantized before batch norm is folded
 * into them. Folding multiplies output channel `k` by `c_k = gamma_k / sqrt(var_k + eps)`, and
 * symmetric per-channel quantization commutes with that (the scale of the folded channel is
 * `|c_k|` times the unfolded one, and `rint` is odd), so the folded INT8 weights are exactly the
 * folded fake-quantized weights, up to f32 rounding. Unlike PyTorch's fused conv-bn QAT modules,
 * batch norm itself still runs on batch statistics in training (not on the folded weights), which
 * is the usual gap between a network's training and evaluation modes, not a quantization mismatch.
 * @packageDocumentation
 */
import { ResnetError, expectInt, expectNumber, expectOptions, invalid } from '../errors.js';
import { lowerForInference, type InferenceGraph, type NodeQuantization } from '../inference/graph.js';
import { Chain } from '../nn/containers.js';
import { DEFAULT_AVERAGING_CONSTANT, FakeQuantizer, symmetricLevels } from '../nn/fake-quant.js';
import { Conv2d, Linear } from '../nn/layers.js';
import type { Module } from '../nn/module.js';

/** Options of {@link prepareQat} (and of the Trainer's `qat` option). */
export interface QatOptions {
  /** The activation observers' averaging constant, in (0, 1]; default 0.01 (PyTorch's MovingAverageMinMaxObserver). */
  averagingConstant?: number;
  /**
   * Freeze the activation observers after this many optimizer steps (the Trainer counts them; the
   * scales then stay fixed while the weights keep adapting to them, as PyTorch's recipes do with
   * `disable_observer`). Default: never.
   */
  freezeObserversAfter?: number;
}

/** {@link QatOptions} validated, with defaults. */
export interface QatSettings {
  averagingConstant: number;
  /** null: never. */
  freezeObserversAfter: number | null;
}

/** The name of the fake-quantization child of each quantized layer (in the state dict: `conv1.fake_quant.scale`). */
export const FAKE_QUANT_CHILD = 'fake_quant';

/** Validates {@link QatOptions}; `true` means the defaults. */
export function parseQatOptions(options: QatOptions | true, name = 'qat'): QatSettings {
  const o =
    options === true ? {} : expectOptions<QatOptions>(name, options, ['averagingConstant', 'freezeObserversAfter']);
  return {
    averagingConstant: expectNumber(
      `${name}.averagingConstant`,
      o.averagingConstant ?? DEFAULT_AVERAGING_CONSTANT,
      Number.MIN_VALUE,
      1,
    ),
    freezeObserversAfter:
      o.freezeObserversAfter === undefined
        ? null
        : expectInt(`${name}.freezeObserversAfter`, o.freezeObserversAfter, 0),
  };
}

/** The quantizable layers of a network with their state-dict names. */
function quantizableLayers(model: Module): [string, Conv2d | Linear][] {
  return model
    .namedModules()
    .filter((e): e is [string, Conv2d | Linear] => e[1] instanceof Conv2d || e[1] instanceof Linear);
}

/** Whether each convolution's or linear layer's input is non-negative (it follows a ReLU), by name. */
function unsignedInputs(graph: InferenceGraph): Map<string, boolean> {
  const unsignedValue: boolean[] = [false];
  const out = new Map<string, boolean>();
  for (const node of graph.nodes) {
    if (node.op === 'conv') {
      out.set(node.name, unsignedValue[node.input]!);
      unsignedValue.push(node.relu);
    } else if (node.op === 'linear') {
      out.set(node.name, unsignedValue[node.input]!);
      unsignedValue.push(false);
    } else {
      unsignedValue.push(unsignedValue[node.input]!);
    }
  }
  return out;
}

/**
 * Whether a state dict holds the observers of a model prepared with {@link prepareQat} (the
 * weights of a quantization-aware run): such weights load into a prepared model only.
 */
export function hasQatState(state: ReadonlyMap<string, unknown>): boolean {
  for (const key of state.keys()) if (key.endsWith(`.${FAKE_QUANT_CHILD}.min_max`)) return true;
  return false;
}

/** Whether {@link prepareQat} was applied to `model`. */
export function isQatPrepared(model: Module): boolean {
  return quantizableLayers(model).some(([, m]) => m.quantizer !== null);
}

/**
 * Prepares `model` for quantization-aware training, in place (PyTorch's `prepare_qat`): every
 * Conv2d and Linear gets a {@link FakeQuantizer} (its child `fake_quant`), which fake-quantizes the
 * layer's input and weight in each forward from then on, training or evaluation, and observes the
 * input in training mode. The model must be one that {@link lowerForInference} lowers (a ResNet, or
 * a chain of its layers). Load the trained float weights first: the new observer buffers are not in
 * a float checkpoint. Returns `model`.
 */
export function prepareQat<M extends Module>(model: M, options: QatOptions | true = true): M {
  if (!(model instanceof Chain)) invalid('model', 'a Chain (a ResNet or a Sequential)', model);
  const settings = parseQatOptions(options, 'options');
  if (isQatPrepared(model)) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      'prepareQat: the model is already prepared for quantization-aware training',
    );
  }
  const unsigned = unsignedInputs(lowerForInference(model));
  const layers = quantizableLayers(model);
  for (const [name, layer] of layers) {
    const isUnsigned = unsigned.get(name);
    if (isUnsigned === undefined) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `prepareQat: ${name} is not part of the model's inference graph`,
      );
    }
    layer.attachQuantizer(
      FAKE_QUANT_CHILD,
      new FakeQuantizer({ unsigned: isUnsigned, averagingConstant: settings.averagingConstant }),
    );
  }
  // A placed model places the new observer buffers beside its parameters; an unplaced one does so on its first forward.
  if (model.device !== null) model.to(model.device);
  return model;
}

/** The fake quantizers of a prepared model, by layer name. */
function quantizers(model: Module): [string, FakeQuantizer][] {
  const out: [string, FakeQuantizer][] = [];
  for (const [name, layer] of quantizableLayers(model)) {
    if (layer.quantizer instanceof FakeQuantizer) out.push([name, layer.quantizer]);
  }
  return out;
}

/**
 * Starts or stops the activation observers of a prepared model (PyTorch's `enable_observer` /
 * `disable_observer`): stopped, the input scales stay as they are; fake quantization goes on.
 */
export function setQatObservers(model: Module, observing: boolean): void {
  const all = quantizers(model);
  if (all.length === 0) invalid('model', 'a model prepared with prepareQat', model);
  for (const [, q] of all) q.observing = observing;
}

/**
 * Symmetric per-output-channel scales of `[rows, ...]` weights: `max(max |w_k| / 127, eps)` in f32,
 * as the device computes them during training.
 */
export function weightScales(weight: Float32Array, rows: number): Float32Array {
  const per = weight.length / rows;
  const out = new Float32Array(rows);
  for (let k = 0; k < rows; k++) {
    let m = 0;
    for (let i = k * per; i < (k + 1) * per; i++) m = Math.max(m, Math.abs(weight[i]!));
    out[k] = Math.max(Math.fround(m / symmetricLevels(false)), 2 ** -23);
  }
  return out;
}

/**
 * The INT8 inference graph of a model trained with quantization awareness (PyTorch's `convert`):
 * {@link lowerForInference} (batch norm folded) with every convolution and linear node quantized,
 * input scales from the learned observers and weight scales from the folded weights (see the
 * module documentation for why that matches training). The graph is what the INT8 plan and
 * `exportOnnx` take. Reads the observers back to the host once.
 */
export function quantizedGraph(model: Module): InferenceGraph {
  const byName = new Map(quantizers(model));
  if (byName.size === 0) invalid('model', 'a model prepared with prepareQat (and trained)', model);
  const graph = lowerForInference(model);
  for (const node of graph.nodes) {
    if (node.op !== 'conv' && node.op !== 'linear') continue;
    const q = byName.get(node.name);
    if (!q) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `quantizedGraph: ${node.name} has no fake quantization`);
    const state = q.observerState();
    if (!state.observed) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `quantizedGraph: the input observer of ${node.name} has seen no data; train the prepared model (or run forwards in training mode) first`,
      );
    }
    const rows = node.op === 'conv' ? node.outChannels : node.outFeatures;
    const quant: NodeQuantization = {
      inputScale: state.scale,
      inputUnsigned: q.unsigned,
      weightScales: weightScales(node.weight, rows),
    };
    node.quant = quant;
  }
  return graph;
}

/** Freezes a prepared model's observers once the optimizer steps reach {@link QatSettings.freezeObserversAfter}. */
export class QatObserverSchedule {
  readonly #model: Module;
  readonly #freezeAfter: number | null;
  #frozen = false;

  constructor(model: Module, settings: QatSettings) {
    this.#model = model;
    this.#freezeAfter = settings.freezeObserversAfter;
  }

  /** Called before the forward of each micro-batch with the optimizer steps taken so far (a host count: no sync). */
  beforeStep(step: number): void {
    if (this.#frozen || this.#freezeAfter === null || step < this.#freezeAfter) return;
    setQatObservers(this.#model, false);
    this.#frozen = true;
  }
}

/**
 * The Trainer's side of its `qat` option: prepares the (placed) model unless it already is, and
 * returns the observer schedule.
 */
export function startQat(model: Module, settings: QatSettings): QatObserverSchedule {
  if (!isQatPrepared(model)) {
    prepareQat(model, {
      averagingConstant: settings.averagingConstant,
      ...(settings.freezeObserversAfter !== null ? { freezeObserversAfter: settings.freezeObserversAfter } : {}),
    });
  }
  return new QatObserverSchedule(model, settings);
}
