/**
 * Checks of the CUDA backend beyond the op tables, as a table that both the Node runner
 * (test/gpu/checks.ts, for GPU machines without npm) and vitest (test/cuda-emulator.test.ts, on the
 * emulated CUDA backend) execute:
 * - the backend reports the device and library versions;
 * - ResNet-50 bf16 training steps replayed from a captured CUDA graph give the same losses and
 *   parameters as eager execution;
 * - a graph stays right when a tensor from before the capture is disposed during it and when a later
 *   eager step grows the scratch buffer, and AdamW refuses to be captured;
 * - LAMB, AdamW and the gradient norm over a model's arena give the same bits twice and agree with
 *   the CPU backend;
 * - a learning rate changed at every step without a host wait reaches the device in order;
 * - an NCCL communicator with one rank all-reduces and broadcasts in place;
 * - DistributedDataParallel on that group: no host synchronisation, f32 exact, bf16 within rounding;
 * - with two devices, a model moved to cuda:1 trains as its twin on cuda:0;
 * - an impossible allocation fails with ERR_RC_OUT_OF_MEMORY naming the sizes;
 * - the Trainer trains a small-stem ResNet-18 on the generated shapes in bf16 and in fp16 with loss
 *   scaling, clipping and a moving average;
 * - the Trainer's `cudaGraph` run (warm-up, one capture, replays under a per-step learning rate)
 *   gives the eager run's losses and parameters;
 * - the driver's utilisation reading (NVML) is sane where the driver gives one and says why where it
 *   does not (the emulated device), and a Trainer epoch writes its bottleneck record either way;
 * - the inference plan (fused cuDNN convolutions) equals the CPU eval forward in f32, bf16 and f16,
 *   and its throughput at batch 1 and 256 (test/gpu/inference.ts).
 * - the fused optimizer end of a step equals the unfused ops, and both are timed (test/gpu/fused.ts).
 * `scale: 'full'` is the GPU size (ResNet-50 at 224 px, a Trainer run to 90% accuracy); `'small'`
 * keeps every code path at sizes a CPU emulating the device gets through in seconds.
 */
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  AdaptiveAvgPool2d,
  Conv2d,
  Flatten,
  ReLU,
  Sequential,
  AdamW,
  CenterCrop,
  Compose,
  CosineAnnealingLR,
  DataLoader,
  ResNet18,
  ShapesDataset,
  Trainer,
  CrossEntropyLoss,
  CudaGraph,
  LAMB,
  Linear,
  ResNet50,
  SGD,
  Tensor,
  deviceUtilization,
  gradNorm,
  listBackends,
  parameterGroups,
  synchronize,
} from '../../lib/index.js';
import { addon } from '../../lib/binding.js';
import { diagnose } from '../../lib/cli/doctor.js';
import { inferencePlanCheck } from './inference.js';
import { ddpNcclCheck } from './ddp.js';
import { fusedOptimCheck } from './fused.js';
import { gpuLoaderCheck } from './jpeg-loader.js';
import { COLLECTIVE_CASES } from '../helpers/collectives.js';
import { soloGroup } from './solo-group.js';

/** Where and how big a check runs, and where it reports details. */
export interface GpuCheckContext {
  device: string;
  scale: 'full' | 'small';
  log: (line: string) => void;
}

/** One check: throws on failure. */
export interface GpuCheck {
  name: string;
  /** CUDA devices the check needs (1 when absent); with fewer it is skipped. */
  minDevices?: number;
  run: (ctx: GpuCheckContext) => void | Promise<void>;
}

/** How many CUDA devices the backend sees. */
export function cudaDeviceCount(): number {
  return listBackends().find((b) => b.name === 'cuda')?.deviceCount ?? 0;
}

function assert(condition: boolean, message: string): asserts condition {
  if (!condition) throw new Error(message);
}

function relativeError(a: Float32Array, b: Float32Array): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.length; i++) {
    num += (a[i]! - b[i]!) ** 2;
    den += b[i]! ** 2;
  }
  return Math.sqrt(num / Math.max(den, 1e-30));
}

type Model = ReturnType<typeof ResNet18>;

/** A training step of `model` with SGD on fixed inputs, returning the loss tensor. */
function sgdStepper(
  model: Model,
  x: Tensor,
  labels: Tensor,
  options: { lr: number; momentum: number; weightDecay?: number },
  labelSmoothing = 0,
) {
  const loss = new CrossEntropyLoss({ labelSmoothing });
  const optimizer = new SGD(model, options);
  const step = () => {
    const value = loss.forward(model.forward(x), labels);
    model.backward(loss.backward());
    optimizer.step();
    optimizer.zeroGrad();
    return value;
  };
  return { model, step };
}

