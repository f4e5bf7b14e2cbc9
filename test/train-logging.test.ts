/**
 * Training logs: JSON lines, the progress bar's plain-text output, TensorBoard event files read
 * back by a reader written here independently of the writer (bitwise CRC-32C, generic protobuf
 * decoding), and PNG plots decoded with sharp.
 */
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { afterAll, describe, expect, it } from 'vitest';
import { JsonLinesLogger, ProgressBar, formatDuration, type ProgressStream } from '../lib/train/outputs/logging.js';
import { ConfusionMatrix } from '../lib/train/metrics.js';
import { plotConfusionMatrix, plotCurves, writePng } from '../lib/train/outputs/plots.js';
import { crc32c } from '../lib/train/crc32c.js';
import { SummaryWriter, maskedCrc32c } from '../lib/train/outputs/tensorboard.js';
import { defined } from './helpers/defined.js';

const dir = mkdtempSync(join(tmpdir(), 'rc-train-logging-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function code(f: () => unknown): string | undefined {
  try {
    f();
  } catch (e) {
    return (e as { code?: string }).code;
  }
  return undefined;
}

describe('JsonLinesLogger', () => {
  it('appends one parseable object per line, readable before close', () => {
    const path = join(dir, 'logs', 'metrics.jsonl');
    const log = new JsonLinesLogger(path);
    log.log({ epoch: 1, step: 10, loss: 2.5, lr: 0.1 });
    log.log({ epoch: 1, step: 20, loss: NaN, tag: 'a "quoted"\nline' });
    // Written through at once: a reader sees both lines without close().
    expect(readFileSync(path, 'utf8').trimEnd().split('\n')).toHaveLength(2);
    log.close();
    log.close();
    const again = new JsonLinesLogger(path);
    again.log({ done: true });
    again.close();
    const lines = readFileSync(path, 'utf8').split('\n');
    expect(lines.at(-1)).toBe('');
    expect(lines.slice(0, -1).map((l): unknown => JSON.parse(l))).toEqual([
      { epoch: 1, step: 10, loss: 2.5, lr: 0.1 },
      { epoch: 1, step: 20, loss: null, tag: 'a "quoted"\nline' },
      { done: true },
    ]);
    expect(code(() => log.log({ x: 1 }))).toBe('ERR_RC_DISPOSED');
    expect(code(() => again.log([1] as never))).toBe('ERR_RC_DISPOSED');
    expect(code(() => new JsonLinesLogger(join(dir, 'x.jsonl')).log([1] as never))).toBe('ERR_RC_INVALID_ARGUMENT');
  });
});

describe('formatDuration', () => {
  it('formats m:ss, h:mm:ss and days, with an unknown ETA as --:--', () => {
    expect(formatDuration(0)).toBe('0:00');
    expect(formatDuration(65.4)).toBe('1:05');
    expect(formatDuration(3725)).toBe('1:02:05');
    expect(formatDuration(90061)).toBe('1d 1:01:01');
    expect(formatDuration(-5)).toBe('0:00');
    expect(formatDuration(Infinity)).toBe('--:--');
    expect(formatDuration(NaN)).toBe('--:--');
  });
});

/** A stream that records writes, and a clock that advances 100 ms per read. */
function fakes(isTTY: boolean): { stream: ProgressStream & { text: string }; now: () => number } {
  const stream = {
    text: '',
    isTTY,
    columns: 200,
    write(s: string) {
      this.text += s;
      return true;
    },
  };
  let t = 0;
  return { stream, now: () => (t += 100) - 100 };
}

describe('ProgressBar', () => {
  it('prints a plain line every printEvery steps and a final line when not a terminal', () => {
    const { stream, now } = fakes(false);
    const bar = new ProgressBar({ total: 10, stream, label: 'train', printEvery: 5, batchSize: 32, now });
    for (let i = 1; i <= 10; i++) bar.update(i, { epoch: 1, epochs: 3, loss: 1.23456, lr: 0.1 });
    bar.finish({ loss: 0.5 });
    bar.finish();
    // The clock reads 0 at construction and 100 ms more at every update and at finish(): step 5
    // at 0.5 s is 10 steps/s, 320 img/s, 0.5 s left; the end at 1.1 s is 10 * 32 / 1.1 = 291 img/s.
    expect(stream.text).toBe(
      'train epoch 1/3 step  5/10  50% loss 1.2346 lr 0.1 320 img/s ETA 0:01\n' +
        'train epoch 1/3 step 10/10 100% loss 0.5000 lr 0.1 291 img/s time 0:01\n',
    );
    expect(code(() => bar.update(3))).toBe('ERR_RC_DISPOSED');
  });

  it('with printEvery 0 prints only the final line; metrics and small lrs are shown', () => {
    const { stream, now } = fakes(false);
    const bar = new ProgressBar({ total: 4, stream, printEvery: 0, now });
    for (let i = 1; i <= 4; i++) {
      bar.update(i, { loss: 0.25, lr: 2.5e-5, imagesPerSec: 1234.4, metrics: { acc1: 0.75 } });
    }
    bar.finish();
    expect(stream.text).toBe('step 4/4 100% loss 0.2500 lr 2.50e-5 acc1 0.7500 1234 img/s time 0:01\n'); // 0.5 s rounds up
    expect(() => bar.update(1, { los: 1 } as never)).toThrow();
  });

  it('counts the rate and the time left from `initial` when it starts part-way (a resumed epoch)', () => {
    const { stream, now } = fakes(false);
    const bar = new ProgressBar({ total: 100, initial: 90, stream, printEvery: 5, batchSize: 10, now });
    for (let i = 91; i <= 100; i++) bar.update(i);
    // 5 steps in 0.5 s: 10 steps/s and 100 img/s, not the 95 steps of the whole epoch; 5 steps left.
    expect(stream.text.split('\n')[0]).toBe('step  95/100  95% 100 img/s ETA 0:01');
    expect(() => new ProgressBar({ total: 10, initial: 11 })).toThrow(/initial/);
  });

  it('redraws one line in place on a terminal', () => {
    const { stream, now } = fakes(true);
    const bar = new ProgressBar({ total: 4, stream, minIntervalMs: 0, now });
    bar.update(2, { loss: 1 });
    bar.finish();
    const draws = stream.text.split('\r').slice(1);
    expect(draws).toHaveLength(2);
    expect(draws[0]).toBe('step 2/4 [##########..........]  50% loss 1.0000 ETA 0:00\x1b[K');
    expect(draws[1]!.endsWith('\x1b[K\n')).toBe(true);
    expect(stream.text.split('\n')).toHaveLength(2);
  });
});

// ---------------------------------------------------------------------------------------------
// An independent TensorBoard event-file reader.

/** CRC-32C computed bit by bit (no table), reflected polynomial 0x82F63B78. */
function crc32cBitwise(bytes: Uint8Array): number {
  let crc = 0xffffffff;
  for (const b of bytes) {
    crc ^= b;
    for (let k = 0; k < 8; k++) crc = crc & 1 ? (crc >>> 1) ^ 0x82f63b78 : crc >>> 1;
  }
  return (crc ^ 0xffffffff) >>> 0;
}

function masked(bytes: Uint8Array): number {
  const c = crc32cBitwise(bytes);
  return (((c >>> 15) | (c << 17)) + 0xa282ead8) >>> 0;
}

/** Splits a TFRecord file, checking both checksums of every record. */
function readRecords(file: Buffer): Buffer[] {
  const out: Buffer[] = [];
  let at = 0;
  while (at < file.length) {
    const len = Number(file.readBigUInt64LE(at));
    expect(file.readUInt32LE(at + 8)).toBe(masked(file.subarray(at, at + 8)));
    const data = file.subarray(at + 12, at + 12 + len);
    expect(file.readUInt32LE(at + 12 + len)).toBe(masked(data));
    out.push(data);
    at += 12 + len + 4;
  }
  expect(at).toBe(file.length);
  return out;
}

/** A varint field (wire type 0), or a 64-bit, length-delimited or 32-bit one (wire types 1, 2, 5) with its bytes. */
type Field = { field: number; wire: 0; varint: bigint } | BytesField;
interface BytesField {
  field: number;
  wire: 1 | 2 | 5;
  bytes: Buffer;
}

/** Decodes one protobuf message into its fields, in order. */
function decodeMessage(buf: Buffer): Field[] {
  const fields: Field[] = [];
  let at = 0;
  const varint = (): bigint => {
    let v = 0n;
    let shift = 0n;
    for (;;) {
      const b = buf[at++]!;
      v |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
      shift += 7n;
    }
  };
  while (at < buf.length) {
    const key = Number(varint());
    const field = key >> 3;
    const wire = key & 7;
    if (wire === 0) fields.push({ field, wire, varint: varint() });
    else if (wire === 1) {
      fields.push({ field, wire, bytes: buf.subarray(at, at + 8) });
      at += 8;
    } else if (wire === 2) {
      const len = Number(varint());
      fields.push({ field, wire, bytes: buf.subarray(at, at + len) });
      at += len;
    } else if (wire === 5) {
      fields.push({ field, wire, bytes: buf.subarray(at, at + 4) });
      at += 4;
    } else throw new Error(`unexpected wire type ${wire}`);
  }
  return fields;
}

interface DecodedEvent {
  wallTime?: number;
  step?: bigint;
  fileVersion?: string;
  values?: { tag: string; simpleValue: number }[];
}

/** Event: wall_time = 1 (double), step = 2 (int64), file_version = 3, summary = 5 (Summary.value = 1: tag = 1, simple_value = 2). */
function decodeEvent(buf: Buffer): DecodedEvent {
  const e: DecodedEvent = {};
  for (const f of decodeMessage(buf)) {
    if (f.field === 1 && f.wire === 1) e.wallTime = f.bytes.readDoubleLE(0);
    else if (f.field === 2 && f.wire === 0) e.step = BigInt.asIntN(64, f.varint);
    else if (f.field === 3 && f.wire === 2) e.fileVersion = f.bytes.toString('utf8');
    else if (f.field === 5 && f.wire === 2) {
      e.values = decodeMessage(f.bytes)
        .filter((v): v is BytesField => v.field === 1 && v.wire === 2)
        .map((v) => {
          const inner = decodeMessage(v.bytes);
          const tag = defined(
            inner.find((x): x is BytesField => x.field === 1 && x.wire === 2),
            'the tag of a Summary.Value',
          ).bytes.toString('utf8');
          const simpleValue = defined(
            inner.find((x): x is BytesField => x.field === 2 && x.wire === 5),
            'the simple_value of a Summary.Value',
          ).bytes.readFloatLE(0);
          return { tag, simpleValue };
        });
    } else throw new Error(`unexpected Event field ${f.field} (wire type ${f.wire})`);
  }
  return e;
}

describe('SummaryWriter', () => {
  it('CRC-32C matches the standard check value and the bitwise reference', () => {
    const check = Buffer.from('123456789', 'ascii');
    expect(crc32c(check)).toBe(0xe3069283);
    expect(crc32cBitwise(check)).toBe(0xe3069283);
    const data = Buffer.from(Array.from({ length: 1000 }, (_, i) => (i * 7919) & 0xff));
    expect(crc32c(data)).toBe(crc32cBitwise(data));
    expect(crc32c(data.subarray(600), crc32c(data.subarray(0, 600)))).toBe(crc32c(data)); // chunked
    expect(maskedCrc32c(data)).toBe(masked(data));
  });

  it('writes framed, checksummed Event records that decode to the scalars written', async () => {
    const logDir = join(dir, 'tb', 'run1');
    const w = new SummaryWriter(logDir);
    expect(w.path.startsWith(join(logDir, 'events.out.tfevents.'))).toBe(true);
    expect(w.path.slice(logDir.length + 1)).toMatch(/^events\.out\.tfevents\.\d{10}\.[^/]+\.\d+\.\d+$/);
    w.addScalar('train/loss', 2.5, 0, 1700000000.25);
    w.addScalar('train/loss', 1.1, 100, 1700000001.5);
    w.addScalar('train/lr', 0.1, 100, 1700000001.5);
    w.addScalar('val/acc1', NaN, 1 << 20, 1700000002);
    w.addScalar('neg', -Infinity, -3, 1700000003);
    await w.flush();
    const events = readRecords(readFileSync(w.path)).map(decodeEvent);
    expect(events[0]!.fileVersion).toBe('brain.Event:2');
    expect(Math.abs(defined(events[0]!.wallTime, 'the wall time') - Date.now() / 1000)).toBeLessThan(60);
    const scalars = events
      .slice(1)
      .map((e) => ({ wallTime: e.wallTime, step: e.step, ...defined(e.values, 'a summary')[0]! }));
    expect(events.slice(1).every((e) => e.values?.length === 1)).toBe(true);
    expect(scalars).toEqual([
      { wallTime: 1700000000.25, step: 0n, tag: 'train/loss', simpleValue: 2.5 },
      { wallTime: 1700000001.5, step: 100n, tag: 'train/loss', simpleValue: Math.fround(1.1) },
      { wallTime: 1700000001.5, step: 100n, tag: 'train/lr', simpleValue: Math.fround(0.1) },
      { wallTime: 1700000002, step: 1048576n, tag: 'val/acc1', simpleValue: NaN },
      { wallTime: 1700000003, step: -3n, tag: 'neg', simpleValue: -Infinity },
    ]);

    // More after a flush, then close: appended to the same file.
    w.addScalar('train/loss', 0.5, 200);
    await w.close();
    await w.close();
    await w.flush();
    const all = readRecords(readFileSync(w.path)).map(decodeEvent);
    expect(all).toHaveLength(7);
    expect(defined(all[6]!.values, 'a summary')[0]!.tag).toBe('train/loss');
    expect(all[6]!.step).toBe(200n);
    expect(Math.abs(defined(all[6]!.wallTime, 'the wall time') - Date.now() / 1000)).toBeLessThan(60);
    expect(code(() => w.addScalar('x', 1, 1))).toBe('ERR_RC_DISPOSED');
    expect(() => w.addScalar('x', 1, 1)).toThrow(/closed/);
  });

  it('writes when the queue fills, and two writers get two files', async () => {
    const logDir = join(dir, 'tb', 'run2');
    const a = new SummaryWriter(logDir, { maxQueue: 2 });
    const b = new SummaryWriter(logDir, { filenameSuffix: '.eval' });
    expect(a.path).not.toBe(b.path);
    expect(b.path.endsWith('.eval')).toBe(true);
    a.addScalar('x', 1, 1);
    a.addScalar('x', 2, 2);
    await new Promise((r) => setTimeout(r, 50));
    expect(readRecords(readFileSync(a.path))).toHaveLength(3); // handed over without flush()
    expect(code(() => a.addScalar('', 1, 1))).toBe('ERR_RC_INVALID_ARGUMENT');
    expect(code(() => a.addScalar('x', 1, 1.5))).toBe('ERR_RC_INVALID_ARGUMENT');
    await Promise.all([a.close(), b.close()]);
    expect(readdirSync(logDir).sort()).toEqual([a.path, b.path].map((p) => p.slice(logDir.length + 1)).sort());
  });
});

// ---------------------------------------------------------------------------------------------

async function decode(png: Buffer): Promise<{ width: number; height: number; data: Buffer }> {
  const { data, info } = await sharp(png).ensureAlpha().raw().toBuffer({ resolveWithObject: true });
  expect(info.channels).toBe(4);
  return { width: info.width, height: info.height, data };
}

function countColour(data: Buffer, rgb: [number, number, number]): number {
  let n = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (data[i] === rgb[0] && data[i + 1] === rgb[1] && data[i + 2] === rgb[2]) n++;
  }
  return n;
}

