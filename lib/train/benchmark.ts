/**
 * Training throughput on synthetic data that stays on the device, so that only the model is
 * measured: input conversion, forward, cross-entropy, backward and an SGD step, timed between
 * device synchronisations after a warm-up, eagerly or replayed as one CUDA graph. Used by
 * `resnet-cuda bench` and by the GPU benchmark beside PyTorch.
 * @packageDocumentation
 */
import { memoryStats, resetPeakMemory, synchronize } from '../device.js';
import { CudaGraph } from '../cuda.js';
import { ResnetError, expectBool, expectInt, expectOneOf, expectOptions, invalid } from '../errors.js';
import { InputNormalize } from '../nn/input.js';
import { CrossEntropyLoss } from '../nn/loss.js';
import { Module } from '../nn/module.js';
import { GradScaler } from '../optim/grad-scaler.js';
import { SGD } from '../optim/sgd.js';
import { Profiler } from '../profile/profiler.js';
import { Tensor } from '../tensor.js';

/** Options of {@link benchmarkTraining}. */
export interface BenchmarkTrainingOptions {
  /** The model, placed on `device`; its output is `[batch, numClasses]` logits. */
  model: Module;
  /** Where to run. */
  device: string;
  /** Classes of the model's output (labels are drawn below it). */
  numClasses: number;
  /**
   * Activation precision: f32, or bf16/f16 mixed precision (f16 with a {@link GradScaler} whose
   * scale stays on the device, as PyTorch's AMP recipe scales f16).
   */
  dtype?: 'f32' | 'bf16' | 'f16';
  /** Images per step; default 256. */
  batch?: number;
  /** Image height and width; default 224. */
  size?: number;
  /** Timed steps; default 30. */
  steps?: number;
  /** Untimed steps first (algorithm selection, allocations); default 5. */
  warmup?: number;
  /** Capture one step as a CUDA graph and time its replays; default false. */
  cudaGraph?: boolean;
  /**
   * A profiler (not started) that records the timed steps, one profiled step each; stopped when
   * they are done. The step time then includes the profiler's own cost. Not with `cudaGraph`.
   */
  profiler?: Profiler;
}

/** What {@link benchmarkTraining} measured. */
export interface TrainingBenchmark {
  /** Mean wall time of a step. */
  msPerStep: number;
  /** `batch * 1000 / msPerStep`. */
  imagesPerSecond: number;
  /** The allocator's peak of live bytes during the timed steps. */
  peakMemoryBytes: number;
  /** The allocator's reserved bytes at the end. */
  reservedBytes: number;
  /** The loss of the last step (to show that the numbers are sane). */
  loss: number;
}

/**
 * Times training steps of `model` on one fixed synthetic batch already on the device (the data
 * pipeline is not part of it). The model's parameters are trained by the measurement: use a fresh
 * model.
 */
export function benchmarkTraining(options: BenchmarkTrainingOptions): TrainingBenchmark {
  const o = expectOptions<BenchmarkTrainingOptions>('benchmarkTraining options', options, [
    'model',
    'device',
    'numClasses',
    'dtype',
    'batch',
    'size',
    'steps',
    'warmup',
    'cudaGraph',
    'profiler',
  ]);
  if (!(o.model instanceof Module)) invalid('model', 'a Module', o.model);
  if (typeof o.device !== 'string') invalid('device', "a device name such as 'cuda:0'", o.device);
  const model = o.model;
  const device = o.device;
  const numClasses = expectInt('numClasses', o.numClasses, 1);
  const dtype = expectOneOf('dtype', o.dtype ?? 'f32', ['f32', 'bf16', 'f16'] as const);
  const batch = expectInt('batch', o.batch ?? 256, 1);
  const size = expectInt('size', o.size ?? 224, 1);
  const steps = expectInt('steps', o.steps ?? 30, 1);
  const warmup = expectInt('warmup', o.warmup ?? 5, 0);
  const useGraph = expectBool('cudaGraph', o.cudaGraph ?? false);
  const profiler = o.profiler;
  if (profiler !== undefined && !(profiler instanceof Profiler)) invalid('profiler', 'a Profiler', profiler);
  if (profiler && useGraph) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      'benchmarkTraining: profiler and cudaGraph exclude each other (a replayed graph runs no op calls to time); profile eager steps',
    );
  }

  const normalize = new InputNormalize({ dtype });
  const loss = new CrossEntropyLoss({ labelSmoothing: 0.1 });
  const optimizer = new SGD(model, { lr: 0.1, momentum: 0.9, weightDecay: 5e-5, nesterov: true });
  // f16 gradients need loss scaling. The scale lives on the device, and the loss reads it there,
  // so that the step needs no host synchronisation and can be captured.
  const scaler = dtype === 'f16' ? new GradScaler() : null;
  if (scaler) loss.gradScaleFrom = scaler.deviceState(device).scale;
  const pixels = new Uint8Array(batch * size * size * 3);
  for (let i = 0; i < pixels.length; i++) pixels[i] = (i * 2654435761) >>> 24;
  const images = Tensor.from(pixels, [batch, size, size, 3], { dtype: 'u8', device });
  const labels = Tensor.from(
    Array.from({ length: batch }, (_, i) => (i * 7) % numClasses),
    [batch],
    { dtype: 'i32', device },
  );
  let lastLoss: Tensor | null = null;
  const step = (): void => {
    lastLoss = loss.forward(model.forward(normalize.forward(images)), labels);
    model.backward(loss.backward());
    if (scaler) {
      scaler.stepOnDeviceAndZeroGrad(optimizer);
    } else {
      optimizer.step();
      optimizer.zeroGrad();
    }
  };
  let graph: CudaGraph | null = null;
  try {
    for (let i = 0; i < warmup; i++) step();
    synchronize(device);
    if (useGraph) {
      graph = CudaGraph.capture(device, step);
      graph.replay();
      synchronize(device);
    }
    resetPeakMemory(device);
    profiler?.start();
    const started = performance.now();
    for (let i = 0; i < steps; i++) {
      if (graph) graph.replay();
      else step();
      profiler?.step();
    }
    synchronize(device);
    const msPerStep = (performance.now() - started) / steps;
    profiler?.stop();
    const stats = memoryStats(device);
    return {
      msPerStep,
      imagesPerSecond: (batch * 1000) / msPerStep,
      peakMemoryBytes: stats.peakAllocatedBytes,
      reservedBytes: stats.reservedBytes,
      loss: (lastLoss as Tensor | null)?.item() ?? NaN,
    };
  } finally {
    graph?.dispose();
    scaler?.dispose();
    optimizer.dispose();
    loss.dispose();
    normalize.dispose();
    images.dispose();
    labels.dispose();
    model.releaseBuffers();
  }
}
