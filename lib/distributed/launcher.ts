/**
 * Starts and supervises the local ranks of a data-parallel job, as torchrun does: one process per
 * rank with torchrun's environment variables, each bound to its GPU or to a share of the CPU
 * cores, every output line prefixed with its rank. When a rank exits with an error or is killed,
 * the others are stopped (SIGTERM, then SIGKILL after a grace period) and the whole local group is
 * restarted, up to a number of times, with a fixed world size, or the launch fails naming the rank.
 * Signals to the launcher (SIGINT, SIGTERM, SIGHUP) are forwarded to every rank.
 *
 * Each rank runs in a process group of its own, so that Ctrl-C in a terminal reaches the ranks only
 * through the launcher (once), and stopping a rank stops the processes it started too.
 * @packageDocumentation
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { constants } from 'node:os';
import { cpuBinding, cpuShares, formatCpuList } from './cpu-binding.js';
import { LinePrefixer } from './line-prefixer.js';

/** How the launcher binds each local rank to hardware. */
export type RankBinding = 'gpu' | 'cpu' | 'none';

/** Where the launcher writes: the ranks' prefixed lines and its own messages. */
export interface LaunchStream {
  write(text: string): unknown;
}

/** What {@link launchRanks} starts and how it supervises it. */
export interface LaunchOptions {
  /** The program to run for each rank (looked up on `env.PATH` when it has no slash). */
  command: string;
  /** Its arguments. */
  args: readonly string[];
  /** Ranks on this node (`LOCAL_WORLD_SIZE`). */
  nprocPerNode: number;
  /** Nodes in the job; the world is `nnodes * nprocPerNode`. */
  nnodes: number;
  /** This node's number, 0 to `nnodes - 1`; its ranks are `nodeRank * nprocPerNode + localRank`. */
  nodeRank: number;
  /** Host of the store, served by global rank 0 (`MASTER_ADDR`). */
  masterAddr: string;
  /** Its port (`MASTER_PORT`). */
  masterPort: number;
  /** The job's store token (`RESNET_STORE_TOKEN`), the same on every node. */
  token: string;
  /** How many times the local group may be restarted after a failure. */
  maxRestarts: number;
  /** Seconds between two looks at the ranks' states (torchrun's `--monitor-interval`). */
  monitorIntervalSeconds: number;
  /** Seconds a rank has after SIGTERM before it gets SIGKILL. */
  gracePeriodSeconds: number;
  /**
   * `gpu`: a rank uses CUDA device `LOCAL_RANK` (every GPU stays visible) and its share of the
   * cores' OpenMP threads; `cpu`: a disjoint share of the cores, pinned; `none`: neither.
   */
  binding: RankBinding;
  /** The cores to share between the local ranks (for `cpu` and `gpu`). */
  cpus: readonly number[];
  /** The path of `taskset`, which pins ranks with `cpu` binding; OpenMP places without it. */
  taskset: string | undefined;
  /** The environment every rank starts from. */
  env: Readonly<Record<string, string | undefined>>;
  /** Working folder of the ranks. */
  cwd: string;
  /** Receives the ranks' standard output lines, prefixed `[rank N] `. */
  stdout: LaunchStream;
  /** Receives their standard error lines, prefixed the same, and the launcher's own messages. */
  stderr: LaunchStream;
  /** Forward SIGINT, SIGTERM and SIGHUP received by this process to the ranks; default true. */
  forwardSignals?: boolean;
}

/** How one rank ended. */
export interface RankExit {
  /** Global rank. */
  rank: number;
  localRank: number;
  /** Exit code, or null when a signal ended it or it could not start. */
  code: number | null;
  /** The signal that ended it, if one did. */
  signal: NodeJS.Signals | null;
  /** Why it could not start (the program was not found, for example). */
  error?: string;
}

/** How {@link launchRanks} ended. */
export interface LaunchResult {
  /** `succeeded`: every rank exited 0; `failed`: a rank failed after the last restart; `interrupted`: a signal stopped the launch. */
  status: 'succeeded' | 'failed' | 'interrupted';
  /** How many times the group was restarted. */
  restarts: number;
  /** The first rank that failed in the last attempt (`failed`). */
  failure?: RankExit;
  /** The signal that interrupted the launch (`interrupted`). */
  signal?: NodeJS.Signals;
}

/** The signals forwarded to the ranks. */
const FORWARDED: readonly NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];

