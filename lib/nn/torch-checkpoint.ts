/**
 * PyTorch's own checkpoint files, read without Python: `torch.save`'s zip format (PyTorch 1.6 and
 * later: a `data.pkl` pickle whose tensors point, by persistent id, at raw `data/<key>` entries)
 * and its legacy format (a run of pickles followed by the storages' bytes). The pickle is read by
 * the restricted reader of `pickle.ts`, with an allowlist of the globals a tensor checkpoint
 * needs, a subset of those PyTorch's own `torch.load(weights_only=True)` allows
 * (torch/_weights_only_unpickler.py): `collections.OrderedDict`, the tensor and parameter rebuild
 * functions of `torch._utils`, and the `torch.*Storage` types. Anything else is refused.
 * @packageDocumentation
 */
import { readFileSync } from 'node:fs';
import { ResnetError, invalid } from '../errors.js';
import type { StateDict, StateEntry } from './module.js';
import { PickleGlobal, unpickle, type PickleKey, type PickleValue } from './pickle.js';
import { ZipArchive, looksLikeZip } from './zip.js';

/** The element types of PyTorch storages this reader understands. */
export type TorchDType = 'f32' | 'f64' | 'f16' | 'bf16' | 'i64' | 'i32' | 'i16' | 'i8' | 'u8' | 'bool';

/** The `torch.<Name>Storage` types, their dtypes and element sizes. */
const STORAGE_TYPES: Record<string, { dtype: TorchDType; bytes: number }> = {
  FloatStorage: { dtype: 'f32', bytes: 4 },
  DoubleStorage: { dtype: 'f64', bytes: 8 },
  HalfStorage: { dtype: 'f16', bytes: 2 },
  BFloat16Storage: { dtype: 'bf16', bytes: 2 },
  LongStorage: { dtype: 'i64', bytes: 8 },
  IntStorage: { dtype: 'i32', bytes: 4 },
  ShortStorage: { dtype: 'i16', bytes: 2 },
  CharStorage: { dtype: 'i8', bytes: 1 },
  ByteStorage: { dtype: 'u8', bytes: 1 },
  BoolStorage: { dtype: 'bool', bytes: 1 },
};

const FLOATING: readonly TorchDType[] = ['f32', 'f64', 'f16', 'bf16'];

/** One storage of a checkpoint: the typed memory that tensors view. */
export class TorchStorage {
  /** Its raw bytes, little-endian once read (big-endian files are swapped). */
  #bytes: Uint8Array | null = null;
  #decoded: Float32Array | BigInt64Array | null = null;

  constructor(
    /** The storage's key in the file (`data/<key>` in the zip format). */
    readonly key: string,
    readonly dtype: TorchDType,
    /** Its number of elements. */
    readonly numel: number,
    /** The device it was saved from (`cpu`, `cuda:0`); the values are read to the host regardless. */
    readonly location: string,
    private readonly source: string,
  ) {}

  /** Sets the bytes, checking their length against the element count. */
  setBytes(bytes: Uint8Array, bigEndian: boolean): void {
    const size = STORAGE_BYTES[this.dtype];
    if (bytes.length < this.numel * size) {
      fail(
        this.source,
        `storage '${this.key}' holds ${bytes.length} bytes, too few for ${this.numel} ${this.dtype} values`,
      );
    }
    let data = bytes.subarray(0, this.numel * size);
    if (bigEndian && size > 1) {
      const swapped = Uint8Array.from(data);
      for (let i = 0; i < swapped.length; i += size) swapped.subarray(i, i + size).reverse();
      data = swapped;
    }
    this.#bytes = data;
  }

