import { mkdirSync, mkdtempSync, rmSync, writeFileSync, existsSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { gzipSync } from 'node:zlib';
import sharp from 'sharp';
import { afterAll, assert, beforeAll, describe, expect, expectTypeOf, it } from 'vitest';
import { CIFAR10_CLASSES, CifarDataset } from '../lib/data/cifar.js';
import { compareCodePoints } from '../lib/data/dataset.js';
import { generateShapes } from '../lib/data/generated.js';
import { IdxDataset } from '../lib/data/idx.js';
import { ImageFiles } from '../lib/data/image-files.js';
import { INDEX_FILE_NAME, ImageFolder } from '../lib/data/image-folder.js';
import { DATASET_KINDS, datasetFromSpec } from '../lib/data/registry.js';
import { ShapesDataset } from '../lib/data/shapes-dataset.js';
import { Subset, randomSplit, splitLengths } from '../lib/data/split.js';
import { SyntheticDataset } from '../lib/data/synthetic.js';
import type { Dataset, DecodedImage, RawSample } from '../lib/data/types.js';
import { Random } from '../lib/random.js';

let tmp: string;
beforeAll(() => {
  tmp = mkdtempSync(path.join(tmpdir(), 'resnet-cuda-datasets-'));
});
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
});

/** A fresh folder under the test's temporary directory. */
let folders = 0;
function freshDir(name: string): string {
  const dir = path.join(tmp, `${name}-${folders++}`);
  mkdirSync(dir, { recursive: true });
  return dir;
}

function randomBytes(n: number, seed: number): Uint8Array {
  const rng = new Random(seed);
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = rng.int(256);
  return out;
}

async function writePng(file: string, seed: number, size = 8): Promise<void> {
  mkdirSync(path.dirname(file), { recursive: true });
  await sharp(randomBytes(size * size * 3, seed), { raw: { width: size, height: size, channels: 3 } })
    .png()
    .toFile(file);
}

function decoded(sample: RawSample): DecodedImage {
  if (sample.source.kind !== 'decoded') throw new Error('expected a decoded sample');
  return sample.source.image;
}

async function decodeFile(sample: RawSample): Promise<Uint8Array> {
  if (sample.source.kind !== 'encoded') throw new Error('expected an encoded sample');
  const { data } = await sharp(sample.source.bytes).raw().toBuffer({ resolveWithObject: true });
  return new Uint8Array(data);
}

/** The same length, classes, labels and sample contents. */
async function expectSameDataset(a: Dataset, b: Dataset, sampleIndices?: number[]): Promise<void> {
  expect(b.length).toBe(a.length);
  expect([...b.classes]).toEqual([...a.classes]);
  for (let i = 0; i < a.length; i++) expect(b.label(i)).toBe(a.label(i));
  for (const i of sampleIndices ?? Array.from({ length: a.length }, (_, k) => k)) {
    const [x, y] = await Promise.all([a.get(i), b.get(i)]);
    expect(y.label).toBe(x.label);
    expect(y.source.kind).toBe(x.source.kind);
    if (x.source.kind === 'encoded' && y.source.kind === 'encoded') {
      expect(y.source.path).toBe(x.source.path);
      expect(Buffer.from(y.source.bytes).equals(Buffer.from(x.source.bytes))).toBe(true);
    } else {
      const [ix, iy] = [decoded(x), decoded(y)];
      expect([iy.height, iy.width, iy.channels]).toEqual([ix.height, ix.width, ix.channels]);
      expect(Buffer.from(iy.data).equals(Buffer.from(ix.data))).toBe(true);
    }
  }
}

async function rejectsWith(promise: Promise<unknown>, code: string, ...fragments: string[]): Promise<Error> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  assert.instanceOf(error, Error, 'expected a rejection');
  expect(error).toHaveProperty('code', code);
  for (const f of fragments) expect(error.message).toContain(f);
  return error;
}

/** A dataset of labels only, for the split tests. */
function labelsDataset(labels: number[]): Dataset {
  return {
    length: labels.length,
    classes: [...new Set(labels)].sort((a, b) => a - b).map(String),
    label: (i) => labels[i]!,
    get: (i) =>
      Promise.resolve({
        source: { kind: 'decoded', image: { data: new Uint8Array([i & 255]), height: 1, width: 1, channels: 1 } },
        label: labels[i]!,
      }),
    spec: () => ({ kind: 'Labels' }),
  };
}

