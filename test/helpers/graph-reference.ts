/**
 * A plain float64 evaluation of an {@link InferenceGraph} on NHWC input, for the tests of what is
 * built from the graph: as lowered, or with the INT8 quantization that its nodes carry simulated
 * (inputs rounded to the u8/s8 grid of their scale, weights to the s8 grid of each channel's, the
 * bias to the s32 grid of input scale times weight scale), which is what a QDQ ONNX file means.
 * Also the max-abs calibration that gives a graph such a quantization.
 * @packageDocumentation
 */
import type { InferenceGraph, InferenceNode, NodeQuantization } from '../../lib/inference/graph.js';

/** An NHWC activation (`[n, h, w, c]`; `h = w = 1` after global pooling). */
interface Activation {
  data: Float64Array;
  n: number;
  h: number;
  w: number;
  c: number;
}

/** Round to nearest, ties to even (ONNX QuantizeLinear's rounding). */
function roundEven(x: number): number {
  const r = Math.round(x);
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** `v` on the grid of `scale` within [lo, hi] steps. */
function fakeQuant(v: number, scale: number, lo: number, hi: number): number {
  if (scale === 0) return 0;
  return Math.max(lo, Math.min(hi, roundEven(Math.fround(v / scale)))) * scale;
}

function quantizeInput(x: Activation, q: NodeQuantization): Activation {
  const [lo, hi] = q.inputUnsigned ? [0, 255] : [-128, 127];
  return { ...x, data: x.data.map((v) => fakeQuant(v, q.inputScale, lo, hi)) };
}

/** Weights `[rows, ...]` on each row's s8 grid and the bias on the s32 grid of input times weight scale. */
function quantizeParams(weight: Float32Array, bias: Float32Array, q: NodeQuantization): [Float64Array, Float64Array] {
  const per = weight.length / q.weightScales.length;
  const w = Float64Array.from(weight, (v, i) => fakeQuant(v, q.weightScales[Math.floor(i / per)]!, -128, 127));
  const b = Float64Array.from(bias, (v, k) =>
    fakeQuant(v, Math.fround(q.inputScale * q.weightScales[k]!), -(2 ** 31), 2 ** 31 - 1),
  );
  return [w, b];
}

function conv(
  x: Activation,
  node: Extract<InferenceNode, { op: 'conv' }>,
  w: ArrayLike<number>,
  b: ArrayLike<number>,
  residual: Activation | null,
): Activation {
  const [kh, kw] = node.kernel;
  const [sh, sw] = node.stride;
  const [ph, pw] = node.padding;
  const [dh, dw] = node.dilation;
  const oh = Math.floor((x.h + 2 * ph - dh * (kh - 1) - 1) / sh) + 1;
  const ow = Math.floor((x.w + 2 * pw - dw * (kw - 1) - 1) / sw) + 1;
  const k = node.outChannels;
  const ci = x.c;
  const out = new Float64Array(x.n * oh * ow * k);
  for (let n = 0; n < x.n; n++) {
    for (let y = 0; y < oh; y++) {
      for (let xx = 0; xx < ow; xx++) {
        const base = ((n * oh + y) * ow + xx) * k;
        for (let o = 0; o < k; o++) {
          let acc = b[o]!;
          for (let ky = 0; ky < kh; ky++) {
            const iy = y * sh - ph + ky * dh;
            if (iy < 0 || iy >= x.h) continue;
            for (let kx = 0; kx < kw; kx++) {
              const ix = xx * sw - pw + kx * dw;
              if (ix < 0 || ix >= x.w) continue;
              const xi = ((n * x.h + iy) * x.w + ix) * ci;
              const wi = ((o * kh + ky) * kw + kx) * ci;
              for (let c = 0; c < ci; c++) acc += x.data[xi + c]! * w[wi + c]!;
            }
          }
          if (residual) acc += residual.data[base + o]!;
          out[base + o] = node.relu ? Math.max(0, acc) : acc;
        }
      }
    }
  }
  return { data: out, n: x.n, h: oh, w: ow, c: k };
}

function maxpool(x: Activation, node: Extract<InferenceNode, { op: 'maxpool' }>): Activation {
  const [kh, kw] = node.kernel;
  const [sh, sw] = node.stride;
  const [ph, pw] = node.padding;
  const oh = Math.floor((x.h + 2 * ph - kh) / sh) + 1;
  const ow = Math.floor((x.w + 2 * pw - kw) / sw) + 1;
  const out = new Float64Array(x.n * oh * ow * x.c).fill(-Infinity);
  for (let n = 0; n < x.n; n++) {
    for (let y = 0; y < oh; y++) {
      for (let xx = 0; xx < ow; xx++) {
        for (let ky = 0; ky < kh; ky++) {
          for (let kx = 0; kx < kw; kx++) {
            const iy = y * sh - ph + ky;
            const ix = xx * sw - pw + kx;
            if (iy < 0 || iy >= x.h || ix < 0 || ix >= x.w) continue;
            for (let c = 0; c < x.c; c++) {
              const o = ((n * oh + y) * ow + xx) * x.c + c;
              out[o] = Math.max(out[o]!, x.data[((n * x.h + iy) * x.w + ix) * x.c + c]!);
            }
          }
        }
      }
    }
  }
  return { data: out, n: x.n, h: oh, w: ow, c: x.c };
}

function globalAvgPool(x: Activation): Activation {
  const out = new Float64Array(x.n * x.c);
  const hw = x.h * x.w;
  for (let i = 0; i < x.n * hw; i++) {
    for (let c = 0; c < x.c; c++) {
      const o = Math.floor(i / hw) * x.c + c;
      out[o] = out[o]! + x.data[i * x.c + c]! / hw;
    }
  }
  return { data: out, n: x.n, h: 1, w: 1, c: x.c };
}

function linear(
  x: Activation,
  node: Extract<InferenceNode, { op: 'linear' }>,
  w: ArrayLike<number>,
  b: ArrayLike<number>,
): Activation {
  const out = new Float64Array(x.n * node.outFeatures);
  for (let n = 0; n < x.n; n++) {
    for (let o = 0; o < node.outFeatures; o++) {
      let acc = b[o]!;
      for (let i = 0; i < node.inFeatures; i++) acc += x.data[n * node.inFeatures + i]! * w[o * node.inFeatures + i]!;
      out[n * node.outFeatures + o] = acc;
    }
  }
  return { data: out, n: x.n, h: 1, w: 1, c: node.outFeatures };
}

/** What {@link evaluateGraph} can also do. */
export interface EvaluateOptions {
  /** Simulate the quantization the nodes carry (default: ignore it). */
  quantized?: boolean;
  /** Called with each convolution or linear node's index and its (unquantized) input values. */
  observe?: (node: number, input: Float64Array) => void;
}

/** The graph's output (`[n, features]`) on NHWC images `x` of `[n, h, w, inChannels]`. */
export function evaluateGraph(
  graph: InferenceGraph,
  x: Float32Array,
  [n, h, w]: [number, number, number],
  options: EvaluateOptions = {},
): Float64Array {
  const values: Activation[] = [{ data: Float64Array.from(x), n, h, w, c: graph.inChannels }];
  graph.nodes.forEach((node, index) => {
    let input = values[node.input]!;
    if (node.op === 'conv' || node.op === 'linear') {
      options.observe?.(index, input.data);
      const q = options.quantized ? node.quant : undefined;
      if (q) input = quantizeInput(input, q);
      const [wq, bq] = q ? quantizeParams(node.weight, node.bias, q) : [node.weight, node.bias];
      values.push(
        node.op === 'conv'
          ? conv(input, node, wq, bq, node.residual === null ? null : values[node.residual]!)
          : linear(input, node, wq, bq),
      );
    } else if (node.op === 'maxpool') values.push(maxpool(input, node));
    else values.push(globalAvgPool(input));
  });
  return values[values.length - 1]!.data;
}

/**
 * Gives every convolution and linear node of `graph` (in place) a max-abs INT8 quantization from
 * the batches `calibration`: the input scale is the largest input magnitude over 255 (u8) when the
 * input never goes below zero, else over 127 (s8); each output channel's weight scale is its
 * largest weight magnitude over 127.
 */
export function calibrateMaxAbs(
  graph: InferenceGraph,
  calibration: { x: Float32Array; dims: [number, number, number] }[],
): void {
  const range = new Map<number, { min: number; max: number }>();
  for (const { x, dims } of calibration) {
    evaluateGraph(graph, x, dims, {
      observe: (node, input) => {
        const r = range.get(node) ?? { min: Infinity, max: -Infinity };
        for (const v of input) {
          r.min = Math.min(r.min, v);
          r.max = Math.max(r.max, v);
        }
        range.set(node, r);
      },
    });
  }
  graph.nodes.forEach((node, index) => {
    if (node.op !== 'conv' && node.op !== 'linear') return;
    const r = range.get(index);
    if (!r) throw new Error(`node ${index} was not observed`);
    const unsigned = r.min >= 0;
    const magnitude = Math.max(Math.abs(r.min), Math.abs(r.max));
    const rows = node.op === 'conv' ? node.outChannels : node.outFeatures;
    const per = node.weight.length / rows;
    const weightScales = new Float32Array(rows);
    for (let k = 0; k < rows; k++) {
      let m = 0;
      for (let i = k * per; i < (k + 1) * per; i++) m = Math.max(m, Math.abs(node.weight[i]!));
      weightScales[k] = m / 127;
    }
    node.quant = { inputScale: Math.fround(magnitude / (unsigned ? 255 : 127)), inputUnsigned: unsigned, weightScales };
  });
}
