/**
 * The command line of the learning-rate finder (`resnet-cuda lr-find`) and of MLflow tracking
 * (`train --mlflow`), the latter read back by MLflow's own client when `RESNET_MLFLOW_PYTHON` names
 * a Python with `mlflow` installed.
 */
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { LrFinderResult } from '../lib/train/lr-finder.js';
import { runCli } from './helpers/cli.js';
import {
  MLFLOW_PYTHON,
  MLFLOW_SKIPPED,
  metricLines,
  readMeta,
  readWithMlflowClient,
  runIds,
} from './helpers/mlflow-store.js';

const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-cli-lrf-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Runs small enough for the CPU: ResNet-18, 16 px. */
const SMALL = ['--train-crop-size', '16', '-j', '0', '--seed', '1'];

describe('resnet-cuda lr-find', () => {
  it('sweeps on the built-in dataset, prints the suggestion and writes the plot and the data', async () => {
    const run = await runCli(
      [
        'lr-find',
        ...SMALL,
        '-b',
        '8',
        '--num-iter',
        '20',
        '--start-lr',
        '1e-4',
        '--end-lr',
        '1',
        '--output-dir',
        'lrf',
        '-q',
      ],
      dir,
    );
    expect(run.code, run.stderr).toBe(0);
    const data = JSON.parse(readFileSync(join(dir, 'lrf', 'lr-find.json'), 'utf8')) as LrFinderResult;
    expect(data.lrs[0]).toBeCloseTo(1e-4, 18);
    expect(data.settings).toMatchObject({ startLr: 1e-4, endLr: 1, numIter: 20, mode: 'exp', beta: 0.98 });
    const suggestion = data.suggestion?.lr;
    expect(suggestion).toBeDefined();
    const printed =
      /^suggested learning rate: (\S+) \(steepest descent of the smoothed loss against log\(lr\)\)$/m.exec(run.stdout);
    expect(Number(printed?.[1]) / Number(suggestion)).toBeCloseTo(1, 2);
    expect(run.stdout).toMatch(/minimum\/10 rule: \S+ \(lowest smoothed loss in the same window \d\.\d{4} at lr \S+\)/);
    expect(run.stdout).toMatch(/wrote lrf\/lr-find\.png and lrf\/lr-find\.json\n$/);
    expect(
      readFileSync(join(dir, 'lrf', 'lr-find.png'))
        .subarray(1, 4)
        .toString(),
    ).toBe('PNG');
  });

  it('prints JSON with --json', async () => {
    const run = await runCli(
      ['lr-find', ...SMALL, '-b', '4', '--num-iter', '3', '--opt', 'adamw', '--output-dir', 'lrf-json', '--json'],
      dir,
    );
    expect(run.code, run.stderr).toBe(0);
    const out = JSON.parse(run.stdout) as {
      steps: number;
      suggestion: null;
      png: string;
      settings: { numIter: number };
    };
    // Three steps leave nothing once the first 10 and the last 5 are left out.
    expect(out).toMatchObject({ steps: 3, suggestion: null, png: join(dir, 'lrf-json', 'lr-find.png') });
    expect(run.stderr).toBe('');
  });

  const usage: [string[], RegExp][] = [
    [['lr-find', '--start-lr', '1', '--end-lr', '0.5'], /--end-lr 0.5 must be above --start-lr 1/],
    [['lr-find', '--num-iter', '1'], /--num-iter expects an integer of at least 2, got 1/],
    [['lr-find', '--step-mode', 'log'], /--step-mode expects one of exp, linear, got 'log'/],
    [['lr-find', '--momentum', '0.5', '--opt', 'lamb'], /--momentum applies to --opt sgd and sgd-nesterov, not lamb/],
    [['lr-find', '--amp', 'fp16'], /--amp fp16 needs a CUDA device/],
    [['lr-find', '--diverge-threshold', '1'], /--diverge-threshold expects a number above 1/],
    [['train', '--mlflow-experiment', 'x'], /--mlflow-experiment needs --mlflow/],
  ];
  for (const [args, message] of usage) {
    it(args.join(' '), async () => {
      const run = await runCli(args, dir);
      expect(run.code).toBe(2);
      expect(run.stderr).toMatch(message);
    });
  }
});

