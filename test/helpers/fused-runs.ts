/**
 * What the tests of the fused paths share to train the same small model with a path on and off:
 * deterministic data, the fused-path switch set for the length of a run, a small ResNet of a
 * chosen shape, and the Trainer options of a quiet run; and, for the conv-bn path's tests, a
 * Bottleneck with its data and a module step that records the fused ops and fallback warnings.
 * @packageDocumentation
 */
import { vi } from 'vitest';
import {
  AdaptiveAvgPool2d,
  BatchNorm2d,
  Bottleneck,
  Flatten,
  Linear,
  MaxPool2d,
  Random,
  Residual,
  Sequential,
  Tensor,
  type TrainerOptions,
} from '../../lib/index.js';
import { addon } from '../../lib/binding.js';
import { FUSED_ENV } from '../../lib/fused-paths.js';
import { CONV_BN_FALLBACK_WARNING } from '../../lib/nn/conv-bn-support.js';
import { Conv2d } from '../../lib/nn/layers.js';
import type { Module } from '../../lib/nn/module.js';

/** Deterministic values in [-1, 1) (a small LCG), so that the runs compared see the same data. */
export function lcgValues(n: number, seed: number): Float32Array {
  let s = seed >>> 0;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = s / 2 ** 31 - 1;
  }
  return out;
}

/** `batch` u8 NHWC images of `size` x `size` x 3 from {@link lcgValues}, on `device`. */
export function lcgImages(batch: number, size: number, seed: number, device: string): Tensor {
  return Tensor.from(
    lcgValues(batch * size * size * 3, seed).map((v) => Math.floor((v + 1) * 127.5)),
    [batch, size, size, 3],
    { dtype: 'u8', device },
  );
}

/**
 * Runs `body` with RESNET_CUDA_FUSED set to `value` (unset for null), then restores it: when
 * `body` returns, throws, or, for a promise, when the promise settles.
 */
export function withFused<T>(value: string | null, body: () => T): T {
  const saved = process.env[FUSED_ENV];
  if (value === null) delete process.env.RESNET_CUDA_FUSED;
  else process.env[FUSED_ENV] = value;
  const restore = (): void => {
    if (saved === undefined) delete process.env.RESNET_CUDA_FUSED;
    else process.env[FUSED_ENV] = saved;
  };
  try {
    const out = body();
    if (out instanceof Promise) return out.finally(restore) as T;
    restore();
    return out;
  } catch (error) {
    restore();
    throw error;
  }
}

/** The shape of {@link smallResNet}. */
export interface SmallResNetShape {
  /** Channels of the stem: a 3x3 convolution from the 3 input channels, batch norm + ReLU, 2x2 max pool. */
  stem: number;
  /** Whether a block with the identity shortcut, `stem` channels wide, follows the stem. */
  identityBlock: boolean;
  /** Channels of the last block, which downsamples (stride 2, a 1x1 convolution + batch norm on the shortcut). */
  width: number;
  /** Outputs of the final linear layer. */
  classes: number;
}

/**
 * A small ResNet: the stem, optionally an identity block, a downsampling block, global average
 * pooling and a linear layer. The convolutions and the linear layer take the seeds `seed`,
 * `seed + 1`, ... in that order.
 */
export function smallResNet(seed: number, shape: SmallResNetShape): Sequential {
  const { stem, width } = shape;
  let nextSeed = seed;
  const conv = (i: number, o: number, k: number, stride: number) =>
    new Conv2d({ inChannels: i, outChannels: o, kernelSize: k, stride, padding: (k - 1) / 2, seed: nextSeed++ });
  const main = (i: number, o: number, stride: number): [string, Conv2d | BatchNorm2d][] => [
    ['conv1', conv(i, o, 3, stride)],
    ['bn1', new BatchNorm2d({ numFeatures: o, relu: true })],
    ['conv2', conv(o, o, 3, 1)],
    ['bn2', new BatchNorm2d({ numFeatures: o, relu: true })],
  ];
  const layers: Module[] = [
    conv(3, stem, 3, 1),
    new BatchNorm2d({ numFeatures: stem, relu: true }),
    new MaxPool2d({ kernelSize: 2 }),
  ];
  if (shape.identityBlock) layers.push(new Residual(main(stem, stem, 1)));
  const downMain = main(stem, width, 2);
  const shortcut = new Sequential(conv(stem, width, 1, 2), new BatchNorm2d({ numFeatures: width }));
  layers.push(new Residual(downMain, ['downsample', shortcut]));
  return new Sequential(
    ...layers,
    new AdaptiveAvgPool2d(),
    new Flatten(),
    new Linear({ inFeatures: width, outFeatures: shape.classes, seed: nextSeed++ }),
  );
}

/** The input normalisation of the runs: mean 0.5 and standard deviation 0.25 per channel. */
export const NORMALIZE = { mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] } as const;

