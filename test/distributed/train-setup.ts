/**
 * The training run the end-to-end data-parallel tests compare: a tiny ResNet on a few 8 px shapes,
 * built the same way by every rank (with a process group, its share of the data) and by the
 * one-process reference (the whole batch). Imported by the rank script train-ranks.ts and by
 * test/distributed-train.test.ts.
 * @packageDocumentation
 */
import {
  AdaptiveAvgPool2d,
  BasicBlock,
  BatchNorm2d,
  Compose,
  Conv2d,
  DataLoader,
  Flatten,
  Linear,
  RandomHorizontalFlip,
  RandomResizedCrop,
  SGD,
  Sequential,
  ShapesDataset,
} from '../../lib/index.js';
import type { ProcessGroup } from '../../lib/distributed/types.js';
import { Random } from '../../lib/random.js';
import { Trainer, type Callback, type TrainerOptions } from '../../lib/train/trainer.js';

/** What one run does; the rank script takes it as JSON in its first argument. */
export interface RunSpec {
  /** Samples per rank and micro-batch (the reference takes `worldSize` times as many). */
  batch: number;
  /** Micro-batches per optimizer step. */
  accumulate: number;
  /** Training samples (a multiple of the global batch, so that no rank is padded). */
  trainLength: number;
  /** Validation samples (not a multiple of the world size: the last ranks are padded). */
  valLength: number;
  /** Epochs in all. */
  epochs: number;
  /** Stop after this many steps (a checkpoint is written there). */
  maxSteps?: number;
  /** Continue from the latest checkpoint of `outDir` (true) or of this folder. */
  resume?: boolean | string;
  /** Write a checkpoint every this many steps. */
  checkpointEverySteps?: number;
  /** Loss scaling with this initial scale (f32 activations), with an inf injected at `infStep`. */
  lossScale?: number;
  /** The optimizer step (from 1) whose forward gets an infinite classifier weight on `infRank`. */
  infStep?: number;
  /** The rank that gets it (the reference has one process: it always gets it). */
  infRank?: number;
  /** The output folder (checkpoints, results). */
  outDir: string;
  /** Seconds the group waits for a peer. */
  timeoutSeconds?: number;
}

/** What a run reports. */
export interface RunReport {
  /** Each optimizer step's mean loss on this process. */
  losses: number[];
  /** The loss scale after each step (when scaling). */
  scales: number[];
  /** The model's state dict at the end, by name. */
  state: Record<string, number[]>;
  /** The final evaluation on the validation set. */
  eval: { count: number; acc1: number; acc5: number; loss: number; confusion: number[][] } | null;
}

/** A tiny ResNet: stem, a BasicBlock, a strided BasicBlock with a projection shortcut, pooling and fc. */
export function tinyResNet(seed: number): { model: Sequential; fc: Linear } {
  const rng = new Random(seed);
  const s = (): number => Math.floor(rng.next() * 2 ** 31);
  const downsample = new Sequential(
    new Conv2d({ inChannels: 8, outChannels: 16, kernelSize: 1, stride: 2, seed: s() }),
    new BatchNorm2d({ numFeatures: 16 }),
  );
  const fc = new Linear({ inFeatures: 16, outFeatures: 4, seed: s() });
  const model = new Sequential(
    new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 3, padding: 1, seed: s() }),
    new BatchNorm2d({ numFeatures: 8, relu: true }),
    new BasicBlock(8, 8, 1, null, new Random(s())),
    new BasicBlock(8, 16, 2, downsample, new Random(s())),
    new AdaptiveAvgPool2d(1),
    new Flatten(),
    fc,
  ).to('cpu');
  return { model, fc };
}

const SEED = 11;

function loader(
  length: number,
  batchSize: number,
  dataSeed: number,
  train: boolean,
  group: ProcessGroup | null,
): DataLoader {
  const augment = new Compose([new RandomResizedCrop({ size: 8, scale: [0.5, 1] }), new RandomHorizontalFlip()]);
  return new DataLoader(new ShapesDataset({ length, size: 8, classes: 4, seed: dataSeed }), {
    batchSize,
    ...(train ? { transform: augment } : {}),
    workers: 0,
    shuffle: train,
    seed: 5,
    ...(group ? { distributed: { rank: group.rank, worldSize: group.worldSize } } : {}),
  });
}

/**
 * Runs `spec` on this process: with `group`, as its rank with batch `spec.batch` and SyncBatchNorm;
 * without, as the reference with batch `spec.batch * worldSize`.
 */
export async function runSpec(spec: RunSpec, group: ProcessGroup | null, worldSize: number): Promise<RunReport> {
  const batch = group ? spec.batch : spec.batch * worldSize;
  const { model, fc } = tinyResNet(SEED);
  const optimizer = new SGD(model, { lr: 0.05, momentum: 0.9, weightDecay: 1e-4 });
  const report: RunReport = { losses: [], scales: [], state: {}, eval: null };
  const rank = group?.rank ?? 0;
  let saved: Float32Array | null = null;
  const inject = spec.infStep !== undefined && (group === null || rank === (spec.infRank ?? 0));
  const callback: Callback = {
    onStepBegin: (_t, info) => {
      if (!inject || info.step !== spec.infStep) return;
      saved = fc.weight.values();
      const broken = saved.slice();
      broken[0] = Infinity;
      fc.weight.setValues(broken);
    },
    onStepEnd: (t, info) => {
      if (saved) {
        fc.weight.setValues(saved);
        saved = null;
      }
      report.losses.push(info.loss());
      report.scales.push(t.scaler.lossScale);
    },
  };
  const options: TrainerOptions = {
    model,
    optimizer,
    accumulate: spec.accumulate,
    outDir: spec.outDir,
    progress: false,
    tensorboard: false,
    plots: false,
    logEvery: 1,
    callbacks: [callback],
    checkpoint: { keepLast: 2, ...(spec.checkpointEverySteps ? { everySteps: spec.checkpointEverySteps } : {}) },
    ...(spec.lossScale !== undefined ? { gradScaler: { enabled: true, initScale: spec.lossScale } } : {}),
    ...(group ? { distributed: { processGroup: group, syncBatchNorm: true } } : {}),
  };
  const trainer = new Trainer(options);
  const train = loader(spec.trainLength, batch, 3, true, group);
  const val = loader(spec.valLength, batch, 4, false, group);
  try {
    const result = await trainer.fit(train, {
      epochs: spec.epochs,
      val,
      ...(spec.resume !== undefined ? { resume: spec.resume } : {}),
      ...(spec.maxSteps !== undefined ? { maxSteps: spec.maxSteps } : {}),
    });
    for (const [name, entry] of model.stateDict()) report.state[name] = Array.from(entry.data, Number);
    const e = result.lastEval;
    if (e) {
      report.eval = { count: e.count, acc1: e.acc1, acc5: e.acc5, loss: e.loss, confusion: e.confusion.toArray() };
    }
  } finally {
    await trainer.dispose();
    await train.close();
    await val.close();
  }
  return report;
}
