/**
 * GPU training throughput: ResNet-50 at 224 px on synthetic data, one step = input conversion,
 * forward, loss, backward and SGD, eager and replayed as one CUDA graph (`benchmarkTraining`).
 * Prints one JSON line per configuration (for scripts/gpu-check's table) and a readable summary.
 * `--modes eager,graph` measures both in one process, so that cuDNN's algorithm search (once per
 * convolution shape and process) runs once.
 *
 *   node dist/bench/gpu.js [--device cuda:0] [--batch 256] [--dtype bf16|f16|f32] [--steps 30]
 *                          [--modes eager|graph|eager,graph] [--graph (= --modes graph)]
 */
import { parseArgs } from 'node:util';
import { ResNet50 } from '../lib/index.js';
import { benchmarkTraining } from '../lib/train/benchmark.js';

const { values } = parseArgs({
  options: {
    device: { type: 'string', default: 'cuda:0' },
    batch: { type: 'string', default: '256' },
    size: { type: 'string', default: '224' },
    dtype: { type: 'string', default: 'bf16' },
    steps: { type: 'string', default: '30' },
    warmup: { type: 'string', default: '5' },
    modes: { type: 'string', default: 'eager' },
    graph: { type: 'boolean', default: false },
  },
});
const device = values.device;
const batch = Number(values.batch);
const size = Number(values.size);
const dtype = values.dtype as 'f32' | 'bf16' | 'f16';
const modes = values.graph ? ['graph'] : values.modes.split(',');
for (const mode of modes) {
  if (mode !== 'eager' && mode !== 'graph') throw new Error(`--modes: 'eager' and/or 'graph', not '${mode}'`);
}

for (const mode of modes) {
  const graph = mode === 'graph';
  const measured = benchmarkTraining({
    model: ResNet50({ numClasses: 1000, seed: 1, device }),
    device,
    numClasses: 1000,
    dtype,
    batch,
    size,
    steps: Number(values.steps),
    warmup: Number(values.warmup),
    cudaGraph: graph,
  });
  const result = {
    impl: `resnet-cuda${graph ? ' graph' : ''}`,
    dtype,
    batch,
    size,
    stepMs: measured.msPerStep,
    imagesPerSecond: measured.imagesPerSecond,
    peakMemoryGiB: measured.peakMemoryBytes / 2 ** 30,
    reservedGiB: measured.reservedBytes / 2 ** 30,
    loss: measured.loss,
  };
  console.log(`RESULT ${JSON.stringify(result)}`);
  console.log(
    `${result.impl} ${dtype} batch ${batch}: ${result.stepMs.toFixed(1)} ms/step, ${result.imagesPerSecond.toFixed(0)} img/s, peak ${result.peakMemoryGiB.toFixed(1)} GiB`,
  );
}
