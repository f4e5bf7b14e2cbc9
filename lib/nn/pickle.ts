/**
 * A restricted reader of Python pickles: it interprets the opcodes that plain data needs (numbers,
 * strings, bytes, lists, tuples, dicts, the memo) and nothing that can reach code it was not
 * given. A global (`GLOBAL` / `STACK_GLOBAL`) is looked up in the caller's allowlist and refused
 * otherwise, at the opcode that names it, before anything could call it; `REDUCE` calls only the
 * allowlisted global's handler written in TypeScript; `BUILD` only sets attributes of a dict
 * (which are dropped); persistent ids go to the caller. Nothing in the file is ever executed.
 * The opcodes are those of CPython's `Lib/pickletools.py` (protocols 0-5).
 * @packageDocumentation
 */
import { ResnetError } from '../errors.js';

/** A dict key: what Python hashes and a checkpoint uses as a key. */
export type PickleKey = string | number | bigint | boolean | null;

/**
 * A value read from a pickle: `None` is null, `int` a number (a bigint beyond 2^53), `float` a
 * number, `str` a string, `bytes` a Uint8Array, a list an array, a tuple a frozen array, a dict
 * (and an `OrderedDict`) a Map in insertion order, and whatever an allowlisted global's handler
 * returns (`T`).
 */
export type PickleValue<T = never> =
  | null
  | boolean
  | number
  | bigint
  | string
  | Uint8Array
  | readonly PickleValue<T>[]
  | Map<PickleKey, PickleValue<T>>
  | PickleGlobal<T>
  | T;

/** An allowlisted global, as the pickle pushes it: its handler is called only by `REDUCE`. */
export class PickleGlobal<T = never> {
  constructor(
    /** `module.name`, e.g. `collections.OrderedDict`. */
    readonly name: string,
    /** What calling it with these arguments makes; absent for a global that is only a value (a type). */
    readonly call?: (args: readonly PickleValue<T>[]) => PickleValue<T>,
  ) {}
}

/** What {@link unpickle} needs besides the bytes. */
export interface UnpickleOptions<T> {
  /** Names the file (and entry) in errors. */
  source: string;
  /** The globals the pickle may name, by `module.name`; any other is refused. */
  globals: ReadonlyMap<string, PickleGlobal<T>>;
  /** Resolves a persistent id (`BINPERSID`); without it persistent ids are refused. */
  persistentLoad?: (pid: PickleValue<T>) => PickleValue<T>;
}

/** The names of the pickle opcodes, for messages (CPython's `pickletools`). */
const OPCODE_NAMES: Record<number, string> = {
  0x28: 'MARK',
  0x2e: 'STOP',
  0x30: 'POP',
  0x31: 'POP_MARK',
  0x32: 'DUP',
  0x46: 'FLOAT',
  0x49: 'INT',
  0x4a: 'BININT',
  0x4b: 'BININT1',
  0x4c: 'LONG',
  0x4d: 'BININT2',
  0x4e: 'NONE',
  0x50: 'PERSID',
  0x51: 'BINPERSID',
  0x52: 'REDUCE',
  0x53: 'STRING',
  0x54: 'BINSTRING',
  0x55: 'SHORT_BINSTRING',
  0x56: 'UNICODE',
  0x58: 'BINUNICODE',
  0x61: 'APPEND',
  0x62: 'BUILD',
  0x63: 'GLOBAL',
  0x64: 'DICT',
  0x7d: 'EMPTY_DICT',
  0x65: 'APPENDS',
  0x67: 'GET',
  0x68: 'BINGET',
  0x69: 'INST',
  0x6a: 'LONG_BINGET',
  0x6c: 'LIST',
  0x5d: 'EMPTY_LIST',
  0x6f: 'OBJ',
  0x70: 'PUT',
  0x71: 'BINPUT',
  0x72: 'LONG_BINPUT',
  0x73: 'SETITEM',
  0x74: 'TUPLE',
  0x29: 'EMPTY_TUPLE',
  0x75: 'SETITEMS',
  0x47: 'BINFLOAT',
  0x80: 'PROTO',
  0x81: 'NEWOBJ',
  0x82: 'EXT1',
  0x83: 'EXT2',
  0x84: 'EXT4',
  0x85: 'TUPLE1',
  0x86: 'TUPLE2',
  0x87: 'TUPLE3',
  0x88: 'NEWTRUE',
  0x89: 'NEWFALSE',
  0x8a: 'LONG1',
  0x8b: 'LONG4',
  0x42: 'BINBYTES',
  0x43: 'SHORT_BINBYTES',
  0x8c: 'SHORT_BINUNICODE',
  0x8d: 'BINUNICODE8',
  0x8e: 'BINBYTES8',
  0x8f: 'EMPTY_SET',
  0x90: 'ADDITEMS',
  0x91: 'FROZENSET',
  0x92: 'NEWOBJ_EX',
  0x93: 'STACK_GLOBAL',
  0x94: 'MEMOIZE',
  0x95: 'FRAME',
  0x96: 'BYTEARRAY8',
  0x97: 'NEXT_BUFFER',
  0x98: 'READONLY_BUFFER',
};