describe('ImageFolder', () => {
  it('loads generated shapes with torchvision class order and labels, and the pixels written', async () => {
    const root = freshDir('shapes');
    const written = await ShapesDataset.writeImageFolder(root, {
      count: 24,
      size: 16,
      classes: 3,
      seed: 5,
      format: 'png',
    });
    const source = new ShapesDataset({ length: 24, size: 16, classes: 3, seed: 5 });
    const folder = await ImageFolder.open(root);
    expect(folder.classes).toEqual(['circle', 'square', 'triangle']);
    expect(folder.length).toBe(24);
    expect(folder.fromCache).toBe(false);
    expect(folder.skipped).toEqual([]);
    const byPath = new Map(written.map((file, i) => [file, i]));
    let previous = '';
    for (let i = 0; i < folder.length; i++) {
      const sample = await folder.get(i);
      if (sample.source.kind !== 'encoded') throw new Error('expected encoded');
      const className = path.basename(path.dirname(sample.source.path));
      expect(sample.label).toBe(folder.classToIdx.get(className));
      expect(folder.label(i)).toBe(sample.label);
      // Sample order: by class, then by file name.
      const key = `${String(sample.label).padStart(3, '0')}/${path.basename(sample.source.path)}`;
      expect(compareCodePoints(previous, key)).toBeLessThan(0);
      previous = key;
      const original = byPath.get(sample.source.path);
      assert.isDefined(original, sample.source.path);
      expect(folder.classes[sample.label]).toBe(source.classes[source.label(original)]);
      expect(Buffer.from(await decodeFile(sample)).equals(Buffer.from(decoded(await source.get(original)).data))).toBe(
        true,
      );
    }
    // Another seed draws other images (JPEG this time).
    const jpegRoot = freshDir('shapes-jpeg');
    const jpegs = await ShapesDataset.writeImageFolder(jpegRoot, {
      count: 6,
      size: 16,
      classes: 2,
      seed: 6,
      format: 'jpeg',
    });
    expect(jpegs.every((f) => f.endsWith('.jpg'))).toBe(true);
    expect((await ImageFolder.open(jpegRoot)).length).toBe(6);
  });

  it('sorts classes and files by code point (B before a), walks sub-folders and matches extensions in any case', async () => {
    const root = freshDir('order');
    await writePng(path.join(root, 'a', 'b.png'), 1);
    await writePng(path.join(root, 'a', 'B.PNG'), 2);
    await writePng(path.join(root, 'a', 'sub', 'a.png'), 3);
    await writePng(path.join(root, 'a', 'sub-x', 'c.png'), 4);
    await writePng(path.join(root, 'a', 'sub', 'deep', 'd.png'), 8);
    await writePng(path.join(root, 'B', 'x.Jpeg'), 5);
    await writePng(path.join(root, 'B', 'y.webp'), 6);
    await writePng(path.join(root, '_z', 'q.jpg'), 7);
    writeFileSync(path.join(root, 'a', 'notes.txt'), 'not an image');
    writeFileSync(path.join(root, 'B', 'image.gif'), 'not taken');
    writeFileSync(path.join(root, 'top-level.png'), 'not in a class');
    const folder = await ImageFolder.open(root);
    // Python: sorted(['a', 'B', '_z']) == ['B', '_z', 'a'] (a locale sort would give a, B, _z or _z, a, B).
    expect(folder.classes).toEqual(['B', '_z', 'a']);
    const rel = folder.spec().files;
    // sorted(os.walk(...)) orders directories by path, not depth-first: 'a/sub' < 'a/sub-x' <
    // 'a/sub/deep', since '-' (0x2d) sorts before '/' (0x2f). Checked against Python.
    expect(rel).toEqual([
      'B/x.Jpeg',
      'B/y.webp',
      '_z/q.jpg',
      'a/B.PNG',
      'a/b.png',
      'a/sub/a.png',
      'a/sub-x/c.png',
      'a/sub/deep/d.png',
    ]);
    expect(Array.from({ length: folder.length }, (_, i) => folder.label(i))).toEqual([0, 0, 1, 2, 2, 2, 2, 2]);
    expect(folder.path(3)).toBe(path.join(root, 'a', 'B.PNG'));
    await rejectsWith(folder.get(8), 'ERR_RC_INVALID_ARGUMENT', 'index', 'between 0 and 7');
  });

  it('gives clear errors for no class folders, an empty class and a missing root', async () => {
    const empty = freshDir('no-classes');
    writeFileSync(path.join(empty, 'loose.png'), 'x');
    await rejectsWith(ImageFolder.open(empty), 'ERR_RC_DATASET', 'no class folders', empty);
    const root = freshDir('empty-class');
    await writePng(path.join(root, 'cat', '1.png'), 1);
    mkdirSync(path.join(root, 'dog'));
    writeFileSync(path.join(root, 'dog', 'readme.txt'), 'no images here');
    await rejectsWith(ImageFolder.open(root), 'ERR_RC_DATASET', "class 'dog'", '.png');
    await rejectsWith(ImageFolder.open(path.join(root, 'missing')), 'ERR_RC_DATASET', 'missing');
    await expect(ImageFolder.open(root, { onCorrupt: 'drop' } as never)).rejects.toMatchObject({
      code: 'ERR_RC_INVALID_ARGUMENT',
    });
    await expect(ImageFolder.open(root, { colour: true } as never)).rejects.toThrow(/Unknown option 'colour'/);
  });

  it('refuses file and folder names that are not UTF-8 when indexing, naming the folder', async () => {
    const root = freshDir('non-utf8');
    await writePng(path.join(root, 'cat', '1.png'), 1);
    const latin1 = (dir: string, name: Buffer, ext = '') =>
      Buffer.concat([Buffer.from(`${dir}/`), name, Buffer.from(ext)]);
    writeFileSync(
      latin1(path.join(root, 'cat'), Buffer.from([0x63, 0x61, 0x66, 0xe9]), '.png'),
      readFileSync(path.join(root, 'cat', '1.png')),
    );
    const error = await rejectsWith(ImageFolder.open(root), 'ERR_RC_DATASET', path.join(root, 'cat'), 'UTF-8');
    expect(error.message).toContain('caf\uFFFD.png');
    const folders = freshDir('non-utf8-class');
    await writePng(path.join(folders, 'cat', '1.png'), 1);
    mkdirSync(latin1(folders, Buffer.from([0xe9, 0x74, 0xe9])));
    await rejectsWith(ImageFolder.open(folders), 'ERR_RC_DATASET', folders, 'UTF-8');
  });

  it('checkImages names a corrupt file; onCorrupt skip leaves it out and reports it', async () => {
    const root = freshDir('corrupt');
    await writePng(path.join(root, 'cat', '1.png'), 1);
    await writePng(path.join(root, 'cat', '2.png'), 2);
    await writePng(path.join(root, 'dog', '1.png'), 3);
    const bad = path.join(root, 'dog', 'broken.jpg');
    writeFileSync(bad, 'this is not a JPEG');
    // Without the check, the file is listed (the transform pipeline fails on it when decoding).
    expect((await ImageFolder.open(root)).length).toBe(4);
    await rejectsWith(ImageFolder.open(root, { checkImages: true }), 'ERR_RC_CORRUPT_FILE', bad, "onCorrupt: 'skip'");
    const skipping = await ImageFolder.open(root, { onCorrupt: 'skip' });
    expect(skipping.length).toBe(3);
    expect(skipping.skipped).toHaveLength(1);
    expect(skipping.skipped[0]!.path).toBe(bad);
    expect(skipping.skipped[0]!.reason.length).toBeGreaterThan(0);
    expect(skipping.spec().files).toEqual(['cat/1.png', 'cat/2.png', 'dog/1.png']);
    await expect(ImageFolder.open(root, { onCorrupt: 'skip', checkImages: false })).rejects.toMatchObject({
      code: 'ERR_RC_INVALID_ARGUMENT',
    });
    // A file that disappears after the scan is named when read.
    rmSync(path.join(root, 'cat', '2.png'));
    await rejectsWith(skipping.get(1), 'ERR_RC_DATASET', path.join(root, 'cat', '2.png'), "class 'cat'");
  });

  it('writes an index cache, reuses it, and rescans when a file is added', async () => {
    const root = freshDir('cache');
    await writePng(path.join(root, 'x', '1.png'), 1);
    await writePng(path.join(root, 'y', '1.png'), 2);
    await writePng(path.join(root, 'y', 'deep', '2.png'), 3);
    const first = await ImageFolder.open(root, { cache: true });
    const indexFile = path.join(root, INDEX_FILE_NAME);
    expect(first.fromCache).toBe(false);
    expect(existsSync(indexFile)).toBe(true);
    const index = JSON.parse(readFileSync(indexFile, 'utf8')) as { files: unknown };
    expect(index.files).toEqual(['x/1.png', 'y/1.png', 'y/deep/2.png']);
    const second = await ImageFolder.open(root, { cache: true });
    expect(second.fromCache).toBe(true);
    expect(second.spec()).toEqual(first.spec());
    // Other scan options do not reuse it.
    expect((await ImageFolder.open(root, { cache: true, checkImages: true })).fromCache).toBe(false);
    expect((await ImageFolder.open(root, { cache: true, checkImages: true })).fromCache).toBe(true);
    // A new file in a sub-folder changes that folder's entry count (and mtime).
    await writePng(path.join(root, 'y', 'deep', '3.png'), 4);
    const third = await ImageFolder.open(root, { cache: true, checkImages: true });
    expect(third.fromCache).toBe(false);
    expect(third.length).toBe(4);
    expect((await ImageFolder.open(root, { cache: true, checkImages: true })).fromCache).toBe(true);
    // An index elsewhere (for read-only datasets); no temporary files are left behind.
    const elsewhere = path.join(freshDir('index'), 'index.json');
    expect((await ImageFolder.open(root, { cache: elsewhere })).fromCache).toBe(false);
    const again = await ImageFolder.open(root, { cache: elsewhere });
    expect(again.fromCache).toBe(true);
    expect(again.length).toBe(4);
    expect(readFileSync(elsewhere, 'utf8').length).toBeGreaterThan(0);
    expect(
      existsSync(path.dirname(elsewhere)) && (await import('node:fs')).readdirSync(path.dirname(elsewhere)),
    ).toEqual(['index.json']);
  });
});

