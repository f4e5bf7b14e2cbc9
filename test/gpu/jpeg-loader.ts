/**
 * The GPU check of `DataLoader({ decode: 'gpu' })`: against the CPU loader with the same seed on a
 * folder of JPEGs, the same batch order, labels and flips, and pixels within the tolerance of
 * test/data-gpu-decode.test.ts (nvJPEG's IDCT and chroma upsampling against libjpeg-turbo's: a mean
 * difference of at most 1 level, at most 1% of values more than 4 levels apart); then the images/s
 * of both loaders over a second epoch (persistent workers, so without their start-up), the GPU
 * loader's timed to the end of the device's work. 'full': 512 JPEGs of 375x500 at 224 px, batch
 * 64; 'small' (the emulated device): 12 small JPEGs at 24 px.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import {
  Compose,
  DataLoader,
  ImageFolder,
  Normalize,
  RandomHorizontalFlip,
  RandomResizedCrop,
  synchronize,
  type DataLoaderOptions,
} from '../../lib/index.js';
import { photo } from '../helpers/photo.js';
import type { GpuCheck } from './cases.js';

const TOLERANCE = { mean: 1, level: 4, outliers: 0.01 };

function fail(message: string): never {
  throw new Error(message);
}

/** Writes `count` JPEGs of `height` x `width` in 4 class folders under `root`. */
async function writeJpegs(root: string, count: number, height: number, width: number): Promise<void> {
  for (let i = 0; i < count; i++) {
    const dir = join(root, `class${i % 4}`);
    mkdirSync(dir, { recursive: true });
    const jpeg = await sharp(photo(height, width, i + 1), { raw: { width, height, channels: 3 } })
      .jpeg({ quality: 90 })
      .toBuffer();
    writeFileSync(join(dir, `${i}.jpg`), jpeg);
  }
}

/** Compares one batch of each loader; returns the mean |difference|. */
function compareBatch(k: number, gpu: Uint8Array, cpu: Uint8Array): number {
  if (gpu.length !== cpu.length) fail(`batch ${k}: ${gpu.length} bytes on the device, ${cpu.length} on the CPU`);
  let sum = 0;
  let outliers = 0;
  for (let i = 0; i < cpu.length; i++) {
    const d = Math.abs(gpu[i]! - cpu[i]!);
    sum += d;
    if (d > TOLERANCE.level) outliers++;
  }
  const mean = sum / cpu.length;
  if (mean > TOLERANCE.mean) fail(`batch ${k}: mean difference ${mean.toFixed(3)} levels (at most ${TOLERANCE.mean})`);
  if (outliers / cpu.length > TOLERANCE.outliers) {
    fail(
      `batch ${k}: ${((100 * outliers) / cpu.length).toFixed(2)}% of values more than ${TOLERANCE.level} levels apart`,
    );
  }
  return mean;
}

/** Images/s of one epoch of `loader` (every batch handed over with toTensors when on the device). */
async function timeEpoch(loader: DataLoader, device: string | undefined): Promise<number> {
  let images = 0;
  const started = performance.now();
  for await (const batch of loader) {
    if (device) batch.toTensors();
    images += batch.size;
  }
  if (device) synchronize(device);
  return images / ((performance.now() - started) / 1000);
}

export const gpuLoaderCheck: GpuCheck = {
  name: "DataLoader decode: 'gpu' gives the CPU loader's batches (pixels within the decode tolerance), and its images/s",
  run: async ({ device, scale, log }) => {
    const full = scale === 'full';
    const root = mkdtempSync(join(tmpdir(), 'resnet-cuda-gpu-loader-check-'));
    try {
      await (full ? writeJpegs(root, 512, 375, 500) : writeJpegs(root, 12, 40, 52));
      const dataset = await ImageFolder.open(root);
      const transform = new Compose([
        new RandomResizedCrop({ size: full ? 224 : 24 }),
        new RandomHorizontalFlip(),
        new Normalize({ mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] }),
      ]);
      const options: DataLoaderOptions = {
        batchSize: full ? 64 : 4,
        transform,
        shuffle: true,
        seed: 5,
        workers: full ? 4 : 1,
        persistentWorkers: true,
      };
      const cpu = new DataLoader(dataset, options);
      const gpu = new DataLoader(dataset, { ...options, decode: 'gpu', device });
      try {
        const cpuIterator = cpu[Symbol.asyncIterator]();
        let worst = 0;
        let k = 0;
        for await (const batch of gpu) {
          const other = await cpuIterator.next();
          if (other.done === true) fail(`the CPU loader ended before batch ${k}`);
          const c = other.value;
          const same = (a: ArrayLike<number>, b: ArrayLike<number>) =>
            a.length === b.length && Array.from(a).every((v, i) => v === b[i]);
          if (!same(batch.indices, c.indices)) fail(`batch ${k}: other samples than the CPU loader's`);
          if (!same(batch.labels, c.labels)) fail(`batch ${k}: other labels than the CPU loader's`);
          if (!same(batch.flips, c.flips)) fail(`batch ${k}: other flips than the CPU loader's`);
          const pixels = batch.toTensors().images.toArray() as Uint8Array;
          worst = Math.max(worst, compareBatch(k, pixels, c.images));
          k++;
        }
        if (!(await cpuIterator.next()).done) fail(`the CPU loader has more than ${k} batches`);
        log(`${k} batches equal within the tolerance (worst batch mean difference ${worst.toFixed(3)} levels)`);
        const cpuRate = await timeEpoch(cpu, undefined);
        const gpuRate = await timeEpoch(gpu, device);
        log(
          `second epoch, ${options.workers} workers: CPU decode ${cpuRate.toFixed(0)} images/s, ` +
            `GPU decode ${gpuRate.toFixed(0)} images/s (to the end of the device work)`,
        );
      } finally {
        await cpu.close();
        await gpu.close();
      }
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  },
};
