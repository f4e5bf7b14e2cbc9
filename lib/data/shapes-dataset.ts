/**
 * The generated shapes (coloured shapes on noise, one class per shape) as a lazy dataset: each
 * image is drawn when asked for, from the seed and its index, so any worker draws any sample and
 * no image is held in memory. It is the built-in default dataset of the demo.
 * @packageDocumentation
 */
import { mkdir } from 'node:fs/promises';
import * as path from 'node:path';
import { expectInt, expectOneOf, expectOptions, invalid } from '../errors.js';
import { Random } from '../random.js';
import { checkIndex, expectSpec, indexSeed, mapLimit, promiseOf, resolveSeed } from './dataset.js';
import { SHAPE_CLASSES, drawShape } from './generated.js';
import type { Dataset, DatasetSpec, RawSample } from './types.js';

/** Options of {@link ShapesDataset}. */
export interface ShapesDatasetOptions {
  /** Number of samples. */
  length: number;
  /** Image height and width in pixels, 8 to 4096; default 32. */
  size?: number;
  /** Number of classes, 2 to 6 (the first entries of {@link SHAPE_CLASSES}); default 4. */
  classes?: number;
  /** Seed; random when omitted (and recorded in the spec, so workers agree). */
  seed?: number;
}

/** Options of {@link ShapesDataset.writeImageFolder}. */
export interface WriteShapesOptions {
  /** Number of images. */
  count: number;
  /** Image height and width; default 32. */
  size?: number;
  /** Number of classes, 2 to 6; default 4. */
  classes?: number;
  /** Seed; random when omitted. */
  seed?: number;
  /** File format: `'png'` (lossless, default) or `'jpeg'` (sharp's default quality). */
  format?: 'png' | 'jpeg';
}

/** The spec of a {@link ShapesDataset}. */
export interface ShapesSpec extends DatasetSpec {
  kind: 'Shapes';
  length: number;
  size: number;
  classes: number;
  seed: number;
}

/**
 * Coloured shapes on a noisy background, learnable in a few hundred steps. Labels are balanced
 * (`length / classes` each, the rest to the first classes) and shuffled by the seed; image `i` is
 * drawn from its own stream `(seed, i)`. The drawing is `generateShapes`'s, but the images
 * differ from `generateShapes` with the same seed, which draws all images from one stream.
 */
export class ShapesDataset implements Dataset {
  /** Number of samples. */
  readonly length: number;
  /** Image height and width. */
  readonly size: number;
  /** Class names by label: the first `classes` entries of {@link SHAPE_CLASSES}. */
  readonly classes: readonly string[];
  /** The seed every sample derives from. */
  readonly seed: number;
  readonly #labels: Int32Array;

  /** @throws `ERR_RC_INVALID_ARGUMENT` for bad options. */
  /** `[height, width, channels]` of every sample. */
  get imageShape(): readonly [number, number, number] {
    return [this.size, this.size, 3];
  }

  constructor(options: ShapesDatasetOptions) {
    const o = expectOptions<ShapesDatasetOptions>('ShapesDataset options', options, [
      'length',
      'size',
      'classes',
      'seed',
    ]);
    this.length = expectInt('length', o.length, 0);
    this.size = expectInt('size', o.size ?? 32, 8, 4096);
    const classes = expectInt('classes', o.classes ?? 4, 2, SHAPE_CLASSES.length);
    this.classes = Object.freeze(SHAPE_CLASSES.slice(0, classes) as string[]);
    this.seed = resolveSeed('seed', o.seed);
    // Balanced labels in a seeded order, as generateShapes makes them. O(length) once per
    // process; 4 bytes per sample.
    const labels = new Int32Array(this.length);
    for (let i = 0; i < this.length; i++) labels[i] = i % classes;
    const rng = new Random(indexSeed(this.seed, 0, 2));
    for (let i = this.length - 1; i > 0; i--) {
      const j = rng.int(i + 1);
      const t = labels[i]!;
      labels[i] = labels[j]!;
      labels[j] = t;
    }
    this.#labels = labels;
  }

  /** Rebuilds the dataset from {@link ShapesDataset.spec}. */
  static fromSpec(spec: DatasetSpec): ShapesDataset {
    const s = expectSpec(spec, 'Shapes');
    return new ShapesDataset({
      length: s.length as number,
      size: s.size as number,
      classes: s.classes as number,
      seed: s.seed as number,
    });
  }

  /**
   * Writes generated shapes as image files, one folder per class name (`root/circle/0007.png`),
   * for tests and for trying `ImageFolder` without a dataset at hand. The images are those
   * of `new ShapesDataset({ length: count, size, classes, seed })`, in index order. Note that
   * `ImageFolder` numbers the classes in sorted folder order (`circle`, `cross`, `square`, …),
   * not in {@link SHAPE_CLASSES} order.
   *
   * @returns the absolute paths written, by index.
   */
  static async writeImageFolder(root: string, options: WriteShapesOptions): Promise<string[]> {
    if (typeof root !== 'string' || root.length === 0) invalid('root', 'a folder path', root);
    const o = expectOptions<WriteShapesOptions>('writeImageFolder options', options, [
      'count',
      'size',
      'classes',
      'seed',
      'format',
    ]);
    const format = o.format === undefined ? 'png' : expectOneOf('format', o.format, ['png', 'jpeg'] as const);
    const dataset = new ShapesDataset({
      length: expectInt('count', o.count, 1),
      size: o.size,
      classes: o.classes,
      seed: o.seed,
    });
    const { default: sharp } = await import('sharp');
    const absRoot = path.resolve(root);
    for (const name of dataset.classes) await mkdir(path.join(absRoot, name), { recursive: true });
    const digits = String(dataset.length - 1).length;
    const indices = Array.from({ length: dataset.length }, (_, i) => i);
    return mapLimit(indices, 8, async (i) => {
      const sample = await dataset.get(i);
      if (sample.source.kind !== 'decoded') throw new Error('unreachable: shapes are decoded');
      const { data, width, height, channels } = sample.source.image;
      const file = path.join(
        absRoot,
        dataset.classes[sample.label]!,
        `${String(i).padStart(digits, '0')}.${format === 'png' ? 'png' : 'jpg'}`,
      );
      const image = sharp(data, { raw: { width, height, channels: channels as 3 } });
      await (format === 'png' ? image.png() : image.jpeg()).toFile(file);
      return file;
    });
  }

  /** Label of sample `index`. */
  label(index: number): number {
    return this.#labels[checkIndex(index, this.length)]!;
  }

  /** Sample `index`: a `size x size x 3` RGB image drawn from `(seed, index)`. */
  get(index: number): Promise<RawSample> {
    return promiseOf(() => this.#sample(index));
  }

  // `get`'s sample, read from memory (or drawn) at once.
  #sample(index: number): RawSample {
    const label = this.label(index);
    const data = new Uint8Array(this.size * this.size * 3);
    drawShape(data, 0, this.size, SHAPE_CLASSES[label]!, new Random(indexSeed(this.seed, index, 0)));
    return { source: { kind: 'decoded', image: { data, height: this.size, width: this.size, channels: 3 } }, label };
  }

  /** The length, size, class count and seed. */
  spec(): ShapesSpec {
    return { kind: 'Shapes', length: this.length, size: this.size, classes: this.classes.length, seed: this.seed };
  }
}
