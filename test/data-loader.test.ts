import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, assert, beforeAll, describe, expect, it } from 'vitest';
import { InputNormalize, Tensor } from '../lib/index.js';
import { ImageFolder } from '../lib/data/image-folder.js';
import { DataLoader, DataLoaderError, type Batch } from '../lib/data/loader.js';
import { DistributedSampler, RandomSampler, SequentialSampler } from '../lib/data/sampler.js';
import { ShapesDataset } from '../lib/data/shapes-dataset.js';
import { SyntheticDataset } from '../lib/data/synthetic.js';
import { workerExecArgv } from '../lib/data/worker-flags.js';
import { stringMatching } from './helpers/matchers.js';
import {
  CenterCrop,
  ColorJitter,
  Compose,
  RandomHorizontalFlip,
  RandomResizedCrop,
  Resize,
} from '../lib/data/transforms.js';

/** A batch's contents copied out of the shared slot (which the loader reuses). */
interface Copied {
  images: Uint8Array;
  labels: number[];
  flips: number[];
  indices: number[];
  shape: number[];
}

function copy(batch: Batch): Copied {
  return {
    images: batch.images.slice(),
    labels: [...batch.labels],
    flips: [...batch.flips],
    indices: [...batch.indices],
    shape: [...batch.shape],
  };
}

async function epoch(loader: DataLoader): Promise<Copied[]> {
  const out: Copied[] = [];
  for await (const batch of loader) out.push(copy(batch));
  return out;
}

const shapes = new ShapesDataset({ length: 40, size: 16, classes: 4, seed: 1 });
const augment = () => new Compose([new RandomResizedCrop({ size: 12 }), new RandomHorizontalFlip()]);

let root: string;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), 'resnet-cuda-loader-test-'));
  await ShapesDataset.writeImageFolder(join(root, 'images'), {
    count: 24,
    size: 28,
    classes: 3,
    seed: 2,
    format: 'jpeg',
  });
});

afterAll(() => {
  rmSync(root, { recursive: true, force: true });
});

describe('samplers', () => {
  it('SequentialSampler and RandomSampler', () => {
    expect([...new SequentialSampler({ length: 5 })]).toEqual([0, 1, 2, 3, 4]);
    const a = new RandomSampler({ length: 50, seed: 9 });
    const b = new RandomSampler({ length: 50, seed: 9 });
    const e0 = [...a];
    expect(e0).toEqual([...b]);
    expect([...e0].sort((x, y) => x - y)).toEqual(Array.from({ length: 50 }, (_, i) => i));
    a.setEpoch(1);
    const e1 = [...a];
    expect(e1).not.toEqual(e0);
    expect([...e1].sort((x, y) => x - y)).toEqual(Array.from({ length: 50 }, (_, i) => i));
    a.setEpoch(0);
    expect([...a]).toEqual(e0);
    expect([...new RandomSampler({ length: 50, seed: 10 })]).not.toEqual(e0);
  });

  it('DistributedSampler pads like PyTorch, partitions, and drops the tail with dropLast', () => {
    // PyTorch, 10 samples on 3 ranks without shuffling: [0..9, 0, 1] dealt out rank by rank.
    const plain = [0, 1, 2].map((rank) => [
      ...new DistributedSampler({ length: 10, rank, worldSize: 3, shuffle: false }),
    ]);
    expect(plain).toEqual([
      [0, 3, 6, 9],
      [1, 4, 7, 0],
      [2, 5, 8, 1],
    ]);
    for (const [length, worldSize] of [
      [10, 3],
      [12, 4],
      [5, 8],
      [1, 3],
    ] as const) {
      for (const dropLast of [false, true]) {
        const samplers = Array.from(
          { length: worldSize },
          (_, rank) => new DistributedSampler({ length, rank, worldSize, seed: 3, dropLast }),
        );
        for (const epochNumber of [0, 1]) {
          samplers.forEach((s) => s.setEpoch(epochNumber));
          const parts = samplers.map((s) => [...s]);
          const per = dropLast ? Math.floor(length / worldSize) : Math.ceil(length / worldSize);
          for (const p of parts) expect(p.length).toBe(per);
          expect(samplers[0]!.length).toBe(per);
          const all = parts.flat();
          if (dropLast) {
            // Disjoint, and only the tail of the permutation is missing.
            expect(new Set(all).size).toBe(all.length);
          } else {
            // Every sample is covered; the padding repeats some.
            expect(new Set(all).size).toBe(length);
            expect(all.length).toBe(per * worldSize);
          }
          if (length % worldSize === 0) expect(new Set(all).size).toBe(length);
        }
      }
    }
    // The epoch reshuffles, the same on every rank.
    const r0 = new DistributedSampler({ length: 100, rank: 0, worldSize: 2 });
    const first = [...r0];
    r0.setEpoch(1);
    expect([...r0]).not.toEqual(first);
    expect(() => new DistributedSampler({ length: 10, rank: 3, worldSize: 3 })).toThrow(/rank/);
  });
});

