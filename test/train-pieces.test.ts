// The pieces the Trainer is built from, each on its own: monitors, the epoch meter, the checkpoint
// manager, run outputs, option parsing, evaluation helpers, the data-parallel reduction, abort.
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Flatten, Linear, SGD, Sequential, Tensor } from '../lib/index.js';
import { AbortError, checkSignal, throwIfAborted } from '../lib/train/abort.js';
import { isLoader } from '../lib/train/batches.js';
import {
  CheckpointManager,
  findResumeFile,
  resolveCheckpointPath,
  type RunState,
} from '../lib/train/checkpoint-manager.js';
import { DistributedSampler } from '../lib/data/sampler.js';
import { ownSamples, sumEvalCounts } from '../lib/train/distributed.js';
import { EpochMeter } from '../lib/train/epoch-meter.js';
import { evalResult, namesFor, rankPredictions } from '../lib/train/evaluation.js';
import { ConfusionMatrix } from '../lib/train/metrics.js';
import { BestMetric, EarlyStopping, defaultMode, improves } from '../lib/train/monitors.js';
import { RunOutputs, spansDecades } from '../lib/train/run-outputs.js';
import { parseFitOptions, parseTrainerOptions } from '../lib/train/trainer-options.js';
import { defined } from './helpers/defined.js';
import { PeerGroup } from './helpers/peer-group.js';
import { stringContaining } from './helpers/matchers.js';

const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-train-pieces-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let folders = 0;
const folder = (): string => join(dir, `f-${folders++}`);

describe('monitors', () => {
  it('improves: the first finite value, then by more than minDelta in the mode’s direction', () => {
    expect(defaultMode('val/loss')).toBe('min');
    expect(defaultMode('val/acc1')).toBe('max');
    expect(improves(1, null, 'min', 0)).toBe(true);
    expect(improves(NaN, null, 'min', 0)).toBe(false);
    expect(improves(0.9, 1, 'min', 0.05)).toBe(true);
    expect(improves(0.97, 1, 'min', 0.05)).toBe(false);
    expect(improves(1.1, 1, 'max', 0)).toBe(true);
  });

  it('BestMetric keeps the best epoch and drops a best saved for another metric', () => {
    const best = new BestMetric('val/acc1', 'max');
    expect(best.update({ 'val/acc1': 0.5 }, 0)).toBe(true);
    expect(best.update({ 'val/acc1': 0.4 }, 1)).toBe(false);
    expect(best.update({ 'train/loss': 1 }, 2)).toBe(false);
    expect(best.best).toEqual({ monitor: 'val/acc1', value: 0.5, epoch: 0 });
    best.restore({ monitor: 'val/loss', value: 0.1, epoch: 3 });
    expect(best.best).toBeNull();
    best.restore({ monitor: 'val/acc1', value: 0.7, epoch: 3 });
    expect(best.update({ 'val/acc1': 0.6 }, 4)).toBe(false);
  });

  it('EarlyStopping stops after patience evaluations without improvement, and restores only its own metric', () => {
    const early = new EarlyStopping({ monitor: 'val/loss', patience: 2, minDelta: 0.1, mode: 'min' });
    expect(early.update({ 'val/loss': 1 })).toBe(false);
    expect(early.update({ 'val/loss': 0.95 })).toBe(false);
    expect(early.update({ 'val/loss': 0.92 })).toBe(true);
    expect(early.state).toEqual({ best: 1, bad: 2 });
    early.restore({ best: 0.5, bad: 1 }, 'val/acc1');
    expect(early.state).toEqual({ best: null, bad: 0 });
    early.restore({ best: 0.5, bad: 1 }, 'val/loss');
    expect(early.update({ 'val/loss': 0.45 })).toBe(true);
  });
});

