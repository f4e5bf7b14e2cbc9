/**
 * `npm run bench`: CPU training benchmarks with tinybench.
 *
 * 1. Every distinct convolution of ResNet-50 at the benchmark's batch and image size, forward plus
 *    backward (data and weights), in f32 and bf16, with achieved GFLOP/s.
 * 2. A whole ResNet-50 training step (forward, loss, backward, SGD) in f32 and bf16: step time,
 *    images/s, GFLOP/s (on the CPU also as a share of its FMA peak, measured right before and after
 *    the timed steps), and the ratio to the conv-only time of the same step; then that ratio again
 *    over --ratio-rounds rounds, each one pass over the convolutions right before one step, so that
 *    both halves of each ratio see the same load (`stepToConvRounds`).
 * 3. Memory: resident set size and allocator statistics before and after the timed steps.
 * 4. Gradient checkpointing: the allocator's peak and the step time of a ResNet-50 training step
 *    without checkpointing, per stage and with every block a segment (`benchCheckpointing`).
 * 5. The profiler's overhead: the step with and without per-op profiling (first dtype only).
 * 6. Inference (CPU): the Predictor in f32 and bf16 (int8 when a calibrated graph is given) beside
 *    ONNX Runtime on the same exported ResNet-50 (bench/inference.ts).
 * 7. Data parallel (CPU): 2 ranks x 1 thread with DistributedDataParallel over Gloo against 1 process
 *    x 2 threads, ResNet-18 at 32 px (bench/ddp.ts).
 * 8. PyTorch's CPU step beside ours (CPU only, when a Python with torch is found, bench/torch-cpu.ts):
 *    eager and torch.compile, the same model, batch, dtype and optimizer, runs of --peer-steps steps
 *    alternated with ours for --peer-rounds rounds; ranges of the rounds' means and the ratios.
 *
 * Options: `--help` prints them (USAGE below).
 * Prints a table and writes JSON under bench/results/.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Bench } from 'tinybench';
import {
  Conv2d,
  CrossEntropyLoss,
  Linear,
  Profiler,
  ResNet,
  SGD,
  Tensor,
  benchmarkTraining,
  listBackends,
  memoryStats,
  synchronize,
  type DType,
} from '../lib/index.js';
import { addon } from '../lib/binding.js';
import { benchInference } from './inference.js';
import { int8Quantizer } from './int8.js';
import { benchPruning } from './prune.js';
import { benchDataParallel } from './ddp.js';
import { integerOption, parseOptions, usageError } from './options.js';
import { checkpointingOf, type CheckpointSegments } from '../lib/nn/checkpoint.js';
import { findTorchPython, startTorchPeer, type TorchPeer } from './torch-cpu.js';

const USAGE = `Usage: node dist/bench/run.js [OPTIONS]   (npm run bench runs it with the defaults, then bench/loader.js)

  --batch N            batch size [16]
  --size PX            image size [224]
  --depth D            ResNet depth [50]
  --iterations N       timed steps of the whole-step row [5]
  --device D           cpu or cuda[:i] [cpu]
  --dtypes LIST        comma-separated element types [f32,bf16]
  --checkpoint-batch N, --checkpoint-size PX, --checkpoint-steps N
                       the gradient-checkpointing rows [64, 224 on CUDA and 64 on the CPU, 2]
  --only ROWS          checkpointing (only those rows), profiler (the whole step and the
                       profiler's overhead, first dtype), or training (the convolutions, the whole
                       step and the PyTorch rows per dtype, nothing else: for runs under a changed
                       environment such as ONEDNN_MAX_CPU_ISA, which both sides honour)
  --peer-rounds N      alternated rounds beside PyTorch; 0 skips them [3]
  --peer-steps N       steps per round [2]
  --peers LIST         eager,compile [eager,compile]
  --ratio-rounds N     alternated rounds of the whole step against its convolutions alone; 0
                       skips them [3]
  -h, --help           print this help

PyTorch's rows need a Python with torch: RESNET_TORCH_PYTHON, else python3 on the PATH.
Prints a table and writes JSON under bench/results/.
`;

const values = parseOptions(
  () =>
    parseArgs({
      options: {
        batch: { type: 'string', default: '16' },
        size: { type: 'string', default: '224' },
        depth: { type: 'string', default: '50' },
        iterations: { type: 'string', default: '5' },
        device: { type: 'string', default: 'cpu' },
        dtypes: { type: 'string', default: 'f32,bf16' },
        'checkpoint-batch': { type: 'string', default: '64' },
        'checkpoint-size': { type: 'string' },
        'checkpoint-steps': { type: 'string', default: '2' },
        only: { type: 'string' },
        'peer-rounds': { type: 'string', default: '3' },
        'peer-steps': { type: 'string', default: '2' },
        'ratio-rounds': { type: 'string', default: '3' },
        peers: { type: 'string', default: 'eager,compile' },
        help: { type: 'boolean', short: 'h' },
      },
    }),
  USAGE,
);
const onlyValues = ['checkpointing', 'profiler', 'training'];
if (values.only !== undefined && !onlyValues.includes(values.only)) {
  usageError(`--only expects one of ${onlyValues.map((v) => `'${v}'`).join(', ')}, got '${values.only}'`);
}
/** Whether the per-dtype training rows (convolutions, whole step, PyTorch peers) run in full. */
const trainingRows = values.only === undefined || values.only === 'training';
const batch = integerOption('batch', values.batch, 1);
const size = integerOption('size', values.size, 1);
const depth = integerOption('depth', values.depth, 1) as 50;
const iterations = integerOption('iterations', values.iterations, 1);
const device = values.device;
const dtypes = values.dtypes.split(',') as DType[];
const peerRounds = integerOption('peer-rounds', values['peer-rounds'], 0);
const peerSteps = integerOption('peer-steps', values['peer-steps'], 1);
const ratioRounds = integerOption('ratio-rounds', values['ratio-rounds'], 0);
const peerVariants = values.peers.split(',').filter((v) => v !== '');
for (const v of peerVariants) {
  if (v !== 'eager' && v !== 'compile') usageError(`--peers expects eager and/or compile, got '${v}'`);
}
interface ConvShape {
  key: string;
  input: number[];
  inChannels: number;
  outChannels: number;
  kernel: number;
  stride: number;
  padding: number;
  count: number;
  /** Multiply-accumulates of the forward pass. */
  macs: number;
}

