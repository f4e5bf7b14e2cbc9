/**
 * Tensors: shaped, typed, contiguous arrays in native memory on a device. Activations are NHWC.
 * @packageDocumentation
 */
import { addon, type DTypeName, type RawTensor } from './binding.js';
import './dispose.js';
import { countHostSync, parseDevice } from './device.js';
import { ResnetError, expectNumber, expectOneOf, expectShape, invalid, mismatch } from './errors.js';
import { Random } from './random.js';

/** Element types: floats (`f32`, `bf16`, `f16`), integers (`i32`, `i64`) and bytes (`u8`). */
export type DType = DTypeName;

const DTYPES: readonly DType[] = ['f32', 'bf16', 'f16', 'i32', 'i64', 'u8'];
const FLOAT_DTYPES: readonly DType[] = ['f32', 'bf16', 'f16'];

/** Whether `dtype` is a floating-point type. */
export function isFloatDType(dtype: DType): boolean {
  return FLOAT_DTYPES.includes(dtype);
}

/** Where and how a tensor is created. */
export interface TensorOptions {
  /** Element type; default `'f32'`. */
  dtype?: DType;
  /** Device; default `'cpu'`. */
  device?: string;
}

type HostArray = Float32Array | Float64Array | Int32Array | Uint8Array | BigInt64Array | Uint16Array;

/** The typed array that holds each dtype's elements on the host (bf16/f16 as their raw bits). */
type HostArrayClass =
  typeof Float32Array | typeof Uint16Array | typeof Int32Array | typeof BigInt64Array | typeof Uint8Array;
const HOST_ARRAY: Readonly<Record<DType, HostArrayClass>> = {
  f32: Float32Array,
  bf16: Uint16Array,
  f16: Uint16Array,
  i32: Int32Array,
  i64: BigInt64Array,
  u8: Uint8Array,
};

/** The integer range of the dtypes `Tensor.from` converts numbers to. */
const INTEGER_RANGE: Partial<Record<DType, readonly [number, number]>> = {
  i32: [-(2 ** 31), 2 ** 31 - 1],
  u8: [0, 255],
};

/** Checks that every value of `data` is a number, and an integer in range for an integer dtype. */
function checkValues(data: ArrayLike<number>, dtype: DType): void {
  const range = INTEGER_RANGE[dtype];
  for (let i = 0; i < data.length; i++) {
    const v = data[i];
    if (typeof v !== 'number') invalid(`data[${i}]`, 'a number', v);
    if (range && !(Number.isInteger(v) && v >= range[0] && v <= range[1])) {
      invalid(`data[${i}]`, `an integer between ${range[0]} and ${range[1]} for dtype ${dtype}`, v);
    }
  }
}