function labelsFor(n: number, classes: number, device: string, stride = 1): Tensor {
  return Tensor.from(
    Array.from({ length: n }, (_, i) => (i * stride) % classes),
    [n],
    { dtype: 'i32', device },
  );
}

export const gpuChecks: GpuCheck[] = [
  {
    name: 'the CUDA backend is available and reports its device',
    run: ({ log }) => {
      const cuda = listBackends().find((b) => b.name === 'cuda');
      assert(cuda?.available === true, `cuda is not available: ${cuda?.reason}`);
      log(`${cuda.device} ${JSON.stringify(cuda.properties)}`);
    },
  },
  {
    name: 'ResNet-50 bf16 steps replayed from a CUDA graph match eager steps',
    run: ({ device, scale, log }) => {
      const [batch, size] = scale === 'full' ? [32, 224] : [2, 32];
      const x = Tensor.randn([batch, size, size, 3], { seed: 3, device, dtype: 'bf16' });
      const labels = labelsFor(batch, 1000, device, 13);
      const make = () =>
        sgdStepper(ResNet50({ seed: 7, device }), x, labels, { lr: 0.05, momentum: 0.9, weightDecay: 1e-4 }, 0.1);
      const eager = make();
      const eagerLosses = [0, 1, 2].map(() => eager.step().item());
      const captured = make();
      const graphLosses = [captured.step().item()];
      // Set by the captured step; the type keeps TypeScript from taking it for null below.
      let lossTensor = null as Tensor | null;
      const graph = CudaGraph.capture(device, () => {
        lossTensor = captured.step();
      });
      assert(lossTensor !== null, 'the captured step returned no loss');
      for (let i = 0; i < 2; i++) {
        graph.replay();
        graphLosses.push(lossTensor.item());
      }
      synchronize(device);
      log(
        `eager ${eagerLosses.map((v) => v.toFixed(5)).join(' ')} | graph ${graphLosses.map((v) => v.toFixed(5)).join(' ')}`,
      );
      eagerLosses.forEach((v, i) =>
        assert(
          Number.isFinite(v) && Math.abs(v - graphLosses[i]!) <= 1e-3 * Math.abs(v),
          `step ${i}: eager loss ${v} vs graph ${graphLosses[i]}`,
        ),
      );
      const err = relativeError(
        captured.model.arena().params.toFloat32Array(),
        eager.model.arena().params.toFloat32Array(),
      );
      log(`parameters after three steps: relative difference ${err.toExponential(2)}`);
      assert(err < 1e-3, `parameters after three steps differ by ${err}`);
      graph.dispose();
    },
  },
  {
    name: 'LAMB, AdamW and the gradient norm over a model arena are deterministic and match the CPU',
    run: ({ device, scale, log }) => {
      // The same random gradients on the CPU and twice on the device; two steps of each optimizer.
      const build = (where: string) =>
        scale === 'full'
          ? ResNet50({ seed: 5, device: where })
          : ResNet18({ numClasses: 10, smallInput: true, seed: 5, device: where });
      const grads = Tensor.randn([build('cpu').arena().size], { seed: 6, std: 1e-2 }).toFloat32Array();
      const run = (where: string, kind: 'lamb' | 'adamw') => {
        const model = build(where);
        const arena = model.arena();
        const before = arena.params.toFloat32Array();
        arena.grads.raw.copyFromHost(grads);
        const groups = parameterGroups(model, { weightDecay: 0.01 });
        const optimizer = kind === 'lamb' ? new LAMB(groups, { lr: 0.01 }) : new AdamW(groups, { lr: 1e-3 });
        const norm = gradNorm(model).item();
        optimizer.step();
        optimizer.step();
        const after = arena.params.toFloat32Array();
        optimizer.dispose();
        return { norm, delta: after.map((p, i) => p - before[i]!), after };
      };
      for (const kind of ['lamb', 'adamw'] as const) {
        const cpu = run('cpu', kind);
        const first = run(device, kind);
        const second = run(device, kind);
        assert(
          first.norm === second.norm,
          `${kind}: gradient norms of two runs differ: ${first.norm} and ${second.norm}`,
        );
        assert(
          first.after.every((v, i) => Object.is(v, second.after[i])),
          `${kind}: two runs on ${device} differ`,
        );
        assert(
          Math.abs(first.norm - cpu.norm) <= 1e-5 * cpu.norm,
          `${kind}: gradient norm ${first.norm} on ${device}, ${cpu.norm} on cpu`,
        );
        const err = relativeError(first.delta, cpu.delta);
        log(`${kind}: update vs cpu ${err.toExponential(2)}, norm ${first.norm}`);
        assert(err < 1e-5, `${kind}: the update differs from the CPU's by ${err}`);
      }
    },
  },
  {
    name: 'a learning rate that changes at every step reaches the device in order, with no host wait between steps',
    run: ({ device, log }) => {
      // More steps than the backend has staging buffers for its tables: each new rate must wait for
      // the copy that last used its buffer, not overwrite it.
      const grads = Tensor.randn([32 * 64 + 32], { seed: 11, std: 0.1 }).toFloat32Array();
      const run = (where: string) => {
        const model = new Linear({ inFeatures: 64, outFeatures: 32, seed: 3 }).to(where);
        const arena = model.arena();
        arena.grads.raw.copyFromHost(grads);
        const optimizer = new SGD(model, { lr: 0.1, momentum: 0.9, weightDecay: 1e-3 });
        for (let step = 0; step < 12; step++) {
          optimizer.paramGroups[0]!.lr = 0.1 / (step + 1);
          optimizer.step();
        }
        const params = arena.params.toFloat32Array();
        optimizer.dispose();
        return params;
      };
      const err = relativeError(run(device), run('cpu'));
      log(`parameters after 12 steps vs cpu: ${err.toExponential(2)}`);
      assert(err < 1e-6, `parameters after 12 steps with a new rate at each differ from the CPU's by ${err}`);
    },
  },
  {
    name: 'an NCCL process group of one rank passes the collectives table (test/helpers/collectives.ts)',
    run: ({ device, log }) => {
      const group = soloGroup('nccl', device);
      try {
        for (const c of COLLECTIVE_CASES) {
          c.run(group);
          log(`ok: ${c.name}`);
        }
        const records = group.takeCollectiveRecords();
        assert(records.length === 0, `NCCL keeps no host records, got ${records.length}`);
        // The collective and its join are events between the compute and NCCL streams: capturable.
        const t = Tensor.from([1, 2, 3], [3], { device });
        const two = Tensor.from([2, 2, 2], [3], { device });
        const graph = CudaGraph.capture(device, () => {
          group.allReduce(t, { op: 'max' });
          group.wait();
          addon().mul({ a: t.raw, b: two.raw, out: t.raw });
        });
        graph.replay();
        graph.replay();
        const values = [...t.toFloat32Array()].join(',');
        assert(values === '4,8,12', `two replays of max-all-reduce then doubling: expected 4,8,12, got ${values}`);
        graph.dispose();
        t.dispose();
        two.dispose();
      } finally {
        group.destroy();
      }
    },
  },
  {
    name: 'a graph survives a tensor disposed during capture and a larger eager step; AdamW refuses capture',
    run: ({ device, scale, log }) => {
      const [batch, size] = scale === 'full' ? [16, 32] : [2, 8];
      const x = Tensor.randn([batch, size, size, 3], { seed: 5, device, dtype: 'bf16' });
      const labels = labelsFor(batch, 10, device);
      const make = () =>
        sgdStepper(ResNet18({ numClasses: 10, smallInput: true, seed: 4, device }), x, labels, {
          lr: 0.02,
          momentum: 0.9,
        });
      // Another model's step at 8x the batch between replays: its convolutions may need more scratch
      // than the captured ones, which replaces the scratch buffer the graph points at.
      const big = ResNet18({ numClasses: 10, smallInput: true, seed: 9, device });
      const bigX = Tensor.randn([8 * batch, size, size, 3], { seed: 6, device, dtype: 'bf16' });
      const bigStep = () => {
        const loss = new CrossEntropyLoss();
        loss.forward(big.forward(bigX), labelsFor(8 * batch, 10, device));
        big.backward(loss.backward());
        big.zeroGrad();
      };
      const eager = make();
      const eagerLosses = [0, 1, 2, 3].map(() => eager.step().item());
      const captured = make();
      const graphLosses = [captured.step().item()];
      const doomed = Tensor.zeros([1 << 20], { device });
      // Set by the captured step; the type keeps TypeScript from taking it for null below.
      let lossTensor = null as Tensor | null;
      const graph = CudaGraph.capture(device, () => {
        lossTensor = captured.step();
        doomed.dispose();
      });
      assert(lossTensor !== null, 'the captured step returned no loss');
      for (let i = 0; i < 3; i++) {
        if (i === 1) bigStep();
        graph.replay();
        graphLosses.push(lossTensor.item());
      }
      log(
        `eager ${eagerLosses.map((v) => v.toFixed(5)).join(' ')} | graph ${graphLosses.map((v) => v.toFixed(5)).join(' ')}`,
      );
      eagerLosses.forEach((v, i) =>
        assert(
          Number.isFinite(v) && Math.abs(v - graphLosses[i]!) <= 1e-3 * Math.abs(v),
          `step ${i}: eager loss ${v} vs graph ${graphLosses[i]}`,
        ),
      );
      const err = relativeError(
        captured.model.arena().params.toFloat32Array(),
        eager.model.arena().params.toFloat32Array(),
      );
      assert(err < 1e-3, `parameters after four steps differ by ${err}`);
      graph.dispose();
      const adamModel = ResNet18({ numClasses: 10, smallInput: true, seed: 4, device });
      const adam = new AdamW(adamModel, { lr: 1e-3 });
      adam.step();
      let refused: (Error & { code?: string }) | null = null;
      try {
        CudaGraph.capture(device, () => adam.step()).dispose();
      } catch (error) {
        refused = error as Error & { code?: string };
      }
      assert(
        refused?.code === 'ERR_RC_INVALID_ARGUMENT' && refused.message.includes('cannot be captured'),
        `AdamW capture: ${refused?.code} ${refused?.message}`,
      );
    },
  },
  {
    name: 'two devices: a model moved from cuda:0 to cuda:1 trains there as its twin does on cuda:0, steps interleaved',
    minDevices: 2,
    run: ({ log }) => {
      const on = (device: string) => {
        const x = Tensor.randn([4, 16, 16, 3], { seed: 21, device, dtype: 'bf16' });
        const model = ResNet18({ numClasses: 10, smallInput: true, seed: 2, device: 'cuda:0' });
        return sgdStepper(device === 'cuda:0' ? model : model.to(device), x, labelsFor(4, 10, device), {
          lr: 0.05,
          momentum: 0.9,
        });
      };
      const first = on('cuda:0');
      const second = on('cuda:1');
      const losses: number[][] = [[], []];
      for (let i = 0; i < 3; i++) {
        losses[0]!.push(first.step().item());
        losses[1]!.push(second.step().item());
      }
      log(
        `cuda:0 ${losses[0]!.map((v) => v.toFixed(5)).join(' ')} | cuda:1 ${losses[1]!.map((v) => v.toFixed(5)).join(' ')}`,
      );
      losses[0]!.forEach((v, i) =>
        assert(
          Number.isFinite(v) && Math.abs(v - losses[1]![i]!) <= 1e-3 * Math.abs(v),
          `step ${i}: ${v} on cuda:0, ${losses[1]![i]} on cuda:1`,
        ),
      );
      const err = relativeError(
        second.model.arena().params.toFloat32Array(),
        first.model.arena().params.toFloat32Array(),
      );
      assert(err < 1e-3, `parameters after three steps differ by ${err}`);
    },
  },
  {
    name: 'an impossible allocation fails with ERR_RC_OUT_OF_MEMORY naming the sizes',
    run: ({ device }) => {
      try {
        Tensor.empty([1 << 30, 1 << 12], { dtype: 'u8', device });
        throw new Error('a 4 TiB allocation succeeded');
      } catch (error) {
        const e = error as Error & { code?: string };
        assert(e.code === 'ERR_RC_OUT_OF_MEMORY', `expected ERR_RC_OUT_OF_MEMORY, got ${e.code}: ${e.message}`);
        assert(
          e.message.includes('tried to allocate') && e.message.includes('free'),
          `message lacks sizes: ${e.message}`,
        );
      }
    },
  },
  {
    name: 'the Trainer trains a small-stem ResNet-18 in bf16, and in fp16 with loss scaling, clipping and EMA',
    run: async ({ device, scale, log }) => {
      const full = scale === 'full';
      const transform = () => new Compose([new CenterCrop({ size: 32 })]);
      for (const amp of ['bf16', 'fp16'] as const) {
        const model = ResNet18({ numClasses: 4, smallInput: true, seed: 1, device });
        const optimizer = new SGD(parameterGroups(model, { weightDecay: 5e-4 }), {
          lr: 0.01,
          momentum: 0.9,
          nesterov: true,
        });
        const train = new DataLoader(new ShapesDataset({ length: full ? 3200 : 16, size: 32, classes: 4, seed: 1 }), {
          batchSize: full ? 32 : 8,
          transform: transform(),
          workers: 0,
          shuffle: true,
          seed: 1,
        });
        const val = new DataLoader(new ShapesDataset({ length: full ? 512 : 8, size: 32, classes: 4, seed: 2 }), {
          batchSize: full ? 128 : 8,
          transform: transform(),
          workers: 0,
          seed: 1,
        });
        const trainer = new Trainer({
          model,
          optimizer,
          amp,
          device,
          clipGradNorm: 5,
          ema: { decay: 0.98 },
          progress: false,
          labelSmoothing: 0.05,
          normalize: { mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] },
          schedule: new CosineAnnealingLR({ tMax: 100 }),
        });
        const result = await trainer.fit(train, { epochs: 1, val });
        const { lastEval, lastEvalEma } = result;
        assert(lastEval !== undefined && lastEvalEma !== undefined, `${amp}: the run ended without an evaluation`);
        const acc = lastEval.acc1;
        log(
          `${amp}: ${result.steps} steps, val acc@1 ${(100 * acc).toFixed(1)}%, ema ${(100 * lastEvalEma.acc1).toFixed(1)}%, loss scale ${trainer.scaler.lossScale}`,
        );
        // The small run is too short to learn the task: it checks that every part of the step runs
        // and stays finite.
        if (full) assert(acc >= 0.9, `${amp}: validation accuracy ${acc} below 0.9`);
        assert(Number.isFinite(lastEval.loss), `${amp}: validation loss ${lastEval.loss}`);
        assert(
          trainer.scaler.enabled === (amp === 'fp16'),
          `${amp}: the GradScaler should be ${amp === 'fp16' ? 'on' : 'off'}`,
        );
        await trainer.dispose();
        await train.close();
        await val.close();
      }
    },
  },
  {
    name: "the Trainer's cudaGraph: a small-stem ResNet-18 bf16 run replayed from one captured step matches the eager run",
    run: async ({ device, scale, log }) => {
      const full = scale === 'full';
      // Each run: eager warm-up steps, one capture, replays with a learning rate changing every step.
      const run = async (cudaGraph: boolean) => {
        const model = ResNet18({ numClasses: 4, smallInput: true, seed: 1, device });
        const optimizer = new SGD(parameterGroups(model, { weightDecay: 5e-4 }), { lr: 0.05, momentum: 0.9 });
        const train = new DataLoader(new ShapesDataset({ length: full ? 640 : 16, size: full ? 32 : 8, seed: 1 }), {
          batchSize: full ? 64 : 4,
          workers: 0,
          shuffle: true,
          seed: 1,
        });
        const losses: number[] = [];
        const trainer = new Trainer({
          model,
          optimizer,
          amp: 'bf16',
          device,
          progress: false,
          jsonLog: false,
          tensorboard: false,
          plots: false,
          normalize: { mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25] },
          schedule: new CosineAnnealingLR({ tMax: 10 }),
          ...(cudaGraph ? { cudaGraph: { warmup: 2 } } : {}),
          callbacks: [{ onStepEnd: (_t, info) => void losses.push(info.loss()) }],
        });
        await trainer.fit(train, { epochs: 1 });
        const stats = trainer.cudaGraphStats;
        const params = model.arena().params.toFloat32Array();
        await trainer.dispose();
        await train.close();
        return { losses, params, stats };
      };
      const eager = await run(false);
      const graph = await run(true);
      log(
        `eager ${eager.losses.map((v) => v.toFixed(5)).join(' ')} | graph ${graph.losses.map((v) => v.toFixed(5)).join(' ')}`,
      );
      const steps = eager.losses.length;
      assert(
        graph.stats?.captures === 1 && graph.stats.replays === steps - 2 && graph.stats.reasons.length === 0,
        `graph stats ${JSON.stringify(graph.stats)} for ${steps} steps`,
      );
      // The emulated device runs the same kernels on the same values; a GPU's cuDNN may pick other
      // algorithms for the two models, so there the runs agree within bf16 training noise.
      const tolerance = full ? 5e-2 : 1e-6;
      eager.losses.forEach((v, i) =>
        assert(
          Number.isFinite(v) && Math.abs(v - graph.losses[i]!) <= tolerance * Math.abs(v),
          `step ${i}: eager loss ${v} vs graph ${graph.losses[i]}`,
        ),
      );
      const err = relativeError(graph.params, eager.params);
      assert(err <= tolerance, `parameters after ${steps} steps differ by ${err}`);
    },
  },
  {
    name: "the driver's utilisation reading (NVML), or why there is none; a Trainer epoch's bottleneck record",
    run: async ({ device, scale, log }) => {
      const reading = deviceUtilization(device);
      log(JSON.stringify(reading));
      if (reading.available) {
        assert(reading.gpuPercent >= 0 && reading.gpuPercent <= 100, `gpuPercent ${reading.gpuPercent}`);
        assert(
          reading.memoryUsedBytes > 0 && reading.memoryUsedBytes <= reading.memoryTotalBytes,
          `memory used ${reading.memoryUsedBytes} of ${reading.memoryTotalBytes}`,
        );
      } else {
        assert((reading.reason ?? '').length > 0, 'no reading and no reason');
      }
      // doctor reports the same, and a missing reading as a note with the reason.
      const doctor = await diagnose();
      const cuda = doctor.backends.find((b) => b.name === 'cuda');
      assert(cuda?.utilization?.available === reading.available, `doctor: ${JSON.stringify(cuda?.utilization)}`);
      assert(
        reading.available || doctor.problems.some((p) => p.message.includes(reading.reason ?? '?')),
        'doctor gives no note for the missing reading',
      );
      const out = mkdtempSync(join(tmpdir(), 'resnet-cuda-gpu-bottleneck-'));
      const full = scale === 'full';
      // The small size: a two-layer network, which the emulated device gets through in seconds.
      const model = full
        ? ResNet18({ numClasses: 4, smallInput: true, seed: 1, device })
        : new Sequential(
            new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 3, padding: 1, seed: 1 }),
            new ReLU(),
            new AdaptiveAvgPool2d(1),
            new Flatten(),
            new Linear({ inFeatures: 8, outFeatures: 4, seed: 2 }),
          ).to(device);
      const trainer = new Trainer({
        model,
        optimizer: new SGD(model, { lr: 0.01, momentum: 0.9 }),
        amp: 'bf16',
        device,
        outDir: out,
        plots: false,
        checkpoint: false,
        progress: false,
        logEvery: 1,
      });
      const train = new DataLoader(
        new ShapesDataset({ length: full ? 1280 : 24, size: full ? 32 : 8, classes: 4, seed: 1 }),
        {
          batchSize: full ? 64 : 8,
          transform: new Compose([new CenterCrop({ size: full ? 32 : 8 })]),
          workers: 0,
        },
      );
      try {
        await trainer.fit(train, { epochs: 1 });
        const records = readFileSync(join(out, 'log.jsonl'), 'utf8')
          .trim()
          .split('\n')
          .map((l) => JSON.parse(l) as Record<string, unknown>);
        const report = records.find((r) => r.type === 'bottleneck') as
          { kind: string; summary: string; measurements: { deviceSource: string; syncsPerStep: number } } | undefined;
        assert(report !== undefined, 'no bottleneck record in log.jsonl');
        log(report.summary);
        // Every step copies its batch to the device, which waits for the device's queue; the loss is read at every step.
        assert(report.measurements.syncsPerStep >= 2, `syncs per step ${report.measurements.syncsPerStep}`);
        const events = readdirSync(join(out, 'tensorboard'))
          .map((f) => readFileSync(join(out, 'tensorboard', f)).toString('latin1'))
          .join('');
        if (reading.available) {
          assert(report.measurements.deviceSource === 'nvml', `device time from ${report.measurements.deviceSource}`);
          assert(events.includes('gpu/utilization') && events.includes('gpu/memory_used'), 'no gpu/* scalars');
        } else {
          assert(report.measurements.deviceSource === 'waits', `device time from ${report.measurements.deviceSource}`);
          const monitor = records.find((r) => r.type === 'gpu-monitor');
          assert(
            monitor?.available === false && monitor.reason === reading.reason,
            'no gpu-monitor record with the reason',
          );
          assert(!events.includes('gpu/utilization'), 'gpu/* scalars without a reading');
        }
      } finally {
        await trainer.dispose();
        await train.close();
        rmSync(out, { recursive: true, force: true });
      }
    },
  },
  inferencePlanCheck,
  ddpNcclCheck,
  fusedOptimCheck,
  gpuLoaderCheck,
];
