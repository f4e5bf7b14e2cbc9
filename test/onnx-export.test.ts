/**
 * ONNX export, checked by running the files in ONNX Runtime (onnxruntime-node): ResNet-18 and
 * ResNet-50 with non-trivial batch-norm statistics, NCHW and NHWC inputs, a dynamic batch (batch 1
 * and 3 through one file) and dynamic spatial size, f32 and f16, every supported opset; the
 * metadata the file carries; ONNX's checker when a Python with `onnx` is given
 * (RESNET_TEST_PYTHON); and the errors of bad options.
 *
 * Error measure: the largest absolute difference over the largest magnitude of the reference
 * logits (`relativeError` in helpers/onnx.ts). The reference is the training modules' eval
 * forward on the same NHWC input.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_ONNX_OPSET, ONNX_OPSETS, exportOnnx, exportOnnxBytes } from '../lib/export/onnx.js';
import { decodeOnnxModel } from '../lib/export/onnx-schema.js';
import { float16Bits } from '../lib/export/float16.js';
import { lowerForInference } from '../lib/inference/graph.js';
import {
  AdaptiveAvgPool2d,
  BatchNorm2d,
  Conv2d,
  Flatten,
  Linear,
  MaxPool2d,
  ReLU,
  ResNet18,
  ResNet50,
  Sequential,
  type ResNet,
} from '../lib/index.js';
import {
  argmaxRows,
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

const F32_TOLERANCE = 1e-4;
/**
 * f16 weights and activations: a 10-bit mantissa rounds each value by up to 2^-11 (~5e-4) relative,
 * through 20 layers (measured on ResNet-18: 4.3e-4).
 */
const F16_TOLERANCE = 5e-3;

