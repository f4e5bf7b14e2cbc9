/**
 * NumPy's `.npy` files, version 1.0, as `numpy.save` writes them: the magic string `\x93NUMPY`, the
 * version bytes 1 and 0, a little-endian uint16 header length, a Python dict literal giving the
 * dtype, the order and the shape, padded with spaces and ended by a newline so that the data starts
 * at a multiple of 64 bytes, then the values in C order. Format description:
 * https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
 * @packageDocumentation
 */
import { invalid, isArray } from '../errors.js';

/** The typed arrays an `.npy` file is written from, by the dtype they are stored as. */
export type NpyArray = Float32Array | Float64Array | Int32Array | BigInt64Array;

/** NumPy's dtype string of an array's elements (little-endian). */
function descr(data: NpyArray): string {
  if (data instanceof Float32Array) return '<f4';
  if (data instanceof Float64Array) return '<f8';
  if (data instanceof Int32Array) return '<i4';
  return '<i8';
}

/** The header's data start is a multiple of this (NumPy 1.14 and later write 64). */
const ALIGNMENT = 64;

/**
 * Encodes `data` as the bytes of an `.npy` file of the given shape (C order; `np.load` reads it
 * back as `float32`, `float64`, `int32` or `int64`).
 * @param data - the values, row-major.
 * @param shape - the array's shape; its product must equal `data.length`.
 * @throws `ERR_RC_INVALID_ARGUMENT` for another kind of array or a shape that does not fit.
 */
export function encodeNpy(data: NpyArray, shape: readonly number[]): Buffer {
  if (!(
    data instanceof Float32Array ||
    data instanceof Float64Array ||
    data instanceof Int32Array ||
    data instanceof BigInt64Array
  )) {
    invalid('data', 'a Float32Array, Float64Array, Int32Array or BigInt64Array', data);
  }
  if (!isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    invalid('shape', 'an array of non-negative integers', shape);
  }
  const count = shape.reduce((a, b) => a * b, 1);
  if (count !== data.length) invalid('shape', `dimensions whose product is ${data.length} (data.length)`, shape);
  // Python's tuple syntax: a one-element tuple keeps its trailing comma.
  const tuple = shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(', ')})`;
  const dict = `{'descr': '${descr(data)}', 'fortran_order': False, 'shape': ${tuple}, }`;
  const preamble = 10; // magic (6) + version (2) + header length (2)
  const padded = Math.ceil((preamble + dict.length + 1) / ALIGNMENT) * ALIGNMENT;
  const header = dict + ' '.repeat(padded - preamble - dict.length - 1) + '\n';
  const out = Buffer.alloc(padded + data.byteLength);
  out.write('\x93NUMPY', 0, 'latin1');
  out[6] = 1;
  out[7] = 0;
  out.writeUInt16LE(header.length, 8);
  out.write(header, preamble, 'latin1');
  // Typed arrays hold the platform's byte order; every platform this package builds for is little-endian.
  Buffer.from(data.buffer, data.byteOffset, data.byteLength).copy(out, padded);
  return out;
}
