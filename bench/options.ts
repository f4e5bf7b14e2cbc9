/**
 * Command-line handling shared by the benchmark scripts: `--help` prints the script's usage, and a
 * bad option or value ends the run with a one-line message and exit status 2, not a stack trace.
 */

/** Prints `message` and a pointer to `--help` on stderr, then exits with status 2. */
export function usageError(message: string): never {
  process.stderr.write(`${message}\nRun with --help for the options.\n`);
  process.exit(2);
}

/**
 * The values of `parse()` (a `node:util` `parseArgs` call that declares `help`): prints `usage` and
 * exits on `--help`, and turns parseArgs' errors (an unknown option, a missing value) into
 * {@link usageError}.
 */
export function parseOptions<V extends { help?: boolean | undefined }>(parse: () => { values: V }, usage: string): V {
  let values: V;
  try {
    values = parse().values;
  } catch (error) {
    usageError(error instanceof Error ? error.message : String(error));
  }
  if (values.help === true) {
    process.stdout.write(usage);
    process.exit(0);
  }
  return values;
}

/** `text` as a number of at least `min`, or a {@link usageError} naming the option `name`. */
export function numberOption(name: string, text: string, min: number): number {
  const value = Number(text);
  if (text.trim() === '' || !Number.isFinite(value) || value < min) {
    usageError(`--${name} expects a number >= ${min}, got '${text}'`);
  }
  return value;
}

/** `text`, a comma-separated list, as integers of at least `min` each (see {@link integerOption}). */
export function integerListOption(name: string, text: string, min: number): number[] {
  return text.split(',').map((item) => integerOption(name, item, min));
}

/** `text` as an integer of at least `min`, or a {@link usageError} naming the option `name`. */
export function integerOption(name: string, text: string, min: number): number {
  const value = Number(text);
  if (text.trim() === '' || !Number.isInteger(value) || value < min) {
    usageError(`--${name} expects an integer >= ${min}, got '${text}'`);
  }
  return value;
}
