/**
 * Whether cuDNN accepts the `conv-bn` fused graphs of one convolution shape, asked once per shape
 * before the shape runs (the `convBnSupport` op builds and keeps the execution plans). A shape
 * cuDNN refuses runs the unfused convolution and batch norm instead, and the process is told once
 * per distinct refusal with a warning (code {@link CONV_BN_FALLBACK_WARNING}) naming the layer
 * shape and cuDNN's reason: NVIDIA documents some of the engines for FP16 only, so a GPU may
 * refuse bf16, or some shapes, where the emulated device accepts them.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import type { Tensor } from '../tensor.js';
import type { ConvWindow } from './layers.js';

/** The `code` of the warning emitted when a shape falls back to the unfused path. */
export const CONV_BN_FALLBACK_WARNING = 'RESNET_CUDA_CONV_BN_FALLBACK';

/** A convolution's output channels and window, as the native ops name them. */
export interface ConvBnWindow extends ConvWindow {
  /** Output channels. */
  k: number;
  /** Kernel height. */
  kernelH: number;
  /** Kernel width. */
  kernelW: number;
}

const answers = new Map<string, boolean>();
const warned = new Set<string>();

/** The cache key of one shape: device, dtype, input shape, window, prologue. */
function shapeKey(x: Tensor, win: ConvBnWindow, prologue: boolean): string {
  const w = win;
  return [
    x.device,
    x.dtype,
    x.shape.join('x'),
    w.k,
    `${w.kernelH}x${w.kernelW}`,
    `${w.strideH}x${w.strideW}`,
    `${w.padH}x${w.padW}`,
    `${w.dilationH}x${w.dilationW}`,
    prologue ? 'prologue' : 'epilogue',
  ].join('|');
}

/** The warning's text for a refused shape. */
function fallbackMessage(x: Tensor, win: ConvBnWindow, prologue: boolean, reason: string): string {
  const what = prologue
    ? 'the batch norm + ReLU in the prologue of the convolution'
    : 'the statistics epilogue of the convolution';
  return (
    `conv-bn: cuDNN refused ${what} of input [${x.shape.join(', ')}] ${x.dtype} -> ${win.k} channels, ` +
    `kernel ${win.kernelH}x${win.kernelW}, stride ${win.strideH}x${win.strideW}, ` +
    `pad ${win.padH}x${win.padW}, dilation ${win.dilationH}x${win.dilationW}; ` +
    `that shape runs unfused. cuDNN: ${reason}`
  );
}

/**
 * Whether the `conv-bn` ops take input `x` of a convolution with window `win`: with `prologue`,
 * as the second of a batch norm + convolution pair (forward with prologue and statistics,
 * convDgradDbn, convWgradSbr), else as a convolution with the statistics epilogue. Asks the
 * backend once per shape and caches the answer; on a refusal, emits one warning per distinct
 * reason and returns false. The caller has checked that the path is on and applies to `x`.
 */
export function convBnAccepts(x: Tensor, win: ConvBnWindow, prologue: boolean): boolean {
  const key = shapeKey(x, win, prologue);
  const known = answers.get(key);
  if (known !== undefined) return known;
  const [n, h, w, c] = x.shape as [number, number, number, number];
  const answer = addon().convBnSupport({ device: x.device, dtype: x.dtype, n, h, w, c, ...win, prologue });
  answers.set(key, answer.ok);
  if (!answer.ok) {
    const reason = answer.reason ?? 'no reason given';
    if (!warned.has(reason)) {
      warned.add(reason);
      process.emitWarning(fallbackMessage(x, win, prologue, reason), { code: CONV_BN_FALLBACK_WARNING });
    }
  }
  return answer.ok;
}
