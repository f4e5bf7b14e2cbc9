/**
 * A reader of NumPy `.npy` files (version 1.0 and 2.0, little-endian f4, f8, i4, i8, C order),
 * written from the format's description (numpy.lib.format) to check what the package writes.
 * @packageDocumentation
 */

/** A parsed `.npy` file. */
export interface Npy {
  descr: string;
  shape: number[];
  /** Where the data starts (the header's end). */
  dataOffset: number;
  data: Float32Array | Float64Array | Int32Array | BigInt64Array;
}

/** Parses an `.npy` file's bytes; throws on anything the format does not allow. */
export function readNpy(bytes: Uint8Array): Npy {
  const magic = Buffer.from(bytes.subarray(0, 6)).toString('latin1');
  if (magic !== '\x93NUMPY') throw new Error(`not an .npy file (magic ${JSON.stringify(magic)})`);
  const major = bytes[6]!;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const lengthBytes = major === 1 ? 2 : 4;
  const headerLength = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const dataOffset = 8 + lengthBytes + headerLength;
  const header = Buffer.from(bytes.subarray(8 + lengthBytes, dataOffset)).toString('latin1');
  if (!header.endsWith('\n')) throw new Error('the header does not end with a newline');
  const match = /^\{'descr': '([<>|][a-z]\d+)', 'fortran_order': (True|False), 'shape': \(([\d, ]*)\), \} *\n$/.exec(
    header,
  );
  if (!match) throw new Error(`unexpected header ${JSON.stringify(header)}`);
  const [, descr, fortran, dims] = match as unknown as [string, string, string, string];
  if (fortran !== 'False') throw new Error('Fortran order is not read');
  const shape = dims
    .split(',')
    .map((d) => d.trim())
    .filter((d) => d.length > 0)
    .map(Number);
  const count = shape.reduce((a, b) => a * b, 1);
  const body = new Uint8Array(bytes.subarray(dataOffset)).buffer;
  const kinds = { '<f4': Float32Array, '<f8': Float64Array, '<i4': Int32Array, '<i8': BigInt64Array } as const;
  const kind = kinds[descr as keyof typeof kinds] as (typeof kinds)[keyof typeof kinds] | undefined;
  if (kind === undefined) throw new Error(`dtype ${descr} is not read`);
  if (body.byteLength !== count * kind.BYTES_PER_ELEMENT) {
    throw new Error(`${body.byteLength} data bytes for shape [${shape.join(', ')}] of ${descr}`);
  }
  return { descr, shape, dataOffset, data: new kind(body) };
}
