/**
 * Shares this machine's CPU cores between the local ranks of a job: each rank gets a disjoint,
 * contiguous slice of the cores the launcher may use, as many OpenMP threads as cores in its slice,
 * and is pinned to that slice. Pinning uses `taskset` (util-linux) when it is on the `PATH`, which
 * sets the affinity of the whole process (its OpenMP threads, Node's and the data loader's threads
 * inherit it); without it, `OMP_PLACES` and `OMP_PROC_BIND` pin the OpenMP threads only.
 * @packageDocumentation
 */
import { accessSync, constants, readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { delimiter, join } from 'node:path';
import { ResnetError } from '../errors.js';

/** Parses a Linux CPU list (`0-3,8,10-11`) into the CPU numbers, in order. */
export function parseCpuList(text: string): number[] {
  const cpus: number[] = [];
  for (const part of text.trim().split(',')) {
    const match = /^(\d+)(?:-(\d+))?$/.exec(part);
    if (!match) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `Expected a CPU list such as 0-3,8 but received '${text}'`);
    }
    const lo = Number(match[1]);
    const hi = match[2] === undefined ? lo : Number(match[2]);
    for (let cpu = lo; cpu <= hi; cpu++) cpus.push(cpu);
  }
  return cpus;
}

/** Writes CPU numbers as a Linux CPU list, ranges collapsed (`0-3,8`). */
export function formatCpuList(cpus: readonly number[]): string {
  const parts: string[] = [];
  for (let i = 0; i < cpus.length;) {
    let j = i;
    while (j + 1 < cpus.length && cpus[j + 1] === (cpus[j] ?? 0) + 1) j++;
    parts.push(i === j ? `${cpus[i]}` : `${cpus[i]}-${cpus[j]}`);
    i = j + 1;
  }
  return parts.join(',');
}

/**
 * The CPUs this process may run on: `Cpus_allowed_list` of /proc/self/status (the affinity a
 * scheduler such as SLURM or a container gave it), else CPUs 0 to `availableParallelism() - 1`.
 */
export function allowedCpus(): number[] {
  try {
    const status = readFileSync('/proc/self/status', 'utf8');
    const line = /^Cpus_allowed_list:\s*(\S+)$/m.exec(status);
    if (line?.[1] !== undefined) return parseCpuList(line[1]);
  } catch {
    // Not Linux's procfs: fall back to the count.
  }
  return Array.from({ length: availableParallelism() }, (_, i) => i);
}

/**
 * Splits `cpus` into `parts` contiguous slices as equal as possible (the first ones one larger
 * when they do not divide evenly). With fewer CPUs than parts, each part gets one CPU, taken in
 * turn, and parts share CPUs.
 */
export function cpuShares(cpus: readonly number[], parts: number): number[][] {
  if (cpus.length === 0) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'Expected at least one CPU to share');
  if (cpus.length < parts) return Array.from({ length: parts }, (_, i) => [cpus[i % cpus.length] ?? 0]);
  const base = Math.floor(cpus.length / parts);
  const extra = cpus.length % parts;
  const shares: number[][] = [];
  let start = 0;
  for (let i = 0; i < parts; i++) {
    const size = base + (i < extra ? 1 : 0);
    shares.push(cpus.slice(start, start + size));
    start += size;
  }
  return shares;
}

/** The path of the executable `name` in the directories of `path` (a `PATH` value), if any. */
export function findExecutable(name: string, path: string | undefined): string | undefined {
  for (const dir of (path ?? '').split(delimiter)) {
    if (dir === '') continue;
    const candidate = join(dir, name);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // Not here.
    }
  }
  return undefined;
}

/** How one rank is started on its share of the cores. */
export interface CpuBinding {
  /** Words to put before the command (`taskset -c 0-3`), empty when pinning goes through OpenMP. */
  wrapper: string[];
  /** Environment variables to set: `OMP_NUM_THREADS`, and `OMP_PLACES`/`OMP_PROC_BIND` without taskset. */
  env: Record<string, string>;
}

/**
 * The binding of a rank to `cpus`: `taskset -c <cpus>` before the command when `taskset` is the
 * path of the tool, else OpenMP's places (one per core, threads bound close to the first). The
 * OpenMP thread count is the number of cores, unless `keepThreads` (the user set
 * `OMP_NUM_THREADS`).
 */
export function cpuBinding(cpus: readonly number[], taskset: string | undefined, keepThreads: boolean): CpuBinding {
  const env: Record<string, string> = keepThreads ? {} : { OMP_NUM_THREADS: String(cpus.length) };
  if (taskset !== undefined) return { wrapper: [taskset, '-c', formatCpuList(cpus)], env };
  env.OMP_PLACES = cpus.map((cpu) => `{${cpu}}`).join(',');
  env.OMP_PROC_BIND = 'close';
  return { wrapper: [], env };
}
