/**
 * Argument validation with messages that name the parameter, what was expected and what was
 * received. Every public entry point checks its arguments here before calling native code.
 * @packageDocumentation
 */

/**
 * Every `code` the package's errors carry: the native side's (native/core/error.h) and the
 * TypeScript layer's.
 */
export const ERROR_CODES = [
  /** A public argument or option is wrong; the message names it, what was expected and what was received. */
  'ERR_RC_INVALID_ARGUMENT',
  /** An object was used after `dispose()` or `close()`. */
  'ERR_RC_DISPOSED',
  /** A host or device allocation failed; the message says how much was asked and what to try. */
  'ERR_RC_OUT_OF_MEMORY',
  /** An unknown or unusable device name, or tensors on different devices. */
  'ERR_RC_DEVICE',
  /** A backend (CUDA, NCCL) that this build or machine does not have. */
  'ERR_RC_BACKEND_UNAVAILABLE',
  /** A oneDNN call failed. */
  'ERR_RC_ONEDNN',
  /** A CUDA runtime call failed. */
  'ERR_RC_CUDA',
  /** A cuDNN call failed. */
  'ERR_RC_CUDNN',
  /** A cuBLAS call failed. */
  'ERR_RC_CUBLAS',
  /** An NCCL call failed. */
  'ERR_RC_NCCL',
  /** An image or data file that cannot be decoded; the message names the file. */
  'ERR_RC_CORRUPT_FILE',
  /** A broken invariant of the native code or of the TypeScript layer (a bug). */
  'ERR_RC_INTERNAL',
  /**
   * Data-parallel rendezvous: the store or a peer process is unreachable, refused this process,
   * went away, or did not answer within the timeout; the message names the address, key or rank.
   */
  'ERR_RC_DISTRIBUTED',
  /** A state dict that does not match the module. */
  'ERR_RC_STATE_DICT',
  /** A checkpoint that cannot be written or read. */
  'ERR_RC_CHECKPOINT',
  /** A dataset that cannot be opened or read, or whose contents contradict its description. */
  'ERR_RC_DATASET',
  /** A data loader's worker that failed outside any one sample. */
  'ERR_RC_DATA_LOADER',
  /** The native addon could not be loaded; the message says why and how to fix it. */
  'ERR_RC_ADDON_LOAD',
  /** A download that failed: an unreachable index, no file for this platform, or a digest that does not match. */
  'ERR_RC_DOWNLOAD',
] as const;

/** The stable code of a {@link ResnetError}, one of {@link ERROR_CODES}. */
export type ErrorCode = (typeof ERROR_CODES)[number];

/** An Error with a stable `code`, like Node's own errors. */
export class ResnetError extends Error {
  /** A stable, machine-readable code such as `ERR_RC_INVALID_ARGUMENT`. */
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message: string) {
    super(message);
    this.name = 'ResnetError';
    this.code = code;
  }
}

/** Describes a received value for an error message: its type and, briefly, its value. */
export function describe(value: unknown): string {
  if (value === null) return 'null';
  if (value === undefined) return 'undefined';
  if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint') {
    return `${typeof value} ${String(value)}`;
  }
  if (typeof value === 'string') return `string '${value.length > 40 ? value.slice(0, 40) + '…' : value}'`;
  if (Array.isArray(value)) return `array of length ${value.length}`;
  if (ArrayBuffer.isView(value)) return `${value.constructor.name} of ${value.byteLength} bytes`;
  if (typeof value === 'function') return 'function';
  const name = value.constructor?.name;
  // A class's own toString (a Tensor's `bf16[8,56,56,64] on cpu`) is what the message should show.
  // eslint-disable-next-line @typescript-eslint/no-base-to-string
  return name && name !== 'Object' ? `${name} ${String(value)}` : 'object';
}

