/**
 * A plain TypeScript reference of a quantized inference graph: the arithmetic the INT8 plan is meant
 * to do, written out loop by loop. A quantized node rounds its input to u8/s8 with its input scale
 * and its weights to s8 per output channel, accumulates the integer products exactly, and scales
 * the sum back (`acc * inputScale * weightScale[k] + bias`), then adds the residual and applies the
 * ReLU in f32. Unquantized nodes, pooling included, run in f64.
 */
import { listBackends } from '../../lib/index.js';
import type { InferenceGraph, InferenceNode } from '../../lib/inference/graph.js';
import { quantize } from '../../lib/inference/quant-math.js';

/**
 * Whether this CPU's int8 kernels (oneDNN's, and ONNX Runtime's) compute the quantized arithmetic
 * exactly: with VNNI or AMX they sum u8 x s8 products in 32 bits. Without VNNI (AVX2, AVX-512
 * before Cascade Lake) they add pairs of products in saturating 16-bit integers, and oneDNN halves
 * the weights of layers with signed inputs to avoid that, so results are close, not equal.
 */
export const EXACT_INT8 = listBackends().find((b) => b.name === 'cpu')?.properties?.int8 === 'vnni';

interface Value {
  n: number;
  h: number;
  w: number;
  c: number;
  data: Float64Array;
}

function quantizedWeights(node: InferenceNode & { op: 'conv' | 'linear' }): Float64Array {
  const w = node.weight;
  const k = node.op === 'conv' ? node.outChannels : node.outFeatures;
  const per = w.length / k;
  const out = new Float64Array(w.length);
  for (let o = 0; o < k; o++) {
    for (let i = 0; i < per; i++) {
      out[o * per + i] = node.quant ? quantize(w[o * per + i]!, node.quant.weightScales[o]!, false) : w[o * per + i]!;
    }
  }
  return out;
}

function inputOf(node: InferenceNode & { op: 'conv' | 'linear' }, v: Value): Float64Array {
  if (!node.quant) return v.data;
  const { inputScale, inputUnsigned } = node.quant;
  return v.data.map((x) => quantize(x, inputScale, inputUnsigned));
}

/** Runs `graph` on an NHWC batch; returns the `[n, classes]` output. */
export function referenceInt8Forward(graph: InferenceGraph, x: Float32Array, shape: readonly number[]): Float64Array {
  const [n, h, w, c] = shape as [number, number, number, number];
  const values: Value[] = [{ n, h, w, c, data: Float64Array.from(x) }];
  for (const node of graph.nodes) {
    const v = values[node.input]!;
    if (node.op === 'conv') {
      const [kh, kw] = node.kernel;
      const [sh, sw] = node.stride;
      const [ph, pw] = node.padding;
      const [dh, dw] = node.dilation;
      const oh = Math.floor((v.h + 2 * ph - dh * (kh - 1) - 1) / sh) + 1;
      const ow = Math.floor((v.w + 2 * pw - dw * (kw - 1) - 1) / sw) + 1;
      const k = node.outChannels;
      const ci = node.inChannels;
      const xq = inputOf(node, v);
      const wq = quantizedWeights(node);
      const out = new Float64Array(n * oh * ow * k);
      const res = node.residual !== null ? values[node.residual]!.data : null;
      for (let b = 0; b < n; b++) {
        for (let y = 0; y < oh; y++) {
          for (let xx = 0; xx < ow; xx++) {
            for (let o = 0; o < k; o++) {
              let acc = 0;
              for (let i = 0; i < kh; i++) {
                const iy = y * sh - ph + i * dh;
                if (iy < 0 || iy >= v.h) continue;
                for (let j = 0; j < kw; j++) {
                  const ix = xx * sw - pw + j * dw;
                  if (ix < 0 || ix >= v.w) continue;
                  const xo = ((b * v.h + iy) * v.w + ix) * ci;
                  const wo = ((o * kh + i) * kw + j) * ci;
                  for (let q = 0; q < ci; q++) acc += xq[xo + q]! * wq[wo + q]!;
                }
              }
              const scale = node.quant ? node.quant.inputScale * node.quant.weightScales[o]! : 1;
              const at = ((b * oh + y) * ow + xx) * k + o;
              let r = acc * scale + node.bias[o]!;
              if (res) r += res[at]!;
              out[at] = node.relu ? Math.max(0, r) : r;
            }
          }
        }
      }
      values.push({ n, h: oh, w: ow, c: k, data: out });
    } else if (node.op === 'maxpool') {
      const [kh, kw] = node.kernel;
      const [sh, sw] = node.stride;
      const [ph, pw] = node.padding;
      const oh = Math.floor((v.h + 2 * ph - kh) / sh) + 1;
      const ow = Math.floor((v.w + 2 * pw - kw) / sw) + 1;
      const out = new Float64Array(n * oh * ow * v.c).fill(-Infinity);
      for (let b = 0; b < n; b++) {
        for (let y = 0; y < oh; y++) {
          for (let xx = 0; xx < ow; xx++) {
            for (let i = 0; i < kh; i++) {
              const iy = y * sh - ph + i;
              if (iy < 0 || iy >= v.h) continue;
              for (let j = 0; j < kw; j++) {
                const ix = xx * sw - pw + j;
                if (ix < 0 || ix >= v.w) continue;
                for (let q = 0; q < v.c; q++) {
                  const at = ((b * oh + y) * ow + xx) * v.c + q;
                  out[at] = Math.max(out[at]!, v.data[((b * v.h + iy) * v.w + ix) * v.c + q]!);
                }
              }
            }
          }
        }
      }
      values.push({ n, h: oh, w: ow, c: v.c, data: out });
    } else if (node.op === 'globalavgpool') {
      const out = new Float64Array(n * v.c);
      const hw = v.h * v.w;
      for (let b = 0; b < n; b++) {
        for (let p = 0; p < hw; p++) {
          for (let q = 0; q < v.c; q++) out[b * v.c + q] = out[b * v.c + q]! + v.data[(b * hw + p) * v.c + q]! / hw;
        }
      }
      values.push({ n, h: 1, w: 1, c: v.c, data: out });
    } else {
      const xq = inputOf(node, v);
      const wq = quantizedWeights(node);
      const out = new Float64Array(n * node.outFeatures);
      for (let b = 0; b < n; b++) {
        for (let o = 0; o < node.outFeatures; o++) {
          let acc = 0;
          for (let i = 0; i < node.inFeatures; i++) acc += xq[b * node.inFeatures + i]! * wq[o * node.inFeatures + i]!;
          const scale = node.quant ? node.quant.inputScale * node.quant.weightScales[o]! : 1;
          out[b * node.outFeatures + o] = acc * scale + node.bias[o]!;
        }
      }
      values.push({ n, h: 1, w: 1, c: node.outFeatures, data: out });
    }
  }
  return values[values.length - 1]!.data;
}