function numelOf(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/**
 * A tensor in native memory. Tensors returned by modules are owned by the module and reused at
 * every step; copy them (`clone()`) to keep a value. Tensors you create are yours to `dispose()`
 * (memory is also reclaimed when the object is garbage-collected, but not promptly).
 */
export class Tensor {
  #raw: RawTensor | null;
  /** The dimensions; activations are `[N, H, W, C]`. */
  readonly shape: readonly number[];
  /** The element type. */
  readonly dtype: DType;
  /** The device, e.g. `'cpu'` or `'cuda:0'`. */
  readonly device: string;

  /** Wraps a raw native tensor; use the static constructors instead. @internal */
  constructor(raw: RawTensor) {
    this.#raw = raw;
    this.shape = Object.freeze(raw.shape);
    this.dtype = raw.dtype;
    this.device = raw.device;
  }

  /** An uninitialised tensor. */
  static empty(shape: readonly number[], options: TensorOptions = {}): Tensor {
    expectShape('shape', shape);
    const dtype = expectOneOf('dtype', options.dtype ?? 'f32', DTYPES);
    const device = parseDevice(options.device ?? 'cpu');
    return new Tensor(new (addon().NativeTensor)({ shape: [...shape], dtype, device }));
  }

  /** A tensor filled with `value`. */
  static full(shape: readonly number[], value: number, options: TensorOptions = {}): Tensor {
    const t = Tensor.empty(shape, options);
    addon().fill({ tensor: t.raw, value });
    return t;
  }

  /** A tensor of zeros. */
  static zeros(shape: readonly number[], options: TensorOptions = {}): Tensor {
    return Tensor.full(shape, 0, options);
  }

  /**
   * A tensor holding `data` (row-major, the last dimension fastest). Floats are converted to the
   * requested dtype (`bf16`/`f16` round to nearest even); `i64` takes a `BigInt64Array`.
   */
  static from(data: ArrayLike<number> | HostArray, shape: readonly number[], options: TensorOptions = {}): Tensor {
    expectShape('shape', shape);
    const dtype = expectOneOf('dtype', options.dtype ?? 'f32', DTYPES);
    const n = numelOf(shape);
    if (data === null || typeof data !== 'object' || typeof (data as ArrayLike<number>).length !== 'number') {
      invalid('data', 'an array or typed array', data);
    }
    if (data.length !== n) mismatch('data', `${n} values for shape [${shape.join(', ')}]`, `${data.length} values`);
    if (!(data instanceof HOST_ARRAY[dtype]) && !(data instanceof BigInt64Array)) checkValues(data, dtype);
    let host: HostArray;
    let hostDType: DType = dtype;
    switch (dtype) {
      case 'i32':
        host = data instanceof Int32Array ? data : Int32Array.from(data as ArrayLike<number>);
        break;
      case 'u8':
        host = data instanceof Uint8Array ? data : Uint8Array.from(data as ArrayLike<number>);
        break;
      case 'i64':
        if (!(data instanceof BigInt64Array)) invalid('data', 'a BigInt64Array for dtype i64', data);
        host = data;
        break;
      default:
        host = data instanceof Float32Array ? data : Float32Array.from(data as ArrayLike<number>);
        hostDType = 'f32';
    }
    const target = Tensor.empty(shape, { dtype, device: options.device });
    if (hostDType === dtype) {
      copyToDevice(target.raw, host);
      return target;
    }
    const staging = Tensor.empty(shape, { dtype: 'f32', device: options.device });
    copyToDevice(staging.raw, host);
    addon().cast({ src: staging.raw, dst: target.raw });
    staging.dispose();
    return target;
  }

  /** Normal samples (mean 0, std 1 unless given) from a seeded generator. */
  static randn(
    shape: readonly number[],
    options: TensorOptions & { seed?: number; mean?: number; std?: number } = {},
  ): Tensor {
    expectShape('shape', shape);
    expectOneOf('dtype', options.dtype ?? 'f32', FLOAT_DTYPES);
    const rng = new Random(options.seed);
    const mean = expectNumber('mean', options.mean ?? 0);
    const std = expectNumber('std', options.std ?? 1, 0);
    const data = new Float32Array(numelOf(shape));
    for (let i = 0; i < data.length; i++) data[i] = mean + std * rng.normal();
    return Tensor.from(data, shape, options);
  }

  /** The native tensor; throws `ERR_RC_DISPOSED` after `dispose()`. @internal */
  get raw(): RawTensor {
    if (this.#raw === null || this.#raw.disposed) {
      throw new ResnetError(
        'ERR_RC_DISPOSED',
        `This ${this.dtype}[${this.shape.join(',')}] tensor was disposed and cannot be used`,
      );
    }
    return this.#raw;
  }

  /** Whether `dispose()` was called. */
  get disposed(): boolean {
    return this.#raw === null || this.#raw.disposed;
  }

  /** The number of elements. */
  get numel(): number {
    return numelOf(this.shape);
  }

  /** Releases this tensor's reference to its memory; further use throws `ERR_RC_DISPOSED`. */
  dispose(): void {
    this.#raw?.dispose();
    this.#raw = null;
  }

  /** `using t = Tensor.zeros(...)` disposes the tensor at the end of the block. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  /** The values as a Float32Array (floats are widened; integers converted). */
  toFloat32Array(): Float32Array {
    if (this.dtype === 'f32') {
      const out = new Float32Array(this.numel);
      this.#readInto(out);
      return out;
    }
    if (isFloatDType(this.dtype)) {
      const wide = Tensor.empty(this.shape, { dtype: 'f32', device: this.device });
      addon().cast({ src: this.raw, dst: wide.raw });
      const out = wide.toFloat32Array();
      wide.dispose();
      return out;
    }
    return Float32Array.from(this.toArray() as ArrayLike<number>);
  }

  /** The values in their own type: Float32Array for floats, Int32Array, Uint8Array or BigInt64Array. */
  toArray(): Float32Array | Int32Array | Uint8Array | BigInt64Array {
    switch (this.dtype) {
      case 'i32': {
        const out = new Int32Array(this.numel);
        this.#readInto(out);
        return out;
      }
      case 'u8': {
        const out = new Uint8Array(this.numel);
        this.#readInto(out);
        return out;
      }
      case 'i64': {
        const out = new BigInt64Array(this.numel);
        this.#readInto(out);
        return out;
      }
      default:
        return this.toFloat32Array();
    }
  }

  /** Copies the values to `out`, waiting for the device (counted by `hostSyncStats`). */
  #readInto(out: ArrayBufferView): void {
    const start = performance.now();
    this.raw.copyToHost(out);
    countHostSync(start);
  }

  /** The single value of a one-element tensor (this synchronises with the device). */
  item(): number {
    if (this.numel !== 1) mismatch('tensor', 'a tensor with one element for item()', `${this.numel} elements`);
    return Number(this.toArray()[0]);
  }

  /** A new tensor with this one's values converted to `dtype` (floating types only). */
  to(dtype: DType): Tensor {
    expectOneOf('dtype', dtype, FLOAT_DTYPES);
    if (!isFloatDType(this.dtype)) mismatch('tensor', 'a floating-point tensor to convert', `a ${this.dtype} tensor`);
    const out = Tensor.empty(this.shape, { dtype, device: this.device });
    addon().cast({ src: this.raw, dst: out.raw });
    return out;
  }

  /** A new tensor with a copy of this one's values. */
  clone(): Tensor {
    const out = Tensor.empty(this.shape, { dtype: this.dtype, device: this.device });
    out.raw.copyFrom(this.raw);
    return out;
  }

  /** The same memory seen with another shape of equal element count. */
  reshape(shape: readonly number[]): Tensor {
    expectShape('shape', shape);
    if (numelOf(shape) !== this.numel) mismatch('shape', `a shape of ${this.numel} elements`, `[${shape.join(', ')}]`);
    return new Tensor(this.raw.reshape({ shape: [...shape] }));
  }

  /** A view of `shape` starting `offset` elements in, sharing memory. */
  view(offset: number, shape: readonly number[]): Tensor {
    return new Tensor(this.raw.view({ offset, shape: [...shape] }));
  }

  /**
   * Overwrites this tensor with host data in its own element type (Float32Array for f32,
   * Uint8Array for u8, Int32Array for i32, BigInt64Array for i64, the raw bits for bf16/f16 as a
   * Uint16Array). Use `Tensor.from` to convert numbers to bf16/f16.
   */
  copyFromHost(data: ArrayBufferView): void {
    const host = HOST_ARRAY[this.dtype];
    if (!(data instanceof host)) invalid('data', `a ${host.name} for a ${this.dtype} tensor`, data);
    const bytes = this.numel * host.BYTES_PER_ELEMENT;
    if (data.byteLength !== bytes) {
      mismatch('data', `${bytes} bytes for ${this.toString()}`, `${data.byteLength} bytes`);
    }
    copyToDevice(this.raw, data);
  }

  /** Copies `src` (same shape and dtype, any device) into this tensor. */
  copyFrom(src: Tensor): void {
    this.raw.copyFrom(src.raw);
  }

  /** A short description: `bf16[8,56,56,64] on cpu`. */
  toString(): string {
    return `${this.dtype}[${this.shape.join(',')}] on ${this.disposed ? 'disposed' : this.device}`;
  }
}