/**
 * The convolutions of the model with their input shapes, found by running one forward with each
 * convolution's `forward` wrapped (the wrappers are removed again, so later steps count nothing).
 */
function convShapes(model: ResNet, x: Tensor): { convs: ConvShape[]; linearMacs: number } {
  const found = new Map<string, ConvShape>();
  const wrapped: Conv2d[] = [];
  let linearMacs = 0;
  for (const [, m] of model.namedModules()) {
    if (m instanceof Conv2d) {
      wrapped.push(m);
      const forward = m.forward.bind(m);
      m.forward = (input: Tensor) => {
        const out = m.outputShape(input.shape);
        const key = `${input.shape.join('x')} ${m.inChannels}->${m.outChannels} k${m.kernelSize[0]} s${m.stride[0]}`;
        const entry = found.get(key);
        if (entry) entry.count++;
        else {
          found.set(key, {
            key,
            input: [...input.shape],
            inChannels: m.inChannels,
            outChannels: m.outChannels,
            kernel: m.kernelSize[0],
            stride: m.stride[0],
            padding: m.padding[0],
            count: 1,
            macs: out[0]! * out[1]! * out[2]! * m.outChannels * m.inChannels * m.kernelSize[0] * m.kernelSize[1],
          });
        }
        return forward(input);
      };
    } else if (m instanceof Linear) {
      linearMacs += batch * m.inFeatures * m.outFeatures;
    }
  }
  try {
    model.forward(x);
  } finally {
    for (const m of wrapped) Reflect.deleteProperty(m, 'forward');
  }
  return { convs: [...found.values()], linearMacs };
}

