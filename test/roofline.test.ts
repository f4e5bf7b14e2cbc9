/**
 * The roofline model of a training step: FLOPs against the model summary, the bytes of single ops
 * against hand counts from the kernels, the peaks table, the fused plan against today's, the bound
 * arithmetic, errors, and `bench --model-only`.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { GPU_NAMES, GPU_PEAKS } from '../lib/analysis/gpu-peaks.js';
import { currentPlan } from '../lib/analysis/plan-current.js';
import { fusedPlan } from '../lib/analysis/plan-fused.js';
import { stepRoofline, type StepRoofline } from '../lib/analysis/roofline.js';
import { stepLayers } from '../lib/analysis/step-layers.js';
import type { StepOp } from '../lib/analysis/step-ops.js';
import { setCheckpointing } from '../lib/nn/checkpoint.js';
import { Sequential } from '../lib/nn/containers.js';
import { AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, ReLU } from '../lib/nn/layers.js';
import { ResNet } from '../lib/nn/resnet.js';
import { summary } from '../lib/nn/summary.js';
import { Profiler } from '../lib/profile/profiler.js';
import { benchmarkTraining } from '../lib/train/benchmark.js';
import { runCli } from './helpers/cli.js';

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
    // ResNet-18: 20 convolutions, the stem's without backward data; 8 blocks, each adding gradients.
    expect(count('cudnnConvolutionForward')).toBe(20);
    expect(count('cudnnConvolutionBackwardData')).toBe(19);
    expect(count('add_kernel')).toBe(8);
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

  it('refuses what a model run does not take', async () => {
    for (const [args, message] of [
      [['--gpu', 'h200'], /--gpu goes with --model-only/],
      [['--model-only', '--amp', 'none'], /--model-only models mixed precision/],
      [['--model-only', '--steps', '3'], /--model-only runs nothing: leave out --steps/],
      [['--model-only', '--gpu', 'v100'], /--gpu expects one of/],
    ] as const) {
      const run = await runCli(['bench', ...args], dir);
      expect(run.code).toBe(2);
      expect(run.stderr).toMatch(message);
    }
  });
});
