/**
 * `DataLoader({ decode: 'gpu' })`: the batches decoded on the device against the CPU loader's for
 * the same seed (pixels within the tolerance of test/data-gpu-decode.test.ts, labels, flips and
 * order identical), epochs, shuffling, resuming, dropLast and distributed sharding, with and
 * without workers, and the errors. The device cases run in the 'cuda-emulator-cases' project on
 * the emulated device (skipped with the reason elsewhere); the checks made before any device work
 * run in 'main'. Workers run the compiled package: `npm run build:ts` first.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  AdaptiveAvgPool2d,
  BatchNorm2d,
  CenterCrop,
  ColorJitter,
  Compose,
  Conv2d,
  DataLoader,
  Flatten,
  ImageFolder,
  Linear,
  Normalize,
  RandomHorizontalFlip,
  RandomResizedCrop,
  ReLU,
  Resize,
  SGD,
  Sequential,
  ShapesDataset,
  Subset,
  Trainer,
  listBackends,
  type Batch,
  type DataLoaderOptions,
  type Dataset,
} from '../lib/index.js';
import { runCli } from './helpers/cli.js';
import { objectContaining, stringContaining, stringMatching } from './helpers/matchers.js';
import { photo } from './helpers/photo.js';

/** test/data-gpu-decode.test.ts's tolerance: mean |difference| and the share beyond `level`. */
const TOLERANCE = { mean: 1, level: 4, outliers: 0.01 };

const cuda = listBackends().find((b) => b.name === 'cuda');
const reason = cuda?.available ? undefined : (cuda?.reason ?? 'no CUDA backend');
const emulated = (process.env.RESNET_CUDA_BACKEND_LIBRARY ?? '').includes('emulator');
const onlyCuda = process.env.RESNET_TEST_BACKENDS === 'cuda';

let root = '';
let jpegs = '';
let mixed = '';

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), 'resnet-cuda-gpu-loader-test-'));
  jpegs = join(root, 'data', 'train'); // DATA/train/<class>/<image>, as `train` takes it
  mixed = join(root, 'mixed');
  // 11 JPEGs of different sizes (none more than 4x the output, where the CPU loader would decode
  // with DCT scaling), 4:2:0, 4:4:4, progressive and grey, in 3 classes.
  for (let i = 0; i < 11; i++) {
    const dir = join(jpegs, `class${i % 3}`);
    mkdirSync(dir, { recursive: true });
    const [h, w] = [36 + ((i * 7) % 23), 40 + ((i * 11) % 29)];
    let image = sharp(photo(h, w, i + 1), { raw: { width: w, height: h, channels: 3 } });
    if (i === 4) image = image.toColourspace('b-w');
    const jpeg = image.jpeg({ quality: 88, progressive: i === 5, chromaSubsampling: i === 6 ? '4:4:4' : '4:2:0' });
    writeFileSync(join(dir, `img${i}.jpg`), await jpeg.toBuffer());
  }
  mkdirSync(join(mixed, 'a'), { recursive: true });
  const raw = { raw: { width: 20, height: 20, channels: 3 as const } };
  writeFileSync(join(mixed, 'a', 'one.jpg'), await sharp(photo(20, 20), raw).jpeg().toBuffer());
  writeFileSync(join(mixed, 'a', 'two.png'), await sharp(photo(20, 20), raw).png().toBuffer());
});

afterAll(() => {
  if (root) rmSync(root, { recursive: true, force: true });
});

const trainTransform = (): Compose =>
  new Compose([
    new RandomResizedCrop({ size: 24 }),
    new RandomHorizontalFlip(),
    new Normalize({ mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] }),
  ]);

/** A batch's contents, copied while it is current: the device's pixels read back. */
interface Copied {
  pixels: Uint8Array;
  labels: number[];
  flips: number[];
  indices: number[];
  index: number;
  epoch: number;
}

