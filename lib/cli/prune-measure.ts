/**
 * What `prune --eval` measures of a model before and after pruning: its accuracy over the
 * evaluation data (the `eval` command's path and numbers) and the time of one evaluation-mode
 * forward of a batch.
 * @packageDocumentation
 */
import type { DataLoader } from '../data/loader.js';
import { synchronize } from '../device.js';
import type { ResNet } from '../nn/resnet.js';
import { Tensor } from '../tensor.js';
import type { AmpName } from './common.js';
import { inferenceTrainer } from './inference.js';

/** The accuracy and speed of one model, as `prune --json` prints them. */
export interface ModelMeasurement {
  /** Mean cross-entropy over the evaluation data. */
  loss: number;
  /** Top-1 accuracy, a fraction in [0, 1]. */
  acc1: number;
  /** Top-5 accuracy (top-k for fewer classes), a fraction in [0, 1]. */
  acc5: number;
  /** Images evaluated. */
  count: number;
  /** Median wall time of one evaluation-mode forward of the timing batch, in milliseconds. */
  forwardMs: number;
  /** Images per second of that forward. */
  imagesPerSecond: number;
}

/** How {@link measureModel} measures. */
export interface MeasureOptions {
  /** The evaluation data, transformed as `eval` does. */
  loader: DataLoader;
  device: string;
  amp: AmpName;
  /** The timed batch, NHWC: `[batch, crop, crop, channels]`. */
  batchShape: readonly [number, number, number, number];
  /** Timed forwards after one untimed one. */
  steps: number;
}

/** The median of a non-empty list. */
function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/**
 * Evaluates `model` over `o.loader` and times `o.steps` forwards of a seeded random batch of
 * `o.batchShape` (after one untimed forward that makes the plans), each to the device's completion.
 * The model is left in evaluation mode.
 */
export async function measureModel(model: ResNet, o: MeasureOptions): Promise<ModelMeasurement> {
  const trainer = inferenceTrainer(model, { device: o.device, amp: o.amp, progress: false });
  let evaluated;
  try {
    evaluated = await trainer.evaluate(o.loader);
  } finally {
    await trainer.dispose();
  }
  model.eval();
  const dtype = o.amp === 'bf16' ? 'bf16' : o.amp === 'fp16' ? 'f16' : 'f32';
  const x = Tensor.randn([...o.batchShape], { seed: 0, device: o.device, dtype });
  const times: number[] = [];
  try {
    for (let i = 0; i <= o.steps; i++) {
      const started = performance.now();
      model.forward(x);
      synchronize(o.device);
      if (i > 0) times.push(performance.now() - started);
    }
  } finally {
    x.dispose();
  }
  const forwardMs = median(times);
  return {
    loss: evaluated.loss,
    acc1: evaluated.acc1,
    acc5: evaluated.acc5,
    count: evaluated.count,
    forwardMs,
    imagesPerSecond: (o.batchShape[0] * 1000) / forwardMs,
  };
}
