/**
 * The roofline model of a training step: FLOPs against the model summary, the bytes of single ops
 * against hand counts from the kernels, the peaks table, the fused plan against today's, the plan as
 * built for each fused path against today's and the target, the bound arithmetic, errors, and
 * `bench --model-only`.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { GPU_NAMES, GPU_PEAKS } from '../lib/analysis/gpu-peaks.js';
import { builtPlan, CONV_BN_BUILT, type ConvBnBuilt } from '../lib/analysis/plan-built.js';
import { currentPlan } from '../lib/analysis/plan-current.js';
import { fusedPlan } from '../lib/analysis/plan-fused.js';
import { stepRoofline, type StepRoofline } from '../lib/analysis/roofline.js';
import { stepLayers } from '../lib/analysis/step-layers.js';
import type { StepOp } from '../lib/analysis/step-ops.js';
import { setCheckpointing } from '../lib/nn/checkpoint.js';
import type { FusedPath } from '../lib/fused-paths.js';
import { Residual, Sequential } from '../lib/nn/containers.js';
import { AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, ReLU } from '../lib/nn/layers.js';
import { ResNet } from '../lib/nn/resnet.js';
import { summary } from '../lib/nn/summary.js';
import { Profiler } from '../lib/profile/profiler.js';
import { benchmarkTraining } from '../lib/train/benchmark.js';
import { runCli } from './helpers/cli.js';
import { withFused } from './helpers/fused-runs.js';

const dir = mkdtempSync(join(tmpdir(), 'rc-roofline-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let resnet50: ResNet;
beforeAll(() => {
  resnet50 = new ResNet(50, { seed: 1 });
});
afterAll(() => resnet50.dispose());

const sum = (
  ops: readonly StepOp[],
  pick: (o: StepOp) => boolean,
  field: 'flops' | 'bytesRead' | 'bytesWritten' | 'launches',
) => ops.filter(pick).reduce((a, o) => a + o[field], 0);

describe('FLOPs', () => {
  it('counts twice the multiply-accumulates of summary for the forward: 4.09 GMAC per ResNet-50 image at 224 px', () => {
    const r = stepRoofline(resnet50, { batchSize: 1 });
    const macs = summary(resnet50, { inputSize: 224 }).macs;
    expect(r.forwardMatmulFlops).toBe(2 * macs);
    expect(macs / 1e9).toBeGreaterThan(4.08);
    expect(macs / 1e9).toBeLessThan(4.11);
  });

  it('makes a training step three forwards of convolutions and GEMMs, less the stem convolution backward data that is never run', () => {
    const r = stepRoofline(resnet50, { batchSize: 8 });
    const macs = summary(resnet50, { inputSize: 224, batchSize: 8 }).macs;
    const stem = 8 * 112 * 112 * 64 * 7 * 7 * 3; // the 7x7 stride-2 stem: no input gradient for the image
    const matmul = sum(r.ops, (o) => o.type.startsWith('conv') || o.type === 'gemm', 'flops');
    expect(matmul).toBe(3 * 2 * macs - 2 * stem);
    expect(matmul / (2 * macs)).toBeCloseTo(2.971, 3);
    // Element-wise work (batch norm, adds, loss, optimizer) adds about 1%.
    expect(r.total.flops / matmul).toBeLessThan(1.02);
    expect(r.total.flops / matmul).toBeGreaterThan(1);
  });
});

describe('bytes of single ops, counted by hand from the kernels', () => {
  // conv 3x3 8 -> 16 channels on [2, 8, 8, 8] (pad 1), BN, global pooling, linear 16 -> 4.
  const model = new Sequential(
    new Conv2d({ inChannels: 8, outChannels: 16, kernelSize: 3, padding: 1, seed: 1 }),
    new BatchNorm2d({ numFeatures: 16 }),
    new AdaptiveAvgPool2d(1),
    new Flatten(),
    new Linear({ inFeatures: 16, outFeatures: 4, seed: 2 }),
  );
  afterAll(() => model.dispose());
  const ops = () => currentPlan(stepLayers(model, [2, 8, 8, 8]), { activationBytes: 2, gradScaler: false });

  it('a bf16 convolution: the weight cast, cuDNN forward, backward filter, its f32 accumulation, backward data', () => {
    const conv = ops().filter((o) => o.layer === '0');
    const x = 2 * 8 * 8 * 8;
    const y = 2 * 8 * 8 * 16;
    const w = 16 * 3 * 3 * 8;
    const find = (kernel: string) => conv.filter((o) => o.kernel === kernel);
    expect(find('cast_kernel')).toEqual([
      expect.objectContaining({ bytesRead: 4 * w, bytesWritten: 2 * w, launches: 1 }),
      expect.objectContaining({ bytesRead: 4 * w, bytesWritten: 2 * w, launches: 1 }),
    ]);
    expect(find('cudnnConvolutionForward')[0]).toMatchObject({
      flops: 2 * y * 72,
      bytesRead: 2 * (x + w),
      bytesWritten: 2 * y,
    });
    expect(find('cudnnConvolutionBackwardFilter')[0]).toMatchObject({ bytesRead: 2 * (x + y), bytesWritten: 2 * w });
    expect(find('accumulate_f32_kernel')[0]).toMatchObject({ bytesRead: 6 * w, bytesWritten: 4 * w });
    expect(find('cudnnConvolutionBackwardData')[0]).toMatchObject({ bytesRead: 2 * (y + w), bytesWritten: 2 * x });
    expect(conv.reduce((a, o) => a + o.launches, 0)).toBe(6);
  });

  it("a training batch norm: statistics, finalize and normalisation forward; the backward's three kernels", () => {
    const bn = ops().filter((o) => o.layer === '1');
    // rows 128, C 16: reductionRowBlocks gives 4 blocks of 32 rows; partials 2 x 16 x 4 f32 = 512 bytes.
    const e = 2 * 8 * 8 * 16;
    const fwd = bn.filter((o) => o.type === 'bn fwd');
    expect(fwd.map((o) => [o.kernel, o.bytesRead, o.bytesWritten])).toEqual([
      ['batchnorm_stats_kernel', 2 * e, 512],
      ['batchnorm_stats_finalize_kernel', 512 + 2 * 4 * 16, 4 * 4 * 16],
      ['batchnorm_fwd_kernel', 2 * e + 4 * 4 * 16, 2 * e],
    ]);
    const bwd = bn.filter((o) => o.type === 'bn bwd');
    // No ReLU: x and dy read by the statistics and by the dx kernel; dx written.
    expect(bwd.map((o) => [o.kernel, o.bytesRead, o.bytesWritten])).toEqual([
      ['batchnorm_bwd_stats_kernel', 2 * 2 * e + 2 * 4 * 16, 512],
      ['batchnorm_bwd_finalize_kernel', 512 + 3 * 4 * 16, 4 * 4 * 16],
      ['batchnorm_bwd_kernel', 2 * 2 * e + 5 * 4 * 16, 2 * e],
    ]);
  });

  it('the optimizer and the gradient zeroing cover the parameter arena in f32', () => {
    const params = 16 * 72 + 2 * 16 + 16 * 4 + 4;
    const all = ops();
    expect(all.find((o) => o.type === 'optimizer')).toMatchObject({
      bytesRead: 12 * params,
      bytesWritten: 8 * params,
      launches: 1,
    });
    expect(all.find((o) => o.type === 'zero grad')).toMatchObject({
      bytesRead: 0,
      bytesWritten: 4 * params,
      launches: 1,
    });
    expect(all.some((o) => o.type === 'scaler')).toBe(false);
    const scaled = currentPlan(stepLayers(model, [2, 8, 8, 8]), { activationBytes: 2, gradScaler: true });
    expect(scaled.find((o) => o.kernel === 'unscale_kernel')).toMatchObject({
      bytesRead: 4 * params,
      bytesWritten: 4 * params,
    });
  });
});

describe('the current plan against a step that runs', () => {
  it('has the library calls, per op type, that the profiler records in a ResNet-18 training step (CPU)', () => {
    const model = new ResNet(18, { numClasses: 10, seed: 4 });
    onTestFinished(() => model.dispose());
    const profiler = new Profiler({ model });
    benchmarkTraining({
      model,
      device: 'cpu',
      numClasses: 10,
      dtype: 'bf16',
      batch: 2,
      size: 32,
      steps: 1,
      warmup: 1,
      profiler,
    });
    const calls = new Map(profiler.summary().byOp.map((r) => [r.name, r.calls]));
    const plan = stepRoofline(model, { batchSize: 2, inputSize: 32, plan: 'current' });
    const count = (kernel: string) => plan.ops.filter((o) => o.kernel === kernel).length;
    expect({
      convert_input: count('convert_input_kernel'),
      'conv2d.forward': count('cudnnConvolutionForward'),
      'conv2d.backward_data': count('cudnnConvolutionBackwardData'),
      'conv2d.backward_weights': count('cudnnConvolutionBackwardFilter'),
      'batchnorm.forward': count('batchnorm_fwd_kernel'),
      'batchnorm.backward': count('batchnorm_bwd_kernel'),
      add: count('add_kernel'),
      'max_pool2d.forward': count('maxpool_fwd_kernel'),
      'max_pool2d.backward': count('maxpool_bwd_kernel'),
      'avg_pool2d.forward': count('avgpool_fwd_kernel'),
      'avg_pool2d.backward': count('avgpool_bwd_kernel'),
      'linear.forward': count('cublasGemmEx (forward)'),
      'linear.backward_data': count('cublasGemmEx (input gradient)'),
      'linear.backward_weights': count('cublasGemmEx (weight gradient)'),
      zero_grad: count('cudaMemsetAsync (gradient arena)'),
    }).toEqual(
      Object.fromEntries(
        [
          'convert_input',
          'conv2d.forward',
          'conv2d.backward_data',
          'conv2d.backward_weights',
          'batchnorm.forward',
          'batchnorm.backward',
          'add',
          'max_pool2d.forward',
          'max_pool2d.backward',
          'avg_pool2d.forward',
          'avg_pool2d.backward',
          'linear.forward',
          'linear.backward_data',
          'linear.backward_weights',
          'zero_grad',
        ].map((name) => [name, calls.get(name) ?? 0]),
      ),
    );
    // ResNet-18: 20 convolutions, the stem's without backward data; 8 blocks, each summing its
    // input gradient in its first convolution's backward data, which reads that gradient too.
    expect(count('cudnnConvolutionForward')).toBe(20);
    expect(count('cudnnConvolutionBackwardData')).toBe(19);
    expect(count('add_kernel')).toBe(0);
    const dgrad = plan.ops.find((o) => o.kernel === 'cudnnConvolutionBackwardData' && o.layer === 'layer1.0.conv1');
    const x = 2 * 8 * 8 * 64;
    expect(dgrad).toMatchObject({ bytesRead: 2 * (x + 64 * 9 * 64 + x), bytesWritten: 2 * x });
  });
});

describe('bytes of fused ops, counted by hand', () => {
  it('scale-bias-relu-conv-genstats forward and dgrad-drelu-dbn backward of a 1x1 convolution between two BNs', () => {
    const model = new Sequential(
      new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 1, seed: 1 }),
      new BatchNorm2d({ numFeatures: 8, relu: true }),
      new Conv2d({ inChannels: 8, outChannels: 8, kernelSize: 1, seed: 2 }),
      new BatchNorm2d({ numFeatures: 8, relu: true }),
      new AdaptiveAvgPool2d(1),
      new Flatten(),
      new Linear({ inFeatures: 8, outFeatures: 2, seed: 3 }),
    );
    onTestFinished(() => model.dispose());
    const ops = fusedPlan(stepLayers(model, [2, 4, 4, 3]), { activationBytes: 2, gradScaler: false });
    const conv = ops.filter((o) => o.layer === '2');
    const e = 2 * 4 * 4 * 8; // elements of both raw outputs
    const stats = 2 * 4 * 8; // sum and sum of squares per channel, one tile of 128 rows
    // Forward: the raw y1 read through BN1's scale and bias, the weight; raw y2 and its sums written.
    expect(conv.find((o) => o.type === 'conv fwd')).toMatchObject({
      kernel: 'scale-bias-relu-conv-genstats',
      bytesRead: 2 * (e + 64) + 2 * 4 * 8,
      bytesWritten: 2 * e + stats,
    });
    // Backward data: (g2, raw y2) and BN2's coefficients, the weight, raw y1 for the mask and x-hat;
    // g1 and BN1's sums written.
    expect(conv.find((o) => o.type === 'conv dgrad')).toMatchObject({
      kernel: 'dbn-apply dgrad + drelu-dbn',
      bytesRead: 2 * 2 * e + 3 * 4 * 8 + 2 * 64 + 2 * e,
      bytesWritten: 2 * e + stats,
    });
    // Nothing but the finalize kernels for the first BN; the second is written out once for the pooling.
    expect(ops.filter((o) => o.layer === '1').map((o) => o.kernel)).toEqual(['bn finalize', 'dbn finalize']);
    expect(ops.filter((o) => o.layer === '3').map((o) => o.kernel)).toEqual(['bn finalize', 'bn-relu', 'dbn finalize']);
  });
});

describe('the plan as built, path by path', () => {
  // A conv-BN-ReLU, then a downsample bottleneck of 1x1 convolutions (8 -> 8 -> 16, shortcut 8 -> 16),
  // global pooling and a linear layer, on [2, 4, 4, 8]: 32 rows, one reduction row block per BN.
  const model = new Sequential(
    new Conv2d({ inChannels: 8, outChannels: 8, kernelSize: 1, seed: 1 }),
    new BatchNorm2d({ numFeatures: 8, relu: true }),
    new Residual(
      [
        ['conv1', new Conv2d({ inChannels: 8, outChannels: 8, kernelSize: 1, seed: 2 })],
        ['bn1', new BatchNorm2d({ numFeatures: 8, relu: true })],
        ['conv2', new Conv2d({ inChannels: 8, outChannels: 16, kernelSize: 1, seed: 3 })],
        ['bn2', new BatchNorm2d({ numFeatures: 16, relu: true })],
      ],
      [
        'downsample',
        new Sequential(
          new Conv2d({ inChannels: 8, outChannels: 16, kernelSize: 1, seed: 4 }),
          new BatchNorm2d({ numFeatures: 16 }),
        ),
      ],
    ),
    new AdaptiveAvgPool2d(1),
    new Flatten(),
    new Linear({ inFeatures: 16, outFeatures: 2, seed: 5 }),
  );
  afterAll(() => model.dispose());
  const step = () => stepLayers(model, [2, 4, 4, 8]);
  const current = (gradScaler = false) => currentPlan(step(), { activationBytes: 2, gradScaler });
  const built = (fused: FusedPath[], convBn: Partial<ConvBnBuilt> = {}, gradScaler = false) =>
    builtPlan(step(), {
      activationBytes: 2,
      gradScaler,
      fused: new Set(fused),
      convBn: { ...CONV_BN_BUILT, ...convBn },
    });
  // The ops of `a` not in `b` (as a multiset), as [layer, kernel, read, written, launches].
  const minus = (a: readonly StepOp[], b: readonly StepOp[]) => {
    const left = b.map((o) => JSON.stringify(o));
    return a
      .filter((o) => {
        const i = left.indexOf(JSON.stringify(o));
        if (i < 0) return true;
        left.splice(i, 1);
        return false;
      })
      .map((o) => [o.layer, o.kernel, o.bytesRead, o.bytesWritten, o.launches]);
  };
  const kernels = (ops: readonly StepOp[], layer: string) => ops.filter((o) => o.layer === layer).map((o) => o.kernel);
  // Trained parameters: convolutions 64 + 64 + 128 + 128, four BNs 2 x (8 + 8 + 16 + 16), linear 32 + 2.
  const params = 64 + 64 + 128 + 128 + 2 * (8 + 8 + 16 + 16) + 34;

  it('with no path on is the current plan, op for op', () => {
    expect(built([])).toEqual(current());
    expect(built([], {}, true)).toEqual(current(true));
    for (const [net, input] of [
      [resnet50, [4, 64, 64, 3]],
      [new ResNet(18, { smallInput: true, numClasses: 10, seed: 3 }), [4, 16, 16, 3]],
    ] as const) {
      const layers = stepLayers(net, input);
      for (const gradScaler of [false, true]) {
        expect(builtPlan(layers, { activationBytes: 2, gradScaler, fused: new Set(), convBn: CONV_BN_BUILT })).toEqual(
          currentPlan(layers, { activationBytes: 2, gradScaler }),
        );
      }
      if (net !== resnet50) net.dispose();
    }
  });

  it('optim: the update, the unscale, the scale update and the zeroing become one SGD kernel (and a check pass under a GradScaler)', () => {
    expect(minus(current(), built(['optim']))).toEqual([
      ['step', 'sgd_step_kernel', 12 * params, 8 * params, 1],
      ['step', 'cudaMemsetAsync (gradient arena)', 0, 4 * params, 1],
    ]);
    expect(minus(built(['optim']), current())).toEqual([
      ['step', 'fused_sgd_kernel (SGD + zero)', 12 * params, 12 * params, 1],
    ]);
    expect(minus(current(true), built(['optim'], {}, true))).toEqual([
      ['step', 'unscale_kernel', 4 * params, 4 * params, 1],
      ['step', 'sgd_step_kernel', 12 * params, 8 * params, 1],
      ['step', 'scaler_update_kernel', 12, 8, 1],
      ['step', 'cudaMemsetAsync (gradient arena)', 0, 4 * params, 1],
    ]);
    expect(minus(built(['optim'], {}, true), current(true))).toEqual([
      ['step', 'fused_first_pass_kernel (check)', 4 * params, 0, 1],
      ['step', 'fused_sgd_kernel (unscale + SGD + scale update + zero)', 12 * params + 12, 12 * params + 8, 1],
    ]);
  });

  it("bn-add-relu: the block's two batch norms become one dual pass forward and one backward", () => {
    const fused = built(['bn-add-relu']);
    // Removed: both BNs' three forward kernels (the shortcut runs first) and three backward kernels.
    const main = ['2.bn2', '2.bn2', '2.bn2'];
    const shortcut = ['2.downsample.1', '2.downsample.1', '2.downsample.1'];
    expect(minus(current(), fused).map(([layer]) => layer)).toEqual([...shortcut, ...main, ...main, ...shortcut]);
    // e = 2 x 4 x 4 x 16 bf16 elements, 16 channels, one row block: partials 2 x 4 x 16 bytes per input.
    const e = 2 * 2 * 4 * 4 * 16;
    expect(minus(fused, current())).toEqual([
      ['2.bn2', 'batchnorm_stats_kernel (dual)', 2 * e, 2 * 128, 1],
      ['2.bn2', 'batchnorm_stats_finalize_kernel (dual)', 2 * 128 + 4 * 64, 8 * 64, 1],
      ['2.bn2', 'batchnorm_fwd_kernel (dual)', 2 * e + 8 * 64, e, 1],
      // Backward: both raw outputs, dy and the block output (the ReLU mask), three sums.
      ['2.bn2', 'batchnorm_bwd_stats_kernel (dual)', 4 * e + 4 * 64, 3 * 64, 1],
      ['2.bn2', 'batchnorm_bwd_finalize_kernel (dual)', 3 * 64 + 6 * 64, 7 * 64, 1],
      ['2.bn2', 'batchnorm_bwd_kernel (dual)', 4 * e + 9 * 64, 2 * e, 1],
    ]);
    expect(kernels(fused, '2.downsample.1')).toEqual([]);
  });

  it("conv-bn: sums in the epilogues, finalize instead of statistics, bn1 in conv2's prologue and its fused backward", () => {
    const fused = built(['conv-bn']);
    const x = 2 * 2 * 4 * 4 * 8; // bytes of an 8-channel activation
    const y = 2 * x; // of a 16-channel one
    // Every convolution but none (all have channel counts that are multiples of 8) writes its sums.
    for (const layer of ['0', '2.conv1', '2.downsample.0']) {
      expect(kernels(fused, layer).filter((k) => k.startsWith('convBnForward'))).toEqual([
        'convBnForward (conv + genstats)',
      ]);
    }
    // The BNs after them finalize from the sums and normalise; bn1 only finalizes.
    for (const layer of ['1', '2.bn2', '2.downsample.1']) {
      expect(kernels(fused, layer).slice(0, 2)).toEqual([
        'conv_bn_finalize_kernel',
        'batchnorm_fwd_kernel (finalized statistics)',
      ]);
    }
    expect(kernels(fused, '2.bn1')).toEqual([
      'conv_bn_finalize_kernel',
      'accumulate_bn_grads_kernel',
      'batchNormBackwardApply',
    ]);
    const conv2 = fused.filter((o) => o.layer === '2.conv2' || o.kernel.includes('recompute'));
    expect(conv2.map((o) => [o.layer, o.kernel, o.bytesRead, o.bytesWritten])).toEqual([
      ['2.conv2', 'cast_kernel', 4 * 128, 2 * 128],
      // The raw conv1 output through bn1's scale and shift (f32[8] each), the weight; y2 and its sums.
      ['2.conv2', 'convBnForward (scale-bias-relu + conv + genstats)', x + 2 * 128 + 2 * 4 * 8, y + 2 * 4 * 16],
      // Backward: the weight gradient through the same prologue (the raw x, scale and shift, dy), in
      // bf16, then added to the f32 gradient.
      ['2.conv2', 'convWgradSbr', x + y + 2 * 4 * 8, 2 * 128],
      ['2.conv2', 'accumulate_f32_kernel', 6 * 128, 4 * 128],
      ['2.conv2', 'cast_kernel', 4 * 128, 2 * 128],
      // dy, the weight, the raw x; five f32[8] in (scale, shift, mean, inv std, gamma), dz and five
      // f32[8] out (dScale, dBias and the three coefficients).
      ['2.conv2', 'convDgradDbn', y + 2 * 128 + x + 5 * 4 * 8, x + 5 * 4 * 8],
    ]);
    // dScale and dBias added to dGamma and dBeta.
    expect(fused.find((o) => o.kernel === 'accumulate_bn_grads_kernel')).toMatchObject({
      layer: '2.bn1',
      bytesRead: 4 * 4 * 8,
      bytesWritten: 2 * 4 * 8,
    });
    // dx = eqDz * dz + eqX * x + eqBias: dz and x read, dx written.
    expect(fused.find((o) => o.kernel === 'batchNormBackwardApply')).toMatchObject({
      layer: '2.bn1',
      bytesRead: 2 * x + 3 * 4 * 8,
      bytesWritten: x,
    });
    // Removed: bn1's statistics, normalisation and backward, the other BNs' statistics kernels.
    const removed = minus(current(), fused).map(([layer, kernel]) => `${String(layer)} ${String(kernel)}`);
    expect(removed.filter((k) => k.startsWith('2.bn1'))).toEqual([
      '2.bn1 batchnorm_stats_kernel',
      '2.bn1 batchnorm_stats_finalize_kernel',
      '2.bn1 batchnorm_fwd_kernel',
      '2.bn1 batchnorm_bwd_stats_kernel',
      '2.bn1 batchnorm_bwd_finalize_kernel',
      '2.bn1 batchnorm_bwd_kernel',
    ]);
    expect(removed.filter((k) => k.includes('batchnorm_stats'))).toHaveLength(8);
    // Launches: 4 BNs lose 2 statistics launches each and gain a finalize; bn1 loses its normalisation
    // and 3 backward launches for the accumulation and the apply.
    const launches = (ops: readonly StepOp[]) => ops.reduce((a, o) => a + o.launches, 0);
    expect(launches(current()) - launches(fused)).toBe(4 * 1 + 1 + 3 - 2);
  });

  it('conv-bn in parts: without the prologue, without the fused backward, without the weight gradient through the prologue', () => {
    const noPrologue = built(['conv-bn'], { prologue: false });
    expect(kernels(noPrologue, '2.bn1')).toEqual([
      'conv_bn_finalize_kernel',
      'batchnorm_fwd_kernel (finalized statistics)',
      'batchnorm_bwd_stats_kernel',
      'batchnorm_bwd_finalize_kernel',
      'batchnorm_bwd_kernel',
    ]);
    expect(kernels(noPrologue, '2.conv2')).toEqual([
      'cast_kernel',
      'convBnForward (conv + genstats)',
      'cudnnConvolutionBackwardFilter',
      'accumulate_f32_kernel',
      'cast_kernel',
      'cudnnConvolutionBackwardData',
    ]);
    const baseline = built(['conv-bn'], { dgradDbn: false });
    expect(kernels(baseline, '2.bn1')).toEqual([
      'conv_bn_finalize_kernel',
      'batchnorm_fwd_kernel (recompute)',
      'batchnorm_bwd_stats_kernel',
      'batchnorm_bwd_finalize_kernel',
      'batchnorm_bwd_kernel',
    ]);
    expect(kernels(baseline, '2.conv2').at(-1)).toBe('cudnnConvolutionBackwardData');
    const sbr = built(['conv-bn']);
    expect(sbr.some((o) => o.kernel.includes('recompute'))).toBe(false);
    // Without convWgradSbr: bn1's activation recomputed (gamma, beta, mean, variance read) for the
    // ordinary backward filter.
    const recompute = built(['conv-bn'], { wgradPrologue: false });
    const x = 2 * 2 * 4 * 4 * 8;
    expect(recompute.find((o) => o.kernel === 'batchnorm_fwd_kernel (recompute)')).toMatchObject({
      layer: '2.bn1',
      bytesRead: x + 4 * 4 * 8,
      bytesWritten: x,
    });
    expect(kernels(recompute, '2.conv2')).toContain('cudnnConvolutionBackwardFilter');
    expect(kernels(sbr, '2.conv2')).not.toContain('cudnnConvolutionBackwardFilter');
    const bytes = (ops: readonly StepOp[]) => ops.reduce((a, o) => a + o.bytesRead + o.bytesWritten, 0);
    // The recompute pass's bytes, less the scale and shift convWgradSbr reads instead.
    expect(bytes(recompute) - bytes(sbr)).toBe(2 * x + 4 * 4 * 8 - 2 * 4 * 8);
  });

  it("conv-bn with bn-add-relu: the downsample convolutions' sums consumed, computed again, or not written", () => {
    const both: FusedPath[] = ['bn-add-relu', 'conv-bn'];
    const consumed = built(both);
    expect(kernels(consumed, '2.bn2').slice(0, 2)).toEqual(['conv_bn_finalize_kernel', 'batchnorm_fwd_kernel (dual)']);
    expect(kernels(consumed, '2.downsample.1')).toEqual(['conv_bn_finalize_kernel']);
    expect(consumed.some((o) => o.kernel === 'batchnorm_stats_kernel (dual)')).toBe(false);
    const unused = built(both, { shortcutSums: 'unused' });
    expect(kernels(unused, '2.bn2').slice(0, 3)).toEqual([
      'batchnorm_stats_kernel (dual)',
      'batchnorm_stats_finalize_kernel (dual)',
      'batchnorm_fwd_kernel (dual)',
    ]);
    expect(kernels(unused, '2.downsample.0')).toContain('convBnForward (conv + genstats)');
    const skipped = built(both, { shortcutSums: 'not-written' });
    expect(kernels(skipped, '2.conv2')[1]).toBe('convBnForward (scale-bias-relu + conv)');
    expect(kernels(skipped, '2.downsample.0')[1]).toBe('cudnnConvolutionForward');
    // The sums cost 2 x 4 x 16 bytes per convolution; the statistics pass reads both raw outputs.
    const bytes = (ops: readonly StepOp[]) => ops.reduce((a, o) => a + o.bytesRead + o.bytesWritten, 0);
    expect(bytes(unused) - bytes(skipped)).toBe(2 * 2 * 4 * 16);
    expect(bytes(consumed)).toBeLessThan(bytes(skipped));
  });
});

describe('the built plan between the current one and the target', () => {
  it('moves fewer bytes in fewer launches than the current plan and more than the fused target, whatever conv-bn parts are built', () => {
    const current = stepRoofline(resnet50, { plan: 'current' });
    const target = stepRoofline(resnet50, { plan: 'fused' });
    const all = stepRoofline(resnet50, { plan: 'built', fused: ['optim', 'bn-add-relu', 'conv-bn'] });
    expect(all.planLabel).toBe('built (optim, bn-add-relu, conv-bn)');
    for (const convBn of [
      {},
      { prologue: false },
      { dgradDbn: false },
      { wgradPrologue: false },
      { shortcutSums: 'unused' },
      { shortcutSums: 'not-written' },
    ] as const) {
      const r = stepRoofline(resnet50, { plan: 'built', fused: ['optim', 'bn-add-relu', 'conv-bn'], convBn });
      expect(r.bytes).toBeLessThan(current.bytes);
      expect(r.bytes).toBeGreaterThan(target.bytes);
      expect(r.total.launches).toBeLessThan(current.total.launches);
      expect(r.total.launches).toBeGreaterThan(target.total.launches);
      expect(r.imagesPerSecond).toBeGreaterThan(current.imagesPerSecond);
      expect(r.imagesPerSecond).toBeLessThan(target.imagesPerSecond);
    }
    // Each path alone saves something, and the three together save more than any one.
    for (const path of ['optim', 'bn-add-relu', 'conv-bn'] as const) {
      const one = stepRoofline(resnet50, { plan: 'built', fused: [path] });
      expect(one.total.launches).toBeLessThan(current.total.launches);
      expect(one.bytes).toBeLessThanOrEqual(current.bytes);
      expect(all.bytes).toBeLessThan(one.bytes);
    }
    // The same convolutions run in every plan.
    const convs = (r: StepRoofline) => r.ops.filter((o) => o.type.startsWith('conv')).length;
    expect(convs(all)).toBe(convs(current));
  });

  it('takes its paths from RESNET_CUDA_FUSED by default, and refuses bad ones, naming the option', () => {
    const fromEnv = withFused('conv-bn, optim', () => stepRoofline(resnet50, { batchSize: 2, plan: 'built' }));
    expect(fromEnv.fused).toEqual(['optim', 'conv-bn']);
    expect(fromEnv.toJSON()).toMatchObject({ plan: 'built', fused: ['optim', 'conv-bn'], convBn: CONV_BN_BUILT });
    expect(withFused(null, () => stepRoofline(resnet50, { batchSize: 2, plan: 'built' })).planLabel).toBe(
      'built (none)',
    );
    expect(
      stepRoofline(resnet50, { batchSize: 2, plan: 'built', fused: ['conv-bn'], convBn: { dgradDbn: false } })
        .planLabel,
    ).toBe('built (conv-bn; conv-bn: no dgradDbn)');
    expect(() => stepRoofline(resnet50, { plan: 'built', fused: ['fast' as FusedPath] })).toThrow(/for fused\[0\]/);
    expect(() => stepRoofline(resnet50, { plan: 'built', fused: 'optim' as never })).toThrow(/for fused/);
    expect(() => stepRoofline(resnet50, { plan: 'built', convBn: { prologue: 1 as never } })).toThrow(
      /convBn\.prologue/,
    );
    expect(() => stepRoofline(resnet50, { plan: 'built', convBn: { shortcutSums: 'maybe' as never } })).toThrow(
      /convBn\.shortcutSums/,
    );
    expect(() => stepRoofline(resnet50, { plan: 'built', convBn: { fast: true } as never })).toThrow(/fast/);
    expect(() => stepRoofline(resnet50, { plan: 'current', fused: ['optim'] })).toThrow(
      /the options fused and convBn go with plan 'built', not 'current'/,
    );
  });
});

describe('the GPU peaks', () => {
  it('lists dense bf16 and fp16 tensor FLOP/s and memory bandwidth for every GPU, with an NVIDIA source', () => {
    expect([...GPU_NAMES].sort()).toEqual(['a100', 'b200', 'h100', 'h200', 'l4']);
    for (const name of GPU_NAMES) {
      const p = GPU_PEAKS[name];
      expect(p.bf16Flops).toBeGreaterThan(1e14);
      expect(p.fp16Flops).toBe(p.bf16Flops);
      expect(p.bandwidth).toBeGreaterThan(1e11);
      expect(p.source).toMatch(/^https:\/\/www\.nvidia\.com\//);
    }
    // H200: the H100's compute with 4.8 TB/s of HBM3e.
    expect(GPU_PEAKS.h200.bf16Flops).toBe(GPU_PEAKS.h100.bf16Flops);
    expect(GPU_PEAKS.h200.bandwidth).toBe(4.8e12);
  });
});

describe('the fused plan beside the current one', () => {
  let current: StepRoofline;
  let fused: StepRoofline;
  beforeAll(() => {
    current = stepRoofline(resnet50, { plan: 'current' });
    fused = stepRoofline(resnet50, { plan: 'fused' });
  });

  it('moves fewer bytes in fewer launches for the same convolutions', () => {
    expect(fused.bytes).toBeLessThan(0.7 * current.bytes);
    expect(fused.total.launches).toBeLessThan(current.total.launches / 2);
    const convs = (r: StepRoofline) => r.ops.filter((o) => o.type.startsWith('conv')).length;
    expect(convs(fused)).toBe(convs(current));
    // Neither plan has the weight casts or the separate accumulation in the fused one.
    expect(fused.byType.has('weight cast')).toBe(false);
    expect(fused.byType.has('add')).toBe(false);
  });

  it('bounds ResNet-50 at batch 256 in bf16 on an H200 at 16,000 images/s or more (the target set for the fused step)', () => {
    expect(fused.imagesPerSecond).toBeGreaterThanOrEqual(16000);
    expect(current.imagesPerSecond).toBeLessThan(fused.imagesPerSecond);
  });

  it('models ResNet-18 and the small-input stem too', () => {
    const model = new ResNet(18, { smallInput: true, numClasses: 10, seed: 3 });
    try {
      const a = stepRoofline(model, { plan: 'current', batchSize: 16, inputSize: 32, gpu: 'l4' });
      const b = stepRoofline(model, { plan: 'fused', batchSize: 16, inputSize: 32, gpu: 'l4' });
      expect(b.bytes).toBeLessThan(a.bytes);
      expect(b.ops.some((o) => o.kernel === 'bn-relu')).toBe(true);
    } finally {
      model.dispose();
    }
  });
});

describe('the bound', () => {
  it('is max(flops / peak, bytes / bandwidth) per op, summed, plus the launch overhead asked for', () => {
    const r = stepRoofline(resnet50, { batchSize: 32, gpu: 'a100', amp: 'fp16' });
    const peak = GPU_PEAKS.a100;
    let seconds = 0;
    for (const o of r.ops) {
      seconds += Math.max(o.flops / peak.fp16Flops, (o.bytesRead + o.bytesWritten) / peak.bandwidth);
    }
    expect(r.seconds).toBeCloseTo(seconds, 12);
    expect(r.seconds).toBeGreaterThanOrEqual(r.total.flops / peak.fp16Flops);
    expect(r.seconds).toBeGreaterThanOrEqual(r.bytes / peak.bandwidth);
    expect(r.imagesPerSecond).toBeCloseTo(32 / seconds, 6);
    // fp16 brings the Trainer's GradScaler.
    expect(r.byType.get('scaler')?.launches).toBe(4);
    const slow = stepRoofline(resnet50, { batchSize: 32, gpu: 'a100', amp: 'fp16', launchOverheadUs: 2 });
    expect(slow.seconds - r.seconds).toBeCloseTo(r.total.launches * 2e-6, 12);
  });

  it('refuses bad options, naming them', () => {
    expect(() => stepRoofline(resnet50, { gpu: 'h300' as never })).toThrow(/for gpu/);
    expect(() => stepRoofline(resnet50, { plan: 'faster' as never })).toThrow(/for plan/);
    expect(() => stepRoofline(resnet50, { amp: 'f32' as never })).toThrow(/for amp/);
    expect(() => stepRoofline(resnet50, { batchSize: 0 })).toThrow(/for batchSize/);
    expect(() => stepRoofline(resnet50, { launchOverheadUs: -1 })).toThrow(/for launchOverheadUs/);
    const checkpointed = new ResNet(18, { numClasses: 4, seed: 5 });
    onTestFinished(() => checkpointed.dispose());
    setCheckpointing(checkpointed, { segments: 'stage' });
    expect(() => stepRoofline(checkpointed)).toThrow(/layer1 is checkpointed .* setCheckpointing\(model, false\)/);
    setCheckpointing(checkpointed, false);
    expect(stepRoofline(checkpointed).total.launches).toBeGreaterThan(0);
    const headless = new Sequential(
      new Conv2d({ inChannels: 3, outChannels: 4, kernelSize: 1 }),
      new BatchNorm2d({ numFeatures: 4 }),
    );
    onTestFinished(() => headless.dispose());
    expect(() => stepRoofline(headless, { batchSize: 2, inputSize: 4 })).toThrow(
      /output must be \[N, classes\] logits for the cross-entropy, but it is \[2, 4, 4, 4\]/,
    );
    const odd = new Sequential(new Conv2d({ inChannels: 3, outChannels: 4, kernelSize: 1 }), new ReLU(), new Flatten());
    try {
      expect(() => fusedPlan(stepLayers(odd, [1, 2, 2, 3]), { activationBytes: 2, gradScaler: false })).toThrow(
        /every convolution feeds a BatchNorm2d.*0 is not followed by one/,
      );
    } finally {
      odd.dispose();
    }
  });
});

describe('bench --model-only', () => {
  it('prints both plans per op type, and their comparison', async () => {
    const run = await runCli(
      ['bench', '--model-only', '--model', 'resnet18', '--size', '64', '-b', '32', '--gpu', 'h100'],
      dir,
    );
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toContain('current plan, H100 SXM (990 TFLOP/s dense bf16, 3.35 TB/s), batch 32');
    expect(run.stdout).toContain('fused plan, H100 SXM');
    expect(run.stdout).toMatch(/^conv wgrad +\d+\.\d +\d+\.\d\d +\d+\.\d\d +\d+ +\d+\.\d{3} +\d+\.\d%$/m);
    expect(run.stdout).toMatch(
      /^fused \/ current: 0\.\d\dx the bytes, \d+ \/ \d+ launches, bound \d+ \/ \d+ images\/s \(\d\.\d\dx\)$/m,
    );
  });

  it('prints JSON that agrees with stepRoofline', async () => {
    const run = await runCli(['bench', '--model-only', '--plan', 'fused', '--amp', 'fp16', '-b', '256', '--json'], dir);
    expect(run.code, run.stderr).toBe(0);
    const out = JSON.parse(run.stdout) as {
      model: string;
      plans: { plan: string; imagesPerSecond: number; total: { launches: number } }[];
    };
    expect(out.model).toBe('resnet50');
    expect(out.plans).toHaveLength(1);
    const r = stepRoofline(resnet50, { plan: 'fused', amp: 'fp16', batchSize: 256 });
    expect(out.plans[0]).toMatchObject({ plan: 'fused', total: { launches: r.total.launches } });
    expect(out.plans[0]!.imagesPerSecond).toBeCloseTo(r.imagesPerSecond, 6);
  });

  it('prints the built plan for the --fused paths beside the current one and the target', async () => {
    const run = await runCli(
      ['bench', '--model-only', '--model', 'resnet18', '--size', '64', '-b', '32', '--plan', 'all', '--fused', 'all'],
      dir,
    );
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toContain('current plan, H200 SXM');
    expect(run.stdout).toContain('built (optim, bn-add-relu, conv-bn) plan, H200 SXM');
    expect(run.stdout).toContain('fused plan, H200 SXM');
    expect(run.stdout).toMatch(/^built \/ current: 0\.\d\dx the bytes, \d+ \/ \d+ launches/m);
    expect(run.stdout).toMatch(/^fused \/ current: 0\.\d\dx the bytes/m);
    const json = await runCli(
      ['bench', '--model-only', '--plan', 'built', '--fused', 'conv-bn,optim', '-b', '64', '--json'],
      dir,
    );
    expect(json.code, json.stderr).toBe(0);
    const out = JSON.parse(json.stdout) as { plans: { plan: string; fused: string[]; total: { launches: number } }[] };
    const r = stepRoofline(resnet50, { plan: 'built', fused: ['optim', 'conv-bn'], batchSize: 64 });
    expect(out.plans).toEqual([
      expect.objectContaining({ plan: 'built', fused: ['optim', 'conv-bn'], total: r.total }),
    ]);
    // runCli's environment is empty: no RESNET_CUDA_FUSED, so the built plan is the current one.
    const none = await runCli(['bench', '--model-only', '--plan', 'built', '-b', '8', '--json'], dir);
    const plain = stepRoofline(resnet50, { plan: 'current', batchSize: 8 });
    expect((JSON.parse(none.stdout) as { plans: { fused: string[]; total: unknown }[] }).plans[0]).toMatchObject({
      fused: [],
      total: plain.total,
    });
  });

  it('refuses what a model run does not take', async () => {
    for (const [args, message] of [
      [['--gpu', 'h200'], /--gpu goes with --model-only/],
      [['--model-only', '--amp', 'none'], /--model-only models mixed precision/],
      [['--model-only', '--steps', '3'], /--model-only runs nothing: leave out --steps/],
      [['--model-only', '--gpu', 'v100'], /--gpu expects one of/],
      [['--fused', 'all'], /--fused goes with --model-only/],
      [['--model-only', '--fused', 'all'], /--fused goes with --plan built or all/],
      [
        ['--model-only', '--plan', 'built', '--fused', 'optim,fast'],
        /--fused: unknown fused path 'fast'; known: optim/,
      ],
    ] as const) {
      const run = await runCli(['bench', ...args], dir);
      expect(run.code).toBe(2);
      expect(run.stderr).toMatch(message);
    }
  });
});
