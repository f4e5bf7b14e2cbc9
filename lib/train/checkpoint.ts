/**
 * Checkpoints and weight files. Weights are written in the safetensors format with torchvision's
 * names and layouts, so `safetensors.torch.load_file` followed by `model.load_state_dict` reads
 * them in PyTorch; a training checkpoint is a safetensors file too, holding the model and the
 * optimizer's per-element state as tensors and everything else (epoch, step, optimizer settings,
 * scaler, scheduler, caller data) as JSON metadata. Every file is written atomically: a crash
 * leaves the old file or the new one, never a mix.
 * @packageDocumentation
 */
import { randomBytes } from 'node:crypto';
import { open, readFile, readdir, rename, unlink } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { ResnetError } from '../errors.js';
import type { Module, StateDict, StateEntry } from '../nn/module.js';
import { crc32c } from './crc32c.js';

/** The temporary files of {@link writeFileAtomic}: `.<name>.<12 hex digits>.tmp`. */
const TEMPORARY = /^\..+\.[0-9a-f]{12}\.tmp$/;

/** Writes `data` to `path` through a temporary file in the same folder, flushed, then renamed. */
export async function writeFileAtomic(path: string, data: Uint8Array | string): Promise<void> {
  const temporary = join(dirname(path), `.${basename(path)}.${randomBytes(6).toString('hex')}.tmp`);
  const handle = await open(temporary, 'w');
  try {
    await handle.writeFile(data);
    await handle.sync();
  } catch (error) {
    await handle.close();
    await unlink(temporary).catch(() => undefined);
    throw error;
  }
  await handle.close();
  await rename(temporary, path);
  // Persist the rename itself (the folder entry) where the platform allows it.
  const folder = await open(dirname(path), 'r').catch(() => null);
  await folder?.sync().catch(() => undefined);
  await folder?.close();
}

/**
 * Removes the temporary files that {@link writeFileAtomic} leaves in `folder` when the process is
 * killed mid-write (a checkpoint's can be as large as the checkpoint); returns their names. Call
 * it only when no other process writes into the folder.
 */
export async function removeTemporaries(folder: string): Promise<string[]> {
  const names = (await readdir(folder).catch(() => [] as string[])).filter((name) => TEMPORARY.test(name));
  for (const name of names) await unlink(join(folder, name)).catch(() => undefined);
  return names;
}

const DTYPES = { f32: { name: 'F32', bytes: 4 }, i64: { name: 'I64', bytes: 8 } } as const;

function checkpointError(source: string, problem: string): never {
  throw new ResnetError('ERR_RC_CHECKPOINT', `${source}: ${problem}`);
}

/**
 * Encodes tensors in the safetensors format: an 8-byte little-endian header length, a JSON header
 * (`dtype`, `shape`, `data_offsets` per tensor, string `__metadata__`), then the raw little-endian
 * data in header order.
 */
export function encodeSafetensors(tensors: StateDict, metadata: Record<string, string> = {}): Buffer {
  const header: Record<string, unknown> = { __metadata__: metadata };
  const chunks: Buffer[] = [];
  let offset = 0;
  for (const [name, entry] of tensors) {
    const bytes = Buffer.from(entry.data.buffer, entry.data.byteOffset, entry.data.byteLength);
    header[name] = {
      dtype: DTYPES[entry.dtype].name,
      shape: entry.shape,
      data_offsets: [offset, offset + bytes.length],
    };
    chunks.push(bytes);
    offset += bytes.length;
  }
  let json = JSON.stringify(header);
  // The format lets the header end in spaces; padding to 8 bytes keeps the data aligned.
  json += ' '.repeat((8 - (Buffer.byteLength(json) % 8)) % 8);
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
  return Buffer.concat([head, Buffer.from(json), ...chunks]);
}