/**
 * Copies host data into a raw tensor. A copy to a CUDA device waits for the device's queue (the
 * host buffer is the caller's again once it returns), so it is counted as a host synchronisation;
 * on the CPU it is a plain copy. @internal
 */
export function copyToDevice(raw: RawTensor, data: ArrayBufferView): void {
  if (raw.device === 'cpu') {
    raw.copyFromHost(data);
    return;
  }
  const start = performance.now();
  raw.copyFromHost(data);
  countHostSync(start);
}

/**
 * Checks a tensor argument of a public API: type, not disposed, and optionally rank, dtype and
 * shape (a `-1` in `shape` matches any size).
 */
export function expectTensor(
  name: string,
  value: unknown,
  expect: { rank?: number; dtype?: DType | readonly DType[]; shape?: readonly number[]; device?: string } = {},
): Tensor {
  if (!(value instanceof Tensor)) invalid(name, 'a Tensor', value);
  if (value.disposed) throw new ResnetError('ERR_RC_DISPOSED', `${name} was disposed and cannot be used`);
  const shapeText = `[${value.shape.join(', ')}]`;
  if (expect.rank !== undefined && value.shape.length !== expect.rank) {
    mismatch(name, `a tensor of rank ${expect.rank}`, `a tensor of shape ${shapeText}`);
  }
  if (
    expect.shape &&
    (expect.shape.length !== value.shape.length || expect.shape.some((d, i) => d !== -1 && d !== value.shape[i]))
  ) {
    mismatch(
      name,
      `a tensor of shape [${expect.shape.map((d) => (d === -1 ? '*' : d)).join(', ')}]`,
      `a tensor of shape ${shapeText}`,
    );
  }
  if (expect.dtype !== undefined) {
    const allowed = typeof expect.dtype === 'string' ? [expect.dtype] : expect.dtype;
    if (!allowed.includes(value.dtype)) {
      mismatch(name, `a tensor of dtype ${allowed.join(' or ')}`, `a ${value.dtype} tensor`);
    }
  }
  if (expect.device !== undefined && value.device !== expect.device) {
    mismatch(
      name,
      `a tensor on ${expect.device} (the module's device; move it with module.to())`,
      `a tensor on ${value.device}`,
    );
  }
  return value;
}
