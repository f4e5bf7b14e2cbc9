/**
 * The slot through which op call sites report to a running profiler. Each call site reads
 * {@link opRecorder} once and, when it is null (no profiler running), does nothing else.
 * @packageDocumentation
 */
import type { Module } from '../nn/module.js';

/** What a running profiler receives from op call sites. */
export interface OpRecorder {
  /**
   * An op begins: `op` is its type (`conv2d.forward`), `layer` the module that runs it (named by
   * its path in the profiled model) or a name for ops outside modules (`optimizer`, `loss`), and
   * `device` where it runs. Returns the token to pass to {@link OpRecorder.end}.
   */
  begin(op: string, layer: Module | string, device: string): number;
  /** The op of `token` has been called (on the CPU: has run; on CUDA: has been enqueued). */
  end(token: number): void;
}

/** The running profiler's recorder, or null when none runs. */
export let opRecorder: OpRecorder | null = null;

/** Installs (or, with null, removes) the recorder op call sites report to. @internal */
export function setOpRecorder(recorder: OpRecorder | null): void {
  opRecorder = recorder;
}
