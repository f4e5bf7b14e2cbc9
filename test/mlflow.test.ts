import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  AdaptiveAvgPool2d,
  CenterCrop,
  Compose,
  Conv2d,
  DataLoader,
  Flatten,
  Linear,
  LinearWarmup,
  ReLU,
  SGD,
  Sequential,
  ShapesDataset,
} from '../lib/index.js';
import { MlflowRun } from '../lib/train/outputs/mlflow.js';
import { Trainer, type TrainerOptions } from '../lib/train/trainer.js';
import { defined } from './helpers/defined.js';
import {
  MLFLOW_PYTHON,
  MLFLOW_SKIPPED,
  metricLines,
  readMeta,
  readWithMlflowClient,
  runIds,
} from './helpers/mlflow-store.js';

const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-mlflow-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let folders = 0;
const fresh = (): string => join(dir, `case-${folders++}`);

describe('MlflowRun writes the MLflow file-store layout', () => {
  it('creates the store with the default experiment, an experiment by name, and a run with meta, tags, params, metrics and artifacts', () => {
    const root = fresh();
    const before = Date.now();
    const run = MlflowRun.start({ trackingDir: root, experimentName: 'shapes', runName: 'first', tags: { team: 'a' } });
    // The store as FileStore makes it: experiment 0 "Default" and the trash folder.
    expect(readMeta(root, '0')).toMatchObject({ experiment_id: '0', name: 'Default', lifecycle_stage: 'active' });
    expect(existsSync(join(root, '.trash'))).toBe(true);
    expect(run.experimentId).toBe('1');
    const experiment = readMeta(root, '1');
    expect(experiment).toMatchObject({ experiment_id: '1', name: 'shapes', lifecycle_stage: 'active' });
    expect(experiment.artifact_location).toBe(`file://${join(root, '1')}`);
    expect(Number(experiment.creation_time)).toBeGreaterThanOrEqual(before);
    expect(run.runId).toMatch(/^[0-9a-f]{32}$/);
    expect(run.runDir).toBe(join(root, '1', run.runId));
    const info = readMeta(run.runDir);
    expect(info).toMatchObject({
      run_id: run.runId,
      run_uuid: run.runId,
      run_name: 'first',
      experiment_id: '1',
      status: 1,
      end_time: null,
      lifecycle_stage: 'active',
      source_type: 4,
      artifact_uri: `file://${join(run.runDir, 'artifacts')}`,
    });
    expect(readFileSync(join(run.runDir, 'meta.yaml'), 'utf8')).toContain('tags: []\n');
    for (const folder of ['metrics', 'params', 'tags', 'artifacts']) {
      expect(existsSync(join(run.runDir, folder))).toBe(true);
    }
    const tag = (key: string): string => readFileSync(join(run.runDir, 'tags', key), 'utf8');
    expect(tag('mlflow.runName')).toBe('first');
    expect(tag('mlflow.source.type')).toBe('LOCAL');
    expect(tag('team')).toBe('a');

    run.logParams({ lr: 0.1, opt: 'sgd', nesterov: true });
    expect(readFileSync(join(run.runDir, 'params', 'lr'), 'utf8')).toBe('0.1');
    expect(readFileSync(join(run.runDir, 'params', 'nesterov'), 'utf8')).toBe('true');
    run.logParam('lr', 0.1); // the same value again is fine
    expect(() => run.logParam('lr', 0.2)).toThrow(/param 'lr' was already logged as '0.1'.*cannot change/);
    run.logParam('lr', 0.2, { keepExisting: true });
    expect(readFileSync(join(run.runDir, 'params', 'lr'), 'utf8')).toBe('0.1');
    run.logParam('long', 'x'.repeat(7000));
    expect(readFileSync(join(run.runDir, 'params', 'long'), 'utf8')).toHaveLength(6000);

    run.logMetric('train/loss', 2.5, 10, 1_700_000_000_123);
    run.logMetric('train/loss', 1.25, 20, 1_700_000_000_456);
    run.logMetric('val/acc1', Number.NaN, 20);
    expect(readFileSync(join(run.runDir, 'metrics', 'train', 'loss'), 'utf8')).toBe(
      '1700000000123 2.5 10\n1700000000456 1.25 20\n',
    );
    expect(readFileSync(join(run.runDir, 'metrics', 'val', 'acc1'), 'utf8')).toMatch(/^\d{13} NaN 20\n$/);

    const file = join(root, 'weights.bin');
    writeFileSync(file, 'abc');
    expect(run.logArtifact(file)).toBe(join(run.runDir, 'artifacts', 'weights.bin'));
    run.logArtifact(file, 'plots/extra');
    expect(readFileSync(join(run.runDir, 'artifacts', 'plots', 'extra', 'weights.bin'), 'utf8')).toBe('abc');
    // Replacing the source by rename (as every output of a run is written) leaves the artifact as it was.
    writeFileSync(join(root, 'next.bin'), 'new');
    execFileSync('mv', [join(root, 'next.bin'), file]);
    expect(readFileSync(join(run.runDir, 'artifacts', 'weights.bin'), 'utf8')).toBe('abc');

    run.end('FINISHED');
    const ended = readMeta(run.runDir);
    expect(ended.status).toBe(3);
    expect(Number(ended.end_time)).toBeGreaterThanOrEqual(Number(ended.start_time));
    expect(() => run.logMetric('train/loss', 1, 30)).toThrow(expect.objectContaining({ code: 'ERR_RC_DISPOSED' }));
    // No temporary file is left behind.
    expect(readdirSync(run.runDir).filter((n) => n.endsWith('.tmp'))).toEqual([]);

    // A second run of the same experiment name goes into the same experiment; reopening sets it running again.
    const second = MlflowRun.start({ trackingDir: root, experimentName: 'shapes' });
    expect(second.experimentId).toBe('1');
    expect(second.runName).toBe(`run-${second.runId.slice(0, 8)}`);
    second.end('KILLED');
    expect(readMeta(second.runDir).status).toBe(5);
    const again = defined(MlflowRun.reopen(root, run.runId), 'the reopened run');
    expect(again.runName).toBe('first');
    expect(readMeta(run.runDir)).toMatchObject({ status: 1, end_time: null, run_name: 'first' });
    again.end('FAILED');
    expect(readMeta(run.runDir).status).toBe(4);
    expect(MlflowRun.reopen(root, 'f'.repeat(32))).toBeNull();
  });

  it('reads experiments whose meta files PyYAML wrote (quoted and folded scalars)', () => {
    const root = fresh();
    MlflowRun.start({ trackingDir: root }).end();
    // An experiment written by MLflow itself: single quotes, a folded long value.
    const id = '123456789';
    execFileSync('mkdir', ['-p', join(root, id)]);
    writeFileSync(
      join(root, id, 'meta.yaml'),
      "artifact_location: file:///very/long/path/that/goes/on/and/on/and/on/and/on/and/on/and/on/and/on\n  /mlruns/123456789\ncreation_time: 1700000000000\nexperiment_id: '123456789'\nlast_update_time: 1700000000000\nlifecycle_stage: active\nname: 'it''s mine'\n",
    );
    expect(readMeta(root, id)).toMatchObject({ experiment_id: '123456789', name: "it's mine" });
    expect(readMeta(root, id).artifact_location).toMatch(/and\/on \/mlruns\/123456789$/);
    const run = MlflowRun.start({ trackingDir: root, experimentName: "it's mine" });
    expect(run.experimentId).toBe(id);
    // A new experiment takes the next integer id after the largest.
    expect(MlflowRun.start({ trackingDir: root, experimentName: 'other' }).experimentId).toBe('123456790');
  });

  it('refuses bad keys, values and options, naming them', () => {
    const root = fresh();
    const run = MlflowRun.start({ trackingDir: root });
    for (const key of ['../escape', '/abs', 'a//b', 'what?', '', 'x'.repeat(251)]) {
      expect(() => run.logMetric(key, 1), key).toThrow(expect.objectContaining({ code: 'ERR_RC_INVALID_ARGUMENT' }));
    }
    expect(() => run.logMetric('loss', 1, 1.5)).toThrow(/step/);
    expect(() => run.logMetric('loss', '1' as unknown as number)).toThrow(/metric 'loss'/);
    expect(() => run.logParam('p', { a: 1 } as unknown as string)).toThrow(/param 'p'/);
    expect(() => run.setTag('t', 1 as unknown as string)).toThrow(/tag 't'/);
    expect(() => run.logArtifact(join(root, 'missing'))).toThrow(/file/);
    expect(() => run.end('DONE' as 'FINISHED')).toThrow(/status/);
    expect(() => MlflowRun.start({ trackingDir: root, nope: 1 } as never)).toThrow(/Unknown option 'nope'/);
    expect(() => MlflowRun.start({ trackingDir: root, runName: '' })).toThrow(/runName/);
    expect(() => MlflowRun.start({ trackingDir: root, tags: { a: 1 } as never })).toThrow(/tags/);
    expect(() => MlflowRun.reopen(root, 'xyz')).toThrow(/runId/);
    run.end();
  });
});

