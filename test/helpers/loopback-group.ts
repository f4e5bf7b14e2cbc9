/**
 * A test double of ProcessGroup: `worldSize` ranks in one process (CPU tensors), for testing what
 * is built on top of a group without spawning processes. Each rank's n-th collective is matched
 * with the other ranks' n-th; it runs when the last rank enqueues it (checking that every rank
 * enqueued the same op on the same shape and dtype), and every call is recorded with its time.
 * `wait()` throws where a real group would hang: a collective of this rank that a peer never
 * enqueued.
 * @packageDocumentation
 */
import type { CollectiveRecord, ProcessGroup, ReduceOp } from '../../lib/distributed/types.js';
import { Tensor } from '../../lib/tensor.js';

/** One enqueued collective of one rank. */
interface Pending {
  op: string;
  reduce: ReduceOp | null;
  root: number;
  tensor: Tensor;
  enqueuedMs: number;
}

/** A call as the double saw it (for tests of order and timing). */
export interface LoggedCall {
  rank: number;
  op: string;
  reduce: ReduceOp | null;
  numel: number;
  dtype: string;
  atMs: number;
}

function nowMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

/** The shared state of the ranks of one loopback job. */
class Loopback {
  readonly queues: Pending[][];
  readonly records: CollectiveRecord[][];
  readonly log: LoggedCall[] = [];

  constructor(readonly worldSize: number) {
    this.queues = Array.from({ length: worldSize }, () => []);
    this.records = Array.from({ length: worldSize }, () => []);
  }

  enqueue(rank: number, item: Pending): void {
    this.log.push({
      rank,
      op: item.op,
      reduce: item.reduce,
      numel: item.tensor.numel,
      dtype: item.tensor.dtype,
      atMs: item.enqueuedMs,
    });
    this.queues[rank]!.push(item);
    if (this.queues.every((q) => q.length > 0)) this.#run(this.queues.map((q) => q.splice(0, 1)[0]!));
  }

  #run(items: Pending[]): void {
    const first = items[0]!;
    for (const [rank, item] of items.entries()) {
      if (
        item.op !== first.op ||
        item.reduce !== first.reduce ||
        item.root !== first.root ||
        item.tensor.dtype !== first.tensor.dtype ||
        item.tensor.numel !== first.tensor.numel
      ) {
        throw new Error(
          `loopback group: rank ${rank} enqueued ${item.op} ${item.reduce ?? ''} of ${item.tensor.toString()} but rank 0 enqueued ${first.op} ${first.reduce ?? ''} of ${first.tensor.toString()}`,
        );
      }
    }
    const startMs = nowMs();
    const values = items.map((item) => item.tensor.toFloat32Array());
    let result: Float32Array;
    if (first.op === 'broadcast') {
      result = values[first.root]!;
    } else {
      result = new Float32Array(values[0]!.length);
      for (let i = 0; i < result.length; i++) {
        let acc = first.reduce === 'max' ? -Infinity : 0;
        for (const v of values) acc = first.reduce === 'max' ? Math.max(acc, v[i]!) : acc + v[i]!;
        result[i] = first.reduce === 'avg' ? acc / this.worldSize : acc;
      }
    }
    const converted = Tensor.from(result, first.tensor.shape, { dtype: first.tensor.dtype });
    for (const item of items) item.tensor.copyFrom(converted);
    converted.dispose();
    const endMs = nowMs();
    items.forEach((item, rank) => {
      const bytes = item.tensor.numel * (item.tensor.dtype === 'f32' ? 4 : 2);
      this.records[rank]!.push({ op: item.op, bytes, enqueuedMs: item.enqueuedMs, startMs, endMs });
    });
  }
}

/** A rank of a loopback job. */
class LoopbackGroup implements ProcessGroup {
  readonly backend = 'gloo' as const;
  readonly localRank: number;
  readonly localWorldSize: number;
  readonly device = 'cpu';
  readonly timeoutSeconds = 1;
  destroyed = false;

  constructor(
    readonly job: Loopback,
    readonly rank: number,
    readonly worldSize: number,
  ) {
    this.localRank = rank;
    this.localWorldSize = worldSize;
  }

  allReduce(tensor: Tensor, options: { op?: ReduceOp } = {}): void {
    this.job.enqueue(this.rank, { op: 'allReduce', reduce: options.op ?? 'sum', root: 0, tensor, enqueuedMs: nowMs() });
  }

  broadcast(tensor: Tensor, root = 0): void {
    this.job.enqueue(this.rank, { op: 'broadcast', reduce: null, root, tensor, enqueuedMs: nowMs() });
  }

  allGather(): void {
    throw new Error('loopback group: allGather is not implemented');
  }

  barrier(): void {
    // Every rank of a loopback job runs in this thread.
  }

  wait(): void {
    const waiting = this.job.queues[this.rank]!.length;
    if (waiting > 0) {
      throw new Error(`loopback group: rank ${this.rank} waits for ${waiting} collectives no peer has enqueued`);
    }
  }

  synchronize(): void {
    this.wait();
  }

  takeCollectiveRecords(): CollectiveRecord[] {
    return this.job.records[this.rank]!.splice(0);
  }

  destroy(): void {
    this.destroyed = true;
  }
}

/** The ranks of a loopback job, and the log of every call they made. */
export function loopbackGroups(worldSize: number): { groups: ProcessGroup[]; log: LoggedCall[] } {
  const job = new Loopback(worldSize);
  return {
    groups: Array.from({ length: worldSize }, (_, rank) => new LoopbackGroup(job, rank, worldSize)),
    log: job.log,
  };
}
