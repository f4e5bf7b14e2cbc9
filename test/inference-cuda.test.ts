/**
 * The inference plan on the CUDA backend (native/cuda/inference.cc): the Predictor on a CUDA device
 * against the training modules' eval forward on the CPU, and its errors. Runs in the
 * 'cuda-emulator-cases' project on the emulated device (test/cuda-emulator); without a usable CUDA
 * backend the cases are skipped with the reason.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { CudaGraph, ResNet18, ResNet50, Tensor, listBackends, type Module } from '../lib/index.js';
import { addon } from '../lib/binding.js';
import { lowerForInference } from '../lib/inference/graph.js';
import { Predictor, rawInferenceNode, type PredictorDType } from '../lib/inference/predictor.js';
import {
  INFERENCE_TOLERANCE,
  evalForward,
  hostBatch,
  maxRelativeError,
  predictOn,
  randomizeBatchNorms,
  type HostBatch,
} from './gpu/inference.js';

const cuda = listBackends().find((b) => b.name === 'cuda');
const reason = cuda?.available ? undefined : (cuda?.reason ?? 'no CUDA backend');

/** The predictor's logits for the batch on the CUDA device. */
function predictOnCuda(model: Module, dtype: PredictorDType, x: HostBatch): Float32Array {
  const predictor = new Predictor(model, { device: 'cuda', dtype });
  try {
    return predictOn(predictor, x);
  } finally {
    predictor.dispose();
  }
}