describe('EpochMeter', () => {
  it('reads windows from the device, and a meter resumed from progress() continues the same totals', () => {
    const sum = Tensor.zeros([1]);
    const meter = new EpochMeter(sum, null);
    const add = (m: EpochMeter, v: number) => m.addLoss(Tensor.from([v], [1]));
    expect(meter.readWindow()).toBeNull();
    add(meter, 1);
    add(meter, 3);
    meter.addImages(8);
    expect(defined(meter.readWindow(), 'a window reading').loss).toBe(2);
    add(meter, 5);
    meter.addImages(4);
    const saved = meter.progress();
    expect(saved).toMatchObject({ lossTotal: 4, batches: 2, images: 12, window: { loss: 5, batches: 1, images: 4 } });
    const resumed = new EpochMeter(Tensor.zeros([1]), saved);
    add(resumed, 7);
    resumed.addImages(4);
    expect(defined(resumed.readWindow(), 'a window reading').loss).toBe(6);
    const totals = resumed.totals();
    expect(totals.trainLoss).toBe(4);
    expect(totals.seconds).toBeGreaterThanOrEqual(saved.seconds);
    expect(totals.imagesPerSec * totals.seconds).toBeCloseTo(16, 9);
  });
});

describe('CheckpointManager', () => {
  const run = (periodic: string[]): RunState => ({
    batch: 0,
    epochs: 1,
    best: null,
    earlyStopping: null,
    earlyMonitor: null,
    history: [],
    trainLossPoints: [],
    periodic,
    data: { trainSeed: 0, trainLength: 1, batchSize: 1 },
    config: {},
  });

  it('keeps the last keepLast files, lists the new file among them, and points latest.json at it', async () => {
    const out = folder();
    const manager = new CheckpointManager(out, 2);
    await manager.prepare();
    const lists: string[][] = [];
    const write = async (path: string, kept: string[]) => {
      lists.push(kept);
      await writeFile(path, 'x');
    };
    for (const step of [3, 5, 6]) await manager.save({ epoch: 0, batch: step, step }, write);
    expect(lists).toEqual([
      ['step-00000003.safetensors'],
      ['step-00000003.safetensors', 'step-00000005.safetensors'],
      ['step-00000005.safetensors', 'step-00000006.safetensors'],
    ]);
    expect(readdirSync(manager.dir).sort()).toEqual([
      'latest.json',
      'step-00000005.safetensors',
      'step-00000006.safetensors',
    ]);
    expect(JSON.parse(readFileSync(join(manager.dir, 'latest.json'), 'utf8'))).toEqual({
      file: 'step-00000006.safetensors',
      epoch: 0,
      batch: 6,
      step: 6,
    });
    expect(manager.hasStep(6)).toBe(true);
    expect(await findResumeFile(true, out)).toBe(join(manager.dir, 'step-00000006.safetensors'));
  });

  it('adopts a resumed run’s list (adding the file itself to lists of older releases) only in its own folder', async () => {
    const out = folder();
    const manager = new CheckpointManager(out, 2);
    await manager.prepare();
    manager.adopt(run(['step-00000002.safetensors']), join(manager.dir, 'step-00000004.safetensors'));
    expect(manager.kept).toEqual(['step-00000002.safetensors', 'step-00000004.safetensors']);
    const other = new CheckpointManager(folder(), 2);
    other.adopt(run(['step-00000002.safetensors']), join(manager.dir, 'step-00000004.safetensors'));
    expect(other.kept).toEqual([]);
  });

  it('prepare() removes partial files of a killed write, and nothing else', async () => {
    const out = folder();
    mkdirSync(join(out, 'checkpoints'), { recursive: true });
    const partial = ['.step-00000004.safetensors.a1b2c3d4e5f6.tmp', '.latest.json.000000000000.tmp'];
    const kept = ['step-00000002.safetensors', 'notes.tmp', '.hidden.tmp'];
    for (const name of [...partial, ...kept]) writeFileSync(join(out, 'checkpoints', name), 'x');
    writeFileSync(join(out, '.model.safetensors.abcdefabcdef.tmp'), 'x');
    await new CheckpointManager(out, 3).prepare();
    expect(readdirSync(join(out, 'checkpoints')).sort()).toEqual([...kept].sort());
    expect(existsSync(join(out, '.model.safetensors.abcdefabcdef.tmp'))).toBe(false);
  });

  it('findResumeFile(true) is null for a fresh folder; resolveCheckpointPath names what is wrong', async () => {
    const out = folder();
    expect(await findResumeFile(true, out)).toBeNull();
    await expect(resolveCheckpointPath(join(out, 'missing'))).rejects.toMatchObject({
      code: 'ERR_RC_CHECKPOINT',
      message: stringContaining('no such checkpoint'),
    });
    mkdirSync(out, { recursive: true });
    writeFileSync(join(out, 'latest.json'), 'null');
    await expect(resolveCheckpointPath(out)).rejects.toThrow(/does not name a checkpoint file/);
  });
});

