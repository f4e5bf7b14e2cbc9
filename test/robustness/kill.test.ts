/**
 * Killing `resnet-cuda train`, run through the compiled entry point (`npm run build:ts` first) as
 * a child process on the built-in dataset: `kill -9` at seeded random moments leaves either
 * loadable checkpoints or none, and `--resume` then completes the run; SIGTERM, SIGHUP and SIGINT
 * stop it after the current step with a checkpoint and exit codes 143, 129 and 130; a second
 * signal while stopping quits at once. The seed of the moments is printed with every failure and
 * can be set with RESNET_KILL_SEED.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ResNet18, Trainer, loadCheckpoint } from '../../lib/index.js';
import { Rng } from '../reference/rng.js';

const entry = join(import.meta.dirname, '..', '..', 'dist', 'lib', 'cli', 'main.js');
const dir = mkdtempSync(join(tmpdir(), 'rc-kill-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const SEED = process.env.RESNET_KILL_SEED !== undefined ? Number(process.env.RESNET_KILL_SEED) : randomInt(2 ** 31);
const seedNote = `RESNET_KILL_SEED=${SEED}`;

/** A seeded uniform generator, so that a failing case replays. */
function random(seed: number): () => number {
  const rng = new Rng(seed);
  return () => rng.uniform();
}

/** A short run: ResNet-18 with the small stem on 16 px shapes, in the main thread, quiet. */
const RUN = ['-b', '4', '--train-crop-size', '16', '-j', '0', '--no-tensorboard', '--no-plots', '--quiet'];

interface Child {
  process: ChildProcess;
  output: () => { stdout: string; stderr: string };
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

function train(args: string[]): Child {
  const child = spawn(process.execPath, [entry, 'train', ...args], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((done) =>
    child.on('close', (code, signal) => done({ code, signal })),
  );
  return { process: child, output: () => ({ stdout, stderr }), exited };
}

const sleep = (ms: number) => new Promise((done) => setTimeout(done, ms));

/** Waits until `ready` holds (checked every 50 ms) or the child exits. */
async function until(child: Child, ready: () => boolean): Promise<void> {
  let exited = false;
  void child.exited.then(() => (exited = true));
  while (!ready() && !exited) await sleep(50);
}

/** Whether the run's log holds a training-loss record (a step has been taken). */
function stepTaken(out: string): boolean {
  const log = join(out, 'log.jsonl');
  return existsSync(log) && readFileSync(log, 'utf8').includes('"type":"train"');
}

/**
 * What a killed run leaves: every checkpoint file (not the partial `.tmp` ones) loads into the
 * model, and `latest.json`, when there, names one of them. Returns the latest step, or null when
 * there is no pointer.
 */
async function checkLeftovers(out: string): Promise<number | null> {
  const folder = join(out, 'checkpoints');
  const files = existsSync(folder) ? readdirSync(folder).filter((f) => f.endsWith('.safetensors')) : [];
  const anyNumber: unknown = expect.any(Number);
  for (const file of files) {
    const model = ResNet18({ numClasses: 4, smallInput: true });
    await expect(loadCheckpoint(join(folder, file), { model }), `${file} (${seedNote})`).resolves.toMatchObject({
      step: anyNumber,
    });
  }
  if (!existsSync(join(folder, 'latest.json'))) return null;
  const info = await Trainer.readCheckpointInfo(folder);
  expect(files, seedNote).toContain(info.file.slice(folder.length + 1));
  return info.step;
}

/** A run of `steps` steps into `out` with a checkpoint at every step: resumed, or fresh from seed 1. */
function shortRun(out: string, steps: number, resume: boolean): string[] {
  const start = resume ? ['--resume'] : ['--seed', '1'];
  return [
    ...start,
    '--max-steps',
    String(steps),
    '--checkpoint-every-steps',
    '1',
    '--keep-last',
    '1',
    '--output-dir',
    out,
    ...RUN,
  ];
}

describe('kill -9 during train, then --resume', () => {
  it('leaves a loadable checkpoint or nothing, and the resumed run completes', async () => {
    const out = join(dir, 'killed');
    const steps = 3;
    const next = random(SEED);
    let last: number | null = null;
    for (let trial = 0; trial < 3; trial++) {
      const child = train(shortRun(out, steps, last !== null));
      // Start-up takes a few seconds on two cores; the moments spread over start-up, steps and checkpoint writes.
      const moment = 1000 + Math.floor(next() * 9000);
      await Promise.race([sleep(moment), child.exited]);
      child.process.kill('SIGKILL');
      const ended = await child.exited;
      expect(
        ended.code === 0 || ended.signal === 'SIGKILL',
        `trial ${trial} at ${moment} ms: ${JSON.stringify(ended)} ${child.output().stderr} (${seedNote})`,
      ).toBe(true);
      last = await checkLeftovers(out);
    }
    const final = train(shortRun(out, steps, last !== null));
    const ended = await final.exited;
    expect(ended.code, `${final.output().stderr} (${seedNote})`).toBe(0);
    expect(final.output().stdout).toMatch(new RegExp(`^stopped after 0 epochs \\(${steps} steps\\)`));
    expect(await checkLeftovers(out)).toBe(steps);
  });
});

describe('signals', () => {
  for (const [signal, code] of [
    ['SIGTERM', 143],
    ['SIGHUP', 129],
  ] as const) {
    it(`${signal} stops after the current step, writes a checkpoint and exits with ${code}`, async () => {
      const out = join(dir, signal);
      const child = train(['--max-steps', '1000', '--print-freq', '1', '--seed', '1', '--output-dir', out, ...RUN]);
      await until(child, () => stepTaken(out));
      child.process.kill(signal);
      const ended = await child.exited;
      const { stdout, stderr } = child.output();
      expect(ended, stderr).toEqual({ code, signal: null });
      expect(stderr).toContain(`${signal}: stopping after this step and writing a checkpoint`);
      expect(stdout).toMatch(/^stopped after 0 epochs \(\d+ steps\)/);
      const step = await checkLeftovers(out);
      expect(step).toBeGreaterThanOrEqual(1);
      expect(stdout).toContain(`(${step} steps)`);
    });
  }

  it('a second signal while stopping quits at once, with the code of that signal', async () => {
    const out = join(dir, 'twice');
    const child = train(['--max-steps', '1000', '--print-freq', '1', '--seed', '1', '--output-dir', out, ...RUN]);
    await until(child, () => stepTaken(out));
    child.process.kill('SIGTERM');
    await until(child, () => child.output().stderr.includes('SIGTERM: stopping'));
    child.process.kill('SIGINT');
    const ended = await child.exited;
    expect(ended, child.output().stderr).toEqual({ code: 130, signal: null });
    // Whatever the moment, what is on disk loads (or there is nothing).
    await checkLeftovers(out);
  });
});
