/**
 * Process groups (torch.distributed's `init_process_group`): {@link initProcessGroup} joins this
 * process to the job's group, NCCL between GPUs or Gloo on the CPU, and returns the
 * {@link ProcessGroup} that DistributedDataParallel, SyncBatchNorm and the Trainer use.
 *
 * Rendezvous: rank 0 serves the job's TCP key-value store on `masterAddr:masterPort`; every rank
 * connects to it with the job's token. NCCL ranks exchange rank 0's unique id through it, Gloo ranks
 * their TCP addresses (under a key prefix of the group). A group of one process needs no store.
 * @packageDocumentation
 */
import { addon, type RawCommunicator } from '../binding.js';
import { parseDevice } from '../device.js';
import {
  ResnetError,
  describe,
  expectInt,
  expectNumber,
  expectOneOf,
  expectOptions,
  invalid,
  mismatch,
} from '../errors.js';
import { expectTensor, type Tensor } from '../tensor.js';
import { rendezvousFromEnv } from './env.js';
import { TcpStore, TcpStoreServer } from './store.js';
import type { CollectiveRecord, ProcessGroup, ProcessGroupBackend, ReduceOp, RendezvousInfo } from './types.js';

/**
 * How long joining, any collective and any wait may take by default: 30 minutes, PyTorch's default
 * process-group timeout (`torch.distributed.default_pg_timeout`). A dead peer is usually reported
 * much sooner (its connections close); the timeout bounds a peer that stalls.
 */
export const DEFAULT_PROCESS_GROUP_TIMEOUT_SECONDS = 1800;

/** Options of {@link initProcessGroup}; what is left out comes from the environment ({@link rendezvousFromEnv}). */
export interface ProcessGroupOptions {
  /** `nccl` or `gloo`; default `nccl` when `device` is a GPU, else `gloo`. */
  backend?: ProcessGroupBackend;
  /** This rank's device; default `cuda:<localRank>` for NCCL, `cpu` for Gloo. */
  device?: string;
  /** Global rank (`RANK`). */
  rank?: number;
  /** Number of processes (`WORLD_SIZE`). */
  worldSize?: number;
  /** Rank on this machine (`LOCAL_RANK`). */
  localRank?: number;
  /** Processes on this machine (`LOCAL_WORLD_SIZE`). */
  localWorldSize?: number;
  /** Host of rank 0's store (`MASTER_ADDR`); rank 0 binds to it. */
  masterAddr?: string;
  /** Port of the store (`MASTER_PORT`). */
  masterPort?: number;
  /** The job's store token (`RESNET_STORE_TOKEN`). */
  token?: string;
  /** Seconds joining, each collective and each wait may take; default {@link DEFAULT_PROCESS_GROUP_TIMEOUT_SECONDS}. */
  timeoutSeconds?: number;
}

const OPTION_KEYS = [
  'backend',
  'device',
  'rank',
  'worldSize',
  'localRank',
  'localWorldSize',
  'masterAddr',
  'masterPort',
  'token',
  'timeoutSeconds',
] as const;

const REDUCE_OPS: readonly ReduceOp[] = ['sum', 'avg', 'max'];

/** Groups created by this process so far: each gets its own key prefix in the store. */
let groupsCreated = 0;

/** The rendezvous of `options`, completed from the environment and checked. */
function resolveRendezvous(options: ProcessGroupOptions): RendezvousInfo {
  const o = options;
  const given = [o.rank, o.worldSize, o.localRank, o.localWorldSize, o.masterAddr, o.masterPort, o.token];
  // The environment is read only when something is missing, so that explicit options need none.
  const env: RendezvousInfo | null = given.some((v) => v === undefined) ? rendezvousFromEnv() : null;
  const worldSize = expectInt('worldSize', o.worldSize ?? env?.worldSize, 1, 65536);
  const rank = expectInt('rank', o.rank ?? env?.rank, 0, worldSize - 1);
  const localWorldSize = expectInt('localWorldSize', o.localWorldSize ?? env?.localWorldSize, 1, worldSize);
  const localRank = expectInt('localRank', o.localRank ?? env?.localRank, 0, localWorldSize - 1);
  const masterAddr = o.masterAddr ?? env?.masterAddr;
  if (typeof masterAddr !== 'string' || masterAddr.length === 0) {
    invalid('masterAddr', 'a host name or address', masterAddr);
  }
  const masterPort = expectInt('masterPort', o.masterPort ?? env?.masterPort, 0, 65535);
  const token = o.token ?? env?.token ?? '';
  if (typeof token !== 'string') invalid('token', 'a string', token);
  return {
    rank,
    worldSize,
    localRank,
    localWorldSize,
    masterAddr,
    masterPort,
    token,
    source: env?.source ?? 'explicit',
  };
}

