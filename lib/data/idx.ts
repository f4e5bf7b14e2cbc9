/**
 * The IDX format of MNIST, Fashion-MNIST and EMNIST: a pair of files, images (magic 0x00000803,
 * unsigned bytes, `[count, rows, cols]`) and labels (magic 0x00000801, unsigned bytes,
 * `[count]`), sizes big-endian, each file optionally gzipped.
 * @packageDocumentation
 */
import { readFile } from 'node:fs/promises';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { gunzip } from 'node:zlib';
import { expectOptions, invalid } from '../errors.js';
import {
  checkIndex,
  corruptFileError,
  datasetError,
  expectSpec,
  numberedClasses,
  promiseOf,
  resolveClassNames,
} from './dataset.js';
import type { Dataset, DatasetSpec, RawSample } from './types.js';

const gunzipAsync = promisify(gunzip);

/** Magic number of an IDX file of unsigned bytes with three dimensions (images). */
export const IDX_IMAGES_MAGIC = 0x00000803;
/** Magic number of an IDX file of unsigned bytes with one dimension (labels). */
export const IDX_LABELS_MAGIC = 0x00000801;

/** Options of {@link IdxDataset.open}. */
export interface IdxOptions {
  /**
   * Class names by label, or their number; default `'0'` … up to the largest label in the file
   * (`'0'`…`'9'` for MNIST), refused when most of those classes would have no sample (a stray
   * label). Fashion-MNIST users pass its names here.
   */
  classes?: readonly string[] | number;
}

/** The spec of an {@link IdxDataset}: the two files, reopened by workers. */
export interface IdxSpec extends DatasetSpec {
  kind: 'Idx';
  images: string;
  labels: string;
  classes: string[];
}

/** A parsed IDX file: its dimensions and a view of its data bytes. */
interface IdxArray {
  dims: number[];
  data: Uint8Array;
}

