/**
 * The GPU-decode row of `node dist/bench/loader.js`: images/s of {@link GpuJpegDecoder} on the
 * loader benchmark's folder and pipelines, from file bytes already in memory (the reads are the
 * loader's cost either way), timing whole batches to the end of their device work. Runs on a real
 * GPU only: without a usable CUDA backend, or on the emulated device (whose timings mean nothing),
 * the row is skipped with the reason.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { listBackends } from '../lib/device.js';
import { GpuJpegDecoder, type GpuDecodeSample } from '../lib/data/gpu-decode.js';
import type { ImageFolder } from '../lib/data/image-folder.js';
import type { Compose } from '../lib/data/transforms.js';

/** One pipeline's GPU-decode throughput. */
export interface GpuDecodeRow {
  pipeline: string;
  implementation: string;
  imagesPerSecond: number;
}

/** The rows, or why there are none. */
export type GpuDecodeResult = { available: true; rows: GpuDecodeRow[] } | { available: false; reason: string };

/** Why GPU decoding cannot be timed in this process, or null when it can. */
export function gpuDecodeUnavailable(): string | null {
  if (process.env.RESNET_CUDA_BACKEND_LIBRARY) {
    return 'the CUDA backend is replaced (RESNET_CUDA_BACKEND_LIBRARY, e.g. the emulated device): GPU decode throughput needs a real GPU';
  }
  const cuda = listBackends().find((b) => b.name === 'cuda');
  if (!cuda?.available) return `no usable CUDA device (${cuda?.reason ?? 'no CUDA backend'})`;
  return null;
}

/** Times `batches` batches of `batchSize` images per pipeline after `warmup` batches. */
export function measureGpuDecode(
  dataset: ImageFolder,
  pipelines: readonly [string, () => Compose][],
  batchSize: number,
  batches: number,
  warmup = 2,
): GpuDecodeResult {
  const reason = gpuDecodeUnavailable();
  if (reason) return { available: false, reason };
  const spec = dataset.spec();
  const files: GpuDecodeSample[] = spec.files.map((f, index) => {
    const path = join(spec.root, f);
    return { path, bytes: new Uint8Array(readFileSync(path)), index };
  });
  const batchAt = (k: number) =>
    Array.from({ length: batchSize }, (_, i) => files[(k * batchSize + i) % files.length]!);
  const rows: GpuDecodeRow[] = [];
  for (const [pipeline, make] of pipelines) {
    const decoder = new GpuJpegDecoder({ transform: make(), device: 'cuda:0', seed: 0 });
    try {
      for (let k = 0; k < warmup; k++) decoder.decode(batchAt(k), 0);
      decoder.synchronize(120);
      const started = performance.now();
      for (let k = 0; k < batches; k++) decoder.decode(batchAt(warmup + k), 0);
      decoder.synchronize(120);
      const seconds = (performance.now() - started) / 1000;
      rows.push({ pipeline, implementation: decoder.implementation, imagesPerSecond: (batches * batchSize) / seconds });
    } finally {
      decoder.dispose();
    }
  }
  return { available: true, rows };
}
