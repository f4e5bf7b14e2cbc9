/**
 * `ImageFolder`: a folder of images with one sub-folder per class, read the way torchvision's
 * `datasets.ImageFolder` reads it, so that class indices and sample order match a PyTorch run on
 * the same folder. Optionally checks every image's header at open time, and caches the scan in a
 * JSON index for folders too large to walk at every start.
 * @packageDocumentation
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { lstat, readFile, readdir, rename, stat, unlink, writeFile } from 'node:fs/promises';
import * as path from 'node:path';
import { ResnetError, expectBool, expectOneOf, expectOptions, invalid } from '../errors.js';
import {
  checkIndex,
  compareCodePoints,
  corruptFileError,
  datasetError,
  expectIntArray,
  expectSpec,
  expectStrings,
  mapLimit,
} from './dataset.js';
import type { Dataset, DatasetSpec, RawSample } from './types.js';

/**
 * The file extensions `ImageFolder` takes by default: those of torchvision's `IMG_EXTENSIONS`
 * that sharp decodes (JPEG, PNG, WebP). Matched case-insensitively.
 */
export const IMG_EXTENSIONS: readonly string[] = ['.jpg', '.jpeg', '.png', '.webp'];

/** The index file `cache: true` writes, in the dataset's root. */
export const INDEX_FILE_NAME = '.resnet-cuda-index.json';

/** Options of {@link ImageFolder.open}. */
export interface ImageFolderOptions {
  /** Extensions to take, with the dot, any case; default {@link IMG_EXTENSIONS}. */
  extensions?: readonly string[];
  /**
   * Read every image's header with sharp at open time (which finds files that are not images, or
   * are of a format sharp cannot read, but not a file truncated after its header). Default false
   * (fast; a bad file then fails when the transform pipeline decodes it), or true when
   * `onCorrupt` is `'skip'`.
   */
  checkImages?: boolean;
  /**
   * What the header check does with a bad file: `'error'` (default) throws `ERR_RC_CORRUPT_FILE`
   * naming the first bad file and what is wrong; `'skip'` leaves bad files out and lists them in
   * {@link ImageFolder.skipped}.
   */
  onCorrupt?: 'error' | 'skip';
  /**
   * Keep the scan in a JSON index: `true` for `<root>/.resnet-cuda-index.json`, or the index
   * file's path (for read-only datasets). The index is reused only when the class folders are the
   * same and every scanned directory still has its recorded modification time and entry count
   * (so adding, removing or renaming a file invalidates it; editing a file in place does not).
   * Default false.
   */
  cache?: boolean | string;
}

/** A file left out by `onCorrupt: 'skip'`. */
export interface SkippedFile {
  /** Absolute path of the file. */
  path: string;
  /** What sharp said when reading its header. */
  reason: string;
}

/** The spec of an {@link ImageFolder}: the file list, so workers rebuild it without scanning. */
export interface ImageFolderSpec extends DatasetSpec {
  kind: 'ImageFolder';
  /** Absolute root folder. */
  root: string;
  /** File paths relative to `root`, in sample order. */
  files: string[];
  /** Label per file. */
  labels: number[];
  /** Class names by label. */
  classes: string[];
}

/** A scanned directory's stamp, for validating the index cache. */
interface DirStamp {
  /** Path relative to the root. */
  path: string;
  mtimeMs: number;
  entries: number;
}

/** The index cache file's contents. */
interface IndexFile {
  format: 'resnet-cuda ImageFolder index';
  version: 1;
  root: string;
  extensions: string[];
  checkImages: boolean;
  classes: string[];
  files: string[];
  labels: number[];
  skipped: { path: string; reason: string }[];
  dirs: DirStamp[];
}

interface Scan {
  classes: string[];
  files: string[];
  labels: number[];
  skipped: { path: string; reason: string }[];
  dirs: DirStamp[];
}

function systemMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * Refuses an entry of `dir` whose name is not valid UTF-8: Node decodes such a name with U+FFFD in
 * place of the bad bytes, and the decoded name names no file (reading it would give ENOENT).
 */
