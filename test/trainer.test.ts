import {
  existsSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  truncateSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  AdaptiveAvgPool2d,
  BatchNorm2d,
  CenterCrop,
  Compose,
  Conv2d,
  CosineAnnealingLR,
  DataLoader,
  Flatten,
  Linear,
  RandomHorizontalFlip,
  RandomResizedCrop,
  ReLU,
  SGD,
  Sequential,
  ShapesDataset,
  Tensor,
  decodeSafetensors,
} from '../lib/index.js';
import type { Module } from '../lib/nn/module.js';
import { Trainer, type Callback, type TrainerOptions } from '../lib/train/trainer.js';
import { defined, lookup } from './helpers/defined.js';
import { stringContaining } from './helpers/matchers.js';

const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-trainer-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let runs = 0;
const outDir = (): string => join(dir, `run-${runs++}`);

/** A small convolutional classifier; `bn: false` leaves out batch norm (whose statistics depend on the batch split). */
function tinyNet(seed: number, bn = true): Module {
  const layers: Module[] = [new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 3, padding: 1, seed })];
  if (bn) layers.push(new BatchNorm2d({ numFeatures: 8 }));
  layers.push(
    new ReLU(),
    new Conv2d({ inChannels: 8, outChannels: 16, kernelSize: 3, stride: 2, padding: 1, seed: seed + 1 }),
  );
  if (bn) layers.push(new BatchNorm2d({ numFeatures: 16 }));
  layers.push(
    new ReLU(),
    new AdaptiveAvgPool2d(1),
    new Flatten(),
    new Linear({ inFeatures: 16, outFeatures: 4, seed: seed + 2 }),
  );
  return new Sequential(...layers).to('cpu');
}

const shapes = (length: number, seed: number) => new ShapesDataset({ length, size: 16, classes: 4, seed });
const plain = () => new Compose([new CenterCrop({ size: 16 })]);
const augment = () => new Compose([new RandomResizedCrop({ size: 16, scale: [0.6, 1] }), new RandomHorizontalFlip()]);

function loader(
  length: number,
  options: { batchSize?: number; shuffle?: boolean; seed?: number; augment?: boolean; dataSeed?: number } = {},
): DataLoader {
  return new DataLoader(shapes(length, options.dataSeed ?? 3), {
    batchSize: options.batchSize ?? 16,
    transform: options.augment ? augment() : plain(),
    workers: 0,
    shuffle: options.shuffle ?? false,
    seed: options.seed ?? 7,
  });
}

function make(seed: number, extra: Partial<TrainerOptions> = {}, bn = true): Trainer {
  const model = tinyNet(seed, bn);
  const optimizer = new SGD(model, { lr: 0.05, momentum: 0.9, weightDecay: 1e-4 });
  return new Trainer({
    model,
    optimizer,
    progress: false,
    normalize: { mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] },
    ...extra,
  });
}