function rssMiB(): number {
  return process.memoryUsage().rss / 2 ** 20;
}

/** The middle value (the mean of the two middle ones for an even count). */
function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/** What {@link profilerOverhead} measured. */
interface ProfilerOverhead {
  rounds: number;
  /** Median step time without a profiler. */
  plainMs: number;
  /** Median step time with every op recorded. */
  profiledMs: number;
  /** `profiledMs / plainMs - 1`, in percent. */
  overheadPercent: number;
  /** The recorded ops' time as a share of the profiled step's wall time (median). */
  opsCoverPercent: number;
  /** Ops recorded per step. */
  opsPerStep: number;
  /** The recording's own cost per op (one begin and end on the host, without the op), in microseconds. */
  perOpMicros: number;
  /** `opsPerStep * perOpMicros` as a share of the plain step: the overhead without the machine's noise. */
  bookkeepingPercent: number;
}

/** The profiler's cost of recording one op on the CPU, in microseconds: begin and end without an op between. */
function recordingMicros(count: number): number {
  const profiler = new Profiler().start();
  const started = performance.now();
  for (let i = 0; i < count; i++) profiler.end(profiler.begin('conv2d.forward', 'layer1.0.conv1', 'cpu'));
  const micros = ((performance.now() - started) * 1000) / count;
  profiler.stop();
  return micros;
}

/**
 * The profiler's cost per step: `rounds` pairs of one plain step and one profiled step (a window
 * of its own, whose start and stop are outside the timing), alternated so that a busy machine's
 * drift falls on both alike; medians, each step timed to the device's completion.
 */
function profilerOverhead(model: ResNet, step: () => unknown, rounds: number): ProfilerOverhead {
  const plain: number[] = [];
  const profiled: number[] = [];
  const cover: number[] = [];
  let opsPerStep = 0;
  const timed = (): number => {
    const started = performance.now();
    step();
    synchronize(device);
    return performance.now() - started;
  };
  for (let i = 0; i < rounds; i++) {
    plain.push(timed());
    const profiler = new Profiler({ model }).start();
    const ms = timed();
    profiled.push(ms);
    const { ops } = profiler.stop();
    opsPerStep = ops.length;
    cover.push((100 * ops.reduce((sum, op) => sum + op.duration, 0)) / ms);
  }
  const plainMs = median(plain);
  const profiledMs = median(profiled);
  const perOpMicros = recordingMicros(100_000);
  return {
    rounds,
    plainMs,
    profiledMs,
    overheadPercent: 100 * (profiledMs / plainMs - 1),
    opsCoverPercent: median(cover),
    opsPerStep,
    perOpMicros,
    bookkeepingPercent: (100 * opsPerStep * perOpMicros) / 1000 / plainMs,
  };
}

const cpu = listBackends().find((b) => b.name === 'cpu');
console.log(
  `resnet-cuda bench: ResNet-${depth}, batch ${batch}, ${size}px, ${device}; ${cpu?.device ?? ''} [oneDNN ${cpu?.properties?.onednn}, ${cpu?.properties?.isa}, ${cpu?.properties?.threads} threads]`,
);

const results: Record<string, unknown> = {
  date: new Date().toISOString(),
  device,
  cpu: cpu?.device,
  properties: cpu?.properties,
  batch,
  size,
  depth,
  layers: [] as unknown[],
  models: [] as unknown[],
};