describe('IDX (MNIST format)', () => {
  const count = 7;
  const rows = 5;
  const cols = 3;
  const pixels = randomBytes(count * rows * cols, 11);
  const labels = Uint8Array.from([3, 0, 9, 1, 1, 4, 2]);
  function idx(magic: number, dims: number[], data: Uint8Array): Uint8Array {
    const header = Buffer.alloc(4 + 4 * dims.length);
    header.writeUInt32BE(magic, 0);
    dims.forEach((d, i) => header.writeUInt32BE(d, 4 + 4 * i));
    return Buffer.concat([header, data]);
  }
  const imagesFile = idx(0x803, [count, rows, cols], pixels);
  const labelsFile = idx(0x801, [count], labels);

  it('reads plain and gzipped files back exactly, as grayscale HxWx1 images', async () => {
    const dir = freshDir('idx');
    writeFileSync(path.join(dir, 'images'), imagesFile);
    writeFileSync(path.join(dir, 'labels'), labelsFile);
    writeFileSync(path.join(dir, 'images.gz'), gzipSync(imagesFile));
    writeFileSync(path.join(dir, 'labels.gz'), gzipSync(labelsFile));
    for (const [im, lb] of [
      ['images', 'labels'],
      ['images.gz', 'labels.gz'],
      ['images', 'labels.gz'],
    ] as const) {
      const ds = await IdxDataset.open(path.join(dir, im), path.join(dir, lb));
      expect(ds.length).toBe(count);
      expect(ds.classes).toEqual(['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']);
      for (let i = 0; i < count; i++) {
        const sample = await ds.get(i);
        const image = decoded(sample);
        expect([image.height, image.width, image.channels]).toEqual([rows, cols, 1]);
        expect(Array.from(image.data)).toEqual(Array.from(pixels.subarray(i * rows * cols, (i + 1) * rows * cols)));
        expect(sample.label).toBe(labels[i]);
        expect(ds.label(i)).toBe(labels[i]);
      }
    }
    const named = await IdxDataset.open(path.join(dir, 'images'), path.join(dir, 'labels'), {
      classes: 'abcdefghij'.split(''),
    });
    expect(named.classes[9]).toBe('j');
    await rejectsWith(
      IdxDataset.open(path.join(dir, 'images'), path.join(dir, 'labels'), { classes: ['a', 'b'] }),
      'ERR_RC_CORRUPT_FILE',
      'label 3',
      '2 classes',
    );
  });

  it('refuses a stray label that would make most inferred classes empty, naming the file and index', async () => {
    const dir = freshDir('idx-stray');
    const many = 40;
    const stray = Uint8Array.from({ length: many }, (_, i) => (i === 17 ? 255 : i % 10));
    writeFileSync(path.join(dir, 'images'), idx(0x803, [many, 1, 1], new Uint8Array(many)));
    writeFileSync(path.join(dir, 'labels'), idx(0x801, [many], stray));
    const labelsPath = path.join(dir, 'labels');
    await rejectsWith(
      IdxDataset.open(path.join(dir, 'images'), labelsPath),
      'ERR_RC_CORRUPT_FILE',
      labelsPath,
      'label 255 at index 17',
      'classes',
    );
    // Declared, the 256 classes are taken as they are.
    expect((await IdxDataset.open(path.join(dir, 'images'), labelsPath, { classes: 256 })).classes.length).toBe(256);
    await rejectsWith(
      IdxDataset.open(path.join(dir, 'images'), labelsPath, { classes: 10 }),
      'ERR_RC_CORRUPT_FILE',
      labelsPath,
      'label 255 at index 17',
    );
  });

  it('names the file for truncation (expected and actual bytes), bad magic, swapped paths and count mismatches', async () => {
    const dir = freshDir('idx-bad');
    const truncated = path.join(dir, 'truncated');
    writeFileSync(truncated, imagesFile.subarray(0, imagesFile.length - 4));
    writeFileSync(path.join(dir, 'labels'), labelsFile);
    await rejectsWith(
      IdxDataset.open(truncated, path.join(dir, 'labels')),
      'ERR_RC_CORRUPT_FILE',
      truncated,
      'truncated',
      `expected ${imagesFile.length} bytes`,
      `has ${imagesFile.length - 4}`,
    );
    const truncatedGz = path.join(dir, 'truncated.gz');
    writeFileSync(truncatedGz, gzipSync(imagesFile.subarray(0, 30)));
    await rejectsWith(
      IdxDataset.open(truncatedGz, path.join(dir, 'labels')),
      'ERR_RC_CORRUPT_FILE',
      truncatedGz,
      'once decompressed',
    );
    const brokenGz = path.join(dir, 'broken.gz');
    writeFileSync(brokenGz, gzipSync(imagesFile).subarray(0, 40));
    await rejectsWith(IdxDataset.open(brokenGz, path.join(dir, 'labels')), 'ERR_RC_CORRUPT_FILE', brokenGz, 'gzipped');
    writeFileSync(path.join(dir, 'images'), imagesFile);
    await rejectsWith(
      IdxDataset.open(path.join(dir, 'labels'), path.join(dir, 'images')),
      'ERR_RC_CORRUPT_FILE',
      'swapped',
      '0x00000803',
    );
    const fewer = path.join(dir, 'fewer-labels');
    writeFileSync(fewer, idx(0x801, [count - 1], labels.subarray(1)));
    await rejectsWith(
      IdxDataset.open(path.join(dir, 'images'), fewer),
      'ERR_RC_DATASET',
      `${count} images`,
      `${count - 1} labels`,
    );
    await rejectsWith(IdxDataset.open(path.join(dir, 'nope'), fewer), 'ERR_RC_DATASET', 'nope');
  });
});

