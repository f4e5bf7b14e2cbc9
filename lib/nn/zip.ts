/**
 * A small reader of zip archives held in memory, as much of the format as `torch.save` files
 * need: the central directory (found from the end-of-central-directory record, with ZIP64 when
 * the archive needs it), stored and deflated entries, and each entry's CRC-32 checked. The
 * format is PKWARE's APPNOTE.TXT (https://pkware.cachefly.net/webdocs/casestudies/APPNOTE.TXT).
 * @packageDocumentation
 */
import { crc32, inflateRawSync } from 'node:zlib';
import { ResnetError } from '../errors.js';

/** One file of a {@link ZipArchive}. */
export interface ZipEntry {
  /** Its path inside the archive, `/`-separated. */
  name: string;
  /** 0 (stored) or 8 (deflated); other methods are refused when the entry is read. */
  method: number;
  /** Its CRC-32, as the central directory records it. */
  crc32: number;
  compressedSize: number;
  uncompressedSize: number;
  /** Where its local header starts in the archive. */
  localHeaderOffset: number;
}

const EOCD = 0x06054b50;
const ZIP64_EOCD = 0x06064b50;
const ZIP64_LOCATOR = 0x07064b50;
const CENTRAL = 0x02014b50;
const LOCAL = 0x04034b50;
/** The ZIP64 extended-information extra field's id. */
const ZIP64_EXTRA = 0x0001;
/** Set in an entry's flags when it is encrypted. */
const ENCRYPTED = 0x0001;

/** Whether `bytes` start like a zip archive (a local file header). */
export function looksLikeZip(bytes: Uint8Array): boolean {
  return bytes.length >= 4 && bytes[0] === 0x50 && bytes[1] === 0x4b && bytes[2] === 0x03 && bytes[3] === 0x04;
}

/** A zip archive in memory: its entries by name, each read (and checked) on request. */
export class ZipArchive {
  /** The entries in central-directory order. */
  readonly entries: readonly ZipEntry[];
  readonly #bytes: Buffer;
  readonly #source: string;
  readonly #byName = new Map<string, ZipEntry>();

  /**
   * Reads the central directory of `bytes`; `source` names the file in errors.
   * @throws ResnetError `ERR_RC_CHECKPOINT` when the bytes are not a readable zip archive.
   */
  constructor(bytes: Uint8Array, source: string) {
    this.#bytes = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.#source = source;
    this.entries = this.#readDirectory();
    for (const entry of this.entries) this.#byName.set(entry.name, entry);
  }

  /** The entry named `name`, or undefined. */
  entry(name: string): ZipEntry | undefined {
    return this.#byName.get(name);
  }

