/**
 * PyTorch's CPU training step as a peer of `npm run bench` (bench/torch_cpu_resnet50.py): finds a
 * Python with torch and torchvision, keeps one warmed-up process per variant (eager, compiled) and
 * times steps on request, so that the bench can alternate the peers' steps with its own on a noisy
 * machine. Every wait has a time limit.
 */
import { spawn, spawnSync, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/** The Python that runs the peer, or why there is none. */
export type TorchPython = { python: string; torch: string } | { reason: string };

/**
 * `RESNET_TORCH_PYTHON` when set, else `python3`, if it imports torch and torchvision; otherwise
 * the reason the PyTorch rows are skipped.
 */
export function findTorchPython(): TorchPython {
  const python = process.env.RESNET_TORCH_PYTHON ?? 'python3';
  const probe = spawnSync(python, ['-c', 'import torch, torchvision; print(torch.__version__)'], {
    encoding: 'utf8',
    timeout: 120_000,
  });
  if (probe.error) return { reason: `${python} did not start (${probe.error.message})` };
  if (probe.status !== 0) {
    const last = probe.stderr.trim().split('\n').pop() ?? '';
    return {
      reason: `${python} cannot import torch and torchvision (${last}); set RESNET_TORCH_PYTHON to a Python that can`,
    };
  }
  return { python, torch: probe.stdout.trim() };
}

/** One variant of PyTorch's step in a process of its own. */
export interface TorchPeer {
  /** "pytorch eager" or "pytorch compile". */
  readonly impl: string;
  /** Runs `steps` steps and resolves with their times in milliseconds. */
  run(steps: number): Promise<number[]>;
  /** Ends the process. */
  close(): void;
}

/** Options of {@link startTorchPeer}. */
export interface TorchPeerOptions {
  python: string;
  dtype: 'f32' | 'bf16';
  batch: number;
  size: number;
  compile: boolean;
  /** The limit on start-up (model build, compilation, warm-up steps). */
  startTimeoutMs: number;
  /** The limit on one step. */
  stepTimeoutMs: number;
}

const script = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'bench', 'torch_cpu_resnet50.py');

/** Starts the peer and resolves once its warm-up steps have run. */
export async function startTorchPeer(o: TorchPeerOptions): Promise<TorchPeer> {
  const argv = [script, '--dtype', o.dtype, '--batch', String(o.batch), '--size', String(o.size)];
  if (o.compile) argv.push('--compile');
  const child: ChildProcessWithoutNullStreams = spawn(o.python, argv, { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (chunk: Buffer) => {
    stderr = (stderr + chunk.toString()).slice(-4000);
  });
  const lines = createInterface({ input: child.stdout });
  const waiting: ((line: string | null) => void)[] = [];
  const queued: string[] = [];
  lines.on('line', (line) => {
    if (!/^(READY|RESULT|ERROR) /.test(line)) return;
    const next = waiting.shift();
    if (next) next(line);
    else queued.push(line);
  });
  child.on('close', () => {
    for (const w of waiting.splice(0)) w(null);
  });
  const label = `${o.compile ? 'pytorch compile' : 'pytorch eager'} ${o.dtype}`;
  const nextLine = (what: string, timeoutMs: number): Promise<{ kind: string; body: Record<string, unknown> }> =>
    new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        child.kill();
        reject(new Error(`${label}: no answer ${what} within ${timeoutMs / 1000} s; stderr: ${stderr.trim()}`));
      }, timeoutMs);
      const take = (line: string | null): void => {
        clearTimeout(timer);
        if (line === null) {
          reject(
            new Error(
              `${label}: the process ended ${what} (${child.signalCode ? `signal ${child.signalCode}` : `exit ${child.exitCode}`}); stderr: ${stderr.trim()}`,
            ),
          );
          return;
        }
        const space = line.indexOf(' ');
        resolve({ kind: line.slice(0, space), body: JSON.parse(line.slice(space + 1)) as Record<string, unknown> });
      };
      const ready = queued.shift();
      if (ready !== undefined) take(ready);
      else if (child.exitCode !== null) take(null);
      else waiting.push(take);
    });
  const ready = await nextLine('while starting', o.startTimeoutMs);
  if (ready.kind !== 'READY') {
    throw new Error(`${label}: expected READY, got ${ready.kind} ${JSON.stringify(ready.body)}`);
  }
  return {
    impl: String(ready.body.impl),
    async run(steps: number): Promise<number[]> {
      child.stdin.write(`run ${steps}\n`);
      const answer = await nextLine(`to 'run ${steps}'`, o.stepTimeoutMs * steps);
      if (answer.kind !== 'RESULT') throw new Error(`${label}: ${JSON.stringify(answer.body)}`);
      return answer.body.stepMs as number[];
    },
    close(): void {
      if (child.exitCode === null) {
        child.stdin.end('quit\n');
        setTimeout(() => child.kill(), 5000).unref();
      }
    },
  };
}
