/**
 * CUDA graphs. They need a CUDA device; on the CPU they throw with `ERR_RC_INVALID_ARGUMENT`.
 * (Collectives: lib/distributed/process-group.ts.)
 * @packageDocumentation
 */
import { addon } from './binding.js';
import { parseDevice } from './device.js';
import { ResnetError } from './errors.js';

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
