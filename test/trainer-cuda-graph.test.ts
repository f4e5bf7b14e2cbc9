/**
 * The Trainer's `cudaGraph` option: a run whose step is captured once and replayed gives the same
 * losses, parameters, optimizer step count, loss scale and BatchNorm counters as the same run
 * eagerly (bf16 with SGD and a learning rate that changes every step; fp16 with a GradScaler that
 * overflows every few steps, AdamW and clipping; a ragged last batch over two epochs); replays
 * are counted; and each configuration that cannot be captured says why and still trains. The CUDA
 * cases run in the 'cuda-emulator-cases' project on the emulated device; the CPU case in 'main'.
 */
import { describe, expect, it } from 'vitest';
import {
  AdamW,
  AdaptiveAvgPool2d,
  BatchNorm2d,
  Conv2d,
  CosineAnnealingLR,
  CrossEntropyLoss,
  DataLoader,
  Flatten,
  Linear,
  ReLU,
  SGD,
  Sequential,
  ShapesDataset,
  Tensor,
  Trainer,
  listBackends,
  type TrainerOptions,
} from '../lib/index.js';
import type { Module } from '../lib/nn/module.js';
import type { Optimizer } from '../lib/optim/optimizer.js';
import { soloGroup } from './gpu/solo-group.js';

const onlyCuda = process.env.RESNET_TEST_BACKENDS === 'cuda';
const cuda = listBackends().find((b) => b.name === 'cuda');
const noCuda = cuda?.available ? null : (cuda?.reason ?? 'no CUDA backend');

/** Conv-BN-ReLU twice and a linear head: every kind of op of the step, small enough for the emulator. */
function tinyLayers(): Module[] {
  return [
    new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 3, padding: 1, seed: 1 }),
    new BatchNorm2d({ numFeatures: 8 }),
    new ReLU(),
    new Conv2d({ inChannels: 8, outChannels: 8, kernelSize: 3, stride: 2, padding: 1, seed: 2 }),
    new BatchNorm2d({ numFeatures: 8 }),
    new ReLU(),
    new AdaptiveAvgPool2d(1),
    new Flatten(),
    new Linear({ inFeatures: 8, outFeatures: 4, seed: 3 }),
  ];
}

function tinyNet(device: string): Module {
  return new Sequential(...tinyLayers()).to(device);
}

/** The tiny net, checking on the host that its input is finite: host control flow in a forward. */
class CheckedNet extends Sequential {
  constructor() {
    super(...tinyLayers());
  }

  override forward(x: Tensor): Tensor {
    if (x.toFloat32Array().some((v) => !Number.isFinite(v))) throw new Error('non-finite input');
    return super.forward(x);
  }
}

/** An optimizer of the user's that does not declare capture support. */
class UncapturableSGD extends SGD {
  override get capturable(): boolean {
    return false;
  }
}

interface RunSetup {
  /** The model; default {@link tinyNet}. */
  model?: (device: string) => Module;
  device: string;
  samples: number;
  epochs: number;
  optimizer: (model: Module) => Optimizer<{ lr: number }>;
  options: Partial<TrainerOptions>;
}

interface RunRecord {
  losses: number[];
  lrs: number[];
  params: Float32Array;
  optimizerSteps: number;
  trainerSteps: number;
  lossScale: number;
  counters: bigint[];
  trainer: Trainer;
}

