/**
 * The command line's option tables and what is built from them: parsing (`node:util` parseArgs,
 * strict), typed values with ranges, `--config` files merged under the command line, the help
 * text, and the usage errors (exit code 2) that name the option at fault. Each command declares
 * its options once, in a {@link CommandSpec}; nothing else lists them.
 * @packageDocumentation
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { packageRoot } from '../binding.js';
import { defined } from '../errors.js';

/** Where the commands write: `process.stdout`/`process.stderr`, or a test's collectors. */
export interface CliStream {
  write(text: string): unknown;
  /** True for a terminal (progress lines redraw in place there). */
  isTTY?: boolean;
  /** Terminal width. */
  columns?: number;
}

/** The outside world of one command-line run; tests inject their own. */
export interface CliIO {
  stdout: CliStream;
  stderr: CliStream;
  /** Environment variables (`RC_DEBUG=1` prints stack traces). */
  env: Readonly<Record<string, string | undefined>>;
  /** Folder relative paths are resolved against. */
  cwd: string;
}

/** The process's own streams, environment and working folder. */
export function processIO(): CliIO {
  return { stdout: process.stdout, stderr: process.stderr, env: process.env, cwd: process.cwd() };
}

/**
 * A mistake in how the command was called: unknown or malformed options, values out of range,
 * options that contradict each other, files that do not exist. Reported in one line with a hint
 * and exit code 2, before any work starts.
 */
export class UsageError extends Error {
  /** A second line suggesting what to do; the command's `--help` pointer when absent. */
  readonly hint: string | undefined;
  constructor(message: string, hint?: string) {
    super(message);
    this.name = 'UsageError';
    this.hint = hint;
  }
}

/**
 * A failure while doing the work (a device that is not there, a file that cannot be decoded, a
 * checkpoint that does not fit the model), with a hint on what to do. Exit code 1.
 */
export class CliError extends Error {
  /** A second line suggesting what to do. */
  readonly hint: string | undefined;
  /** The error code of the failure, when it is one the package names (`ERR_RC_OUT_OF_MEMORY`). */
  readonly code: string | undefined;
  constructor(message: string, hint?: string, code?: string) {
    super(message);
    this.name = 'CliError';
    this.hint = hint;
    this.code = code;
  }
}

/**
 * The kinds of option values:
 * - `string`, `path` (resolved against the working folder), `choice` (one of `choices`);
 * - `int`, `number` (checked against `min`/`max`);
 * - `boolean` (a flag without a value; `true`/`false` in a config file);
 * - `ints`, `strings` (comma-separated on the command line, an array or a comma-separated string
 *   in a config file).
 */
export type OptionType = 'string' | 'path' | 'choice' | 'int' | 'number' | 'boolean' | 'ints' | 'strings';

/** A value an option may hold once parsed. */
export type OptionValue = string | number | boolean | number[] | string[];

/** One option of a command. */
export interface OptionSpec {
  /** Long name in kebab-case, without the dashes (`batch-size`); its value's key is the camelCase form. */
  name: string;
  /** One-letter short form (`b` for `-b`). */
  short?: string;
  /** Further long names that mean the same (`wd` for `weight-decay`). */
  aliases?: readonly string[];
  type: OptionType;
  /** The allowed values of a `choice`. */
  choices?: readonly string[];
  /** Smallest value of an `int`/`number` (or of each entry of `ints`). */
  min?: number;
  /** Largest value of an `int`/`number`. */
  max?: number;
  /** `min` itself is not allowed (e.g. a learning rate above 0). */
  exclusiveMin?: boolean;
  /** The value when the option is given neither on the command line nor in the config file. */
  default?: OptionValue;
  /** Shown in the help instead of `default`, for defaults that depend on other options. */
  defaultText?: string;
  /** The placeholder of the value in the help (`N`, `FILE`, `LR`). */
  valueName?: string;
  /** One or two sentences. */
  help: string;
  /** The heading the option is listed under in the help. */
  section?: string;
  /** For `path`: the path must exist and be a file (`file`) or a folder (`dir`). */
  mustExist?: 'file' | 'dir';
  /** The value taken when the flag is given without one (`--resume` alone means `latest`). */
  valueWhenBare?: string;
}

