// End to end: the Trainer with a Gloo process group of two processes over loopback (rank script
// test/distributed/train-ranks.ts; `npm run build:ts` first) against one process with the whole
// batch, on a tiny ResNet with SyncBatchNorm (test/distributed/train-setup.ts).
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { SGD, loadCheckpoint } from '../lib/index.js';
import { Trainer } from '../lib/train/trainer.js';
import { runSpec, tinyResNet, type RunReport, type RunSpec } from './distributed/train-setup.js';
import { defined } from './helpers/defined.js';
import { rankScript, runRanks, type RankRun } from './helpers/ranks.js';

const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-distributed-train-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/**
 * f32 tolerance: the two runs add the same numbers in another order (each rank's half batch, then
 * the all-reduce; SyncBatchNorm merges the ranks' statistics in double), so they differ by rounding
 * only; relative to 1 + |value|. Measured over 20 steps: step losses within 8e-8, weights and
 * running statistics within 8e-7.
 */
const LOSS_TOLERANCE = 1e-6;
const WEIGHT_TOLERANCE = 1e-5;

/** 40 training samples, 4 per rank (8 per step in all): 5 steps an epoch, 20 in 4 epochs; 13 validation samples. */
function spec(name: string, extra: Partial<RunSpec> = {}): RunSpec {
  const outDir = join(dir, name);
  mkdirSync(outDir, { recursive: true });
  return { batch: 4, accumulate: 1, trainLength: 40, valLength: 13, epochs: 4, outDir, timeoutSeconds: 60, ...extra };
}

function failures(runs: RankRun[]): string {
  return runs.map((r) => `rank ${r.rank}: code ${r.code} signal ${r.signal}\n${r.stderr}`).join('\n');
}

/** Runs `s` on two ranks and returns their reports. */
async function onRanks(s: RunSpec): Promise<RunReport[]> {
  const runs = await runRanks(rankScript('train-ranks'), { args: [JSON.stringify(s)], timeoutMs: 600_000 });
  expect(
    runs.every((r) => r.code === 0),
    failures(runs),
  ).toBe(true);
  return runs.map((r) => {
    const report = JSON.parse(readFileSync(join(s.outDir, `report-${r.rank}.json`), 'utf8')) as RunReport;
    // JSON writes the NaN loss of a step with an inf as null.
    return { ...report, losses: report.losses.map((v: number | null) => v ?? NaN) };
  });
}

/** The one-process run of `s` with the whole batch, in its own folder. */
async function reference(s: RunSpec): Promise<RunReport> {
  const outDir = `${s.outDir}-reference`;
  mkdirSync(outDir, { recursive: true });
  return runSpec({ ...s, outDir }, null, 2);
}

function close(a: number, b: number, tolerance: number): boolean {
  if (Number.isNaN(a) || Number.isNaN(b)) return Number.isNaN(a) && Number.isNaN(b);
  return Math.abs(a - b) <= tolerance * (1 + Math.abs(b));
}

/** The largest difference between two state dicts, relative to 1 + |value|. */
function stateDifference(a: RunReport['state'], b: RunReport['state']): number {
  expect(Object.keys(a).sort()).toEqual(Object.keys(b).sort());
  let worst = 0;
  for (const [name, values] of Object.entries(b)) {
    const other = a[name]!;
    expect(other.length, name).toBe(values.length);
    values.forEach((v, i) => (worst = Math.max(worst, Math.abs(other[i]! - v) / (1 + Math.abs(v)))));
  }
  return worst;
}