/** `rank 3 exited with code 1`, `rank 3 was killed by SIGKILL`, `rank 3 could not start: ...`. */
export function describeExit(exit: RankExit): string {
  const who = `rank ${exit.rank} (local rank ${exit.localRank})`;
  if (exit.error !== undefined) return `${who} could not start: ${exit.error}`;
  if (exit.signal !== null) return `${who} was killed by ${exit.signal}`;
  return `${who} exited with code ${exit.code}`;
}

/**
 * The variables a local rank gets: torchrun's (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
 * `LOCAL_WORLD_SIZE`, `GROUP_RANK` (the node), `GROUP_WORLD_SIZE`, `MASTER_ADDR`,
 * `MASTER_PORT`), the store token `RESNET_STORE_TOKEN`, and `RESNET_RESTART_COUNT` /
 * `RESNET_MAX_RESTARTS` (torchrun's `TORCHELASTIC_RESTART_COUNT` / `_MAX_RESTARTS`).
 */
export function rankEnvironment(options: LaunchOptions, localRank: number, restart: number): Record<string, string> {
  return {
    RANK: String(options.nodeRank * options.nprocPerNode + localRank),
    WORLD_SIZE: String(options.nnodes * options.nprocPerNode),
    LOCAL_RANK: String(localRank),
    LOCAL_WORLD_SIZE: String(options.nprocPerNode),
    GROUP_RANK: String(options.nodeRank),
    GROUP_WORLD_SIZE: String(options.nnodes),
    MASTER_ADDR: options.masterAddr,
    MASTER_PORT: String(options.masterPort),
    RESNET_STORE_TOKEN: options.token,
    RESNET_RESTART_COUNT: String(restart),
    RESNET_MAX_RESTARTS: String(options.maxRestarts),
  };
}

/** The command line and environment of a local rank, its binding applied. */
function rankProcess(
  options: LaunchOptions,
  localRank: number,
  restart: number,
  share: readonly number[],
): { file: string; args: string[]; env: Record<string, string | undefined> } {
  const env: Record<string, string | undefined> = { ...options.env, ...rankEnvironment(options, localRank, restart) };
  const keepThreads = options.env.OMP_NUM_THREADS !== undefined && options.env.OMP_NUM_THREADS !== '';
  if (options.binding === 'cpu') {
    const binding = cpuBinding(share, options.taskset, keepThreads);
    Object.assign(env, binding.env);
    const [file, ...wrapper] = binding.wrapper;
    if (file !== undefined) return { file, args: [...wrapper, options.command, ...options.args], env };
  } else if (options.binding === 'gpu' && !keepThreads) {
    env.OMP_NUM_THREADS = String(share.length);
  }
  return { file: options.command, args: [...options.args], env };
}

/** Sends `signal` to the process group of `child` (and to the child itself if that fails). */
function signalGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    try {
      child.kill(signal);
    } catch {
      // Already gone.
    }
  }
}

/** The exit code of a process ended by `signal`: 128 plus its number, as shells report it. */
export function signalExitCode(signal: NodeJS.Signals): number {
  return 128 + (constants.signals[signal] ?? 0);
}

/** One attempt: how the local group ended. */
type Attempt =
  { kind: 'succeeded' } | { kind: 'failed'; failure: RankExit } | { kind: 'interrupted'; signal: NodeJS.Signals };

/** A running rank and what became of it. */
interface RankState {
  localRank: number;
  rank: number;
  child: ChildProcess;
  /** Set when the process has exited (or failed to start), with the time it did. */
  exit?: RankExit & { at: number };
  /** Set when its output streams are closed too. */
  closed: boolean;
}