describe('CIFAR binary', () => {
  /** Records of label bytes then a planar 32x32 RGB image; returns the file and the expected HWC images. */
  function records(labelRows: number[][], seed: number): { file: Uint8Array; images: Uint8Array[] } {
    const rng = new Random(seed);
    const parts: number[] = [];
    const images: Uint8Array[] = [];
    for (const labelBytes of labelRows) {
      const planar = Array.from({ length: 3072 }, () => rng.int(256));
      parts.push(...labelBytes, ...planar);
      const hwc = new Uint8Array(3072);
      for (let y = 0; y < 32; y++) {
        for (let x = 0; x < 32; x++) {
          for (let c = 0; c < 3; c++) hwc[(y * 32 + x) * 3 + c] = planar[c * 1024 + y * 32 + x]!;
        }
      }
      images.push(hwc);
    }
    return { file: Uint8Array.from(parts), images };
  }

  it('reads CIFAR-10 records back exactly, HWC from planar, across files', async () => {
    const dir = freshDir('cifar10');
    const a = records([[3], [9], [0]], 1);
    const b = records([[7], [2]], 2);
    writeFileSync(path.join(dir, 'data_batch_1.bin'), a.file);
    writeFileSync(path.join(dir, 'data_batch_2.bin'), b.file);
    const ds = await CifarDataset.open([path.join(dir, 'data_batch_1.bin'), path.join(dir, 'data_batch_2.bin')], {
      variant: 'cifar10',
    });
    expect(ds.length).toBe(5);
    expect(ds.classes).toEqual(CIFAR10_CLASSES);
    expect(ds.classes).toEqual([
      'airplane',
      'automobile',
      'bird',
      'cat',
      'deer',
      'dog',
      'frog',
      'horse',
      'ship',
      'truck',
    ]);
    const expected = [...a.images, ...b.images];
    const expectedLabels = [3, 9, 0, 7, 2];
    for (let i = 0; i < 5; i++) {
      const sample = await ds.get(i);
      const image = decoded(sample);
      expect([image.height, image.width, image.channels]).toEqual([32, 32, 3]);
      expect(Buffer.from(image.data).equals(Buffer.from(expected[i]!))).toBe(true);
      expect(sample.label).toBe(expectedLabels[i]);
      expect(ds.label(i)).toBe(expectedLabels[i]);
    }
    await rejectsWith(ds.get(5), 'ERR_RC_INVALID_ARGUMENT', 'index');
  });

  it('reads CIFAR-100 fine and coarse labels', async () => {
    const dir = freshDir('cifar100');
    const r = records(
      [
        [4, 99],
        [19, 0],
        [0, 57],
      ],
      3,
    );
    const file = path.join(dir, 'train.bin');
    writeFileSync(file, r.file);
    const fine = await CifarDataset.open([file], { variant: 'cifar100' });
    const coarse = await CifarDataset.open([file], { variant: 'cifar100', label: 'coarse' });
    expect(fine.classes).toHaveLength(100);
    expect(fine.classes[99]).toBe('99');
    expect(coarse.classes).toHaveLength(20);
    expect([0, 1, 2].map((i) => fine.label(i))).toEqual([99, 0, 57]);
    expect([0, 1, 2].map((i) => coarse.label(i))).toEqual([4, 19, 0]);
    for (let i = 0; i < 3; i++) {
      expect(Buffer.from(decoded(await coarse.get(i)).data).equals(Buffer.from(r.images[i]!))).toBe(true);
    }
    await expect(CifarDataset.open([file], { variant: 'cifar10', label: 'coarse' } as never)).rejects.toMatchObject({
      code: 'ERR_RC_INVALID_ARGUMENT',
    });
    await expect(CifarDataset.open([file], { variant: 'cifar100', classes: ['a'] })).rejects.toThrow(/100 class names/);
  });

  it('names the file whose size is not a whole number of records', async () => {
    const dir = freshDir('cifar-bad');
    const file = path.join(dir, 'short.bin');
    writeFileSync(file, records([[1], [2]], 4).file.subarray(0, 3073 + 100));
    await rejectsWith(
      CifarDataset.open([file], { variant: 'cifar10' }),
      'ERR_RC_CORRUPT_FILE',
      file,
      '3073 bytes',
      '100 bytes over',
    );
    const c100 = path.join(dir, 'c100.bin');
    writeFileSync(
      c100,
      records(
        [
          [1, 2],
          [3, 4],
        ],
        5,
      ).file,
    );
    await rejectsWith(
      CifarDataset.open([c100], { variant: 'cifar10' }),
      'ERR_RC_CORRUPT_FILE',
      c100,
      'is variant right',
    );
    await expect(CifarDataset.open([], { variant: 'cifar10' })).rejects.toMatchObject({
      code: 'ERR_RC_INVALID_ARGUMENT',
    });
  });
});

