/**
 * QDQ export of an INT8-quantized inference graph, run by ONNX Runtime: the graph's quantization
 * is computed here (max-abs calibration on shapes images, test/helpers/graph-reference.ts), the
 * file is checked against a float64 simulation of the same quantization (tight) and against the
 * f32 model (the int8 error, and top-1 agreement), and ONNX Runtime's optimized graph is checked
 * for the integer convolutions it fused the QDQ pattern into.
 *
 * Error measure: the largest absolute difference over the largest magnitude of the reference
 * logits (`relativeError` in helpers/onnx.ts).
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { exportOnnx, exportOnnxBytes } from '../lib/export/onnx.js';
import { decodeOnnxModel } from '../lib/export/onnx-schema.js';
import { lowerForInference, type InferenceGraph } from '../lib/inference/graph.js';
import {
  AdaptiveAvgPool2d,
  BatchNorm2d,
  Conv2d,
  Flatten,
  Linear,
  ReLU,
  ResNet18,
  Sequential,
  Tensor,
} from '../lib/index.js';
import { calibrate } from '../lib/inference/calibrate.js';
import { calibrateMaxAbs, evaluateGraph } from './helpers/graph-reference.js';
import { EXACT_INT8 } from './helpers/int8-reference.js';
import {
  argmaxRows,
  fitNearestMeanClassifier,
  labelledShapeImages,
  checkerPython,
  eagerLogits,
  nhwcToNchw,
  noiseImages,
  randomizeBatchNorms,
  relativeError,
  runChecker,
  runOnnx,
  shapeImages,
} from './helpers/onnx.js';

const dir = mkdtempSync(join(tmpdir(), 'rc-onnx-qdq-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const SIZE = 32;

/** What a TensorRT-flavour file means: every unsigned input on the s8 grid of the same range. */
function signedInputs(graph: InferenceGraph): InferenceGraph {
  return {
    ...graph,
    nodes: graph.nodes.map((node) =>
      (node.op === 'conv' || node.op === 'linear') && node.quant?.inputUnsigned
        ? {
            ...node,
            quant: {
              ...node.quant,
              inputScale: Math.fround((node.quant.inputScale * 255) / 127),
              inputUnsigned: false,
            },
          }
        : node,
    ),
  };
}
const CLASSES = 6;