/** A positional argument of a command. */
export interface PositionalSpec {
  /** The placeholder, upper-case (`DATA`, `IMAGE`). */
  name: string;
  help: string;
  /** Any number of them (at least one when `required`). */
  variadic?: boolean;
  required?: boolean;
  /** The config-file key that may hold it (`data`); the command line wins. */
  configKey?: string;
}

/** A command: its names, help text, positionals and options. */
export interface CommandSpec {
  name: string;
  /** One line, for `resnet-cuda --help`. */
  summary: string;
  /** A paragraph or two under the usage line. */
  description: string;
  positionals: readonly PositionalSpec[];
  options: readonly OptionSpec[];
  /** Example command lines, shown at the end of the help. */
  examples?: readonly string[];
  /** Whether `--config FILE` is accepted; default true. */
  config?: boolean;
}

/** A command: its option table and what it does with the parsed options. */
export interface Command {
  spec: CommandSpec;
  /** Runs the command; resolves to its exit code. */
  run(parsed: ParsedCommand, io: CliIO): Promise<number>;
}

/** The package version, from its package.json. */
export function packageVersion(): string {
  const json = JSON.parse(readFileSync(join(packageRoot(), 'package.json'), 'utf8')) as { version: string };
  return json.version;
}

/** What {@link parseCommand} returns. */
export interface ParsedCommand {
  /** Every option's value by camelCase key (defaults included; absent when there is no default). */
  values: Record<string, OptionValue | undefined>;
  /** The camelCase keys set on the command line or in the config file (not by a default). */
  explicit: ReadonlySet<string>;
  /** The positional arguments: the command line's, else the config file's. */
  positionals: string[];
  /** The config file, resolved, when one was read. */
  configFile: string | undefined;
  /** The words after a `--` terminator, exactly as given (not resolved as paths); empty without one. */
  afterDoubleDash: string[];
  /** `--verbose`. */
  verbose: boolean;
}

/** The options every command takes, listed after its own. */
export function commonOptions(config: boolean): OptionSpec[] {
  return [
    ...(config
      ? [
          {
            name: 'config',
            type: 'path',
            mustExist: 'file',
            valueName: 'FILE',
            help: 'Read options from a JSON object whose keys are long option names (camelCase or kebab-case); options on the command line override it.',
            section: 'General',
          } satisfies OptionSpec,
        ]
      : []),
    {
      name: 'verbose',
      type: 'boolean',
      help: 'Print stack traces with errors (as does RC_DEBUG=1 in the environment).',
      section: 'General',
    },
    { name: 'help', short: 'h', type: 'boolean', help: 'Print this help and exit.', section: 'General' },
  ];
}

/** `batch-size` → `batchSize`. */
export function camelCase(name: string): string {
  return name.replace(/-([a-z0-9])/g, (_, c: string) => c.toUpperCase());
}

/** `batchSize` → `batch-size` (a kebab-case name is returned as it is). */
export function kebabCase(name: string): string {
  return name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
}

/** Edit distance with adjacent transpositions (optimal string alignment), for "did you mean" suggestions. */
function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) =>
    Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)),
  );
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let best = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) {
        best = Math.min(best, d[i - 2]![j - 2]! + 1);
      }
      d[i]![j] = best;
    }
  }
  return d[a.length]![b.length]!;
}

/** The closest of `candidates` to `word`, when it is close enough to be a likely typo. */
export function closest(word: string, candidates: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestDistance = Infinity;
  for (const c of candidates) {
    const d = editDistance(word, c);
    if (d < bestDistance) {
      best = c;
      bestDistance = d;
    }
  }
  return best !== undefined && bestDistance <= Math.max(1, Math.floor(word.length / 3)) ? best : undefined;
}

function allOptions(spec: CommandSpec): OptionSpec[] {
  return [...spec.options, ...commonOptions(spec.config ?? true)];
}

/** `--lr`, `-b, --batch-size`. */
function flagText(option: OptionSpec): string {
  return option.short ? `-${option.short}, --${option.name}` : `--${option.name}`;
}

function describeRange(option: OptionSpec): string {
  const kind = option.type === 'int' || option.type === 'ints' ? 'an integer' : 'a number';
  const { min, max } = option;
  if (min !== undefined && max !== undefined) return `${kind} from ${min} to ${max}`;
  if (min !== undefined) return option.exclusiveMin ? `${kind} above ${min}` : `${kind} of at least ${min}`;
  if (max !== undefined) return `${kind} of at most ${max}`;
  return kind;
}

