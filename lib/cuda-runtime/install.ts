/**
 * Installing the CUDA runtime libraries (cuBLAS, cuDNN, NCCL) from their pinned PyPI wheels into
 * `<cache>/cuda-runtime-<key>/lib`, where the CUDA backend looks for them: each wheel's sha256 is
 * taken from the index's JSON API and checked before anything is unpacked, only the shared
 * libraries are unpacked, and the folder appears under its final name only once complete.
 * @packageDocumentation
 */
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream, existsSync } from 'node:fs';
import { mkdir, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ResnetError } from '../errors.js';
import { RUNTIME_LAYOUT, RUNTIME_MARKER, runtimeKey, runtimePins, type WheelPin } from './pins.js';
import { extractWheelLibraries } from './wheel.js';

/** PyPI's JSON API: `<index>/<project>/<version>/json`. */
export const DEFAULT_INDEX_URL = 'https://pypi.org/pypi';

/** Options of {@link installCudaRuntime}. */
export interface InstallCudaRuntimeOptions {
  /** The cache folder (see `defaultCudaCache`); wheels go to `wheels/`, libraries to `cuda-runtime-<key>/lib`. */
  cacheDir: string;
  /** The JSON API's base URL; default {@link DEFAULT_INDEX_URL}. */
  indexUrl?: string;
  /** The wheels to install; default the runtime pins of native/cuda/pins.txt. */
  pins?: readonly WheelPin[];
  /** Install again even when the folder is complete. */
  reinstall?: boolean;
  /** How long a request may wait for the next bytes, in ms; default 60 000. */
  idleTimeoutMs?: number;
  /** The platform tag a wheel must end with; default this machine's (`x86_64` or `aarch64`). */
  machine?: string;
  /** Progress lines. */
  log?: (line: string) => void;
}

/** What {@link installCudaRuntime} did. */
export interface InstallCudaRuntimeResult {
  /** `<cache>/cuda-runtime-<key>`. */
  dir: string;
  /** `<dir>/lib`, the folder the libraries are in. */
  libDir: string;
  /** Whether it was complete already (nothing was done). */
  present: boolean;
  /** The wheels downloaded this time (file names). */
  downloaded: string[];
  /** The libraries unpacked (file names). */
  libraries: string[];
}

/** One file of a release in PyPI's JSON API. */
interface ReleaseFile {
  filename: string;
  url: string;
  packagetype?: string;
  digests?: { sha256?: string };
}

/** The wheel chosen for this machine, with the digest it must have. */
interface WheelFile {
  filename: string;
  url: string;
  sha256: string;
}

function downloadError(message: string): ResnetError {
  return new ResnetError('ERR_RC_DOWNLOAD', message);
}

/** `fetch` whose body must keep arriving: aborted after `idleMs` without a byte. */
async function fetchWithIdleTimeout(
  url: string,
  idleMs: number,
  onChunk: (chunk: Uint8Array) => void | Promise<void>,
): Promise<void> {
  const controller = new AbortController();
  let timer = setTimeout(() => controller.abort(), idleMs);
  const rearm = () => {
    clearTimeout(timer);
    timer = setTimeout(() => controller.abort(), idleMs);
  };
  try {
    const response = await fetch(url, { signal: controller.signal, redirect: 'follow' });
    if (!response.ok || response.body === null) throw downloadError(`GET ${url}: HTTP ${response.status}`);
    for await (const chunk of response.body as AsyncIterable<Uint8Array>) {
      rearm();
      await onChunk(chunk);
    }
  } catch (error) {
    if (error instanceof ResnetError) throw error;
    const why = controller.signal.aborted
      ? `no data for ${idleMs / 1000} s`
      : error instanceof Error
        ? error.cause instanceof Error
          ? error.cause.message
          : error.message
        : String(error);
    throw downloadError(`GET ${url} failed: ${why}`);
  } finally {
    clearTimeout(timer);
  }
}