/** Trainer options of a run that writes nothing (no progress, logs, TensorBoard or plots), with {@link NORMALIZE}. */
export const QUIET_TRAINER = {
  progress: false,
  jsonLog: false,
  tensorboard: false,
  plots: false,
  normalize: NORMALIZE,
} as const satisfies Partial<TrainerOptions>;

/** A downsampling Bottleneck, 16 -> 32 channels (inner width 8), stride 2, as ResNet-50 builds its first block of a stage. */
export function bottleneck(): Bottleneck {
  const rng = new Random(41);
  const downsample = new Sequential(
    new Conv2d({ inChannels: 16, outChannels: 32, kernelSize: 1, stride: 2, seed: 42 }),
    new BatchNorm2d({ numFeatures: 32 }),
  );
  return new Bottleneck(16, 8, 2, downsample, rng);
}

/** The input of a {@link bottleneck} step, [2, 8, 8, 16] (seed 51), and its output gradient (seed 52), on `device` in `dtype`. */
export function bottleneckData(
  device: string,
  dtype: 'bf16' | 'f16',
): { input: () => Tensor; gradOf: (output: Tensor) => Tensor } {
  const opts = { device, dtype };
  return {
    input: () => Tensor.from(lcgValues(2 * 8 * 8 * 16, 51), [2, 8, 8, 16], opts),
    gradOf: (y: Tensor) => Tensor.from(lcgValues(y.numel, 52), y.shape, opts),
  };
}

/** What a {@link moduleStep} leaves: the last step's output, input gradient, parameter gradients and buffers, and the fused ops and warnings of all. */
export interface StepResult {
  output: Float32Array;
  inputGrad: Float32Array | null;
  grads: Map<string, Float32Array>;
  buffers: Map<string, Float32Array>;
  /** convBnForward calls with the scale-bias-ReLU prologue, and all convBnForward calls. */
  prologueCalls: number;
  convBnCalls: number;
  /** convWgradSbr, convDgradDbn and batchNormBackwardApply calls (the pairs' backward). */
  wgradCalls: number;
  dgradDbnCalls: number;
  applyCalls: number;
  /** The messages of the conv-bn fallback warnings (CONV_BN_FALLBACK_WARNING), which are not printed. */
  warnings: string[];
}

/** How a {@link moduleStep} runs: in training (a backward after each forward) or evaluation, and how many steps. */
export interface StepOptions {
  /** Training mode, with a backward after each forward (true), or evaluation mode, forwards only. */
  training?: boolean;
  /** The number of steps, each on the same input and output gradient. */
  steps?: number;
}

/**
 * `steps` forwards of `input()` through `build()` (placed on `device`, in training or evaluation
 * mode) and, in training, a backward of `gradOf(output)` after each, with RESNET_CUDA_FUSED set to
 * `fused`; the model is disposed after.
 */
export function moduleStep(
  fused: string,
  device: string,
  build: () => Module,
  input: () => Tensor,
  gradOf: (output: Tensor) => Tensor,
  { training = true, steps = 1 }: StepOptions = {},
): StepResult {
  return withFused(fused, () => {
    const convBn = vi.spyOn(addon(), 'convBnForward');
    const wgrad = vi.spyOn(addon(), 'convWgradSbr');
    const dgradDbn = vi.spyOn(addon(), 'convDgradDbn');
    const apply = vi.spyOn(addon(), 'batchNormBackwardApply');
    const warn = vi.spyOn(process, 'emitWarning').mockImplementation(() => undefined);
    const model = build().to(device);
    try {
      model.train(training);
      let output: Float32Array = new Float32Array(0);
      let inputGrad: Float32Array | null = null;
      for (let s = 0; s < steps; s++) {
        using x = input();
        const y = model.forward(x);
        output = y.toFloat32Array();
        if (training) {
          using g = gradOf(y);
          inputGrad = model.backward(g)?.toFloat32Array() ?? null;
        }
      }
      return {
        output,
        inputGrad,
        grads: new Map(model.namedParameters().map(([name, p]) => [name, p.grad.toFloat32Array()])),
        buffers: new Map(model.namedBuffers().map(([name, t]) => [name, t.toFloat32Array()])),
        prologueCalls: convBn.mock.calls.filter(([args]) => args.scale !== undefined).length,
        convBnCalls: convBn.mock.calls.length,
        wgradCalls: wgrad.mock.calls.length,
        dgradDbnCalls: dgradDbn.mock.calls.length,
        applyCalls: apply.mock.calls.length,
        warnings: warn.mock.calls
          .filter(([, o]) => typeof o === 'object' && o !== null && 'code' in o && o.code === CONV_BN_FALLBACK_WARNING)
          .map(([m]) => String(m)),
      };
    } finally {
      model.dispose();
      convBn.mockRestore();
      wgrad.mockRestore();
      dgradDbn.mockRestore();
      apply.mockRestore();
      warn.mockRestore();
    }
  });
}
