/**
 * A model summary in the manner of torchinfo: per layer its output shape, parameters (trainable
 * and frozen), multiply-accumulates and activation memory for an input size and dtype, and the
 * totals. Shapes are propagated analytically (each layer's output shape from its input shape), so
 * nothing runs on a device: a summary of ResNet-152 at 224 px is instant and needs no memory.
 * @packageDocumentation
 */
import { ResnetError, expectInt, expectOneOf, expectOptions, invalid, isArray } from '../errors.js';
import { Chain, Residual } from './containers.js';
import { AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU } from './layers.js';
import type { Module } from './module.js';

/** The activation dtypes a summary sizes memory for. */
export type SummaryDType = 'f32' | 'bf16' | 'f16';

/** Options of {@link summary}. */
export interface SummaryOptions {
  /** The image size: `224` for 224x224, or `[height, width]`. */
  inputSize: number | readonly [number, number];
  /** Images per batch; default 1 (as torchinfo's usual `(1, 3, H, W)`). Activations and MACs scale with it. */
  batchSize?: number;
  /** The activation dtype (`'bf16'` for mixed precision); default `'f32'`. Parameters are always f32. */
  dtype?: SummaryDType;
  /** Input channels; default the first convolution's `inChannels` (3 for a ResNet). */
  channels?: number;
}

/** One module of the summary. Containers' figures are the sums over their subtree. */
export interface SummaryRow {
  /** The dotted path (`layer1.0.conv1`); `''` for the model itself. */
  name: string;
  /** The class name (`Conv2d`, `Bottleneck`...). */
  type: string;
  /** Nesting depth: 0 for the model, 1 for its children... */
  depth: number;
  /** Whether the module has no children. */
  leaf: boolean;
  /** The output shape, NHWC (`[N, H, W, C]`) or `[N, features]`. */
  outputShape: number[];
  /** Parameters of the subtree. */
  params: number;
  /** Those of them with `requiresGrad`. */
  trainableParams: number;
  /** Multiply-accumulates of the subtree's convolutions and linear layers for one forward. */
  macs: number;
  /** Bytes of the outputs the subtree's layers allocate for one forward (Flatten's is a view: 0). */
  activationBytes: number;
}

/** Options of {@link ModelSummary.format}. */
export interface SummaryFormatOptions {
  /** The deepest rows shown; default 3 (torchinfo's default). Totals always count every layer. */
  depth?: number;
}

const BYTES: Record<SummaryDType, number> = { f32: 4, bf16: 2, f16: 2 };

/** The result of {@link summary}: rows in execution order, and the totals. */
export class ModelSummary {
  /** One row per module, in execution order, the model first. */
  readonly rows: readonly SummaryRow[];
  /** The input shape, NHWC. */
  readonly inputShape: readonly number[];
  /** The activation dtype. */
  readonly dtype: SummaryDType;
  /** All parameters. */
  readonly totalParams: number;
  /** Parameters with `requiresGrad`. */
  readonly trainableParams: number;
  /** Frozen parameters. */
  readonly frozenParams: number;
  /** Multiply-accumulates of one forward of the whole batch. */
  readonly macs: number;
  /** Bytes of the layers' outputs for one forward (what backward keeps, roughly; gradients need as much again). */
  readonly activationBytes: number;
  /** Bytes of the parameters (f32). */
  readonly paramBytes: number;
  /** Bytes of the input batch in the activation dtype. */
  readonly inputBytes: number;

