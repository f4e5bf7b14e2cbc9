/**
 * Values a test expects to be there, checked: a Map lookup, a `find`, an optional result field, a
 * regular expression match. A missing one throws an Error that names it, so the test fails at that
 * point with a message rather than with a TypeError later.
 */

/** `value`, checked to be neither undefined nor null; `what` names it in the error. */
export function defined<T>(value: T, what: string): NonNullable<T> {
  if (value === undefined || value === null) throw new Error(`expected ${what}, got ${String(value)}`);
  return value;
}

/** `map.get(key)`, checked to be there (a state dict's entry, a file's tensor). */
export function lookup<K, V>(map: ReadonlyMap<K, V>, key: K): V {
  const value = map.get(key);
  if (value === undefined) throw new Error(`no entry ${String(key)}`);
  return value;
}