/** A JSON document from the index; `undefined` when it answers 404. */
async function fetchJson(url: string, idleMs: number): Promise<unknown> {
  const chunks: Uint8Array[] = [];
  try {
    await fetchWithIdleTimeout(url, idleMs, (c) => void chunks.push(c));
  } catch (error) {
    if (error instanceof ResnetError && error.message.endsWith(': HTTP 404')) return undefined;
    throw error;
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown;
  } catch (error) {
    throw downloadError(`${url} is not JSON: ${(error as Error).message}`);
  }
}

/**
 * The files of release `pin` from the index's JSON API: `<index>/<name>/<version>/json` (its
 * `urls`), else, where only the project's document is served, `<index>/<name>/json` (its
 * `releases[version]`).
 */
async function releaseFiles(
  pin: WheelPin,
  indexUrl: string,
  idleMs: number,
): Promise<{ url: string; files: ReleaseFile[] }> {
  const base = `${indexUrl.replace(/\/+$/, '')}/${pin.name}`;
  const release = `${base}/${pin.version}/json`;
  const one = (await fetchJson(release, idleMs)) as { urls?: unknown } | undefined;
  if (one !== undefined) {
    if (!Array.isArray(one.urls)) {
      throw downloadError(`${release} is not a release in PyPI's JSON format (no "urls" list)`);
    }
    return { url: release, files: one.urls as ReleaseFile[] };
  }
  const project = `${base}/json`;
  const all = (await fetchJson(project, idleMs)) as { releases?: Record<string, unknown> } | undefined;
  if (all === undefined) {
    throw downloadError(`GET ${release}: HTTP 404 (and ${project} too): is ${pin.name} on this index?`);
  }
  const files = all.releases?.[pin.version];
  if (!Array.isArray(files)) throw downloadError(`${project} lists no release ${pin.version} of ${pin.name}`);
  return { url: project, files: files as ReleaseFile[] };
}

/** The release's wheel for this machine and its sha256, from the index's JSON API. */
async function findWheel(pin: WheelPin, indexUrl: string, machine: string, idleMs: number): Promise<WheelFile> {
  const { url, files } = await releaseFiles(pin, indexUrl, idleMs);
  const wheel = files.find(
    (f) =>
      (f.packagetype ?? 'bdist_wheel') === 'bdist_wheel' &&
      /^[A-Za-z0-9._]+-[^-]+-py3-none-[A-Za-z0-9._]*manylinux[A-Za-z0-9._]*\.whl$/.test(f.filename) &&
      f.filename.endsWith(`_${machine}.whl`),
  );
  if (wheel === undefined) {
    throw downloadError(
      `${pin.name}==${pin.version} has no manylinux ${machine} wheel at ${url} (files: ${files.map((f) => f.filename).join(', ') || 'none'})`,
    );
  }
  const sha256 = wheel.digests?.sha256 ?? '';
  if (!/^[0-9a-f]{64}$/.test(sha256)) {
    throw downloadError(`${url} gives no sha256 digest for ${wheel.filename}; refusing to install it unchecked`);
  }
  // A mirror may give the file's address relative to the JSON document.
  let fileUrl: string;
  try {
    fileUrl = new URL(wheel.url, url).href;
  } catch {
    throw downloadError(`${url} gives '${wheel.url}' as the address of ${wheel.filename}, which is not a URL`);
  }
  return { filename: wheel.filename, url: fileUrl, sha256 };
}