function copy(batch: Batch): Copied {
  const pixels =
    batch.decoded === 'gpu'
      ? Uint8Array.from(batch.toTensors().images.toArray() as Uint8Array)
      : Uint8Array.from(batch.images);
  return {
    pixels,
    labels: [...batch.labels],
    flips: [...batch.flips],
    indices: [...batch.indices],
    index: batch.index,
    epoch: batch.epoch,
  };
}

/**
 * One epoch of `loader`, copied; with `pause`, a pause before each next batch, so that the workers'
 * next files have arrived and its decode runs ahead, into the other buffer, while a batch is current.
 */
async function epoch(loader: DataLoader, pause = false): Promise<Copied[]> {
  const out: Copied[] = [];
  for await (const batch of loader) {
    if (pause) await new Promise((resolve) => setTimeout(resolve, 30));
    out.push(copy(batch));
  }
  return out;
}

/** The batches of the same options decoded on the CPU and on the device (the loaders closed). */
async function both(
  dataset: Dataset,
  options: Omit<DataLoaderOptions, 'decode' | 'device'>,
  epochs = 1,
  pause = false,
): Promise<{ cpu: Copied[][]; gpu: Copied[][] }> {
  const cpu = new DataLoader(dataset, options);
  const gpu = new DataLoader(dataset, { ...options, decode: 'gpu', device: 'cuda' });
  try {
    const result = { cpu: [] as Copied[][], gpu: [] as Copied[][] };
    for (let e = 0; e < epochs; e++) {
      result.cpu.push(await epoch(cpu));
      result.gpu.push(await epoch(gpu, pause));
    }
    return result;
  } finally {
    await cpu.close();
    await gpu.close();
  }
}

/** Expects the device's batches to be the CPU's: order, labels and flips exactly, pixels within the tolerance. */
function expectSameBatches(gpu: Copied[], cpu: Copied[]): void {
  expect(gpu.map((b) => [b.epoch, b.index, b.indices, b.labels, b.flips])).toEqual(
    cpu.map((b) => [b.epoch, b.index, b.indices, b.labels, b.flips]),
  );
  gpu.forEach((g, k) => {
    const c = cpu[k]!.pixels;
    expect(g.pixels.length).toBe(c.length);
    let sum = 0;
    let outliers = 0;
    let max = 0;
    for (let i = 0; i < c.length; i++) {
      const d = Math.abs(g.pixels[i]! - c[i]!);
      sum += d;
      max = Math.max(max, d);
      if (d > TOLERANCE.level) outliers++;
    }
    expect(sum / c.length).toBeLessThanOrEqual(TOLERANCE.mean);
    expect(outliers / c.length).toBeLessThanOrEqual(TOLERANCE.outliers);
    // The emulated nvJPEG decodes with libjpeg, as the CPU loader does: the same pixels.
    if (emulated) expect(max).toBe(0);
  });
}

