/**
 * Where this process sits in a data-parallel job, read from the environment that the process's
 * launcher set: `resnet-cuda launch` or torchrun, SLURM's `srun`, or Open MPI's `mpirun`.
 *
 * Sources, in order of precedence (the first one present wins):
 *
 * 1. **torchrun** (also `resnet-cuda launch` and a Kubeflow PyTorchJob): `RANK`, `WORLD_SIZE`,
 *    `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`. Present when any of `RANK`,
 *    `WORLD_SIZE` or `LOCAL_RANK` is set; then `RANK` and `WORLD_SIZE` are required. Without
 *    `LOCAL_RANK` the process is alone on its machine (local rank 0 of 1, as a PyTorchJob with one
 *    process per pod); with it, `LOCAL_WORLD_SIZE` is required.
 * 2. **SLURM** (`srun`, one task per process): present when `SLURM_PROCID` is set. Rank
 *    `SLURM_PROCID`, world `SLURM_NTASKS`, local rank `SLURM_LOCALID`; the local world is this
 *    node's entry of `SLURM_STEP_TASKS_PER_NODE`, `SLURM_NTASKS_PER_NODE` or `SLURM_TASKS_PER_NODE`
 *    (the first set; the compressed form `4(x2),3` lists the nodes in order, `SLURM_NODEID` picks
 *    this node's). The store's host is `MASTER_ADDR` or else the first host of
 *    `SLURM_JOB_NODELIST` (the node of task 0 under the default block distribution), its port
 *    `MASTER_PORT` or else {@link slurmDefaultPort}.
 * 3. **Open MPI** (`mpirun`): present when `OMPI_COMM_WORLD_RANK` is set. Rank, world, local rank
 *    and local world from `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`. Open MPI
 *    says nothing about a store, so `MASTER_ADDR` and `MASTER_PORT` are required (pass them with
 *    `mpirun -x MASTER_ADDR=... -x MASTER_PORT=...`).
 *
 * torchrun comes first so that a launcher started once per node by `srun` or `mpirun` (which then
 * sets the torchrun variables for its own workers) gives the workers its numbering, not the
 * scheduler's. A process with none of these is a job of its own: rank 0 of 1, its store on
 * 127.0.0.1 at port 0 (any free port: nobody else has to find it).
 *
 * With a world of one, `MASTER_ADDR` and `MASTER_PORT` may be left out under every source (the
 * same defaults). The store token is `RESNET_STORE_TOKEN` (empty when unset). An empty variable
 * counts as unset. Every value that is set is checked: a malformed one, or a rank outside its
 * world, throws `ERR_RC_INVALID_ARGUMENT` naming the variable and its value.
 * @packageDocumentation
 */
import { isIP } from 'node:net';
import { ResnetError, defined, mismatch } from '../errors.js';
import type { RendezvousInfo } from './types.js';

/** The environment variables this module reads. */
type Env = Readonly<Record<string, string | undefined>>;

/** The host of the store when the environment names none (a job of one process). */
export const DEFAULT_MASTER_ADDR = '127.0.0.1';

/** The lowest port {@link slurmDefaultPort} gives. */
export const SLURM_PORT_BASE = 10000;

/** How many ports {@link slurmDefaultPort} spreads job ids over. */
export const SLURM_PORT_SPAN = 20000;

/** `value` as `'...'`, for messages. */
function quoted(value: string): string {
  return `'${value.length > 80 ? value.slice(0, 80) + '…' : value}'`;
}

/** Throws naming the environment variable `name`, what it should hold and what it holds. */
function badVariable(name: string, expected: string, value: string): never {
  return mismatch(`the environment variable ${name}`, expected, quoted(value));
}

/** The value of `name`, or undefined when it is unset or empty. */
function read(env: Env, name: string): string | undefined {
  const value = env[name];
  return value === undefined || value === '' ? undefined : value;
}

/** The value of `name`; throws naming it (and `why` it is needed) when it is unset. */
function required(env: Env, name: string, why: string): string {
  const value = read(env, name);
  if (value === undefined) {
    throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `The environment variable ${name} is not set (${why})`);
  }
  return value;
}

/** A decimal integer of at least `min` from the variable `name`. */
function integerVariable(name: string, value: string, min: number): number {
  const n = /^\d+$/.test(value) ? Number(value) : NaN;
  if (!Number.isSafeInteger(n) || n < min) badVariable(name, `an integer of at least ${min}`, value);
  return n;
}