describe('QDQ (INT8) ONNX export of ResNet-18', () => {
  const model = ResNet18({ numClasses: CLASSES, seed: 21 });
  randomizeBatchNorms(model, 22);
  const fit = labelledShapeImages(60, SIZE, 23);
  fitNearestMeanClassifier(model, fit.x, fit.labels, SIZE);
  const graph = lowerForInference(model);
  calibrateMaxAbs(graph, [{ x: fit.x.subarray(0, 16 * SIZE * SIZE * 3), dims: [16, SIZE, SIZE] }]);
  const batches = [
    { n: 24, x: shapeImages(24, SIZE, 24) },
    { n: 4, x: noiseImages(4, SIZE, 25) },
  ];
  const path = join(dir, 'r18-int8.onnx');
  const tensorrtPath = join(dir, 'r18-int8-tensorrt.onnx');
  let written: Awaited<ReturnType<typeof exportOnnx>>;
  beforeAll(async () => {
    written = await exportOnnx(graph, path, { layout: 'nhwc' });
  });
  afterAll(() => model.dispose());

  it('writes QuantizeLinear/DequantizeLinear on inputs and s8 per-channel weights with s32 biases', () => {
    expect(written.quantized).toBe(true);
    const m = decodeOnnxModel(readFileSync(path));
    const ops = m.graph.node.map((n) => n.opType);
    const count = (op: string) => ops.filter((o) => o === op).length;
    // 20 convolutions and the classifier: each has s8 weights and an s32 bias through DequantizeLinear.
    expect(count('Conv') + count('Gemm')).toBe(21);
    const int8 = m.graph.initializer.filter((t) => t.dataType === 3 && t.dims.length > 1);
    expect(int8.length).toBe(21);
    const int32 = m.graph.initializer.filter((t) => t.dataType === 6);
    expect(int32.filter((t) => t.name.endsWith('.bias_quantized')).length).toBe(21);
    expect(int32.filter((t) => t.name.endsWith('.bias_zero_point')).length).toBe(21);
    // The block outputs that feed both a block's first convolution and its downsample share one pair.
    expect(count('QuantizeLinear')).toBeLessThan(21);
    expect(count('DequantizeLinear')).toBe(count('QuantizeLinear') + 42);
    const stem = m.graph.initializer.find((t) => t.name === 'conv1.weight_quantized');
    expect(stem?.dims).toEqual([64, 3, 7, 7]);
  });

  it('ONNX Runtime equals the simulated quantization closely and the f32 model within int8 error, with the same top-1', async () => {
    const session = await ort.InferenceSession.create(path);
    let agree = 0;
    let total = 0;
    for (const { n, x } of batches) {
      const got = await runOnnx(session, x, [n, SIZE, SIZE, 3]);
      const simulated = evaluateGraph(graph, x, [n, SIZE, SIZE], { quantized: true });
      const f32 = eagerLogits(model, x, n, SIZE);
      // ONNX Runtime computes the quantization that the simulation does, not some other: its
      // distance to the simulation (one-step rounding flips of f32 against f64 sums, which grow
      // through the layers; measured 0.012 to 0.017) is a fraction of the int8 error (0.076 to 0.097).
      const toSimulation = relativeError(got, simulated);
      const int8Error = relativeError(simulated, f32);
      expect(toSimulation).toBeLessThan(0.3 * int8Error);
      const error = relativeError(got, f32);
      expect(error).toBeLessThan(0.15);
      expect(error).toBeGreaterThan(1e-3);
      const a = argmaxRows(got, CLASSES);
      const b = argmaxRows(f32, CLASSES);
      agree += a.filter((v, i) => v === b[i]).length;
      total += n;
    }
    // Measured: 26 of 28.
    expect(agree / total).toBeGreaterThanOrEqual(0.85);
    await session.release();
  });

  it('ONNX Runtime fuses QDQ convolutions into integer convolutions (QLinearConv) and the classifier into QGemm', async () => {
    const optimized = join(dir, 'r18-int8.optimized.onnx');
    const session = await ort.InferenceSession.create(path, {
      graphOptimizationLevel: 'extended',
      optimizedModelFilePath: optimized,
    });
    await session.release();
    const ops = decodeOnnxModel(readFileSync(optimized)).graph.node.map((n) => n.opType);
    // The first convolution of each of the 8 blocks (its output is quantized next); the others
    // end in the residual Add or the max pool and stay Conv on dequantized values. The classifier
    // becomes QGemm.
    expect(ops.filter((o) => o === 'QLinearConv').length).toBe(8);
    expect(ops).toContain('QGemm');
  });

  it("the TensorRT flavour (s8 activations only, f32 biases) runs with its own simulated quantization's numbers", async () => {
    const { bytes } = await exportOnnx(graph, tensorrtPath, { layout: 'nhwc', qdq: 'tensorrt' });
    const m = decodeOnnxModel(bytes);
    const types = new Set(m.graph.initializer.map((t) => t.dataType));
    expect([...types].sort()).toEqual([1, 3]); // f32 and s8: no u8, no s32
    for (const t of m.graph.initializer.filter((t) => t.name.endsWith('.weight_quantized'))) {
      expect(new Int8Array(t.rawData.buffer, t.rawData.byteOffset, t.rawData.length).includes(-128)).toBe(false);
    }
    const signed = signedInputs(graph);
    const session = await ort.InferenceSession.create(bytes);
    const { n, x } = batches[0]!;
    const got = await runOnnx(session, x, [n, SIZE, SIZE, 3]);
    const simulated = evaluateGraph(signed, x, [n, SIZE, SIZE], { quantized: true, floatBias: true });
    const f32 = eagerLogits(model, x, n, SIZE);
    // Measured: 0.056 from the simulation (ONNX Runtime without its graph optimizations is as far
    // from it, and from itself with them: the one-step rounding flips of different summation
    // orders, grown through 20 layers on the coarser grid) against 0.128 of int8 error; 22 of 24 top-1.
    expect(relativeError(got, simulated)).toBeLessThan(0.6 * relativeError(simulated, f32));
    const top1 = argmaxRows(f32, CLASSES);
    expect(argmaxRows(got, CLASSES).filter((v, k) => v === top1[k]).length / n).toBeGreaterThanOrEqual(0.85);
    expect(relativeError(got, f32)).toBeLessThan(0.2);
    await session.release();
  });

  it('the NCHW file computes the same as the NHWC one', async () => {
    const { bytes } = exportOnnxBytes(graph, {});
    const session = await ort.InferenceSession.create(bytes);
    const { n, x } = batches[0]!;
    const nchw = await runOnnx(session, nhwcToNchw(x, n, SIZE, SIZE, 3), [n, 3, SIZE, SIZE]);
    const nhwc = await runOnnx(await ort.InferenceSession.create(path), x, [n, SIZE, SIZE, 3]);
    expect(relativeError(nchw, nhwc)).toBeLessThan(1e-5);
  });

  it('refuses f16 for a quantized graph, and a malformed quantization naming its node', () => {
    expect(() => exportOnnxBytes(graph, { dtype: 'f16' })).toThrow(/options\.dtype/);
    const stem = graph.nodes[0]!;
    if (stem.op !== 'conv' || !stem.quant) throw new Error('the stem is not a quantized convolution');
    const bad = (quant: object) =>
      ({ ...graph, nodes: [{ ...stem, quant }, ...graph.nodes.slice(1)] }) as InferenceGraph;
    expect(() => exportOnnxBytes(bad({ ...stem.quant, inputScale: 0 }))).toThrow(/'conv1': inputScale/);
    expect(() => exportOnnxBytes(bad({ ...stem.quant, weightScales: new Float32Array(3) }))).toThrow(
      /64 scales.*'conv1': weightScales/,
    );
    expect(() => exportOnnxBytes(bad({ ...stem.quant, weightScales: new Float32Array(64).fill(NaN) }))).toThrow(
      /weightScales\[0\]/,
    );
  });

  it('a shallow network equals the simulated quantization within 1e-4 in both flavours (no layers for rounding flips to grow through)', async () => {
    const net = new Sequential(
      new Conv2d({ inChannels: 3, outChannels: 16, kernelSize: 3, padding: 1, seed: 26 }),
      new BatchNorm2d({ numFeatures: 16 }),
      new ReLU(),
      new AdaptiveAvgPool2d(1),
      new Flatten(),
      new Linear({ inFeatures: 16, outFeatures: 5, seed: 2 }),
    );
    net.to('cpu');
    randomizeBatchNorms(net, 26);
    const small = lowerForInference(net);
    const x = shapeImages(8, 16, 27);
    calibrateMaxAbs(small, [{ x, dims: [8, 16, 16] }]);
    const f32 = eagerLogits(net, x, 8, 16);
    for (const qdq of ['onnxruntime', 'tensorrt'] as const) {
      const session = await ort.InferenceSession.create(exportOnnxBytes(small, { layout: 'nhwc', qdq }).bytes);
      const got = await runOnnx(session, x, [8, 16, 16, 3]);
      // The TensorRT flavour's meaning: the unsigned input on the s8 grid of its range, f32 biases.
      const meant = qdq === 'onnxruntime' ? small : signedInputs(small);
      const simulated = evaluateGraph(meant, x, [8, 16, 16], { quantized: true, floatBias: qdq === 'tensorrt' });
      // ONNX Runtime's u8 x s8 kernels on a CPU without VNNI add pairs of products in saturating
      // 16-bit integers: on an AVX2 CPU these weights (seeded) gave 4e-8, others 0.9-22%.
      expect(relativeError(got, simulated), qdq).toBeLessThan(EXACT_INT8 ? 1e-4 : 0.25);
      // The quantization is there: the f32 network differs by far more.
      expect(relativeError(got, f32), qdq).toBeGreaterThan(1e-3);
      await session.release();
    }
    net.dispose();
  });

  it('with 7-bit weights ONNX Runtime computes the simulated quantization on every CPU, VNNI or not', async () => {
    const net = new Sequential(
      new Conv2d({ inChannels: 3, outChannels: 16, kernelSize: 3, padding: 1, seed: 26 }),
      new BatchNorm2d({ numFeatures: 16 }),
      new ReLU(),
      new Conv2d({ inChannels: 16, outChannels: 32, kernelSize: 3, padding: 1, seed: 27 }),
      new BatchNorm2d({ numFeatures: 32 }),
      new ReLU(),
      new AdaptiveAvgPool2d(1),
      new Flatten(),
      new Linear({ inFeatures: 32, outFeatures: 5, seed: 2 }),
    );
    randomizeBatchNorms(net, 26);
    const x = shapeImages(8, 16, 27);
    const graph = await calibrate(net, [Tensor.from(x, [8, 16, 16, 3])], { method: 'minmax', weightBits: 7 });
    const session = await ort.InferenceSession.create(
      exportOnnxBytes(graph, { layout: 'nhwc', qdq: 'onnxruntime' }).bytes,
    );
    const got = await runOnnx(session, x, [8, 16, 16, 3]);
    // Its u8 x s8 pair sums without VNNI cannot saturate on 7-bit weights: on an AVX2 CPU this
    // network gave 5e-8 with 7-bit weights and 14% with 8-bit ones.
    expect(relativeError(got, evaluateGraph(graph, x, [8, 16, 16], { quantized: true }))).toBeLessThan(1e-4);
    await session.release();
    net.dispose();
  });

  const found = checkerPython();
  const reason = 'reason' in found ? found.reason : undefined;
  it.skipIf(reason !== undefined)(
    `both flavours pass onnx.checker.check_model(full_check=True)${reason ? ` (skipped: ${reason})` : ''}`,
    () => {
      if ('python' in found) expect(runChecker(found.python, [path, tensorrtPath])).toBe('');
    },
  );
});
