/**
 * Argument validation with messages that name the parameter, what was expected and what was
 * received. Every public entry point checks its arguments here before calling native code.
 * @packageDocumentation
 */

/** Error codes used by the TypeScript layer (native errors carry `ERR_RC_*` codes too). */
export type ErrorCode =
  | 'ERR_RC_INVALID_ARGUMENT'
  | 'ERR_RC_DISPOSED'
  | 'ERR_RC_DEVICE'
  | 'ERR_RC_STATE_DICT'
  | 'ERR_RC_CHECKPOINT'
  | 'ERR_RC_DATASET'
  | 'ERR_RC_CORRUPT_FILE';

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
  const name = (value as object).constructor?.name;
  return name && name !== 'Object' ? `${name} ${String(value)}` : 'object';
}

/** Throws `ERR_RC_INVALID_ARGUMENT` naming the parameter, the expectation and the value. */
export function invalid(name: string, expected: string, received: unknown): never {
  throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `Expected ${expected} for ${name} but received ${describe(received)}`);
}

/** Validates an integer in [min, max]. */
export function expectInt(name: string, value: unknown, min = -Infinity, max = Infinity): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    const range = min === -Infinity ? (max === Infinity ? '' : ` at most ${max}`) : max === Infinity ? ` of at least ${min}` : ` between ${min} and ${max}`;
    invalid(name, `an integer${range}`, value);
  }
  return value;
}

/** Validates a finite number in [min, max]. */
export function expectNumber(name: string, value: unknown, min = -Infinity, max = Infinity): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < min || value > max) {
    const range = min === -Infinity ? (max === Infinity ? '' : ` at most ${max}`) : max === Infinity ? ` of at least ${min}` : ` between ${min} and ${max}`;
    invalid(name, `a finite number${range}`, value);
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
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `Unknown option '${key}' in ${name}; known options: ${known.join(', ')}`);
    }
  }
  return value as Partial<T>;
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