function checkNumber(option: OptionSpec, value: number, where: string): number {
  const integer = option.type === 'int' || option.type === 'ints';
  // Integers past 2^53 are not exact (and no count, size or step number gets there).
  const range =
    integer && option.max === undefined && Number.isInteger(value) && !Number.isSafeInteger(value)
      ? { ...option, max: Number.MAX_SAFE_INTEGER }
      : option;
  const bad =
    !Number.isFinite(value) ||
    (integer && !Number.isInteger(value)) ||
    (range.min !== undefined && (range.exclusiveMin ? value <= range.min : value < range.min)) ||
    (range.max !== undefined && value > range.max);
  if (bad) throw new UsageError(`${where} expects ${describeRange(range)}, got ${JSON.stringify(value)}`);
  return value;
}

function parseNumberText(option: OptionSpec, text: string, where: string): number {
  const trimmed = text.trim();
  // Number('') is 0 and Number('0x10') is 16: accept only decimal notation; 1e400 is not finite.
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(trimmed) || !Number.isFinite(Number(trimmed))) {
    throw new UsageError(`${where} expects ${describeRange(option)}, got '${text}'`);
  }
  return checkNumber(option, Number(trimmed), where);
}

function checkChoice(option: OptionSpec, value: string, where: string): string {
  const choices = option.choices ?? [];
  if (!choices.includes(value)) {
    const guess = closest(value, choices);
    throw new UsageError(
      `${where} expects one of ${choices.join(', ')}, got '${value}'${guess ? ` (did you mean '${guess}'?)` : ''}`,
    );
  }
  return value;
}

/** Converts a command-line value (always text) to the option's type. */
function fromText(option: OptionSpec, text: string, cwd: string): OptionValue {
  const where = `--${option.name}`;
  switch (option.type) {
    case 'string':
      return text;
    case 'path':
      if (text.length === 0) throw new UsageError(`${where} expects a path, got an empty string`);
      return resolve(cwd, text);
    case 'choice':
      return checkChoice(option, text, where);
    case 'int':
    case 'number':
      return parseNumberText(option, text, where);
    case 'ints': {
      const parts = text
        .split(',')
        .map((p) => p.trim())
        .filter((p) => p.length > 0);
      if (parts.length === 0) {
        throw new UsageError(`${where} expects a comma-separated list of integers, got '${text}'`);
      }
      return parts.map((p) => parseNumberText(option, p, where));
    }
    case 'strings': {
      const parts = text
        .split(',')
        .map((p) => p.trim())
        .filter((p) => p.length > 0);
      if (parts.length === 0) throw new UsageError(`${where} expects a comma-separated list, got '${text}'`);
      return parts;
    }
    case 'boolean':
      return true;
  }
}

/** Converts a config-file value (any JSON) to the option's type. */
function fromJson(option: OptionSpec, value: unknown, key: string, file: string, configDir: string): OptionValue {
  const where = `'${key}' in ${file}`;
  const shown = JSON.stringify(value) ?? String(value);
  switch (option.type) {
    case 'boolean':
      if (typeof value !== 'boolean') throw new UsageError(`${where} expects true or false, got ${shown}`);
      return value;
    case 'int':
    case 'number':
      if (typeof value === 'string') return parseNumberText(option, value, where);
      if (typeof value !== 'number') throw new UsageError(`${where} expects ${describeRange(option)}, got ${shown}`);
      return checkNumber(option, value, where);
    case 'ints':
      if (typeof value === 'string') return fromText(option, value, configDir);
      if (typeof value === 'number') return [checkNumber(option, value, where)];
      if (!Array.isArray(value) || value.length === 0 || !value.every((v) => typeof v === 'number')) {
        throw new UsageError(`${where} expects a non-empty array of integers, got ${shown}`);
      }
      return value.map((v: number) => checkNumber(option, v, where));
    case 'strings':
      if (typeof value === 'string') return fromText(option, value, configDir);
      if (!Array.isArray(value) || value.length === 0 || !value.every((v) => typeof v === 'string' && v.length > 0)) {
        throw new UsageError(`${where} expects a non-empty array of strings, got ${shown}`);
      }
      return [...(value as string[])];
    case 'choice':
      if (typeof value !== 'string') {
        throw new UsageError(`${where} expects one of ${(option.choices ?? []).join(', ')}, got ${shown}`);
      }
      return checkChoice(option, value, where);
    case 'path':
      if (typeof value !== 'string' || value.length === 0) {
        throw new UsageError(`${where} expects a path, got ${shown}`);
      }
      // Relative paths in a config file are relative to the file, so that it works from anywhere.
      return resolve(configDir, value);
    case 'string':
      if (typeof value !== 'string') throw new UsageError(`${where} expects a string, got ${shown}`);
      return value;
  }
}

