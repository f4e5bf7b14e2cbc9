/**
 * Pruning's effect on a model: parameters, non-zero parameters, MACs (from the model summary) and
 * the forward + backward time of a dense model, of the same model with 80% of its weights pruned by
 * global magnitude (same shapes: dense kernels run as before), and of channel-pruned models (30%
 * and 50% of the blocks' inner channels removed).
 *
 * `node dist/bench/prune.js [OPTIONS]` (`--help` lists them); `npm run bench` runs it at its
 * defaults after the ResNet-50 step.
 * @packageDocumentation
 */
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import {
  CrossEntropyLoss,
  MagnitudePruner,
  ResNet,
  Tensor,
  pruneChannels,
  weightSparsity,
  type ResNetDepth,
} from '../lib/index.js';
import { integerOption, parseOptions } from './options.js';

const USAGE = `Usage: node dist/bench/prune.js [OPTIONS]

  --depth D          ResNet depth [18]
  --size PX          image size; the small-image stem up to 64 [64]
  --batch N          batch size [16]
  --iterations N     timed forward + backward passes [5]
  --device D         cpu or cuda[:i] [cpu]
  -h, --help         print this help
`;

/** What {@link benchPruning} measures. */
export interface PruningBenchOptions {
  depth: ResNetDepth;
  /** Image size; the small-image stem is used up to 64 px, as `train` does. */
  size: number;
  batch: number;
  /** Timed forward + backward passes (after one untimed). */
  iterations: number;
  device: string;
}

/** One model of the table. */
export interface PruningBenchRow {
  model: string;
  params: number;
  nonzeroParams: number;
  gmacs: number;
  /** Median forward + backward time, ms. */
  forwardBackwardMs: number;
}

function nonzero(model: ResNet): number {
  let n = 0;
  for (const p of model.parameters()) for (const v of p.values()) if (v !== 0) n++;
  return n;
}

function timeForwardBackward(model: ResNet, o: PruningBenchOptions): number {
  const x = Tensor.randn([o.batch, o.size, o.size, 3], { seed: 2, device: o.device });
  const labels = Tensor.from(
    Array.from({ length: o.batch }, (_, i) => i % 10),
    [o.batch],
    { dtype: 'i32', device: o.device },
  );
  const loss = new CrossEntropyLoss();
  const pass = (): Tensor => {
    const value = loss.forward(model.forward(x), labels);
    model.backward(loss.backward());
    model.zeroGrad();
    return value;
  };
  pass().item();
  const times: number[] = [];
  for (let i = 0; i < o.iterations; i++) {
    const start = performance.now();
    pass().item(); // reading the loss waits for the device
    times.push(performance.now() - start);
  }
  x.dispose();
  labels.dispose();
  loss.dispose();
  model.releaseBuffers();
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)] ?? Number.NaN;
}

/** Measures the dense, magnitude-pruned and channel-pruned models and prints a table. */
export function benchPruning(o: PruningBenchOptions): PruningBenchRow[] {
  const smallInput = o.size <= 64;
  const rows: PruningBenchRow[] = [];
  const measure = (name: string, model: ResNet): void => {
    const s = model.summary({ inputSize: o.size, batchSize: 1 });
    rows.push({
      model: name,
      params: s.totalParams,
      nonzeroParams: nonzero(model),
      gmacs: s.macs / 1e9,
      forwardBackwardMs: timeForwardBackward(model, o),
    });
  };
  const dense = new ResNet(o.depth, { numClasses: 10, smallInput, seed: 1, device: o.device });
  measure(`ResNet-${o.depth} dense`, dense);
  for (const amount of [0.3, 0.5]) {
    const slim = pruneChannels(dense, { amount });
    measure(`channels -${amount * 100}% (l1)`, slim);
    slim.dispose();
  }
  const pruner = new MagnitudePruner(dense);
  pruner.prune(0.8);
  pruner.dispose();
  measure(`magnitude ${(100 * weightSparsity(dense)).toFixed(0)}% (global)`, dense);
  dense.dispose();

  console.log(
    `\npruning: ResNet-${o.depth}${smallInput ? ' (small-image stem)' : ''}, ${o.size} px, batch ${o.batch}, f32, ${o.device}; forward + backward, median of ${o.iterations}`,
  );
  console.log('  model                      params   non-zero   GMACs/img   fwd+bwd ms');
  for (const r of rows) {
    console.log(
      `  ${r.model.padEnd(24)} ${(r.params / 1e6).toFixed(2).padStart(7)}M ${(r.nonzeroParams / 1e6).toFixed(2).padStart(9)}M ${r.gmacs.toFixed(3).padStart(11)} ${r.forwardBackwardMs.toFixed(1).padStart(12)}`,
    );
  }
  return rows;
}

function isEntryPoint(): boolean {
  const script = process.argv[1];
  if (script === undefined) return false;
  try {
    return realpathSync(script) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
}

if (isEntryPoint()) {
  const values = parseOptions(
    () =>
      parseArgs({
        options: {
          depth: { type: 'string', default: '18' },
          size: { type: 'string', default: '64' },
          batch: { type: 'string', default: '16' },
          iterations: { type: 'string', default: '5' },
          device: { type: 'string', default: 'cpu' },
          help: { type: 'boolean', short: 'h' },
        },
      }),
    USAGE,
  );
  benchPruning({
    depth: integerOption('depth', values.depth, 1) as ResNetDepth,
    size: integerOption('size', values.size, 1),
    batch: integerOption('batch', values.batch, 1),
    iterations: integerOption('iterations', values.iterations, 1),
    device: values.device,
  });
}