/** Decodes a safetensors file's bytes; `source` names the file in errors. */
export function decodeSafetensors(
  bytes: Uint8Array,
  source: string,
): { tensors: StateDict; metadata: Record<string, string> } {
  if (bytes.byteLength < 8) {
    checkpointError(source, `is ${bytes.byteLength} bytes long, too short for a safetensors header`);
  }
  const view = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLength = Number(view.readBigUInt64LE(0));
  if (headerLength > view.length - 8) {
    checkpointError(
      source,
      `is truncated: its header declares ${headerLength} bytes but only ${view.length - 8} follow`,
    );
  }
  let header: unknown;
  try {
    header = JSON.parse(view.subarray(8, 8 + headerLength).toString('utf8'));
  } catch (error) {
    return checkpointError(source, `has a header that is not valid JSON (${(error as Error).message})`);
  }
  if (!isRecord(header)) {
    checkpointError(source, 'has a header that is not a JSON object of tensors; the file is corrupt');
  }
  const dataStart = 8 + headerLength;
  const dataLength = view.length - dataStart;
  const metadata = readMetadata(header.__metadata__, source);
  const tensors: StateDict = new Map();
  const spans: { name: string; begin: number; end: number }[] = [];
  for (const [name, value] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const { dtype, shape, begin, end } = readEntry(name, value, dataLength, source);
    spans.push({ name, begin, end });
    const copy = new Uint8Array(end - begin);
    copy.set(view.subarray(dataStart + begin, dataStart + end));
    const data = dtype === 'f32' ? new Float32Array(copy.buffer) : new BigInt64Array(copy.buffer);
    tensors.set(name, { shape, dtype, data } satisfies StateEntry);
  }
  spans.sort((a, b) => a.begin - b.begin || a.end - b.end);
  for (let i = 1; i < spans.length; i++) {
    const previous = spans[i - 1]!;
    const span = spans[i]!;
    if (span.begin < previous.end) {
      checkpointError(
        source,
        `tensors '${previous.name}' and '${span.name}' overlap (offsets ${previous.begin}-${previous.end} and ${span.begin}-${span.end}); the file is corrupt`,
      );
    }
  }
  return { tensors, metadata };
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

function isCount(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0;
}

/** The `__metadata__` of a header: absent, or an object of strings as the format requires. */
function readMetadata(value: unknown, source: string): Record<string, string> {
  if (value === undefined) return {};
  if (!isRecord(value)) {
    checkpointError(source, 'has __metadata__ that is not an object of strings; the file is corrupt');
  }
  for (const [key, text] of Object.entries(value)) {
    if (typeof text !== 'string') {
      checkpointError(source, `has __metadata__ entry '${key}' that is not a string; the file is corrupt`);
    }
  }
  return value as Record<string, string>;
}

/** One tensor's header entry, checked against the format and the data that follows the header. */
function readEntry(
  name: string,
  value: unknown,
  dataLength: number,
  source: string,
): { dtype: keyof typeof DTYPES; shape: number[]; begin: number; end: number } {
  const bad = (problem: string): never =>
    checkpointError(source, `tensor '${name}' ${problem}; the file is truncated or corrupt`);
  if (!isRecord(value)) return bad('has a header entry that is not an object');
  const dtype = value.dtype === 'F32' ? 'f32' : value.dtype === 'I64' ? 'i64' : null;
  if (!dtype) checkpointError(source, `tensor '${name}' has dtype ${String(value.dtype)}; only F32 and I64 are read`);
  const shape = value.shape;
  if (!Array.isArray(shape) || !shape.every(isCount)) {
    return bad(`has shape ${JSON.stringify(shape)}, not a list of sizes`);
  }
  const offsets = value.data_offsets;
  if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every(isCount)) {
    return bad(`has data_offsets ${JSON.stringify(offsets)}, not a pair of byte offsets`);
  }
  const [begin, end] = offsets as [number, number];
  const bytes = shape.reduce((a, b) => a * b, DTYPES[dtype].bytes);
  if (!(begin <= end && end <= dataLength && end - begin === bytes)) {
    bad(
      `lies outside the file or does not match its shape [${shape.join(', ')}] (offsets ${begin}-${end} of ${dataLength} data bytes)`,
    );
  }
  return { dtype, shape: [...shape], begin, end };
}

async function readWhole(path: string): Promise<Uint8Array> {
  try {
    return await readFile(path);
  } catch (error) {
    return checkpointError(path, `cannot be read (${(error as Error).message})`);
  }
}

