/**
 * A roofline model of one training step on a GPU, computed from the model's modules and shapes
 * (nothing runs): every kernel and library call of the plan, with its FLOPs, the bytes it must move
 * and its launches; each op's lower bound is `max(flops / peak, bytes / bandwidth)` (plus an
 * optional fixed cost per launch), and the step's bound is their sum. The FLOPs of every op are set
 * against the tensor-core peak, which is above what element-wise code reaches, so the bound stays a
 * lower bound. Three plans: the one the CUDA backend runs by default (lib/analysis/plan-current.ts),
 * the one it runs with a set of fused paths switched on (lib/analysis/plan-built.ts), and the fused
 * target planned on cuDNN's graph API (lib/analysis/plan-fused.ts).
 * @packageDocumentation
 */
import {
  ResnetError,
  expectBool,
  expectInt,
  expectNumber,
  expectOneOf,
  expectOptions,
  invalid,
  isArray,
} from '../errors.js';
import { FUSED_PATH_NAMES, fusedPaths, type FusedPath } from '../fused-paths.js';
import { Conv2d } from '../nn/layers.js';
import { Module } from '../nn/module.js';
import { GPU_NAMES, gpuPeak, type GpuName, type GpuPeak } from './gpu-peaks.js';
import { builtPlan, CONV_BN_BUILT, orderedPaths, type ConvBnBuilt } from './plan-built.js';
import { currentPlan } from './plan-current.js';
import { fusedPlan } from './plan-fused.js';
import { stepLayers } from './step-layers.js';
import { OP_TYPES, type OpType, type StepOp } from './step-ops.js';

/** The plans the model accounts for. */
export const ROOFLINE_PLANS = ['current', 'built', 'fused'] as const;

/**
 * A plan of {@link ROOFLINE_PLANS}: the default (unfused) kernels, what the backend executes with a
 * set of fused paths on (`built`), or the fused target on cuDNN's graph API.
 */
export type RooflinePlan = (typeof ROOFLINE_PLANS)[number];

/** Options of {@link stepRoofline}. */
export interface StepRooflineOptions {
  /** Images per step; default 256. */
  batchSize?: number;
  /** Image size: `224` or `[height, width]`; default 224. */
  inputSize?: number | readonly [number, number];
  /** Mixed precision of the activations: `'bf16'` (default) or `'fp16'`. */
  amp?: 'bf16' | 'fp16';
  /** The GPU whose peaks bound the step; default `'h200'`. */
  gpu?: GpuName;
  /** Which plan; default `'current'`. */
  plan?: RooflinePlan;
  /**
   * With plan `'built'`: the fused paths switched on (names of FUSED_PATH_NAMES); default those
   * `RESNET_CUDA_FUSED` names (lib/fused-paths.ts).
   */
  fused?: Iterable<FusedPath>;
  /** With plan `'built'` and `conv-bn` on: the parts of that path built; default {@link CONV_BN_BUILT}. */
  convBn?: Partial<ConvBnBuilt>;
  /** Whether a GradScaler checks the gradients; default true in fp16 (as the Trainer), false in bf16. */
  gradScaler?: boolean;
  /** A fixed cost per launch added to the bound, in microseconds; default 0 (the pure roofline). */
  launchOverheadUs?: number;
}

/** The totals of one op type (or of the whole step). */
export interface RooflineTotals {
  /** Floating-point operations. */
  flops: number;
  /** Bytes read from device memory. */
  bytesRead: number;
  /** Bytes written to device memory. */
  bytesWritten: number;
  /** Kernel launches. */
  launches: number;
  /** The lower bound of their time, seconds. */
  seconds: number;
}

/** One op with its bound. */
export interface BoundOp extends StepOp {
  /** `max(flops / peak, bytes / bandwidth) + launches * overhead`, seconds. */
  seconds: number;
  /** Whether memory traffic, not arithmetic, sets the bound. */
  memoryBound: boolean;
}

