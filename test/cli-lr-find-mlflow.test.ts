/**
 * The command line of the learning-rate finder (`resnet-cuda lr-find`) and of MLflow tracking
 * (`train --mlflow`).
 */
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { LrFinderResult } from '../lib/train/lr-finder.js';
import { parseFlatYaml } from '../lib/train/outputs/mlflow.js';
import { runCli } from './helpers/cli.js';

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

describe('resnet-cuda train --mlflow', () => {
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
    const experiment = parseFlatYaml(readFileSync(join(root, '1', 'meta.yaml'), 'utf8'));
    expect(experiment.name).toBe('demo');
    const runs = readdirSync(join(root, '1')).filter((n) => /^[0-9a-f]{32}$/.test(n));
    expect(runs).toHaveLength(1);
    const runDir = join(root, '1', runs[0] ?? '');
    expect(parseFlatYaml(readFileSync(join(runDir, 'meta.yaml'), 'utf8'))).toMatchObject({
      status: 3,
      run_name: 'out',
    });
    expect(readFileSync(join(runDir, 'params', 'config.options.batchSize'), 'utf8')).toBe('4');
    expect(readFileSync(join(runDir, 'params', 'config.model'), 'utf8')).toBe('resnet18');
    expect(readFileSync(join(runDir, 'params', 'optimizer'), 'utf8')).toBe('SGD');
    expect(existsSync(join(runDir, 'artifacts', 'model.safetensors'))).toBe(true);
    expect(existsSync(join(runDir, 'artifacts', 'config.json'))).toBe(true);
    expect(JSON.parse(readFileSync(join(dir, 'out', 'mlflow-run.json'), 'utf8'))).toMatchObject({ runId: runs[0] });
  });
});