async function expectUtf8Name(dir: string, name: string, what: string): Promise<void> {
  if (!name.includes('\uFFFD')) return;
  if (
    await lstat(path.join(dir, name)).then(
      () => true,
      () => false,
    )
  ) {
    return;
  } // a real U+FFFD
  throw datasetError(
    `The ${what} '${name}' in '${dir}' has a name that is not valid UTF-8 (shown with \uFFFD for the bytes that are not), ` +
      'which cannot be opened by its decoded name: rename it to UTF-8',
  );
}

/**
 * Class folders of `root`, sorted as torchvision's `find_classes` sorts them:
 * `sorted(entry.name for entry in os.scandir(root) if entry.is_dir())`, by code point, and
 * following symbolic links as `is_dir()` does.
 */
async function findClasses(root: string): Promise<string[]> {
  let entries;
  try {
    entries = await readdir(root, { withFileTypes: true });
  } catch (error) {
    throw datasetError(`Cannot list the ImageFolder root '${root}': ${systemMessage(error)}`);
  }
  const classes: string[] = [];
  for (const entry of entries) {
    if (entry.isDirectory()) classes.push(entry.name);
    else if (
      entry.isSymbolicLink() &&
      (await stat(path.join(root, entry.name)).then(
        (s) => s.isDirectory(),
        () => false,
      ))
    ) {
      classes.push(entry.name);
    }
  }
  for (const name of classes) await expectUtf8Name(root, name, 'class folder');
  return classes.sort(compareCodePoints);
}

/**
 * The image files of one class folder in torchvision's `make_dataset` order:
 * `for root, _, fnames in sorted(os.walk(class_dir, followlinks=True)): for fname in sorted(fnames)`
 * — sub-folders included, directories ordered by their path, files by name, all by code point.
 */
async function walkClass(
  root: string,
  className: string,
  extensions: readonly string[],
): Promise<{ files: string[]; dirs: DirStamp[] }> {
  const found: { suffix: string; files: string[] }[] = [];
  const dirs: DirStamp[] = [];
  // Directories already walked (device and inode): a symbolic link back up the tree would make
  // os.walk loop forever; here it is walked once.
  const visited = new Set<string>();
  const visit = async (dir: string, suffix: string): Promise<void> => {
    let entries;
    let st;
    try {
      st = await stat(dir);
      entries = await readdir(dir, { withFileTypes: true });
    } catch (error) {
      throw datasetError(`Cannot list the folder '${dir}' of class '${className}': ${systemMessage(error)}`);
    }
    const key = `${st.dev}:${st.ino}`;
    if (visited.has(key)) return;
    visited.add(key);
    dirs.push({ path: path.relative(root, dir), mtimeMs: st.mtimeMs, entries: entries.length });
    const files: string[] = [];
    const subdirs: string[] = [];
    for (const entry of entries) {
      let isDir = entry.isDirectory();
      if (entry.isSymbolicLink()) {
        isDir = await stat(path.join(dir, entry.name)).then(
          (s) => s.isDirectory(),
          () => false,
        );
      }
      if (isDir) subdirs.push(entry.name);
      else if (hasExtension(entry.name, extensions)) files.push(entry.name);
      else continue;
      await expectUtf8Name(dir, entry.name, isDir ? 'folder' : 'file');
    }
    found.push({ suffix, files });
    for (const sub of subdirs) await visit(path.join(dir, sub), `${suffix}/${sub}`);
  };
  await visit(path.join(root, className), '');
  found.sort((a, b) => compareCodePoints(a.suffix, b.suffix));
  const files: string[] = [];
  for (const { suffix, files: names } of found) {
    for (const name of names.sort(compareCodePoints)) files.push(`${className}${suffix}/${name}`);
  }
  return { files, dirs };
}

function hasExtension(name: string, extensions: readonly string[]): boolean {
  const lower = name.toLowerCase();
  return extensions.some((ext) => lower.endsWith(ext));
}

/** Reads every file's header with sharp; returns the reason per bad file (undefined when good). */
async function checkHeaders(root: string, files: readonly string[]): Promise<(string | undefined)[]> {
  const { default: sharp } = await import('sharp');
  return mapLimit(files, 16, async (file) => {
    try {
      const meta = await sharp(path.join(root, file)).metadata();
      if (!meta.width || !meta.height) return `sharp found no image size in its ${meta.format ?? 'unknown'} header`;
      return undefined;
    } catch (error) {
      return systemMessage(error);
    }
  });
}