const dir = mkdtempSync(join(tmpdir(), 'rc-onnx-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
/** Files written by the tests, for ONNX's checker at the end. */
const written: string[] = [];

async function exportTo(
  model: Parameters<typeof exportOnnx>[0],
  file: string,
  options: Parameters<typeof exportOnnx>[2],
) {
  const path = join(dir, file);
  const result = await exportOnnx(model, path, options);
  written.push(path);
  return { path, result, session: await ort.InferenceSession.create(path) };
}

describe('ONNX export of ResNet-18 (32 px, 10 classes)', () => {
  let model: ResNet;
  beforeAll(() => {
    model = ResNet18({ numClasses: 10, seed: 1 });
    randomizeBatchNorms(model, 2);
  });
  afterAll(() => model.dispose());

  it('NCHW, dynamic batch and size: batch 1 and 3, noise and shapes, equal the eval forward within 1e-4', async () => {
    const { session, result } = await exportTo(model, 'r18-nchw.onnx', {});
    expect(result.input).toEqual({ name: 'input', shape: ['batch', 3, 'height', 'width'] });
    expect(result.output).toEqual({ name: 'logits', shape: ['batch', 10] });
    for (const [n, size, x] of [
      [1, 32, noiseImages(1, 32, 3)],
      [3, 32, shapeImages(3, 32, 4)],
      [3, 40, shapeImages(3, 40, 5)],
    ] as const) {
      const want = eagerLogits(model, x, n, size);
      const got = await runOnnx(session, nhwcToNchw(x, n, size, size, 3), [n, 3, size, size]);
      expect(got.length).toBe(n * 10);
      expect(relativeError(got, want), `batch ${n}, ${size} px`).toBeLessThan(F32_TOLERANCE);
    }
  });

  it('NHWC input (a Transpose inside the graph) equals the eval forward within 1e-4', async () => {
    const { session, result } = await exportTo(model, 'r18-nhwc.onnx', { layout: 'nhwc', inputSize: 32 });
    expect(result.input.shape).toEqual(['batch', 32, 32, 3]);
    for (const [n, x] of [
      [1, shapeImages(1, 32, 6)],
      [3, noiseImages(3, 32, 7)],
    ] as const) {
      const got = await runOnnx(session, x, [n, 32, 32, 3]);
      expect(relativeError(got, eagerLogits(model, x, n, 32))).toBeLessThan(F32_TOLERANCE);
    }
  });

  it('a fixed batch and size are fixed dims that ONNX Runtime enforces', async () => {
    const { session, result } = await exportTo(model, 'r18-fixed.onnx', { batch: 2, inputSize: [32, 32] });
    expect(result.input.shape).toEqual([2, 3, 32, 32]);
    expect(result.output.shape).toEqual([2, 10]);
    const x = shapeImages(2, 32, 8);
    const got = await runOnnx(session, nhwcToNchw(x, 2, 32, 32, 3), [2, 3, 32, 32]);
    expect(relativeError(got, eagerLogits(model, x, 2, 32))).toBeLessThan(F32_TOLERANCE);
    const three = shapeImages(3, 32, 9);
    await expect(runOnnx(session, nhwcToNchw(three, 3, 32, 32, 3), [3, 3, 32, 32])).rejects.toThrow(/dim|shape/i);
  });

  it(`f16 (half-precision weights and compute, f32 input and output) is within ${F16_TOLERANCE} and keeps the top-1`, async () => {
    const { session, path } = await exportTo(model, 'r18-f16.onnx', { dtype: 'f16', layout: 'nhwc' });
    const x = shapeImages(4, 32, 10);
    const got = await runOnnx(session, x, [4, 32, 32, 3]);
    const want = eagerLogits(model, x, 4, 32);
    const error = relativeError(got, want);
    expect(error).toBeLessThan(F16_TOLERANCE);
    // Not bit-equal to f32: the computation really is in half precision.
    expect(error).toBeGreaterThan(1e-5);
    expect(argmaxRows(got, 10)).toEqual(argmaxRows(want, 10));
    const decoded = decodeOnnxModel(readFileSync(path));
    const weight = decoded.graph.initializer.find((t) => t.name === 'conv1.weight');
    expect(weight?.dataType).toBe(10);
    const folded = lowerForInference(model).nodes[0]!;
    if (folded.op !== 'conv') throw new Error('the first node is not the stem convolution');
    // OIHW element [0, 0, 0, 0] is OHWI element 0: the folded weight rounded to f16.
    const bytes = weight?.rawData ?? new Uint8Array(2);
    expect(bytes[0]! | (bytes[1]! << 8)).toBe(float16Bits(folded.weight[0]!));
  });

  it('carries the IR version, opset, producer and the preprocessing and class names as metadata', () => {
    const classNames = Array.from({ length: 10 }, (_, i) => `class ${i}`);
    const { bytes, irVersion, opset } = exportOnnxBytes(model, {
      classNames,
      mean: [0.485, 0.456, 0.406],
      std: [0.229, 0.224, 0.225],
      inputName: 'images',
      outputName: 'scores',
    });
    expect([irVersion, opset]).toEqual([8, DEFAULT_ONNX_OPSET]);
    const m = decodeOnnxModel(bytes);
    expect(m.irVersion).toBe(8);
    expect(m.opsetImport).toEqual([{ version: 17 }]);
    expect(m.producerName).toBe('resnet-cuda');
    expect(m.graph.name).toBe('ResNet-18 (10 classes)');
    const meta = new Map(m.metadataProps.map((p) => [p.key, JSON.parse(p.value) as unknown]));
    expect(meta.get('class_names')).toEqual(classNames);
    expect(meta.get('mean')).toEqual([0.485, 0.456, 0.406]);
    expect(meta.get('std')).toEqual([0.229, 0.224, 0.225]);
    expect(m.graph.input.map((v) => v.name)).toEqual(['images']);
    expect(m.graph.output.map((v) => v.name)).toEqual(['scores']);
    // Batch norm is folded: 20 convolutions, no BatchNormalization; 8 residual Adds.
    const ops = m.graph.node.map((n) => n.opType);
    const count = (op: string) => ops.filter((o) => o === op).length;
    expect([count('Conv'), count('Add'), count('Relu'), count('MaxPool'), count('Gemm')]).toEqual([20, 8, 17, 1, 1]);
    expect(ops).not.toContain('BatchNormalization');
  });
});

describe('ONNX export of ResNet-50 (64 px, 10 classes)', () => {
  it('NCHW dynamic batch: batch 1 and 3 on shapes and noise equal the eval forward within 1e-4', async () => {
    const model = ResNet50({ numClasses: 10, seed: 11 });
    randomizeBatchNorms(model, 12);
    const { session } = await exportTo(model, 'r50-nchw.onnx', {});
    for (const [n, x] of [
      [1, noiseImages(1, 64, 13)],
      [3, shapeImages(3, 64, 14)],
    ] as const) {
      const got = await runOnnx(session, nhwcToNchw(x, n, 64, 64, 3), [n, 3, 64, 64]);
      expect(relativeError(got, eagerLogits(model, x, n, 64)), `batch ${n}`).toBeLessThan(F32_TOLERANCE);
    }
    await session.release();
    model.dispose();
  });
});

describe('ONNX export options', () => {
  /** A small network of every supported layer, one input channel. */
  function small(): Sequential {
    const net = new Sequential(
      new Conv2d({ inChannels: 1, outChannels: 8, kernelSize: 3, padding: 1, bias: true }),
      new BatchNorm2d({ numFeatures: 8 }),
      new ReLU(),
      new MaxPool2d({ kernelSize: 2, stride: 2 }),
      new AdaptiveAvgPool2d(1),
      new Flatten(),
      new Linear({ inFeatures: 8, outFeatures: 4, seed: 1 }),
    );
    net.to('cpu');
    randomizeBatchNorms(net, 3);
    return net;
  }

  it('every supported opset runs in ONNX Runtime with the same output', async () => {
    const net = small();
    const x = noiseImages(2, 8, 15, 1);
    const want = eagerLogits(net, x, 2, 8, 1);
    expect(ONNX_OPSETS).toEqual([13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]);
    for (const opset of ONNX_OPSETS) {
      const { session } = await exportTo(net, `small-opset${opset}.onnx`, { opset, layout: 'nhwc' });
      expect(relativeError(await runOnnx(session, x, [2, 8, 8, 1]), want), `opset ${opset}`).toBeLessThan(
        F32_TOLERANCE,
      );
    }
    net.dispose();
  });

  it('rejects bad options with an error naming the option', () => {
    const net = small();
    const bad: [object, RegExp][] = [
      [{ opset: 12 }, /options\.opset/],
      [{ opset: 24 }, /options\.opset/],
      [{ batch: 0 }, /options\.batch/],
      [{ batch: 'auto' }, /options\.batch/],
      [{ layout: 'chw' }, /options\.layout/],
      [{ dtype: 'bf16' }, /options\.dtype/],
      [{ inputSize: [32] }, /options\.inputSize/],
      [{ inputSize: 0 }, /options\.inputSize/],
      [{ inputName: '' }, /options\.inputName/],
      [{ inputName: 'x', outputName: 'x' }, /options\.outputName/],
      [{ classNames: ['a', 'b'] }, /4 class names.*options\.classNames/],
      [{ mean: [0.5, 0.5] }, /options\.mean/],
      [{ std: [0.5, 'x'] }, /options\.std/],
      [{ layuot: 'nhwc' }, /Unknown option 'layuot'/],
    ];
    for (const [options, message] of bad) {
      expect(() => exportOnnxBytes(net, options as never), JSON.stringify(options)).toThrow(message);
    }
    expect(() => exportOnnxBytes({} as never)).toThrow(/for model/);
    // An input named like a weight keeps its name; the weight takes another.
    const renamed = decodeOnnxModel(exportOnnxBytes(net, { inputName: '0.weight' }).bytes).graph;
    expect(renamed.input[0]?.name).toBe('0.weight');
    expect(renamed.initializer.map((t) => t.name)).toContain('0.weight_2');
    net.dispose();
  });

  it('rejects an empty path', async () => {
    const net = small();
    await expect(exportOnnx(net, '')).rejects.toThrow(/for path/);
    net.dispose();
  });
});

// Last: ONNX's own checker on every file written above.
describe('ONNX checker', () => {
  const found = checkerPython();
  const reason = 'reason' in found ? found.reason : undefined;
  it.skipIf(reason !== undefined)(
    `onnx.checker.check_model(full_check=True) passes every exported file${reason ? ` (skipped: ${reason})` : ''}`,
    () => {
      if (!('python' in found)) return;
      expect(written.length).toBeGreaterThan(10);
      expect(runChecker(found.python, written)).toBe('');
    },
  );
});
