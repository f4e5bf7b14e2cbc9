/**
 * Reading the shared libraries out of a wheel (a zip archive, PKWARE's APPNOTE.TXT): the central
 * directory is read from the end of the file, and each wanted member is streamed through an
 * inflater to its file with its CRC-32 checked, so that a wheel of several hundred megabytes is
 * never held in memory (lib/nn/zip.ts reads archives that fit in memory, checkpoints).
 * @packageDocumentation
 */
import { createReadStream, createWriteStream, type promises as fsp } from 'node:fs';
import { open } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { Transform } from 'node:stream';
import { crc32, createInflateRaw } from 'node:zlib';
import { ResnetError } from '../errors.js';

/** One member of a zip archive, from its central directory. */
export interface ZipMember {
  name: string;
  /** 0 (stored) or 8 (deflated). */
  method: number;
  compressedSize: number;
  size: number;
  /** Offset of the member's local header. */
  headerOffset: number;
  /** The CRC-32 of the unpacked bytes. */
  crc: number;
}

function corrupt(file: string, what: string): never {
  throw new ResnetError('ERR_RC_CORRUPT_FILE', `${file} is not a readable wheel (zip archive): ${what}`);
}

async function readAt(handle: fsp.FileHandle, position: number, length: number): Promise<Buffer> {
  const buffer = Buffer.alloc(length);
  const { bytesRead } = await handle.read(buffer, 0, length, position);
  return buffer.subarray(0, bytesRead);
}

/** The zip64 sizes and offset that replace the 0xffffffff fields of a central directory entry. */
function zip64Fields(extra: Buffer, member: ZipMember): void {
  for (let at = 0; at + 4 <= extra.length;) {
    const id = extra.readUInt16LE(at);
    const length = extra.readUInt16LE(at + 2);
    if (id === 0x0001) {
      let p = at + 4;
      const take = () => {
        const value = Number(extra.readBigUInt64LE(p));
        p += 8;
        return value;
      };
      if (member.size === 0xffffffff) member.size = take();
      if (member.compressedSize === 0xffffffff) member.compressedSize = take();
      if (member.headerOffset === 0xffffffff) member.headerOffset = take();
      return;
    }
    at += 4 + length;
  }
}

/** The members of the zip archive `file` (zip64 archives included). */
export async function zipMembers(file: string): Promise<ZipMember[]> {
  const handle = await open(file, 'r');
  try {
    const { size } = await handle.stat();
    const tailLength = Math.min(size, 65_557);
    const tail = await readAt(handle, size - tailLength, tailLength);
    const eocd = tail.lastIndexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06]));
    if (eocd < 0) corrupt(file, 'no end of central directory record');
    let count = tail.readUInt16LE(eocd + 10);
    let cdSize = tail.readUInt32LE(eocd + 12);
    let cdOffset = tail.readUInt32LE(eocd + 16);
    const locator = eocd - 20;
    if (locator >= 0 && tail.readUInt32LE(locator) === 0x07064b50) {
      const record = await readAt(handle, Number(tail.readBigUInt64LE(locator + 8)), 56);
      if (record.length < 56 || record.readUInt32LE(0) !== 0x06064b50) corrupt(file, 'a bad zip64 record');
      count = Number(record.readBigUInt64LE(32));
      cdSize = Number(record.readBigUInt64LE(40));
      cdOffset = Number(record.readBigUInt64LE(48));
    }
    const cd = await readAt(handle, cdOffset, cdSize);
    if (cd.length !== cdSize) corrupt(file, 'the central directory is cut short');
    const members: ZipMember[] = [];
    for (let at = 0, i = 0; i < count; i++) {
      if (at + 46 > cd.length || cd.readUInt32LE(at) !== 0x02014b50) {
        corrupt(file, `central directory entry ${i} is damaged`);
      }
      const nameLength = cd.readUInt16LE(at + 28);
      const extraLength = cd.readUInt16LE(at + 30);
      const commentLength = cd.readUInt16LE(at + 32);
      const member: ZipMember = {
        name: cd.toString('utf8', at + 46, at + 46 + nameLength),
        method: cd.readUInt16LE(at + 10),
        compressedSize: cd.readUInt32LE(at + 20),
        size: cd.readUInt32LE(at + 24),
        headerOffset: cd.readUInt32LE(at + 42),
        crc: cd.readUInt32LE(at + 16),
      };
      zip64Fields(cd.subarray(at + 46 + nameLength, at + 46 + nameLength + extraLength), member);
      members.push(member);
      at += 46 + nameLength + extraLength + commentLength;
    }
    return members;
  } finally {
    await handle.close();
  }
}

/** Writes member `m` of the archive `file` to `target`, checking its size. */
async function extractMember(file: string, m: ZipMember, target: string): Promise<void> {
  const handle = await open(file, 'r');
  let dataStart: number;
  try {
    const header = await readAt(handle, m.headerOffset, 30);
    if (header.length < 30 || header.readUInt32LE(0) !== 0x04034b50) corrupt(file, `${m.name}: bad local header`);
    dataStart = m.headerOffset + 30 + header.readUInt16LE(26) + header.readUInt16LE(28);
  } finally {
    await handle.close();
  }
  if (m.method !== 0 && m.method !== 8) corrupt(file, `${m.name}: compression method ${m.method} is not supported`);
  const source =
    m.compressedSize === 0 ? null : createReadStream(file, { start: dataStart, end: dataStart + m.compressedSize - 1 });
  const out = createWriteStream(target, { mode: 0o755 });
  let crc = 0;
  const check = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      crc = crc32(chunk, crc);
      done(null, chunk);
    },
  });
  if (source === null) {
    out.end();
    await new Promise<void>((resolve, reject) => out.on('finish', resolve).on('error', reject));
  } else if (m.method === 8) {
    await pipeline(source, createInflateRaw(), check, out);
  } else {
    await pipeline(source, check, out);
  }
  if (out.bytesWritten !== m.size) corrupt(file, `${m.name}: ${out.bytesWritten} bytes unpacked, ${m.size} expected`);
  if (crc >>> 0 !== m.crc) corrupt(file, `${m.name}: CRC-32 mismatch`);
}

/** Whether a member is a shared library of an NVIDIA wheel: `nvidia/<part>/lib/<name>.so[.N...]`. */
export function isWheelLibrary(name: string): boolean {
  return /^nvidia\/[^/]+\/lib\/[^/]+\.so(\.\d+)*$/.test(name);
}

/** Unpacks the shared libraries of the wheel `file` (see {@link isWheelLibrary}) into `dir`; returns their names. */
export async function extractWheelLibraries(file: string, dir: string): Promise<string[]> {
  const written: string[] = [];
  for (const m of await zipMembers(file)) {
    if (!isWheelLibrary(m.name)) continue;
    await extractMember(file, m, join(dir, basename(m.name)));
    written.push(basename(m.name));
  }
  return written;
}