function records(out: string): Record<string, unknown>[] {
  return readFileSync(join(out, 'log.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((line) => JSON.parse(line) as Record<string, unknown>);
}

describe('Trainer', () => {
  it('trains, evaluates and leaves checkpoints, a JSON log, TensorBoard events, PNGs and weights', async () => {
    const out = outDir();
    const trainer = make(1, {
      outDir: out,
      logEvery: 2,
      schedule: new CosineAnnealingLR({ tMax: 12 }),
      ema: { decay: 0.9 },
    });
    const train = loader(96, { shuffle: true, augment: true });
    const val = loader(64, { dataSeed: 4 });
    const result = await trainer.fit(train, { epochs: 2, val });
    expect(result.epochs).toBe(2);
    expect(result.steps).toBe(12);
    expect(result.history).toHaveLength(2);
    const lastEval = defined(result.lastEval, 'an evaluation');
    expect(lastEval.count).toBe(64);
    expect(lastEval.confusion.total).toBe(64);
    expect(lastEval.report).toContain('weighted avg');
    expect(defined(result.lastEvalEma, 'an evaluation of the average').count).toBe(64);
    expect(defined(result.best, 'a best epoch').monitor).toBe('val/acc1');
    for (const f of [
      'log.jsonl',
      'model.safetensors',
      'model-ema.safetensors',
      'model-best.safetensors',
      'curves-loss.png',
      'curves-accuracy.png',
      'confusion-matrix.png',
      'classification-report.txt',
      'summary.json',
    ]) {
      expect(existsSync(join(out, f)), f).toBe(true);
    }
    const ckpts = readdirSync(join(out, 'checkpoints')).sort();
    expect(ckpts).toEqual([
      'best.json',
      'best.safetensors',
      'latest.json',
      'step-00000006.safetensors',
      'step-00000012.safetensors',
    ]);
    expect(JSON.parse(readFileSync(join(out, 'checkpoints', 'latest.json'), 'utf8'))).toMatchObject({
      file: 'step-00000012.safetensors',
      epoch: 2,
      batch: 0,
      step: 12,
    });
    const events = readdirSync(join(out, 'tensorboard'));
    expect(events.some((f) => f.startsWith('events.out.tfevents.'))).toBe(true);
    const log = records(out);
    expect(log.filter((r) => r.type === 'train').map((r) => r.step)).toEqual([2, 4, 6, 8, 10, 12]);
    const epochs = log.filter((r) => r.type === 'epoch');
    expect(epochs).toHaveLength(2);
    expect((epochs[1]!.metrics as Record<string, number>)['val_ema/acc1']).toBeGreaterThanOrEqual(0);
    // The lr followed the cosine schedule over the 12 steps.
    expect(trainer.lr).toBeCloseTo(0, 10);
    // The weights file has torchvision-style names and the trained values.
    const weights = decodeSafetensors(readFileSync(join(out, 'model.safetensors')), 'model.safetensors');
    expect([...weights.tensors.keys()]).toContain('0.weight');
    expect(lookup(weights.tensors, '8.weight').data).toEqual(lookup(trainer.model.stateDict(), '8.weight').data);
    await trainer.dispose();
  });

  it('resumes an interrupted run with exactly the losses of the uninterrupted run', async () => {
    const options = {
      logEvery: 1,
      checkpoint: { everySteps: 3, keepLast: 2 },
      schedule: new CosineAnnealingLR({ tMax: 20, minLr: 0.001 }),
    };
    const whole = outDir();
    const a = make(2, { ...options, outDir: whole });
    await a.fit(loader(80, { shuffle: true, augment: true }), { epochs: 3 });
    const expected = records(whole)
      .filter((r) => r.type === 'train')
      .map((r) => r.loss);
    expect(expected).toHaveLength(15);
    await a.dispose();

    const broken = outDir();
    const crash: Callback = {
      onStepEnd(_trainer, info) {
        if (info.step === 8) throw new Error('simulated crash');
      },
    };
    const b = make(2, { ...options, outDir: broken, callbacks: [crash] });
    await expect(b.fit(loader(80, { shuffle: true, augment: true }), { epochs: 3 })).rejects.toThrow('simulated crash');
    await b.dispose();
    // The last checkpoint is at step 6, in the middle of the second epoch (5 steps per epoch).
    expect(JSON.parse(readFileSync(join(broken, 'checkpoints', 'latest.json'), 'utf8'))).toMatchObject({
      step: 6,
      epoch: 1,
      batch: 1,
    });
    // Checkpoints at steps 3 and 6 (every 3) and 5 (end of the first epoch); keepLast: 2 pruned step 3.
    expect(readdirSync(join(broken, 'checkpoints')).filter((f) => f.startsWith('step-'))).toEqual([
      'step-00000005.safetensors',
      'step-00000006.safetensors',
    ]);

    const c = make(99, { ...options, outDir: broken });
    const result = await c.fit(loader(80, { shuffle: true, augment: true }), { epochs: 3, resume: true });
    expect(result.steps).toBe(15);
    const log = records(broken);
    const resumedAt = log.findIndex((r) => r.type === 'resume');
    expect(resumedAt).toBeGreaterThan(0);
    const after = log.slice(resumedAt).filter((r) => r.type === 'train');
    expect(after.map((r) => r.step)).toEqual([7, 8, 9, 10, 11, 12, 13, 14, 15]);
    expect(after.map((r) => r.loss)).toEqual(expected.slice(6));
    // The resumed model ends with the uninterrupted model's weights, bit for bit.
    for (const [name, entry] of a.model.stateDict()) {
      expect(lookup(c.model.stateDict(), name).data, name).toEqual(entry.data);
    }
    await c.dispose();
  });

  it('rejects a truncated checkpoint and a resume with different data, changing nothing', async () => {
    const out = outDir();
    const a = make(3, { outDir: out });
    await a.fit(loader(32), { epochs: 1 });
    await a.dispose();
    const file = join(out, 'checkpoints', 'step-00000002.safetensors');
    const b = make(4, { outDir: out });
    const before = lookup(b.model.stateDict(), '0.weight').data.slice();
    await expect(b.fit(loader(32, { seed: 8 }), { epochs: 2, resume: true })).rejects.toMatchObject({
      code: 'ERR_RC_CHECKPOINT',
      message: stringContaining('seed: 7'),
    });
    truncateSync(file, statSync(file).size - 100);
    await expect(b.fit(loader(32), { epochs: 2, resume: file })).rejects.toMatchObject({
      code: 'ERR_RC_CHECKPOINT',
      message: stringContaining('truncated'),
    });
    expect(lookup(b.model.stateDict(), '0.weight').data).toEqual(before);
    await b.dispose();
  });

  it.each([
    ['without clipping', undefined],
    ['with clipping', 0.5],
  ])('accumulating gradients %s gives the update of the single large batch', async (_name, clip) => {
    const extra = clip === undefined ? {} : { clipGradNorm: clip };
    const big = make(5, extra, false);
    const small = make(5, { ...extra, accumulate: 4 }, false);
    await big.fit(loader(64, { batchSize: 32 }), { epochs: 1 });
    await small.fit(loader(64, { batchSize: 8 }), { epochs: 1 });
    expect(big.stepCount).toBe(2);
    expect(small.stepCount).toBe(2);
    const before = tinyNet(5, false).stateDict();
    for (const [name, entry] of big.model.stateDict()) {
      const a = entry.data as Float32Array;
      const b = lookup(small.model.stateDict(), name).data as Float32Array;
      const start = lookup(before, name).data as Float32Array;
      let diff = 0;
      let moved = 0;
      for (let i = 0; i < a.length; i++) {
        diff = Math.max(diff, Math.abs(a[i]! - b[i]!));
        moved = Math.max(moved, Math.abs(a[i]! - start[i]!));
      }
      expect(moved, name).toBeGreaterThan(1e-4);
      expect(diff, name).toBeLessThan(2e-6);
    }
  });

  it('stops early when the monitored metric stops improving', async () => {
    const trainer = make(6, { earlyStopping: { monitor: 'val/loss', patience: 2, minDelta: 100 } });
    const result = await trainer.fit(loader(32), { epochs: 10, val: loader(32, { dataSeed: 9 }) });
    // The first evaluation sets the best; two more without an improvement of 100 stop the run.
    expect(result.stoppedEarly).toBe(true);
    expect(result.epochs).toBe(3);
  });

  it('calls the callbacks in order and stops on request with a checkpoint', async () => {
    const events: string[] = [];
    const out = outDir();
    const trainer = make(7, {
      outDir: out,
      callbacks: [
        {
          onFitBegin: () => void events.push('fit'),
          onEpochBegin: (_t, e) => void events.push(`epoch ${e}`),
          onStepBegin: (_t, i) => void events.push(`begin ${i.step}`),
          onStepEnd: (t, i) => {
            events.push(`end ${i.step} ${i.loss() > 0}`);
            if (i.step === 3) t.requestStop();
          },
          onEpochEnd: (_t, r) => void events.push(`epoch end ${r.epoch}`),
          onFitEnd: (_t, r) => void events.push(`fit end ${r.steps} ${r.interrupted}`),
        },
      ],
    });
    await trainer.fit(loader(64), { epochs: 2 });
    expect(events).toEqual([
      'fit',
      'epoch 0',
      'begin 1',
      'end 1 true',
      'begin 2',
      'end 2 true',
      'begin 3',
      'end 3 true',
      'fit end 3 true',
    ]);
    expect(JSON.parse(readFileSync(join(out, 'checkpoints', 'latest.json'), 'utf8'))).toMatchObject({
      step: 3,
      epoch: 0,
      batch: 3,
    });
  });

  it('stops at an epoch boundary when asked during evaluation, and keeps each step loss', async () => {
    const seen: { step: number; loss: () => number; value: number }[] = [];
    const trainer = make(15, {
      callbacks: [
        {
          onStepEnd: (_t, info) => void seen.push({ step: info.step, loss: () => info.loss(), value: info.loss() }),
          onEpochEnd: (t) => t.requestStop(),
        },
      ],
    });
    const result = await trainer.fit(loader(64), { epochs: 3, val: loader(16, { dataSeed: 2 }) });
    expect(result.steps).toBe(4);
    expect(result.epochs).toBe(1);
    expect(result.interrupted).toBe(true);
    // Each step's loss() returned its own value, and a value read during the step stays readable.
    expect(new Set(seen.map((s) => s.value)).size).toBe(4);
    expect(() => seen[0]!.loss()).not.toThrow();
    expect(seen[0]!.loss()).toBe(seen[0]!.value);
  });

  it('reduces the lr on a plateau of an accuracy only when it stops rising', async () => {
    const seen: { acc: number; lr: number }[] = [];
    const trainer = make(16, {
      plateau: { monitor: 'val/acc1', patience: 0, factor: 0.5 },
      callbacks: [{ onEpochEnd: (t, record) => void seen.push({ acc: record.metrics['val/acc1']!, lr: t.lr }) }],
    });
    await trainer.fit(loader(48, { shuffle: true, augment: true }), { epochs: 5, val: loader(32, { dataSeed: 6 }) });
    // PyTorch's rule in 'max' mode with patience 0: halve after every evaluation that does not beat
    // the best by the relative threshold 1e-4.
    let best = -Infinity;
    let lr = 0.05;
    const expected = seen.map(({ acc }) => {
      if (acc > best * (1 + 1e-4)) best = acc;
      else lr *= 0.5;
      return lr;
    });
    expect(seen.map((s) => s.lr)).toEqual(expected);
  });

  it('refuses to resume a checkpoint made with other options before changing anything', async () => {
    const out = outDir();
    const a = make(17, { outDir: out, schedule: new CosineAnnealingLR({ tMax: 10 }) });
    await a.fit(loader(32), { epochs: 1 });
    const b = make(18, { outDir: out, ema: { decay: 0.9 } });
    const before = lookup(b.model.stateDict(), '0.weight').data.slice();
    await expect(b.fit(loader(32), { epochs: 2, resume: true })).rejects.toMatchObject({
      code: 'ERR_RC_CHECKPOINT',
      message: stringContaining('follows a schedule'),
    });
    const c = make(18, { outDir: out, schedule: new CosineAnnealingLR({ tMax: 10 }), ema: { decay: 0.9 } });
    await expect(c.fit(loader(32), { epochs: 2, resume: true })).rejects.toMatchObject({
      code: 'ERR_RC_CHECKPOINT',
      message: stringContaining('no moving average'),
    });
    expect(lookup(b.model.stateDict(), '0.weight').data).toEqual(before);
    expect(c.stepCount).toBe(0);
  });

  it('recovers from an error inside a step: the next fit starts with clean gradients and loss scale', async () => {
    let broken = true;
    const failing: Callback = {
      onStepBegin: (t) => {
        if (broken) t.optimizer.paramGroups[0]!.lr = -1;
      },
    };
    const trainer = make(19, {
      amp: 'bf16',
      gradScaler: { enabled: true, initScale: 1024 },
      clipGradNorm: 1,
      callbacks: [failing],
    });
    await expect(trainer.fit(loader(32), { epochs: 1 })).rejects.toThrow(/lr/);
    broken = false;
    trainer.optimizer.paramGroups[0]!.lr = 0.05;
    const result = await trainer.fit(loader(32), { epochs: 1 });
    expect(result.steps).toBe(2);
    expect(defined(result.history.at(-1), 'an epoch').trainLoss).toBeLessThan(3);
    const weights = trainer.model.arena().params.toFloat32Array();
    expect(Math.max(...weights.map(Math.abs))).toBeLessThan(10);
  });

  it('overfits a few batches in the dry-run mode', async () => {
    const model = tinyNet(8);
    const trainer = new Trainer({
      model,
      optimizer: new SGD(model, { lr: 0.2, momentum: 0.9 }),
      progress: false,
      normalize: { mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] },
    });
    const result = await trainer.fit(loader(256, { shuffle: true }), { epochs: 40, overfitBatches: 1 });
    expect(result.steps).toBe(40);
    const first = result.history[0]!.trainLoss;
    const last = defined(result.history.at(-1), 'an epoch').trainLoss;
    expect(first).toBeGreaterThan(1);
    expect(last).toBeLessThan(0.2 * first);
    // Evaluated on the same batch, in evaluation mode.
    const lastEval = defined(result.lastEval, 'an evaluation');
    expect(lastEval.count).toBe(16);
    expect(lastEval.acc1).toBeGreaterThanOrEqual(0.9);
  });

  it('predicts the top classes with probabilities', async () => {
    const trainer = make(9);
    const val = loader(20);
    const p = await trainer.predict(val, { topk: 3 });
    expect(p.numClasses).toBe(4);
    expect(p.classes).toHaveLength(60);
    expect(Array.from(p.indices)).toEqual(Array.from({ length: 20 }, (_, i) => i));
    for (let s = 0; s < 20; s++) {
      const row = p.logits.subarray(s * 4, s * 4 + 4);
      const best = row.indexOf(Math.max(...row));
      expect(p.classes[s * 3]).toBe(best);
      const probs = p.probabilities.subarray(s * 3, s * 3 + 3);
      expect(probs[0]).toBeGreaterThanOrEqual(probs[1]!);
      expect(probs[1]).toBeGreaterThanOrEqual(probs[2]!);
      expect(probs[0]! + probs[1]! + probs[2]!).toBeLessThanOrEqual(1 + 1e-6);
    }
    const images = Tensor.zeros([2, 16, 16, 3], { dtype: 'u8' });
    expect((await trainer.predict(images, { topk: 10 })).topk).toBe(4);
  });

  it('averages gradients over ranks and sums evaluation counts through the process group', async () => {
    // Two ranks with identical data: the average of the gradients is each rank's gradient, and
    // every evaluation count doubles.
    const calls: string[] = [];
    const processGroup = {
      rank: 0,
      worldSize: 2,
      allReduce(tensor: Tensor, options: { op?: string } = {}) {
        calls.push(options.op === 'avg' ? `average ${tensor.numel}` : `sum ${tensor.numel}`);
        if (options.op !== 'avg') tensor.copyFromHost(tensor.toFloat32Array().map((v) => 2 * v));
      },
      wait() {},
    };
    const single = make(12);
    const ranked = make(12, { distributed: { processGroup: processGroup as never } });
    const a = await single.fit(loader(32), { epochs: 1, val: loader(24, { dataSeed: 5 }) });
    const b = await ranked.fit(loader(32), { epochs: 1, val: loader(24, { dataSeed: 5 }) });
    const arena = ranked.model.arena().size;
    expect(calls).toEqual([`average ${arena}`, `average ${arena}`, `sum ${4 * 4 + 3}`]);
    const singleEval = defined(a.lastEval, 'an evaluation');
    const rankedEval = defined(b.lastEval, 'an evaluation');
    expect(rankedEval.count).toBe(48);
    expect(rankedEval.acc1).toBe(singleEval.acc1);
    expect(rankedEval.loss).toBeCloseTo(singleEval.loss, 6);
    for (const [name, entry] of single.model.stateDict()) {
      expect(lookup(ranked.model.stateDict(), name).data, name).toEqual(entry.data);
    }
  });

  it('trains in bf16 with loss scaling, and checkpoints the scaler', async () => {
    const out = outDir();
    const trainer = make(13, {
      amp: 'bf16',
      gradScaler: { enabled: true, initScale: 1024, growthInterval: 2 },
      clipGradNorm: 1,
      outDir: out,
      logEvery: 1,
    });
    const result = await trainer.fit(loader(64), { epochs: 1 });
    expect(result.steps).toBe(4);
    // No overflow in four steps: the scale doubled after steps 2 and 4.
    expect(trainer.scaler.lossScale).toBe(4096);
    const losses = records(out)
      .filter((r) => r.type === 'train')
      .map((r) => r.loss as number);
    expect(losses.every(Number.isFinite)).toBe(true);
    const resumed = make(14, {
      amp: 'bf16',
      gradScaler: { enabled: true, initScale: 1, growthInterval: 2 },
      outDir: out,
    });
    await resumed.fit(loader(64), { epochs: 1, resume: true });
    expect(resumed.scaler.lossScale).toBe(4096);
    expect(resumed.stepCount).toBe(4);
  });

  it('rejects bad options with clear errors', async () => {
    const model = tinyNet(10);
    const optimizer = new SGD(model, { lr: 0.1 });
    const bad = (extra: Record<string, unknown>) => () => new Trainer({ model, optimizer, progress: false, ...extra });
    expect(bad({ colour: 'red' })).toThrow(/Unknown option 'colour'/);
    expect(bad({ amp: 'fp16' })).toThrow(/needs a CUDA device/);
    expect(bad({ amp: 'fp8' })).toThrow(/amp/);
    expect(bad({ accumulate: 0 })).toThrow(/accumulate/);
    expect(bad({ schedule: new CosineAnnealingLR({ tMax: 3 }), plateau: {} })).toThrow(/either schedule or plateau/);
    expect(bad({ earlyStopping: { monitor: 'val/acc7', patience: 1 } })).toThrow(/metric name/);
    expect(bad({ optimizer: new SGD(tinyNet(11), { lr: 0.1 }) })).toThrow(/do not belong to this model/);
    const trainer = new Trainer({
      model,
      optimizer,
      progress: false,
      earlyStopping: { monitor: 'val/acc1', patience: 1 },
    });
    await expect(trainer.fit(loader(16), { epochs: 1 })).rejects.toThrow(/no validation data/);
    await expect(trainer.fit(loader(16), { epochs: 1, resume: true })).rejects.toThrow(/no outDir/);
    await expect(trainer.fit(loader(16), { epochs: 0 })).rejects.toThrow(/epochs/);
    await expect(trainer.evaluate(loader(16), { ema: true })).rejects.toThrow(/no moving average/);
  });
});

describe('Trainer runs and resumes', () => {
  it('resume: true on a fresh outDir starts fresh; a missing checkpoint path writes nothing', async () => {
    const out = outDir();
    const trainer = make(20, { outDir: out });
    const result = await trainer.fit(loader(32), { epochs: 1, resume: true });
    expect(result.steps).toBe(2);
    expect(existsSync(join(out, 'checkpoints', 'latest.json'))).toBe(true);
    await trainer.dispose();
    const other = outDir();
    const refused = make(20, { outDir: other });
    await expect(refused.fit(loader(32), { epochs: 1, resume: join(other, 'nothing-here') })).rejects.toMatchObject({
      code: 'ERR_RC_CHECKPOINT',
    });
    expect(existsSync(other)).toBe(false);
    await refused.dispose();
  });

  it('a resumed epoch reports the loss, time and images of the whole epoch, and keep-last holds the resumed file too', async () => {
    const options = { logEvery: 2, checkpoint: { everySteps: 2, keepLast: 2 } };
    const whole = outDir();
    const a = make(21, { ...options, outDir: whole });
    const expected = await a.fit(loader(96, { shuffle: true }), { epochs: 2 });
    await a.dispose();

    const broken = outDir();
    const b = make(21, {
      ...options,
      outDir: broken,
      callbacks: [
        {
          onStepEnd: (t, info) => {
            if (info.step === 9) t.requestStop();
          },
        },
      ],
    });
    await b.fit(loader(96, { shuffle: true }), { epochs: 2 });
    await b.dispose();
    // Stopped at step 9, in the middle of the second epoch (6 steps per epoch), with a partial log window.
    expect(JSON.parse(readFileSync(join(broken, 'checkpoints', 'latest.json'), 'utf8'))).toMatchObject({
      step: 9,
      epoch: 1,
      batch: 3,
    });
    writeFileSync(join(broken, 'checkpoints', '.step-00000010.safetensors.0123456789ab.tmp'), 'partial');
    writeFileSync(join(broken, '.model.safetensors.0123456789ab.tmp'), 'partial');

    const c = make(99, { ...options, outDir: broken });
    const resumed = await c.fit(loader(96, { shuffle: true }), { epochs: 2, resume: true });
    await c.dispose();
    const epoch = defined(resumed.history.at(-1), 'an epoch');
    expect(epoch.trainLoss).toBe(defined(expected.history.at(-1), 'an epoch').trainLoss);
    // The whole epoch's 96 images over its whole time, which includes the time before the stop.
    expect(epoch.imagesPerSec * epoch.seconds).toBeCloseTo(96, 6);
    // After the resume, the log points (each the mean loss since the previous one) are the uninterrupted run's.
    const log = records(broken);
    const after = log
      .slice(log.findIndex((r) => r.type === 'resume'))
      .filter((r) => r.type === 'train')
      .map((r) => [r.step, r.loss]);
    expect(after).toEqual(
      records(whole)
        .filter((r) => r.type === 'train' && (r.step as number) > 9)
        .map((r) => [r.step, r.loss]),
    );
    // Partial files of the killed run are gone, and only the last two checkpoints are kept.
    expect(readdirSync(join(broken, 'checkpoints')).filter((f) => f.startsWith('step-') || f.endsWith('.tmp'))).toEqual(
      ['step-00000010.safetensors', 'step-00000012.safetensors'],
    );
    expect(readdirSync(broken).filter((f) => f.endsWith('.tmp'))).toEqual([]);
  });

  it('writes the confusion matrix, report and summary for a model with more classes than the dataset', async () => {
    const out = outDir();
    const trainer = make(22, { outDir: out, classNames: ['circle', 'square', 'triangle'] });
    const result = await trainer.fit(loader(32), { epochs: 1, val: loader(16, { dataSeed: 5 }) });
    expect(defined(result.lastEval, 'an evaluation').confusion.toArray()).toHaveLength(4);
    for (const f of ['confusion-matrix.png', 'classification-report.txt', 'summary.json']) {
      expect(existsSync(join(out, f)), f).toBe(true);
    }
    expect(readFileSync(join(out, 'classification-report.txt'), 'utf8')).toMatch(/triangle[\s\S]*\b3\b/);
    await trainer.dispose();
  });

  it('refuses a second fit or an evaluate while fit runs, and allows evaluate from its callbacks', async () => {
    let inside: number | undefined;
    const trainer = make(23, {
      callbacks: [{ onEpochEnd: async (t) => void (inside = (await t.evaluate(loader(16))).count) }],
    });
    const running = trainer.fit(loader(64), { epochs: 1 });
    await expect(trainer.fit(loader(64), { epochs: 1 })).rejects.toMatchObject({
      code: 'ERR_RC_INVALID_ARGUMENT',
      message: stringContaining('already running fit()'),
    });
    await expect(trainer.evaluate(loader(16))).rejects.toThrow(/already running fit\(\)/);
    await expect(trainer.predict(loader(16))).rejects.toThrow(/already running fit\(\)/);
    expect((await running).steps).toBe(4);
    expect(inside).toBe(16);
    expect((await trainer.evaluate(loader(16))).count).toBe(16);
    await trainer.dispose();
  });

  it('stops at a step boundary on an AbortSignal with an AbortError, and can train again', async () => {
    const controller = new AbortController();
    const trainer = make(24, {
      callbacks: [
        {
          onStepEnd: (_t, info) => {
            if (info.step === 2) controller.abort(new Error('user'));
          },
        },
      ],
    });
    const error = (await trainer.fit(loader(64), { epochs: 3, signal: controller.signal }).then(
      () => null,
      (e: unknown) => e,
    )) as { name: string; code: string; cause: Error };
    expect(error).toMatchObject({ name: 'AbortError', code: 'ABORT_ERR' });
    expect(error.cause.message).toBe('user');
    expect(trainer.stepCount).toBe(2);
    await expect(trainer.evaluate(loader(16), { signal: controller.signal })).rejects.toMatchObject({
      code: 'ABORT_ERR',
    });
    await expect(trainer.predict(loader(16), { signal: controller.signal })).rejects.toMatchObject({
      code: 'ABORT_ERR',
    });
    await expect(trainer.fit(loader(16), { epochs: 1, signal: 'stop' as never })).rejects.toThrow(
      /AbortSignal for signal/,
    );
    expect((await trainer.fit(loader(64), { epochs: 1 })).steps).toBe(6);
    await trainer.dispose();
  });
});