/**
 * `value` as a host to connect to: a host name, an IPv4 address or an IPv6 address (brackets
 * allowed and removed); undefined when it is none of these (empty, spaces, a port after a colon).
 */
export function normalizeHost(value: string): string | undefined {
  const bare = value.startsWith('[') && value.endsWith(']') ? value.slice(1, -1) : value;
  if (isIP(bare) !== 0) return bare;
  const label = /^[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?$/;
  const hostname = value.endsWith('.') ? value.slice(0, -1) : value;
  const ok = value.length <= 253 && hostname !== '' && hostname.split('.').every((l) => label.test(l));
  return ok ? value : undefined;
}

/** {@link normalizeHost} of the variable `name`; throws naming it and its value when it is no host. */
export function parseHost(name: string, value: string): string {
  return normalizeHost(value) ?? badVariable(name, 'a host name or an IP address', value);
}

/** A TCP port: 1 to 65535, or 0 (any free port) when `allowAny`. */
export function parsePort(name: string, value: string, allowAny: boolean): number {
  const port = /^\d+$/.test(value) ? Number(value) : NaN;
  const min = allowAny ? 0 : 1;
  if (!Number.isInteger(port) || port < min || port > 65535) {
    badVariable(name, `a TCP port between ${min} and 65535`, value);
  }
  return port;
}

/**
 * The store's port for the SLURM job `jobId` when `MASTER_PORT` is unset:
 * `10000 + jobId % 20000`. Every task of a job computes the same port, jobs that share a node
 * (numbered one after the other) get different ones, and the range 10000-29999 stays below
 * Linux's default range of ephemeral ports (32768-60999, `net.ipv4.ip_local_port_range`), from
 * which outgoing connections take theirs.
 */
export function slurmDefaultPort(jobId: number): number {
  return SLURM_PORT_BASE + (jobId % SLURM_PORT_SPAN);
}

/**
 * Expands a SLURM host list in its compressed form (`node[01-03,07],gpu5`, as in
 * `SLURM_JOB_NODELIST`) into the host names, in order; zero padding is kept. `name` is the
 * variable it came from, for errors. The whole list is checked; only its first `limit` hosts are
 * returned.
 */
export function expandSlurmHostList(name: string, value: string, limit = 100_000): string[] {
  const hosts: string[] = [];
  // Items are separated by commas outside brackets.
  const items: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < value.length; i++) {
    const c = value[i];
    if (c === '[') depth++;
    else if (c === ']') depth--;
    if (depth < 0 || depth > 1) badVariable(name, 'a SLURM host list such as node[01-03,07]', value);
    if (c === ',' && depth === 0) {
      items.push(value.slice(start, i));
      start = i + 1;
    }
  }
  if (depth !== 0) badVariable(name, 'a SLURM host list such as node[01-03,07] (a bracket is not closed)', value);
  items.push(value.slice(start));
  for (const item of items) {
    if (item === '') badVariable(name, 'a SLURM host list without empty entries', value);
    // Each item: text and bracketed range lists, one after the other (rack[1-2]-n[01-04]).
    let names = [''];
    for (const part of item.split(/(\[[^\]]*\])/)) {
      if (part === '') continue;
      const choices = part.startsWith('[') ? expandRanges(name, value, part.slice(1, -1)) : [part];
      const next: string[] = [];
      for (const prefix of names) {
        for (const choice of choices) if (next.length < limit) next.push(prefix + choice);
      }
      names = next;
    }
    hosts.push(...names.slice(0, Math.max(0, limit - hosts.length)));
  }
  return hosts;
}

/** The numbers of a bracket's contents (`01-03,07` gives `01 02 03 07`), zero padding kept. */
function expandRanges(name: string, value: string, ranges: string): string[] {
  const out: string[] = [];
  for (const range of ranges.split(',')) {
    const match = /^(\d+)(?:-(\d+))?$/.exec(range);
    if (!match) badVariable(name, 'a SLURM host list whose brackets hold numbers and ranges such as [01-03,07]', value);
    const first = match[1] ?? '';
    const last = match[2] ?? first;
    const lo = Number(first);
    const hi = Number(last);
    if (hi < lo) badVariable(name, `a SLURM host list with increasing ranges (not [${range}])`, value);
    if (hi - lo >= 100_000) badVariable(name, 'a SLURM host list of at most 100000 hosts', value);
    const width = first.length;
    for (let n = lo; n <= hi; n++) out.push(String(n).padStart(width, '0'));
  }
  return out;
}