/** Trains a fresh tiny net on generated shapes, recording every step's loss and learning rate. */
async function train(setup: RunSetup, cudaGraph: TrainerOptions['cudaGraph']): Promise<RunRecord> {
  const model = setup.model?.(setup.device) ?? tinyNet(setup.device);
  const optimizer = setup.optimizer(model);
  const loader = new DataLoader(new ShapesDataset({ length: setup.samples, size: 8, classes: 4, seed: 3 }), {
    batchSize: 4,
    workers: 0,
    shuffle: true,
    seed: 5,
  });
  const losses: number[] = [];
  const lrs: number[] = [];
  const trainer = new Trainer({
    model,
    optimizer,
    device: setup.device,
    progress: false,
    jsonLog: false,
    tensorboard: false,
    plots: false,
    normalize: { mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] },
    ...setup.options,
    ...(cudaGraph !== undefined ? { cudaGraph } : {}),
    callbacks: [
      {
        onStepEnd: (_t, info) => {
          losses.push(info.loss());
          lrs.push(info.lr);
        },
      },
    ],
  });
  try {
    const result = await trainer.fit(loader, { epochs: setup.epochs });
    return {
      losses,
      lrs,
      params: model.arena().params.toFloat32Array(),
      optimizerSteps: optimizer.stepCount,
      trainerSteps: result.steps,
      lossScale: trainer.scaler.scaleValue(),
      counters: model.counterValues(),
      trainer,
    };
  } finally {
    await loader.close();
  }
}

function maxRelativeError(a: Float32Array | number[], b: Float32Array | number[]): number {
  let worst = 0;
  for (let i = 0; i < a.length; i++) {
    const x = a[i]!;
    const y = b[i]!;
    worst = Math.max(worst, Math.abs(x - y) / Math.max(Math.abs(x), Math.abs(y), 1e-6));
  }
  return worst;
}

/** The graphed run matches the eager one step by step (the same kernels on the same values). */
function expectSameRun(graph: RunRecord, eager: RunRecord): void {
  expect(graph.losses.length).toBe(eager.losses.length);
  expect(graph.losses.every(Number.isFinite)).toBe(true);
  expect(maxRelativeError(graph.losses, eager.losses)).toBeLessThanOrEqual(1e-6);
  expect(graph.lrs).toEqual(eager.lrs);
  expect(graph.params.length).toBe(eager.params.length);
  expect(maxRelativeError(graph.params, eager.params)).toBeLessThanOrEqual(1e-6);
  expect(graph.optimizerSteps).toBe(eager.optimizerSteps);
  expect(graph.trainerSteps).toBe(eager.trainerSteps);
  expect(graph.lossScale).toBe(eager.lossScale);
  expect(graph.counters).toEqual(eager.counters);
}

// The CUDA cases run where RESNET_TEST_BACKENDS=cuda (the emulated device's project).
const cudaSkip = !onlyCuda ? 'runs in the cuda-emulator-cases project' : noCuda;