describe('RunOutputs', () => {
  it('writes nothing off the main process or without a folder; spansDecades picks the log axis', async () => {
    const out = folder();
    const lines: string[] = [];
    const stream = { write: (s: string) => lines.push(s) > 0 };
    const worker = new RunOutputs({
      outDir: out,
      isMain: false,
      progress: stream,
      jsonLog: true,
      tensorboard: true,
      plots: true,
    });
    worker.open();
    worker.log({ type: 'x' });
    worker.say('hello');
    await worker.writeCurves([], [[1, 2]]);
    expect(existsSync(out)).toBe(false);
    expect(lines).toEqual([]);
    expect(worker.progressBar({ total: 3 })).toBeNull();
    const main = new RunOutputs({
      outDir: null,
      isMain: true,
      progress: stream,
      jsonLog: true,
      tensorboard: true,
      plots: true,
    });
    main.say('hello');
    expect(lines).toEqual(['hello\n']);
    expect(main.writes).toBe(false);
    expect(spansDecades([2.3, 1.1, 0.08])).toBe(true);
    expect(spansDecades([2.3, 0.5])).toBe(false);
    expect(spansDecades([2.3, 0, 0.001])).toBe(false);
  });

  it('draws the loss curves and logs when it writes', async () => {
    const out = folder();
    mkdirSync(out);
    const outputs = new RunOutputs({
      outDir: out,
      isMain: true,
      progress: null,
      jsonLog: true,
      tensorboard: false,
      plots: true,
    });
    outputs.open();
    outputs.log({ type: 'train', loss: 1 });
    await outputs.writeCurves(
      [{ epoch: 0, step: 2, metrics: { 'val/loss': 0.5, 'val/acc1': 0.75 } }],
      [
        [1, 2.3],
        [2, 0.01],
      ],
    );
    await outputs.close();
    expect(readdirSync(out).sort()).toEqual(['curves-accuracy.png', 'curves-loss.png', 'log.jsonl']);
    expect(JSON.parse(readFileSync(join(out, 'log.jsonl'), 'utf8'))).toMatchObject({ type: 'train', loss: 1 });
  });
});

describe('trainer options', () => {
  const model = new Sequential(new Flatten(), new Linear({ inFeatures: 3, outFeatures: 2, seed: 1 })).to('cpu');
  const optimizer = new SGD(model, { lr: 0.1 });

  it('resolves the defaults; no checkpoints without an outDir; the plateau mode follows its monitor', () => {
    const s = parseTrainerOptions({ model, optimizer, plateau: { monitor: 'val/acc1', patience: 1 } });
    expect(s).toMatchObject({
      device: 'cpu',
      amp: false,
      accumulate: 1,
      logEvery: 10,
      checkpoint: null,
      outDir: null,
      progress: process.stderr,
    });
    expect(s.plateau).toEqual({ monitor: 'val/acc1', patience: 1, mode: 'max' });
    const withDir = parseTrainerOptions({ model, optimizer, outDir: 'runs/x', checkpoint: { keepLast: 5 } });
    expect(withDir.checkpoint).toEqual({ everyEpochs: 1, everySteps: null, keepLast: 5, monitor: null, mode: null });
    expect(() => parseTrainerOptions({ model, optimizer, checkpoint: { keep: 1 } as never })).toThrow(
      /Unknown option 'keep'/,
    );
    expect(() => parseTrainerOptions({ model, optimizer, normalize: { mean: 0.5, std: [1] } as never })).toThrow(
      /normalize\.mean/,
    );
    expect(() => parseTrainerOptions({ model, optimizer, progress: 3 as never })).toThrow(/progress/);
  });

  it('fit options: loaders, monitors that will exist, and the signal', () => {
    const settings = parseTrainerOptions({ model, optimizer, earlyStopping: { monitor: 'val_ema/acc1', patience: 1 } });
    // A loader in shape only: the options are checked, nothing iterates it.
    const train = {
      [Symbol.asyncIterator]() {
        // never called
      },
      setEpoch() {
        // never called
      },
      length: 1,
    };
    expect(isLoader(train)).toBe(true);
    expect(() => parseFitOptions({}, { epochs: 1 }, { settings, hasEma: true })).toThrow(/DataLoader for train/);
    expect(() => parseFitOptions(train, { epochs: 1 }, { settings, hasEma: true })).toThrow(/no validation data/);
    expect(() => parseFitOptions(train, { epochs: 1, val: train as never }, { settings, hasEma: false })).toThrow(
      /moving average/,
    );
    const f = parseFitOptions(
      train,
      { epochs: 2, val: train as never, signal: new AbortController().signal },
      { settings, hasEma: true },
    );
    expect(f).toMatchObject({ epochs: 2, resume: null, evalEvery: 1, overfit: null, maxSteps: null });
    expect(f.signal).toBeInstanceOf(AbortSignal);
  });
});