/**
 * Expands SLURM's tasks-per-node form (`4(x2),3`: 4 tasks on each of 2 nodes, then 3 on one) into
 * one count per node, in node order.
 */
export function expandSlurmTasksPerNode(name: string, value: string): number[] {
  const counts: number[] = [];
  for (const item of value.split(',')) {
    const match = /^(\d+)(?:\(x(\d+)\))?$/.exec(item.trim());
    if (!match) badVariable(name, 'tasks per node such as 4 or 4(x2),3', value);
    const tasks = integerVariable(name, match[1] ?? '', 1);
    const repeat = match[2] === undefined ? 1 : Number(match[2]);
    if (repeat < 1 || counts.length + repeat > 100_000) badVariable(name, 'tasks per node such as 4 or 4(x2),3', value);
    for (let i = 0; i < repeat; i++) counts.push(tasks);
  }
  return counts;
}

/** Rank, world, local rank and local world, checked against each other. */
interface Placement {
  rank: number;
  worldSize: number;
  localRank: number;
  localWorldSize: number;
}

/** The names of the variables a {@link Placement} came from, for messages. */
type PlacementNames = Record<keyof Placement, string>;

/**
 * Reads the four numbers and checks that each rank lies in its world. `local`, when given, is the
 * local rank and local world already read (SLURM derives the latter).
 */
function placement(
  env: Env,
  names: PlacementNames,
  source: string,
  local?: { localRank: number; localWorldSize: number },
): Placement {
  const why = `${source} sets it`;
  const worldSize = integerVariable(names.worldSize, required(env, names.worldSize, why), 1);
  const rankText = required(env, names.rank, why);
  const rank = integerVariable(names.rank, rankText, 0);
  if (rank >= worldSize) badVariable(names.rank, `a rank below ${names.worldSize}=${worldSize}`, rankText);
  let { localRank, localWorldSize } = local ?? { localRank: 0, localWorldSize: 1 };
  const localText = read(env, names.localRank);
  if (local === undefined && localText !== undefined) {
    localRank = integerVariable(names.localRank, localText, 0);
    const why = `${names.localRank} is set`;
    localWorldSize = integerVariable(names.localWorldSize, required(env, names.localWorldSize, why), 1);
  }
  if (localWorldSize > worldSize) {
    const text = read(env, names.localWorldSize) ?? String(localWorldSize);
    badVariable(names.localWorldSize, `at most ${names.worldSize}=${worldSize} processes on this node`, text);
  }
  if (localRank >= localWorldSize) {
    const expected = `a local rank below ${names.localWorldSize}=${localWorldSize}`;
    badVariable(names.localRank, expected, localText ?? String(localRank));
  }
  return { rank, worldSize, localRank, localWorldSize };
}

/** `MASTER_ADDR` and `MASTER_PORT`, defaulted for a world of one, `fallback` otherwise. */
function master(
  env: Env,
  worldSize: number,
  why: string,
  fallback?: { addr?: () => string; port?: () => number },
): { masterAddr: string; masterPort: number } {
  const addrText = read(env, 'MASTER_ADDR');
  const portText = read(env, 'MASTER_PORT');
  const alone = worldSize === 1;
  const masterAddr =
    addrText !== undefined
      ? parseHost('MASTER_ADDR', addrText)
      : (fallback?.addr?.() ?? (alone ? DEFAULT_MASTER_ADDR : required(env, 'MASTER_ADDR', why)));
  const masterPort =
    portText !== undefined
      ? parsePort('MASTER_PORT', portText, alone)
      : (fallback?.port?.() ?? (alone ? 0 : parsePort('MASTER_PORT', required(env, 'MASTER_PORT', why), false)));
  return { masterAddr, masterPort };
}

/** The torchrun convention. */
function fromTorchrun(env: Env): Omit<RendezvousInfo, 'token'> {
  const where = placement(
    env,
    { rank: 'RANK', worldSize: 'WORLD_SIZE', localRank: 'LOCAL_RANK', localWorldSize: 'LOCAL_WORLD_SIZE' },
    'torchrun',
  );
  return {
    ...where,
    ...master(env, where.worldSize, 'torchrun sets it; needed with WORLD_SIZE above 1'),
    source: 'torchrun',
  };
}

