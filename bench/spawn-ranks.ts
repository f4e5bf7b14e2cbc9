/**
 * Starts a benchmark worker as several processes on this machine with the environment torchrun
 * gives its workers (MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, a store
 * token) and a number of OpenMP threads each, and collects each one's last stdout line as JSON.
 * @packageDocumentation
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:net';

/** A TCP port that was free a moment ago on 127.0.0.1. */
async function freePort(): Promise<number> {
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
  const port = await freePort();
  const token = randomBytes(16).toString('hex');
  const runs = Array.from({ length: worldSize }, (_, rank) => {
    const child = spawn(process.execPath, [script, ...args], {
      env: {
        ...process.env,
        OMP_NUM_THREADS: String(threads),
        MASTER_ADDR: '127.0.0.1',
        MASTER_PORT: String(port),
        RANK: String(rank),
        WORLD_SIZE: String(worldSize),
        LOCAL_RANK: String(rank),
        LOCAL_WORLD_SIZE: String(worldSize),
        RESNET_STORE_TOKEN: token,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const killer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    return new Promise<unknown>((done, fail) => {
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
      child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
      child.on('close', (code, signal) => {
        clearTimeout(killer);
        const last = stdout.trim().split('\n').pop() ?? '';
        if (code !== 0) {
          fail(
            new Error(`bench rank ${rank} of ${script} exited with ${code ?? signal ?? 'nothing'}: ${stderr.trim()}`),
          );
        } else {
          done(JSON.parse(last) as unknown);
        }
      });
    });
  });
  return await Promise.all(runs);
}