// Refused before any device work, so these run once, in the CPU project.
describe.skipIf(onlyCuda)("decode: 'gpu' options", () => {
  it('needs a CUDA device', async () => {
    const dataset = await ImageFolder.open(jpegs);
    const transform = trainTransform();
    expect(() => new DataLoader(dataset, { batchSize: 2, transform, decode: 'gpu' })).toThrow(
      objectContaining({ code: 'ERR_RC_INVALID_ARGUMENT', message: stringMatching(/decode: 'gpu'.*device: 'cuda'/) }),
    );
    expect(() => new DataLoader(dataset, { batchSize: 2, transform, decode: 'gpu', device: 'cpu' })).toThrow(
      objectContaining({ message: stringMatching(/CUDA device.*received 'cpu'/) }),
    );
    expect(() => new DataLoader(dataset, { batchSize: 2, transform, decode: 'gpu', device: 'gpu0' })).toThrow(
      objectContaining({ code: 'ERR_RC_DEVICE' }),
    );
    expect(() => new DataLoader(dataset, { batchSize: 2, transform, decode: 'GPU' as 'gpu' })).toThrow(
      /"cpu", "gpu" for decode/,
    );
  });

  it('takes datasets of JPEG files only, naming a file that is not one', async () => {
    const transform = trainTransform();
    const options = { batchSize: 2, transform, decode: 'gpu', device: 'cuda' } as const;
    expect(() => new DataLoader(new ShapesDataset({ length: 4, size: 16 }), options)).toThrow(
      objectContaining({
        message: stringMatching(/decode: 'gpu' decodes JPEG files.*\(Shapes\) yields decoded images/),
      }),
    );
    const folder = await ImageFolder.open(mixed);
    expect(() => new DataLoader(folder, options)).toThrow(
      objectContaining({ message: stringMatching(/1 of the dataset's 2 files are not JPEGs.*two\.png/) }),
    );
    // A Subset is checked by the files it yields.
    const png = folder.spec().files.findIndex((f) => f.endsWith('.png'));
    expect(() => new DataLoader(new Subset(folder, [png]), options)).toThrow(/two\.png/);
  });

  it('names the transforms the device does not do', async () => {
    const dataset = await ImageFolder.open(jpegs);
    const make = (transform: Compose, deferFlip?: boolean) => () =>
      new DataLoader(dataset, {
        batchSize: 2,
        transform,
        decode: 'gpu',
        device: 'cuda',
        ...(deferFlip === undefined ? {} : { deferFlip }),
      });
    expect(make(new Compose([new RandomResizedCrop({ size: 24 }), new ColorJitter({ brightness: 0.4 })]))).toThrow(
      objectContaining({
        code: 'ERR_RC_INVALID_ARGUMENT',
        message: stringContaining('the device does not do ColorJitter (transforms[1])'),
      }),
    );
    expect(make(new Compose([new ColorJitter({ brightness: 0.4 }), new CenterCrop({ size: 8 })]))).toThrow(
      /transforms\[0\] is ColorJitter, not a crop or resize/,
    );
    expect(make(new Compose([new CenterCrop({ size: 8 })], { outputChannels: 1 }))).toThrow(/1-channel images/);
    expect(make(new Compose([new RandomResizedCrop({ size: 24 }), new Resize({ size: [20, 20] })]))).toThrow(
      /does not do Resize \(transforms\[1\]\)/,
    );
    // Without deferred flips, only a flip right after the crop is done (in the decode).
    const twoFlips = new Compose([
      new RandomResizedCrop({ size: 24 }),
      new RandomHorizontalFlip(),
      new RandomHorizontalFlip(),
    ]);
    expect(make(twoFlips, false)).toThrow(/RandomHorizontalFlip \(transforms\[2\]\).*only a flip right after/);
  });

  it('train --decode gpu: a usage error without a CUDA device or with a dataset of decoded images', async () => {
    const cpu = await runCli(['train', join(root, 'data'), '--decode', 'gpu'], root);
    expect(cpu.code).toBe(2);
    expect(cpu.stderr).toMatch(
      /--decode gpu decodes on the training device: use it with --device cuda or cuda:N, not cpu/,
    );
    const shapes = await runCli(['train', '--decode', 'gpu', '--device', 'cuda'], root);
    expect(shapes.code).toBe(2);
    expect(shapes.stderr).toMatch(/--decode gpu decodes JPEG files \(--dataset imagefolder\), not the shapes dataset/);
  });
});

describe.skipIf(reason !== undefined)(`decode: 'gpu' on CUDA${reason ? ` (skipped: ${reason})` : ''}`, () => {
  it('gives the CPU loader batches on the device, two shuffled epochs, with persistent workers and decodes ahead', async () => {
    const dataset = await ImageFolder.open(jpegs);
    const options = {
      batchSize: 4,
      transform: trainTransform(),
      shuffle: true,
      seed: 11,
      workers: 2,
      persistentWorkers: true,
    };
    const { cpu, gpu } = await both(dataset, options, 2, true);
    expect(gpu[0]!.map((b) => b.indices)).not.toEqual(gpu[1]!.map((b) => b.indices)); // reshuffled
    expect(gpu[0]!.map((b) => b.indices.length)).toEqual([4, 4, 3]);
    for (let e = 0; e < 2; e++) expectSameBatches(gpu[e]!, cpu[e]!);
  });

  it('without workers, with Resize + CenterCrop and flips mirrored in the decode, and dropLast', async () => {
    const dataset = await ImageFolder.open(jpegs);
    const transform = new Compose([
      new Resize({ size: 30 }),
      new CenterCrop({ size: [26, 28] }),
      new RandomHorizontalFlip(),
    ]);
    const options = { batchSize: 3, transform, seed: 2, shuffle: true, workers: 0, deferFlip: false, dropLast: true };
    const { cpu, gpu } = await both(dataset, options);
    expect(gpu[0]!.map((b) => b.indices.length)).toEqual([3, 3, 3]);
    expect(gpu[0]!.every((b) => b.flips.every((f) => f === 0))).toBe(true);
    expectSameBatches(gpu[0]!, cpu[0]!);
  });

  it('shards like the CPU loader (distributed) and resumes inside an epoch (setEpoch)', async () => {
    const dataset = await ImageFolder.open(jpegs);
    const shards: number[] = [];
    for (const rank of [0, 1]) {
      const options = { batchSize: 2, transform: trainTransform(), shuffle: true, workers: 1 };
      const cpu = new DataLoader(dataset, { ...options, distributed: { rank, worldSize: 2 } });
      const gpu = new DataLoader(dataset, {
        ...options,
        distributed: { rank, worldSize: 2 },
        decode: 'gpu',
        device: 'cuda',
      });
      try {
        cpu.setEpoch(3, 1);
        gpu.setEpoch(3, 1);
        const [c, g] = [await epoch(cpu), await epoch(gpu)];
        expect(g.map((b) => b.index)).toEqual([1, 2]);
        expectSameBatches(g, c);
        gpu.setEpoch(3);
        shards.push(...(await epoch(gpu)).flatMap((b) => b.indices));
      } finally {
        await cpu.close();
        await gpu.close();
      }
    }
    // 11 samples padded to 12: every sample in one of the two shards.
    expect(new Set(shards)).toEqual(new Set(Array.from({ length: 11 }, (_, i) => i)));
    expect(shards).toHaveLength(12);
  });

  it('hands over device tensors: toTensors on the loader device, images a host copy, stale batches refused', async () => {
    const dataset = await ImageFolder.open(jpegs);
    const loader = new DataLoader(dataset, {
      batchSize: 5,
      transform: trainTransform(),
      seed: 1,
      workers: 0,
      decode: 'gpu',
      device: 'cuda:0',
    });
    try {
      expect(loader.device).toBe('cuda:0');
      expect(loader.decode).toBe('gpu');
      let previous: Batch | undefined;
      for await (const batch of loader) {
        const { images, labels } = batch.toTensors();
        expect(images.device).toBe('cuda:0');
        expect(images.shape).toEqual([batch.size, 24, 24, 3]);
        expect(batch.shape).toEqual([batch.size, 24, 24, 3]);
        expect([...(labels.toArray() as Int32Array)]).toEqual([...batch.labels]);
        expect(batch.images).toEqual(images.toArray());
        expect(batch.toTensors('cuda').images).toBe(images);
        expect(() => batch.toTensors('cpu')).toThrow(/decoded on cuda:0.*not on cpu/);
        const stale = previous;
        if (stale) expect(() => stale.toTensors()).toThrow(objectContaining({ code: 'ERR_RC_DISPOSED' }));
        previous = batch;
      }
    } finally {
      await loader.close();
    }
  });

  it('stops on its abort signal and after close(), as the CPU loader does', async () => {
    const dataset = await ImageFolder.open(jpegs);
    const controller = new AbortController();
    const loader = new DataLoader(dataset, {
      batchSize: 2,
      transform: trainTransform(),
      workers: 1,
      decode: 'gpu',
      device: 'cuda',
      signal: controller.signal,
    });
    let seen = 0;
    await expect(
      (async () => {
        for await (const batch of loader) {
          batch.toTensors();
          if (++seen === 2) controller.abort(new Error('stop here'));
        }
      })(),
    ).rejects.toThrow('stop here');
    expect(seen).toBe(2);
    expect(loader.activeWorkers).toBe(0);
    await loader.close();
    expect(() => loader[Symbol.asyncIterator]()).toThrow(objectContaining({ code: 'ERR_RC_DISPOSED' }));
  });

  it('names the file that does not decode, and the sample', async () => {
    const dir = join(root, 'broken');
    mkdirSync(join(dir, 'a'), { recursive: true });
    const good = await sharp(photo(30, 30), { raw: { width: 30, height: 30, channels: 3 } })
      .jpeg()
      .toBuffer();
    writeFileSync(join(dir, 'a', 'good.jpg'), good);
    writeFileSync(join(dir, 'a', 'not-really.jpg'), Buffer.from('not a JPEG at all'));
    const dataset = await ImageFolder.open(dir);
    for (const workers of [0, 1]) {
      const loader = new DataLoader(dataset, {
        batchSize: 2,
        transform: new Compose([new CenterCrop({ size: 16 })]),
        workers,
        decode: 'gpu',
        device: 'cuda',
      });
      try {
        await expect(epoch(loader)).rejects.toThrow(
          objectContaining({
            name: 'DataLoaderError',
            code: 'ERR_RC_CORRUPT_FILE',
            index: 1,
            path: stringContaining('not-really.jpg'),
            message: stringMatching(/not a JPEG/),
          }),
        );
      } finally {
        await loader.close();
      }
    }
  });

  it('trains as the CPU-decoded loader does: the same losses step by step (Trainer, eager and CUDA graph)', async () => {
    const dataset = await ImageFolder.open(jpegs);
    const run = async (decode: 'cpu' | 'gpu', cudaGraph: boolean): Promise<number[]> => {
      const model = new Sequential(
        new Conv2d({ inChannels: 3, outChannels: 4, kernelSize: 3, stride: 2, padding: 1, seed: 1 }),
        new BatchNorm2d({ numFeatures: 4 }),
        new ReLU(),
        new AdaptiveAvgPool2d(1),
        new Flatten(),
        new Linear({ inFeatures: 4, outFeatures: 3, seed: 2 }),
      ).to('cuda');
      const transform = new Compose([
        new RandomResizedCrop({ size: 16 }),
        new RandomHorizontalFlip(),
        new Normalize({ mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] }),
      ]);
      const options = { batchSize: 4, transform, shuffle: true, seed: 4, workers: 1, dropLast: true };
      const loader = new DataLoader(dataset, { ...options, decode, device: 'cuda' });
      const losses: number[] = [];
      const trainer = new Trainer({
        model,
        optimizer: new SGD(model, { lr: 0.1, momentum: 0.9 }),
        device: 'cuda',
        progress: false,
        jsonLog: false,
        tensorboard: false,
        plots: false,
        cudaGraph,
        callbacks: [
          {
            onStepEnd: (_t, info) => {
              losses.push(info.loss());
            },
          },
        ],
      });
      try {
        await trainer.fit(loader, { epochs: 2 });
      } finally {
        await loader.close();
      }
      return losses;
    };
    const cpu = await run('cpu', false);
    expect(cpu).toHaveLength(4);
    for (const cudaGraph of [false, true]) {
      const gpu = await run('gpu', cudaGraph);
      expect(gpu).toHaveLength(cpu.length);
      gpu.forEach((loss, i) => expect(loss).toBeCloseTo(cpu[i]!, emulated ? 6 : 2));
    }
  });
});
