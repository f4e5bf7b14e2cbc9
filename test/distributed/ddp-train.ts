/**
 * Rank script of test/distributed-ddp.test.ts: DistributedDataParallel over a real Gloo group.
 * Each rank starts from its own seed (the construction's broadcast must make them equal), trains
 * on its share (images [2 rank, 2 rank + 2)) and writes what the test compares with one process on
 * all the images: the gradients of 2 synced steps and the weights after them, the gradients of a
 * noSync accumulation of 2 micro-batches of 1, the gradients with bf16 compression, the GradScaler's
 * verdict when only rank 1 overflows, the times of the first step's all-reduces and backward, and
 * the running statistics before and after a training-mode forward broadcast rank 0's.
 * Usage: node ddp-train.js OUT_DIR
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CrossEntropyLoss, GradScaler, SGD, type Tensor } from '../../lib/index.js';
import { DistributedDataParallel } from '../../lib/distributed/ddp.js';
import { initProcessGroup } from '../../lib/distributed/process-group.js';
import { grads, images, labels, smallResNet } from '../helpers/ddp-fixtures.js';

const outDir = process.argv[2] ?? '';
if (outDir === '') throw new Error('usage: ddp-train.js OUT_DIR');
const group = initProcessGroup({ backend: 'gloo', timeoutSeconds: 60 });
const rank = group.rank;

function save(name: string, arrays: Float32Array[]): void {
  const total = arrays.reduce((n, a) => n + a.length, 0);
  const flat = new Float32Array(total);
  let at = 0;
  for (const a of arrays) {
    flat.set(a, at);
    at += a.length;
  }
  writeFileSync(join(outDir, `${name}-rank${rank}.f32`), flat);
}

function nowMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

/** A fresh model from this rank's own seed, wrapped. */
function replica(options: ConstructorParameters<typeof DistributedDataParallel>[2]): DistributedDataParallel {
  return new DistributedDataParallel(smallResNet(1 + rank * 100).eval(), group, options);
}

/** Forward and backward of `count` images from `from` through `ddp`. */
function pass(ddp: DistributedDataParallel, loss: CrossEntropyLoss, from: number, count: number): void {
  const x: Tensor = images(from, count);
  loss.forward(ddp.forward(x), labels(from, count));
  ddp.backward(loss.backward());
  x.dispose();
}

const report: Record<string, unknown> = { rank };

// Two synced steps, the all-reduce times of the first.
{
  const ddp = replica({ bucketCapMb: 0.1 });
  report.buckets = ddp.buckets.length;
  group.takeCollectiveRecords();
  const loss = new CrossEntropyLoss();
  const optimizer = new SGD(ddp.module, { lr: 0.1, momentum: 0.9 });
  for (let step = 0; step < 2; step++) {
    const backwardStartMs = nowMs();
    pass(ddp, loss, rank * 2, 2);
    const backwardEndMs = nowMs();
    ddp.finishGradientSync();
    if (step === 0) {
      const records = group.takeCollectiveRecords().filter((r) => r.op === 'allReduce');
      report.timing = { backwardStartMs, backwardEndMs, records };
      report.bytesLastSync = ddp.bytesLastSync;
    }
    save(`grads-step${step}`, grads(ddp.module));
    optimizer.step();
    optimizer.zeroGrad();
  }
  save(
    'weights',
    ddp.module.parameters().map((p) => p.values()),
  );
  ddp.dispose();
}

// Accumulation: a noSync micro-batch of 1, then a synced one.
{
  const ddp = replica({ bucketCapMb: 1 });
  const loss = new CrossEntropyLoss();
  loss.gradScale = 0.5;
  ddp.noSync(() => pass(ddp, loss, rank * 2, 1));
  pass(ddp, loss, rank * 2 + 1, 1);
  ddp.finishGradientSync();
  save('grads-nosync', grads(ddp.module));
  ddp.dispose();
}

// bf16 compression.
{
  const ddp = replica({ gradientCompression: 'bf16', bucketCapMb: 0.5 });
  pass(ddp, new CrossEntropyLoss(), rank * 2, 2);
  ddp.finishGradientSync();
  save('grads-bf16', grads(ddp.module));
  report.bf16Bytes = ddp.bytesLastSync;
  ddp.dispose();
}

// The GradScaler when only rank 1's gradients overflow (one input value at infinity), then a clean step.
{
  const ddp = replica({});
  const loss = new CrossEntropyLoss();
  const scaler = new GradScaler({ initScale: 1024 });
  const optimizer = new SGD(ddp.module, { lr: 0.1 });
  const verdicts: { skipped: boolean; scale: number; steps: number }[] = [];
  for (const overflow of [true, false]) {
    const x = images(rank * 2, 2);
    if (overflow && rank === 1) {
      const values = x.toFloat32Array();
      values[5] = Infinity;
      x.copyFromHost(values);
    }
    scaler.scale(loss);
    loss.forward(ddp.forward(x), labels(rank * 2, 2));
    ddp.backward(loss.backward());
    ddp.finishGradientSync();
    scaler.step(optimizer);
    scaler.update();
    optimizer.zeroGrad();
    verdicts.push({ skipped: scaler.skippedLastStep, scale: scaler.lossScale, steps: optimizer.stepCount });
    x.dispose();
  }
  report.scaler = verdicts;
  save(
    'weights-scaler',
    ddp.module.parameters().map((p) => p.values()),
  );
  ddp.dispose();
}

// Buffers in training mode: each rank's own batch moves its running statistics apart; the next
// forward broadcasts rank 0's first, so the same batch on both ranks leaves them equal.
{
  const ddp = replica({});
  ddp.module.train();
  const loss = new CrossEntropyLoss();
  const buffers = (): Float32Array[] => ddp.module.namedBuffers().map(([, t]) => t.toFloat32Array());
  pass(ddp, loss, rank * 2, 2);
  ddp.finishGradientSync();
  save('buffers-diverged', buffers());
  pass(ddp, loss, 0, 2);
  ddp.finishGradientSync();
  save('buffers-synced', buffers());
  ddp.dispose();
}

group.destroy();
console.log(JSON.stringify(report));