describe('evaluation helpers', () => {
  it('rankPredictions orders classes by probability, ties by index', () => {
    const p = rankPredictions([{ logits: Float32Array.of(0, 2, 2, 1), indices: Int32Array.of(7) }], 4, 3);
    expect(Array.from(p.classes)).toEqual([1, 2, 3]);
    expect(p.probabilities[0]).toBeCloseTo(Math.exp(2) / (1 + 2 * Math.exp(2) + Math.exp(1)), 6);
    expect(Array.from(p.indices)).toEqual([7]);
    expect(rankPredictions([], 0, 5).topk).toBe(1);
  });

  it('names the classes beyond the given names by index, and builds the report with them', () => {
    expect(namesFor(4, ['a', 'b', 'c'])).toEqual(['a', 'b', 'c', '3']);
    expect(namesFor(2, null)).toBeUndefined();
    const confusion = ConfusionMatrix.fromArray([
      [2, 0, 0],
      [0, 1, 1],
      [0, 0, 0],
    ]);
    const result = evalResult({ confusion, lossTotal: 2, topHits: 4, count: 4 }, ['cat', 'dog']);
    expect(result).toMatchObject({ loss: 0.5, acc1: 0.75, acc5: 1, count: 4 });
    expect(result.report).toMatch(/cat[\s\S]*dog[\s\S]*\b2\b/);
  });

  it('sumEvalCounts adds every rank’s counts in one all-reduce, and does nothing for one process', () => {
    const confusion = ConfusionMatrix.fromArray([
      [1, 0],
      [1, 2],
    ]);
    const counts = { confusion, lossTotal: 1.5, topHits: 4, count: 4 };
    expect(sumEvalCounts(null, counts, 'cpu')).toBe(counts);
    const twice = new PeerGroup();
    const summed = sumEvalCounts(twice, counts, 'cpu');
    expect(twice.calls).toEqual(['allReduce:sum 7', 'synchronize']);
    expect(summed.confusion.toArray()).toEqual([
      [2, 0],
      [2, 4],
    ]);
    expect(summed).toMatchObject({ lossTotal: 3, topHits: 8, count: 8 });
  });

  it('ownSamples counts a rank’s samples without the padding of an uneven split', () => {
    const own = (length: number, worldSize: number, dropLast = false): number[] =>
      Array.from({ length: worldSize }, (_, rank) =>
        ownSamples({ sampler: new DistributedSampler({ length, rank, worldSize, dropLast }) } as never),
      );
    expect(own(13, 2)).toEqual([7, 6]);
    expect(own(12, 4)).toEqual([3, 3, 3, 3]);
    // Fewer samples than ranks: the last ranks read only padding.
    expect(own(3, 4)).toEqual([1, 1, 1, 0]);
    // dropLast truncates instead: every rank's samples are its own.
    expect(own(13, 2, true)).toEqual([6, 6]);
    for (const [n, w] of [
      [13, 2],
      [3, 4],
      [101, 8],
    ] as const) {
      expect(own(n, w).reduce((a, b) => a + b)).toBe(n);
    }
  });
});

describe('abort', () => {
  it('AbortError has the name, code and cause of Node’s', () => {
    const controller = new AbortController();
    expect(() => throwIfAborted(controller.signal, 'x')).not.toThrow();
    controller.abort('why');
    let error: unknown;
    try {
      throwIfAborted(controller.signal, 'the run');
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(AbortError);
    expect(error).toMatchObject({
      name: 'AbortError',
      code: 'ABORT_ERR',
      cause: 'why',
      message: 'the run was aborted',
    });
    expect(checkSignal('signal', undefined)).toBeNull();
    expect(() => checkSignal('signal', {})).toThrow(/AbortSignal for signal/);
  });
});
