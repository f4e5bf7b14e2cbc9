/**
 * One process of the data-parallel benchmark (bench/ddp.ts): a ResNet training loop at small size
 * on the CPU, either a rank of a Gloo group with DistributedDataParallel (`ddp`) or one process
 * alone (`single`). Prints one JSON line: step times, and for `ddp` the bytes all-reduced per step
 * and how much of the all-reduce time ran while backward was still running.
 * Usage: node ddp-worker.js ddp|single DEPTH SIZE BATCH STEPS
 */
import { CrossEntropyLoss, DistributedDataParallel, ResNet, SGD, Tensor, initProcessGroup } from '../lib/index.js';
import type { CollectiveRecord } from '../lib/distributed/types.js';

const [mode, depthArg, sizeArg, batchArg, stepsArg] = process.argv.slice(2);
if (mode !== 'ddp' && mode !== 'single') throw new Error(`ddp-worker: mode must be ddp or single, got ${mode}`);
const depth = Number(depthArg) as 18 | 50;
const size = Number(sizeArg);
const batch = Number(batchArg);
const steps = Number(stepsArg);

function nowMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

/** Milliseconds of `[start, end)` that fall inside `[from, to)`. */
function overlap(start: number, end: number, from: number, to: number): number {
  return Math.max(0, Math.min(end, to) - Math.max(start, from));
}

const group = mode === 'ddp' ? initProcessGroup({ backend: 'gloo', timeoutSeconds: 120 }) : null;
const model = new ResNet(depth, { numClasses: 10, smallInput: true, seed: 1, device: 'cpu' });
const ddp = group ? new DistributedDataParallel(model, group) : null;
const loss = new CrossEntropyLoss();
const optimizer = new SGD(model, { lr: 0.01, momentum: 0.9 });
const x = Tensor.randn([batch, size, size, 3], { seed: 1 + (group?.rank ?? 0) });
const labels = Array.from({ length: batch }, (_, i) => i % 10);
const stepMs: number[] = [];
let reduceMs = 0;
let hiddenMs = 0;
let bytes = 0;
for (let step = 0; step <= steps; step++) {
  const start = nowMs();
  loss.forward(ddp ? ddp.forward(x) : model.forward(x), labels);
  const backwardStart = nowMs();
  if (ddp) ddp.backward(loss.backward());
  else model.backward(loss.backward());
  const backwardEnd = nowMs();
  if (ddp) ddp.finishGradientSync();
  optimizer.step();
  optimizer.zeroGrad();
  group?.synchronize();
  const records: CollectiveRecord[] = group ? group.takeCollectiveRecords() : [];
  if (step === 0) continue; // warm-up: plans, buffers, the first connections
  stepMs.push(nowMs() - start);
  if (ddp) bytes += ddp.bytesLastSync;
  for (const r of records) {
    if (r.op !== 'allReduce') continue;
    reduceMs += r.endMs - r.startMs;
    hiddenMs += overlap(r.startMs, r.endMs, backwardStart, backwardEnd);
  }
}
console.log(
  JSON.stringify({
    mode,
    rank: group?.rank ?? 0,
    stepMs,
    buckets: ddp?.buckets.length ?? 0,
    bytesPerStep: bytes / steps,
    reduceMsPerStep: reduceMs / steps,
    hiddenShare: reduceMs > 0 ? hiddenMs / reduceMs : 0,
  }),
);
ddp?.dispose();
group?.destroy();
