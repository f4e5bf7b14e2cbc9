/**
 * One table of collective checks that every process group runs, whatever its backend and world
 * size: Gloo in-process (one rank) and in two processes, NCCL on one (emulated) GPU. Each rank's
 * inputs depend on its rank; the expected results are computed here from every rank's inputs, so
 * the checks are exact (all values are small integers or halves, exact in f32 and bf16).
 * @packageDocumentation
 */
import { Tensor } from '../../lib/index.js';
import type { DType } from '../../lib/index.js';
import type { ProcessGroup } from '../../lib/distributed/types.js';

/** One check: throws an Error saying what differed. */
export interface CollectiveCase {
  name: string;
  run: (group: ProcessGroup) => void;
}

function equal(what: string, got: ArrayLike<number | bigint>, want: readonly number[]): void {
  const g = Array.from(got, Number);
  if (g.length !== want.length || g.some((v, i) => v !== want[i])) {
    throw new Error(`${what}: expected [${want.join(', ')}], got [${g.join(', ')}]`);
  }
}

const ranks = (group: ProcessGroup): number[] => Array.from({ length: group.worldSize }, (_, r) => r);

/** The values rank `r` contributes to the reductions. */
const contribution = (r: number): number[] => [r + 1, 2 * (r + 1), 0.5 * r, -3 * r, 7];

function reduceCase(op: 'sum' | 'avg' | 'max', dtype: DType): CollectiveCase {
  return {
    name: `allReduce ${op} ${dtype}`,
    run: (group) => {
      const mine = contribution(group.rank).map((v) => (dtype === 'i32' ? Math.trunc(v) : v));
      const all = ranks(group).map((r) => contribution(r).map((v) => (dtype === 'i32' ? Math.trunc(v) : v)));
      const want = mine.map((_, i) => {
        const column = all.map((values) => values[i]!);
        if (op === 'max') return Math.max(...column);
        const sum = column.reduce((a, b) => a + b, 0);
        if (op === 'sum') return sum;
        return dtype === 'i32' ? Math.trunc(sum / group.worldSize) : sum / group.worldSize;
      });
      const t = Tensor.from(mine, [mine.length], { device: group.device, dtype });
      group.allReduce(t, { op });
      group.synchronize();
      equal(`allReduce ${op} ${dtype} on rank ${group.rank}`, dtype === 'i32' ? t.toArray() : t.toFloat32Array(), want);
      t.dispose();
    },
  };
}

/** The table; every case runs on every rank, in this order. */
export const COLLECTIVE_CASES: readonly CollectiveCase[] = [
  reduceCase('sum', 'f32'),
  reduceCase('avg', 'f32'),
  reduceCase('max', 'f32'),
  reduceCase('sum', 'i32'),
  reduceCase('avg', 'i32'),
  reduceCase('max', 'i32'),
  reduceCase('sum', 'bf16'),
  {
    name: 'allReduce sum i64',
    run: (group) => {
      const t = Tensor.from(BigInt64Array.from([BigInt(group.rank) * 2n ** 40n, -5n]), [2], {
        device: group.device,
        dtype: 'i64',
      });
      group.allReduce(t);
      group.synchronize();
      const n = BigInt(group.worldSize);
      const want = [((n * (n - 1n)) / 2n) * 2n ** 40n, -5n * n];
      const got = t.toArray() as BigInt64Array;
      if (got[0] !== want[0] || got[1] !== want[1]) {
        throw new Error(`allReduce sum i64 on rank ${group.rank}: expected ${want.join(', ')}, got ${got.join(', ')}`);
      }
      t.dispose();
    },
  },
  {
    name: 'several allReduce enqueued before one wait() run in order, and a read after wait() sees them',
    run: (group) => {
      const t = Tensor.from([1, group.rank], [2], { device: group.device });
      group.allReduce(t);
      group.allReduce(t, { op: 'max' });
      group.allReduce(t);
      // Only wait(): the read that follows is device work ordered after the collectives.
      group.wait();
      const w = group.worldSize;
      const sumRanks = (w * (w - 1)) / 2;
      // sum: [w, sumRanks]; max of identical values: unchanged; sum again: times w.
      equal(`chained allReduce on rank ${group.rank}`, t.toFloat32Array(), [w * w, w * sumRanks]);
      t.dispose();
    },
  },
  {
    name: 'broadcast from the last rank',
    run: (group) => {
      const root = group.worldSize - 1;
      const values = (r: number): number[] => [10 * r + 1, 10 * r + 2, -r, 0.5];
      const t = Tensor.from(values(group.rank), [2, 2], { device: group.device });
      group.broadcast(t, root);
      group.synchronize();
      equal(`broadcast from rank ${root} on rank ${group.rank}`, t.toFloat32Array(), values(root));
      t.dispose();
    },
  },
  {
    name: 'allGather',
    run: (group) => {
      const mine = [group.rank, group.rank + 0.5, -group.rank];
      const input = Tensor.from(mine, [3], { device: group.device });
      const output = Tensor.zeros([group.worldSize * 3], { device: group.device });
      group.allGather(input, output);
      group.synchronize();
      equal(
        `allGather on rank ${group.rank}`,
        output.toFloat32Array(),
        ranks(group).flatMap((r) => [r, r + 0.5, -r]),
      );
      input.dispose();
      output.dispose();
    },
  },
  {
    name: 'barrier',
    run: (group) => {
      group.barrier();
      group.barrier();
    },
  },
];