/** The result of {@link stepRoofline}. */
export class StepRoofline {
  /** The plan modelled. */
  readonly plan: RooflinePlan;
  /** For the `built` plan: the fused paths on (in FUSED_PATH_NAMES order); else null. */
  readonly fused: readonly FusedPath[] | null;
  /** For the `built` plan with `conv-bn` on: the parts of that path counted; else null. */
  readonly convBn: Readonly<ConvBnBuilt> | null;
  /** The GPU's key in the peaks table. */
  readonly gpu: GpuName;
  /** Its peaks. */
  readonly peak: Readonly<GpuPeak>;
  /** The activation precision. */
  readonly amp: 'bf16' | 'fp16';
  /** Images per step. */
  readonly batchSize: number;
  /** The seconds added per launch. */
  readonly launchOverheadSeconds: number;
  /** Every op of the step in execution order, with its bound. */
  readonly ops: readonly BoundOp[];
  /** The totals per op type, in the order of {@link OP_TYPES} (types with no op left out). */
  readonly byType: ReadonlyMap<OpType, RooflineTotals>;
  /** The totals of the step. */
  readonly total: RooflineTotals;

  /** @internal Built by {@link stepRoofline}. */
  constructor(
    plan: RooflinePlan,
    gpu: GpuName,
    amp: 'bf16' | 'fp16',
    batchSize: number,
    launchOverheadSeconds: number,
    ops: readonly StepOp[],
    built: { fused: readonly FusedPath[]; convBn: Readonly<ConvBnBuilt> } | null = null,
  ) {
    this.plan = plan;
    this.fused = built ? [...built.fused] : null;
    this.convBn = built?.fused.includes('conv-bn') ? { ...built.convBn } : null;
    this.gpu = gpu;
    this.peak = gpuPeak(gpu);
    this.amp = amp;
    this.batchSize = batchSize;
    this.launchOverheadSeconds = launchOverheadSeconds;
    const peakFlops = amp === 'bf16' ? this.peak.bf16Flops : this.peak.fp16Flops;
    this.ops = ops.map((o) => {
      const compute = o.flops / peakFlops;
      const memory = (o.bytesRead + o.bytesWritten) / this.peak.bandwidth;
      return {
        ...o,
        seconds: Math.max(compute, memory) + o.launches * launchOverheadSeconds,
        memoryBound: memory >= compute,
      };
    });
    const byType = new Map<OpType, RooflineTotals>();
    const total = zero();
    for (const type of OP_TYPES) {
      const rows = this.ops.filter((o) => o.type === type);
      if (rows.length === 0) continue;
      const t = zero();
      for (const o of rows) add(t, o);
      byType.set(type, t);
      add(total, t);
    }
    this.byType = byType;
    this.total = total;
  }

  /** Bytes moved (read and written) by the whole step. */
  get bytes(): number {
    return this.total.bytesRead + this.total.bytesWritten;
  }

  /** Bytes moved per image. */
  get bytesPerImage(): number {
    return this.bytes / this.batchSize;
  }

  /** The bound of the step time, seconds. */
  get seconds(): number {
    return this.total.seconds;
  }

  /** The bound of the throughput: images per second at the step's lower-bound time. */
  get imagesPerSecond(): number {
    return this.batchSize / this.total.seconds;
  }

  /** FLOPs of the convolutions' and GEMMs' forward (twice the multiply-accumulates `summary` counts). */
  get forwardMatmulFlops(): number {
    return this.#sum((o) => o.type === 'conv fwd' || (o.type === 'gemm' && o.kernel.includes('forward')));
  }

