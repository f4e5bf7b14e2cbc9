/**
 * Batches as the Trainer's loops use them: device tensors with the deferred flips, from a
 * DataLoader or from host copies of a few batches (the overfit debugging mode).
 * @packageDocumentation
 */
import type { DataLoader } from '../data/loader.js';
import { Tensor } from '../tensor.js';

/** A batch on the device, with the flips the input conversion applies. */
export interface DeviceBatch {
  images: Tensor;
  labels: Tensor;
  hostLabels: Int32Array;
  flips: Uint8Array;
  size: number;
  /** The batch's index in its epoch. */
  index: number;
  /** The dataset index of each sample. */
  indices: Int32Array;
}

/** A host copy of a batch, replayed every epoch in the overfit mode. */
export interface HostBatch {
  images: Uint8Array;
  labels: Int32Array;
  flips: Uint8Array;
  shape: readonly [number, number, number, number];
  indices: Int32Array;
}

/** Whether `value` looks like a DataLoader. */
export function isLoader(value: unknown): value is DataLoader {
  return (
    value !== null &&
    typeof value === 'object' &&
    typeof (value as DataLoader)[Symbol.asyncIterator] === 'function' &&
    typeof (value as DataLoader).setEpoch === 'function' &&
    typeof (value as DataLoader).length === 'number'
  );
}

/** Yields the loader's batches of `epoch` on `device`, starting at batch `first` (the earlier ones are not loaded). */
export async function* loaderBatches(
  loader: DataLoader,
  device: string,
  epoch: number,
  first: number,
): AsyncGenerator<DeviceBatch> {
  loader.setEpoch(epoch, first);
  for await (const batch of loader) {
    const { images, labels } = batch.toTensors(device);
    yield {
      images,
      labels,
      hostLabels: batch.labels,
      flips: batch.flips,
      size: batch.size,
      index: batch.index,
      indices: batch.indices,
    };
  }
}

/**
 * Yields cached host batches on `device`, through one pair of device tensors per batch shape. Nothing
 * is waited for, so it is a plain generator; `for await` takes it as it takes {@link loaderBatches}.
 */
export function* cachedBatches(cached: readonly HostBatch[], device: string): Generator<DeviceBatch> {
  const tensors = new Map<string, { images: Tensor; labels: Tensor }>();
  try {
    for (let index = 0; index < cached.length; index++) {
      const b = cached[index]!;
      const key = b.shape.join('x');
      let t = tensors.get(key);
      if (!t) {
        t = {
          images: Tensor.empty(b.shape, { dtype: 'u8', device }),
          labels: Tensor.empty([b.shape[0]], { dtype: 'i32', device }),
        };
        tensors.set(key, t);
      }
      t.images.copyFromHost(b.images);
      t.labels.copyFromHost(b.labels);
      yield {
        images: t.images,
        labels: t.labels,
        hostLabels: b.labels,
        flips: b.flips,
        size: b.shape[0],
        index,
        indices: b.indices,
      };
    }
  } finally {
    for (const t of tensors.values()) {
      t.images.dispose();
      t.labels.dispose();
    }
  }
}

/** Host copies of the loader's first `count` batches of epoch 0. */
export async function cacheBatches(loader: DataLoader, count: number): Promise<HostBatch[]> {
  const out: HostBatch[] = [];
  loader.setEpoch(0);
  for await (const batch of loader) {
    out.push({
      images: batch.images.slice(),
      labels: batch.labels.slice(),
      flips: batch.flips.slice(),
      shape: [...batch.shape],
      indices: batch.indices.slice(),
    });
    if (out.length === count) break;
  }
  return out;
}