for (const dtype of trainingRows ? dtypes : values.only === 'profiler' ? dtypes.slice(0, 1) : []) {
  const model = new ResNet(depth, { numClasses: 1000, seed: 1, device });
  const x = Tensor.randn([batch, size, size, 3], { seed: 2, device, dtype });
  const { convs, linearMacs } = convShapes(model, x);
  const convMacs = convs.reduce((n, c) => n + c.macs * c.count, 0);
  const stepFlops = 3 * 2 * (convMacs + linearMacs); // forward + backward data + backward weights

  // 1. The convolutions one by one.
  const layerBench = new Bench({
    iterations: Math.max(2, Math.ceil(iterations / 2)),
    warmupIterations: 1,
    time: 0,
    warmupTime: 0,
  });
  const layerData = (values.only === 'profiler' ? [] : convs).map((c): LayerRun => {
    const conv = new Conv2d({
      inChannels: c.inChannels,
      outChannels: c.outChannels,
      kernelSize: c.kernel,
      stride: c.stride,
      padding: c.padding,
      seed: 3,
    });
    const input = Tensor.randn(c.input, { seed: 4, device, dtype });
    const dy = Tensor.randn(conv.outputShape(c.input), { seed: 5, device, dtype });
    layerBench.add(c.key, () => {
      conv.forward(input);
      conv.backward(dy);
    });
    return { c, conv, input, dy };
  });
  await layerBench.run();
  let convSeconds = 0;
  if (layerData.length > 0) {
    console.log(
      `\n${dtype}: convolutions of one ResNet-${depth} step, forward + backward (${layerBench.tasks[0]?.name ? 'tinybench mean' : ''})`,
    );
    console.log('  input shape        conv            count   ms/call   GFLOP/s   implementation');
  } else {
    console.log(`\n${dtype}: ResNet-${depth} training step`);
  }
  for (const [i, task] of layerBench.tasks.entries()) {
    const r = task.result;
    if (r.state !== 'completed') throw new Error(`${task.name}: ${r.state === 'errored' ? r.error.message : r.state}`);
    const { c, conv } = layerData[i]!;
    const ms = r.latency.mean;
    convSeconds += (ms / 1000) * c.count;
    const gflops = (3 * 2 * c.macs) / (ms / 1000) / 1e9;
    console.log(
      `  ${c.input.join('x').padEnd(18)} ${`${c.inChannels}->${c.outChannels} ${c.kernel}x${c.kernel}/${c.stride}`.padEnd(15)} ${String(c.count).padStart(5)} ${ms.toFixed(2).padStart(9)} ${gflops.toFixed(1).padStart(9)}   ${conv.implementation()}`,
    );
    (results.layers as unknown[]).push({
      dtype,
      shape: c.input,
      inChannels: c.inChannels,
      outChannels: c.outChannels,
      kernel: c.kernel,
      stride: c.stride,
      count: c.count,
      ms,
      gflops,
      implementation: conv.implementation(),
    });
  }
  const convOnlyGflops = (3 * 2 * convMacs) / convSeconds / 1e9;
  if (layerData.length > 0) {
    console.log(`  conv-only: ${(convSeconds * 1000).toFixed(0)} ms per step, ${convOnlyGflops.toFixed(1)} GFLOP/s`);
  }

  // 2. The whole training step.
  const loss = new CrossEntropyLoss();
  const optimizer = new SGD(model, { lr: 0.01, momentum: 0.9, weightDecay: 1e-4 });
  const labels = Tensor.from(
    Array.from({ length: batch }, (_, i) => i % 1000),
    [batch],
    { dtype: 'i32', device },
  );
  const step = () => {
    const value = loss.forward(model.forward(x), labels);
    model.backward(loss.backward());
    optimizer.step();
    optimizer.zeroGrad();
    return value;
  };
  step();
  const rssBefore = rssMiB();
  const allocBefore = memoryStats(device);
  const peakBefore = device === 'cpu' ? fmaPeak() : null;
  const modelBench = new Bench({ iterations, warmupIterations: 1, time: 0, warmupTime: 0 });
  let last = 0;
  modelBench.add(`ResNet-${depth} ${dtype} training step`, () => {
    last = step().item();
  });
  await modelBench.run();
  const r = modelBench.tasks[0]!.result;
  if (r.state !== 'completed') throw new Error(`training step: ${r.state === 'errored' ? r.error.message : r.state}`);
  const stepMs = r.latency.mean;
  const peakAfter = peakBefore ? fmaPeak() : null;
  const allocAfter = memoryStats(device);
  const rssAfter = rssMiB();
  const gflops = stepFlops / (stepMs / 1000) / 1e9;
  const ratio = stepMs / (convSeconds * 1000);
  console.log(
    `  whole step: ${stepMs.toFixed(0)} ms (sd ${r.latency.sd.toFixed(0)}), ${((batch * 1000) / stepMs).toFixed(2)} img/s, ${gflops.toFixed(1)} GFLOP/s${layerData.length > 0 ? `, ${ratio.toFixed(2)}x the conv-only time` : ''}; loss ${last.toFixed(3)}`,
  );
  // The step's share of the higher of the two peak readings (the CPU only).
  const fma =
    peakBefore && peakAfter
      ? {
          gflops: [peakBefore.gflops, peakAfter.gflops],
          share: gflops / Math.max(peakBefore.gflops, peakAfter.gflops),
          isa: peakBefore.isa,
          threads: peakBefore.threads,
        }
      : null;
  if (fma) {
    console.log(
      `  ${(100 * fma.share).toFixed(0)}% of the CPU's FMA peak measured right before and after the timed steps (${fma.gflops.map((g) => g.toFixed(0)).join(' and ')} GFLOP/s: ${fma.isa}, ${fma.threads} threads)`,
    );
  }
  console.log(
    `  memory: RSS ${rssBefore.toFixed(0)} -> ${rssAfter.toFixed(0)} MiB over ${iterations + 1} steps; allocator ${(allocAfter.allocatedBytes / 2 ** 20).toFixed(0)} MiB live, ${(allocAfter.reservedBytes / 2 ** 20).toFixed(0)} MiB reserved, ${allocAfter.systemAllocationCount - allocBefore.systemAllocationCount} new system allocations`,
  );
  const alternated = layerData.length > 0 ? stepToConvRounds(layerData, step) : [];
  if (alternated.length > 0) {
    const s = spread(alternated);
    console.log(
      `  step / conv-only, ${alternated.length} alternated rounds (the convolutions once, then one step): ${s.min.toFixed(2)}-${s.max.toFixed(2)}x, median ${median(alternated).toFixed(2)}x`,
    );
  }
  for (const { conv, input, dy } of layerData) {
    conv.releaseBuffers();
    input.dispose();
    dy.dispose();
  }
  (results.models as unknown[]).push({
    dtype,
    stepMs,
    stepSd: r.latency.sd,
    imagesPerSecond: (batch * 1000) / stepMs,
    gflops,
    convOnlyMs: convSeconds * 1000,
    convOnlyGflops,
    ratioToConvOnly: ratio,
    ratioToConvOnlyAlternated: alternated,
    stepGflop: stepFlops / 1e9,
    ...(fma ? { fmaPeakGflops: fma.gflops, shareOfFmaPeak: fma.share } : {}),
    rssMiB: { before: rssBefore, after: rssAfter },
    allocator: allocAfter,
    newSystemAllocations: allocAfter.systemAllocationCount - allocBefore.systemAllocationCount,
  });

  // 8. PyTorch's step beside ours.
  if (trainingRows && device === 'cpu' && depth === 50 && peerRounds > 0 && (dtype === 'f32' || dtype === 'bf16')) {
    results.pytorch ??= [];
    (results.pytorch as unknown[]).push(await torchRows(dtype, () => step().item(), stepMs));
  }

  // 4. The profiler's overhead.
  if (dtype === dtypes[0] && values.only !== 'training') {
    const overhead = profilerOverhead(model, step, Math.max(3, iterations));
    console.log(
      `  profiler: ${overhead.plainMs.toFixed(1)} ms per step without, ${overhead.profiledMs.toFixed(1)} ms with per-op profiling (${overhead.overheadPercent >= 0 ? '+' : ''}${overhead.overheadPercent.toFixed(2)}%, medians of ${overhead.rounds} alternated steps); the ops account for ${overhead.opsCoverPercent.toFixed(1)}% of the profiled step`,
    );
    console.log(
      `  profiler bookkeeping: ${overhead.perOpMicros.toFixed(2)} us per op x ${overhead.opsPerStep} ops = ${overhead.bookkeepingPercent.toFixed(3)}% of the plain step`,
    );
    results.profiler = { dtype, ...overhead };
  }
  model.releaseBuffers();
  optimizer.dispose();
  loss.dispose();
  x.dispose();
}

