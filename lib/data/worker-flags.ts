/**
 * The Node flags the data loader's worker threads start with.
 * @packageDocumentation
 */

/** Flags that choose or run the main program, followed by a value unless written `--flag=value`. */
const PROGRAM_FLAGS_WITH_VALUE = new Set([
  '-e',
  '--eval',
  '-p',
  '--print',
  '-pe',
  '-ep',
  '--input-type',
  '--watch-path',
]);

/** Flags that choose or run the main program, without a value. */
const PROGRAM_FLAGS = new Set(['-i', '--interactive', '-c', '--check', '--test', '--watch', '--watch-preserve-output']);

/**
 * The parent's Node flags less those that choose or run the main program (`--eval`, `--print`,
 * `--input-type`, `--check`, `--interactive`, `--test`, `--watch`): a worker started from a file
 * refuses them (`--input-type` gives `ERR_INPUT_TYPE_NOT_ALLOWED`) or has no use for them. The
 * others (`--import`, `--require`, `--conditions`, `--enable-source-maps`, ...) are kept, as a
 * worker inherits them by default.
 */
export function workerExecArgv(execArgv: readonly string[] = process.execArgv): string[] {
  const kept: string[] = [];
  for (let i = 0; i < execArgv.length; i++) {
    const arg = execArgv[i]!;
    const equals = arg.indexOf('=');
    const name = equals < 0 ? arg : arg.slice(0, equals);
    if (PROGRAM_FLAGS_WITH_VALUE.has(name)) {
      if (equals < 0) i++;
      continue;
    }
    if (!PROGRAM_FLAGS.has(name)) kept.push(arg);
  }
  return kept;
}