describe('plots', () => {
  it('plotCurves draws axes, text and each series in its colour at the requested size', async () => {
    const loss = Array.from({ length: 200 }, (_, i) => [i * 10, 2.5 * Math.exp(-i / 50) + 0.1] as [number, number]);
    const val = Array.from(
      { length: 20 },
      (_, i) => [i * 100, i === 7 ? NaN : 2 * Math.exp(-i / 6) + 0.3] as [number, number],
    );
    const png = await plotCurves(
      [
        { name: 'train loss', points: loss },
        { name: 'val loss', points: val },
      ],
      { title: 'ResNet-18 loss', xLabel: 'step', yLabel: 'loss' },
    );
    expect(png.subarray(1, 4).toString('ascii')).toBe('PNG');
    const img = await decode(png);
    expect([img.width, img.height]).toEqual([800, 500]);
    const pixels = img.width * img.height;
    const white = countColour(img.data, [255, 255, 255]);
    expect(white).toBeLessThan(pixels * 0.97);
    expect(white).toBeGreaterThan(pixels * 0.5);
    expect(countColour(img.data, [31, 119, 180])).toBeGreaterThan(500); // tab10 blue: the first series
    expect(countColour(img.data, [255, 127, 14])).toBeGreaterThan(200); // tab10 orange: the second
    expect(countColour(img.data, [0, 0, 0])).toBeGreaterThan(500); // text

    const small = await decode(
      await plotCurves(
        [
          {
            name: 'lr',
            points: [
              [0, 1e-4],
              [50, 0.1],
              [100, 1e-6],
            ],
          },
        ],
        { width: 320, height: 200, logY: true },
      ),
    );
    expect([small.width, small.height]).toEqual([320, 200]);
    const empty = await decode(await plotCurves([], { title: 'nothing yet' }));
    expect([empty.width, empty.height]).toEqual([800, 500]);
    await expect(plotCurves([{ name: 'x', points: [[0, 'a']] as never }])).rejects.toThrow(/points\[0\]/);
  });

  it('plotCurves marks each point of a short curve', async () => {
    // The same horizontal segment as 3 points and as 31 (too many to mark): the 5x5 markers of the
    // three inner points add about 15 blue pixels each to the 2-pixel line.
    const ref = {
      name: 'ref',
      points: [
        [0, 0],
        [4, 1],
      ] as [number, number][],
    };
    const blue = async (count: number): Promise<number> => {
      const points = Array.from({ length: count }, (_, i) => [1 + (2 * i) / (count - 1), 0.5] as [number, number]);
      return countColour((await decode(await plotCurves([{ name: 'val', points }, ref]))).data, [31, 119, 180]);
    };
    expect(await blue(3)).toBeGreaterThan((await blue(31)) + 30);
  });

  it('plotConfusionMatrix draws a heat map with counts', async () => {
    const cm = ConfusionMatrix.fromArray([
      [50, 2, 0],
      [5, 40, 5],
      [0, 10, 30],
    ]);
    const img = await decode(await plotConfusionMatrix(cm, ['cat', 'dog', 'bird']));
    expect(img.width).toBeGreaterThan(200);
    expect(img.height).toBeGreaterThan(200);
    expect(countColour(img.data, [8, 48, 107])).toBeGreaterThan(1000); // the largest cell, darkest blue
    expect(countColour(img.data, [247, 251, 255])).toBeGreaterThan(1000); // the empty cells
    const many = await decode(
      await plotConfusionMatrix(
        Array.from({ length: 100 }, (_, i) => Array.from({ length: 100 }, (_, j) => (i === j ? 9 : 0))),
        undefined,
        { normalize: true },
      ),
    );
    expect(many.width).toBeGreaterThan(600);
  });

  it('writePng replaces the file atomically and leaves no temporary file', async () => {
    const path = join(dir, 'plots', 'loss.png');
    const png = await plotCurves(
      [
        {
          name: 'a',
          points: [
            [0, 1],
            [1, 0],
          ],
        },
      ],
      { width: 200, height: 150 },
    );
    await writePng(path, png);
    await writePng(path, png);
    expect(readFileSync(path).equals(png)).toBe(true);
    expect(readdirSync(join(dir, 'plots'))).toEqual(['loss.png']);
  });
});