describe.skipIf(reason !== undefined)(`inference plan on CUDA${reason ? ` (skipped: ${reason})` : ''}`, () => {
  // Small-input ResNet-18 at 16 px: 3x3 stem, BasicBlocks, stride-2 blocks with 1x1 downsample
  // shortcuts, global pooling and the fc.
  it('ResNet-18 (small input, 16 px, batch 2) equals the eval forward in f32, bf16 and f16', () => {
    const model = ResNet18({ numClasses: 10, smallInput: true, seed: 11 });
    randomizeBatchNorms(model, 12);
    const x = hostBatch(2, 16, 13);
    const expected = evalForward(model, x);
    for (const dtype of ['f32', 'bf16', 'f16'] as const) {
      const error = maxRelativeError(predictOnCuda(model, dtype, x), expected);
      expect(error, `${dtype}: max |difference| / max |logit| = ${error.toExponential(2)}`).toBeLessThanOrEqual(
        INFERENCE_TOLERANCE[dtype],
      );
    }
    model.dispose();
  });

  // ResNet-50 with the 7x7 stride-2 stem and the max pooling at 32 px, its inner widths narrowed
  // so the emulated device runs it quickly (the blocks' outputs keep torchvision's widths).
  it('a narrow ResNet-50 (224 px stem with max pooling, 32 px, batch 2) equals the eval forward in f32 and bf16', () => {
    const model = ResNet50({ numClasses: 7, seed: 21, blockWidths: Array.from({ length: 16 }, () => [4, 4]) });
    randomizeBatchNorms(model, 22);
    const x = hostBatch(2, 32, 23);
    const expected = evalForward(model, x);
    for (const dtype of ['f32', 'bf16'] as const) {
      const error = maxRelativeError(predictOnCuda(model, dtype, x), expected);
      expect(error, `${dtype}: max |difference| / max |logit| = ${error.toExponential(2)}`).toBeLessThanOrEqual(
        INFERENCE_TOLERANCE[dtype],
      );
    }
    model.dispose();
  });

  it('names the fused cuDNN call and its algorithms, and reuses the plan of a shape', () => {
    const model = ResNet18({ numClasses: 4, smallInput: true, seed: 31 });
    const predictor = new Predictor(model, { device: 'cuda', dtype: 'bf16' });
    const impl = predictor.implementation([1, 8, 8, 3]);
    expect(impl).toMatch(/^cudnn:conv_bias_act\[/);
    // The shortcut convolutions have no ReLU: cuDNN runs the identity only with PRECOMP_GEMM.
    expect(impl).toMatch(/implicit_precomp_gemmx\d+/);
    expect(impl).toMatch(/ bf16 tensor-op /);
    const x = Tensor.from(hostBatch(1, 8, 32).data, [1, 8, 8, 3], { device: 'cuda' });
    const a = predictor.predict(x);
    const b = predictor.predict(x);
    expect(b.toFloat32Array()).toEqual(a.toFloat32Array());
    for (const t of [x, a, b]) t.dispose();
    predictor.dispose();
    model.dispose();
  });

  // The plan's run() enqueues only (no allocation, host wait or descriptor work), so it can be
  // captured. The native plan is used directly with an output allocated before the capture: the
  // emulated cuBLAS and cuDNN check their pointers when called, and memory a capture allocates
  // exists only while the graph runs.
  it('runs inside a captured CUDA graph: replays on new input give the eager logits', () => {
    const model = ResNet18({ numClasses: 5, smallInput: true, seed: 61 });
    randomizeBatchNorms(model, 62);
    const graph = lowerForInference(model);
    const nodes = graph.nodes.map(rawInferenceNode);
    const plan = new (addon().InferencePlan)({
      device: 'cuda',
      dtype: 'f32',
      int8: false,
      n: 2,
      h: 8,
      w: 8,
      c: 3,
      nodes,
    });
    const first = hostBatch(2, 8, 63);
    const second = hostBatch(2, 8, 64);
    const x = Tensor.from(first.data, first.shape, { device: 'cuda' });
    const y = Tensor.empty([2, 5], { dtype: 'f32', device: 'cuda' });
    const cudaGraph = CudaGraph.capture('cuda', () => plan.run({ x: x.raw, y: y.raw }));
    x.raw.copyFromHost(second.data);
    cudaGraph.replay();
    const replayed = y.toFloat32Array();
    plan.run({ x: x.raw, y: y.raw });
    expect(replayed).toEqual(y.toFloat32Array());
    x.raw.copyFromHost(first.data);
    cudaGraph.replay();
    expect(maxRelativeError(y.toFloat32Array(), evalForward(model, first))).toBeLessThanOrEqual(
      INFERENCE_TOLERANCE.f32,
    );
    cudaGraph.dispose();
    plan.dispose();
    for (const t of [x, y]) t.dispose();
    model.dispose();
  });

  it('refuses INT8 plans and input of the wrong shape or device with clear errors', () => {
    const model = ResNet18({ numClasses: 4, smallInput: true, seed: 41 });
    const graph = lowerForInference(model);
    for (const node of graph.nodes) {
      if (node.op === 'conv' || node.op === 'linear') {
        const outputs = node.op === 'conv' ? node.outChannels : node.outFeatures;
        node.quant = { inputScale: 0.05, inputUnsigned: false, weightScales: new Float32Array(outputs).fill(0.01) };
      }
    }
    const int8 = new Predictor(graph, { device: 'cuda', dtype: 'int8' });
    const x = Tensor.from(hostBatch(1, 8, 42).data, [1, 8, 8, 3], { device: 'cuda' });
    expect(() => int8.predict(x)).toThrow(/INT8 plans run on the CPU backend/);
    int8.dispose();

    const predictor = new Predictor(model, { device: 'cuda' });
    const wrongChannels = Tensor.from(new Float32Array(64), [1, 8, 8, 1], { device: 'cuda' });
    expect(() => predictor.predict(wrongChannels)).toThrow(/x/);
    const onCpu = Tensor.from(hostBatch(1, 8, 43).data, [1, 8, 8, 3]);
    expect(() => predictor.predict(onCpu)).toThrow(/cuda/);
    for (const t of [x, wrongChannels, onCpu]) t.dispose();
    predictor.dispose();
    model.dispose();
  });

  // The emulator's cudnnConvolutionBiasActivationForward: results and argument checks against
  // cuDNN's documented behaviour, in its own C++ test next to the emulated backend.
  const library = process.env.RESNET_CUDA_BACKEND_LIBRARY;
  const fusedTest = library ? join(dirname(library), 'rc_emu_fused_conv_test') : '';
  it.skipIf(!existsSync(fusedTest))(
    "the emulator's fused convolution: results against a direct sum, and the documented refusals",
    () => {
      const r = spawnSync(fusedTest, [], { encoding: 'utf8' });
      expect(r.stdout + r.stderr).toMatch(/fused conv: \d+ passed, 0 failed/);
      expect(r.status).toBe(0);
    },
  );
});