/** Reads a cached index and returns it when it still describes the folder, else undefined. */
async function readIndex(
  cachePath: string,
  root: string,
  extensions: string[],
  checkImages: boolean,
  classes: string[],
): Promise<IndexFile | undefined> {
  let index: IndexFile;
  try {
    index = JSON.parse(await readFile(cachePath, 'utf8')) as IndexFile;
  } catch {
    return undefined; // missing or unreadable: scan and rewrite it
  }
  if (
    index?.format !== 'resnet-cuda ImageFolder index' ||
    index.version !== 1 ||
    index.root !== root ||
    index.checkImages !== checkImages ||
    JSON.stringify(index.extensions) !== JSON.stringify(extensions) ||
    JSON.stringify(index.classes) !== JSON.stringify(classes) ||
    !Array.isArray(index.dirs) ||
    !Array.isArray(index.files) ||
    !Array.isArray(index.labels) ||
    !Array.isArray(index.skipped) ||
    index.files.length !== index.labels.length
  ) {
    return undefined;
  }
  const fresh = await mapLimit(index.dirs, 32, async (d) => {
    try {
      const dir = path.join(root, d.path);
      const st = await stat(dir);
      return st.mtimeMs === d.mtimeMs && (await readdir(dir)).length === d.entries;
    } catch {
      return false;
    }
  });
  return fresh.every(Boolean) ? index : undefined;
}

