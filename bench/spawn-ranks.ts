/**
 * Starts a worker script as several processes on this machine with the environment torchrun gives
 * its workers (MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, a store token) and
 * a number of OpenMP threads each. The data-parallel benchmark collects each rank's last stdout
 * line as JSON; the multi-process tests use the same spawner.
 * @packageDocumentation
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:net';

/** What one rank's process did. */
export interface RankRun {
  rank: number;
  /** Exit code, or null when a signal ended it. */
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** How {@link startRanks} runs the ranks. */
export interface StartRanksOptions {
  /** Number of processes. */
  worldSize: number;
  /** OpenMP threads per rank. */
  threads: number;
  /** Kill every rank still running after this long. */
  timeoutMs: number;
  /** Extra environment for each rank. */
  env?: (rank: number) => Record<string, string>;
  /** Called with each rank's process id once started. */
  onSpawn?: (rank: number, pid: number) => void;
}

/** A TCP port that was free a moment ago on 127.0.0.1. */
export async function freePort(): Promise<number> {
  return await new Promise((done, fail) => {
    const server = createServer();
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => done(port));
    });
  });
}

/** Runs `script` with `args` as `options.worldSize` processes of one job on 127.0.0.1 and waits for all. */
export async function startRanks(
  script: string,
  args: readonly string[],
  options: StartRanksOptions,
): Promise<RankRun[]> {
  const port = await freePort();
  const token = randomBytes(16).toString('hex');
  const runs = Array.from({ length: options.worldSize }, (_, rank) => {
    const child = spawn(process.execPath, [script, ...args], {
      env: {
        ...process.env,
        OMP_NUM_THREADS: String(options.threads),
        MASTER_ADDR: '127.0.0.1',
        MASTER_PORT: String(port),
        RANK: String(rank),
        WORLD_SIZE: String(options.worldSize),
        LOCAL_RANK: String(rank),
        LOCAL_WORLD_SIZE: String(options.worldSize),
        RESNET_STORE_TOKEN: token,
        ...options.env?.(rank),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    if (child.pid !== undefined) options.onSpawn?.(rank, child.pid);
    const killer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs);
    return new Promise<RankRun>((done) => {
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
      child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
      child.on('close', (code, signal) => {
        clearTimeout(killer);
        done({ rank, code, signal, stdout, stderr });
      });
    });
  });
  return await Promise.all(runs);
}

/**
 * Runs `script` with `args` as `worldSize` processes of `threads` OpenMP threads each, killing them
 * after `timeoutMs`; resolves to each rank's parsed last line of output, or rejects naming the rank
 * that failed, with its stderr.
 */
export async function spawnRanks(
  script: string,
  args: readonly string[],
  worldSize: number,
  threads: number,
  timeoutMs: number,
): Promise<unknown[]> {
  const runs = await startRanks(script, args, { worldSize, threads, timeoutMs });
  const failed = runs.find((r) => r.code !== 0);
  if (failed) {
    throw new Error(
      `bench rank ${failed.rank} of ${script} exited with ${failed.code ?? failed.signal ?? 'nothing'}: ${failed.stderr.trim()}`,
    );
  }
  return runs.map((r) => JSON.parse(r.stdout.trim().split('\n').pop() ?? '') as unknown);
}