/** Checks that an existing file or folder is at `path`; `what` names it in the message. */
export function requirePath(path: string, kind: 'file' | 'dir', what: string, hint?: string): void {
  if (!existsSync(path)) throw new UsageError(`${what} '${path}' does not exist`, hint);
  const isDir = statSync(path).isDirectory();
  if (kind === 'dir' && !isDir) throw new UsageError(`${what} '${path}' is a file, not a folder`, hint);
  if (kind === 'file' && isDir) throw new UsageError(`${what} '${path}' is a folder, not a file`, hint);
}

/**
 * The flag of a parseArgs message as the user wrote it: parseArgs names an option that has a short
 * form as `'-b, --batch-size'`, whichever form was typed.
 */
function typedFlag(message: string, args: readonly string[]): string {
  const both = /'(-\w), (--[\w-]+)/.exec(message);
  if (both) return args.includes(both[1]!) ? both[1]! : both[2]!;
  return /'(--?[\w-]+)/.exec(message)?.[1] ?? 'an option';
}

/** Rewrites parseArgs's messages (several lines, generic) as one line naming the option. */
function parseArgsMessage(
  error: Error & { code?: string },
  options: readonly OptionSpec[],
  args: readonly string[],
): UsageError {
  const message = error.message;
  if (error.code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION') {
    const flag = /'([^']+)'/.exec(message)?.[1] ?? message;
    const names = options.flatMap((o) => [o.name, ...(o.aliases ?? [])]);
    const guess = flag.startsWith('--') ? closest(flag.slice(2).split('=')[0]!, names) : undefined;
    return new UsageError(`unknown option '${flag}'${guess ? ` (did you mean '--${guess}'?)` : ''}`);
  }
  if (error.code === 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE') {
    const flag = typedFlag(message, args);
    if (message.includes('argument missing')) return new UsageError(`${flag} needs a value`);
    if (message.includes('does not take an argument')) return new UsageError(`${flag} takes no value`);
    if (message.includes('ambiguous')) {
      return new UsageError(`${flag} needs a value; to pass one that starts with '-', write ${flag}=VALUE`);
    }
  }
  if (error.code === 'ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL') {
    const arg = /'([^']+)'/.exec(message)?.[1];
    return new UsageError(`unexpected argument${arg ? ` '${arg}'` : ''}`);
  }
  return new UsageError(message.split('\n')[0]!);
}

/**
 * Parses `argv` (the words after the command's name) for `spec`: the command line, then the
 * config file under it, then the defaults. Returns `'help'` when `-h`/`--help` is among the
 * arguments (whatever else is wrong with them).
 *
 * @throws {@link UsageError} for unknown options, values of the wrong type or out of range, a
 *   config file that is not a JSON object or has unknown keys, too many or too few positionals,
 *   and `path` options with `mustExist` that do not exist.
 */
