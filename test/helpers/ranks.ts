/**
 * Runs a rank script (compiled under dist/test/distributed) as several processes on this machine,
 * with the environment torchrun gives its workers, and collects what each one did.
 * @packageDocumentation
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:net';
import { resolve } from 'node:path';

/** What one rank's process did. */
export interface RankRun {
  rank: number;
  /** Exit code, or null when a signal ended it. */
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Options of {@link runRanks}. */
export interface RunRanksOptions {
  /** Number of processes; default 2. */
  worldSize?: number;
  /** Arguments after the script. */
  args?: string[];
  /** Extra environment for every rank (or per rank). */
  env?: Record<string, string> | ((rank: number) => Record<string, string>);
  /** Kill every rank still running after this long; default 300 s. */
  timeoutMs?: number;
  /** Called with each rank's process once started (to signal it, for example). */
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

/** The compiled path of a rank script in test/distributed (run `npm run build:ts` first). */
export function rankScript(name: string): string {
  return resolve('dist/test/distributed', `${name}.js`);
}

/**
 * Starts `worldSize` processes of `script` with `MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`,
 * `LOCAL_RANK`, `LOCAL_WORLD_SIZE` and a fresh `RESNET_STORE_TOKEN`, one OpenMP thread each, and
 * waits for all of them.
 */
export async function runRanks(script: string, options: RunRanksOptions = {}): Promise<RankRun[]> {
  const worldSize = options.worldSize ?? 2;
  const port = await freePort();
  const token = randomBytes(16).toString('hex');
  const runs = Array.from({ length: worldSize }, (_, rank) => {
    const extra = typeof options.env === 'function' ? options.env(rank) : (options.env ?? {});
    const child = spawn(process.execPath, [script, ...(options.args ?? [])], {
      env: {
        ...process.env,
        OMP_NUM_THREADS: '1',
        MASTER_ADDR: '127.0.0.1',
        MASTER_PORT: String(port),
        RANK: String(rank),
        WORLD_SIZE: String(worldSize),
        LOCAL_RANK: String(rank),
        LOCAL_WORLD_SIZE: String(worldSize),
        RESNET_STORE_TOKEN: token,
        ...extra,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    if (child.pid !== undefined) options.onSpawn?.(rank, child.pid);
    const killer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 300_000);
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