describe('generated datasets', () => {
  it('SyntheticDataset is deterministic per seed and index', async () => {
    const a = new SyntheticDataset({ length: 50, height: 7, width: 5, channels: 3, classes: 10, seed: 1 });
    const b = new SyntheticDataset({ length: 50, height: 7, width: 5, channels: 3, classes: 10, seed: 1 });
    const c = new SyntheticDataset({ length: 50, height: 7, width: 5, channels: 3, classes: 10, seed: 2 });
    await expectSameDataset(a, b);
    const [x, z] = [decoded(await a.get(3)), decoded(await c.get(3))];
    expect(x.data.length).toBe(7 * 5 * 3);
    expect(Buffer.from(x.data).equals(Buffer.from(z.data))).toBe(false);
    expect(Buffer.from(x.data).equals(Buffer.from(decoded(await a.get(4)).data))).toBe(false);
    const labels = Array.from({ length: 50 }, (_, i) => a.label(i));
    expect(labels.every((l) => l >= 0 && l < 10)).toBe(true);
    expect(new Set(labels).size).toBeGreaterThan(5);
    expect(a.classes).toHaveLength(10);
    const gray = decoded(await new SyntheticDataset({ length: 1, height: 3, width: 3, channels: 1, seed: 0 }).get(0));
    expect(gray.channels).toBe(1);
    expect(gray.data.length).toBe(9);
    expect(() => new SyntheticDataset({ length: 1, channels: 5 })).toThrow(/channels/);
  });

  it('ShapesDataset is deterministic per seed, balanced, lazily drawn, and leaves generateShapes as it was', async () => {
    const a = new ShapesDataset({ length: 30, size: 12, classes: 3, seed: 9 });
    const b = new ShapesDataset({ length: 30, size: 12, classes: 3, seed: 9 });
    const c = new ShapesDataset({ length: 30, size: 12, classes: 3, seed: 10 });
    await expectSameDataset(a, b);
    const labels = Array.from({ length: 30 }, (_, i) => a.label(i));
    expect([0, 1, 2].map((k) => labels.filter((l) => l === k).length)).toEqual([10, 10, 10]);
    expect(labels).not.toEqual(Array.from({ length: 30 }, (_, i) => c.label(i)));
    expect(Buffer.from(decoded(await a.get(0)).data).equals(Buffer.from(decoded(await c.get(0)).data))).toBe(false);
    expect(a.classes).toEqual(['square', 'circle', 'triangle']);
    // generateShapes' output for a seed is pinned by its digest (it was refactored to share the drawing).
    const g = generateShapes({ count: 50, size: 32, classes: 4, seed: 1 });
    const { createHash } = await import('node:crypto');
    expect(createHash('sha256').update(g.images).update(new Uint8Array(g.labels.buffer)).digest('hex')).toBe(
      '0f1e0d0004591a81b0ca9624881164556d15c7ff5a82ca1926740f3b9a38fb61',
    );
  });
});