  /**
   * The uncompressed bytes of the entry named `name` (a view into the archive when it is stored),
   * after checking its CRC-32.
   * @throws ResnetError `ERR_RC_CHECKPOINT` when there is no such entry or it cannot be read.
   */
  read(name: string): Uint8Array {
    const entry = this.#byName.get(name);
    if (!entry) this.#fail(`has no entry '${name}'`);
    const b = this.#bytes;
    const at = entry.localHeaderOffset;
    if (at + 30 > b.length || b.readUInt32LE(at) !== LOCAL) this.#fail(`entry '${name}' has no local header`);
    const start = at + 30 + b.readUInt16LE(at + 26) + b.readUInt16LE(at + 28);
    const end = start + entry.compressedSize;
    if (end > b.length) this.#fail(`entry '${name}' runs past the end of the file (truncated)`);
    const stored = b.subarray(start, end);
    let data: Uint8Array;
    if (entry.method === 0) data = stored;
    else if (entry.method === 8) {
      try {
        data = inflateRawSync(stored);
      } catch (error) {
        return this.#fail(`entry '${name}' does not inflate (${(error as Error).message})`);
      }
    } else {
      return this.#fail(
        `entry '${name}' uses compression method ${entry.method}; only stored (0) and deflate (8) are read`,
      );
    }
    if (data.length !== entry.uncompressedSize) {
      this.#fail(`entry '${name}' holds ${data.length} bytes, not the ${entry.uncompressedSize} its directory records`);
    }
    if (crc32(data) >>> 0 !== entry.crc32) this.#fail(`entry '${name}' fails its CRC-32 check (corrupt)`);
    return data;
  }

  #fail(problem: string): never {
    throw new ResnetError('ERR_RC_CHECKPOINT', `${this.#source}: zip archive ${problem}`);
  }

  /** Finds the end-of-central-directory record and reads every central-directory entry. */
  #readDirectory(): ZipEntry[] {
    const b = this.#bytes;
    // The record is 22 bytes plus a comment of at most 65535 bytes, at the very end.
    let eocd = -1;
    for (let i = b.length - 22; i >= Math.max(0, b.length - 22 - 0xffff); i--) {
      if (b.readUInt32LE(i) === EOCD) {
        eocd = i;
        break;
      }
    }
    if (eocd < 0) this.#fail('has no end-of-central-directory record (not a zip file, or truncated)');
    let count = b.readUInt16LE(eocd + 10);
    let size = b.readUInt32LE(eocd + 12);
    let offset = b.readUInt32LE(eocd + 16);
    if (count === 0xffff || size === 0xffffffff || offset === 0xffffffff) {
      const locator = eocd - 20;
      if (locator < 0 || b.readUInt32LE(locator) !== ZIP64_LOCATOR) {
        this.#fail('needs ZIP64 but has no ZIP64 end-of-central-directory locator');
      }
      const record = this.#offset(b.readBigUInt64LE(locator + 8), 'the ZIP64 record offset');
      if (record + 56 > b.length || b.readUInt32LE(record) !== ZIP64_EOCD) {
        this.#fail('has no ZIP64 end-of-central-directory record where its locator points');
      }
      count = this.#offset(b.readBigUInt64LE(record + 32), 'the entry count');
      size = this.#offset(b.readBigUInt64LE(record + 40), 'the directory size');
      offset = this.#offset(b.readBigUInt64LE(record + 48), 'the directory offset');
    }
    if (offset + size > b.length) this.#fail('has a central directory that runs past the end of the file');
    const entries: ZipEntry[] = [];
    let at = offset;
    for (let i = 0; i < count; i++) {
      if (at + 46 > b.length || b.readUInt32LE(at) !== CENTRAL) {
        this.#fail(`has a corrupt central directory (entry ${i} of ${count})`);
      }
      const flags = b.readUInt16LE(at + 8);
      const nameLength = b.readUInt16LE(at + 28);
      const extraLength = b.readUInt16LE(at + 30);
      const commentLength = b.readUInt16LE(at + 32);
      const name = b.toString('utf8', at + 46, at + 46 + nameLength);
      if (flags & ENCRYPTED) this.#fail(`entry '${name}' is encrypted`);
      const entry: ZipEntry = {
        name,
        method: b.readUInt16LE(at + 10),
        crc32: b.readUInt32LE(at + 16),
        compressedSize: b.readUInt32LE(at + 20),
        uncompressedSize: b.readUInt32LE(at + 24),
        localHeaderOffset: b.readUInt32LE(at + 42),
      };
      this.#applyZip64(entry, b.subarray(at + 46 + nameLength, at + 46 + nameLength + extraLength));
      entries.push(entry);
      at += 46 + nameLength + extraLength + commentLength;
    }
    return entries;
  }

  /** Replaces the 32-bit sizes and offset that are saturated with the ZIP64 extra field's values. */
  #applyZip64(entry: ZipEntry, extra: Buffer): void {
    const wanted = [
      entry.uncompressedSize === 0xffffffff,
      entry.compressedSize === 0xffffffff,
      entry.localHeaderOffset === 0xffffffff,
    ];
    if (!wanted.some(Boolean)) return;
    for (let at = 0; at + 4 <= extra.length;) {
      const id = extra.readUInt16LE(at);
      const length = extra.readUInt16LE(at + 2);
      if (id === ZIP64_EXTRA) {
        let p = at + 4;
        const next = (what: string): number => {
          if (p + 8 > at + 4 + length) this.#fail(`entry '${entry.name}' has a short ZIP64 extra field`);
          const value = this.#offset(extra.readBigUInt64LE(p), what);
          p += 8;
          return value;
        };
        if (wanted[0]) entry.uncompressedSize = next('a size');
        if (wanted[1]) entry.compressedSize = next('a size');
        if (wanted[2]) entry.localHeaderOffset = next('an offset');
        return;
      }
      at += 4 + length;
    }
    this.#fail(`entry '${entry.name}' needs ZIP64 sizes but has no ZIP64 extra field`);
  }

  /** A 64-bit size or offset as a number, refused when it cannot lie within the file. */
  #offset(value: bigint, what: string): number {
    if (value > BigInt(this.#bytes.length)) this.#fail(`has ${what} (${value}) beyond the end of the file`);
    return Number(value);
  }
}