  /** @internal Built by {@link summary}. */
  constructor(rows: SummaryRow[], inputShape: readonly number[], dtype: SummaryDType) {
    const root = rows[0];
    if (!root) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'A summary needs at least the model row');
    this.rows = Object.freeze(rows);
    this.inputShape = Object.freeze([...inputShape]);
    this.dtype = dtype;
    this.totalParams = root.params;
    this.trainableParams = root.trainableParams;
    this.frozenParams = root.params - root.trainableParams;
    this.macs = root.macs;
    this.activationBytes = root.activationBytes;
    this.paramBytes = root.params * 4;
    this.inputBytes = inputShape.reduce((a, b) => a * b, 1) * BYTES[dtype];
  }

  /**
   * A table like torchinfo's: each row's indented name and type, output shape, parameters and
   * MACs, then the totals and the memory estimate (MB = 10^6 bytes, as torchinfo).
   */
  format(options: SummaryFormatOptions = {}): string {
    const o = expectOptions<SummaryFormatOptions>('format options', options, ['depth']);
    const maxDepth = expectInt('depth', o.depth ?? 3, 0);
    const table: [string, string, string, string][] = [['Layer (type)', 'Output shape', 'Param #', 'Mult-Adds']];
    for (const r of this.rows) {
      if (r.depth > maxDepth) continue;
      const label =
        r.depth === 0 ? r.type : `${'  '.repeat(r.depth - 1)}${r.name.split('.').pop() ?? r.name} (${r.type})`;
      const frozen =
        r.params > 0 && r.trainableParams < r.params ? ` (${count(r.params - r.trainableParams)} frozen)` : '';
      table.push([
        label,
        `[${r.outputShape.join(', ')}]`,
        r.params > 0 ? count(r.params) + frozen : '--',
        r.macs > 0 ? count(r.macs) : '--',
      ]);
    }
    const widths = [0, 1, 2, 3].map((c) => Math.max(...table.map((row) => row[c as 0 | 1 | 2 | 3].length)));
    const line = (row: readonly string[]): string =>
      row
        .map((cell, c) => (c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!)))
        .join('   ')
        .trimEnd();
    const rule = '='.repeat(widths.reduce((a, b) => a + b, 0) + 9);
    const mb = (bytes: number): string => (bytes / 1e6).toFixed(2);
    const [header, ...body] = table;
    return [
      rule,
      line(header ?? []),
      rule,
      ...body.map(line),
      rule,
      `Total params: ${count(this.totalParams)}`,
      `Trainable params: ${count(this.trainableParams)}`,
      `Non-trainable params: ${count(this.frozenParams)}`,
      `Total mult-adds (G): ${(this.macs / 1e9).toFixed(2)}`,
      rule,
      `Input size (MB): ${mb(this.inputBytes)}  [${this.inputShape.join(', ')}] ${this.dtype}`,
      `Forward/backward pass size (MB): ${mb(2 * this.activationBytes)}`,
      `Params size (MB): ${mb(this.paramBytes)}`,
      `Estimated total size (MB): ${mb(this.inputBytes + 2 * this.activationBytes + this.paramBytes)}`,
      rule,
      '',
    ].join('\n');
  }

  /** {@link format} with its defaults. */
  toString(): string {
    return this.format();
  }

  /** The totals and rows as plain data (for `--json`). */
  toJSON(): Record<string, unknown> {
    return {
      inputShape: this.inputShape,
      dtype: this.dtype,
      totalParams: this.totalParams,
      trainableParams: this.trainableParams,
      frozenParams: this.frozenParams,
      macs: this.macs,
      activationBytes: this.activationBytes,
      paramBytes: this.paramBytes,
      inputBytes: this.inputBytes,
      rows: this.rows,
    };
  }
}

function count(n: number): string {
  return n.toLocaleString('en-US');
}

/** The output length of a window along one axis (PyTorch's formula, floor mode). */
export function windowOut(size: number, kernel: number, stride: number, pad: number, dilation: number): number {
  return Math.floor((size + 2 * pad - dilation * (kernel - 1) - 1) / stride) + 1;
}

/**
 * Refuses an input a layer cannot take, naming the tool that walked the model (`summary`,
 * `roofline`), the layer and the shape that reached it.
 */
export function refuseShape(tool: string, name: string, what: string, shape: readonly number[]): never {
  throw new ResnetError(
    'ERR_RC_INVALID_ARGUMENT',
    `${tool}: ${name || 'the model'} expects ${what}, but the input size gives it [${shape.join(', ')}]`,
  );
}

function refuse(name: string, what: string, shape: readonly number[]): never {
  refuseShape('summary', name, what, shape);
}

/** A leaf's output shape and MACs for an input shape. */
function leafShape(m: Module, name: string, x: readonly number[]): { shape: number[]; macs: number; view?: boolean } {
  if (m instanceof Conv2d) {
    const [n, h, w, c] = x as [number, number, number, number];
    if (x.length !== 4 || c !== m.inChannels) refuse(name, `NHWC input with ${m.inChannels} channels`, x);
    const oh = windowOut(h, m.kernelSize[0], m.stride[0], m.padding[0], m.dilation[0]);
    const ow = windowOut(w, m.kernelSize[1], m.stride[1], m.padding[1], m.dilation[1]);
    if (oh <= 0 || ow <= 0) refuse(name, 'a spatial size at least its kernel size', x);
    const macs = n * oh * ow * m.outChannels * c * m.kernelSize[0] * m.kernelSize[1];
    return { shape: [n, oh, ow, m.outChannels], macs };
  }
  if (m instanceof BatchNorm2d) {
    if (x.length !== 4 || x[3] !== m.numFeatures) refuse(name, `NHWC input with ${m.numFeatures} channels`, x);
    return { shape: [...x], macs: 0 };
  }
  if (m instanceof ReLU) return { shape: [...x], macs: 0 };
  if (m instanceof MaxPool2d) {
    const [n, h, w, c] = x as [number, number, number, number];
    if (x.length !== 4) refuse(name, 'NHWC input', x);
    const oh = windowOut(h, m.kernelSize[0], m.stride[0], m.padding[0], 1);
    const ow = windowOut(w, m.kernelSize[1], m.stride[1], m.padding[1], 1);
    if (oh <= 0 || ow <= 0) refuse(name, 'a spatial size at least its kernel size', x);
    return { shape: [n, oh, ow, c], macs: 0 };
  }
  if (m instanceof AdaptiveAvgPool2d) {
    if (x.length !== 4) refuse(name, 'NHWC input', x);
    return { shape: [x[0]!, 1, 1, x[3]!], macs: 0 };
  }
  if (m instanceof Flatten) {
    return { shape: [x[0]!, x.slice(1).reduce((a, b) => a * b, 1)], macs: 0, view: true };
  }
  if (m instanceof Linear) {
    if (x.length !== 2 || x[1] !== m.inFeatures) refuse(name, `[N, ${m.inFeatures}] input`, x);
    return { shape: [x[0]!, m.outFeatures], macs: x[0]! * m.inFeatures * m.outFeatures };
  }
  throw new ResnetError(
    'ERR_RC_INVALID_ARGUMENT',
    `summary: cannot work out the output shape of ${name || 'the model'} (${m.constructor.name}); it knows the layers, Chain, Sequential and Residual`,
  );
}

