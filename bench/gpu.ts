/**
 * GPU training throughput: ResNet-50 at 224 px on synthetic data, one step = input conversion,
 * forward, loss, backward and SGD, eager and replayed as one CUDA graph. Prints one JSON line per
 * configuration (for scripts/gpu-check's table) and a readable summary.
 *
 *   node dist/bench/gpu.js [--device cuda:0] [--batch 256] [--dtype bf16|f16|f32] [--steps 30] [--graph]
 */
import { parseArgs } from 'node:util';
import { CrossEntropyLoss, CudaGraph, InputNormalize, ResNet50, SGD, Tensor, memoryStats, resetPeakMemory, synchronize, type DType } from '../lib/index.js';

const { values } = parseArgs({
  options: {
    device: { type: 'string', default: 'cuda:0' },
    batch: { type: 'string', default: '256' },
    size: { type: 'string', default: '224' },
    dtype: { type: 'string', default: 'bf16' },
    steps: { type: 'string', default: '30' },
    warmup: { type: 'string', default: '5' },
    graph: { type: 'boolean', default: false },
  },
});
const device = values.device;
const batch = Number(values.batch);
const size = Number(values.size);
const dtype = values.dtype as DType;
const steps = Number(values.steps);
const warmup = Number(values.warmup);

const model = ResNet50({ numClasses: 1000, seed: 1, device });
const normalize = new InputNormalize({ dtype });
const loss = new CrossEntropyLoss({ labelSmoothing: 0.1 });
// A fixed loss scale keeps f16 gradients in range for a throughput measurement.
if (dtype === 'f16') loss.gradScale = 1024;
const optimizer = new SGD(model, { lr: 0.1, momentum: 0.9, weightDecay: 5e-5, nesterov: true });
const pixels = new Uint8Array(batch * size * size * 3);
for (let i = 0; i < pixels.length; i++) pixels[i] = (i * 2654435761) >>> 24;
const images = Tensor.from(pixels, [batch, size, size, 3], { dtype: 'u8', device });
const labels = Tensor.from(Array.from({ length: batch }, (_, i) => (i * 7) % 1000), [batch], { dtype: 'i32', device });

let lastLoss: Tensor | null = null;
const step = () => {
  lastLoss = loss.forward(model.forward(normalize.forward(images)), labels);
  model.backward(loss.backward());
  optimizer.step();
  optimizer.zeroGrad();
};

for (let i = 0; i < warmup; i++) step();
synchronize(device);
let graph: CudaGraph | null = null;
if (values.graph) {
  graph = CudaGraph.capture(device, step);
  graph.replay();
  synchronize(device);
}
resetPeakMemory(device);
const started = performance.now();
for (let i = 0; i < steps; i++) {
  if (graph) graph.replay();
  else step();
}
synchronize(device);
const ms = (performance.now() - started) / steps;
const stats = memoryStats(device);
const result = {
  impl: `resnet-cuda${graph ? ' graph' : ''}`,
  dtype,
  batch,
  size,
  stepMs: ms,
  imagesPerSecond: (batch * 1000) / ms,
  peakMemoryGiB: stats.peakAllocatedBytes / 2 ** 30,
  reservedGiB: stats.reservedBytes / 2 ** 30,
  loss: (lastLoss as Tensor | null)?.item() ?? NaN,
};
console.log(`RESULT ${JSON.stringify(result)}`);
console.log(`${result.impl} ${dtype} batch ${batch}: ${ms.toFixed(1)} ms/step, ${result.imagesPerSecond.toFixed(0)} img/s, peak ${result.peakMemoryGiB.toFixed(1)} GiB`);
graph?.dispose();