export function parseCommand(spec: CommandSpec, argv: readonly string[], cwd: string): ParsedCommand | 'help' {
  const options = allOptions(spec);
  // A help request wins over any other problem with the arguments (up to a `--` terminator).
  const end = argv.indexOf('--');
  if ((end === -1 ? argv : argv.slice(0, end)).some((a) => a === '--help' || a === '-h')) return 'help';

  // Flags that may come without a value (`--resume`): alone at the end, or before another option.
  // A short option with `=` (`-b=VALUE`) means what its long form does (`--batch-size=VALUE`), as
  // the hint for values that start with '-' says.
  const args = argv.map((arg, i) => {
    const option = options.find(
      (o) =>
        o.valueWhenBare !== undefined && (arg === `--${o.name}` || (o.aliases ?? []).some((a) => arg === `--${a}`)),
    );
    const next = argv[i + 1];
    if (option && (next === undefined || next.startsWith('-'))) return `--${option.name}=${option.valueWhenBare}`;
    const short = end !== -1 && i > end ? undefined : /^-(\w)=/.exec(arg)?.[1];
    const named = short === undefined ? undefined : options.find((o) => o.short === short);
    return named ? `--${named.name}${arg.slice(2)}` : arg;
  });

  const table: Record<string, { type: 'string' | 'boolean'; short?: string }> = {};
  const canonical = new Map<string, OptionSpec>();
  for (const option of options) {
    const type = option.type === 'boolean' ? 'boolean' : 'string';
    table[option.name] = option.short ? { type, short: option.short } : { type };
    canonical.set(option.name, option);
    for (const alias of option.aliases ?? []) {
      table[alias] = { type };
      canonical.set(alias, option);
    }
  }
  let parsed: {
    values: Record<string, string | boolean | undefined>;
    tokens?: { kind: string; name?: string; index: number }[];
    positionals: string[];
  };
  try {
    parsed = parseArgs({ args, options: table, strict: true, allowPositionals: true, tokens: true });
  } catch (error) {
    throw parseArgsMessage(error as Error & { code?: string }, options, args);
  }

  // Command-line values, converted; with an alias and its option both given, the later one wins.
  const fromCli = new Map<string, OptionValue>();
  for (const token of parsed.tokens ?? []) {
    if (token.kind !== 'option' || token.name === undefined) continue;
    // parseArgs (strict) has rejected unknown options.
    const option = defined(canonical.get(token.name), `the option --${token.name}`);
    const raw = (token as { value?: string }).value;
    fromCli.set(option.name, option.type === 'boolean' ? true : fromText(option, raw ?? '', cwd));
  }

  // The config file.
  const fromConfig = new Map<string, OptionValue>();
  let configPositionals: string[] | undefined;
  const configFile = fromCli.get('config') as string | undefined;
  if (configFile !== undefined) {
    requirePath(configFile, 'file', '--config file');
    let json: unknown;
    try {
      json = JSON.parse(readFileSync(configFile, 'utf8'));
    } catch (error) {
      throw new UsageError(`--config file '${configFile}' is not valid JSON: ${(error as Error).message}`);
    }
    if (json === null || typeof json !== 'object' || Array.isArray(json)) {
      throw new UsageError(
        `--config file '${configFile}' must hold a JSON object of options, such as {"epochs": 10, "lr": 0.1}`,
      );
    }
    const configDir = resolve(configFile, '..');
    const configurable = options.filter((o) => o.name !== 'config' && o.name !== 'help');
    const positionalKeys = spec.positionals.filter(
      (p): p is PositionalSpec & { configKey: string } => p.configKey !== undefined,
    );
    for (const [key, value] of Object.entries(json)) {
      const name = kebabCase(key);
      const positional = positionalKeys.find((p) => p.configKey === name);
      if (positional) {
        const list = Array.isArray(value) ? value : [value];
        if (!list.every((v) => typeof v === 'string' && v.length > 0)) {
          throw new UsageError(
            `'${key}' in ${configFile} expects a path${positional.variadic ? ' or an array of paths' : ''}, got ${JSON.stringify(value)}`,
          );
        }
        configPositionals = (list as string[]).map((v) => resolve(configDir, v));
        continue;
      }
      const option = configurable.find((o) => o.name === name || (o.aliases ?? []).includes(name));
      if (!option) {
        const known = [...configurable.map((o) => o.name), ...positionalKeys.map((p) => p.configKey)];
        const guess = closest(name, known);
        throw new UsageError(
          `unknown key '${key}' in --config file '${configFile}'${guess ? ` (did you mean '${camelCase(guess)}'?)` : ''}`,
          `The keys are the long option names of 'resnet-cuda ${spec.name} --help', in camelCase or kebab-case.`,
        );
      }
      fromConfig.set(option.name, fromJson(option, value, key, configFile, configDir));
    }
  }

  const values: Record<string, OptionValue | undefined> = {};
  const explicit = new Set<string>();
  for (const option of options) {
    if (option.name === 'help' || option.name === 'config') continue;
    const key = camelCase(option.name);
    const value = fromCli.get(option.name) ?? fromConfig.get(option.name);
    if (value !== undefined) explicit.add(key);
    values[key] = value ?? option.default;
    if (value !== undefined && option.type === 'path' && option.mustExist) {
      requirePath(value as string, option.mustExist, `--${option.name}`);
    }
  }

  // Positionals: the command line's, else the config file's.
  const positionals =
    parsed.positionals.length > 0 ? parsed.positionals.map((p) => resolve(cwd, p)) : (configPositionals ?? []);
  const variadic = spec.positionals.some((p) => p.variadic);
  if (!variadic && positionals.length > spec.positionals.length) {
    const extra = positionals[spec.positionals.length]!;
    throw new UsageError(
      spec.positionals.length === 0
        ? `'${spec.name}' takes no arguments, got '${parsed.positionals[0] ?? extra}'`
        : `too many arguments: '${parsed.positionals[spec.positionals.length] ?? extra}'`,
    );
  }
  const required = spec.positionals.filter((p) => p.required);
  if (positionals.length < required.length) throw new UsageError(`missing ${required[positionals.length]!.name}`);

  const afterDoubleDash = end === -1 ? [] : argv.slice(end + 1);
  return { values, explicit, positionals, configFile, afterDoubleDash, verbose: values.verbose === true };
}

