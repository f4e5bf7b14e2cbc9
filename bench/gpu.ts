/**
 * GPU training throughput: ResNet-50 at 224 px on synthetic data, one step = input conversion,
 * forward, loss, backward and SGD, eager and replayed as one CUDA graph (`benchmarkTraining`).
 * Prints one JSON line per configuration (for scripts/gpu-check's table) and a readable summary.
 * `--modes eager,graph` measures both in one process, so that cuDNN's algorithm search (once per
 * convolution shape and process) runs once.
 *
 * Options: `--help` prints them (USAGE below).
 */
import { parseArgs } from 'node:util';
import { ResNet50 } from '../lib/index.js';
import { benchmarkTraining } from '../lib/train/benchmark.js';
import { integerOption, parseOptions, usageError } from './options.js';

const USAGE = `Usage: node dist/bench/gpu.js [OPTIONS]

  --device D         the CUDA device [cuda:0]
  --batch N          batch size [256]
  --size PX          image size [224]
  --dtype T          bf16, f16 or f32 [bf16]
  --steps N          timed steps [30]
  --warmup N         untimed steps first [5]
  --modes LIST       eager, graph or eager,graph [eager]
  --graph            the same as --modes graph
  -h, --help         print this help
`;

const values = parseOptions(
  () =>
    parseArgs({
      options: {
        device: { type: 'string', default: 'cuda:0' },
        batch: { type: 'string', default: '256' },
        size: { type: 'string', default: '224' },
        dtype: { type: 'string', default: 'bf16' },
        steps: { type: 'string', default: '30' },
        warmup: { type: 'string', default: '5' },
        modes: { type: 'string', default: 'eager' },
        graph: { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h' },
      },
    }),
  USAGE,
);
const device = values.device;
const batch = integerOption('batch', values.batch, 1);
const size = integerOption('size', values.size, 1);
const steps = integerOption('steps', values.steps, 1);
const warmup = integerOption('warmup', values.warmup, 0);
if (values.dtype !== 'f32' && values.dtype !== 'bf16' && values.dtype !== 'f16') {
  usageError(`--dtype expects bf16, f16 or f32, got '${values.dtype}'`);
}
const dtype = values.dtype;
const modes = values.graph ? ['graph'] : values.modes.split(',');
for (const mode of modes) {
  if (mode !== 'eager' && mode !== 'graph') usageError(`--modes expects eager and/or graph, got '${mode}'`);
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
    steps,
    warmup,
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
