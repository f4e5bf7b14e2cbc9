/**
 * Cancellation of long calls (`Trainer.fit`, `evaluate`, `predict`) through an `AbortSignal`, with
 * the error Node's own APIs reject with.
 * @packageDocumentation
 */
import { invalid } from '../errors.js';

/**
 * The error of a call stopped through its `AbortSignal`, as Node's (`name` 'AbortError', `code`
 * 'ABORT_ERR', the signal's `reason` as `cause`).
 */
export class AbortError extends Error {
  /** Node's code for an aborted operation. */
  readonly code = 'ABORT_ERR';
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'AbortError';
  }
}

/** Validates an optional `signal` option. */
export function checkSignal(name: string, signal: unknown): AbortSignal | null {
  if (signal === undefined) return null;
  if (!(signal instanceof AbortSignal)) invalid(name, 'an AbortSignal', signal);
  return signal;
}

/** Throws an {@link AbortError} for `what` when `signal` has been aborted. */
export function throwIfAborted(signal: AbortSignal | null, what: string): void {
  if (signal?.aborted) throw new AbortError(`${what} was aborted`, { cause: signal.reason });
}