/** Starts one rank; its output goes through prefixers to the launcher's streams. */
function startRank(options: LaunchOptions, localRank: number, restart: number, share: readonly number[]): RankState {
  const rank = options.nodeRank * options.nprocPerNode + localRank;
  const { file, args, env } = rankProcess(options, localRank, restart, share);
  const child = spawn(file, args, { cwd: options.cwd, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  const state: RankState = { localRank, rank, child, closed: false };
  const prefix = `[rank ${rank}] `;
  const out = new LinePrefixer(prefix, (text) => options.stdout.write(text));
  const err = new LinePrefixer(prefix, (text) => options.stderr.write(text));
  child.stdout?.on('data', (chunk: Buffer) => out.push(chunk));
  child.stderr?.on('data', (chunk: Buffer) => err.push(chunk));
  child.on('exit', (code, signal) => {
    state.exit ??= { rank, localRank, code, signal, at: performance.now() };
  });
  child.on('error', (error) => {
    state.exit ??= { rank, localRank, code: null, signal: null, error: error.message, at: performance.now() };
    state.closed = true;
  });
  child.on('close', () => {
    out.end();
    err.end();
    state.closed = true;
  });
  return state;
}

/** Runs the local group once, until every rank has exited, one has failed, or a signal came. */
async function runAttempt(
  options: LaunchOptions,
  restart: number,
  shares: readonly (readonly number[])[],
): Promise<Attempt> {
  const ranks = shares.map((share, localRank) => startRank(options, localRank, restart, share));
  const running = (): RankState[] => ranks.filter((r) => r.exit === undefined);
  let interrupted: NodeJS.Signals | undefined;
  let failure: RankExit | undefined;
  let killTimer: NodeJS.Timeout | undefined;

  /** Sends `signal` to every running rank and SIGKILL to those still running after the grace period. */
  const stopAll = (signal: NodeJS.Signals): void => {
    for (const r of running()) signalGroup(r.child, signal);
    killTimer ??= setTimeout(() => {
      for (const r of running()) signalGroup(r.child, 'SIGKILL');
    }, options.gracePeriodSeconds * 1000);
  };
  const onSignal = (signal: NodeJS.Signals): void => {
    interrupted ??= signal;
    stopAll(signal);
  };
  const forward = options.forwardSignals ?? true;
  if (forward) for (const signal of FORWARDED) process.on(signal, onSignal);

  try {
    await new Promise<void>((done) => {
      const monitor = setInterval(() => {
        if (failure === undefined && interrupted === undefined) {
          const failed = ranks
            .filter((r) => r.exit !== undefined && (r.exit.code !== 0 || r.exit.error !== undefined))
            .sort((a, b) => (a.exit?.at ?? 0) - (b.exit?.at ?? 0));
          const first = failed[0]?.exit;
          if (first !== undefined) {
            const { at: _at, ...exit } = first;
            failure = exit;
            if (running().length > 0) {
              options.stderr.write(
                `resnet-cuda launch: ${describeExit(exit)}; stopping the other ranks (SIGTERM, SIGKILL after ${options.gracePeriodSeconds} s)\n`,
              );
            }
            stopAll('SIGTERM');
          }
        }
        if (ranks.every((r) => r.exit !== undefined && r.closed)) {
          clearInterval(monitor);
          done();
        }
      }, options.monitorIntervalSeconds * 1000);
    });
  } finally {
    if (forward) for (const signal of FORWARDED) process.off(signal, onSignal);
    clearTimeout(killTimer);
  }
  if (interrupted !== undefined) return { kind: 'interrupted', signal: interrupted };
  if (failure !== undefined) return { kind: 'failed', failure };
  return { kind: 'succeeded' };
}

/**
 * Starts `nprocPerNode` ranks of `command` and supervises them until they all exit 0 (`succeeded`),
 * one fails after the last of `maxRestarts` restarts (`failed`, naming it), or a signal stops the
 * launch (`interrupted`). Each restart starts the whole local group again with the same ranks and
 * `RESNET_RESTART_COUNT` one higher; the command is expected to resume from its latest checkpoint.
 */
export async function launchRanks(options: LaunchOptions): Promise<LaunchResult> {
  const shares = options.binding === 'none' ? [] : cpuShares(options.cpus, options.nprocPerNode);
  const rankShares = Array.from({ length: options.nprocPerNode }, (_, i) => shares[i] ?? []);
  const first = options.nodeRank * options.nprocPerNode;
  const binding =
    options.binding === 'cpu'
      ? `, cores ${rankShares.map((s) => formatCpuList(s)).join(' | ')}${options.taskset === undefined ? ' (OpenMP places)' : ' (taskset)'}`
      : options.binding === 'gpu'
        ? ', GPU = local rank'
        : '';
  options.stderr.write(
    `resnet-cuda launch: ranks ${first}-${first + options.nprocPerNode - 1} of ${options.nnodes * options.nprocPerNode} on node ${options.nodeRank}, store ${options.masterAddr}:${options.masterPort}${binding}\n`,
  );
  for (let restart = 0; ; restart++) {
    const attempt = await runAttempt(options, restart, rankShares);
    if (attempt.kind === 'succeeded') return { status: 'succeeded', restarts: restart };
    if (attempt.kind === 'interrupted') return { status: 'interrupted', restarts: restart, signal: attempt.signal };
    if (restart >= options.maxRestarts) return { status: 'failed', restarts: restart, failure: attempt.failure };
    options.stderr.write(
      `resnet-cuda launch: ${describeExit(attempt.failure)}; restarting the ${options.nprocPerNode} local ranks (restart ${restart + 1} of ${options.maxRestarts})\n`,
    );
  }
}