/** Writes the index atomically (a temporary file renamed over the target). */
async function writeIndex(cachePath: string, index: IndexFile): Promise<void> {
  const temp = `${cachePath}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  try {
    await writeFile(temp, JSON.stringify(index));
    await rename(temp, cachePath);
  } catch (error) {
    await unlink(temp).catch(() => undefined);
    // The index only saves time; a read-only dataset folder should not stop training.
    process.emitWarning(
      `Cannot write the ImageFolder index '${cachePath}' (${systemMessage(error)}); give cache a writable path to keep it`,
      {
        code: 'RC_IMAGEFOLDER_INDEX',
      },
    );
  }
}

/**
 * A dataset of image files, one folder per class, read like torchvision's `ImageFolder`:
 *
 * - classes are the sub-folders of `root`, sorted by code point (`'B'` before `'a'`), and a
 *   sample's label is its class's index;
 * - samples are the files under each class folder (sub-folders included) whose extension is one of
 *   `extensions`, in `os.walk` order with names sorted by code point;
 * - `get(i)` reads the file and yields its encoded bytes; the transform pipeline decodes them.
 *
 * As in torchvision, every sub-folder of `root` is a class, hidden ones included: a stray
 * `.ipynb_checkpoints` folder is reported as a class without images.
 *
 * ```ts
 * const train = await ImageFolder.open('data/train', { cache: true });
 * train.classes;            // ['cat', 'dog']
 * await train.get(0);       // { source: { kind: 'encoded', bytes, path }, label: 0 }
 * ```
 */
export class ImageFolder implements Dataset {
  /** Absolute root folder. */
  readonly root: string;
  /** Class names by label (the class folders, sorted). */
  readonly classes: readonly string[];
  /** Label of each class name (torchvision's `class_to_idx`). */
  readonly classToIdx: ReadonlyMap<string, number>;
  /** Files the header check left out (`onCorrupt: 'skip'`); empty otherwise. */
  readonly skipped: readonly SkippedFile[];
  /** Whether `open` took the file list from the index cache instead of scanning. */
  readonly fromCache: boolean;
  readonly #files: readonly string[];
  readonly #labels: Int32Array;

  private constructor(
    root: string,
    classes: string[],
    files: string[],
    labels: Int32Array,
    skipped: SkippedFile[],
    fromCache: boolean,
  ) {
    this.root = root;
    this.classes = Object.freeze(classes);
    this.classToIdx = new Map(classes.map((c, i) => [c, i]));
    this.#files = files;
    this.#labels = labels;
    this.skipped = Object.freeze(skipped);
    this.fromCache = fromCache;
  }

  /**
   * Scans `root` (or reuses the index cache) and returns the dataset.
   * @throws `ERR_RC_DATASET` when `root` cannot be read, has no class folders, or a class has no
   *   image file; `ERR_RC_CORRUPT_FILE` when `checkImages` finds a bad file and `onCorrupt` is
   *   `'error'`; `ERR_RC_INVALID_ARGUMENT` for bad options.
   */
  static async open(root: string, options?: ImageFolderOptions): Promise<ImageFolder> {
    if (typeof root !== 'string' || root.length === 0) invalid('root', 'a folder path', root);
    const o = expectOptions<ImageFolderOptions>('ImageFolder options', options, [
      'extensions',
      'checkImages',
      'onCorrupt',
      'cache',
    ]);
    const extensions = (
      o.extensions === undefined ? [...IMG_EXTENSIONS] : expectStrings('extensions', o.extensions, { nonEmpty: true })
    ).map((e, i) => {
      if (!e.startsWith('.') || e.length < 2) invalid(`extensions[${i}]`, "an extension starting with '.'", e);
      return e.toLowerCase();
    });
    const onCorrupt =
      o.onCorrupt === undefined ? 'error' : expectOneOf('onCorrupt', o.onCorrupt, ['error', 'skip'] as const);
    const checkImages = o.checkImages === undefined ? onCorrupt === 'skip' : expectBool('checkImages', o.checkImages);
    if (onCorrupt === 'skip' && !checkImages) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        "Expected checkImages true (or omitted) with onCorrupt 'skip' but received false: only the header check can skip files",
      );
    }
    let cachePath: string | undefined;
    if (o.cache !== undefined && o.cache !== false) {
      if (o.cache === true) cachePath = path.join(path.resolve(root), INDEX_FILE_NAME);
      else if (typeof o.cache === 'string' && o.cache.length > 0) cachePath = path.resolve(o.cache);
      else invalid('cache', 'a boolean or an index file path', o.cache);
    }

    const absRoot = path.resolve(root);
    const rootStat = await stat(absRoot).catch((error: unknown) => {
      throw datasetError(`ImageFolder root '${absRoot}' cannot be read: ${systemMessage(error)}`);
    });
    if (!rootStat.isDirectory()) throw datasetError(`ImageFolder root '${absRoot}' is not a folder`);
    const classes = await findClasses(absRoot);
    if (classes.length === 0) {
      throw datasetError(
        `Found no class folders in '${absRoot}': ImageFolder expects one sub-folder per class, holding that class's images (root/<class>/<image>)`,
      );
    }

    let scan: Scan | undefined;
    let fromCache = false;
    if (cachePath !== undefined) {
      scan = await readIndex(cachePath, absRoot, extensions, checkImages, classes);
      fromCache = scan !== undefined;
    }
    if (scan === undefined) {
      scan = await ImageFolder.#scan(absRoot, classes, extensions, checkImages);
      if (cachePath !== undefined) {
        await writeIndex(cachePath, {
          format: 'resnet-cuda ImageFolder index',
          version: 1,
          root: absRoot,
          extensions,
          checkImages,
          ...scan,
        });
      }
    }
    if (scan.skipped.length > 0 && onCorrupt === 'error') {
      const first = scan.skipped[0]!;
      const more = scan.skipped.length - 1;
      throw corruptFileError(
        path.join(absRoot, first.path),
        `cannot be read as an image: ${first.reason}` +
          (more > 0 ? ` (and ${more} more file${more === 1 ? '' : 's'} failed the check)` : '') +
          "; remove it, or open with onCorrupt: 'skip' to leave bad files out",
      );
    }
    // Checked after skipping, so that a class whose every file is bad is reported, not dropped:
    // dropping it would renumber the labels of the classes after it.
    const counts = new Array<number>(classes.length).fill(0);
    for (const label of scan.labels) counts[label]! += 1;
    const empty = classes.filter((_, i) => counts[i] === 0);
    if (empty.length > 0) {
      throw datasetError(
        `Found no valid image file for the class${empty.length === 1 ? '' : 'es'} ${empty.map((c) => `'${c}'`).join(', ')} in '${absRoot}'` +
          `${scan.skipped.length > 0 ? ` (${scan.skipped.length} file(s) failed the image check)` : ''}. Supported extensions are: ${extensions.join(', ')}`,
      );
    }
    const skipped = scan.skipped.map((s) => ({ path: path.join(absRoot, s.path), reason: s.reason }));
    return new ImageFolder(absRoot, classes, scan.files, Int32Array.from(scan.labels), skipped, fromCache);
  }

  static async #scan(root: string, classes: string[], extensions: string[], checkImages: boolean): Promise<Scan> {
    const walks = await mapLimit(classes, 16, (c) => walkClass(root, c, extensions));
    let files: string[] = [];
    let labels: number[] = [];
    const dirs: DirStamp[] = [];
    walks.forEach((w, label) => {
      for (const f of w.files) {
        files.push(f);
        labels.push(label);
      }
      dirs.push(...w.dirs);
    });
    const skipped: { path: string; reason: string }[] = [];
    if (checkImages) {
      const reasons = await checkHeaders(root, files);
      const keptFiles: string[] = [];
      const keptLabels: number[] = [];
      reasons.forEach((reason, i) => {
        if (reason === undefined) {
          keptFiles.push(files[i]!);
          keptLabels.push(labels[i]!);
        } else {
          skipped.push({ path: files[i]!, reason });
        }
      });
      files = keptFiles;
      labels = keptLabels;
    }
    return { classes, files, labels, skipped, dirs };
  }

  /** Rebuilds the dataset from {@link ImageFolder.spec} without touching the file system. */
  static fromSpec(spec: DatasetSpec): ImageFolder {
    const s = expectSpec(spec, 'ImageFolder');
    if (typeof s.root !== 'string' || !path.isAbsolute(s.root)) invalid('spec.root', 'an absolute folder path', s.root);
    const classes = expectStrings('spec.classes', s.classes, { nonEmpty: true, unique: true });
    const files = expectStrings('spec.files', s.files);
    const labels = expectIntArray('spec.labels', s.labels, 0, classes.length - 1);
    if (labels.length !== files.length) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `Expected as many spec.labels as spec.files (${files.length}) but received ${labels.length}`,
      );
    }
    return new ImageFolder(s.root, classes, files, labels, [], false);
  }

  /** Number of samples. */
  get length(): number {
    return this.#files.length;
  }

  /** Absolute path of sample `index`'s file. */
  path(index: number): string {
    return path.join(this.root, this.#files[checkIndex(index, this.length)]!);
  }

  /** Label of sample `index` (its class folder's index). */
  label(index: number): number {
    return this.#labels[checkIndex(index, this.length)]!;
  }

  /**
   * Reads sample `index`'s file.
   * @throws `ERR_RC_DATASET` naming the file when it cannot be read.
   */
  async get(index: number): Promise<RawSample> {
    const file = this.path(index);
    let buffer: Buffer;
    try {
      buffer = await readFile(file);
    } catch (error) {
      throw this.#readError(index, file, error);
    }
    return this.#sample(index, file, buffer);
  }

  /**
   * {@link ImageFolder.get} with a blocking read, for the DataLoader's worker threads: a thread
   * that only fills batches loses nothing by blocking, and a read from the page cache costs far
   * less than the round trips of an asynchronous one through libuv's threadpool.
   * @internal
   */
  getSync(index: number): RawSample {
    const file = this.path(index);
    let buffer: Buffer;
    try {
      buffer = readFileSync(file);
    } catch (error) {
      throw this.#readError(index, file, error);
    }
    return this.#sample(index, file, buffer);
  }

  /** The `ERR_RC_DATASET` error for a file that cannot be read, with the file as its `path`. */
  #readError(index: number, file: string, error: unknown): Error {
    const wrapped = datasetError(
      `Cannot read sample ${index} (class '${this.classes[this.#labels[index]!]}') of the ImageFolder '${this.root}': ${systemMessage(error)}`,
    );
    return Object.assign(wrapped, { path: file, cause: error });
  }

  #sample(index: number, file: string, buffer: Buffer): RawSample {
    // A plain Uint8Array over memory of its own, so that a loader can transfer its buffer to
    // another thread without detaching anything else (small Buffers may share a pool).
    const bytes =
      buffer.byteOffset === 0 && buffer.byteLength === buffer.buffer.byteLength
        ? new Uint8Array(buffer.buffer, 0, buffer.byteLength)
        : new Uint8Array(buffer);
    return { source: { kind: 'encoded', bytes, path: file }, label: this.#labels[index]! };
  }

  /** The file list and labels; workers rebuild the dataset from it without scanning. */
  spec(): ImageFolderSpec {
    return {
      kind: 'ImageFolder',
      root: this.root,
      files: [...this.#files],
      labels: Array.from(this.#labels),
      classes: [...this.classes],
    };
  }
}