/**
 * The CPU's multiply-add peak (independent FMA chains in registers on every OpenMP thread, best
 * trial over 300 ms): what the step's GFLOP/s are a share of.
 */
function fmaPeak(): { gflops: number; threads: number; isa: string } {
  return addon().cpuFmaPeak({ milliseconds: 300 });
}

/** One layer of the conv-only sum: a convolution with its input and output gradient. */
interface LayerRun {
  c: ConvShape;
  conv: Conv2d;
  input: Tensor;
  dy: Tensor;
}

/** One pass over the step's distinct convolutions, forward and backward each, weighted by count (ms). */
function convOnlyOnce(layers: readonly LayerRun[]): number {
  let ms = 0;
  for (const { c, conv, input, dy } of layers) {
    synchronize(device);
    const t0 = performance.now();
    conv.forward(input);
    conv.backward(dy);
    synchronize(device);
    ms += (performance.now() - t0) * c.count;
  }
  return ms;
}

/**
 * The whole step over the convolutions alone, `ratioRounds` times: each round times one pass over
 * the convolutions and, right after it, one step, so that on a shared machine both sides of each
 * ratio run under the same load (the first table times them minutes apart).
 */
function stepToConvRounds(layers: readonly LayerRun[], step: () => unknown): number[] {
  const ratios: number[] = [];
  for (let r = 0; r < ratioRounds; r++) {
    const convMs = convOnlyOnce(layers);
    synchronize(device);
    const t0 = performance.now();
    step();
    synchronize(device);
    ratios.push((performance.now() - t0) / convMs);
  }
  return ratios;
}

