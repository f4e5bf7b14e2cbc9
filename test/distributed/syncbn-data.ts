/**
 * The data of the SyncBatchNorm rank script and its test: a batch every process generates the
 * same way from its size and step.
 * @packageDocumentation
 */
import { Tensor, type BatchNorm2d } from '../../lib/index.js';

/** Channels of the layer. */
export const SYNCBN_CHANNELS = 6;
/** Height and width of every sample. */
export const SYNCBN_HW = 3;

/** The batch of `samples` samples of step `step`: input, residual and output gradient, NHWC. */
export function syncBnBatch(
  samples: number,
  step: number,
): { x: Float32Array; residual: Float32Array; dy: Float32Array } {
  const shape = [samples, SYNCBN_HW, SYNCBN_HW, SYNCBN_CHANNELS];
  const draw = (seed: number, scale: number, shift: number): Float32Array =>
    Tensor.randn(shape, { seed: 1000 * step + seed })
      .toFloat32Array()
      .map((v) => shift + scale * v);
  // A mean far from zero, as after a ReLU, so that the statistics' merge is exercised.
  return { x: draw(1, 2, 5), residual: draw(2, 1, 0), dy: draw(3, 1, 0) };
}

/** What one rank prints: per step, its outputs and gradients and the layer's state. */
export interface SyncBnRankResult {
  rank: number;
  steps: {
    y: number[];
    dx: number[];
    dResidual: number[];
    dGamma: number[];
    dBeta: number[];
    runningMean: number[];
    runningVar: number[];
  }[];
}

/** One step's record: the layer's output `y`, input gradient `dx`, and its gradients and running statistics now. */
export function syncBnStep(bn: BatchNorm2d, y: Tensor, dx: Tensor | null): SyncBnRankResult['steps'][number] {
  const state = bn.stateDict();
  return {
    y: [...y.toFloat32Array()],
    dx: [...(dx?.toFloat32Array() ?? [])],
    dResidual: [...(bn.residualGrad?.toFloat32Array() ?? [])],
    dGamma: [...bn.weight.grad.toFloat32Array()],
    dBeta: [...bn.bias.grad.toFloat32Array()],
    runningMean: [...(state.get('running_mean')?.data as Float32Array)],
    runningVar: [...(state.get('running_var')?.data as Float32Array)],
  };
}
