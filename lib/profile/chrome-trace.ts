/**
 * A recording in Chrome's Trace Event Format (the JSON object form, with "X" complete events in
 * microseconds; https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU),
 * which Perfetto (https://ui.perfetto.dev) and chrome://tracing open.
 * @packageDocumentation
 */
import { renameSync, unlinkSync, writeFileSync } from 'node:fs';
import { invalid } from '../errors.js';
import type { ProfileResult } from './profiler.js';

/** One event of the trace. */
export interface ChromeTraceEvent {
  name: string;
  /** The category: `step`, `op` (host side), `device` (an op's time on a CUDA device). */
  cat?: string;
  /** `X`: a complete event (`ts` and `dur`); `M`: metadata (process and thread names). */
  ph: 'X' | 'M';
  /** Start, in microseconds since the profiler started. */
  ts?: number;
  /** Duration in microseconds. */
  dur?: number;
  pid: number;
  tid: number;
  args?: Record<string, string | number>;
}

/** The trace file's object. */
export interface ChromeTrace {
  traceEvents: ChromeTraceEvent[];
  displayTimeUnit: 'ms';
}

const PID = 1;
const HOST_TID = 1;

/** Microseconds, rounded to nanoseconds: the format's unit, without float noise in the file. */
function micros(ms: number): number {
  return Math.round(ms * 1e6) / 1e3;
}

/**
 * The trace of a recording: one process with a host thread (the steps, and each op's call) and a
 * thread per CUDA device (each op's time on the device). On the CPU the host thread's op events
 * are the ops' times.
 */
export function chromeTrace(result: ProfileResult): ChromeTrace {
  const cudaDevices = result.devices.filter((d) => d !== 'cpu');
  const deviceTid = new Map(cudaDevices.map((d, i) => [d, HOST_TID + 1 + i]));
  const events: ChromeTraceEvent[] = [
    { name: 'process_name', ph: 'M', pid: PID, tid: 0, args: { name: 'resnet-cuda' } },
    { name: 'thread_name', ph: 'M', pid: PID, tid: HOST_TID, args: { name: 'host' } },
  ];
  for (const [device, tid] of deviceTid) {
    events.push({ name: 'thread_name', ph: 'M', pid: PID, tid, args: { name: `${device} stream` } });
  }
  for (const s of result.steps) {
    events.push({
      name: `ProfilerStep#${s.step}`,
      cat: 'step',
      ph: 'X',
      ts: micros(s.hostStart),
      dur: micros(s.hostEnd - s.hostStart),
      pid: PID,
      tid: HOST_TID,
      args: { step: s.step },
    });
  }
  for (const op of result.ops) {
    const args = { layer: op.layer, device: op.device, step: op.step };
    events.push({
      name: op.op,
      cat: 'op',
      ph: 'X',
      ts: micros(op.hostStart),
      dur: micros(op.hostEnd - op.hostStart),
      pid: PID,
      tid: HOST_TID,
      args,
    });
    const tid = deviceTid.get(op.device);
    if (tid !== undefined) {
      events.push({
        name: op.op,
        cat: 'device',
        ph: 'X',
        ts: micros(op.start),
        dur: micros(op.duration),
        pid: PID,
        tid,
        args,
      });
    }
  }
  return { traceEvents: events, displayTimeUnit: 'ms' };
}

/** Writes `trace` to `path` as JSON, through a temporary file renamed into place. */
export function writeChromeTrace(path: string, trace: ChromeTrace): void {
  if (typeof path !== 'string' || path === '') invalid('path', 'a file path for the trace', path);
  const temporary = `${path}.${process.pid}.tmp`;
  try {
    writeFileSync(temporary, JSON.stringify(trace));
    renameSync(temporary, path);
  } catch (error) {
    try {
      unlinkSync(temporary);
    } catch {
      // Nothing was written.
    }
    throw error;
  }
}