describe.skipIf(cudaSkip !== null)(
  `Trainer cudaGraph on CUDA${cudaSkip !== null ? ` (skipped: ${cudaSkip})` : ''}`,
  () => {
    it('bf16, SGD with Nesterov momentum and a learning rate that changes every step: same run, replayed', async () => {
      const setup: RunSetup = {
        device: 'cuda',
        samples: 32,
        epochs: 1,
        optimizer: (m) => new SGD(m, { lr: 0.05, momentum: 0.9, nesterov: true, weightDecay: 1e-4 }),
        options: { amp: 'bf16', schedule: new CosineAnnealingLR({ tMax: 8, minLr: 0.001 }) },
      };
      const eager = await train(setup, undefined);
      const graph = await train(setup, { warmup: 2 });
      expectSameRun(graph, eager);
      expect(new Set(graph.lrs).size).toBe(graph.lrs.length);
      expect(graph.trainer.cudaGraphStats).toEqual({ captures: 1, replays: 6, eagerSteps: 2, reasons: [] });
      expect(eager.trainer.cudaGraphStats).toBeNull();
      await Promise.all([graph.trainer.dispose(), eager.trainer.dispose()]);
    });

    it('fp16, AdamW and clipping with a GradScaler that overflows every few steps: same skips, scale and step count', async () => {
      // The scale grows 2^12-fold after every two clean steps, so the fp16 gradients overflow, the
      // step is skipped on the device and the scale backs off: inf steps happen between replays.
      const setup: RunSetup = {
        device: 'cuda',
        samples: 40,
        epochs: 1,
        optimizer: (m) => new AdamW(m, { lr: 0.01, weightDecay: 0.01 }),
        options: {
          amp: 'fp16',
          clipGradNorm: 1,
          gradScaler: { initScale: 1024, growthFactor: 4096, backoffFactor: 1 / 4096, growthInterval: 2 },
        },
      };
      const eager = await train(setup, undefined);
      const graph = await train(setup, { warmup: 1 });
      expectSameRun(graph, eager);
      expect(eager.optimizerSteps).toBeLessThan(eager.trainerSteps);
      expect(graph.trainer.cudaGraphStats?.replays).toBe(9);
      await Promise.all([graph.trainer.dispose(), eager.trainer.dispose()]);
    });

    it('a ragged last batch runs eagerly, says so once, and the graph is reused in the next epoch', async () => {
      const setup: RunSetup = {
        device: 'cuda',
        samples: 18,
        epochs: 2,
        optimizer: (m) => new SGD(m, { lr: 0.05, momentum: 0.9 }),
        options: { amp: 'bf16' },
      };
      const eager = await train(setup, undefined);
      const graph = await train(setup, true);
      expectSameRun(graph, eager);
      const stats = graph.trainer.cudaGraphStats;
      // 5 batches per epoch (4 + 4 + 4 + 4 + 2): 3 warm-up steps, then 1 replay and the ragged
      // batch; in epoch 2, 4 replays and the ragged batch again.
      expect(stats?.captures).toBe(1);
      expect(stats?.replays).toBe(5);
      expect(stats?.eagerSteps).toBe(5);
      expect(stats?.reasons).toEqual([expect.stringMatching(/a batch of shape \[2, 8, 8, 3\] runs eagerly/)]);
      await Promise.all([graph.trainer.dispose(), eager.trainer.dispose()]);
    });

    it('data-parallel (an NCCL group of one rank): the bucket all-reduces are captured with the step', async () => {
      const run = async (cudaGraph: TrainerOptions['cudaGraph']): Promise<RunRecord> => {
        const group = soloGroup('nccl', 'cuda');
        try {
          return await train(
            {
              device: 'cuda',
              samples: 24,
              epochs: 1,
              optimizer: (m) => new SGD(m, { lr: 0.05, momentum: 0.9 }),
              options: { amp: 'bf16', distributed: { processGroup: group } },
            },
            cudaGraph,
          );
        } finally {
          group.destroy();
        }
      };
      const eager = await run(undefined);
      const graph = await run({ warmup: 2 });
      expectSameRun(graph, eager);
      expect(graph.trainer.cudaGraphStats).toEqual({ captures: 1, replays: 4, eagerSteps: 2, reasons: [] });
      await Promise.all([graph.trainer.dispose(), eager.trainer.dispose()]);
    });

    it('a model that reads a value back in its forward cannot be captured: the capture error is said and it trains eagerly', async () => {
      const setup: RunSetup = {
        device: 'cuda',
        samples: 16,
        epochs: 1,
        optimizer: (m) => new SGD(m, { lr: 0.05, momentum: 0.9 }),
        options: {},
        model: (device) => new CheckedNet().to(device),
      };
      const eager = await train(setup, undefined);
      const graph = await train(setup, { warmup: 1 });
      expectSameRun(graph, eager);
      const stats = graph.trainer.cudaGraphStats;
      expect(stats?.captures).toBe(0);
      expect(stats?.eagerSteps).toBe(4);
      expect(stats?.reasons).toEqual([
        expect.stringMatching(/^cudaGraph: the step could not be captured \(copy to host .*\); training eagerly$/),
      ]);
      await Promise.all([graph.trainer.dispose(), eager.trainer.dispose()]);
    });

    it('gradient accumulation, a moving average, distillation and an optimizer without capture support are not captured: each says why and trains', async () => {
      const sgd = (m: Module): Optimizer<{ lr: number }> => new SGD(m, { lr: 0.05, momentum: 0.9 });
      const cases: [Partial<TrainerOptions>, RunSetup['optimizer'], RegExp][] = [
        [{ accumulate: 2 }, sgd, /gradient accumulation \(accumulate: 2\) is not captured/],
        [{ ema: { decay: 0.9 } }, sgd, /the moving average \(ema\)/],
        [{ distillation: { teacher: tinyNet('cuda') } }, sgd, /knowledge distillation/],
        [{}, (m) => new UncapturableSGD(m, { lr: 0.05 }), /UncapturableSGD cannot be captured/],
      ];
      for (const [options, optimizer, reason] of cases) {
        const setup: RunSetup = { device: 'cuda', samples: 16, epochs: 1, optimizer, options };
        const eager = await train(setup, undefined);
        const graph = await train(setup, true);
        expectSameRun(graph, eager);
        const stats = graph.trainer.cudaGraphStats;
        expect(stats?.replays).toBe(0);
        expect(stats?.reasons).toEqual([expect.stringMatching(reason)]);
        await Promise.all([graph.trainer.dispose(), eager.trainer.dispose()]);
      }
    });
  },
);

