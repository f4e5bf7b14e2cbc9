/**
 * The data-parallel vocabulary shared by the process groups, the launcher, DistributedDataParallel,
 * SyncBatchNorm and the Trainer.
 * @packageDocumentation
 */
import type { Tensor } from '../tensor.js';

/** How {@link ProcessGroup.allReduce} combines the ranks' values. */
export type ReduceOp = 'sum' | 'avg' | 'max';

/** The collective library behind a {@link ProcessGroup}: NCCL between GPUs, Gloo on the CPU. */
export type ProcessGroupBackend = 'nccl' | 'gloo';

/**
 * Where this process sits in the job and how to reach the rendezvous, as read from the environment
 * of torchrun, SLURM or Open MPI (or given explicitly).
 */
export interface RendezvousInfo {
  /** Global rank, 0 to `worldSize - 1`. */
  rank: number;
  /** Number of processes in the job. */
  worldSize: number;
  /** Rank on this machine (picks the GPU). */
  localRank: number;
  /** Number of processes on this machine. */
  localWorldSize: number;
  /** Host of the key-value store served by rank 0 (`MASTER_ADDR`). */
  masterAddr: string;
  /** Port of that store (`MASTER_PORT`). */
  masterPort: number;
  /** The job's shared secret that store clients must present; empty when none was set. */
  token: string;
  /** Which convention the values came from. */
  source: 'torchrun' | 'slurm' | 'mpi' | 'explicit';
}

/** One collective as the group's own thread ran it (Gloo), on `process.hrtime`'s clock. */
export interface CollectiveRecord {
  /** `allReduce`, `broadcast`, `allGather` or `barrier`. */
  op: string;
  /** Bytes of this rank's tensor. */
  bytes: number;
  /** When the call enqueued it, in milliseconds (`Number(process.hrtime.bigint()) / 1e6`). */
  enqueuedMs: number;
  /** When it started and finished running, same clock. */
  startMs: number;
  endMs: number;
}

/**
 * A group of processes running collectives together (torch.distributed's process group).
 *
 * Collectives are enqueued in program order, after the device work enqueued before them, and run
 * asynchronously (NCCL on its own CUDA stream, Gloo on a thread of its own): the call returns at
 * once. {@link ProcessGroup.wait} makes later device work wait for them (on a GPU without blocking
 * the host); {@link ProcessGroup.synchronize} blocks the host. Every wait has the group's timeout:
 * a rank that dies or stalls makes the others fail with an error naming it, never hang.
 */
export interface ProcessGroup {
  /** `nccl` or `gloo`. */
  readonly backend: ProcessGroupBackend;
  /** This process's rank. */
  readonly rank: number;
  /** Number of ranks. */
  readonly worldSize: number;
  /** Rank on this machine. */
  readonly localRank: number;
  /** Number of ranks on this machine. */
  readonly localWorldSize: number;
  /** The device this rank's tensors live on (`cuda:<localRank>` for NCCL, `cpu` for Gloo). */
  readonly device: string;
  /** Seconds any collective or wait may take before the group fails. */
  readonly timeoutSeconds: number;
  /** Combines `tensor` over all ranks, in place. */
  allReduce(tensor: Tensor, options?: { op?: ReduceOp }): void;
  /** Copies rank `root`'s `tensor` to every rank, in place (root 0 by default). */
  broadcast(tensor: Tensor, root?: number): void;
  /** Writes every rank's `input` into `output` (`worldSize` times its size), rank after rank. */
  allGather(input: Tensor, output: Tensor): void;
  /** Blocks until every rank has reached the barrier. */
  barrier(): void;
  /** Makes device work enqueued from now on wait for the collectives enqueued so far. */
  wait(): void;
  /** Blocks the host until the enqueued collectives are done; throws on error or timeout. */
  synchronize(timeoutSeconds?: number): void;
  /**
   * The collectives run since the last call (at most the latest 1024), oldest first, with their
   * times; empty for NCCL, whose collectives run on the GPU (use the profiler there).
   */
  takeCollectiveRecords(): CollectiveRecord[];
  /** Leaves the group (and stops the store on rank 0). */
  destroy(): void;
}