  #sum(pick: (o: BoundOp) => boolean): number {
    return this.ops.filter(pick).reduce((a, o) => a + o.flops, 0);
  }

  /** A table per op type (FLOPs, GB moved, launches, bound time, share) and the totals. */
  format(): string {
    const head = ['op type', 'GFLOP', 'GB read', 'GB written', 'launches', 'bound ms', 'share'];
    const rows: string[][] = [];
    const line = (name: string, t: RooflineTotals): string[] => [
      name,
      (t.flops / 1e9).toFixed(1),
      (t.bytesRead / 1e9).toFixed(2),
      (t.bytesWritten / 1e9).toFixed(2),
      String(t.launches),
      (t.seconds * 1e3).toFixed(3),
      `${((100 * t.seconds) / this.total.seconds).toFixed(1)}%`,
    ];
    for (const [type, t] of this.byType) rows.push(line(type, t));
    const widths = head.map((h, c) =>
      Math.max(h.length, ...rows.map((r) => r[c]!.length), line('total', this.total)[c]!.length),
    );
    const fmt = (r: readonly string[]) =>
      r.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join('  ');
    const rule = '-'.repeat(widths.reduce((a, b) => a + b + 2, -2));
    const overhead =
      this.launchOverheadSeconds > 0 ? `, ${(this.launchOverheadSeconds * 1e6).toFixed(1)} us per launch` : '';
    return [
      `${this.planLabel} plan, ${this.peak.name} (${(this.peak.bf16Flops / 1e12).toFixed(0)} TFLOP/s dense ${this.amp}, ${(this.peak.bandwidth / 1e12).toFixed(2)} TB/s${overhead}), batch ${this.batchSize}`,
      fmt(head),
      rule,
      ...rows.map(fmt),
      rule,
      fmt(line('total', this.total)),
      `bound: ${(this.seconds * 1e3).toFixed(2)} ms/step, ${this.imagesPerSecond.toFixed(0)} images/s; ${(this.bytesPerImage / 1e6).toFixed(1)} MB moved per image, ${this.total.launches} launches per step`,
      '',
    ].join('\n');
  }

  /**
   * The plan's name; for `built`, with its fused paths (`built (optim, conv-bn)`, `built (none)`)
   * and the `conv-bn` parts left out of {@link CONV_BN_BUILT}.
   */
  get planLabel(): string {
    if (!this.fused) return this.plan;
    const cb = this.convBn;
    const parts: string[] = [];
    if (cb) {
      for (const key of ['prologue', 'dgradDbn', 'wgradPrologue'] as const) {
        if (cb[key] !== CONV_BN_BUILT[key]) parts.push(`${cb[key] ? '' : 'no '}${key}`);
      }
      if (cb.shortcutSums !== CONV_BN_BUILT.shortcutSums) parts.push(`shortcut sums ${cb.shortcutSums}`);
    }
    const paths = this.fused.length > 0 ? this.fused.join(', ') : 'none';
    return `built (${paths}${parts.length > 0 ? `; conv-bn: ${parts.join(', ')}` : ''})`;
  }

  /** The plan, the GPU, the totals per type and of the step (for `--json`); the ops are left out. */
  toJSON(): Record<string, unknown> {
    return {
      plan: this.plan,
      ...(this.fused ? { fused: this.fused } : {}),
      ...(this.convBn ? { convBn: this.convBn } : {}),
      gpu: this.gpu,
      gpuName: this.peak.name,
      amp: this.amp,
      batchSize: this.batchSize,
      launchOverheadUs: this.launchOverheadSeconds * 1e6,
      byType: Object.fromEntries(this.byType),
      total: this.total,
      msPerStep: this.seconds * 1e3,
      imagesPerSecond: this.imagesPerSecond,
      bytesPerImage: this.bytesPerImage,
    };
  }
}

function zero(): RooflineTotals {
  return { flops: 0, bytesRead: 0, bytesWritten: 0, launches: 0, seconds: 0 };
}

function add(t: RooflineTotals, o: RooflineTotals): void {
  t.flops += o.flops;
  t.bytesRead += o.bytesRead;
  t.bytesWritten += o.bytesWritten;
  t.launches += o.launches;
  t.seconds += o.seconds;
}

/**
 * The roofline of one training step of `model` (forward, cross-entropy, backward, SGD with momentum,
 * gradient zeroing; the GradScaler's work in fp16) under a plan on a GPU: per op its FLOPs, bytes
 * and launches from the shapes and dtypes, and the lower bound of the step time and of images/s.
 * Analytic: the model may live on any device.
 *
 * @example
 * ```ts
 * const r = stepRoofline(new ResNet(50), { batchSize: 256, amp: 'bf16', gpu: 'h200', plan: 'fused' });
 * console.log(r.format(), r.imagesPerSecond);
 * ```
 */
