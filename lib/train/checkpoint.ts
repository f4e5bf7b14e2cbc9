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
import { open, readFile, rename, unlink } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { ResnetError } from '../errors.js';
import type { Module, StateDict, StateEntry } from '../nn/module.js';

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
    header[name] = { dtype: DTYPES[entry.dtype].name, shape: entry.shape, data_offsets: [offset, offset + bytes.length] };
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
export function decodeSafetensors(bytes: Uint8Array, source: string): { tensors: StateDict; metadata: Record<string, string> } {
  if (bytes.byteLength < 8) checkpointError(source, `is ${bytes.byteLength} bytes long, too short for a safetensors header`);
  const view = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLength = Number(view.readBigUInt64LE(0));
  if (headerLength > view.length - 8) checkpointError(source, `is truncated: its header declares ${headerLength} bytes but only ${view.length - 8} follow`);
  let header: Record<string, unknown>;
  try {
    header = JSON.parse(view.subarray(8, 8 + headerLength).toString('utf8')) as Record<string, unknown>;
  } catch (error) {
    return checkpointError(source, `has a header that is not valid JSON (${(error as Error).message})`);
  }
  const dataStart = 8 + headerLength;
  const dataLength = view.length - dataStart;
  const metadata = (header.__metadata__ ?? {}) as Record<string, string>;
  const tensors: StateDict = new Map();
  for (const [name, value] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const info = value as { dtype?: string; shape?: number[]; data_offsets?: [number, number] };
    const dtype = info.dtype === 'F32' ? 'f32' : info.dtype === 'I64' ? 'i64' : null;
    if (!dtype) checkpointError(source, `tensor '${name}' has dtype ${String(info.dtype)}; only F32 and I64 are read`);
    const [begin, end] = info.data_offsets ?? [-1, -1];
    const count = (info.shape ?? []).reduce((a, b) => a * b, 1);
    if (!(begin >= 0 && end <= dataLength && end - begin === count * DTYPES[dtype].bytes)) {
      checkpointError(source, `tensor '${name}' lies outside the file or does not match its shape [${(info.shape ?? []).join(', ')}] (offsets ${begin}-${end} of ${dataLength} data bytes); the file is truncated or corrupt`);
    }
    const copy = new Uint8Array(end - begin);
    copy.set(view.subarray(dataStart + begin, dataStart + end));
    const data = dtype === 'f32' ? new Float32Array(copy.buffer) : new BigInt64Array(copy.buffer);
    tensors.set(name, { shape: [...(info.shape ?? [])], dtype, data } satisfies StateEntry);
  }
  return { tensors, metadata };
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
  loadState(state: { step: number; paramGroups: Record<string, unknown>[]; buffers: Record<string, Float32Array> }): void;
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

/** Writes model, optimizer, scaler, scheduler and progress to `path`, atomically. */
export async function saveCheckpoint(path: string, parts: CheckpointParts, progress: CheckpointProgress): Promise<void> {
  const tensors: StateDict = new Map();
  for (const [name, entry] of parts.model.stateDict()) tensors.set(`model.${name}`, entry);
  const optimizer = parts.optimizer?.state();
  if (optimizer) {
    for (const [name, values] of Object.entries(optimizer.buffers)) tensors.set(`optimizer.${name}`, { shape: [values.length], dtype: 'f32', data: values });
  }
  if (parts.ema) for (const [name, entry] of parts.ema.stateDict()) tensors.set(`ema.${name}`, entry);
  const metadata: Record<string, string> = {
    format: FORMAT,
    version: VERSION,
    progress: JSON.stringify({ epoch: progress.epoch, step: progress.step }),
    extra: JSON.stringify(progress.extra ?? {}),
  };
  if (optimizer) metadata.optimizer = JSON.stringify({ step: optimizer.step, paramGroups: optimizer.paramGroups });
  if (parts.scaler) metadata.scaler = JSON.stringify(parts.scaler.state());
  if (parts.scheduler) metadata.scheduler = JSON.stringify(parts.scheduler.state());
  if (parts.ema) metadata.ema = JSON.stringify(parts.ema.state());
  await writeFileAtomic(path, encodeSafetensors(tensors, metadata));
}

/**
 * Restores the given parts from a checkpoint written by {@link saveCheckpoint} and returns the
 * progress. The file is checked whole before any part is restored (format, every tensor's bounds,
 * that each part given was saved), and the model's state dict is checked whole before it is applied.
 */
export async function loadCheckpoint(path: string, parts: CheckpointParts): Promise<CheckpointProgress> {
  const { tensors, metadata } = decodeSafetensors(await readWhole(path), path);
  if (metadata.format !== FORMAT) checkpointError(path, `is not a resnet-cuda checkpoint (format '${metadata.format ?? 'none'}'); use loadWeights for weight files`);
  if (metadata.version !== VERSION) checkpointError(path, `has checkpoint version ${metadata.version}; this release reads version ${VERSION}`);
  const parse = (key: string): unknown => {
    try {
      return JSON.parse(metadata[key]!);
    } catch {
      return checkpointError(path, `has unreadable '${key}' metadata`);
    }
  };
  const model: StateDict = new Map();
  const ema: StateDict = new Map();
  const buffers: Record<string, Float32Array> = {};
  for (const [name, entry] of tensors) {
    if (name.startsWith('model.')) model.set(name.slice(6), entry);
    else if (name.startsWith('ema.')) ema.set(name.slice(4), entry);
    else if (name.startsWith('optimizer.')) buffers[name.slice(10)] = entry.data as Float32Array;
  }
  for (const part of ['optimizer', 'scaler', 'scheduler', 'ema'] as const) {
    if (parts[part] && metadata[part] === undefined) checkpointError(path, `holds no ${part} state, but one was given to restore`);
  }
  // Validate the model first: loadStateDict changes nothing unless the whole dict fits.
  parts.model.loadStateDict(model);
  if (parts.ema) {
    parts.ema.loadStateDict(ema);
    parts.ema.loadState(parse('ema') as never);
  }
  if (parts.optimizer) {
    const saved = parse('optimizer') as { step: number; paramGroups: Record<string, unknown>[] };
    parts.optimizer.loadState({ step: saved.step, paramGroups: saved.paramGroups, buffers });
  }
  if (parts.scaler) parts.scaler.loadState(parse('scaler'));
  if (parts.scheduler) parts.scheduler.loadState(parse('scheduler'));
  const progress = parse('progress') as { epoch: number; step: number };
  return { epoch: progress.epoch, step: progress.step, extra: parse('extra') as Record<string, unknown> };
}