describe.skipIf(onlyCuda)('Trainer cudaGraph on the CPU', () => {
  it('says that CUDA graphs need a CUDA device, once, and trains eagerly', async () => {
    const setup: RunSetup = {
      device: 'cpu',
      samples: 12,
      epochs: 2,
      optimizer: (m) => new SGD(m, { lr: 0.05, momentum: 0.9 }),
      options: {},
    };
    const eager = await train(setup, undefined);
    const graph = await train(setup, true);
    expectSameRun(graph, eager);
    expect(graph.trainer.cudaGraphStats).toEqual({
      captures: 0,
      replays: 0,
      eagerSteps: 6,
      reasons: ['cudaGraph: the device is cpu (CUDA graphs need a CUDA device); training eagerly'],
    });
    await Promise.all([graph.trainer.dispose(), eager.trainer.dispose()]);
  });

  it('the device-read arguments of a captured step are refused on the CPU, naming the argument', () => {
    const model = tinyNet('cpu');
    const sgd = new SGD(model, { lr: 0.1 });
    expect(() => sgd.step({ tablesOnly: true })).toThrow(/sgd step: tablesOnly .* needs CUDA tensors/);
    expect(() => new UncapturableSGD(model, { lr: 0.1 }).step({ tablesOnly: true })).toThrow(
      /SGD: stepCount and tablesOnly need an optimizer that supports CUDA graph capture/,
    );
    const adam = new AdamW(model, { lr: 0.1 });
    expect(() => adam.step({ stepCount: Tensor.zeros([1], { dtype: 'f32' }) })).toThrow(/stepCount/);
    expect(() => adam.step({ stepCount: Tensor.zeros([1], { dtype: 'i32' }) })).toThrow(
      /adamw step: stepCount \(a value read on the device, for CUDA graphs\) needs a CUDA tensor/,
    );
    expect(adam.stepCount).toBe(0);
    const loss = new CrossEntropyLoss();
    loss.gradScaleFrom = Tensor.from([2], [1]);
    const logits = Tensor.from([0.5, -0.5, 0.25, 0], [2, 2]);
    expect(() => loss.forward(logits, [0, 1])).toThrow(/cross entropy: gradScaleFrom .* needs a CUDA tensor/);
  });

  it('checks the option', () => {
    const model = tinyNet('cpu');
    const optimizer = new SGD(model, { lr: 0.1 });
    expect(() => new Trainer({ model, optimizer, progress: false, cudaGraph: { warmup: 0 } })).toThrow(
      /cudaGraph\.warmup/,
    );
    expect(() => new Trainer({ model, optimizer, progress: false, cudaGraph: { steps: 2 } as never })).toThrow(/steps/);
  });
});
