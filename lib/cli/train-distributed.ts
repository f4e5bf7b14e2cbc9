/**
 * The data-parallel side of `resnet-cuda train`: joining the process group when started by a
 * launcher (torchrun's variables, `WORLD_SIZE` above 1), the device of this rank, the values every
 * rank must share (seed, output folder) taken from rank 0, and resuming after a restart of the
 * group (`RESNET_RESTART_COUNT` above 0).
 * @packageDocumentation
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { rendezvousFromEnv } from '../distributed/env.js';
import { initProcessGroup } from '../distributed/process-group.js';
import type { ProcessGroup } from '../distributed/types.js';
import { Tensor } from '../tensor.js';
import { UsageError, kebabCase, type CliIO, type ParsedCommand } from './options.js';

/** Where this process sits in a data-parallel run. */
export interface TrainRank {
  /** The group, or null for one process. */
  group: ProcessGroup | null;
  /** The device this rank trains on: `cuda:<LOCAL_RANK>` for `--device cuda`, else the one given. */
  device: string;
}

/** The world size the launcher set (`WORLD_SIZE`), 1 when there is none. */
export function launchedWorldSize(env: Readonly<Record<string, string | undefined>> = process.env): number {
  const text = env.WORLD_SIZE;
  if (text === undefined || text === '') return 1;
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) throw new UsageError(`WORLD_SIZE must be a positive integer, got '${text}'`);
  return n;
}

/**
 * Joins the process group when launched with more than one process: NCCL on a GPU (each local
 * rank on its own, `cuda:<LOCAL_RANK>`), Gloo on the CPU. One process gets no group.
 */
export function joinGroup(device: string, env: Readonly<Record<string, string | undefined>> = process.env): TrainRank {
  if (launchedWorldSize(env) === 1) return { group: null, device };
  const cuda = device.startsWith('cuda');
  if (cuda && device !== 'cuda') {
    throw new UsageError(
      `--device ${device}: with several processes each rank takes the GPU of its local rank; give --device cuda`,
    );
  }
  const where = rendezvousFromEnv(env);
  const rankDevice = cuda ? `cuda:${where.localRank}` : device;
  const group = initProcessGroup({
    backend: cuda ? 'nccl' : 'gloo',
    device: rankDevice,
    rank: where.rank,
    worldSize: where.worldSize,
    localRank: where.localRank,
    localWorldSize: where.localWorldSize,
    masterAddr: where.masterAddr,
    masterPort: where.masterPort,
    token: where.token,
  });
  return { group, device: rankDevice };
}

/** Longest text {@link shareText} carries, in UTF-8 bytes. */
const MAX_TEXT_BYTES = 4096;

/** Rank 0's `text` on every rank (one broadcast of a fixed-size buffer). */
export function shareText(group: ProcessGroup, text: string): string {
  const bytes = Buffer.from(text, 'utf8');
  if (bytes.length > MAX_TEXT_BYTES) {
    throw new UsageError(`'${text}' is longer than ${MAX_TEXT_BYTES} bytes, the most a rank can share`);
  }
  const packed = new Int32Array(MAX_TEXT_BYTES + 1);
  packed[0] = bytes.length;
  packed.set(bytes, 1);
  const t = Tensor.from(packed, [packed.length], { dtype: 'i32', device: group.device });
  try {
    group.broadcast(t, 0);
    group.synchronize();
    const got = t.toArray() as Int32Array;
    return Buffer.from(Uint8Array.from(got.subarray(1, 1 + got[0]!))).toString('utf8');
  } finally {
    t.dispose();
  }
}

/** Rank 0's seed and output folder on every rank (the data order and the files must be the same). */
export function shareRunSettings(
  group: ProcessGroup | null,
  settings: { seed: number; outDir: string },
): { seed: number; outDir: string } {
  if (group === null) return settings;
  const shared = JSON.parse(shareText(group, JSON.stringify(settings))) as { seed: number; outDir: string };
  return shared;
}