/**
 * Writes a model's weights and buffers (torchvision names and layouts) as safetensors; `source` is
 * the model or a state dict of one (such as a moving average's).
 */
export async function saveWeights(path: string, source: Module | StateDict): Promise<void> {
  const state = source instanceof Map ? source : source.stateDict();
  await writeFileAtomic(path, encodeSafetensors(state, { format: 'pt' }));
}

/** Loads weights written by {@link saveWeights} (or by PyTorch's `safetensors.torch.save_file`). */
export async function loadWeights(path: string, model: Module, options: { strict?: boolean } = {}): Promise<void> {
  const { tensors } = decodeSafetensors(await readWhole(path), path);
  model.loadStateDict(tensors, options);
}

/** Anything whose state is saved as JSON: schedulers, the GradScaler, samplers. */
export interface Stateful<S = unknown> {
  state(): S;
  loadState(state: S): void;
}

/** What an optimizer must offer to be checkpointed (every `Optimizer` does). */
export interface CheckpointOptimizer {
  state(): { step: number; paramGroups: Record<string, unknown>[]; buffers: Record<string, Float32Array> };
  loadState(state: {
    step: number;
    paramGroups: Record<string, unknown>[];
    buffers: Record<string, Float32Array>;
  }): void;
}

/** A second set of weights kept beside the model, such as the moving average of `ModelEma`. */
export interface CheckpointWeights {
  stateDict(): StateDict;
  loadStateDict(state: StateDict): void;
  state(): unknown;
  loadState(state: never): void;
}

/** The parts of a training run that a checkpoint holds. */
export interface CheckpointParts {
  model: Module;
  optimizer?: CheckpointOptimizer;
  scaler?: Stateful;
  scheduler?: Stateful;
  /** Averaged weights, saved as `ema.*` tensors with their JSON state. */
  ema?: CheckpointWeights;
}

/** Where a run stood when a checkpoint was written, plus the caller's JSON-serialisable data. */
export interface CheckpointProgress {
  epoch: number;
  step: number;
  extra?: Record<string, unknown>;
}

const FORMAT = 'resnet-cuda-checkpoint';
const VERSION = '1';

/** The CRC-32C of each tensor's bytes, by name: written in the metadata, checked on load. */
function checksums(tensors: StateDict): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [name, entry] of tensors) {
    out[name] = crc32c(new Uint8Array(entry.data.buffer, entry.data.byteOffset, entry.data.byteLength));
  }
  return out;
}

/** The optimizer's class name, recorded so that a checkpoint is not restored into another kind. */
function optimizerKind(optimizer: CheckpointOptimizer): string {
  return optimizer.constructor.name;
}

/** Writes model, optimizer, scaler, scheduler and progress to `path`, atomically. */
export async function saveCheckpoint(
  path: string,
  parts: CheckpointParts,
  progress: CheckpointProgress,
): Promise<void> {
  const tensors: StateDict = new Map();
  for (const [name, entry] of parts.model.stateDict()) tensors.set(`model.${name}`, entry);
  const optimizer = parts.optimizer?.state();
  if (optimizer) {
    for (const [name, values] of Object.entries(optimizer.buffers)) {
      tensors.set(`optimizer.${name}`, { shape: [values.length], dtype: 'f32', data: values });
    }
  }
  if (parts.ema) for (const [name, entry] of parts.ema.stateDict()) tensors.set(`ema.${name}`, entry);
  const metadata: Record<string, string> = {
    format: FORMAT,
    version: VERSION,
    progress: JSON.stringify({ epoch: progress.epoch, step: progress.step }),
    extra: JSON.stringify(progress.extra ?? {}),
    checksums: JSON.stringify(checksums(tensors)),
  };
  if (parts.optimizer && optimizer) {
    metadata.optimizer = JSON.stringify({
      type: optimizerKind(parts.optimizer),
      step: optimizer.step,
      paramGroups: optimizer.paramGroups,
      buffers: Object.keys(optimizer.buffers),
    });
  }
  if (parts.scaler) metadata.scaler = JSON.stringify(parts.scaler.state());
  if (parts.scheduler) metadata.scheduler = JSON.stringify(parts.scheduler.state());
  if (parts.ema) metadata.ema = JSON.stringify(parts.ema.state());
  await writeFileAtomic(path, encodeSafetensors(tensors, metadata));
}