/** The backend and device of `options` with their defaults, checked against each other. */
function resolveBackend(
  options: ProcessGroupOptions,
  localRank: number,
): { backend: ProcessGroupBackend; device: string } {
  const explicitDevice = options.device === undefined ? undefined : parseDevice(options.device);
  const backend =
    options.backend === undefined
      ? explicitDevice?.startsWith('cuda')
        ? 'nccl'
        : 'gloo'
      : expectOneOf<ProcessGroupBackend>('backend', options.backend, ['nccl', 'gloo']);
  const device = explicitDevice ?? (backend === 'nccl' ? `cuda:${localRank}` : 'cpu');
  if (backend === 'nccl' && !device.startsWith('cuda')) {
    invalid('device', "a CUDA device ('cuda:N') for the NCCL backend", device);
  }
  if (backend === 'gloo' && device !== 'cpu') {
    invalid('device', "'cpu' for the Gloo backend (use backend 'nccl' on GPUs)", device);
  }
  return { backend, device };
}

/** Rank 0's store server, with the error a user can act on when the address cannot be served. */
function serveStore(r: RendezvousInfo): TcpStoreServer {
  try {
    return new TcpStoreServer({ host: r.masterAddr, port: r.masterPort, token: r.token });
  } catch (error) {
    const why = error instanceof Error ? error.message : String(error);
    throw new ResnetError(
      error instanceof ResnetError ? error.code : 'ERR_RC_DISTRIBUTED',
      `Rank 0 cannot serve the process group's store on ${r.masterAddr}:${r.masterPort} (MASTER_ADDR:MASTER_PORT): ` +
        `${why}. Is another job using port ${r.masterPort}? Is ${r.masterAddr} an address of this machine?`,
    );
  }
}

/**
 * Joins this process to the job's process group (torch.distributed's `init_process_group`). Rank 0
 * serves the rendezvous store; every rank waits at most `timeoutSeconds` for the others, and fails
 * naming what did not arrive. Call {@link ProcessGroup.destroy} (or `using`) when done.
 */
export function initProcessGroup(options: ProcessGroupOptions = {}): DistributedProcessGroup {
  const o = expectOptions<ProcessGroupOptions>('initProcessGroup options', options, OPTION_KEYS);
  const timeoutSeconds = expectNumber(
    'timeoutSeconds',
    o.timeoutSeconds ?? DEFAULT_PROCESS_GROUP_TIMEOUT_SECONDS,
    Number.MIN_VALUE,
  );
  const r = resolveRendezvous(o);
  const { backend, device } = resolveBackend(o, r.localRank);
  const prefix = `group${groupsCreated++}`;
  let server: TcpStoreServer | null = null;
  let store: TcpStore | null = null;
  try {
    if (r.worldSize > 1) {
      if (r.rank === 0) server = serveStore(r);
      if (backend === 'nccl') {
        store = new TcpStore({ host: r.masterAddr, port: r.masterPort, token: r.token, rank: r.rank, timeoutSeconds });
      }
    }
    const native = addon();
    let uniqueId: string | undefined;
    if (backend === 'nccl') {
      if (r.rank === 0) uniqueId = native.createUniqueId({ device });
      if (store !== null) {
        if (r.rank === 0) store.set(`${prefix}/nccl-unique-id`, uniqueId ?? '');
        else uniqueId = store.getString(`${prefix}/nccl-unique-id`);
      }
    }
    const raw = new native.Communicator({
      device,
      backend,
      rank: r.rank,
      worldSize: r.worldSize,
      timeoutSeconds,
      ...(uniqueId === undefined ? {} : { uniqueId }),
      ...(backend === 'gloo'
        ? { storeHost: r.masterAddr, storePort: r.masterPort, storeToken: r.token, storePrefix: prefix }
        : {}),
    });
    return new DistributedProcessGroup(raw, { ...r, backend, device, timeoutSeconds, server, store });
  } catch (error) {
    store?.close();
    server?.close();
    throw error;
  }
}

/** What a {@link DistributedProcessGroup} is made of; created by {@link initProcessGroup}. */
interface GroupParts extends RendezvousInfo {
  backend: ProcessGroupBackend;
  device: string;
  timeoutSeconds: number;
  server: TcpStoreServer | null;
  store: TcpStore | null;
}

/**
 * The {@link ProcessGroup} of {@link initProcessGroup}: checks every tensor (a live tensor on the
 * group's device) before enqueueing its collective, and owns the native communicator and, on rank 0,
 * the store server.
 */