function tinyNet(seed: number): Sequential {
  return new Sequential(
    new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 3, stride: 2, padding: 1, seed }),
    new ReLU(),
    new AdaptiveAvgPool2d(1),
    new Flatten(),
    new Linear({ inFeatures: 8, outFeatures: 4, seed: seed + 1 }),
  ).to('cpu');
}

function loader(length: number, seed: number): DataLoader {
  return new DataLoader(new ShapesDataset({ length, size: 16, classes: 4, seed }), {
    batchSize: 16,
    transform: new Compose([new CenterCrop({ size: 16 })]),
    workers: 0,
    seed: 7,
  });
}

function trainer(outDir: string, mlflow: TrainerOptions['mlflow'], extra: Partial<TrainerOptions> = {}): Trainer {
  const model = tinyNet(1);
  return new Trainer({
    model,
    optimizer: new SGD(model, { lr: 0.05, momentum: 0.9 }),
    progress: false,
    normalize: { mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] },
    outDir,
    logEvery: 2,
    mlflow,
    config: { model: 'tiny', data: { size: 16, classes: ['a', 'b'] } },
    ...extra,
  });
}

function pointer(outDir: string): { trackingDir: string; experimentId: string; runId: string } {
  return JSON.parse(readFileSync(join(outDir, 'mlflow-run.json'), 'utf8')) as {
    trackingDir: string;
    experimentId: string;
    runId: string;
  };
}