/** This node's number of tasks under SLURM, and the variable it came from. */
function slurmLocalWorldSize(env: Env): { name: string; count: number } {
  const name = ['SLURM_STEP_TASKS_PER_NODE', 'SLURM_NTASKS_PER_NODE', 'SLURM_TASKS_PER_NODE'].find(
    (n) => read(env, n) !== undefined,
  );
  if (name === undefined) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      'None of SLURM_STEP_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE is set (srun sets them; start each process with srun)',
    );
  }
  const value = read(env, name) ?? '';
  const counts = expandSlurmTasksPerNode(name, value);
  if (counts.length === 1) return { name, count: defined(counts[0], 'tasks per node') };
  const nodeText = required(env, 'SLURM_NODEID', `needed to pick this node's entry of ${name}=${quoted(value)}`);
  const node = integerVariable('SLURM_NODEID', nodeText, 0);
  if (node >= counts.length) {
    badVariable('SLURM_NODEID', `a node below the ${counts.length} of ${name}=${quoted(value)}`, nodeText);
  }
  return { name, count: defined(counts[node], 'tasks on this node') };
}

/** The SLURM convention. */
function fromSlurm(env: Env): Omit<RendezvousInfo, 'token'> {
  const tasks = slurmLocalWorldSize(env);
  const localRank = integerVariable('SLURM_LOCALID', required(env, 'SLURM_LOCALID', 'srun sets it'), 0);
  const where = placement(
    env,
    { rank: 'SLURM_PROCID', worldSize: 'SLURM_NTASKS', localRank: 'SLURM_LOCALID', localWorldSize: tasks.name },
    'srun',
    { localRank, localWorldSize: tasks.count },
  );
  const why = 'srun sets it; set MASTER_ADDR and MASTER_PORT instead if it is missing';
  const addr = (): string => {
    const name = read(env, 'SLURM_JOB_NODELIST') !== undefined ? 'SLURM_JOB_NODELIST' : 'SLURM_NODELIST';
    const hosts = expandSlurmHostList(name, required(env, name, why), 1);
    return parseHost(name, defined(hosts[0], 'the first host'));
  };
  const port = (): number => slurmDefaultPort(integerVariable('SLURM_JOB_ID', required(env, 'SLURM_JOB_ID', why), 0));
  return { ...where, ...master(env, where.worldSize, why, { addr, port }), source: 'slurm' };
}

/** The Open MPI convention. */
function fromMpi(env: Env): Omit<RendezvousInfo, 'token'> {
  const where = placement(
    env,
    {
      rank: 'OMPI_COMM_WORLD_RANK',
      worldSize: 'OMPI_COMM_WORLD_SIZE',
      localRank: 'OMPI_COMM_WORLD_LOCAL_RANK',
      localWorldSize: 'OMPI_COMM_WORLD_LOCAL_SIZE',
    },
    'mpirun',
  );
  const why =
    'mpirun does not choose a store: pass it with mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<port>';
  return { ...where, ...master(env, where.worldSize, why), source: 'mpi' };
}

/**
 * Reads this process's place in the job from `env`: torchrun's variables, else SLURM's, else
 * Open MPI's, else a job of one process (see the module's description for each convention).
 * Throws `ERR_RC_INVALID_ARGUMENT` naming the variable and its value when one is malformed or a
 * rank lies outside its world, and naming the variable when a required one is missing.
 */
export function rendezvousFromEnv(env: Env = process.env): RendezvousInfo {
  const token = env.RESNET_STORE_TOKEN ?? '';
  const has = (name: string): boolean => read(env, name) !== undefined;
  let info: Omit<RendezvousInfo, 'token'>;
  if (has('RANK') || has('WORLD_SIZE') || has('LOCAL_RANK')) info = fromTorchrun(env);
  else if (has('SLURM_PROCID')) info = fromSlurm(env);
  else if (has('OMPI_COMM_WORLD_RANK')) info = fromMpi(env);
  else {
    const alone = master(env, 1, '');
    info = { rank: 0, worldSize: 1, localRank: 0, localWorldSize: 1, ...alone, source: 'explicit' };
  }
  return { ...info, token };
}