export function stepRoofline(model: Module, options: StepRooflineOptions = {}): StepRoofline {
  const o = expectOptions<StepRooflineOptions>('stepRoofline options', options, [
    'batchSize',
    'inputSize',
    'amp',
    'gpu',
    'plan',
    'fused',
    'convBn',
    'gradScaler',
    'launchOverheadUs',
  ]);
  if (!(model instanceof Module)) invalid('model', 'a Module', model);
  const batch = expectInt('batchSize', o.batchSize ?? 256, 1);
  let height: number;
  let width: number;
  const size = o.inputSize ?? 224;
  if (typeof size === 'number') {
    height = width = expectInt('inputSize', size, 1);
  } else if (isArray(size) && size.length === 2) {
    height = expectInt('inputSize[0]', size[0], 1);
    width = expectInt('inputSize[1]', size[1], 1);
  } else {
    invalid('inputSize', 'an image size such as 224 or [height, width]', size);
  }
  const amp = expectOneOf('amp', o.amp ?? 'bf16', ['bf16', 'fp16'] as const);
  const gpu = expectOneOf('gpu', o.gpu ?? 'h200', GPU_NAMES);
  const plan = expectOneOf('plan', o.plan ?? 'current', ROOFLINE_PLANS);
  if (plan !== 'built' && (o.fused !== undefined || o.convBn !== undefined)) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `stepRoofline: the options fused and convBn go with plan 'built', not '${plan}'`,
    );
  }
  const gradScaler = expectBool('gradScaler', o.gradScaler ?? amp === 'fp16');
  const overhead = expectNumber('launchOverheadUs', o.launchOverheadUs ?? 0, 0) * 1e-6;
  let channels = 3;
  for (const [, m] of model.namedModules()) {
    if (m instanceof Conv2d) {
      channels = m.inChannels;
      break;
    }
  }
  const step = stepLayers(model, [batch, height, width, channels]);
  const planOptions = { activationBytes: 2, gradScaler };
  if (plan === 'built') {
    const fused = builtPaths(o.fused);
    const convBn = convBnBuilt(o.convBn);
    const ops = builtPlan(step, { ...planOptions, fused, convBn });
    return new StepRoofline(plan, gpu, amp, batch, overhead, ops, { fused: orderedPaths(fused), convBn });
  }
  const ops = plan === 'current' ? currentPlan(step, planOptions) : fusedPlan(step, planOptions);
  return new StepRoofline(plan, gpu, amp, batch, overhead, ops);
}

/** The `fused` option checked (default: the `RESNET_CUDA_FUSED` names). */
function builtPaths(fused: Iterable<FusedPath> | undefined): ReadonlySet<FusedPath> {
  if (fused === undefined) return fusedPaths();
  if (typeof fused === 'string' || typeof (fused as { [Symbol.iterator]?: unknown })[Symbol.iterator] !== 'function') {
    invalid('fused', `an array of fused path names (${FUSED_PATH_NAMES.join(', ')})`, fused);
  }
  const out = new Set<FusedPath>();
  let i = 0;
  for (const name of fused) out.add(expectOneOf(`fused[${i++}]`, name, FUSED_PATH_NAMES));
  return out;
}

/** The `convBn` option checked, over {@link CONV_BN_BUILT}. */
function convBnBuilt(convBn: Partial<ConvBnBuilt> | undefined): ConvBnBuilt {
  const o = expectOptions<ConvBnBuilt>('convBn', convBn ?? {}, [
    'prologue',
    'dgradDbn',
    'wgradPrologue',
    'shortcutSums',
  ]);
  return {
    prologue: expectBool('convBn.prologue', o.prologue ?? CONV_BN_BUILT.prologue),
    dgradDbn: expectBool('convBn.dgradDbn', o.dgradDbn ?? CONV_BN_BUILT.dgradDbn),
    wgradPrologue: expectBool('convBn.wgradPrologue', o.wgradPrologue ?? CONV_BN_BUILT.wgradPrologue),
    shortcutSums: expectOneOf('convBn.shortcutSums', o.shortcutSums ?? CONV_BN_BUILT.shortcutSums, [
      'consumed',
      'unused',
      'not-written',
    ] as const),
  };
}
