/**
 * A TensorBoard event-file writer for scalars, with no dependencies: the TFRecord framing, the
 * CRC32C checksums and the few protobuf fields of an `Event` are encoded by hand.
 *
 * Wire format, from TensorFlow's sources:
 * - TFRecord (tensorflow/core/lib/io/record_writer.cc): `uint64 length` (little-endian),
 *   `uint32 masked_crc32c(length bytes)`, `data`, `uint32 masked_crc32c(data)`, where
 *   `masked(crc) = ((crc >>> 15) | (crc << 17)) + 0xa282ead8` (mod 2^32).
 * - `Event` (tensorflow/core/util/event.proto): `double wall_time = 1`, `int64 step = 2`,
 *   `string file_version = 3`, `Summary summary = 5`.
 * - `Summary` (tensorflow/core/framework/summary.proto): `repeated Value value = 1`, and
 *   `Summary.Value`: `string tag = 1`, `float simple_value = 2`.
 * Protobuf encoding (protobuf.dev/programming-guides/encoding): a field is a varint key
 * `(field_number << 3) | wire_type` then its payload; wire types used here are 0 (varint: int64),
 * 1 (8 bytes little-endian: double), 2 (varint length then bytes: string, message) and
 * 5 (4 bytes little-endian: float).
 * @packageDocumentation
 */
import { createWriteStream, mkdirSync, type WriteStream } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { ResnetError, expectInt, expectNumber, expectOptions, invalid } from '../../errors.js';
import { crc32c } from '../crc32c.js';

/** TFRecord's masked CRC-32C of `data` (masking keeps checksums of checksums from degenerating). */
export function maskedCrc32c(data: Uint8Array): number {
  const crc = crc32c(data);
  return ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0;
}

/** Frames one record: length, its masked CRC, the data, the data's masked CRC. */
function tfRecord(data: Uint8Array): Buffer {
  const out = Buffer.alloc(8 + 4 + data.length + 4);
  out.writeBigUInt64LE(BigInt(data.length), 0);
  out.writeUInt32LE(maskedCrc32c(out.subarray(0, 8)), 8);
  out.set(data, 12);
  out.writeUInt32LE(maskedCrc32c(data), 12 + data.length);
  return out;
}

/** A varint; negative int64 values are their 64-bit two's complement (ten bytes), as protobuf does. */
function varint(value: number | bigint): Buffer {
  let v = BigInt.asUintN(64, BigInt(value));
  const bytes: number[] = [];
  do {
    let byte = Number(v & 0x7fn);
    v >>= 7n;
    if (v !== 0n) byte |= 0x80;
    bytes.push(byte);
  } while (v !== 0n);
  return Buffer.from(bytes);
}

function key(field: number, wireType: 0 | 1 | 2 | 5): Buffer {
  return varint((field << 3) | wireType);
}

function lengthDelimited(field: number, payload: Uint8Array): Buffer {
  return Buffer.concat([key(field, 2), varint(payload.length), payload]);
}

function doubleField(field: number, value: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeDoubleLE(value, 0);
  return Buffer.concat([key(field, 1), b]);
}

function floatField(field: number, value: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeFloatLE(value, 0);
  return Buffer.concat([key(field, 5), b]);
}

/** An `Event` with its wall time and step, plus the payload fields already encoded. */
function event(wallTime: number, step: number, payload: Buffer): Buffer {
  return Buffer.concat([doubleField(1, wallTime), key(2, 0), varint(step), payload]);
}

/** Options of {@link SummaryWriter}. */
export interface SummaryWriterOptions {
  /** Appended to the file name, as PyTorch's `filename_suffix`; default none. */
  filenameSuffix?: string;
  /** Records kept in memory before they are handed to the file; default 10 (PyTorch's `max_queue`). */
  maxQueue?: number;
  /** Seconds after which queued records are written even if the queue is not full; default 120 (PyTorch's `flush_secs`). */
  flushSecs?: number;
}

// Distinguishes writers made by one process in the same second, as TensorBoard's own writer does.
let writerCount = 0;

/**
 * Writes scalars to a TensorBoard event file in `logDir` (`tensorboard --logdir <logDir>` reads it).
 *
 * The file is `events.out.tfevents.<seconds>.<hostname>.<pid>.<n>`, PyTorch's name: the process id
 * and a counter keep two writers started in the same second from appending to one file. Records
 * are queued in memory and written, in order, through an append stream when the queue fills, every
 * `flushSecs`, on {@link SummaryWriter.flush} and on {@link SummaryWriter.close}; records still
 * queued when the process exits without `close()` are lost.
 */
export class SummaryWriter {
  /** The directory given to the constructor. */
  readonly logDir: string;
  /** The event file this writer appends to. */
  readonly path: string;
  readonly maxQueue: number;
  readonly flushSecs: number;
  #stream: WriteStream;
  #queue: Buffer[] = [];
  #timer: NodeJS.Timeout;
  #closed = false;
  #closing: Promise<void> | null = null;
  #error: Error | null = null;

