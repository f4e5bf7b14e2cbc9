/**
 * The binary versions of CIFAR-10 and CIFAR-100 (`data_batch_1.bin` …, `train.bin`, `test.bin`):
 * fixed-size records of label byte(s) followed by a 32x32 image stored planar (1024 red, 1024
 * green, 1024 blue bytes, each row-major).
 * @packageDocumentation
 */
import { readFile } from 'node:fs/promises';
import * as path from 'node:path';
import { expectOneOf, expectOptions, invalid } from '../errors.js';
import {
  checkIndex,
  corruptFileError,
  datasetError,
  expectSpec,
  expectStrings,
  numberedClasses,
  promiseOf,
  resolveClassNames,
} from './dataset.js';
import type { Dataset, DatasetSpec, RawSample } from './types.js';

/** CIFAR-10's class names, by label (from its `batches.meta.txt`). */
export const CIFAR10_CLASSES: readonly string[] = [
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
];

const SIDE = 32;
const PLANE = SIDE * SIDE;
const IMAGE_BYTES = 3 * PLANE;

/** Options of {@link CifarDataset.open}. */
export interface CifarOptions {
  /** `'cifar10'` (1 label byte per record, 3073 bytes) or `'cifar100'` (coarse then fine label byte, 3074 bytes). */
  variant: 'cifar10' | 'cifar100';
  /** CIFAR-100 only: the fine labels (100 classes, default) or the coarse ones (20 superclasses). */
  label?: 'fine' | 'coarse';
  /**
   * Class names by label; default {@link CIFAR10_CLASSES} for CIFAR-10 and `'0'` … `'99'` (or
   * `'19'` for coarse labels) for CIFAR-100.
   */
  classes?: readonly string[];
}

/** The spec of a {@link CifarDataset}: the files, reopened by workers. */
export interface CifarSpec extends DatasetSpec {
  kind: 'Cifar';
  files: string[];
  variant: 'cifar10' | 'cifar100';
  label: 'fine' | 'coarse';
  classes: string[];
}

/**
 * CIFAR-10 or CIFAR-100 from its binary files, the samples of all files in the order given.
 * Samples are decoded 32x32 RGB images in HWC order (converted from the files' planar layout).
 *
 * ```ts
 * const train = await CifarDataset.open([1, 2, 3, 4, 5].map((i) => `cifar-10-batches-bin/data_batch_${i}.bin`), { variant: 'cifar10' });
 * ```
 */
export class CifarDataset implements Dataset {
  /** Absolute paths of the files, in sample order. */
  readonly files: readonly string[];
  /** Which CIFAR. */
  readonly variant: 'cifar10' | 'cifar100';
  /** Which labels (always `'fine'` for CIFAR-10). */
  readonly labelKind: 'fine' | 'coarse';
  /** Class names by label. */
  readonly classes: readonly string[];
  readonly #buffers: Uint8Array[];
  /** First sample index of each file, plus the total at the end. */
  readonly #starts: number[];
  readonly #recordBytes: number;
  readonly #labelOffset: number;

  /** `[height, width, channels]` of every sample. */
  get imageShape(): readonly [number, number, number] {
    return [SIDE, SIDE, 3];
  }

  private constructor(
    files: string[],
    variant: 'cifar10' | 'cifar100',
    labelKind: 'fine' | 'coarse',
    classes: string[],
    buffers: Uint8Array[],
  ) {
    this.files = Object.freeze(files);
    this.variant = variant;
    this.labelKind = labelKind;
    this.classes = Object.freeze(classes);
    this.#buffers = buffers;
    this.#recordBytes = variant === 'cifar10' ? 1 + IMAGE_BYTES : 2 + IMAGE_BYTES;
    // CIFAR-100 records hold the coarse label, then the fine one.
    this.#labelOffset = variant === 'cifar100' && labelKind === 'fine' ? 1 : 0;
    this.#starts = [0];
    for (const b of buffers) this.#starts.push(this.#starts[this.#starts.length - 1]! + b.length / this.#recordBytes);
  }