/** A checkpoint's optimizer metadata; `type` and `buffers` are absent in files of older releases. */
interface SavedOptimizer {
  type?: string;
  step: number;
  paramGroups: Record<string, unknown>[];
  buffers?: string[];
}

/** Everything a checkpoint holds for the parts asked for, parsed and checked, nothing applied yet. */
interface ParsedCheckpoint {
  progress: CheckpointProgress;
  model: StateDict;
  ema: { tensors: StateDict; state: unknown } | null;
  optimizer: { step: number; paramGroups: Record<string, unknown>[]; buffers: Record<string, Float32Array> } | null;
  scaler: unknown;
  scheduler: unknown;
}

/**
 * Reads and checks a checkpoint whole for the given parts: format, every tensor's bounds and
 * checksum, every metadata entry, the optimizer's kind and state tensors. Changes nothing.
 */
function parseCheckpoint(bytes: Uint8Array, path: string, parts: CheckpointParts): ParsedCheckpoint {
  const { tensors, metadata } = decodeSafetensors(bytes, path);
  if (metadata.format !== FORMAT) {
    checkpointError(
      path,
      `is not a resnet-cuda checkpoint (format '${metadata.format ?? 'none'}'); use loadWeights for weight files`,
    );
  }
  if (metadata.version !== VERSION) {
    checkpointError(path, `has checkpoint version ${metadata.version}; this release reads version ${VERSION}`);
  }
  const parse = (key: string, check: (value: unknown) => boolean, expected: string): unknown => {
    let value: unknown;
    try {
      value = JSON.parse(metadata[key]!);
    } catch {
      return checkpointError(path, `has unreadable '${key}' metadata`);
    }
    if (!check(value)) checkpointError(path, `has '${key}' metadata that is not ${expected}`);
    return value;
  };
  if (metadata.checksums !== undefined) {
    verifyChecksums(tensors, parse('checksums', isRecord, 'an object of checksums') as Record<string, unknown>, path);
  }
  for (const part of ['optimizer', 'scaler', 'scheduler', 'ema'] as const) {
    if (parts[part] && metadata[part] === undefined) {
      checkpointError(path, `holds no ${part} state, but one was given to restore`);
    }
  }
  const progress = parse(
    'progress',
    (v) => isRecord(v) && isCount(v.epoch) && isCount(v.step),
    'an object with a whole epoch and step',
  ) as { epoch: number; step: number };
  const extra = parse('extra', isRecord, 'an object') as Record<string, unknown>;
  const model: StateDict = new Map();
  const ema: StateDict = new Map();
  for (const [name, entry] of tensors) {
    if (name.startsWith('model.')) model.set(name.slice(6), entry);
    else if (name.startsWith('ema.')) ema.set(name.slice(4), entry);
  }
  return {
    progress: { epoch: progress.epoch, step: progress.step, extra },
    model,
    ema: parts.ema ? { tensors: ema, state: parse('ema', isRecord, 'an object') } : null,
    optimizer: parts.optimizer
      ? parseOptimizer(
          parse('optimizer', isSavedOptimizer, 'an optimizer state') as SavedOptimizer,
          tensors,
          parts.optimizer,
          path,
        )
      : null,
    scaler: parts.scaler ? parse('scaler', isRecord, 'an object') : null,
    scheduler: parts.scheduler ? parse('scheduler', isRecord, 'an object') : null,
  };
}

function isSavedOptimizer(value: unknown): value is SavedOptimizer {
  return (
    isRecord(value) &&
    isCount(value.step) &&
    Array.isArray(value.paramGroups) &&
    value.paramGroups.every(isRecord) &&
    (value.type === undefined || typeof value.type === 'string') &&
    (value.buffers === undefined || (Array.isArray(value.buffers) && value.buffers.every((b) => typeof b === 'string')))
  );
}