  /** Every element as f32 (floating dtypes) or as int64 (integer and bool dtypes), decoded once. */
  decoded(): Float32Array | BigInt64Array {
    if (this.#decoded) return this.#decoded;
    const bytes = this.#bytes;
    if (!bytes) fail(this.source, `storage '${this.key}' has no data`);
    // The typed arrays need aligned memory: the entry itself when it is aligned (torch.save aligns
    // its zip entries to 64 bytes), else a copy.
    const copy = bytes.byteOffset % 8 === 0 ? bytes : new Uint8Array(bytes);
    const n = this.numel;
    let out: Float32Array | BigInt64Array;
    switch (this.dtype) {
      case 'f32':
        out = new Float32Array(copy.buffer, copy.byteOffset, n);
        break;
      case 'f64':
        out = Float32Array.from(new Float64Array(copy.buffer, copy.byteOffset, n));
        break;
      case 'f16': {
        const half = new Uint16Array(copy.buffer, copy.byteOffset, n);
        out = new Float32Array(n);
        for (let i = 0; i < n; i++) out[i] = halfToFloat(half[i]!);
        break;
      }
      case 'bf16': {
        // bfloat16 is the upper half of an f32.
        const half = new Uint16Array(copy.buffer, copy.byteOffset, n);
        const wide = new Uint32Array(n);
        for (let i = 0; i < n; i++) wide[i] = half[i]! << 16;
        out = new Float32Array(wide.buffer);
        break;
      }
      case 'i64':
        out = new BigInt64Array(copy.buffer, copy.byteOffset, n);
        break;
      case 'i32':
        out = BigInt64Array.from(new Int32Array(copy.buffer, copy.byteOffset, n), (v) => BigInt(v));
        break;
      case 'i16':
        out = BigInt64Array.from(new Int16Array(copy.buffer, copy.byteOffset, n), (v) => BigInt(v));
        break;
      case 'i8':
        out = BigInt64Array.from(new Int8Array(copy.buffer, copy.byteOffset, n), (v) => BigInt(v));
        break;
      case 'u8':
      case 'bool':
        out = BigInt64Array.from(copy.subarray(0, n), (v) => BigInt(v));
        break;
    }
    this.#decoded = out;
    return out;
  }
}

const STORAGE_BYTES = Object.fromEntries(Object.values(STORAGE_TYPES).map((t) => [t.dtype, t.bytes])) as Record<
  TorchDType,
  number
>;

/** An IEEE half-precision value, widened. */
function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const fraction = h & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

/** A tensor of a checkpoint: a strided view of a {@link TorchStorage}, as PyTorch keeps it. */
export class TorchTensor {
  constructor(
    readonly storage: TorchStorage,
    /** Where the view starts in the storage, in elements. */
    readonly storageOffset: number,
    readonly shape: readonly number[],
    /** Elements to step in the storage per index of each dimension. */
    readonly stride: readonly number[],
    /** Whether it was saved as a trainable parameter (`requires_grad`). */
    readonly requiresGrad: boolean,
  ) {}

  /** The storage's element type. */
  get dtype(): TorchDType {
    return this.storage.dtype;
  }

  /** The number of elements. */
  get numel(): number {
    return this.shape.reduce((a, b) => a * b, 1);
  }

  /** Whether the elements lie in row-major order without gaps (the strides of a fresh tensor of this shape). */
  get isContiguous(): boolean {
    let expected = 1;
    for (let d = this.shape.length - 1; d >= 0; d--) {
      if (this.shape[d] !== 1 && this.stride[d] !== expected) return false;
      expected *= this.shape[d]!;
    }
    return true;
  }

  /** Whether the dtype is a floating one (its values read as f32). */
  get isFloating(): boolean {
    return FLOATING.includes(this.dtype);
  }

  /**
   * The values in row-major order: a Float32Array for the floating dtypes (f64 rounded to f32,
   * f16 and bf16 widened exactly), a BigInt64Array for the integer and bool dtypes.
   */
  values(): Float32Array | BigInt64Array {
    const all = this.storage.decoded();
    const n = this.numel;
    if (this.isContiguous) return all.slice(this.storageOffset, this.storageOffset + n);
    const out = all instanceof Float32Array ? new Float32Array(n) : new BigInt64Array(n);
    if (n === 0) return out;
    const rank = this.shape.length;
    const index = new Array<number>(rank).fill(0);
    let at = this.storageOffset;
    for (let i = 0; i < n; i++) {
      out[i] = all[at]!;
      // Odometer over the indices, last dimension fastest.
      for (let d = rank - 1; d >= 0; d--) {
        index[d]!++;
        at += this.stride[d]!;
        if (index[d]! < this.shape[d]!) break;
        at -= this.stride[d]! * this.shape[d]!;
        index[d] = 0;
      }
    }
    return out;
  }