/** The opcode `code` in words: `REDUCE (0x52)`, or `unknown opcode 0xff`. */
export function opcodeName(code: number): string {
  const hex = `0x${code.toString(16).padStart(2, '0')}`;
  const name = OPCODE_NAMES[code];
  return name ? `${name} (${hex})` : `unknown opcode ${hex}`;
}

/** The stack's marker of `MARK`. */
const MARK = Symbol('mark');
type Item<T> = PickleValue<T> | typeof MARK;

/**
 * Reads one pickle from `bytes` at `start`.
 * @returns the value and the offset just after its `STOP`.
 * @throws ResnetError `ERR_RC_CHECKPOINT` naming `options.source` for a global or opcode outside
 *   the allowlist, and for a truncated or malformed pickle.
 */
export function unpickle<T>(
  bytes: Uint8Array,
  options: UnpickleOptions<T>,
  start = 0,
): { value: PickleValue<T>; end: number } {
  return new Unpickler(bytes, options, start).run();
}

class Unpickler<T> {
  readonly #b: Buffer;
  readonly #o: UnpickleOptions<T>;
  #at: number;
  #stack: Item<T>[] = [];
  readonly #marks: number[] = [];
  readonly #memo = new Map<number, PickleValue<T>>();

  constructor(bytes: Uint8Array, options: UnpickleOptions<T>, start: number) {
    this.#b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.#o = options;
    this.#at = start;
  }

