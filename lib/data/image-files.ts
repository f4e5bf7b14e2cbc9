/**
 * `ImageFiles`: a flat list of image files without labels, for inference (`resnet-cuda predict`)
 * through the same transforms and DataLoader as training.
 * @packageDocumentation
 */
import { readFile, stat } from 'node:fs/promises';
import * as path from 'node:path';
import { invalid } from '../errors.js';
import { checkIndex, datasetError, expectSpec, expectStrings, mapLimit } from './dataset.js';
import type { Dataset, DatasetSpec, RawSample } from './types.js';

/**
 * The label every {@link ImageFiles} sample carries: the files have no class, and -1 can never be
 * mistaken for one (the loader passes labels through untouched; only a loss would object).
 */
export const NO_LABEL = -1;

/** The spec of an {@link ImageFiles}: the absolute paths, in sample order. */
export interface ImageFilesSpec extends DatasetSpec {
  kind: 'ImageFiles';
  files: string[];
}

/**
 * Image files given by path (JPEG, PNG, WebP: whatever sharp decodes), in the order given, each
 * with the label {@link NO_LABEL}. Sample `i` yields file `i`'s encoded bytes; the transform
 * pipeline decodes them.
 *
 * ```ts
 * const images = await ImageFiles.open(['cat.jpg', 'dog.png']);
 * const loader = new DataLoader(images, { batchSize: 32, transform: valTransform, workers: 1 });
 * ```
 */
export class ImageFiles implements Dataset {
  /** Absolute paths, in sample order. */
  readonly files: readonly string[];
  /** No class names: the files are unlabelled. */
  readonly classes: readonly string[] = Object.freeze([]);

  private constructor(files: string[]) {
    this.files = Object.freeze(files);
  }

  /**
   * Checks that every path is a readable file and returns the dataset.
   * @throws `ERR_RC_DATASET` naming the first path that is missing or is not a file;
   *   `ERR_RC_INVALID_ARGUMENT` for an empty list.
   */
  static async open(files: readonly string[]): Promise<ImageFiles> {
    const paths = expectStrings('files', files, { nonEmpty: true }).map((f) => path.resolve(f));
    const problems = await mapLimit(paths, 16, async (file) => {
      try {
        return (await stat(file)).isFile() ? undefined : 'is not a file';
      } catch (error) {
        return `cannot be read (${error instanceof Error ? error.message : String(error)})`;
      }
    });
    const bad = problems.findIndex((p) => p !== undefined);
    if (bad >= 0) throw datasetError(`Image file '${paths[bad]}' ${problems[bad]}`);
    return new ImageFiles(paths);
  }

  /** Rebuilds the dataset from {@link ImageFiles.spec} without touching the file system. */
  static fromSpec(spec: DatasetSpec): ImageFiles {
    const s = expectSpec(spec, 'ImageFiles');
    const files = expectStrings('spec.files', s.files);
    files.forEach((f, i) => {
      if (!path.isAbsolute(f)) invalid(`spec.files[${i}]`, 'an absolute path', f);
    });
    return new ImageFiles(files);
  }

  /** Number of files. */
  get length(): number {
    return this.files.length;
  }

  /** Always {@link NO_LABEL}. */
  label(index: number): number {
    checkIndex(index, this.length);
    return NO_LABEL;
  }

  /**
   * Reads file `index`.
   * @throws `ERR_RC_DATASET` naming the file when it cannot be read.
   */
  async get(index: number): Promise<RawSample> {
    const file = this.files[checkIndex(index, this.length)]!;
    let buffer: Buffer;
    try {
      buffer = await readFile(file);
    } catch (error) {
      throw datasetError(
        `Cannot read the image file '${file}': ${error instanceof Error ? error.message : String(error)}`,
      );
    }
    // Memory of its own, so that a loader can transfer it between threads (small Buffers share a pool).
    const bytes =
      buffer.byteOffset === 0 && buffer.byteLength === buffer.buffer.byteLength
        ? new Uint8Array(buffer.buffer, 0, buffer.byteLength)
        : new Uint8Array(buffer);
    return { source: { kind: 'encoded', bytes, path: file }, label: NO_LABEL };
  }

  /** The file list. */
  spec(): ImageFilesSpec {
    return { kind: 'ImageFiles', files: [...this.files] };
  }
}
