/**
 * The unit of the roofline model: one kernel or library call of a training step with its FLOPs,
 * the bytes it must move to and from device memory, and its launches; and the byte sizes both
 * plans count with.
 *
 * Bytes are compulsory traffic: every tensor an op reads is read once and every tensor it writes is
 * written once (the windows of a pooling or a convolution re-read neighbours from cache, and
 * library workspaces are not counted), so the figure is a lower bound of what the op moves.
 * @packageDocumentation
 */

/** The op types the model's tables are grouped by. */
export const OP_TYPES = [
  'input',
  'conv fwd',
  'conv dgrad',
  'conv wgrad',
  'bn fwd',
  'bn bwd',
  'relu',
  'add',
  'pool',
  'gemm',
  'bias',
  'loss',
  'weight cast',
  'grad accumulate',
  'optimizer',
  'zero grad',
  'scaler',
] as const;

/** An op type of {@link OP_TYPES}. */
export type OpType = (typeof OP_TYPES)[number];

/** One kernel (or library call, or memset) of the step, or a few that always run together. */
export interface StepOp {
  /** The row of the per-type table. */
  type: OpType;
  /** The layer's dotted path (`layer1.0.conv1`), or `step` for the step-wide ops. */
  layer: string;
  /** What runs: the kernel or library call, as the sources name it. */
  kernel: string;
  /** Floating-point operations (a multiply-accumulate is 2). */
  flops: number;
  /** Bytes read from device memory. */
  bytesRead: number;
  /** Bytes written to device memory. */
  bytesWritten: number;
  /** Kernel launches (memsets and copies included). */
  launches: number;
}

/** Bytes of an f32 (parameters, their gradients, statistics). */
export const F32 = 4;

/** Builds a {@link StepOp}. */
export function op(
  type: OpType,
  layer: string,
  kernel: string,
  flops: number,
  bytesRead: number,
  bytesWritten: number,
  launches = 1,
): StepOp {
  return { type, layer, kernel, flops, bytesRead, bytesWritten, launches };
}