/** Throws `ERR_RC_INVALID_ARGUMENT` naming the parameter, the expectation and the value. */
export function invalid(name: string, expected: string, received: unknown): never {
  throw new ResnetError(
    'ERR_RC_INVALID_ARGUMENT',
    `Expected ${expected} for ${name} but received ${describe(received)}`,
  );
}

/**
 * Returns `value`, which the caller's invariants say is set; throws `ERR_RC_INTERNAL` (a bug) naming
 * `what` when it is null or undefined.
 */
export function defined<T>(value: T | null | undefined, what: string): T {
  if (value === null || value === undefined) throw new ResnetError('ERR_RC_INTERNAL', `${what} is not set (a bug)`);
  return value;
}

/**
 * `Array.isArray` for a value whose type already says which array it is: it narrows to that type
 * (the built-in's `any[]` would lose the element type).
 */
export function isArray(value: unknown): value is readonly unknown[] {
  return Array.isArray(value);
}

/** ' between 1 and 8', ' of at least 0', ' at most 3' or '': the bounds of a range, for messages. */
function describeRange(min: number, max: number): string {
  if (min === -Infinity) return max === Infinity ? '' : ` at most ${max}`;
  return max === Infinity ? ` of at least ${min}` : ` between ${min} and ${max}`;
}

/** Validates an integer in [min, max]. */
export function expectInt(name: string, value: unknown, min = -Infinity, max = Infinity): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    invalid(name, `an integer${describeRange(min, max)}`, value);
  }
  return value;
}

/** Validates a finite number in [min, max]. */
export function expectNumber(name: string, value: unknown, min = -Infinity, max = Infinity): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < min || value > max) {
    invalid(name, `a finite number${describeRange(min, max)}`, value);
  }
  return value;
}

/** Validates a boolean. */
export function expectBool(name: string, value: unknown): boolean {
  if (typeof value !== 'boolean') invalid(name, 'a boolean', value);
  return value;
}

/** Validates one of a fixed set of values. */
export function expectOneOf<T extends string | number>(name: string, value: unknown, choices: readonly T[]): T {
  if (!choices.includes(value as T)) invalid(name, `one of ${choices.map((c) => JSON.stringify(c)).join(', ')}`, value);
  return value as T;
}

/** Validates a shape: an array of non-negative integers, optionally of a given rank. */
export function expectShape(name: string, value: unknown, rank?: number): number[] {
  if (!Array.isArray(value) || (rank !== undefined && value.length !== rank)) {
    invalid(name, rank === undefined ? 'an array of dimensions' : `an array of ${rank} dimensions`, value);
  }
  value.forEach((d, i) => expectInt(`${name}[${i}]`, d, 0));
  return value as number[];
}

/** Validates an options object (or undefined, which becomes `{}`), rejecting unknown keys. */
export function expectOptions<T extends object>(name: string, value: unknown, known: readonly string[]): Partial<T> {
  if (value === undefined) return {};
  if (value === null || typeof value !== 'object' || Array.isArray(value)) invalid(name, 'an options object', value);
  for (const key of Object.keys(value)) {
    if (!known.includes(key)) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `Unknown option '${key}' in ${name}; known options: ${known.join(', ')}`,
      );
    }
  }
  return value;
}

/** Validates a pair-or-scalar size (PyTorch's `int | (int, int)`) and returns it as a pair. */
export function expectPair(name: string, value: unknown, min: number): [number, number] {
  if (typeof value === 'number') {
    expectInt(name, value, min);
    return [value, value];
  }
  if (Array.isArray(value) && value.length === 2) {
    return [expectInt(`${name}[0]`, value[0], min), expectInt(`${name}[1]`, value[1], min)];
  }
  return invalid(name, `an integer of at least ${min} or a pair of them`, value);
}

/** Like {@link invalid}, with the received value already described in words. */
export function mismatch(name: string, expected: string, receivedText: string): never {
  throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `Expected ${expected} for ${name} but received ${receivedText}`);
}
