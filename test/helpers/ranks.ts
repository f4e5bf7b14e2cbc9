/**
 * Runs a rank script (compiled under dist/test/distributed) as several processes on this machine,
 * with the environment torchrun gives its workers, and collects what each one did.
 * @packageDocumentation
 */
import { resolve } from 'node:path';
import { freePort, startRanks, type RankRun } from '../../bench/spawn-ranks.js';

export { freePort, type RankRun };

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
  const env = options.env;
  return await startRanks(script, options.args ?? [], {
    worldSize: options.worldSize ?? 2,
    threads: 1,
    timeoutMs: options.timeoutMs ?? 300_000,
    env: typeof env === 'function' ? env : () => env ?? {},
    ...(options.onSpawn ? { onSpawn: options.onSpawn } : {}),
  });
}
