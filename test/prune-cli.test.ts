import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ResNet18, saveWeights } from '../lib/index.js';
import { pruneCommand, type PruneResult } from '../lib/cli/prune.js';
import { summaryCommand } from '../lib/cli/summary.js';
import { runCli } from './helpers/cli.js';

const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-prune-cli-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const weights = join(dir, 'model.safetensors');

beforeAll(async () => {
  using model = ResNet18({ numClasses: 4, smallInput: true, seed: 5 });
  await saveWeights(weights, model);
});

describe('resnet-cuda summary and prune', () => {
  it('summary prints the table with the published totals, and JSON', async () => {
    const text = await runCli(['summary', '--model', 'resnet50', '--depth', '1'], dir);
    expect(text.code).toBe(0);
    expect(text.stdout).toContain('Total params: 25,557,032');
    expect(text.stdout).toContain('Total mult-adds (G): 4.09');
    const json = await runCli(
      ['summary', '--weights', weights, '--input-size', '32', '-b', '8', '--amp', 'bf16', '--json'],
      dir,
    );
    expect(json.code).toBe(0);
    const s = JSON.parse(json.stdout) as { totalParams: number; inputShape: number[]; dtype: string };
    expect(s).toMatchObject({ totalParams: 11_170_884, inputShape: [8, 32, 32, 3], dtype: 'bf16' });
  });

  it('prunes channels into weights that summary, eval and train take, and prunes by magnitude', async () => {
    const out = join(dir, 'slim');
    const run = await runCli(
      [
        'prune',
        '--weights',
        weights,
        '--structured',
        '--amount',
        '0.5',
        '--input-size',
        '32',
        '--output-dir',
        out,
        '--eval',
        '-j',
        '0',
        '-b',
        '128',
        '--time-steps',
        '1',
        '--json',
      ],
      dir,
    );
    expect(run.code, run.stderr).toBe(0);
    const result = JSON.parse(run.stdout) as PruneResult;
    expect(result.method).toBe('channels');
    expect(result.blockWidths).toEqual([[32], [32], [64], [64], [128], [128], [256], [256]]);
    expect(result.after.params).toBeLessThan(result.before.params * 0.55);
    const recorded = JSON.parse(readFileSync(join(out, 'summary.json'), 'utf8')) as {
      config: { blockWidths: number[][] };
    };
    expect(recorded.config.blockWidths).toEqual(result.blockWidths);

    const slim = join(out, 'model.safetensors');
    const summary = await runCli(['summary', '--weights', slim, '--input-size', '32', '--json'], dir);
    expect(JSON.parse(summary.stdout) as { totalParams: number; macs: number }).toMatchObject({
      totalParams: result.after.params,
      macs: result.after.macs,
    });
    const evaluated = await runCli(['eval', '--weights', slim, '-j', '0', '-b', '128', '--quiet', '--json'], dir);
    expect(evaluated.code, evaluated.stderr).toBe(0);
    const slimEval = JSON.parse(evaluated.stdout) as { count: number; acc1: number; acc5: number; loss: number };
    expect(slimEval.count).toBe(512);
    // --eval's numbers are eval's, before (the original weights) and after (the pruned ones).
    const original = await runCli(['eval', '--weights', weights, '-j', '0', '-b', '128', '--quiet', '--json'], dir);
    const originalEval = JSON.parse(original.stdout) as typeof slimEval;
    const e = result.evaluation;
    expect(e).toMatchObject({ images: 512, batch: 128, crop: 32 });
    expect(e?.before).toMatchObject({ acc1: originalEval.acc1, acc5: originalEval.acc5, count: 512 });
    expect(e?.after).toMatchObject({ acc1: slimEval.acc1, acc5: slimEval.acc5, count: 512 });
    expect(e?.before.loss).toBeCloseTo(originalEval.loss, 6);
    expect(e?.after.loss).toBeCloseTo(slimEval.loss, 6);
    for (const m of [e?.before, e?.after]) {
      expect(m?.forwardMs).toBeGreaterThan(0);
      expect(m?.imagesPerSecond).toBeCloseTo((128 * 1000) / (m?.forwardMs ?? 1), 6);
    }

    const trained = await runCli(
      [
        'train',
        '--weights',
        slim,
        '--model',
        'resnet18',
        '--epochs',
        '1',
        '--max-steps',
        '2',
        '-b',
        '8',
        '-j',
        '0',
        '--output-dir',
        join(dir, 'fine-tune'),
        '--no-plots',
        '--no-tensorboard',
        '--quiet',
      ],
      dir,
    );
    expect(trained.code, trained.stderr).toBe(0);
    const info = JSON.parse(readFileSync(join(dir, 'fine-tune', 'config.json'), 'utf8')) as Record<string, unknown>;
    expect(info.model).toBe('resnet18');

    const sparse = await runCli(
      [
        'prune',
        '--weights',
        slim,
        '--amount',
        '0.7',
        '--exclude',
        'fc.weight',
        '--output-dir',
        join(dir, 'sparse'),
        '--json',
      ],
      dir,
    );
    expect(sparse.code, sparse.stderr).toBe(0);
    const s = JSON.parse(sparse.stdout) as PruneResult;
    expect(s.after.params).toBe(result.after.params);
    expect(s.after.nonzeroParams).toBeLessThan(s.before.nonzeroParams * 0.35);
  });

  it('--help lists every option with its default', async () => {
    for (const command of [summaryCommand, pruneCommand]) {
      const run = await runCli([command.spec.name, '--help'], dir);
      expect(run.code).toBe(0);
      const text = run.stdout.replace(/\s+/g, ' ');
      for (const option of command.spec.options) {
        expect(text, `--${option.name}`).toContain(`--${option.name}`);
        const shown = option.defaultText ?? (option.default === undefined ? undefined : String(option.default));
        if (shown !== undefined && option.default !== false) expect(text).toContain(`(default: ${shown}`);
      }
    }
  });

  it('refuses bad options with a usage error naming them', async () => {
    const cases: [string[], RegExp][] = [
      [['prune', '--weights', weights, '--output-dir', join(dir, 'x')], /--amount/],
      [['prune', '--weights', weights, '--amount', '0.5'], /--output-dir/],
      [['prune', '--amount', '0.5', '--output-dir', join(dir, 'x')], /--weights/],
      [['prune', '--weights', weights, '--structured', '--amount', '1', '--output-dir', join(dir, 'x')], /below 1/],
      [
        ['prune', '--weights', weights, '--amount', '0.5', '--criterion', 'bn-scale', '--output-dir', join(dir, 'x')],
        /--criterion/,
      ],
      [['summary', '--input-size', '4'], /--input-size/],
      [['summary', '--weights', weights, '--stem', 'small'], /--stem/],
      [['train', '--prune-every', '3', '--dry-run', '1'], /--prune-sparsity/],
      [
        ['prune', '--weights', weights, '--amount', '0.5', '--time-steps', '3', '--output-dir', join(dir, 'x')],
        /--eval/,
      ],
      [['prune', 'data', '--weights', weights, '--amount', '0.5', '--output-dir', join(dir, 'x')], /--eval/],
    ];
    for (const [args, pattern] of cases) {
      const r = await runCli(args, dir);
      expect(r.code, args.join(' ')).toBe(2);
      expect(r.stderr).toMatch(pattern);
    }
  });
});
