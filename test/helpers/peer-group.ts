/**
 * A ProcessGroup test double for one process: rank `rank` of `worldSize`, whose peers hold the
 * values `peer` gives (by default this rank's own), so that collectives have known results without
 * other processes. Records every call.
 * @packageDocumentation
 */
import type { CollectiveRecord, ProcessGroup, ReduceOp } from '../../lib/distributed/types.js';
import type { Tensor } from '../../lib/tensor.js';

/** Options of {@link PeerGroup}. */
export interface PeerGroupOptions {
  rank?: number;
  worldSize?: number;
  /** The values rank `peer` holds for `tensor` (this rank's values as given); default the same. */
  peer?: (values: Float32Array, peer: number, tensor: Tensor) => Float32Array;
}

/** See the module documentation. */
export class PeerGroup implements ProcessGroup {
  readonly backend = 'gloo' as const;
  readonly rank: number;
  readonly worldSize: number;
  readonly localRank: number;
  readonly localWorldSize: number;
  readonly device = 'cpu';
  readonly timeoutSeconds = 10;
  /** The calls, as `op size` strings (`allReduce:avg 12`). */
  readonly calls: string[] = [];
  readonly #peer: NonNullable<PeerGroupOptions['peer']>;

  constructor(options: PeerGroupOptions = {}) {
    this.rank = this.localRank = options.rank ?? 0;
    this.worldSize = this.localWorldSize = options.worldSize ?? 2;
    this.#peer = options.peer ?? ((values) => values);
  }

  allReduce(tensor: Tensor, options: { op?: ReduceOp } = {}): void {
    const op = options.op ?? 'sum';
    this.calls.push(`allReduce:${op} ${tensor.numel}`);
    const isInt = tensor.dtype === 'i32';
    const own = isInt ? Float32Array.from(tensor.toArray() as Int32Array) : tensor.toFloat32Array();
    const out = Float32Array.from(own);
    for (let p = 0; p < this.worldSize; p++) {
      if (p === this.rank) continue;
      const theirs = this.#peer(own, p, tensor);
      for (let i = 0; i < out.length; i++) out[i] = op === 'max' ? Math.max(out[i]!, theirs[i]!) : out[i]! + theirs[i]!;
    }
    if (op === 'avg') for (let i = 0; i < out.length; i++) out[i] = out[i]! / this.worldSize;
    tensor.copyFromHost(isInt ? Int32Array.from(out, Math.round) : out);
  }

  broadcast(tensor: Tensor, root = 0): void {
    this.calls.push(`broadcast:${root} ${tensor.numel}`);
  }

  allGather(input: Tensor, output: Tensor): void {
    this.calls.push(`allGather ${input.numel}`);
    const own = input.toFloat32Array();
    const out = new Float32Array(own.length * this.worldSize);
    for (let p = 0; p < this.worldSize; p++) out.set(p === this.rank ? own : this.#peer(own, p, input), p * own.length);
    output.copyFromHost(out);
  }

  barrier(): void {
    this.calls.push('barrier');
  }

  wait(): void {
    this.calls.push('wait');
  }

  synchronize(): void {
    this.calls.push('synchronize');
  }

  takeCollectiveRecords(): CollectiveRecord[] {
    return [];
  }

  destroy(): void {
    this.calls.push('destroy');
  }
}