  /** This tensor as a state-dict entry: f32 for floating dtypes, i64 for the others. */
  toStateEntry(): StateEntry {
    const data = this.values();
    return { shape: [...this.shape], dtype: data instanceof Float32Array ? 'f32' : 'i64', data };
  }

  toString(): string {
    return `${this.dtype}[${this.shape.join(',')}]`;
  }
}

/**
 * A value read from a checkpoint: plain Python data (see {@link PickleValue}) with
 * {@link TorchTensor} leaves (and, where a file pickles one bare, {@link TorchStorage}s).
 */
export type TorchValue = PickleValue<TorchTensor | TorchStorage>;

function fail(source: string, problem: string): never {
  throw new ResnetError('ERR_RC_CHECKPOINT', `${source}: ${problem}`);
}

function isInt(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0;
}

/** A shape or stride tuple of non-negative integers. */
function sizes(source: string, what: string, value: TorchValue): number[] {
  if (!Array.isArray(value) || !value.every(isInt)) fail(source, `a tensor's ${what} is not a tuple of sizes`);
  return [...value];
}

/** `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])`. */
function rebuildTensor(source: string, args: readonly TorchValue[], v2: boolean): TorchTensor {
  const [storage, offset, shapeArg, strideArg, requiresGrad, hooks, metadata] = args;
  if (!(storage instanceof TorchStorage)) fail(source, 'a tensor is rebuilt from something that is not a storage');
  if (!isInt(offset)) fail(source, "a tensor's storage offset is not a non-negative integer");
  const shape = sizes(source, 'size', shapeArg ?? null);
  const stride = sizes(source, 'stride', strideArg ?? null);
  if (stride.length !== shape.length) fail(source, "a tensor's size and stride differ in length");
  if (v2) {
    if (hooks instanceof Map ? hooks.size > 0 : hooks !== null) {
      fail(source, 'refused: a tensor carries backward hooks (functions), which a checkpoint of weights does not need');
    }
    if (metadata instanceof Map && metadata.size > 0) {
      fail(
        source,
        `refused: a tensor carries metadata (${[...metadata.keys()].join(', ')}) that this reader does not interpret`,
      );
    }
  }
  const numel = shape.reduce((a, b) => a * b, 1);
  if (numel > 0) {
    const last = offset + shape.reduce((sum, d, i) => sum + (d - 1) * stride[i]!, 0);
    if (last >= storage.numel) {
      fail(
        source,
        `a tensor of size [${shape.join(', ')}] reads past the end of its storage '${storage.key}' (${storage.numel} elements)`,
      );
    }
  }
  return new TorchTensor(storage, offset, shape, stride, requiresGrad === true);
}

/** The allowlisted globals, with what `REDUCE` of each makes. */
function allowedGlobals(source: string): Map<string, PickleGlobal<TorchTensor | TorchStorage>> {
  const globals = new Map<string, PickleGlobal<TorchTensor | TorchStorage>>();
  const add = (name: string, call?: (args: readonly TorchValue[]) => TorchValue) =>
    globals.set(name, new PickleGlobal<TorchTensor | TorchStorage>(name, call));
  add('collections.OrderedDict', (args) => {
    const map = new Map<PickleKey, TorchValue>();
    const [pairs] = args;
    if (args.length > 1 || (pairs !== undefined && !Array.isArray(pairs))) {
      fail(source, 'OrderedDict is called with arguments other than a list of pairs');
    }
    for (const pair of (pairs ?? []) as readonly TorchValue[]) {
      if (!Array.isArray(pair) || pair.length !== 2) {
        fail(source, 'OrderedDict is called with an item that is not a pair');
      }
      map.set(pair[0] as PickleKey, pair[1] as TorchValue);
    }
    return map;
  });
  add('torch._utils._rebuild_tensor_v2', (args) => rebuildTensor(source, args, true));
  add('torch._utils._rebuild_tensor', (args) => rebuildTensor(source, args, false));
  const parameter = (args: readonly TorchValue[]): TorchValue => {
    const [data, requiresGrad] = args;
    if (!(data instanceof TorchTensor)) fail(source, 'a parameter is rebuilt from something that is not a tensor');
    return new TorchTensor(data.storage, data.storageOffset, data.shape, data.stride, requiresGrad === true);
  };
  add('torch._utils._rebuild_parameter', parameter);
  add('torch._utils._rebuild_parameter_with_state', parameter);
  for (const name of Object.keys(STORAGE_TYPES)) add(`torch.${name}`);
  return globals;
}

/** The names of the allowlisted globals: everything a checkpoint read here may name. */
export const TORCH_ALLOWED_GLOBALS: readonly string[] = Object.freeze([...allowedGlobals('').keys()]);

/** Reads a persistent id `('storage', StorageType, key, location, numel[, view])` as a shared storage. */
function storageLoader(
  source: string,
  storages: Map<string, TorchStorage>,
  fill: (storage: TorchStorage) => void,
): (pid: TorchValue) => TorchValue {
  return (pid) => {
    if (!Array.isArray(pid) || pid[0] !== 'storage' || pid.length < 5) {
      fail(source, 'refused: the pickle refers to persistent data that is not a tensor storage');
    }
    const [, type, key, location, numel, view] = pid as readonly TorchValue[];
    if (!(type instanceof PickleGlobal) || STORAGE_TYPES[type.name.replace(/^torch\./, '')] === undefined) {
      fail(source, 'a storage has no torch.*Storage type');
    }
    if (typeof key !== 'string' || typeof location !== 'string' || !isInt(numel)) {
      fail(source, 'a storage reference is malformed (key, location, size)');
    }
    if (view !== undefined && view !== null) {
      fail(
        source,
        'a storage is a view of another (a pre-1.0 format) that this reader does not read; re-save the file with torch.save(obj, path) in a current PyTorch',
      );
    }
    const existing = storages.get(key);
    if (existing) return existing;
    const { dtype } = STORAGE_TYPES[type.name.replace(/^torch\./, '')]!;
    const storage = new TorchStorage(key, dtype, numel, location, source);
    storages.set(key, storage);
    fill(storage);
    return storage;
  };
}

/** Reads the zip format: `<prefix>/data.pkl`, `<prefix>/data/<key>`, `<prefix>/byteorder`. */
function readZip(bytes: Uint8Array, source: string): TorchValue {
  const zip = new ZipArchive(bytes, source);
  const pickle = zip.entries.find((e) => /^[^/]+\/data\.pkl$/.test(e.name));
  if (!pickle) {
    const what = zip.entries.some((e) => e.name.endsWith('/constants.pkl'))
      ? 'a TorchScript archive (torch.jit.save), whose code this reader does not run'
      : 'a zip archive without a data.pkl';
    fail(source, `is ${what}, not a torch.save checkpoint; save the weights with torch.save(model.state_dict(), path)`);
  }
  const prefix = pickle.name.slice(0, -'data.pkl'.length);
  if (zip.entry(`${prefix}constants.pkl`) || zip.entries.some((e) => e.name.startsWith(`${prefix}code/`))) {
    fail(
      source,
      'is a TorchScript archive (torch.jit.save), whose code this reader does not run; save the weights with torch.save(model.state_dict(), path)',
    );
  }
  const order = zip.entry(`${prefix}byteorder`)
    ? Buffer.from(zip.read(`${prefix}byteorder`)).toString('latin1')
    : 'little';
  if (order !== 'little' && order !== 'big') fail(source, `has byteorder '${order}', neither little nor big`);
  const storages = new Map<string, TorchStorage>();
  const load = storageLoader(source, storages, (s) => s.setBytes(zip.read(`${prefix}data/${s.key}`), order === 'big'));
  return unpickle(zip.read(pickle.name), {
    source: `${source} (${pickle.name})`,
    globals: allowedGlobals(source),
    persistentLoad: load,
  }).value;
}

/** `torch.serialization.MAGIC_NUMBER`, the first pickle of a legacy file. */
const LEGACY_MAGIC = 0x1950a86a20f9469cfc6cn;

/**
 * Reads the legacy format (`_use_new_zipfile_serialization=False`, and every file before PyTorch
 * 1.6): pickles of the magic number, the protocol version (1001) and the system info, then the
 * object, then the sorted list of storage keys, then per key an 8-byte element count and the bytes.
 */
function readLegacy(bytes: Uint8Array, source: string): TorchValue {
  const plain = { source, globals: new Map<string, PickleGlobal<TorchTensor | TorchStorage>>() };
  const magic = unpickle(bytes, plain);
  if (magic.value !== LEGACY_MAGIC) fail(source, 'is not a torch.save file (no magic number)');
  const version = unpickle(bytes, plain, magic.end);
  if (version.value !== 1001) fail(source, 'is a legacy torch.save file of a protocol other than 1001');
  const info = unpickle(bytes, plain, version.end);
  let bigEndian = false;
  if (info.value instanceof Map) bigEndian = info.value.get('little_endian') === false;
  const storages = new Map<string, TorchStorage>();
  const object = unpickle(
    bytes,
    { source, globals: allowedGlobals(source), persistentLoad: storageLoader(source, storages, () => undefined) },
    info.end,
  );
  const keys = unpickle(bytes, plain, object.end);
  if (!Array.isArray(keys.value) || !keys.value.every((k) => typeof k === 'string')) {
    fail(source, 'has no list of storage keys after its object (truncated or corrupt)');
  }
  const view = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let at = keys.end;
  for (const key of keys.value) {
    const storage = storages.get(key);
    if (!storage) fail(source, `lists storage '${key}', which no tensor uses (corrupt)`);
    if (at + 8 > view.length) fail(source, `ends before storage '${key}' (truncated)`);
    const count = bigEndian ? view.readBigInt64BE(at) : view.readBigInt64LE(at);
    if (count !== BigInt(storage.numel)) {
      fail(source, `storage '${key}' records ${count} elements, not ${storage.numel}`);
    }
    const size = storage.numel * STORAGE_BYTES[storage.dtype];
    if (at + 8 + size > view.length) fail(source, `ends inside storage '${key}' (truncated)`);
    storage.setBytes(view.subarray(at + 8, at + 8 + size), bigEndian);
    at += 8 + size;
  }
  for (const storage of storages.values()) storage.decoded();
  return object.value;
}

/**
 * Reads a `torch.save` file (its bytes, or a path) into plain values: dicts (and OrderedDicts) as
 * Maps, lists and tuples as arrays, numbers, strings, None as null, and {@link TorchTensor}s.
 * Reads the zip format and the legacy one. Only the globals of {@link TORCH_ALLOWED_GLOBALS} may
 * appear in the pickle: any other (a class of the training script, `os.system`, …) is refused
 * with `ERR_RC_CHECKPOINT`, naming it, at the opcode that names it. Nothing is ever executed.
 *
 * @param source - the file's bytes, or its path.
 * @param name - names the file in errors when `source` is bytes.
 * @throws ResnetError `ERR_RC_CHECKPOINT` for a file that is not a readable, allowed checkpoint.
 */
export function readTorchCheckpoint(source: string | Uint8Array, name = 'checkpoint'): TorchValue {
  let bytes: Uint8Array;
  let where = name;
  if (typeof source === 'string') {
    where = source;
    try {
      bytes = readFileSync(source);
    } catch (error) {
      return fail(source, `cannot be read (${(error as Error).message})`);
    }
  } else if (source instanceof Uint8Array) bytes = source;
  else return invalid('source', 'a path or the bytes of a torch.save file', source);
  if (looksLikeZip(bytes)) return readZip(bytes, where);
  // A legacy file starts with PROTO 2 and the magic number as LONG1 of 10 bytes.
  if (bytes[0] === 0x80 && bytes[2] === 0x8a && bytes[3] === 0x0a) return readLegacy(bytes, where);
  if (bytes.length > 262 && Buffer.from(bytes.subarray(257, 262)).toString('latin1') === 'ustar') {
    fail(
      where,
      'is a tar archive (the torch.save format of PyTorch before 0.4), which is not read; load it in PyTorch and save it again with torch.save(obj, path)',
    );
  }
  return fail(where, 'is not a torch.save file (neither the zip format of PyTorch 1.6+ nor the legacy pickle format)');
}

/** Options of {@link loadTorchCheckpoint}. */
export interface LoadTorchCheckpointOptions {
  /**
   * The entry of a checkpoint dict that holds the state dict, e.g. `'model_ema'`; by default the
   * file's top level when it is a dict of tensors, else its `model`, `state_dict` or
   * `model_state_dict` entry.
   */
  key?: string;
  /** Names the file in errors when the source is bytes. */
  name?: string;
}

/** The keys under which training scripts commonly keep the model's state dict. */
const STATE_DICT_KEYS = ['model', 'state_dict', 'model_state_dict'];

/** Prefixes that wrappers add to every name: DistributedDataParallel / DataParallel's, torch.compile's. */
const WRAPPER_PREFIXES = ['module.', '_orig_mod.'];

/** Whether a value is a dict of tensors (a state dict). */
function isTensorDict(value: TorchValue | undefined): value is Map<PickleKey, TorchValue> {
  return (
    value instanceof Map &&
    value.size > 0 &&
    [...value].every(([k, v]) => typeof k === 'string' && v instanceof TorchTensor)
  );
}

/**
 * The state dict of a model in a `torch.save` file, as a {@link StateDict} (floating tensors as
 * f32, integer ones as i64, torchvision's names and layouts as PyTorch has them): the file's top
 * level when it is a dict of tensors (`torch.save(model.state_dict(), f)`, torchvision's model
 * zoo), else its `model`, `state_dict` or `model_state_dict` entry (a training checkpoint), or
 * `options.key`. DataParallel's `module.` (and torch.compile's `_orig_mod.`) prefix is removed
 * when every name has it.
 *
 * ```ts
 * const state = loadTorchCheckpoint('resnet50-11ad3fa6.pth');
 * const model = ResNet50();
 * model.loadStateDict(state);
 * ```
 * @throws ResnetError `ERR_RC_CHECKPOINT` when the file cannot be read or holds no state dict.
 */
export function loadTorchCheckpoint(source: string | Uint8Array, options: LoadTorchCheckpointOptions = {}): StateDict {
  const where = typeof source === 'string' ? source : (options.name ?? 'checkpoint');
  const value = readTorchCheckpoint(source, where);
  const entry = (key: string): TorchValue | undefined => (value instanceof Map ? value.get(key) : undefined);
  let found: TorchValue | undefined;
  if (options.key !== undefined) {
    found = entry(options.key);
    if (found === undefined) fail(where, `has no entry '${options.key}'${describeKeys(value)}`);
    if (!isTensorDict(found)) fail(where, `has an entry '${options.key}' that is not a dict of tensors`);
  } else if (isTensorDict(value)) found = value;
  else {
    const key = STATE_DICT_KEYS.find((k) => isTensorDict(entry(k)));
    if (key !== undefined) found = entry(key);
  }
  if (!isTensorDict(found)) {
    return fail(
      where,
      `holds no state dict: neither the file nor its ${STATE_DICT_KEYS.join(', ')} entry is a dict of tensors${describeKeys(value)}`,
    );
  }
  let names = [...found.keys()] as string[];
  for (let stripped = true; stripped;) {
    stripped = false;
    for (const prefix of WRAPPER_PREFIXES) {
      if (names.every((n) => n.startsWith(prefix))) {
        names = names.map((n) => n.slice(prefix.length));
        stripped = true;
      }
    }
  }
  const state: StateDict = new Map();
  [...found.values()].forEach((tensor, i) => state.set(names[i]!, (tensor as TorchTensor).toStateEntry()));
  return state;
}

/** `; its keys are a, b, c` for a dict, or what the value is. */
function describeKeys(value: TorchValue): string {
  if (value instanceof Map) {
    const keys = [...value.keys()].map(String);
    return `; its keys are ${keys.slice(0, 8).join(', ')}${keys.length > 8 ? ', …' : ''}`;
  }
  return `; it holds ${value instanceof TorchTensor ? 'a single tensor' : Array.isArray(value) ? 'a list' : typeof value}`;
}