describe('DataLoader', () => {
  it('delivers batches of the right shapes, labels and sizes, in sampler order, with dropLast', async () => {
    const loader = new DataLoader(shapes, { batchSize: 16, transform: augment(), workers: 0, seed: 5 });
    expect(loader.length).toBe(3);
    const batches = await epoch(loader);
    expect(batches.map((b) => b.shape)).toEqual([
      [16, 12, 12, 3],
      [16, 12, 12, 3],
      [8, 12, 12, 3],
    ]);
    expect(batches.flatMap((b) => b.indices)).toEqual(Array.from({ length: 40 }, (_, i) => i));
    for (const b of batches) {
      expect(b.images.length).toBe(b.shape[0]! * 12 * 12 * 3);
      expect(b.labels).toEqual(b.indices.map((i) => shapes.label(i)));
      expect(b.flips.every((f) => f === 0 || f === 1)).toBe(true);
    }
    const flips = batches.flatMap((b) => b.flips);
    expect(flips).toContain(0);
    expect(flips).toContain(1);

    const dropping = new DataLoader(shapes, {
      batchSize: 16,
      transform: augment(),
      workers: 0,
      dropLast: true,
      seed: 5,
    });
    expect(dropping.length).toBe(2);
    const kept = await epoch(dropping);
    expect(kept.map((b) => b.shape[0])).toEqual([16, 16]);
    // Same seed and epoch, so the same samples.
    expect(kept[1]!.images).toEqual(batches[1]!.images);
  });

  it('shuffles by seed and epoch, and replays an epoch exactly', async () => {
    const make = (seed: number) =>
      new DataLoader(shapes, { batchSize: 8, transform: augment(), workers: 0, shuffle: true, seed });
    const a = make(7);
    const b = make(7);
    const a0 = await epoch(a);
    const a1 = await epoch(a); // epochs count automatically
    const b0 = await epoch(b);
    const order = (bs: Copied[]) => bs.flatMap((x) => x.indices);
    expect(order(a0)).toEqual(order(b0));
    expect(a0).toEqual(b0);
    expect(order(a1)).not.toEqual(order(a0));
    expect([...order(a1)].sort((x, y) => x - y)).toEqual(Array.from({ length: 40 }, (_, i) => i));
    expect(order(await epoch(make(8)))).not.toEqual(order(a0));
    a.setEpoch(0);
    expect(await epoch(a)).toEqual(a0);
    expect(a.epoch).toBe(1);
  });

  it('starts an epoch at a given batch without loading the earlier ones, with the batches of the whole epoch', async () => {
    const dataset = await ImageFolder.open(join(root, 'images'));
    for (const workers of [0, 2]) {
      const loader = new DataLoader(dataset, { batchSize: 5, transform: augment(), shuffle: true, seed: 3, workers });
      try {
        loader.setEpoch(2);
        const whole = await epoch(loader);
        const indexes: number[] = [];
        loader.setEpoch(2, 3);
        const tail: Copied[] = [];
        for await (const batch of loader) {
          indexes.push(batch.index);
          tail.push(copy(batch));
        }
        expect(indexes).toEqual([3, 4]);
        expect(tail).toEqual(whole.slice(3));
        expect(loader.epoch).toBe(3);
        // The start applies to one iteration; past the end, the epoch is empty.
        loader.setEpoch(2);
        expect((await epoch(loader)).length).toBe(5);
        loader.setEpoch(2, 9);
        expect(await epoch(loader)).toEqual([]);
        expect(() => loader.setEpoch(0, -1)).toThrow(/startBatch/);
      } finally {
        await loader.close();
      }
    }
    // Without workers the skipped samples are not even read.
    let reads = 0;
    const counting = {
      get length() {
        return shapes.length;
      },
      get classes() {
        return shapes.classes;
      },
      get: (i: number) => {
        reads++;
        return shapes.get(i);
      },
      label: (i: number) => shapes.label(i),
      spec: () => shapes.spec(),
    };
    const inline = new DataLoader(counting, {
      batchSize: 8,
      transform: augment(),
      workers: 0,
    });
    inline.setEpoch(0, 4);
    expect((await epoch(inline)).length).toBe(1);
    expect(reads).toBe(8);
  });

  it('gives byte-identical batches with 0 and with 2 workers, and keeps persistent workers', async () => {
    const dataset = await ImageFolder.open(join(root, 'images'));
    const transform = new Compose([
      new RandomResizedCrop({ size: 20, scale: [0.3, 1] }),
      new RandomHorizontalFlip(),
      new ColorJitter({ brightness: 0.4, contrast: 0.4, saturation: 0.4 }),
    ]);
    const options = { batchSize: 5, transform, shuffle: true, seed: 11 };
    const inline = new DataLoader(dataset, { ...options, workers: 0 });
    const threaded = new DataLoader(dataset, { ...options, workers: 2, prefetch: 1, persistentWorkers: true });
    try {
      for (let e = 0; e < 2; e++) {
        const expected = await epoch(inline);
        const got = await epoch(threaded);
        expect(got.map((b) => b.shape[0])).toEqual([5, 5, 5, 5, 4]);
        expect(got).toEqual(expected);
        expect(got.flatMap((b) => b.labels)).toEqual(got.flatMap((b) => b.indices.map((i) => dataset.label(i))));
        expect(threaded.activeWorkers).toBe(2);
      }
      // Leaving an epoch early keeps persistent workers, and the next epoch is whole and right.
      for await (const batch of threaded) {
        expect(batch.index).toBe(0);
        break;
      }
      expect(threaded.activeWorkers).toBe(2);
      inline.setEpoch(3);
      expect(await epoch(threaded)).toEqual(await epoch(inline));
    } finally {
      await threaded.close();
    }
    expect(threaded.activeWorkers).toBe(0);
  });

  it('stops non-persistent workers at the end of an epoch and when the loop is left early', async () => {
    const loader = new DataLoader(shapes, { batchSize: 4, transform: augment(), workers: 2, seed: 1 });
    let seen = 0;
    for await (const batch of loader) {
      expect(loader.activeWorkers).toBe(2);
      expect(batch.size).toBe(4);
      if (++seen === 2) break;
    }
    expect(loader.activeWorkers).toBe(0);
    // The next epoch starts fresh workers and runs to the end.
    const all = await epoch(loader);
    expect(all.length).toBe(10);
    expect(loader.activeWorkers).toBe(0);
    await loader.close();
  });

  it('reports a corrupt file from a worker with its path, index and code, then stops the workers', async () => {
    const dir = join(root, 'corrupt');
    const written = await ShapesDataset.writeImageFolder(dir, {
      count: 12,
      size: 24,
      classes: 3,
      seed: 4,
      format: 'jpeg',
    });
    const bad = written[7]!;
    writeFileSync(bad, Buffer.from('this is not a JPEG file at all'));
    const dataset = await ImageFolder.open(dir);
    let badIndex = -1;
    for (let i = 0; i < dataset.length; i++) {
      const s = await dataset.get(i);
      if (s.source.kind === 'encoded' && s.source.path === bad) badIndex = i;
    }
    expect(badIndex).toBeGreaterThanOrEqual(0);
    const transform = new Compose([new Resize({ size: 16 }), new CenterCrop({ size: 16 })]);
    for (const workers of [2, 0]) {
      const loader = new DataLoader(dataset, { batchSize: 3, transform, workers });
      let error: unknown;
      try {
        await epoch(loader);
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(DataLoaderError);
      const e = error as DataLoaderError;
      expect(e.message).toContain(bad);
      expect(e.message).toContain(`dataset index ${badIndex}`);
      expect(e.code).toBe('ERR_RC_CORRUPT_FILE');
      expect(e.path).toBe(bad);
      expect(e.index).toBe(badIndex);
      expect(e.worker).toBe(workers === 0 ? undefined : e.worker);
      if (workers > 0) expect(e.worker).toBeTypeOf('number');
      expect(loader.activeWorkers).toBe(0);
      await loader.close();
    }
  });

  it('reports a file that disappeared the same way from a worker (which reads it synchronously) and from the main thread', async () => {
    const dir = join(root, 'vanishing');
    const written = await ShapesDataset.writeImageFolder(dir, {
      count: 6,
      size: 20,
      classes: 2,
      seed: 6,
      format: 'jpeg',
    });
    const dataset = await ImageFolder.open(dir);
    const index = 4;
    const gone = dataset.path(index);
    expect(written).toContain(gone);
    // The synchronous read of a worker gives the bytes and label of the asynchronous one.
    expect(dataset.getSync(index)).toEqual(await dataset.get(index));
    rmSync(gone);
    const transform = new Compose([new Resize({ size: 16 }), new CenterCrop({ size: 16 })]);
    const errors: DataLoaderError[] = [];
    for (const workers of [1, 0]) {
      const loader = new DataLoader(dataset, { batchSize: 3, transform, workers });
      const error = await epoch(loader).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(DataLoaderError);
      errors.push(error as DataLoaderError);
      await loader.close();
    }
    for (const e of errors) {
      expect(e.code).toBe('ERR_RC_DATASET');
      expect(e.path).toBe(gone);
      expect(e.index).toBe(index);
      expect(e.message).toContain(`Cannot read sample ${index}`);
      expect(e.message).toContain('ENOENT');
    }
    expect(errors[0]!.worker).toBe(0);
    expect(errors[1]!.worker).toBeUndefined();
  });

  it('toTensors copies into reused tensors; InputNormalize with the flips equals flipping the pixels', async () => {
    const options = { batchSize: 8, transform: augment(), workers: 0, shuffle: true, seed: 21 };
    const loader = new DataLoader(shapes, options);
    const eager = new DataLoader(shapes, { ...options, deferFlip: false });
    const normalize = new InputNormalize({ mean: [0.5, 0.4, 0.3], std: [0.2, 0.25, 0.3] });
    const eagerIterator = eager[Symbol.asyncIterator]();
    let previous: { images: Tensor; labels: Tensor } | undefined;
    let flipped = 0;
    let last: Batch | undefined;
    for await (const batch of loader) {
      const eagerBatch = (await eagerIterator.next()).value as Batch;
      const t = batch.toTensors();
      expect(t.images.shape).toEqual([8, 12, 12, 3]);
      expect(t.images.dtype).toBe('u8');
      expect(t.labels.dtype).toBe('i32');
      expect(t.images.toArray()).toEqual(batch.images);
      expect(t.labels.toArray()).toEqual(batch.labels);
      if (previous) expect(t.images).toBe(previous.images); // reused, not reallocated
      previous = t;

      // Mirror the flagged samples on the host: the same pixels as the loader without deferral.
      const [n, h, w, c] = batch.shape;
      const mirrored = batch.images.slice();
      for (let s = 0; s < n; s++) {
        if (!batch.flips[s]) continue;
        flipped++;
        for (let y = 0; y < h; y++) {
          for (let x = 0; x < w; x++) {
            const src = ((s * h + y) * w + x) * c;
            const dst = ((s * h + y) * w + (w - 1 - x)) * c;
            for (let k = 0; k < c; k++) mirrored[dst + k] = batch.images[src + k]!;
          }
        }
      }
      expect(eagerBatch.images).toEqual(mirrored);
      expect([...eagerBatch.flips]).toEqual(new Array(n).fill(0));

      const onDevice = normalize.forward(t.images, batch.flips).toFloat32Array();
      const host = Tensor.from(mirrored, batch.shape, { dtype: 'u8' });
      expect(normalize.forward(host).toFloat32Array()).toEqual(onDevice);
      host.dispose();
      last = batch;
    }
    expect(flipped).toBeGreaterThan(0);
    assert.isDefined(last, 'the loader yielded batches');
    expect(() => last.toTensors()).toThrow(/no longer current/);
    await eagerIterator.return?.();
    normalize.dispose();
    await loader.close();
    assert.isDefined(previous, 'the loader yielded batches');
    expect(previous.images.disposed).toBe(true);
  });

  it('reads one rank’s share with the distributed option', async () => {
    const parts: number[][] = [];
    for (const rank of [0, 1, 2]) {
      const loader = new DataLoader(shapes, {
        batchSize: 6,
        transform: augment(),
        workers: 0,
        shuffle: true,
        seed: 3,
        distributed: { rank, worldSize: 3 },
      });
      expect(loader.sampler).toBeInstanceOf(DistributedSampler);
      const batches = await epoch(loader);
      expect(batches.map((b) => b.shape[0])).toEqual([6, 6, 2]);
      parts.push(batches.flatMap((b) => b.indices));
    }
    expect(new Set(parts.flat()).size).toBe(40);
  });

  it('rejects transforms without a fixed output size and conflicting options', () => {
    expect(() => new DataLoader(shapes, { batchSize: 4, transform: new Compose([new Resize({ size: 12 })]) })).toThrow(
      /fixed output size/,
    );
    expect(
      () =>
        new DataLoader(shapes, {
          batchSize: 4,
          transform: augment(),
          sampler: new SequentialSampler({ length: 40 }),
          shuffle: true,
        }),
    ).toThrow(/sampler or shuffle/);
    expect(() => new DataLoader(shapes, { batchSize: 0, transform: augment() })).toThrow(/batchSize/);
    expect(() => new DataLoader(shapes, { batchSize: 4, transform: augment(), wrokers: 2 } as never)).toThrow(
      /Unknown option 'wrokers'/,
    );
  });

  it('reports a dataset that workers cannot rebuild', async () => {
    const custom = {
      length: 4,
      classes: ['a'],
      label: () => 0,
      get: (i: number) => shapes.get(i),
      spec: () => ({ kind: 'MyOwnDataset' }),
    };
    const loader = new DataLoader(custom, { batchSize: 2, transform: augment(), workers: 1 });
    const namesTheDataset: unknown = expect.stringMatching(/could not rebuild.*MyOwnDataset/);
    await expect(epoch(loader)).rejects.toMatchObject({ code: 'ERR_RC_DATASET', message: namesTheDataset });
    expect(loader.activeWorkers).toBe(0);
    // In the main thread it works.
    const inline = new DataLoader(custom, { batchSize: 2, transform: augment(), workers: 0 });
    expect((await epoch(inline)).length).toBe(2);
  });

  it('fails a running epoch when the loader is closed', async () => {
    const loader = new DataLoader(shapes, { batchSize: 2, transform: augment(), workers: 1, prefetch: 1 });
    const iterator = loader[Symbol.asyncIterator]();
    expect((await iterator.next()).done).toBe(false);
    await loader.close();
    await expect(iterator.next()).rejects.toThrow(/closed/);
    expect(loader.activeWorkers).toBe(0);
  });

  it.skipIf(!existsSync('/proc/self/maps'))(
    'decodes JPEGs without loading sharp (libvips), which a PNG then loads',
    async () => {
      const png = join(root, 'png');
      await ShapesDataset.writeImageFolder(png, { count: 3, size: 16, classes: 3, seed: 1, format: 'png' });
      const index = pathToFileURL(fileURLToPath(new URL('../dist/lib/index.js', import.meta.url))).href;
      const script = join(root, 'lazy-sharp.mjs');
      writeFileSync(
        script,
        `import { readFileSync } from 'node:fs';
import { Compose, DataLoader, ImageFolder, RandomResizedCrop } from ${JSON.stringify(index)};
const vips = () => readFileSync('/proc/self/maps', 'utf8').includes('libvips');
const report = [vips()];
const dataset = await ImageFolder.open(${JSON.stringify(join(root, 'images'))});
let n = 0;
for await (const b of new DataLoader(dataset, { batchSize: 6, transform: new Compose([new RandomResizedCrop({ size: 12 })]), workers: 2 })) n += b.size;
report.push(n, vips());
for await (const b of new DataLoader(await ImageFolder.open(${JSON.stringify(png)}), { batchSize: 3, transform: new Compose([new RandomResizedCrop({ size: 12 })]), workers: 1 })) n += b.size;
report.push(n, vips());
console.log(JSON.stringify(report));
`,
      );
      const child = spawnSync(process.execPath, [script], { encoding: 'utf8', timeout: 60_000 });
      expect(child.stderr).toBe('');
      // Mapped by the worker that decoded the PNGs (the process's libraries are shared by its threads).
      expect(JSON.parse(child.stdout)).toEqual([false, 24, false, 27, true]);
    },
  );

  it('starts workers from a program given with --eval and --input-type (workers get only the flags that suit them)', () => {
    const program = `import { DataLoader, ShapesDataset } from ${JSON.stringify(pathToFileURL(fileURLToPath(new URL('../dist/lib/index.js', import.meta.url))).href)};
let n = 0;
for await (const b of new DataLoader(new ShapesDataset({ length: 8, size: 8, seed: 1 }), { batchSize: 4, workers: 1 })) n += b.size;
console.log('samples', n);`;
    for (const flags of [
      ['--input-type=module', '-e'],
      ['--input-type', 'module', '--eval'],
      ['--no-warnings', '--input-type=module', '--eval'],
    ]) {
      const child = spawnSync(process.execPath, [...flags, program], { encoding: 'utf8', timeout: 60_000 });
      expect(child.stderr).toBe('');
      expect(child.stdout.trim()).toBe('samples 8');
    }
  });

  it('keeps the Node flags that suit a worker and drops those that choose the main program', () => {
    expect(
      workerExecArgv([
        '--input-type',
        'module',
        '-e',
        'code',
        '--require',
        './hook.cjs',
        '--max-old-space-size=100',
        '-pe',
        '1',
        '--eval=2',
        '--import',
        'tsx',
        '--watch',
        '--check',
      ]),
    ).toEqual(['--require', './hook.cjs', '--max-old-space-size=100', '--import', 'tsx']);
  });

  it('warns that workers outnumber the threadpool only when sharp decodes (PNG), not for natively decoded JPEGs', async () => {
    const threadpool = process.env.UV_THREADPOOL_SIZE;
    delete process.env.UV_THREADPOOL_SIZE;
    const warnings: string[] = [];
    const listen = (w: Error): void => {
      if (w.message.includes('threadpool')) warnings.push(w.message);
    };
    process.on('warning', listen);
    try {
      const transform = new Compose([new RandomResizedCrop({ size: 8 })]);
      await epoch(
        new DataLoader(await ImageFolder.open(join(root, 'images')), { batchSize: 4, transform, workers: 5 }),
      );
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings).toEqual([]);
      const png = join(root, 'png-threadpool');
      await ShapesDataset.writeImageFolder(png, { count: 10, size: 12, classes: 2, seed: 3, format: 'png' });
      await epoch(new DataLoader(await ImageFolder.open(png), { batchSize: 2, transform, workers: 5 }));
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toMatch(/5 workers decode with sharp/);
    } finally {
      process.off('warning', listen);
      if (threadpool !== undefined) process.env.UV_THREADPOOL_SIZE = threadpool;
    }
  });

  it('needs no transform for in-memory images of one size, and keeps their channels', async () => {
    for (const workers of [0, 1]) {
      const batches = await epoch(new DataLoader(shapes, { batchSize: 16, workers }));
      expect(batches.map((b) => b.shape)).toEqual([
        [16, 16, 16, 3],
        [16, 16, 16, 3],
        [8, 16, 16, 3],
      ]);
      const first = await shapes.get(0);
      expect(batches[0]!.images.subarray(0, 16 * 16 * 3)).toEqual(
        (first.source as { image: { data: Uint8Array } }).image.data,
      );
    }
    const grey = new SyntheticDataset({ length: 4, height: 5, width: 7, channels: 1, seed: 2 });
    expect((await epoch(new DataLoader(grey, { batchSize: 4, workers: 0 })))[0]!.shape).toEqual([4, 5, 7, 1]);
    const files = await ImageFolder.open(join(root, 'images'));
    expect(() => new DataLoader(files, { batchSize: 4 })).toThrow(/needs a transform.*different sizes/);
  });

  it('reports batch buffers too large to allocate as out of memory, with the size and what to try', async () => {
    const large = new SyntheticDataset({ length: 4, height: 224, width: 224, channels: 3, seed: 2 });
    const loader = new DataLoader(large, { batchSize: 100_000_000, workers: 0 });
    const error: unknown = await epoch(loader).then(
      () => null,
      (e: unknown) => e,
    );
    expect(error).toMatchObject({ code: 'ERR_RC_OUT_OF_MEMORY', message: stringMatching(/GiB.*smaller batchSize/) });
    await loader.close();
  });

  it('stops on an AbortSignal: the running epoch fails with its reason, the workers end, later epochs refuse to start', async () => {
    for (const workers of [0, 1]) {
      const controller = new AbortController();
      const loader = new DataLoader(shapes, {
        batchSize: 2,
        transform: augment(),
        workers,
        prefetch: 1,
        signal: controller.signal,
      });
      const iterator = loader[Symbol.asyncIterator]();
      expect((await iterator.next()).done).toBe(false);
      controller.abort();
      await expect(iterator.next()).rejects.toMatchObject({ name: 'AbortError' });
      expect(loader.activeWorkers).toBe(0);
      await expect(epoch(loader)).rejects.toMatchObject({ name: 'AbortError' });
      await loader.close();
    }
    const aborted = AbortSignal.abort(new Error('stop now'));
    await expect(
      epoch(new DataLoader(shapes, { batchSize: 2, transform: augment(), workers: 0, signal: aborted })),
    ).rejects.toThrow(/stop now/);
    expect(() => new DataLoader(shapes, { batchSize: 2, signal: {} as AbortSignal })).toThrow(/signal/);
  });

  it('closes once, by close() or Symbol.asyncDispose (await using), any number of times', async () => {
    const loader = new DataLoader(shapes, { batchSize: 4, transform: augment(), workers: 1, persistentWorkers: true });
    await epoch(loader);
    expect(loader.activeWorkers).toBe(1);
    expect(typeof loader[Symbol.asyncDispose]).toBe('function');
    await loader[Symbol.asyncDispose]();
    expect(loader.activeWorkers).toBe(0);
    await loader.close();
    await loader[Symbol.asyncDispose]();
    expect(() => loader[Symbol.asyncIterator]()).toThrow(/closed/);
  });

  it('lets a process that used workers (persistent ones included, left unclosed) exit by itself', () => {
    const dist = (p: string) => pathToFileURL(fileURLToPath(new URL(`../dist/lib/data/${p}`, import.meta.url))).href;
    const script = join(root, 'child.mjs');
    writeFileSync(
      script,
      `import { DataLoader } from ${JSON.stringify(dist('loader.js'))};
import { ShapesDataset } from ${JSON.stringify(dist('shapes-dataset.js'))};
import { Compose, RandomResizedCrop } from ${JSON.stringify(dist('transforms.js'))};
const dataset = new ShapesDataset({ length: 20, size: 16, seed: 1 });
const transform = new Compose([new RandomResizedCrop({ size: 8 })]);
let n = 0;
for await (const b of new DataLoader(dataset, { batchSize: 4, transform, workers: 2 })) n += b.size;
const persistent = new DataLoader(dataset, { batchSize: 4, transform, workers: 2, persistentWorkers: true });
for await (const b of persistent) n += b.size;
for await (const b of persistent) { n += b.size; break; }
console.log('samples', n, 'workers', persistent.activeWorkers);
`,
    );
    const started = Date.now();
    const child = spawnSync(process.execPath, [script], { encoding: 'utf8', timeout: 30_000 });
    const elapsed = Date.now() - started;
    expect(child.stderr).toBe('');
    expect(child.status).toBe(0);
    expect(child.stdout.trim()).toBe('samples 44 workers 2');
    // It returned on its own (spawnSync kills it at the timeout, giving status null).
    expect(elapsed).toBeLessThan(30_000);
  });
});