describe('the Trainer tracks its runs in MLflow', () => {
  const tracked = { root: '', out: '', runId: '' };

  it('logs parameters, every scalar as a metric, the final files as artifacts, and FINISHED at the end', async () => {
    const root = fresh();
    const out = join(fresh(), 'my-run');
    const t = trainer(out, { trackingDir: root, experimentName: 'tiny' });
    const result = await t.fit(loader(64, 3), { epochs: 2, val: loader(32, 4) });
    await t.dispose();
    const p = pointer(out);
    expect(p).toMatchObject({ trackingDir: root, experimentId: '1' });
    const runDir = join(root, '1', p.runId);
    expect(readMeta(runDir)).toMatchObject({ status: 3, run_name: 'my-run', experiment_id: '1' });
    const param = (key: string): string => readFileSync(join(runDir, 'params', key), 'utf8');
    expect(param('optimizer')).toBe('SGD');
    expect(param('optimizer.lr')).toBe('0.05');
    expect(param('optimizer.momentum')).toBe('0.9');
    expect(param('model')).toBe('Sequential');
    expect(param('amp')).toBe('false');
    expect(param('config.data.size')).toBe('16');
    expect(param('config.data.classes')).toBe('["a","b"]');
    // The log's train/loss records are the metric's values, at the same steps.
    const logged = readFileSync(join(out, 'log.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { type: string; step: number; loss: number })
      .filter((r) => r.type === 'train');
    expect(metricLines(runDir, 'train/loss').map(([, v, s]) => [s, v])).toEqual(logged.map((r) => [r.step, r.loss]));
    const acc = metricLines(runDir, 'val/acc1');
    expect(acc.map(([, v, s]) => [s, v])).toEqual(result.history.map((h) => [h.step, h.metrics['val/acc1']]));
    for (const name of ['model.safetensors', 'curves-loss.png', 'confusion-matrix.png', 'summary.json']) {
      expect(readFileSync(join(runDir, 'artifacts', name)), name).toEqual(readFileSync(join(out, name)));
    }
    Object.assign(tracked, { root, out, runId: p.runId });
  });

  it('continues the same run when the training run is resumed, keeping the first parameters', async () => {
    expect(tracked.runId, 'the run of the previous test').not.toBe('');
    const t = trainer(tracked.out, { trackingDir: tracked.root, experimentName: 'tiny' });
    await t.fit(loader(64, 3), { epochs: 3, val: loader(32, 4), resume: true });
    await t.dispose();
    expect(pointer(tracked.out).runId).toBe(tracked.runId);
    const runDir = join(tracked.root, '1', tracked.runId);
    expect(readMeta(runDir).status).toBe(3);
    expect(metricLines(runDir, 'val/acc1').map(([, , s]) => s)).toEqual([4, 8, 12]);
    expect(runIds(join(tracked.root, '1'))).toEqual([tracked.runId]);
  });

  it("records a schedule's base learning rate beside the first step's (a warm-up's start)", async () => {
    const root = fresh();
    const out = fresh();
    const t = trainer(out, { trackingDir: root }, { schedule: new LinearWarmup({ totalIters: 4, startFactor: 0.1 }) });
    await t.fit(loader(32, 3), { epochs: 1, maxSteps: 1 });
    await t.dispose();
    const runDir = join(root, '0', pointer(out).runId);
    const param = (key: string): string => readFileSync(join(runDir, 'params', key), 'utf8');
    expect(Number(param('optimizer.lr'))).toBeCloseTo(0.005, 12);
    expect(param('optimizer.initial_lr')).toBe('0.05');
    expect(param('schedule')).toBe('LinearWarmup');
  });

  it('marks a cancelled run KILLED and a failed one FAILED', async () => {
    const root = fresh();
    const out = fresh();
    const controller = new AbortController();
    const t = trainer(out, { trackingDir: root }, { callbacks: [{ onStepEnd: () => controller.abort() }] });
    await expect(t.fit(loader(64, 3), { epochs: 1, signal: controller.signal })).rejects.toMatchObject({
      name: 'AbortError',
    });
    expect(readMeta(root, '0', pointer(out).runId).status).toBe(5);
    const failing = trainer(
      fresh(),
      { trackingDir: root },
      {
        callbacks: [
          {
            onStepEnd: () => {
              throw new Error('boom');
            },
          },
        ],
      },
    );
    await expect(failing.fit(loader(64, 3), { epochs: 1 })).rejects.toThrow('boom');
    await failing.dispose();
    await t.dispose();
    const runs = runIds(join(root, '0'));
    expect(runs.map((r) => readMeta(root, '0', r).status).sort()).toEqual([4, 5]);
  });

  it('refuses mlflow without an output folder and malformed mlflow options', () => {
    const model = tinyNet(1);
    const optimizer = new SGD(model, { lr: 0.1 });
    expect(() => new Trainer({ model, optimizer, mlflow: true })).toThrow(/mlflow needs outDir/);
    expect(() => new Trainer({ model, optimizer, outDir: fresh(), mlflow: 'yes' as never })).toThrow(/mlflow/);
    expect(() => new Trainer({ model, optimizer, outDir: fresh(), mlflow: { experimentName: '' } })).toThrow(
      /mlflow.experimentName/,
    );
    expect(() => new Trainer({ model, optimizer, outDir: fresh(), mlflow: { uri: 'x' } as never })).toThrow(
      /Unknown option 'uri' in mlflow/,
    );
  });

  // MLflow's own reader, when a Python with mlflow is named (e.g. RESNET_MLFLOW_PYTHON=venv/bin/python).
  it.skipIf(!MLFLOW_PYTHON)(`MLflow's MlflowClient reads the run back${MLFLOW_SKIPPED}`, () => {
    expect(tracked.runId, 'the run of the first Trainer test').not.toBe('');
    const seen = readWithMlflowClient(tracked.root, tracked.runId);
    expect(seen.experiments).toEqual([
      ['0', 'Default'],
      ['1', 'tiny'],
    ]);
    expect(seen).toMatchObject({ experiment_id: '1', run_name: 'my-run', status: 'FINISHED' });
    expect(seen.params['optimizer.lr']).toBe('0.05');
    expect(seen.tags['mlflow.runName']).toBe('my-run');
    const runDir = join(tracked.root, '1', tracked.runId);
    const lines = metricLines(runDir, 'train/loss');
    expect(seen.history['train/loss']).toEqual(lines.map(([t, v, s]) => [s, v, t]));
    expect(seen.metrics['val/acc1']).toBe(metricLines(runDir, 'val/acc1').at(-1)?.[1]);
    expect(seen.artifacts.map((a) => a.path)).toEqual(expect.arrayContaining(['model.safetensors', 'curves-loss.png']));
  });
});