/** The lowest and highest of a list, and its mean. */
function spread(values: readonly number[]): { min: number; max: number; mean: number } {
  return {
    min: Math.min(...values),
    max: Math.max(...values),
    mean: values.reduce((a, b) => a + b, 0) / values.length,
  };
}

/** Starts one PyTorch variant, or says why it could not start. */
async function tryPeer(python: string, dtype: 'f32' | 'bf16', compile: boolean): Promise<TorchPeer | string> {
  try {
    return await startTorchPeer({
      python,
      dtype,
      batch,
      size,
      compile,
      startTimeoutMs: 30 * 60_000,
      stepTimeoutMs: 10 * 60_000,
    });
  } catch (e) {
    return (e as Error).message.split('\n')[0]!;
  }
}

/**
 * 8. PyTorch's CPU step (eager and torch.compile) alternated with ours, `peerRounds` rounds of
 * `peerSteps` steps each; `ourStep` runs one of our steps. Prints images/s ranges and ratios.
 */
async function torchRows(dtype: 'f32' | 'bf16', ourStep: () => unknown, ourStepMs: number): Promise<unknown> {
  const found = findTorchPython();
  if ('reason' in found) {
    console.log(`  pytorch: skipped: ${found.reason}`);
    return { dtype, skipped: found.reason };
  }
  const started = await Promise.all(peerVariants.map((v) => tryPeer(found.python, dtype, v === 'compile')));
  const peers = started.filter((p): p is TorchPeer => typeof p !== 'string');
  for (const p of started) if (typeof p === 'string') console.log(`  pytorch: a variant did not start: ${p}`);
  const rounds: Record<string, number[]> = { 'resnet-cuda': [] };
  for (const p of peers) rounds[p.impl] = [];
  try {
    for (let r = 0; r < peerRounds; r++) {
      const t0 = performance.now();
      for (let i = 0; i < peerSteps; i++) ourStep();
      rounds['resnet-cuda']!.push((performance.now() - t0) / peerSteps);
      for (const p of peers) rounds[p.impl]!.push(spread(await p.run(peerSteps)).mean);
    }
  } finally {
    for (const p of peers) p.close();
  }
  const ours = rounds['resnet-cuda']!;
  const imgs = (ms: number): number => (batch * 1000) / ms;
  console.log(
    `  beside PyTorch ${found.torch} (${peerRounds} alternated rounds of ${peerSteps} steps; img/s range over rounds; ours / peer per round):`,
  );
  const rows = Object.entries(rounds).map(([impl, ms]) => {
    const s = spread(ms);
    const perRound = ms.map((peerMs, i) => peerMs / ours[i]!);
    const ratios = impl === 'resnet-cuda' ? null : { ...spread(perRound), median: median(perRound) };
    console.log(
      `    ${impl.padEnd(16)} ${imgs(s.max).toFixed(2)}-${imgs(s.min).toFixed(2)} img/s (mean step ${s.mean.toFixed(0)} ms)${ratios ? `, ours / peer ${ratios.min.toFixed(2)}-${ratios.max.toFixed(2)}x, median ${ratios.median.toFixed(2)}x` : ''}`,
    );
    return { impl, stepMs: ms, ratioOursToPeer: ratios };
  });
  return { dtype, torch: found.torch, rounds: peerRounds, steps: peerSteps, benchStepMs: ourStepMs, rows };
}

