/**
 * Runs a snippet against the compiled package (`dist/lib/index.js`) in a child process, so that a
 * case which could crash the process (a segmentation fault, an abort, a floating-point exception)
 * is observed from outside instead of taking the test runner down with it.
 */
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const entry = pathToFileURL(join(import.meta.dirname, '..', '..', 'dist', 'lib', 'index.js')).href;

/** What the snippet did: returned a JSON-serialisable value, or threw an error. */
export type IsolatedOutcome =
  | { readonly ok: true; readonly value: unknown }
  | { readonly ok: false; readonly code: string | undefined; readonly name: string; readonly message: string };

/** How the child process ended, and the snippet's outcome when it ended normally. */
export interface IsolatedResult {
  /** The exit status, or `null` when a signal ended the process. */
  readonly status: number | null;
  /** The signal that ended the process (`SIGSEGV`, `SIGFPE`, `SIGABRT`...), or `null`. */
  readonly signal: NodeJS.Signals | null;
  /** `undefined` when the process died before reporting. */
  readonly outcome: IsolatedOutcome | undefined;
  readonly stderr: string;
}

/**
 * Runs `body`, the body of an async function of `rc` (the package's exports), in a fresh Node
 * process. Whatever the body returns is reported as `{ ok: true, value }`; an error it throws as
 * `{ ok: false, code, name, message }`.
 */
export function runIsolated(
  body: string,
  options: { timeoutMs?: number; env?: NodeJS.ProcessEnv } = {},
): IsolatedResult {
  const program = `
    import * as rc from ${JSON.stringify(entry)};
    const report = (o) => process.stdout.write('\\n@@outcome ' + JSON.stringify(o) + '\\n');
    try {
      const value = await (async (rc) => { ${body} })(rc);
      report({ ok: true, value: value === undefined ? null : value });
    } catch (e) {
      report({ ok: false, code: e?.code, name: String(e?.name), message: String(e?.message) });
    }
  `;
  const child = spawnSync(process.execPath, ['--input-type=module', '-e', program], {
    encoding: 'utf8',
    timeout: options.timeoutMs ?? 60_000,
    env: { ...process.env, ...options.env },
    maxBuffer: 16 * 1024 * 1024,
  });
  const line = child.stdout.split('\n').find((l) => l.startsWith('@@outcome '));
  const outcome = line === undefined ? undefined : (JSON.parse(line.slice('@@outcome '.length)) as IsolatedOutcome);
  return { status: child.status, signal: child.signal, outcome, stderr: child.stderr };
}

/** A one-line description of a result, for assertion messages. */
export function describeResult(result: IsolatedResult): string {
  if (result.signal !== null) return `killed by ${result.signal}: ${result.stderr.trim().slice(-400)}`;
  if (result.outcome === undefined) {
    return `exit ${result.status} without an outcome: ${result.stderr.trim().slice(-400)}`;
  }
  return JSON.stringify(result.outcome);
}