export class DistributedProcessGroup implements ProcessGroup {
  /** {@inheritDoc ProcessGroup.backend} */
  readonly backend: ProcessGroupBackend;
  /** {@inheritDoc ProcessGroup.rank} */
  readonly rank: number;
  /** {@inheritDoc ProcessGroup.worldSize} */
  readonly worldSize: number;
  /** {@inheritDoc ProcessGroup.localRank} */
  readonly localRank: number;
  /** {@inheritDoc ProcessGroup.localWorldSize} */
  readonly localWorldSize: number;
  /** {@inheritDoc ProcessGroup.device} */
  readonly device: string;
  /** {@inheritDoc ProcessGroup.timeoutSeconds} */
  readonly timeoutSeconds: number;
  #raw: RawCommunicator | null;
  #server: TcpStoreServer | null;
  #store: TcpStore | null;

  /** @internal Use {@link initProcessGroup}. */
  constructor(raw: RawCommunicator, parts: GroupParts) {
    this.#raw = raw;
    this.backend = parts.backend;
    this.rank = parts.rank;
    this.worldSize = parts.worldSize;
    this.localRank = parts.localRank;
    this.localWorldSize = parts.localWorldSize;
    this.device = parts.device;
    this.timeoutSeconds = parts.timeoutSeconds;
    this.#server = parts.server;
    this.#store = parts.store;
  }

  /** {@inheritDoc ProcessGroup.allReduce} */
  allReduce(tensor: Tensor, options: { op?: ReduceOp } = {}): void {
    const o = expectOptions<{ op?: ReduceOp }>('allReduce options', options, ['op']);
    const op = o.op === undefined ? 'sum' : expectOneOf('op', o.op, REDUCE_OPS);
    this.#comm().allReduce({ tensor: this.#tensor('tensor', tensor).raw, op });
  }

  /** {@inheritDoc ProcessGroup.broadcast} */
  broadcast(tensor: Tensor, root = 0): void {
    const t = this.#tensor('tensor', tensor);
    this.#comm().broadcast({ tensor: t.raw, root: expectInt('root', root, 0, this.worldSize - 1) });
  }

  /** {@inheritDoc ProcessGroup.allGather} */
  allGather(input: Tensor, output: Tensor): void {
    const i = this.#tensor('input', input);
    const out = this.#tensor('output', output);
    if (out.dtype !== i.dtype || out.numel !== i.numel * this.worldSize) {
      mismatch(
        'output',
        `a ${i.dtype} tensor of ${i.numel * this.worldSize} elements (${this.worldSize} ranks x ${i.numel})`,
        `a ${out.dtype} tensor of ${out.numel} elements`,
      );
    }
    this.#comm().allGather({ input: i.raw, output: out.raw });
  }

  /** {@inheritDoc ProcessGroup.barrier} */
  barrier(): void {
    this.#comm().barrier();
  }

  /** {@inheritDoc ProcessGroup.wait} */
  wait(): void {
    this.#comm().waitOnDevice();
  }

  /** {@inheritDoc ProcessGroup.synchronize} */
  synchronize(timeoutSeconds = this.timeoutSeconds): void {
    this.#comm().synchronize({ timeoutSeconds: expectNumber('timeoutSeconds', timeoutSeconds, Number.MIN_VALUE) });
  }

  /** {@inheritDoc ProcessGroup.takeCollectiveRecords} */
  takeCollectiveRecords(): CollectiveRecord[] {
    return this.#comm().takeRecords();
  }

  /**
   * Leaves the group: a final barrier (so that rank 0 does not stop the store while another rank
   * still needs it), then the communicator and, on rank 0, the store are closed. A group that has
   * already failed is closed without the barrier. Calling it again does nothing.
   */
  destroy(): void {
    const raw = this.#raw;
    if (raw === null) return;
    this.#raw = null;
    try {
      if (this.worldSize > 1) raw.barrier();
    } catch {
      // The group failed (the error was or will be reported by the call that saw it); close anyway.
    } finally {
      raw.dispose();
      this.#store?.close();
      this.#server?.close();
      this.#store = null;
      this.#server = null;
    }
  }

  /** {@link DistributedProcessGroup.destroy}, for `using`. */
  [Symbol.dispose](): void {
    this.destroy();
  }

  #comm(): RawCommunicator {
    if (this.#raw === null) throw new ResnetError('ERR_RC_DISPOSED', 'This process group was destroyed');
    return this.#raw;
  }

  #tensor(name: string, value: unknown): Tensor {
    const t = expectTensor(name, value);
    if (t.device !== this.device) {
      throw new ResnetError(
        'ERR_RC_DEVICE',
        `${name} is on ${t.device}, but this ${this.backend} process group runs on ${this.device}; got ${describe(value)}`,
      );
    }
    return t;
  }
}
