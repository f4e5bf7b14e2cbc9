/**
 * Fuzzed JPEGs: seeded mutations of a few valid files (bit flips anywhere and in the entropy-coded
 * data, byte edits in the headers, a frame header that claims a huge size, truncations), decoded
 * whole and through a crop fused with the decoder, in a child process so that a crash is seen as
 * one. Every case must either give an image of the size its header declares or throw a coded error
 * naming the file. RESNET_FUZZ_CASES sets the number of mutants (default 300) and RESNET_FUZZ_SEED
 * the seed.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import sharp from 'sharp';
import { afterAll, assert, describe, expect, it } from 'vitest';
import { describeResult, runIsolated } from './isolated.js';

const cases = Number(process.env.RESNET_FUZZ_CASES ?? 300);
const seed = Number(process.env.RESNET_FUZZ_SEED ?? 1);
const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-fuzz-'));

afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A small seeded generator (mulberry32). */
function generator(s: number): (n: number) => number {
  let a = s >>> 0;
  return (n) => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return Math.floor((((t ^ (t >>> 14)) >>> 0) / 4294967296) * n);
  };
}

/** The valid files: baseline 4:2:0, progressive, 4:4:4 with restart-free data, and grey. */
async function originals(): Promise<Uint8Array[]> {
  const [h, w] = [40, 56];
  const pixels = Buffer.alloc(h * w * 3);
  for (let i = 0; i < pixels.length; i++) pixels[i] = (i * 37 + ((i / 3) | 0) * 11) & 255;
  const image = () => sharp(pixels, { raw: { width: w, height: h, channels: 3 } });
  return Promise.all([
    image().jpeg({ quality: 90 }).toBuffer(),
    image().jpeg({ quality: 80, progressive: true }).toBuffer(),
    image().jpeg({ quality: 95, chromaSubsampling: '4:4:4' }).toBuffer(),
    image().grayscale().jpeg({ quality: 85 }).toBuffer(),
  ]).then((list) => list.map((b) => new Uint8Array(b)));
}

/** Where the first scan's entropy-coded data starts (after the SOS segment). */
function scanStart(bytes: Uint8Array): number {
  for (let i = 2; i + 3 < bytes.length;) {
    const marker = bytes[i + 1]!;
    const length = (bytes[i + 2]! << 8) | bytes[i + 3]!;
    if (marker === 0xda) return i + 2 + length;
    i += 2 + length;
  }
  throw new Error('no SOS segment');
}

/** The offset of the frame header's height (SOF0 or SOF2). */
function frameSize(bytes: Uint8Array): number {
  for (let i = 2; i + 3 < bytes.length;) {
    const marker = bytes[i + 1]!;
    if (marker === 0xc0 || marker === 0xc2) return i + 5;
    i += 2 + ((bytes[i + 2]! << 8) | bytes[i + 3]!);
  }
  throw new Error('no frame header');
}

const KINDS = [
  'flip anywhere',
  'flip in entropy data',
  'byte edit in headers',
  'huge frame size',
  'truncation',
] as const;

function mutate(original: Uint8Array, kind: (typeof KINDS)[number], draw: (n: number) => number): Uint8Array {
  const bytes = original.slice();
  const data = scanStart(bytes);
  switch (kind) {
    case 'flip anywhere': {
      const at = 2 + draw(bytes.length - 4);
      bytes[at]! ^= 1 << draw(8);
      return bytes;
    }
    case 'flip in entropy data': {
      const at = data + draw(bytes.length - 2 - data);
      bytes[at]! ^= 1 << draw(8);
      return bytes;
    }
    case 'byte edit in headers': {
      bytes[2 + draw(data - 2)] = draw(256);
      return bytes;
    }
    case 'huge frame size': {
      const at = frameSize(bytes);
      const [h, w] = [1 + draw(30000), 1 + draw(30000)];
      bytes.set([h >> 8, h & 255, w >> 8, w & 255], at);
      return bytes;
    }
    case 'truncation':
      return bytes.subarray(0, 2 + draw(bytes.length - 3));
  }
}

describe('fuzzed JPEGs', () => {
  it(`decode to their declared size or fail with a coded error naming the file (${cases} mutants, seed ${seed})`, async () => {
    const bases = await originals();
    const draw = generator(seed);
    const files: { path: string; kind: string }[] = [];
    for (let k = 0; k < cases; k++) {
      const kind = KINDS[k % KINDS.length]!;
      const path = join(dir, `case-${k}.jpg`);
      writeFileSync(path, mutate(bases[draw(bases.length)]!, kind, draw));
      files.push({ path, kind });
    }
    const binding = pathToFileURL(join(import.meta.dirname, '..', '..', 'dist', 'lib', 'binding.js')).href;
    const result = runIsolated(
      `const { readFileSync } = await import('node:fs');
       const { addon } = await import(${JSON.stringify(binding)});
       const files = ${JSON.stringify(files.map((f) => f.path))};
       const pipelines = [new rc.Compose([]), new rc.Compose([new rc.RandomResizedCrop({ size: 16 })])];
       const outcomes = [];
       for (const path of files) {
         const bytes = new Uint8Array(readFileSync(path));
         let declared = null;
         try { const h = addon().jpegHeader({ bytes }); declared = [h.height, h.width]; } catch {}
         for (const [p, pipeline] of pipelines.entries()) {
           try {
             const { image } = await pipeline.run({ source: { kind: 'encoded', bytes, path }, label: 0 }, rc.sampleRandom(1, 0, 0));
             outcomes.push({ path, p, ok: true, size: [image.height, image.width], declared });
           } catch (e) {
             outcomes.push({ path, p, ok: false, code: e?.code, message: String(e?.message) });
           }
         }
       }
       return outcomes;`,
      { timeoutMs: 600_000 },
    );
    expect(result.signal, describeResult(result)).toBeNull();
    expect(result.outcome?.ok, describeResult(result)).toBe(true);
    const outcomes = (
      result.outcome as {
        value: {
          path: string;
          p: number;
          ok: boolean;
          size?: number[];
          declared?: number[] | null;
          code?: string;
          message?: string;
        }[];
      }
    ).value;
    expect(outcomes).toHaveLength(cases * 2);
    const tally = new Map<string, { decoded: number; refused: number }>();
    for (const o of outcomes) {
      if (o.ok) expect(o.size, o.path).toEqual(o.p === 0 ? o.declared : [16, 16]);
      else {
        expect(o.code, `${o.path}: ${o.message}`).toBe('ERR_RC_CORRUPT_FILE');
        expect(o.message).toContain(o.path);
      }
      if (o.p !== 0) continue;
      const file = files.find((f) => f.path === o.path);
      assert.isDefined(file, o.path);
      const kind = file.kind;
      const t = tally.get(kind) ?? { decoded: 0, refused: 0 };
      t[o.ok ? 'decoded' : 'refused']++;
      tally.set(kind, t);
    }
    console.log(`fuzzed JPEGs, decoded whole (seed ${seed}):`, JSON.stringify(Object.fromEntries(tally)));
    // A frame header that claims a size the data does not hold never decodes.
    expect(tally.get('huge frame size')?.decoded).toBe(0);
    expect(tally.get('truncation')?.decoded).toBe(0);
  });
});
