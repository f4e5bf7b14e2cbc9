/**
 * A profile's totals by op type and by layer, and the table `Profiler.table()` prints.
 * @packageDocumentation
 */
import { expectInt, expectOptions } from '../errors.js';
import type { ProfileResult } from './profiler.js';

/** The calls of one op type, or of one layer. */
export interface ProfileRow {
  /** The op type (`conv2d.forward`) or the layer (`layer1.0.conv1`). */
  name: string;
  calls: number;
  /** Summed op time. */
  totalMs: number;
  /** `totalMs / calls`. */
  meanMs: number;
  /** `totalMs` as a percentage of the summed step time. */
  percentOfStep: number;
}

/** What {@link summarizeProfile} computes. */
export interface ProfileSummary {
  /** Profiled steps. */
  steps: number;
  /** The devices ops ran on. */
  devices: string[];
  /** Summed step time (on the device on CUDA, on the host on the CPU). */
  stepMs: number;
  /** Summed op time: what the ops account for of `stepMs`. */
  opMs: number;
  /** By op type, longest first. */
  byOp: ProfileRow[];
  /** By layer, longest first. */
  byLayer: ProfileRow[];
}

/** Options of the table. */
export interface ProfileTableOptions {
  /** Layers listed; default 10. */
  topLayers?: number;
}

function rows(keyed: Map<string, { calls: number; totalMs: number }>, stepMs: number): ProfileRow[] {
  return [...keyed]
    .map(([name, { calls, totalMs }]) => ({
      name,
      calls,
      totalMs,
      meanMs: totalMs / calls,
      percentOfStep: stepMs > 0 ? (100 * totalMs) / stepMs : 0,
    }))
    .sort((a, b) => b.totalMs - a.totalMs || a.name.localeCompare(b.name));
}

function add(keyed: Map<string, { calls: number; totalMs: number }>, key: string, ms: number): void {
  const row = keyed.get(key);
  if (row) {
    row.calls++;
    row.totalMs += ms;
  } else keyed.set(key, { calls: 1, totalMs: ms });
}

/** Totals of a recording by op type and by layer. */
export function summarizeProfile(result: ProfileResult): ProfileSummary {
  const stepMs = result.steps.reduce((sum, s) => sum + s.duration, 0);
  const byOp = new Map<string, { calls: number; totalMs: number }>();
  const byLayer = new Map<string, { calls: number; totalMs: number }>();
  let opMs = 0;
  for (const op of result.ops) {
    add(byOp, op.op, op.duration);
    add(byLayer, op.layer, op.duration);
    opMs += op.duration;
  }
  return {
    steps: result.steps.length,
    devices: result.devices,
    stepMs,
    opMs,
    byOp: rows(byOp, stepMs),
    byLayer: rows(byLayer, stepMs),
  };
}

function table(title: string, list: readonly ProfileRow[], nameWidth: number): string[] {
  const lines = [
    `${title.padEnd(nameWidth)}  ${'calls'.padStart(6)}  ${'total ms'.padStart(10)}  ${'mean ms'.padStart(9)}  ${'% of step'.padStart(9)}`,
  ];
  for (const r of list) {
    lines.push(
      `${r.name.padEnd(nameWidth)}  ${String(r.calls).padStart(6)}  ${r.totalMs.toFixed(3).padStart(10)}  ${r.meanMs.toFixed(3).padStart(9)}  ${r.percentOfStep.toFixed(1).padStart(9)}`,
    );
  }
  return lines;
}

/** The summary as text: a header, the op types, the other time, then the longest layers. */
export function formatProfileTable(summary: ProfileSummary, options: ProfileTableOptions = {}): string {
  const o = expectOptions<ProfileTableOptions>('table options', options, ['topLayers']);
  const top = expectInt('topLayers', o.topLayers ?? 10, 0);
  const layers = summary.byLayer.slice(0, top);
  const width = Math.max(24, ...summary.byOp.map((r) => r.name.length), ...layers.map((r) => r.name.length));
  const perStep = summary.steps > 0 ? summary.stepMs / summary.steps : 0;
  const where = summary.devices.some((d) => d !== 'cpu') ? 'device time' : 'host time';
  const other = summary.stepMs - summary.opMs;
  const lines = [
    `profile: ${summary.steps} step${summary.steps === 1 ? '' : 's'} on ${summary.devices.join(', ') || 'no device'}, ${perStep.toFixed(3)} ms per step (${where}); ops account for ${summary.stepMs > 0 ? ((100 * summary.opMs) / summary.stepMs).toFixed(1) : '0.0'}%`,
    '',
    ...table('op', summary.byOp, width),
    `${'(between ops)'.padEnd(width)}  ${''.padStart(6)}  ${other.toFixed(3).padStart(10)}  ${''.padStart(9)}  ${(summary.stepMs > 0 ? (100 * other) / summary.stepMs : 0).toFixed(1).padStart(9)}`,
  ];
  if (layers.length > 0) lines.push('', ...table(`top ${layers.length} layers`, layers, width));
  return `${lines.join('\n')}\n`;
}
