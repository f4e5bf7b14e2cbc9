/**
 * vitest's asymmetric matchers (`expect.stringContaining` and the others) are declared to return
 * `any`, so that one fits any field of an expected value; in an object literal that `any` is an
 * unchecked assignment. These return the same matchers typed as `unknown`, which every place that
 * takes a matcher accepts: a field of toMatchObject's or toEqual's expected value, toThrow's argument.
 */
import { expect } from 'vitest';

/** A string that contains `text`. */
export function stringContaining(text: string): unknown {
  return expect.stringContaining(text);
}

/** A string that `pattern` matches. */
export function stringMatching(pattern: RegExp): unknown {
  return expect.stringMatching(pattern);
}

/** An object that has `fields` (and possibly others). */
export function objectContaining(fields: Record<string, unknown>): unknown {
  return expect.objectContaining(fields);
}
