/**
 * The GPU check of `DataLoader({ decode: 'gpu' })`: against the CPU loader with the same seed on a
 * folder of JPEGs, the same batch order, labels and flips, and pixels within the decoders'
 * tolerance (test/helpers/decode-tolerance.ts), once with 4:2:0 JPEGs and once with 4:4:4 (no chroma
 * upsampling, a tighter bound); then the images/s of both loaders over a second epoch of the 4:2:0
 * folder (persistent workers, so without their start-up), the GPU loader's timed to the end of the
 * device's work. 'full': 512 JPEGs of 375x500 at 224 px, batch 64; 'small' (the emulated device): 12
 * small JPEGs at 24 px.
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
import { DECODE_TOLERANCE as TOLERANCE, decodeDifference, type DecodeDifference } from '../helpers/decode-tolerance.js';
import { photo } from '../helpers/photo.js';
import type { GpuCheck } from './cases.js';

function fail(message: string): never {
  throw new Error(message);
}

/** Writes `count` JPEGs of `height` x `width` in 4 class folders under `root`. */
async function writeJpegs(
  root: string,
  count: number,
  height: number,
  width: number,
  chromaSubsampling: '4:2:0' | '4:4:4',
): Promise<void> {
  for (let i = 0; i < count; i++) {
    const dir = join(root, `class${i % 4}`);
    mkdirSync(dir, { recursive: true });
    const jpeg = await sharp(photo(height, width, i + 1), { raw: { width, height, channels: 3 } })
      .jpeg({ quality: 90, chromaSubsampling })
      .toBuffer();
    writeFileSync(join(dir, `${i}.jpg`), jpeg);
  }
}

function describeDifference(d: DecodeDifference): string {
  const pct = (v: number) => `${(100 * v).toFixed(2)}%`;
  return `mean ${d.mean.toFixed(3)}, max ${d.max}, >4 ${pct(d.over[4])}, >8 ${pct(d.over[8])}, >16 ${pct(d.over[16])}`;
}

/** One batch of each loader compared: the difference and, outside the tolerance, why. */
function compareBatch(
  k: number,
  gpu: Uint8Array,
  cpu: Uint8Array,
  maxOutliers: number,
): { diff: DecodeDifference; problem: string | null } {
  if (gpu.length !== cpu.length) fail(`batch ${k}: ${gpu.length} bytes on the device, ${cpu.length} on the CPU`);
  const diff = decodeDifference(gpu, cpu);
  let problem: string | null = null;
  if (diff.mean > TOLERANCE.mean) problem = `mean difference above ${TOLERANCE.mean} level`;
  else if (diff.over[TOLERANCE.level] > maxOutliers) {
    problem = `more than ${100 * maxOutliers}% of values over ${TOLERANCE.level} levels apart`;
  }
  return { diff, problem: problem && `batch ${k}: ${problem} (${describeDifference(diff)})` };
}

/**
 * Runs both loaders over one epoch side by side: the same samples, labels and flips (else throws),
 * and each batch's pixel difference. Returns the worst batch and the batches outside the tolerance.
 */
async function compareLoaders(
  gpu: DataLoader,
  cpu: DataLoader,
  maxOutliers: number,
): Promise<{ batches: number; worst: DecodeDifference | null; problems: string[] }> {
  const cpuIterator = cpu[Symbol.asyncIterator]();
  let worst: DecodeDifference | null = null;
  const problems: string[] = [];
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
    const { diff, problem } = compareBatch(k, batch.toTensors().images.toArray() as Uint8Array, c.images, maxOutliers);
    if (problem) problems.push(problem);
    if (!worst || diff.mean > worst.mean) worst = diff;
    k++;
  }
  if (!(await cpuIterator.next()).done) fail(`the CPU loader has more than ${k} batches`);
  return { batches: k, worst, problems };
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
    const problems: string[] = [];
    // 4:2:0 (sharp's default, as most photographs) first; 4:4:4, without chroma upsampling, apart.
    for (const chroma of ['4:2:0', '4:4:4'] as const) {
      const root = mkdtempSync(join(tmpdir(), 'resnet-cuda-gpu-loader-check-'));
      try {
        await (full ? writeJpegs(root, 512, 375, 500, chroma) : writeJpegs(root, 12, 40, 52, chroma));
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
          const maxOutliers = chroma === '4:4:4' ? TOLERANCE.outliersWithoutSubsampling : TOLERANCE.outliers;
          const compared = await compareLoaders(gpu, cpu, maxOutliers);
          log(
            `${chroma}: ${compared.batches} batches, ${compared.problems.length} outside the tolerance ` +
              `(worst batch: ${compared.worst ? describeDifference(compared.worst) : 'none'})`,
          );
          problems.push(...compared.problems.map((p) => `${chroma} ${p}`));
          if (chroma !== '4:2:0') continue;
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
    }
    if (problems.length) fail(`${problems.length} batches outside the tolerance; first: ${problems[0]}`);
  },
};
