/**
 * CUDA graphs and NCCL collectives. Both need a CUDA device; on the CPU they throw with
 * `ERR_RC_INVALID_ARGUMENT`.
 * @packageDocumentation
 */
import { addon, type RawCommunicator } from './binding.js';
import { parseDevice } from './device.js';
import { ResnetError, expectInt, expectNumber, expectOptions } from './errors.js';
import { expectTensor, type Tensor } from './tensor.js';

/**
 * A captured sequence of device work, replayed with one launch. Capture records what the callback
 * enqueues, with the buffers it used; run the step once before capturing so that every plan and
 * buffer exists, and do not read values back to the host inside the callback.
 */
export class CudaGraph {
  readonly device: string;
  #id: number | null;

  private constructor(device: string, id: number) {
    this.device = device;
    this.#id = id;
  }

  /** Records the device work of `body` on `device` into a graph. */
  static capture(device: string, body: () => void): CudaGraph {
    const d = parseDevice(device);
    const native = addon();
    native.beginCapture({ device: d });
    try {
      body();
    } catch (error) {
      try {
        native.destroyGraph({ device: d, graph: native.endCapture({ device: d }) });
      } catch {
        // The capture is already invalid; the original error says why.
      }
      throw error;
    }
    return new CudaGraph(d, native.endCapture({ device: d }));
  }

  /** Runs the recorded work again (asynchronously, in order with other work on the device). */
  replay(): void {
    if (this.#id === null) throw new ResnetError('ERR_RC_DISPOSED', 'This CUDA graph was disposed');
    addon().replayGraph({ device: this.device, graph: this.#id });
  }

  /** Frees the graph. */
  dispose(): void {
    if (this.#id !== null) addon().destroyGraph({ device: this.device, graph: this.#id });
    this.#id = null;
  }
}

/** Options of {@link Communicator}. */
export interface CommunicatorOptions {
  /** This rank's device, e.g. `cuda:0`. */
  device: string;
  /** The id from {@link createUniqueId} on rank 0, shared with every rank. */
  uniqueId: string;
  rank: number;
  worldSize: number;
  /** How long joining, and later waiting, may take before the group is aborted; default 300 s. */
  timeoutSeconds?: number;
}

/** A new NCCL unique id (hex), created by rank 0 and published to the others. */
export function createUniqueId(device: string): string {
  return addon().createUniqueId({ device: parseDevice(device) });
}

/** An NCCL communicator: in-place all-reduce and broadcast of device tensors, with timeouts. */
export class Communicator {
  readonly rank: number;
  readonly worldSize: number;
  readonly #timeout: number;
  #raw: RawCommunicator | null;

  constructor(options: CommunicatorOptions) {
    const o = expectOptions<CommunicatorOptions>('Communicator options', options, [
      'device',
      'uniqueId',
      'rank',
      'worldSize',
      'timeoutSeconds',
    ]);
    this.worldSize = expectInt('worldSize', o.worldSize, 1);
    this.rank = expectInt('rank', o.rank, 0, this.worldSize - 1);
    this.#timeout = expectNumber('timeoutSeconds', o.timeoutSeconds ?? 300, Number.MIN_VALUE);
    if (typeof o.uniqueId !== 'string') {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'Expected the uniqueId string from createUniqueId() for uniqueId',
      );
    }
    this.#raw = new (addon().Communicator)({
      device: parseDevice(o.device),
      uniqueId: o.uniqueId,
      rank: this.rank,
      worldSize: this.worldSize,
      timeoutSeconds: this.#timeout,
    });
  }

  /** Sums (or averages) `tensor` over all ranks, in place. */
  allReduce(tensor: Tensor, options: { average?: boolean } = {}): void {
    this.#comm().allReduce({ tensor: expectTensor('tensor', tensor).raw, average: options.average ?? false });
  }

  /** Copies rank `root`'s `tensor` to every rank, in place. */
  broadcast(tensor: Tensor, root = 0): void {
    this.#comm().broadcast({
      tensor: expectTensor('tensor', tensor).raw,
      root: expectInt('root', root, 0, this.worldSize - 1),
    });
  }

  /** Waits for the queued collectives; throws (and aborts the group) on error or timeout. */
  synchronize(timeoutSeconds = this.#timeout): void {
    this.#comm().synchronize({ timeoutSeconds: expectNumber('timeoutSeconds', timeoutSeconds, Number.MIN_VALUE) });
  }

  /** Leaves the group. */
  dispose(): void {
    this.#raw?.dispose();
    this.#raw = null;
  }

  #comm(): RawCommunicator {
    if (!this.#raw) throw new ResnetError('ERR_RC_DISPOSED', 'This communicator was disposed');
    return this.#raw;
  }
}