/** Two ranks' reports against the reference: the mean of the ranks' step losses, the weights. */
function expectSameRun(ranks: RunReport[], ref: RunReport): void {
  const [r0, r1] = ranks as [RunReport, RunReport];
  expect(r0.losses.length).toBe(ref.losses.length);
  ref.losses.forEach((loss, i) => {
    const mean = (r0.losses[i]! + r1.losses[i]!) / 2;
    expect(close(mean, loss, LOSS_TOLERANCE), `step ${i + 1}: ranks ${mean}, one process ${loss}`).toBe(true);
  });
  // Both ranks step with the same averaged gradients and SyncBatchNorm statistics: identical weights.
  expect(stateDifference(r1.state, r0.state)).toBe(0);
  expect(stateDifference(r0.state, ref.state)).toBeLessThanOrEqual(WEIGHT_TOLERANCE);
}

describe('data-parallel Trainer, 2 processes over Gloo', () => {
  it('2 ranks x batch 4 train as 1 process x batch 8 over 20 steps, and the uneven validation set counts each sample once', async () => {
    const s = spec('plain');
    const [ranks, ref] = [await onRanks(s), await reference(s)];
    expect(ref.losses.length).toBe(20);
    expectSameRun(ranks, ref);
    // 13 samples over 2 ranks: 7 and 6 of their own, the padding (a repeat) not counted.
    const whole = defined(ref.eval, 'the reference evaluation');
    expect(whole.count).toBe(13);
    for (const r of ranks) {
      const e = defined(r.eval, 'a rank evaluation');
      expect(e.count).toBe(13);
      expect(e.confusion).toEqual(whole.confusion);
      expect(e.acc1).toBe(whole.acc1);
      expect(close(e.loss, whole.loss, LOSS_TOLERANCE), `${e.loss} against ${whole.loss}`).toBe(true);
    }
    // Rank 0 alone writes the outputs.
    expect(existsSync(join(s.outDir, 'model.safetensors'))).toBe(true);
    expect(existsSync(join(s.outDir, 'checkpoints', 'latest.json'))).toBe(true);
  });

  it('with accumulation: 2 ranks x 2 micro-batches of 2 train as 1 process x 2 micro-batches of 4', async () => {
    const s = spec('accumulate', { batch: 2, accumulate: 2 });
    const [ranks, ref] = [await onRanks(s), await reference(s)];
    expect(ref.losses.length).toBe(20);
    expectSameRun(ranks, ref);
  });

  it('an inf on one rank makes every rank skip that step, as one process skips it', async () => {
    const s = spec('scaler', { lossScale: 1024, infStep: 3, infRank: 1 });
    const [ranks, ref] = [await onRanks(s), await reference(s)];
    expectSameRun(ranks, ref);
    // The scale halves at step 3 on both ranks (the step was skipped), as in the reference.
    const halved = Array.from({ length: 20 }, (_, i) => (i < 2 ? 1024 : 512));
    expect(ref.scales).toEqual(halved);
    for (const r of ranks) expect(r.scales).toEqual(halved);
  });

  it('resumes exactly with the same world size, and refuses another', async () => {
    const first = spec('resume', { maxSteps: 8 });
    const before = await onRanks(first);
    expect(before[0]!.losses.length).toBe(8);
    const after = await onRanks({ ...first, maxSteps: undefined, resume: true });
    expect(after[0]!.losses.length).toBe(12);
    const ref = await reference(spec('resume-whole'));
    const joined = before.map((b, r) => ({ ...after[r]!, losses: [...b.losses, ...after[r]!.losses] }));
    expectSameRun(joined, ref);
    // One process cannot continue a two-rank run exactly.
    await expect(reference({ ...first, resume: first.outDir })).rejects.toThrow(/world size 2 .*this one has 1/);
  });

  it('a rank killed mid-training makes the other exit non-zero naming it, and the latest checkpoint stays loadable', async () => {
    const s = spec('kill', { epochs: 1000, checkpointEverySteps: 2, timeoutSeconds: 10 });
    const pids: number[] = [];
    const latest = join(s.outDir, 'checkpoints', 'latest.json');
    let killedAt = 0;
    const running = runRanks(rankScript('train-ranks'), {
      args: [JSON.stringify(s)],
      timeoutMs: 300_000,
      onSpawn: (rank, pid) => (pids[rank] = pid),
    });
    const killer = (async () => {
      const deadline = Date.now() + 240_000;
      while (!existsSync(latest) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      await new Promise((r) => setTimeout(r, 300));
      killedAt = Date.now();
      process.kill(pids[1]!, 'SIGKILL');
    })();
    const [runs] = await Promise.all([running, killer]);
    const exited = Date.now() - killedAt;
    const [r0, r1] = runs as [RankRun, RankRun];
    expect(r1.signal).toBe('SIGKILL');
    expect(r0.code, r0.stderr).not.toBe(0);
    expect(r0.stderr).toMatch(/rank 1 is gone/);
    // Within the group's timeout (10 s), with room for a busy machine.
    expect(exited).toBeLessThan(30_000);
    const { model } = tinyResNet(1);
    const optimizer = new SGD(model, { lr: 0.05, momentum: 0.9 });
    const info = await Trainer.readCheckpointInfo(s.outDir);
    expect(info.run?.data.worldSize).toBe(2);
    const progress = await loadCheckpoint(info.file, { model, optimizer });
    expect(progress.step).toBeGreaterThanOrEqual(2);
  });

  it('train --nproc-per-node 2 runs two ranks under the launcher; rank 0 reports and writes', () => {
    const out = join(dir, 'cli');
    const cli = spawnSync(
      process.execPath,
      [
        resolve('dist/lib/cli/main.js'),
        'train',
        '--nproc-per-node',
        '2',
        '--dataset',
        'synthetic',
        '--num-classes',
        '4',
        '--train-crop-size',
        '16',
        '-b',
        '2',
        '--epochs',
        '1',
        '--max-steps',
        '3',
        '--workers',
        '0',
        '--sync-bn',
        '--output-dir',
        out,
      ],
      { encoding: 'utf8', env: { ...process.env, OMP_NUM_THREADS: '1' }, timeout: 600_000 },
    );
    expect(cli.status, cli.stderr).toBe(0);
    expect(cli.stderr).toMatch(
      /\[rank 0\] .*2 processes \(gloo\), cpu, batch 2 per process \(4 per step in all\), SyncBatchNorm/,
    );
    expect(cli.stdout).toMatch(/\[rank 0\] stopped after 0 epochs \(3 steps\)/);
    expect(cli.stdout).not.toMatch(/\[rank 1\] stopped/);
    expect(existsSync(join(out, 'config.json'))).toBe(true);
    const latest = JSON.parse(readFileSync(join(out, 'checkpoints', 'latest.json'), 'utf8')) as { step: number };
    expect(latest.step).toBe(3);
  });

  it('train started again by the launcher after a failure (RESNET_RESTART_COUNT 1) resumes from the latest checkpoint', async () => {
    const out = join(dir, 'restart');
    const args = (maxSteps: number): string[] => [
      'train',
      '--dataset',
      'synthetic',
      '--num-classes',
      '4',
      '--train-crop-size',
      '16',
      '-b',
      '2',
      '--epochs',
      '1',
      '--max-steps',
      String(maxSteps),
      '--workers',
      '0',
      '--output-dir',
      out,
    ];
    const cli = resolve('dist/lib/cli/main.js');
    const first = await runRanks(cli, { args: args(2), timeoutMs: 300_000 });
    expect(
      first.every((r) => r.code === 0),
      failures(first),
    ).toBe(true);
    // The same command again would refuse the folder that holds a run; a restart continues it.
    const again = await runRanks(cli, { args: args(4), timeoutMs: 300_000, env: { RESNET_RESTART_COUNT: '1' } });
    expect(
      again.every((r) => r.code === 0),
      failures(again),
    ).toBe(true);
    expect(again[0]!.stderr).toMatch(/resumed from .*step-00000002\.safetensors at epoch 1, step 2/);
    const latest = JSON.parse(readFileSync(join(out, 'checkpoints', 'latest.json'), 'utf8')) as { step: number };
    expect(latest.step).toBe(4);
  });
});