  /**
   * Reads and validates the files.
   * @throws `ERR_RC_CORRUPT_FILE` naming the file when its size is not a whole number of records
   *   or a label is out of range; `ERR_RC_DATASET` when a file cannot be read or there are no
   *   records at all.
   */
  static async open(files: readonly string[], options: CifarOptions): Promise<CifarDataset> {
    const paths = expectStrings('files', files, { nonEmpty: true }).map((f) => path.resolve(f));
    if (options === undefined) {
      invalid('CifarDataset options', "an options object with variant 'cifar10' or 'cifar100'", options);
    }
    const o = expectOptions<CifarOptions>('CifarDataset options', options, ['variant', 'label', 'classes']);
    const variant = expectOneOf('variant', o.variant, ['cifar10', 'cifar100'] as const);
    let labelKind: 'fine' | 'coarse' = 'fine';
    if (o.label !== undefined) {
      labelKind = expectOneOf(
        'label',
        o.label,
        variant === 'cifar10' ? (['fine'] as const) : (['fine', 'coarse'] as const),
      );
    }
    const classCount = variant === 'cifar10' ? 10 : labelKind === 'fine' ? 100 : 20;
    const classes = resolveClassNames(
      'classes',
      o.classes,
      variant === 'cifar10' ? CIFAR10_CLASSES : numberedClasses(classCount),
    );
    if (o.classes !== undefined && classes.length !== classCount) {
      invalid(
        'classes',
        `${classCount} class names for ${variant}${variant === 'cifar100' ? ` ${labelKind} labels` : ''}`,
        o.classes,
      );
    }
    const recordBytes = variant === 'cifar10' ? 1 + IMAGE_BYTES : 2 + IMAGE_BYTES;
    const buffers = await Promise.all(
      paths.map(async (file) => {
        let bytes: Uint8Array;
        try {
          bytes = await readFile(file);
        } catch (error) {
          throw datasetError(
            `Cannot read the ${variant} file: ${error instanceof Error ? error.message : String(error)}`,
          );
        }
        if (bytes.length % recordBytes !== 0) {
          const hint =
            bytes.length % (variant === 'cifar10' ? recordBytes + 1 : recordBytes - 1) === 0
              ? ` (its size fits ${variant === 'cifar10' ? 'cifar100' : 'cifar10'} records: is variant right?)`
              : '';
          throw corruptFileError(
            file,
            `is not a whole number of ${variant} records: ${bytes.length} bytes is ${Math.floor(bytes.length / recordBytes)} records of ${recordBytes} bytes and ${bytes.length % recordBytes} bytes over${hint}`,
          );
        }
        // Every label byte is checked here, once, so that label(i) can never return a class that
        // does not exist (a wrong variant usually shows up here too).
        const labelBytes = recordBytes - IMAGE_BYTES;
        for (let r = 0, at = 0; at < bytes.length; r++, at += recordBytes) {
          for (let k = 0; k < labelBytes; k++) {
            const limit = variant === 'cifar10' ? 10 : k === 0 ? 20 : 100;
            if (bytes[at + k]! >= limit) {
              const which = variant === 'cifar10' ? 'label' : k === 0 ? 'coarse label' : 'fine label';
              throw corruptFileError(
                file,
                `holds ${which} ${bytes[at + k]} in record ${r}, but ${variant} has ${limit} such classes (is variant right?)`,
              );
            }
          }
        }
        return bytes;
      }),
    );
    if (buffers.every((b) => b.length === 0)) {
      throw datasetError(`The ${variant} files hold no records: ${paths.map((p) => `'${p}'`).join(', ')}`);
    }
    return new CifarDataset(paths, variant, labelKind, classes, buffers);
  }

  /** Reopens the files named by {@link CifarDataset.spec}. */
  static async fromSpec(spec: DatasetSpec): Promise<CifarDataset> {
    const s = expectSpec(spec, 'Cifar');
    return CifarDataset.open(s.files as string[], {
      variant: s.variant as CifarOptions['variant'],
      label: s.label as CifarOptions['label'],
      classes: s.classes as string[],
    });
  }

  /** Number of samples. */
  get length(): number {
    return this.#starts[this.#starts.length - 1]!;
  }

  #locate(index: number): [Uint8Array, number] {
    const i = checkIndex(index, this.length);
    // Binary search for the file: a handful of files, but the loop is as short as a linear one.
    let lo = 0;
    let hi = this.#buffers.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.#starts[mid]! <= i) lo = mid;
      else hi = mid - 1;
    }
    return [this.#buffers[lo]!, (i - this.#starts[lo]!) * this.#recordBytes];
  }

  /** Label of sample `index`. */
  label(index: number): number {
    const [buffer, at] = this.#locate(index);
    return buffer[at + this.#labelOffset]!;
  }

  /** Sample `index`: a 32x32x3 RGB image, HWC (a copy, safe to transfer). */
  get(index: number): Promise<RawSample> {
    return promiseOf(() => this.#sample(index));
  }

  // `get`'s sample, read from memory (or drawn) at once.
  #sample(index: number): RawSample {
    const [buffer, at] = this.#locate(index);
    const planes = at + this.#recordBytes - IMAGE_BYTES;
    const data = new Uint8Array(IMAGE_BYTES);
    for (let p = 0; p < PLANE; p++) {
      data[3 * p] = buffer[planes + p]!;
      data[3 * p + 1] = buffer[planes + PLANE + p]!;
      data[3 * p + 2] = buffer[planes + 2 * PLANE + p]!;
    }
    return {
      source: { kind: 'decoded', image: { data, height: SIDE, width: SIDE, channels: 3 } },
      label: buffer[at + this.#labelOffset]!,
    };
  }

  /** The files, variant, label kind and class names. */
  spec(): CifarSpec {
    return {
      kind: 'Cifar',
      files: [...this.files],
      variant: this.variant,
      label: this.labelKind,
      classes: [...this.classes],
    };
  }
}