/** Pruning's rows: a small ResNet-18 dense, magnitude-pruned and channel-pruned (bench/prune.ts). */
function pruningRows(): void {
  results.pruning = benchPruning({ depth: 18, size: 64, batch: 16, iterations, device });
}
if (values.only === undefined) pruningRows();
/**
 * 4. Gradient checkpointing: whole ResNet-50 f32 training steps (benchmarkTraining: synthetic batch
 * on the device, SGD) without checkpointing, per stage, and with every block a segment. The
 * allocator's peak of live bytes during the timed steps holds the same parameters, gradients,
 * momentum, plans and scratch memory in all three, so the differences are the activations saved.
 * Activation buffers scale with the image area, so the saving at 224 px is the measured one times
 * (224 / size)^2 (exactly so when 224 / size is a ratio the strides keep whole, as for 64, 112, 224).
 */
function benchCheckpointing(): unknown[] {
  const cBatch = integerOption('checkpoint-batch', values['checkpoint-batch'], 1);
  // ResNet-50 at batch 64 and 224 px takes minutes a step on a CPU, and about four times the 4.1 GiB
  // bench/RESULTS.md measures at batch 16: 64 px there unless asked.
  const cSize = integerOption(
    'checkpoint-size',
    values['checkpoint-size'] ?? (device.startsWith('cuda') ? '224' : '64'),
    1,
  );
  const cSteps = integerOption('checkpoint-steps', values['checkpoint-steps'], 1);
  const configs: [string, CheckpointSegments | null][] = [
    ['none', null],
    ['stage', 'stage'],
    ['every 1', { every: 1 }],
  ];
  console.log(
    `\ngradient checkpointing: ResNet-${depth} f32 training step, batch ${cBatch}, ${cSize} px, ${cSteps} timed steps after 1 warm-up step`,
  );
  console.log('  config     segments  peak live MiB   saved MiB   saved at 224 px   ms/step   step time');
  const rows: { segments: string; peakBytes: number; msPerStep: number; count: number }[] = [];
  for (const [label, segments] of configs) {
    const model = new ResNet(depth, { numClasses: 1000, seed: 1, device });
    if (segments !== null) model.checkpointing({ segments });
    const r = benchmarkTraining({
      model,
      device,
      numClasses: 1000,
      batch: cBatch,
      size: cSize,
      steps: cSteps,
      warmup: 1,
    });
    rows.push({
      segments: label,
      peakBytes: r.peakMemoryBytes,
      msPerStep: r.msPerStep,
      count: checkpointingOf(model)?.segments.length ?? 0,
    });
    model.dispose();
  }
  const mib = (bytes: number): string => (bytes / 2 ** 20).toFixed(0);
  const base = rows[0]!;
  const scale = (224 / cSize) ** 2;
  return rows.map((row) => {
    const saved = base.peakBytes - row.peakBytes;
    console.log(
      `  ${row.segments.padEnd(10)} ${String(row.count).padStart(8)} ${mib(row.peakBytes).padStart(14)} ${mib(saved).padStart(11)} ${mib(saved * scale).padStart(17)} ${row.msPerStep.toFixed(0).padStart(9)} ${(row.msPerStep / base.msPerStep).toFixed(2).padStart(10)}x`,
    );
    return {
      ...row,
      batch: cBatch,
      size: cSize,
      savedBytes: saved,
      savedBytesAt224: saved * scale,
      stepTimeRatio: row.msPerStep / base.msPerStep,
    };
  });
}
if (values.only === undefined || values.only === 'checkpointing') results.checkpointing = benchCheckpointing();