describe('randomSplit and Subset', () => {
  it('rounds fractions like torch.utils.data.random_split', () => {
    expect(splitLengths(103, [0.8, 0.1, 0.1])).toEqual([83, 10, 10]);
    expect(splitLengths(7, [0.5, 0.5])).toEqual([4, 3]);
    expect(splitLengths(10, [0.3, 0.3, 0.4])).toEqual([3, 3, 4]);
    expect(splitLengths(5, [0.1, 0.1, 0.8])).toEqual([1, 0, 4]); // floors [0, 0, 4], then one round-robin
    expect(splitLengths(10, [4, 6])).toEqual([4, 6]);
    expect(() => splitLengths(10, [0.5, 0.6])).toThrow(/summing to 1/);
    expect(() => splitLengths(10, [4, 5])).toThrow(/summing to the dataset length 10/);
  });

  it('splits are disjoint, cover every index, and depend only on the seed', () => {
    const ds = new ShapesDataset({ length: 103, size: 8, classes: 4, seed: 1 });
    const parts = randomSplit(ds, undefined, { seed: 42 });
    expect(parts.map((p) => p.length)).toEqual([83, 10, 10]);
    const all = parts.flatMap((p) => Array.from(p.indices));
    expect(new Set(all).size).toBe(103);
    expect([...all].sort((x, y) => x - y)).toEqual(Array.from({ length: 103 }, (_, i) => i));
    // A tuple of fractions gives a tuple of subsets (destructuring needs no checks).
    const [train, val] = randomSplit(ds, [0.9, 0.1], { seed: 1 });
    expectTypeOf(train).toEqualTypeOf<Subset>();
    expect(train.length + val.length).toBe(103);
    const [a, b, c] = randomSplit(ds);
    expectTypeOf(c).toEqualTypeOf<Subset>();
    expect(a.length + b.length + c.length).toBe(103);
    expectTypeOf(randomSplit(ds, [0.5, 0.5] as number[])).toEqualTypeOf<Subset[]>();
    const same = randomSplit(ds, [0.8, 0.1, 0.1], { seed: 42 });
    expect(same.map((p) => Array.from(p.indices))).toEqual(parts.map((p) => Array.from(p.indices)));
    const other = randomSplit(ds, [0.8, 0.1, 0.1], { seed: 43 });
    expect(other.map((p) => Array.from(p.indices))).not.toEqual(parts.map((p) => Array.from(p.indices)));
    const sub = parts[1];
    expect(sub.classes).toBe(ds.classes);
    for (let i = 0; i < sub.length; i++) expect(sub.label(i)).toBe(ds.label(sub.indices[i]!));
    expect(() => randomSplit(ds, [0.5, 0.6], { seed: 1 })).toThrow(/fractions/);
    expect(() => randomSplit(ds, [0.5, -0.5, 1], { seed: 1 })).toThrow(/fractions\[1\]/);
    expect(() => randomSplit({} as Dataset)).toThrow(/dataset/);
    expect(() => new Subset(ds, [0, 103])).toThrow(/indices\[1\]/);
  });

  it('stratified splits keep every class within one sample of its proportion', () => {
    const labels: number[] = [];
    const sizes = [37, 11, 5, 1, 46];
    sizes.forEach((n, k) => labels.push(...new Array<number>(n).fill(k)));
    const rng = new Random(3);
    for (let i = labels.length - 1; i > 0; i--) {
      const j = rng.int(i + 1);
      [labels[i], labels[j]] = [labels[j]!, labels[i]!];
    }
    const ds = labelsDataset(labels);
    const fractions = [0.7, 0.2, 0.1];
    for (const seed of [1, 2, 3]) {
      const parts = randomSplit(ds, fractions, { seed, stratified: true });
      const all = parts.flatMap((p) => Array.from(p.indices));
      expect(all.length).toBe(labels.length);
      expect(new Set(all).size).toBe(labels.length);
      parts.forEach((p, s) => {
        sizes.forEach((n, k) => {
          const got = Array.from(p.indices).filter((i) => labels[i] === k).length;
          expect(Math.abs(got - n * fractions[s]!)).toBeLessThan(1);
        });
        expect(Math.abs(p.length - labels.length * fractions[s]!)).toBeLessThanOrEqual(2);
      });
      expect(randomSplit(ds, fractions, { seed, stratified: true }).map((p) => Array.from(p.indices))).toEqual(
        parts.map((p) => Array.from(p.indices)),
      );
    }
  });
});

