/**
 * The integer tensors of a QDQ (QuantizeLinear / DequantizeLinear) ONNX graph, from an
 * {@link NodeQuantization}: weights quantized per output channel to s8, biases to s32 at the scale
 * of their accumulator (input scale times weight scale), as ONNX Runtime's quantization tool and
 * its QLinearConv fusion expect them. Rounding is to nearest with ties to even, as ONNX's
 * QuantizeLinear rounds (https://onnx.ai/onnx/operators/onnx__QuantizeLinear.html).
 * @packageDocumentation
 */
import type { NodeQuantization } from '../inference/graph.js';

/** `x` rounded to the nearest integer, ties to even. */
export function roundHalfEven(x: number): number {
  const r = Math.round(x);
  // Math.round sends ties up; a tie that lands on an odd integer goes back down.
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/**
 * Weights `[rows, ...]` (row `k` is output channel `k`) as s8 values of `scales[k]`:
 * `clamp(round(w / scale), -128, 127)`; a channel of scale 0 (all its weights zero) is all zeros.
 */
export function quantizeWeights(weight: Float32Array, scales: Float32Array): Int8Array {
  const rows = scales.length;
  const per = weight.length / rows;
  const out = new Int8Array(weight.length);
  for (let k = 0; k < rows; k++) {
    const scale = scales[k]!;
    if (scale === 0) continue;
    for (let i = k * per; i < (k + 1) * per; i++) {
      out[i] = Math.max(-128, Math.min(127, roundHalfEven(weight[i]! / scale)));
    }
  }
  return out;
}

/** The scales of an s32 bias: the input scale times each output channel's weight scale. */
export function biasScales(quant: NodeQuantization): Float32Array {
  return quant.weightScales.map((s) => Math.fround(quant.inputScale * s));
}

/**
 * The bias as s32 values of {@link biasScales}, or null when one cannot be represented (a scale of
 * 0, or a value beyond the s32 range); the caller then keeps that bias in floating point.
 */
export function quantizeBias(bias: Float32Array, quant: NodeQuantization): Int32Array | null {
  const scales = biasScales(quant);
  const out = new Int32Array(bias.length);
  for (let k = 0; k < bias.length; k++) {
    const scale = scales[k]!;
    if (!(scale > 0)) return null;
    const q = roundHalfEven(bias[k]! / scale);
    if (!(Math.abs(q) <= 2 ** 31 - 1)) return null;
    out[k] = q;
  }
  return out;
}
