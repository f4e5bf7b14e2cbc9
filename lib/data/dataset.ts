/**
 * What the datasets share: their errors (`ERR_RC_DATASET` for a dataset that cannot be built or
 * used, `ERR_RC_CORRUPT_FILE` for a file whose contents are wrong), index and spec validation, the
 * per-index seed derivation of the generated datasets, and the code-point ordering torchvision
 * sorts class folders and files with.
 * @packageDocumentation
 */
import { randomInt } from 'node:crypto';
import { ResnetError, describe, expectInt, invalid } from '../errors.js';
import type { Dataset, DatasetSpec } from './types.js';

/** An `ERR_RC_DATASET` error: a dataset that cannot be built (no classes, no files, bad spec...). */
export function datasetError(message: string): ResnetError {
  return new ResnetError('ERR_RC_DATASET', message);
}

/**
 * An `ERR_RC_CORRUPT_FILE` error naming the file and what is wrong with it (`problem` is a sentence
 * fragment such as "is truncated: expected 7840016 bytes but it has 7840000").
 */
export function corruptFileError(path: string, problem: string): ResnetError {
  return new ResnetError('ERR_RC_CORRUPT_FILE', `File '${path}' ${problem}`);
}

/**
 * Validates a sample index against a dataset length and returns it; the error
 * (`ERR_RC_INVALID_ARGUMENT`) names the parameter, the valid range and the value received.
 */
export function checkIndex(index: unknown, length: number, name = 'index'): number {
  if (length === 0) {
    // "between 0 and -1" would read as a bug in the message; say what is actually wrong.
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `Expected no ${name} (the dataset is empty) but received ${describe(index)}`,
    );
  }
  return expectInt(name, index, 0, length - 1);
}

/**
 * `compute()`'s result as a promise and its throw as a rejection, as an `async` function gives:
 * the `get` of a dataset whose samples are at hand without waiting.
 */
export function promiseOf<T>(compute: () => T | PromiseLike<T>): Promise<T> {
  return new Promise((resolve) => {
    resolve(compute());
  });
}

/** Validates that `value` implements {@link Dataset} (duck-typed, as any object may). */
export function expectDataset(name: string, value: unknown): Dataset {
  const d = value as Partial<Dataset> | null;
  if (
    d === null ||
    typeof d !== 'object' ||
    typeof d.length !== 'number' ||
    !Number.isInteger(d.length) ||
    d.length < 0 ||
    !Array.isArray(d.classes) ||
    typeof d.get !== 'function' ||
    typeof d.label !== 'function' ||
    typeof d.spec !== 'function'
  ) {
    invalid(name, 'a dataset (length, classes, label(i), get(i), spec())', value);
  }
  return d as Dataset;
}

/** Validates a spec object and its `kind`, for the `fromSpec` factories. */
export function expectSpec(value: unknown, kind: string): DatasetSpec {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    invalid('spec', `a ${kind} dataset spec object`, value);
  }
  const spec = value as DatasetSpec;
  if (spec.kind !== kind) invalid('spec.kind', `'${kind}'`, spec.kind);
  return spec;
}

/** Validates an array (or typed array) of integers in [min, max] and returns it as an Int32Array. */
export function expectIntArray(name: string, value: unknown, min: number, max: number): Int32Array {
  if (!Array.isArray(value) && !(value instanceof Int32Array)) invalid(name, 'an array of integers', value);
  const out = new Int32Array(value.length);
  for (let i = 0; i < value.length; i++) {
    const v: unknown = value[i];
    if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
      // Checked by hand rather than through expectInt per element: a million-entry label list
      // would otherwise build a million parameter names.
      expectInt(`${name}[${i}]`, v, min, max);
    }
    out[i] = v as number;
  }
  return out;
}

/** Validates an array of strings (optionally non-empty and unique). */
export function expectStrings(
  name: string,
  value: unknown,
  options: { nonEmpty?: boolean; unique?: boolean } = {},
): string[] {
  if (!Array.isArray(value) || (options.nonEmpty && value.length === 0)) {
    invalid(name, options.nonEmpty ? 'a non-empty array of strings' : 'an array of strings', value);
  }
  value.forEach((v, i) => {
    if (typeof v !== 'string') invalid(`${name}[${i}]`, 'a string', v);
  });
  if (options.unique) {
    const seen = new Set<string>();
    for (const v of value as string[]) {
      if (seen.has(v)) {
        throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `Expected unique names for ${name} but '${v}' appears twice`);
      }
      seen.add(v);
    }
  }
  return [...(value as string[])];
}

/**
 * Resolves a `classes` option given as a count or as names: a count `n` gives the names
 * `'0'` … `String(n - 1)`.
 */
export function resolveClassNames(name: string, value: unknown, fallback: readonly string[]): string[] {
  if (value === undefined) return [...fallback];
  if (typeof value === 'number') return numberedClasses(expectInt(name, value, 1));
  return expectStrings(name, value, { nonEmpty: true, unique: true });
}

/** Class names `'0'` … `String(count - 1)`. */
export function numberedClasses(count: number): string[] {
  return Array.from({ length: count }, (_, i) => String(i));
}

/** Validates an optional seed, or draws one (recorded in the spec so workers agree). */
export function resolveSeed(name: string, seed: unknown): number {
  return seed === undefined ? randomInt(0, 2 ** 31) : expectInt(name, seed, -(2 ** 31), 2 ** 32 - 1);
}

function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/**
 * A 32-bit seed for sample `index` of a generated dataset: the same `(seed, index, stream)` gives
 * the same seed in any thread, and distinct indices give distinct seeds (murmur3's finaliser is a
 * bijection), so each sample is reproducible without generating the ones before it.
 */
export function indexSeed(seed: number, index: number, stream = 0): number {
  return fmix32(fmix32((seed ^ Math.imul(stream + 1, 0x9e3779b9)) >>> 0) ^ (index >>> 0));
}

/**
 * Compares strings by Unicode code point, as Python's `sorted` does (JavaScript's default sort
 * compares UTF-16 code units, which orders characters beyond U+FFFF before U+E000-U+FFFF).
 * Uppercase sorts before lowercase: `'B' < 'a'`, unlike a locale-aware comparison.
 */
export function compareCodePoints(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x === y) continue;
    // Only when both are in the surrogate/private-use range can code-unit order differ from
    // code-point order; compare the full code points there.
    if (x >= 0xd800 && y >= 0xd800) return (a.codePointAt(i) ?? 0) - (b.codePointAt(i) ?? 0);
    return x - y;
  }
  return a.length - b.length;
}

/** Runs `fn` over `items` with at most `limit` calls in flight; results keep the input order. */
export async function mapLimit<T, R>(
  items: readonly T[],
  limit: number,
  fn: (item: T, index: number) => Promise<R>,
): Promise<R[]> {
  const results = new Array<R>(items.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const i = next++;
      results[i] = await fn(items[i]!, i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
}