describe('datasetFromSpec', () => {
  it('rebuilds every kind from a structured clone of its spec, with the same samples', async () => {
    const dir = freshDir('specs');
    await ShapesDataset.writeImageFolder(path.join(dir, 'folder'), { count: 9, size: 8, classes: 3, seed: 2 });
    const header = (magic: number, dims: number[]) => {
      const h = Buffer.alloc(4 + 4 * dims.length);
      h.writeUInt32BE(magic, 0);
      dims.forEach((d, i) => h.writeUInt32BE(d, 4 + 4 * i));
      return h;
    };
    writeFileSync(path.join(dir, 'images.gz'), gzipSync(Buffer.concat([header(0x803, [4, 2, 2]), randomBytes(16, 1)])));
    writeFileSync(path.join(dir, 'labels'), Buffer.concat([header(0x801, [4]), Uint8Array.from([1, 0, 1, 2])]));
    const cifar = new Uint8Array(3073 * 3);
    cifar.set(randomBytes(cifar.length, 2));
    for (let r = 0; r < 3; r++) cifar[r * 3073] = r * 3;
    writeFileSync(path.join(dir, 'cifar.bin'), cifar);
    const folder = await ImageFolder.open(path.join(dir, 'folder'));
    const datasets: Dataset[] = [
      folder,
      await IdxDataset.open(path.join(dir, 'images.gz'), path.join(dir, 'labels')),
      await CifarDataset.open([path.join(dir, 'cifar.bin')], { variant: 'cifar10' }),
      new SyntheticDataset({ length: 6, height: 4, width: 4, classes: 3, seed: 4 }),
      new SyntheticDataset({ length: 2, height: 4, width: 4 }), // random seed, recorded in the spec
      new ShapesDataset({ length: 8, size: 8, classes: 2, seed: 3 }),
      new Subset(folder, [8, 0, 4]),
      await ImageFiles.open([folder.path(2), folder.path(0)]),
      randomSplit(
        randomSplit(new ShapesDataset({ length: 20, size: 8, seed: 1 }), [0.5, 0.5], { seed: 1 })[0],
        [0.6, 0.4],
        { seed: 2 },
      )[1],
    ];
    const kinds = new Set<string>();
    for (const ds of datasets) {
      const spec = structuredClone(ds.spec());
      kinds.add(spec.kind);
      await expectSameDataset(ds, await datasetFromSpec(spec));
    }
    expect([...kinds].sort()).toEqual([...DATASET_KINDS].sort());
    expect(folder.spec().files).toHaveLength(9);
    await rejectsWith(datasetFromSpec({ kind: 'Parquet' }), 'ERR_RC_DATASET', "'Parquet'", 'ImageFolder');
    await expect(
      datasetFromSpec({ kind: 'ImageFolder', root: 'relative', files: [], labels: [], classes: ['a'] }),
    ).rejects.toThrow(/spec.root/);
    await expect(datasetFromSpec({ kind: 'Subset', dataset: folder.spec(), indices: [99] })).rejects.toThrow(
      /indices\[0\]/,
    );
  });
});
