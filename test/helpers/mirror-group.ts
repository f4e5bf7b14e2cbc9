/**
 * In-process stand-ins for a ProcessGroup, for tests of code that calls collectives: a group of one
 * rank, and a group of `k` ranks that all hold the same data (a "mirror"), whose collectives are
 * therefore known without other processes: an all-gather repeats this rank's tensor k times, a
 * sum all-reduce multiplies it by k.
 * @packageDocumentation
 */
import type { CollectiveRecord, ProcessGroup, ReduceOp } from '../../lib/distributed/types.js';
import { Tensor } from '../../lib/tensor.js';

/** A mirror group and the collectives it was asked to run, in order. */
export interface MirrorGroup extends ProcessGroup {
  readonly calls: string[];
}

/** A group of `worldSize` ranks on `device` that all hold this rank's data. */
export function mirrorGroup(worldSize: number, device = 'cpu'): MirrorGroup {
  const calls: string[] = [];
  return {
    backend: 'gloo',
    rank: 0,
    worldSize,
    localRank: 0,
    localWorldSize: worldSize,
    device,
    timeoutSeconds: 10,
    calls,
    allReduce(tensor: Tensor, options?: { op?: ReduceOp }): void {
      const op = options?.op ?? 'sum';
      calls.push(`allReduce:${op}`);
      if (op !== 'sum') return; // avg and max of identical values are the value itself
      const values = tensor.toFloat32Array().map((v) => v * worldSize);
      tensor.raw.copyFromHost(values);
    },
    broadcast(): void {
      calls.push('broadcast');
    },
    allGather(input: Tensor, output: Tensor): void {
      calls.push('allGather');
      const one = input.toFloat32Array();
      const all = new Float32Array(one.length * worldSize);
      for (let r = 0; r < worldSize; ++r) all.set(one, r * one.length);
      if (output.numel !== all.length) throw new Error(`allGather: output of ${output.numel}, expected ${all.length}`);
      output.raw.copyFromHost(all);
    },
    barrier(): void {
      calls.push('barrier');
    },
    wait(): void {
      calls.push('wait');
    },
    synchronize(): void {
      calls.push('synchronize');
    },
    takeCollectiveRecords(): CollectiveRecord[] {
      return [];
    },
    destroy(): void {
      calls.push('destroy');
    },
  };
}

/** Rows `x` repeated `k` times along the batch (what k mirrored ranks hold together). */
export function repeatBatch(x: Tensor, k: number): Tensor {
  const one = x.toFloat32Array();
  const all = new Float32Array(one.length * k);
  for (let r = 0; r < k; ++r) all.set(one, r * one.length);
  return Tensor.from(all, [x.shape[0]! * k, ...x.shape.slice(1)], { device: x.device });
}