  #fail(problem: string): never {
    throw new ResnetError('ERR_RC_CHECKPOINT', `${this.#o.source}: ${problem}`);
  }

  #take(n: number): Buffer {
    if (n < 0 || this.#at + n > this.#b.length) this.#fail('the pickle ends early (truncated or corrupt)');
    const out = this.#b.subarray(this.#at, this.#at + n);
    this.#at += n;
    return out;
  }

  #line(): string {
    const end = this.#b.indexOf(0x0a, this.#at);
    if (end < 0) this.#fail('the pickle ends inside a GLOBAL name (truncated or corrupt)');
    const text = this.#b.toString('utf8', this.#at, end);
    this.#at = end + 1;
    return text;
  }

  #length(bytes: number): number {
    const b = this.#take(bytes);
    const n = bytes === 1 ? b[0]! : bytes === 4 ? b.readUInt32LE(0) : b.readBigUInt64LE(0);
    if (BigInt(n) > BigInt(this.#b.length - this.#at)) this.#fail('the pickle ends early (truncated or corrupt)');
    return Number(n);
  }

  #pop(): PickleValue<T> {
    const item = this.#stack.pop();
    if (item === undefined || item === MARK) this.#fail('the pickle is malformed (stack underflow)');
    return item;
  }

  #top(): PickleValue<T> {
    const item = this.#stack[this.#stack.length - 1];
    if (item === undefined || item === MARK) this.#fail('the pickle is malformed (stack underflow)');
    return item;
  }

  /** The items since the last MARK, removed with it. */
  #popMark(): PickleValue<T>[] {
    const mark = this.#marks.pop();
    if (mark === undefined) this.#fail('the pickle is malformed (no MARK)');
    const items = this.#stack.splice(mark + 1) as PickleValue<T>[];
    this.#stack.pop();
    return items;
  }

  #global(module: string, name: string): PickleGlobal<T> {
    const full = `${module}.${name}`;
    const allowed = this.#o.globals.get(full);
    if (!allowed) {
      this.#fail(
        `refused: the pickle names the global ${full}, which is not on the allowlist of a tensor checkpoint (${[...this.#o.globals.keys()].slice(0, 4).join(', ')}, …); a pickle can run code through its globals, so nothing in this file was run or imported`,
      );
    }
    return allowed;
  }

  #setItems(target: PickleValue<T>, items: PickleValue<T>[]): void {
    if (!(target instanceof Map)) this.#fail('the pickle sets items on something that is not a dict');
    if (items.length % 2 !== 0) this.#fail('the pickle is malformed (SETITEMS with an odd count)');
    for (let i = 0; i < items.length; i += 2) target.set(this.#key(items[i]!), items[i + 1]!);
  }

  #key(value: PickleValue<T>): PickleKey {
    if (value === null || ['string', 'number', 'bigint', 'boolean'].includes(typeof value)) return value as PickleKey;
    return this.#fail('the pickle uses a dict key that is not a string, number, boolean or None');
  }

  #append(target: PickleValue<T>, items: PickleValue<T>[]): void {
    if (!Array.isArray(target) || Object.isFrozen(target)) {
      this.#fail('the pickle appends to something that is not a list');
    }
    (target as PickleValue<T>[]).push(...items);
  }

  run(): { value: PickleValue<T>; end: number } {
    const b = this.#b;
    for (;;) {
      const code = this.#take(1)[0]!;
      switch (code) {
        case 0x80: // PROTO
          if (this.#take(1)[0]! > 5) this.#fail('the pickle uses a protocol above 5');
          break;
        case 0x95: // FRAME: a length prefix only
          this.#take(8);
          break;
        case 0x2e: // STOP
          return { value: this.#pop(), end: this.#at };
        case 0x28: // MARK
          this.#marks.push(this.#stack.length);
          this.#stack.push(MARK);
          break;
        case 0x30: // POP
          if (this.#stack[this.#stack.length - 1] === MARK) this.#popMark();
          else this.#pop();
          break;
        case 0x31: // POP_MARK
          this.#popMark();
          break;
        case 0x32: // DUP
          this.#stack.push(this.#top());
          break;
        case 0x4e: // NONE
          this.#stack.push(null);
          break;
        case 0x88: // NEWTRUE
          this.#stack.push(true);
          break;
        case 0x89: // NEWFALSE
          this.#stack.push(false);
          break;
        case 0x4a: // BININT
          this.#stack.push(this.#take(4).readInt32LE(0));
          break;
        case 0x4b: // BININT1
          this.#stack.push(this.#take(1)[0]!);
          break;
        case 0x4d: // BININT2
          this.#stack.push(this.#take(2).readUInt16LE(0));
          break;
        case 0x8a: // LONG1
        case 0x8b: // LONG4
          this.#stack.push(decodeLong(this.#take(this.#length(code === 0x8a ? 1 : 4))));
          break;
        case 0x47: // BINFLOAT: big-endian
          this.#stack.push(this.#take(8).readDoubleBE(0));
          break;
        case 0x58: // BINUNICODE
        case 0x8c: // SHORT_BINUNICODE
        case 0x8d: // BINUNICODE8
          this.#stack.push(this.#take(this.#length(code === 0x8c ? 1 : code === 0x58 ? 4 : 8)).toString('utf8'));
          break;
        case 0x55: // SHORT_BINSTRING (a Python 2 str)
        case 0x54: // BINSTRING
          this.#stack.push(this.#take(this.#length(code === 0x55 ? 1 : 4)).toString('latin1'));
          break;
        case 0x43: // SHORT_BINBYTES
        case 0x42: // BINBYTES
        case 0x8e: // BINBYTES8
          this.#stack.push(Uint8Array.from(this.#take(this.#length(code === 0x43 ? 1 : code === 0x42 ? 4 : 8))));
          break;
        case 0x29: // EMPTY_TUPLE
          this.#stack.push(Object.freeze([]));
          break;
        case 0x85: // TUPLE1
        case 0x86: // TUPLE2
        case 0x87: {
          // TUPLE3
          const n = code - 0x84;
          const items: PickleValue<T>[] = [];
          for (let i = 0; i < n; i++) items.unshift(this.#pop());
          this.#stack.push(Object.freeze(items));
          break;
        }
        case 0x74: // TUPLE
          this.#stack.push(Object.freeze(this.#popMark()));
          break;
        case 0x5d: // EMPTY_LIST
          this.#stack.push([]);
          break;
        case 0x6c: // LIST
          this.#stack.push(this.#popMark());
          break;
        case 0x61: {
          // APPEND
          const value = this.#pop();
          this.#append(this.#top(), [value]);
          break;
        }
        case 0x65: {
          // APPENDS
          const items = this.#popMark();
          this.#append(this.#top(), items);
          break;
        }
        case 0x7d: // EMPTY_DICT
          this.#stack.push(new Map());
          break;
        case 0x64: {
          // DICT
          const map = new Map<PickleKey, PickleValue<T>>();
          this.#setItems(map, this.#popMark());
          this.#stack.push(map);
          break;
        }
        case 0x73: {
          // SETITEM
          const value = this.#pop();
          const key = this.#pop();
          this.#setItems(this.#top(), [key, value]);
          break;
        }
        case 0x75: {
          // SETITEMS
          const items = this.#popMark();
          this.#setItems(this.#top(), items);
          break;
        }
        case 0x71: // BINPUT
        case 0x72: // LONG_BINPUT
          this.#memo.set(code === 0x71 ? this.#take(1)[0]! : this.#take(4).readUInt32LE(0), this.#top());
          break;
        case 0x94: // MEMOIZE
          this.#memo.set(this.#memo.size, this.#top());
          break;
        case 0x68: // BINGET
        case 0x6a: {
          // LONG_BINGET
          const key = code === 0x68 ? this.#take(1)[0]! : this.#take(4).readUInt32LE(0);
          const value = this.#memo.get(key);
          if (value === undefined) this.#fail(`the pickle reads memo ${key}, which was never stored (corrupt)`);
          this.#stack.push(value);
          break;
        }
        case 0x63: {
          // GLOBAL: "module\nname\n"
          const module = this.#line();
          this.#stack.push(this.#global(module, this.#line()));
          break;
        }
        case 0x93: {
          // STACK_GLOBAL
          const name = this.#pop();
          const module = this.#pop();
          if (typeof module !== 'string' || typeof name !== 'string') {
            this.#fail('the pickle is malformed (STACK_GLOBAL without two strings)');
          }
          this.#stack.push(this.#global(module, name));
          break;
        }
        case 0x52: {
          // REDUCE: call an allowlisted global's handler
          const args = this.#pop();
          const callable = this.#pop();
          if (!(callable instanceof PickleGlobal) || !callable.call) {
            const what = callable instanceof PickleGlobal ? callable.name : 'something that is not a global';
            this.#fail(`refused: the pickle calls ${what}, which a tensor checkpoint does not call; nothing was run`);
          }
          if (!Array.isArray(args)) this.#fail(`the pickle calls ${callable.name} without an argument tuple`);
          this.#stack.push(callable.call(args as readonly PickleValue<T>[]));
          break;
        }
        case 0x62: {
          // BUILD: only a dict's attributes (a state dict's _metadata), which are not kept
          const state = this.#pop();
          const target = this.#top();
          if (!(target instanceof Map) || !(state instanceof Map || state === null)) {
            this.#fail('refused: the pickle sets the state of an object other than an OrderedDict (BUILD)');
          }
          break;
        }
        case 0x51: {
          // BINPERSID
          const pid = this.#pop();
          if (!this.#o.persistentLoad) this.#fail('the pickle refers to persistent data, which this file cannot have');
          this.#stack.push(this.#o.persistentLoad(pid));
          break;
        }
        default:
          this.#fail(
            `refused: the pickle uses ${opcodeName(code)} at byte ${this.#at - 1}, which a checkpoint of tensors and plain data does not need; nothing in the file was run`,
          );
      }
      if (this.#at > b.length) this.#fail('the pickle ends early (truncated or corrupt)');
    }
  }
}

/** A little-endian two's-complement integer (LONG1/LONG4), as a number when it is safe, else a bigint. */
function decodeLong(bytes: Uint8Array): number | bigint {
  if (bytes.length === 0) return 0;
  let value = 0n;
  for (let i = bytes.length - 1; i >= 0; i--) value = (value << 8n) | BigInt(bytes[i]!);
  if (bytes[bytes.length - 1]! & 0x80) value -= 1n << BigInt(8 * bytes.length);
  return value >= BigInt(Number.MIN_SAFE_INTEGER) && value <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(value) : value;
}