function verifyChecksums(tensors: StateDict, expected: Record<string, unknown>, path: string): void {
  const actual = checksums(tensors);
  for (const name of Object.keys(expected)) {
    if (!(name in actual)) {
      checkpointError(path, `misses tensor '${name}', which was written with it; the file is corrupt`);
    }
  }
  for (const [name, crc] of Object.entries(actual)) {
    if (!(name in expected)) {
      checkpointError(path, `holds tensor '${name}', which was not written with it; the file is corrupt`);
    }
    if (expected[name] !== crc) {
      checkpointError(
        path,
        `tensor '${name}' fails its checksum (CRC-32C ${crc.toString(16)}, written ${Number(expected[name]).toString(16)}); the file is corrupt`,
      );
    }
  }
}

function parseOptimizer(
  saved: SavedOptimizer,
  tensors: StateDict,
  optimizer: CheckpointOptimizer,
  path: string,
): NonNullable<ParsedCheckpoint['optimizer']> {
  const kind = optimizerKind(optimizer);
  if (saved.type !== undefined && saved.type !== kind) {
    checkpointError(path, `holds the state of an ${saved.type} optimizer; it cannot be restored into ${kind}`);
  }
  const buffers: Record<string, Float32Array> = {};
  for (const [name, entry] of tensors) {
    if (!name.startsWith('optimizer.')) continue;
    if (entry.dtype !== 'f32' || entry.shape.length !== 1) {
      checkpointError(path, `tensor '${name}' is not a flat F32 optimizer state`);
    }
    buffers[name.slice(10)] = entry.data as Float32Array;
  }
  for (const name of saved.buffers ?? []) {
    if (!(name in buffers)) checkpointError(path, `misses tensor 'optimizer.${name}' of the optimizer's state`);
  }
  return { step: saved.step, paramGroups: saved.paramGroups, buffers };
}

/** One part's restore and the undo that puts back what it had before. */
interface Restore {
  apply(): void;
  undo: () => void;
}

function restores(parts: CheckpointParts, parsed: ParsedCheckpoint): Restore[] {
  const out: Restore[] = [];
  const model = parts.model;
  const weights = model.stateDict();
  out.push({ apply: () => model.loadStateDict(parsed.model), undo: () => model.loadStateDict(weights) });
  if (parts.ema && parsed.ema) {
    const ema = parts.ema;
    const saved = parsed.ema;
    const before = { tensors: ema.stateDict(), state: ema.state() };
    out.push({
      apply: () => {
        ema.loadStateDict(saved.tensors);
        ema.loadState(saved.state as never);
      },
      undo: () => {
        ema.loadStateDict(before.tensors);
        ema.loadState(before.state as never);
      },
    });
  }
  for (const [part, state] of [
    ['optimizer', parsed.optimizer],
    ['scaler', parsed.scaler],
    ['scheduler', parsed.scheduler],
  ] as const) {
    const step = stageState(parts[part], state);
    if (step) out.push(step);
  }
  return out;
}

/** Applying a part's parsed state, and putting back the one it had; null when the part is absent. */
function stageState(
  target: { state(): unknown; loadState(state: unknown): void } | undefined,
  state: unknown,
): Restore | null {
  if (!target) return null;
  const before = target.state();
  return {
    apply: () => {
      target.loadState(state);
    },
    undo: () => {
      target.loadState(before);
    },
  };
}

/**
 * Restores the given parts from a checkpoint written by {@link saveCheckpoint} and returns the
 * progress. All or nothing: the file is read and checked whole first (format, every tensor's
 * bounds and CRC-32C checksum, every metadata entry, the optimizer's kind and state tensors); a
 * part that still refuses its state puts every part restored before it back as it was, and the
 * error names the file.
 */
export async function loadCheckpoint(path: string, parts: CheckpointParts): Promise<CheckpointProgress> {
  const parsed = parseCheckpoint(await readWhole(path), path, parts);
  const done: Restore[] = [];
  try {
    for (const restore of restores(parts, parsed)) {
      restore.apply();
      done.push(restore);
    }
  } catch (error) {
    for (const restore of done.reverse()) restore.undo();
    if (error instanceof ResnetError && error.message.startsWith(`${path}: `)) throw error;
    throw new ResnetError(
      'ERR_RC_CHECKPOINT',
      `${path}: cannot be restored (${(error as Error).message}); nothing was changed`,
    );
  }
  return parsed.progress;
}