/** Wraps `text` to `width` columns, indenting continuation lines by `indent` spaces. */
function wrap(text: string, width: number, indent: number): string {
  const words = text.split(/\s+/).filter((w) => w.length > 0);
  const lines: string[] = [];
  let line = '';
  for (const word of words) {
    if (line.length > 0 && indent + line.length + 1 + word.length > width) {
      lines.push(line);
      line = word;
    } else {
      line = line.length > 0 ? `${line} ${word}` : word;
    }
  }
  if (line.length > 0) lines.push(line);
  return lines.join(`\n${' '.repeat(indent)}`);
}

function formatDefault(option: OptionSpec): string | undefined {
  if (option.defaultText !== undefined) return option.defaultText;
  const d = option.default;
  if (d === undefined || d === false) return undefined;
  if (Array.isArray(d)) return d.join(',');
  return String(d);
}

const HELP_WIDTH = 100;
const FLAG_COLUMN = 34;

/** The full help of a command, generated from its table. */
export function formatHelp(spec: CommandSpec): string {
  const usageArgs = spec.positionals
    .map((p) => {
      const name = p.variadic ? `${p.name}...` : p.name;
      return p.required ? name : `[${name}]`;
    })
    .join(' ');
  let out = `Usage: resnet-cuda ${spec.name} [options]${usageArgs ? ` ${usageArgs}` : ''}\n\n`;
  for (const paragraph of spec.description.split('\n\n')) out += `${wrap(paragraph, HELP_WIDTH, 0)}\n\n`;
  const row = (left: string, text: string): string => {
    const pad = left.length + 2 <= FLAG_COLUMN ? left.padEnd(FLAG_COLUMN) : `${left}\n${' '.repeat(FLAG_COLUMN)}`;
    return `${pad}${wrap(text, HELP_WIDTH, FLAG_COLUMN)}\n`;
  };
  if (spec.positionals.length > 0) {
    out += 'Arguments:\n';
    for (const p of spec.positionals) out += row(`  ${p.name}`, p.help);
    out += '\n';
  }
  const sections = new Map<string, OptionSpec[]>();
  for (const option of allOptions(spec)) {
    const section = option.section ?? 'Options';
    sections.set(section, [...(sections.get(section) ?? []), option]);
  }
  for (const [section, list] of sections) {
    out += `${section}:\n`;
    for (const option of list) {
      const value =
        option.type === 'boolean'
          ? ''
          : ` ${option.valueName ?? (option.type === 'choice' ? 'NAME' : option.type === 'path' ? 'PATH' : 'N')}`;
      const bare = option.valueWhenBare !== undefined ? `${value.slice(0, 1)}[${value.slice(1)}]` : value;
      let text = option.help;
      if (option.choices) text += ` One of: ${option.choices.join(', ')}.`;
      if (option.aliases?.length) text += ` Also --${option.aliases.join(', --')}.`;
      const shownDefault = formatDefault(option);
      if (shownDefault !== undefined) text += ` (default: ${shownDefault})`;
      out += row(`  ${flagText(option)}${bare}`, text);
    }
    out += '\n';
  }
  if (spec.examples?.length) {
    out += 'Examples:\n';
    for (const example of spec.examples) out += `  ${example}\n`;
    out += '\n';
  }
  return out.replace(/\n+$/, '\n');
}