/** The inference table (bench/inference.ts): the Predictor beside ONNX Runtime, ResNet-50 at 224 px, batch 1 and 16 (CPU only). */
async function inferenceRows(): Promise<void> {
  if (device !== 'cpu' || values.only !== undefined) return;
  results.inference = await benchInference({
    depth: 50,
    size: 224,
    batches: [1, 16],
    dtypes: ['f32', 'bf16', 'int8'],
    rounds: 5,
    seconds: 1,
    quantize: int8Quantizer({ size: 224 }),
  });
}
await inferenceRows();

/**
 * 7. Data-parallel scaling on the CPU (bench/ddp.ts): 2 ranks x 1 thread with
 * DistributedDataParallel over Gloo against 1 process x 2 threads, ResNet-18 at 32 px, global
 * batch 16, a few steps: images/s and their ratio, bytes all-reduced per step, and the share of
 * the all-reduce time hidden behind backward.
 */
async function dataParallelRows(): Promise<void> {
  if (device !== 'cpu' || values.only !== undefined) return;
  const row = await benchDataParallel({ depth: 18, size: 32, batch: 16, steps: 3 });
  results.dataParallel = row;
  console.log('\nData parallel (CPU, Gloo): 2 ranks x 1 thread vs 1 process x 2 threads');
  console.table([
    {
      model: `ResNet-${row.depth} ${row.size}px batch ${row.batch}`,
      'ddp img/s': row.ddpImagesPerSec.toFixed(1),
      'single img/s': row.singleImagesPerSec.toFixed(1),
      ratio: row.ratio.toFixed(2),
      'MB all-reduced/step': (row.bytesPerStep / 1e6).toFixed(1),
      'all-reduce ms/step': row.allReduceMsPerStep.toFixed(1),
      'hidden behind backward': `${(row.hiddenShare * 100).toFixed(0)}%`,
    },
  ]);
}
await dataParallelRows();

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const outDir = join(root, 'bench', 'results');
mkdirSync(outDir, { recursive: true });
const file = join(outDir, `${new Date().toISOString().replace(/[:.]/g, '-')}-${device.replace(':', '')}.json`);
writeFileSync(file, JSON.stringify(results, null, 2) + '\n');
console.log(`\nwrote ${file}`);