/**
 * After a restart of the group (`RESNET_RESTART_COUNT` above 0, set by `resnet-cuda launch
 * --max-restarts`), the run continues from the latest checkpoint of its output folder when there
 * is one: the `--resume` value to use, or undefined (a fresh start, for a group that failed before
 * its first checkpoint, or no restart at all).
 */
export function restartResume(
  a: { outputDir?: unknown; resume?: unknown },
  cwd: string,
  env: Readonly<Record<string, string | undefined>> = process.env,
): string | undefined {
  const resume = typeof a.resume === 'string' ? a.resume : undefined;
  if (!isRestart(env) || resume !== undefined || typeof a.outputDir !== 'string') return resume;
  const checkpoints = resolve(cwd, a.outputDir, 'checkpoints');
  return existsSync(join(checkpoints, 'latest.json')) ? checkpoints : undefined;
}

/** Whether this invocation is a restart of its group (`RESNET_RESTART_COUNT` above 0). */
export function isRestart(env: Readonly<Record<string, string | undefined>> = process.env): boolean {
  return Number(env.RESNET_RESTART_COUNT ?? '0') > 0;
}

/**
 * The command line that gives `parsed` again: its explicit options as `--name=value` (lists
 * comma-separated, flags bare), the config file, then the positionals; `drop` leaves options out.
 */
export function commandLine(parsed: ParsedCommand, drop: readonly string[]): string[] {
  const out: string[] = [];
  if (parsed.configFile !== undefined) out.push(`--config=${parsed.configFile}`);
  for (const key of parsed.explicit) {
    const value = parsed.values[key];
    if (drop.includes(key) || value === undefined || value === false) continue;
    const flag = `--${kebabCase(key)}`;
    out.push(value === true ? flag : `${flag}=${Array.isArray(value) ? value.join(',') : String(value)}`);
  }
  if (parsed.verbose) out.push('--verbose');
  return [...out, ...parsed.positionals];
}

/**
 * `train --nproc-per-node N`: runs the same command again as N processes under `resnet-cuda
 * launch --nproc-per-node N` (which sets torchrun's variables, supervises the ranks and prefixes
 * their lines), in the output folder resolved here so that every rank and every restart writes
 * to the same one. Resolves to the launcher's exit code.
 */
export async function relaunch(nproc: number, parsed: ParsedCommand, outDir: string, io: CliIO): Promise<number> {
  const cli = fileURLToPath(new URL('./main.js', import.meta.url));
  const train = [...commandLine(parsed, ['nprocPerNode', 'outputDir']), `--output-dir=${outDir}`];
  const argv = [cli, 'launch', `--nproc-per-node=${nproc}`, '--', process.execPath, cli, 'train', ...train];
  const child = spawn(process.execPath, argv, { cwd: io.cwd, env: { ...io.env }, stdio: ['inherit', 'pipe', 'pipe'] });
  child.stdout.on('data', (b: Buffer) => io.stdout.write(b.toString()));
  child.stderr.on('data', (b: Buffer) => io.stderr.write(b.toString()));
  // Ctrl-C reaches the launcher from the terminal (it forwards it to the ranks); kill's signals are passed on.
  const ignore = (): void => undefined;
  const forward = (signal: NodeJS.Signals): void => void child.kill(signal);
  process.on('SIGINT', ignore);
  process.on('SIGTERM', forward);
  process.on('SIGHUP', forward);
  try {
    return await new Promise<number>((done, fail) => {
      child.once('error', fail);
      child.once('close', (code, signal) => done(code ?? (signal ? 128 + (signalNumber(signal) ?? 0) : 1)));
    });
  } finally {
    process.off('SIGINT', ignore);
    process.off('SIGTERM', forward);
    process.off('SIGHUP', forward);
  }
}

function signalNumber(signal: NodeJS.Signals): number | undefined {
  return { SIGHUP: 1, SIGINT: 2, SIGKILL: 9, SIGTERM: 15 }[signal as string];
}