  /**
   * Creates `logDir` if needed and starts the event file with its version record.
   * @param logDir - the run's directory.
   * @param options - see {@link SummaryWriterOptions}.
   */
  constructor(logDir: string, options?: SummaryWriterOptions) {
    const o = expectOptions<SummaryWriterOptions>('SummaryWriter options', options, [
      'filenameSuffix',
      'maxQueue',
      'flushSecs',
    ]);
    if (typeof logDir !== 'string' || logDir.length === 0) invalid('logDir', 'a non-empty directory path', logDir);
    const suffix = o.filenameSuffix ?? '';
    if (typeof suffix !== 'string' || /[/\\]/.test(suffix)) {
      invalid('SummaryWriter options.filenameSuffix', 'a string without path separators', suffix);
    }
    this.maxQueue = expectInt('SummaryWriter options.maxQueue', o.maxQueue ?? 10, 1);
    this.flushSecs = expectNumber('SummaryWriter options.flushSecs', o.flushSecs ?? 120, 0.001);
    this.logDir = logDir;
    mkdirSync(logDir, { recursive: true });
    const seconds = String(Math.floor(Date.now() / 1000)).padStart(10, '0');
    this.path = join(logDir, `events.out.tfevents.${seconds}.${hostname()}.${process.pid}.${writerCount++}${suffix}`);
    this.#stream = createWriteStream(this.path, { flags: 'a' });
    // Without a listener a write error would be thrown as an uncaught exception; keep it and
    // report it from the next call instead.
    this.#stream.on('error', (e: Error) => {
      this.#error ??= e;
    });
    // The version record tells readers the format; TensorBoard skips files without it.
    this.#queue.push(tfRecord(event(Date.now() / 1000, 0, lengthDelimited(3, Buffer.from('brain.Event:2')))));
    this.#write();
    this.#timer = setInterval(() => this.#write(), this.flushSecs * 1000);
    // The periodic flush must not keep a finished program alive.
    this.#timer.unref();
  }

  /**
   * Records a scalar (TensorBoard's "Scalars" tab).
   * @param tag - the series name, e.g. `train/loss`; slashes group series into sections.
   * @param value - the value (stored as a float32, as TensorBoard's `simple_value`).
   * @param step - the global step (an integer, the x axis).
   * @param wallTime - seconds since the epoch; default now.
   */
  addScalar(tag: string, value: number, step: number, wallTime?: number): void {
    this.#check('addScalar');
    if (typeof tag !== 'string' || tag.length === 0) invalid('tag', 'a non-empty string', tag);
    // NaN and infinities are legal scalars (a diverging loss should still show up).
    if (typeof value !== 'number') invalid('value', 'a number', value);
    expectInt('step', step, Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER);
    const time = wallTime === undefined ? Date.now() / 1000 : expectNumber('wallTime', wallTime);
    const summaryValue = Buffer.concat([lengthDelimited(1, Buffer.from(tag, 'utf8')), floatField(2, value)]);
    const summary = lengthDelimited(1, summaryValue);
    this.#queue.push(tfRecord(event(time, step, lengthDelimited(5, summary))));
    if (this.#queue.length >= this.maxQueue) this.#write();
  }

  /**
   * Writes every queued record to the file; resolves once the operating system has them. After
   * {@link SummaryWriter.close} it waits for the close instead.
   */
  async flush(): Promise<void> {
    if (this.#closing) return this.#closing;
    this.#throwIfFailed();
    this.#write();
    await new Promise<void>((resolve, reject) => {
      // A write's callback runs after every earlier write has completed, so an empty one marks
      // the end of everything queued so far.
      this.#stream.write(Buffer.alloc(0), (e) => (e ? reject(this.#error ?? e) : resolve()));
    });
    this.#throwIfFailed();
  }

  /**
   * Writes what is queued and closes the file; rejects with the file system's error if a write
   * failed. Calling it again returns the same promise.
   */
  close(): Promise<void> {
    if (this.#closing) return this.#closing;
    this.#write();
    this.#closed = true;
    clearInterval(this.#timer);
    this.#closing = new Promise<void>((resolve, reject) => {
      const done = (): void => (this.#error ? reject(this.#error) : resolve());
      // 'close' follows both a normal end and a failure (the stream destroys itself on errors).
      if (this.#stream.closed) done();
      else {
        this.#stream.once('close', done);
        this.#stream.end();
      }
    });
    return this.#closing;
  }

  /** Whether {@link SummaryWriter.close} has been called. */
  get closed(): boolean {
    return this.#closed;
  }

  #write(): void {
    if (this.#queue.length === 0 || this.#error) return;
    const data = this.#queue.length === 1 ? this.#queue[0]! : Buffer.concat(this.#queue);
    this.#queue = [];
    this.#stream.write(data);
  }

  #check(method: string): void {
    if (this.#closed) {
      throw new ResnetError(
        'ERR_RC_DISPOSED',
        `SummaryWriter.${method}: the writer for ${this.path} has been closed; create a new SummaryWriter to log more`,
      );
    }
    this.#throwIfFailed();
  }

  /** Rethrows a failed write's error, which is Node's own (with its `code`, such as `ENOSPC`). */
  #throwIfFailed(): void {
    if (this.#error) throw this.#error;
  }
}
