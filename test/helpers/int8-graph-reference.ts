/**
 * A float64 reference of INT8 inference over a quantized InferenceGraph: each convolution's and
 * linear node's input is quantized per tensor (zero point 0, u8 or s8, rounded half to even), its
 * weights per output channel (s8), the products are summed as integers and rescaled by
 * `inputScale * weightScale[k]`; bias, residual, ReLU, pooling and the output stay in floating
 * point. This is the arithmetic the QDQ ONNX model and an INT8 plan perform.
 * @packageDocumentation
 */
import type { ConvNode, InferenceGraph, LinearNode, NodeQuantization } from '../../lib/inference/graph.js';
import { roundHalfEven } from '../reference/fake-quant.js';

/** An NHWC activation (or `[N, C]` with h = w = 1). */
interface Act {
  n: number;
  h: number;
  w: number;
  c: number;
  data: Float64Array;
}

function quantizeInput(x: Float64Array, q: NodeQuantization): Float64Array {
  const [lo, hi] = q.inputUnsigned ? [0, 255] : [-128, 127];
  return x.map((v) => Math.min(Math.max(roundHalfEven(Math.fround(v / q.inputScale)), lo), hi));
}

function quantizeWeights(weight: Float32Array, q: NodeQuantization): Float64Array {
  const rows = q.weightScales.length;
  const per = weight.length / rows;
  const out = new Float64Array(weight.length);
  for (let i = 0; i < weight.length; i++) {
    out[i] = Math.min(
      Math.max(roundHalfEven(Math.fround(weight[i]! / q.weightScales[Math.floor(i / per)]!)), -128),
      127,
    );
  }
  return out;
}

function need(node: ConvNode | LinearNode): NodeQuantization {
  if (!node.quant) throw new Error(`int8 reference: ${node.name} is not quantized`);
  return node.quant;
}

function conv(node: ConvNode, x: Act, residual: Act | null): Act {
  const q = need(node);
  const xq = quantizeInput(x.data, q);
  const wq = quantizeWeights(node.weight, q);
  const [kh, kw] = node.kernel;
  const [sh, sw] = node.stride;
  const [ph, pw] = node.padding;
  const [dh, dw] = node.dilation;
  const oh = Math.floor((x.h + 2 * ph - dh * (kh - 1) - 1) / sh) + 1;
  const ow = Math.floor((x.w + 2 * pw - dw * (kw - 1) - 1) / sw) + 1;
  const k = node.outChannels;
  const c = x.c;
  const out = new Float64Array(x.n * oh * ow * k);
  for (let n = 0; n < x.n; n++) {
    for (let oy = 0; oy < oh; oy++) {
      for (let ox = 0; ox < ow; ox++) {
        for (let o = 0; o < k; o++) {
          let acc = 0;
          for (let r = 0; r < kh; r++) {
            const iy = oy * sh - ph + r * dh;
            if (iy < 0 || iy >= x.h) continue;
            for (let s = 0; s < kw; s++) {
              const ix = ox * sw - pw + s * dw;
              if (ix < 0 || ix >= x.w) continue;
              const xBase = ((n * x.h + iy) * x.w + ix) * c;
              const wBase = ((o * kh + r) * kw + s) * c;
              for (let ci = 0; ci < c; ci++) acc += xq[xBase + ci]! * wq[wBase + ci]!;
            }
          }
          const at = ((n * oh + oy) * ow + ox) * k + o;
          let v = acc * q.inputScale * q.weightScales[o]! + node.bias[o]!;
          if (residual) v += residual.data[at]!;
          out[at] = node.relu ? Math.max(v, 0) : v;
        }
      }
    }
  }
  return { n: x.n, h: oh, w: ow, c: k, data: out };
}

function linear(node: LinearNode, x: Act): Act {
  const q = need(node);
  const xq = quantizeInput(x.data, q);
  const wq = quantizeWeights(node.weight, q);
  const out = new Float64Array(x.n * node.outFeatures);
  for (let n = 0; n < x.n; n++) {
    for (let o = 0; o < node.outFeatures; o++) {
      let acc = 0;
      for (let i = 0; i < node.inFeatures; i++) acc += xq[n * node.inFeatures + i]! * wq[o * node.inFeatures + i]!;
      out[n * node.outFeatures + o] = acc * q.inputScale * q.weightScales[o]! + node.bias[o]!;
    }
  }
  return { n: x.n, h: 1, w: 1, c: node.outFeatures, data: out };
}

function maxPool(x: Act, kernel: [number, number], stride: [number, number], padding: [number, number]): Act {
  const oh = Math.floor((x.h + 2 * padding[0] - kernel[0]) / stride[0]) + 1;
  const ow = Math.floor((x.w + 2 * padding[1] - kernel[1]) / stride[1]) + 1;
  const out = new Float64Array(x.n * oh * ow * x.c).fill(-Infinity);
  for (let n = 0; n < x.n; n++) {
    for (let oy = 0; oy < oh; oy++) {
      for (let ox = 0; ox < ow; ox++) {
        for (let r = 0; r < kernel[0]; r++) {
          const iy = oy * stride[0] - padding[0] + r;
          if (iy < 0 || iy >= x.h) continue;
          for (let s = 0; s < kernel[1]; s++) {
            const ix = ox * stride[1] - padding[1] + s;
            if (ix < 0 || ix >= x.w) continue;
            for (let ch = 0; ch < x.c; ch++) {
              const at = ((n * oh + oy) * ow + ox) * x.c + ch;
              out[at] = Math.max(out[at]!, x.data[((n * x.h + iy) * x.w + ix) * x.c + ch]!);
            }
          }
        }
      }
    }
  }
  return { n: x.n, h: oh, w: ow, c: x.c, data: out };
}

function globalAvgPool(x: Act): Act {
  const out = new Float64Array(x.n * x.c);
  const hw = x.h * x.w;
  for (let n = 0; n < x.n; n++) {
    for (let p = 0; p < hw; p++) {
      for (let ch = 0; ch < x.c; ch++) out[n * x.c + ch] = out[n * x.c + ch]! + x.data[(n * hw + p) * x.c + ch]! / hw;
    }
  }
  return { n: x.n, h: 1, w: 1, c: x.c, data: out };
}

/** Runs a quantized graph on an NHWC input `[n, h, w, inChannels]`; returns the logits `[n, classes]`. */
export function runInt8Graph(graph: InferenceGraph, input: ArrayLike<number>, shape: readonly number[]): Float64Array {
  const [n, h, w, c] = shape as [number, number, number, number];
  const values: Act[] = [{ n, h, w, c, data: Float64Array.from(input) }];
  for (const node of graph.nodes) {
    const x = values[node.input]!;
    if (node.op === 'conv') values.push(conv(node, x, node.residual === null ? null : values[node.residual]!));
    else if (node.op === 'linear') values.push(linear(node, x));
    else if (node.op === 'maxpool') values.push(maxPool(x, node.kernel, node.stride, node.padding));
    else values.push(globalAvgPool(x));
  }
  return values[values.length - 1]!.data;
}