/** Walks `m` for input shape `x`, appending rows in execution order; returns its output shape. */
function walk(
  m: Module,
  name: string,
  depth: number,
  x: readonly number[],
  bytes: number,
  rows: SummaryRow[],
): number[] {
  const row: SummaryRow = {
    name,
    type: m.constructor.name,
    depth,
    leaf: m.children().length === 0,
    outputShape: [],
    params: 0,
    trainableParams: 0,
    macs: 0,
    activationBytes: 0,
  };
  rows.push(row);
  const prefix = name === '' ? '' : `${name}.`;
  const named = new Map(m.children().map(([childName, child]) => [child, childName]));
  const child = (c: Module, input: readonly number[]): number[] => {
    const at = rows.length;
    const out = walk(c, prefix + (named.get(c) ?? '?'), depth + 1, input, bytes, rows);
    const r = rows[at]!;
    row.macs += r.macs;
    row.activationBytes += r.activationBytes;
    return out;
  };
  let out: number[];
  if (m instanceof Residual) {
    let h: number[] = [...x];
    for (const c of m.main) h = child(c, h);
    const identity = m.shortcut ? child(m.shortcut, x) : [...x];
    if (identity.join(',') !== h.join(',')) {
      refuse(name, `a shortcut of the main branch's shape [${h.join(', ')}]`, identity);
    }
    out = h;
  } else if (m instanceof Chain) {
    out = [...x];
    for (const c of m.modules) out = child(c, out);
  } else {
    const leaf = leafShape(m, name, x);
    out = leaf.shape;
    row.macs = leaf.macs;
    row.activationBytes = leaf.view ? 0 : out.reduce((a, b) => a * b, 1) * bytes;
  }
  for (const p of m.parameters()) {
    row.params += p.numel;
    if (p.requiresGrad) row.trainableParams += p.numel;
  }
  row.outputShape = out;
  return out;
}

/** The input channels of the first convolution of `model`, or undefined when it has none. */
function firstConvChannels(model: Module): number | undefined {
  for (const [, m] of model.namedModules()) if (m instanceof Conv2d) return m.inChannels;
  return undefined;
}

/**
 * Summarises `model` for a batch of `inputSize` images, as `torchinfo.summary(model, input_size)`:
 * per module its output shape, parameters (trainable and frozen, from `requiresGrad`),
 * multiply-accumulates of its convolutions and linear layers (what torchvision's GFLOPS column
 * counts: ResNet-50 at 224 px, 4.09 G), and the bytes of its outputs in `dtype`. Analytic: no
 * forward pass runs, and the model may live on any device (or have been disposed of its buffers).
 */
export function summary(model: Module, options: SummaryOptions): ModelSummary {
  const o = expectOptions<SummaryOptions>('summary options', options, ['inputSize', 'batchSize', 'dtype', 'channels']);
  if (o.inputSize === undefined) invalid('inputSize', 'an image size such as 224 or [height, width]', undefined);
  let height: number;
  let width: number;
  if (typeof o.inputSize === 'number') {
    height = width = expectInt('inputSize', o.inputSize, 1);
  } else if (isArray(o.inputSize) && o.inputSize.length === 2) {
    height = expectInt('inputSize[0]', o.inputSize[0], 1);
    width = expectInt('inputSize[1]', o.inputSize[1], 1);
  } else {
    invalid('inputSize', 'an image size such as 224 or [height, width]', o.inputSize);
  }
  const batch = expectInt('batchSize', o.batchSize ?? 1, 1);
  const dtype = expectOneOf('dtype', o.dtype ?? 'f32', ['f32', 'bf16', 'f16'] as const);
  const channels = expectInt('channels', o.channels ?? firstConvChannels(model) ?? 3, 1);
  const input = [batch, height, width, channels];
  const rows: SummaryRow[] = [];
  walk(model, '', 0, input, BYTES[dtype], rows);
  return new ModelSummary(rows, input, dtype);
}