async function sha256Of(file: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

/**
 * Makes sure `<wheels>/<filename>` is the wheel with the expected digest: a copy already there is
 * checked, otherwise it is downloaded to a temporary name and renamed only once its digest matches
 * (a mismatch deletes it). Returns whether it was downloaded.
 */
async function fetchWheel(file: WheelFile, wheels: string, idleMs: number, log: (l: string) => void): Promise<boolean> {
  const target = join(wheels, file.filename);
  const expected = file.sha256;
  if (existsSync(target)) {
    if ((await sha256Of(target)) === expected) return false;
    log(`${file.filename} in the cache does not match its sha256; downloading it again`);
    await rm(target, { force: true });
  }
  const partial = `${target}.part-${process.pid}`;
  const hash = createHash('sha256');
  const out = createWriteStream(partial);
  const closed = new Promise<void>((resolve, reject) => out.on('close', resolve).on('error', reject));
  try {
    log(`downloading ${file.filename}`);
    await fetchWithIdleTimeout(file.url, idleMs, async (chunk) => {
      hash.update(chunk);
      if (!out.write(chunk)) await new Promise<void>((resolve) => out.once('drain', resolve));
    });
    out.end();
    await closed;
    const actual = hash.digest('hex');
    if (actual !== expected) {
      throw downloadError(
        `${file.filename} from ${file.url} has sha256 ${actual}, but the index says ${expected}; it was deleted, nothing was installed`,
      );
    }
    await rename(partial, target);
    return true;
  } catch (error) {
    out.destroy();
    await closed.catch(() => undefined);
    await rm(partial, { force: true });
    throw error;
  }
}

/** The machine tag of this process's architecture in wheel file names. */
function defaultMachine(): string {
  return process.arch === 'arm64' ? 'aarch64' : 'x86_64';
}

/**
 * Downloads (checking each wheel's sha256 against the index) and unpacks the pinned runtime
 * libraries into `<cacheDir>/cuda-runtime-<key>/lib`. A run that fails leaves no partial folder.
 */
export async function installCudaRuntime(options: InstallCudaRuntimeOptions): Promise<InstallCudaRuntimeResult> {
  const pins = options.pins ?? runtimePins();
  const log = options.log ?? (() => undefined);
  const idleMs = options.idleTimeoutMs ?? 60_000;
  const key = runtimeKey(pins);
  const dir = join(options.cacheDir, `cuda-runtime-${key}`);
  const libDir = join(dir, 'lib');
  if (!options.reinstall && existsSync(join(dir, RUNTIME_MARKER))) {
    return { dir, libDir, present: true, downloaded: [], libraries: [] };
  }
  const wheels = join(options.cacheDir, 'wheels');
  await mkdir(wheels, { recursive: true });
  const files: WheelFile[] = [];
  const indexUrl = options.indexUrl ?? DEFAULT_INDEX_URL;
  for (const pin of pins) {
    files.push(await findWheel(pin, indexUrl, options.machine ?? defaultMachine(), idleMs));
  }
  const downloaded: string[] = [];
  for (const file of files) {
    if (await fetchWheel(file, wheels, idleMs, log)) downloaded.push(file.filename);
  }
  const stage = await mkdtemp(join(options.cacheDir, `.cuda-runtime-${key}.`));
  try {
    await mkdir(join(stage, 'lib'));
    const libraries: string[] = [];
    for (const [i, file] of files.entries()) {
      log(`unpacking the libraries of ${file.filename}`);
      const written = await extractWheelLibraries(join(wheels, file.filename), join(stage, 'lib'));
      if (written.length === 0) {
        throw downloadError(
          `${file.filename} (${pins[i]!.name}) holds no nvidia/*/lib/*.so files; the wheel's layout changed`,
        );
      }
      libraries.push(...written);
    }
    const marker = [
      `resnet-cuda CUDA runtime ${key} (layout ${RUNTIME_LAYOUT})`,
      ...pins.map((p) => `${p.name}==${p.version}`),
    ];
    await writeFile(join(stage, RUNTIME_MARKER), `${marker.join('\n')}\n`);
    await rm(dir, { recursive: true, force: true });
    await rename(stage, dir);
    return { dir, libDir, present: false, downloaded, libraries };
  } finally {
    await rm(stage, { recursive: true, force: true });
  }
}
