/**
 * The loss and throughput accounting of one training epoch: the loss is summed on the device and
 * read only at log points (a window), and the epoch's totals survive a checkpoint in the middle of
 * the epoch, so that a resumed epoch reports the loss, time and img/s of the whole epoch.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import type { Tensor } from '../tensor.js';

/** Where an epoch's accounting stood at a checkpoint inside it. */
export interface EpochProgress {
  /** Sum of the micro-batch losses already read. */
  lossTotal: number;
  /** Micro-batches whose loss was read. */
  batches: number;
  /** Training images of the epoch so far. */
  images: number;
  /** Training time of the epoch so far, in seconds. */
  seconds: number;
  /** The loss summed on the device since the last log point, and its micro-batches and images. */
  window: { loss: number; batches: number; images: number };
}

/** One log point: the mean loss since the previous one and the img/s over that time. */
export interface WindowReading {
  loss: number;
  imagesPerSec: number;
}

/** The epoch's summary. */
export interface EpochTotals {
  trainLoss: number;
  seconds: number;
  imagesPerSec: number;
}

/** Accumulates an epoch's losses (on the device) and images; see the module documentation. */
export class EpochMeter {
  readonly #lossSum: Tensor;
  readonly #start = performance.now();
  readonly #secondsBefore: number;
  #windowStart = this.#start;
  #windowBatches: number;
  #windowImages: number;
  #lossTotal: number;
  #batches: number;
  #images: number;

  /**
   * @param lossSum - an f32[1] device tensor the losses are added into (overwritten).
   * @param resumed - the state saved inside this epoch, when resuming there.
   */
  constructor(lossSum: Tensor, resumed: EpochProgress | null) {
    this.#lossSum = lossSum;
    addon().fill({ tensor: lossSum.raw, value: resumed?.window.loss ?? 0 });
    this.#windowBatches = resumed?.window.batches ?? 0;
    this.#windowImages = resumed?.window.images ?? 0;
    this.#lossTotal = resumed?.lossTotal ?? 0;
    this.#batches = resumed?.batches ?? 0;
    this.#images = resumed?.images ?? 0;
    this.#secondsBefore = resumed?.seconds ?? 0;
  }

  /** Adds a micro-batch's loss (an f32[1] device tensor), without waiting for the device. */
  addLoss(value: Tensor): void {
    addon().add({ a: this.#lossSum.raw, b: value.raw, out: this.#lossSum.raw });
    this.#windowBatches++;
  }

  /**
   * Counts a micro-batch whose loss the device already added to the sum (a replayed CUDA graph
   * adds into the same tensor).
   */
  countLoss(): void {
    this.#windowBatches++;
  }

  /** Counts the images of an optimizer step. */
  addImages(images: number): void {
    this.#windowImages += images;
    this.#images += images;
  }

  /** Reads the window's loss (waits for the device) and starts a new window; null when empty. */
  readWindow(): WindowReading | null {
    if (this.#windowBatches === 0) return null;
    const total = this.#lossSum.item();
    addon().fill({ tensor: this.#lossSum.raw, value: 0 });
    const now = performance.now();
    const reading = {
      loss: total / this.#windowBatches,
      imagesPerSec: (this.#windowImages * 1000) / Math.max(now - this.#windowStart, 1e-6),
    };
    this.#lossTotal += total;
    this.#batches += this.#windowBatches;
    this.#windowStart = now;
    this.#windowBatches = 0;
    this.#windowImages = 0;
    return reading;
  }

  /** The state to save in a checkpoint inside the epoch (reads the device). */
  progress(): EpochProgress {
    return {
      lossTotal: this.#lossTotal,
      batches: this.#batches,
      images: this.#images,
      seconds: this.#seconds(),
      window: {
        loss: this.#windowBatches > 0 ? this.#lossSum.item() : 0,
        batches: this.#windowBatches,
        images: this.#windowImages,
      },
    };
  }

  /** The epoch's mean loss, time and img/s (call {@link EpochMeter.readWindow} first). */
  totals(): EpochTotals {
    const seconds = this.#seconds();
    return {
      trainLoss: this.#batches > 0 ? this.#lossTotal / this.#batches : NaN,
      seconds,
      imagesPerSec: this.#images / Math.max(seconds, 1e-9),
    };
  }

  #seconds(): number {
    return this.#secondsBefore + (performance.now() - this.#start) / 1000;
  }
}