/** Every file under `root` (recursively), by its path relative to `root` with '/' separators. */
function filesUnder(root: string): string[] {
  return readdirSync(root, { recursive: true, encoding: 'utf8' })
    .filter((name) => statSync(join(root, name)).isFile())
    .map((name) => relative(root, join(root, name)).split('\\').join('/'))
    .sort();
}

describe('resnet-cuda train --mlflow', () => {
  /** The store and the run the first test wrote, for MLflow's reader. */
  const tracked = { root: '', runId: '' };

  it('tracks the run in ./mlruns (the flag alone) under the experiment named', async () => {
    const run = await runCli(
      [
        'train',
        ...SMALL,
        '-b',
        '4',
        '--max-steps',
        '2',
        '--output-dir',
        'out',
        '--no-tensorboard',
        '--mlflow-experiment',
        'demo',
        '--mlflow',
      ],
      dir,
    );
    expect(run.code, run.stderr).toBe(0);
    const root = join(dir, 'mlruns');
    const experiment = readMeta(root, '1');
    expect(experiment.name).toBe('demo');
    const runs = runIds(join(root, '1'));
    expect(runs).toHaveLength(1);
    const runDir = join(root, '1', runs[0] ?? '');
    expect(readMeta(runDir)).toMatchObject({
      status: 3,
      run_name: 'out',
    });
    expect(readFileSync(join(runDir, 'params', 'config.options.batchSize'), 'utf8')).toBe('4');
    expect(readFileSync(join(runDir, 'params', 'config.model'), 'utf8')).toBe('resnet18');
    expect(readFileSync(join(runDir, 'params', 'optimizer'), 'utf8')).toBe('SGD');
    expect(existsSync(join(runDir, 'artifacts', 'model.safetensors'))).toBe(true);
    expect(existsSync(join(runDir, 'artifacts', 'config.json'))).toBe(true);
    expect(JSON.parse(readFileSync(join(dir, 'out', 'mlflow-run.json'), 'utf8'))).toMatchObject({ runId: runs[0] });
    tracked.root = root;
    tracked.runId = runs[0] ?? '';
  });

  // MLflow's own reader, when a Python with mlflow is named (e.g. RESNET_MLFLOW_PYTHON=venv/bin/python).
  it.skipIf(!MLFLOW_PYTHON)(
    `MlflowClient reads the command's run: every parameter, each metric's whole history, every artifact${MLFLOW_SKIPPED}`,
    () => {
      expect(tracked.runId, 'the run of the previous test').not.toBe('');
      const seen = readWithMlflowClient(tracked.root, tracked.runId);
      expect(seen.experiments).toEqual([
        ['0', 'Default'],
        ['1', 'demo'],
      ]);
      expect(seen).toMatchObject({ experiment_id: '1', run_name: 'out', status: 'FINISHED' });
      const runDir = join(tracked.root, '1', tracked.runId);
      // Parameters: the files the command wrote, each one, with its value.
      const params = filesUnder(join(runDir, 'params'));
      expect(params.length).toBeGreaterThan(20);
      expect(seen.params).toEqual(
        Object.fromEntries(params.map((key) => [key, readFileSync(join(runDir, 'params', key), 'utf8')])),
      );
      // Metrics: each file's `timestamp value step` lines are MLflow's history of that key.
      const metrics = filesUnder(join(runDir, 'metrics'));
      expect(metrics).toEqual(expect.arrayContaining(['train/loss', 'train/lr']));
      expect(Object.keys(seen.history).sort()).toEqual(metrics);
      for (const key of metrics) {
        expect(seen.history[key], key).toEqual(metricLines(runDir, key).map(([t, v, s]) => [s, v, t]));
      }
      // Artifacts: the weights and the run's records, with their sizes.
      const artifacts = filesUnder(join(runDir, 'artifacts'));
      expect(artifacts).toEqual(expect.arrayContaining(['model.safetensors', 'config.json', 'summary.json']));
      expect(seen.artifacts.map((a) => a.path).sort()).toEqual(artifacts);
      for (const a of seen.artifacts) expect(a.size, a.path).toBe(statSync(join(runDir, 'artifacts', a.path)).size);
    },
  );
});