/** Reads (gunzipping when the file starts with 1f 8b) and parses an IDX file of unsigned bytes. */
async function readIdx(file: string, role: 'images' | 'labels', magic: number): Promise<IdxArray> {
  let bytes: Uint8Array;
  try {
    bytes = await readFile(file);
  } catch (error) {
    throw datasetError(`Cannot read the IDX ${role} file: ${error instanceof Error ? error.message : String(error)}`);
  }
  const gzipped = bytes.length >= 2 && bytes[0] === 0x1f && bytes[1] === 0x8b;
  if (gzipped) {
    try {
      bytes = await gunzipAsync(bytes);
    } catch (error) {
      throw corruptFileError(
        file,
        `is gzipped but cannot be decompressed (${error instanceof Error ? error.message : String(error)}); the download may be incomplete`,
      );
    }
  }
  // The magic number is checked before the header's length, so that swapped or foreign files are
  // named as such rather than as truncated.
  if (bytes.length < 4) {
    throw corruptFileError(
      file,
      `is truncated: an IDX ${role} file starts with a 4-byte magic number but the file has ${bytes.length} bytes`,
    );
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const found = view.getUint32(0, false);
  if (found !== magic) {
    const hint =
      found === (magic === IDX_IMAGES_MAGIC ? IDX_LABELS_MAGIC : IDX_IMAGES_MAGIC)
        ? ` (it is an IDX ${role === 'images' ? 'labels' : 'images'} file: are the two paths swapped?)`
        : (found & 0xffff0000) === 0 && (found & 0xff00) !== 0x0800
          ? ` (an IDX file of another element type, 0x${((found >>> 8) & 0xff).toString(16).padStart(2, '0')}; only unsigned bytes, 0x08, are read)`
          : '';
    throw corruptFileError(
      file,
      `is not an IDX ${role} file: expected magic number 0x${magic.toString(16).padStart(8, '0')} but found 0x${found.toString(16).padStart(8, '0')}${hint}`,
    );
  }
  const rank = magic & 0xff;
  const headerBytes = 4 + 4 * rank;
  if (bytes.length < headerBytes) {
    throw corruptFileError(
      file,
      `is truncated: an IDX ${role} header needs ${headerBytes} bytes but the file has ${bytes.length}`,
    );
  }
  const dims: number[] = [];
  let count = 1;
  for (let d = 0; d < rank; d++) {
    const size = view.getUint32(4 + 4 * d, false);
    dims.push(size);
    count *= size;
  }
  const expected = headerBytes + count;
  if (bytes.length !== expected) {
    const what = bytes.length < expected ? 'is truncated' : 'has trailing bytes';
    const gz = gzipped ? ' once decompressed' : '';
    throw corruptFileError(
      file,
      `${what}: its header describes ${role} [${dims.join(', ')}], so expected ${expected} bytes but it has ${bytes.length}${gz}`,
    );
  }
  return { dims, data: bytes.subarray(headerBytes) };
}

/**
 * Without declared classes they are inferred as `0` … the largest label; a stray label (a 255
 * marking a missing value, a flipped byte) would then add classes that no sample has. Refuses
 * inferred classes of which more than half never occur, naming the label and its index.
 */
function checkInferredClasses(file: string, labels: Uint8Array, maxLabel: number): void {
  const seen = new Uint8Array(maxLabel + 1);
  for (const l of labels) seen[l] = 1;
  const empty = seen.length - seen.reduce((a, b) => a + b, 0);
  if (empty * 2 <= seen.length) return;
  const at = labels.indexOf(maxLabel);
  throw corruptFileError(
    file,
    `holds label ${maxLabel} at index ${at}, which makes ${maxLabel + 1} classes of which ${empty} have no sample; ` +
      'if that is right, declare the classes (IdxOptions.classes: their number or names)',
  );
}

/**
 * An IDX image/label pair (MNIST and its relatives). Samples are decoded grayscale images
 * (`channels: 1`, `rows x cols`); the transform pipeline converts them to three channels when the
 * model wants RGB. The files are read whole into memory (47 MB for MNIST's training set,
 * uncompressed), once per process.
 *
 * ```ts
 * const mnist = await IdxDataset.open('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz');
 * ```
 */
export class IdxDataset implements Dataset {
  /** Absolute path of the images file. */
  readonly imagesPath: string;
  /** Absolute path of the labels file. */
  readonly labelsPath: string;
  /** Class names by label. */
  readonly classes: readonly string[];
  /** Image height (the file's rows). */
  readonly height: number;
  /** Image width (the file's columns). */
  readonly width: number;
  readonly #pixels: Uint8Array;
  readonly #labels: Uint8Array;

  /** `[height, width, channels]` of every sample. */
  get imageShape(): readonly [number, number, number] {
    return [this.height, this.width, 1];
  }

  private constructor(
    imagesPath: string,
    labelsPath: string,
    classes: string[],
    height: number,
    width: number,
    pixels: Uint8Array,
    labels: Uint8Array,
  ) {
    this.imagesPath = imagesPath;
    this.labelsPath = labelsPath;
    this.classes = Object.freeze(classes);
    this.height = height;
    this.width = width;
    this.#pixels = pixels;
    this.#labels = labels;
  }

  /**
   * Reads and validates the two files.
   * @throws `ERR_RC_CORRUPT_FILE` naming the file for a wrong magic number, a truncated file
   *   (expected and actual sizes), a gzip stream that does not decompress, a label beyond
   *   `classes`, or, without `classes`, a stray label that leaves most inferred classes empty;
   *   `ERR_RC_DATASET` when a file cannot be read or the counts differ.
   */
  static async open(imagesPath: string, labelsPath: string, options?: IdxOptions): Promise<IdxDataset> {
    if (typeof imagesPath !== 'string' || imagesPath.length === 0) invalid('imagesPath', 'a file path', imagesPath);
    if (typeof labelsPath !== 'string' || labelsPath.length === 0) invalid('labelsPath', 'a file path', labelsPath);
    const o = expectOptions<IdxOptions>('IdxDataset options', options, ['classes']);
    const imagesFile = path.resolve(imagesPath);
    const labelsFile = path.resolve(labelsPath);
    const [images, labels] = await Promise.all([
      readIdx(imagesFile, 'images', IDX_IMAGES_MAGIC),
      readIdx(labelsFile, 'labels', IDX_LABELS_MAGIC),
    ]);
    const [count, rows, cols] = images.dims as [number, number, number];
    if (labels.dims[0] !== count) {
      throw datasetError(
        `The IDX files do not match: '${imagesFile}' holds ${count} images but '${labelsFile}' holds ${labels.dims[0]} labels`,
      );
    }
    if (count === 0) throw datasetError(`The IDX images file '${imagesFile}' holds no images`);
    if (rows === 0 || cols === 0) {
      throw corruptFileError(imagesFile, `describes empty images of ${rows}x${cols} pixels`);
    }
    let maxLabel = 0;
    for (const l of labels.data) if (l > maxLabel) maxLabel = l;
    const classes = resolveClassNames('classes', o.classes, numberedClasses(maxLabel + 1));
    if (maxLabel >= classes.length) {
      const at = labels.data.findIndex((l) => l >= classes.length);
      throw corruptFileError(
        labelsFile,
        `holds label ${labels.data[at]} at index ${at}, beyond the ${classes.length} classes given`,
      );
    }
    if (o.classes === undefined) checkInferredClasses(labelsFile, labels.data, maxLabel);
    return new IdxDataset(imagesFile, labelsFile, classes, rows, cols, images.data, labels.data);
  }

  /** Reopens the files named by {@link IdxDataset.spec}. */
  static async fromSpec(spec: DatasetSpec): Promise<IdxDataset> {
    const s = expectSpec(spec, 'Idx');
    if (!Array.isArray(s.classes)) invalid('spec.classes', 'an array of class names', s.classes);
    return IdxDataset.open(s.images as string, s.labels as string, { classes: s.classes as string[] });
  }

  /** Number of samples. */
  get length(): number {
    return this.#labels.length;
  }

  /** Label of sample `index`. */
  label(index: number): number {
    return this.#labels[checkIndex(index, this.length)]!;
  }

  /** Sample `index`: a `height x width x 1` grayscale image (a copy, safe to transfer). */
  get(index: number): Promise<RawSample> {
    return promiseOf(() => this.#sample(index));
  }

  // `get`'s sample, read from memory (or drawn) at once.
  #sample(index: number): RawSample {
    const i = checkIndex(index, this.length);
    const bytes = this.height * this.width;
    const data = this.#pixels.slice(i * bytes, (i + 1) * bytes);
    return {
      source: { kind: 'decoded', image: { data, height: this.height, width: this.width, channels: 1 } },
      label: this.#labels[i]!,
    };
  }

  /** The two file paths and the class names. */
  spec(): IdxSpec {
    return { kind: 'Idx', images: this.imagesPath, labels: this.labelsPath, classes: [...this.classes] };
  }
}
