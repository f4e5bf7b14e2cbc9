/**
 * DistributedDataParallel on the CPU, against a loopback test double of ProcessGroup (every rank in
 * this process; each collective runs when the last rank enqueues it): the bucket layout of
 * ResNet-18/50 against the rule it follows, the post-backward hooks, buckets enqueued during
 * backward in bucket order, 2 ranks x batch b against 1 process x batch 2b (BatchNorm in eval mode,
 * so that batch statistics play no part), noSync accumulation, bf16 compression, the GradScaler
 * skipping on every rank when one rank overflows, frozen and unused parameters, and bad input.
 *
 * Tolerance of the f32 comparisons: the averaged gradients are sums over the same samples in
 * another order (per rank, then across ranks), so they differ from the one-process gradients by
 * rounding only: |a - b| <= 1e-5 * (1 + max |b|) per tensor.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  CrossEntropyLoss,
  GradScaler,
  Linear,
  Module,
  ResNet,
  ResNet18,
  ResNet50,
  SGD,
  Tensor,
  type Parameter,
} from '../lib/index.js';
import { planBuckets } from '../lib/distributed/buckets.js';
import { DistributedDataParallel } from '../lib/distributed/ddp.js';
import type { ProcessGroup } from '../lib/distributed/types.js';
import { grads, images, labels, referenceSteps, smallResNet } from './helpers/ddp-fixtures.js';
import { lookup } from './helpers/defined.js';
import { loopbackGroups } from './helpers/loopback-group.js';
import { rankScript, runRanks, type RankRun } from './helpers/ranks.js';
import { soloGroup } from './gpu/solo-group.js';

const MiB = 1024 * 1024;

/** Whether two arrays hold the same values (one expect instead of one per element). */
function same(a: Float32Array, b: Float32Array): boolean {
  return a.length === b.length && a.every((v, i) => Object.is(v, b[i]));
}

function maxAbs(a: Float32Array): number {
  let m = 0;
  for (const v of a) m = Math.max(m, Math.abs(v));
  return m;
}

/** Every pair of tensors within `rel * (1 + max |expected|)`. */
function expectClose(actual: Float32Array[], expected: Float32Array[], rel: number): void {
  expect(actual.length).toBe(expected.length);
  actual.forEach((a, t) => {
    const e = expected[t]!;
    const bound = rel * (1 + maxAbs(e));
    let worst = 0;
    for (let i = 0; i < e.length; i++) worst = Math.max(worst, Math.abs(a[i]! - e[i]!));
    expect(worst, `tensor ${t}`).toBeLessThanOrEqual(bound);
  });
}

/**
 * bf16 keeps 8 significant bits (unit roundoff 2^-8): each rank's gradient is rounded once before
 * the average and the average once more, so each element is within
 * 2^-8 * ((|g0| + |g1|) / 2 + |average|) of the f32 average, g0 and g1 being the ranks' own
 * gradients. Also checks that the result is not simply the f32 one.
 */
function expectBf16Close(actual: Float32Array[], average: Float32Array[], own: Float32Array[][]): void {
  let worst = 0;
  let differs = false;
  actual.forEach((a, t) => {
    const e = average[t]!;
    const [g0, g1] = [own[0]![t]!, own[1]![t]!];
    const slack = 1e-6 * (1 + maxAbs(e));
    for (let i = 0; i < e.length; i++) {
      const err = Math.abs(a[i]! - e[i]!);
      const bound = 2 ** -8 * ((Math.abs(g0[i]!) + Math.abs(g1[i]!)) / 2 + Math.abs(e[i]!)) + slack;
      worst = Math.max(worst, err / bound);
      differs ||= err > 1e-5 * (1 + maxAbs(e));
    }
  });
  expect(worst).toBeLessThanOrEqual(1);
  expect(differs).toBe(true);
}

/** A rank of a loopback job: its own model (a different seed: the broadcast must fix it), loss, optimizer. */
interface Rank {
  model: ResNet;
  ddp: DistributedDataParallel;
  loss: CrossEntropyLoss;
  optimizer: SGD;
}

function ranks(worldSize: number, options: ConstructorParameters<typeof DistributedDataParallel>[2] = {}): Rank[] {
  const { groups } = loopbackGroups(worldSize);
  const models = groups.map((_, r) => smallResNet(1 + r * 100).eval());
  // The constructors broadcast together: each rank's broadcast runs when the last rank enqueues it.
  const ddps = constructTogether(models, groups, options);
  return models.map((model, r) => ({
    model,
    ddp: ddps[r]!,
    loss: new CrossEntropyLoss(),
    optimizer: new SGD(model, { lr: 0.1, momentum: 0.9 }),
  }));
}

/**
 * Constructs one DistributedDataParallel per rank. Real ranks construct theirs at the same time in
 * their own processes; here rank r's broadcasts wait for the other ranks' in the double's queues,
 * and `wait()` would throw for the ranks constructed first, so those get a group whose `wait()` is
 * deferred to after the last rank's construction.
 */
function constructTogether(
  models: Module[],
  groups: ProcessGroup[],
  options: ConstructorParameters<typeof DistributedDataParallel>[2],
): DistributedDataParallel[] {
  return models.map((model, r) => {
    const group = groups[r]!;
    if (r === models.length - 1) return new DistributedDataParallel(model, group, options);
    const wait = group.wait.bind(group);
    group.wait = () => undefined;
    const ddp = new DistributedDataParallel(model, group, options);
    group.wait = wait;
    return ddp;
  });
}

describe('gradient buckets', () => {
  /** The rule, restated: reverse arena order, close a bucket at >= cap bytes. */
  function expectedSizes(params: readonly Parameter[], arenaSize: number, capBytes: number): number[] {
    const sorted = [...params].sort((a, b) => a.offset - b.offset);
    const sizes: number[] = [];
    let open = 0;
    for (let i = sorted.length - 1; i >= 0; i--) {
      const end = i + 1 < sorted.length ? sorted[i + 1]!.offset : arenaSize;
      open += end - sorted[i]!.offset;
      if (open * 4 >= capBytes) {
        sizes.push(open);
        open = 0;
      }
    }
    if (open > 0) sizes.push(open);
    return sizes;
  }

  for (const [name, make] of [
    ['ResNet-18', ResNet18],
    ['ResNet-50', ResNet50],
  ] as const) {
    it(`${name}: contiguous ranges in backward order, cut at parameters, about the cap`, () => {
      const model = make({ numClasses: 1000, seed: 1 });
      const arena = model.arena();
      const names = new Map(model.namedParameters().map(([n, p]) => [p, n]));
      for (const capMb of [25, 4]) {
        const buckets = planBuckets(arena, capMb * MiB);
        expect(buckets.map((b) => b.length)).toEqual(expectedSizes(arena.entries, arena.size, capMb * MiB));
        // Backward order: the classifier first, the stem last.
        expect(buckets[0]!.parameters.map((p) => names.get(p))).toContain('fc.weight');
        expect(buckets[buckets.length - 1]!.parameters.map((p) => names.get(p))).toContain('conv1.weight');
        let end = arena.size;
        for (const b of buckets) {
          expect(b.offset + b.length).toBe(end);
          expect(b.offset).toBe(b.parameters[0]!.offset);
          expect(b.offset % 16).toBe(0);
          // Each bucket but the last reaches the cap, and would not without its last-added parameter.
          if (b !== buckets.at(-1)) expect(b.length * 4).toBeGreaterThanOrEqual(capMb * MiB);
          if (b.parameters.length > 1) expect((end - b.parameters[1]!.offset) * 4).toBeLessThan(capMb * MiB);
          end = b.offset;
        }
        expect(end).toBe(0);
        expect(buckets.flatMap((b) => b.parameters).length).toBe(arena.entries.length);
      }
      // ResNet-18 has 11.7 M parameters (46.8 MB): two 25 MiB buckets; ResNet-50 25.6 M: four.
      expect(planBuckets(arena, 25 * MiB).length).toBe(name === 'ResNet-18' ? 2 : 4);
      model.dispose();
    });
  }
});

describe('post-backward hooks', () => {
  it('run after each module backward, children before their container, and can be removed', () => {
    const model = smallResNet(1);
    const seen: string[] = [];
    const names = new Map(model.namedModules().map(([n, m]) => [m, n]));
    const handles = model
      .namedModules()
      .map(([, m]) => m.registerPostBackwardHook((mod) => seen.push(lookup(names, mod))));
    const loss = new CrossEntropyLoss();
    const x = images(0, 2);
    loss.forward(model.forward(x), labels(0, 2));
    model.backward(loss.backward());
    expect(seen[0]).toBe('fc');
    expect(seen.at(-1)).toBe('');
    expect(seen.indexOf('layer4.1.bn2')).toBeLessThan(seen.indexOf('layer4.1.conv2'));
    expect(seen.indexOf('layer4.1')).toBeLessThan(seen.indexOf('layer4.0.bn2'));
    expect(seen.indexOf('conv1')).toBeGreaterThan(seen.indexOf('layer1'));
    expect(new Set(seen).size).toBe(names.size);
    for (const h of handles) {
      h.remove();
      h.remove();
    }
    seen.length = 0;
    loss.forward(model.forward(x), labels(0, 2));
    model.backward(loss.backward());
    expect(seen).toEqual([]);
    expect(() => model.registerPostBackwardHook(42 as never)).toThrow(/hook/);
    model.dispose();
  });
});

describe('DistributedDataParallel (loopback group)', () => {
  it('broadcasts rank 0 parameters and buffers at construction', () => {
    const rs = ranks(2);
    const [r0, r1] = [rs[0]!, rs[1]!];
    expect(same(r1.model.arena().params.toFloat32Array(), r0.model.arena().params.toFloat32Array())).toBe(true);
    const b0 = r0.model.namedBuffers().map(([, t]) => t.toFloat32Array());
    const b1 = r1.model.namedBuffers().map(([, t]) => t.toFloat32Array());
    expect(b1).toEqual(b0);
    expect(same(smallResNet(101).arena().params.toFloat32Array(), r0.model.arena().params.toFloat32Array())).toBe(
      false,
    );
  });

  it('2 ranks x batch 2 give the gradients and weights of 1 process x batch 4, over 2 steps', () => {
    const reference = referenceSteps(2, 4);
    const rs = ranks(2);
    for (let step = 0; step < 2; step++) {
      rs.forEach((r, rank) => {
        const x = images(rank * 2, 2);
        r.loss.forward(r.ddp.forward(x), labels(rank * 2, 2));
        r.ddp.backward(r.loss.backward());
        x.dispose();
      });
      for (const r of rs) r.ddp.finishGradientSync();
      for (const r of rs) expectClose(grads(r.model), reference.grads[step]!, 1e-5);
      for (const r of rs) {
        r.optimizer.step();
        r.optimizer.zeroGrad();
      }
    }
    for (const r of rs) {
      expectClose(
        r.model.parameters().map((p) => p.values()),
        reference.weights,
        1e-5,
      );
    }
    expect(rs[0]!.ddp.bytesLastSync).toBe(rs[0]!.model.arena().size * 4);
  });

  it('noSync: 2 micro-batches of 1 per rank accumulate locally and reduce once, as 1 batch of 4', () => {
    const reference = referenceSteps(1, 4);
    const { groups, log } = loopbackGroups(2);
    const models = groups.map((_, r) => smallResNet(1 + r).eval());
    const ddps = constructTogether(models, groups, { bucketCapMb: 1 });
    const losses = models.map(() => new CrossEntropyLoss());
    const constructionCalls = log.length;
    models.forEach((_, rank) => {
      const ddp = ddps[rank]!;
      const loss = losses[rank]!;
      loss.gradScale = 0.5;
      const micro = (i: number): void => {
        const x = images(rank * 2 + i, 1);
        loss.forward(ddp.forward(x), labels(rank * 2 + i, 1));
        ddp.backward(loss.backward());
        x.dispose();
      };
      const result = ddp.noSync(() => {
        micro(0);
        return 'done';
      });
      expect(result).toBe('done');
      expect(ddp.syncGradients).toBe(true);
      expect(log.length).toBe(constructionCalls + rank * ddp.buckets.length);
      micro(1);
    });
    for (const ddp of ddps) ddp.finishGradientSync();
    for (const model of models) expectClose(grads(model), reference.grads[0]!, 1e-5);
    expect(log.length - constructionCalls).toBe(2 * ddps[0]!.buckets.length);
  });

  it('noSync restores the flag after a throwing or asynchronous body', async () => {
    const r = ranks(1)[0]!;
    expect(() =>
      r.ddp.noSync(() => {
        throw new Error('boom');
      }),
    ).toThrow('boom');
    expect(r.ddp.syncGradients).toBe(true);
    const pending = r.ddp.noSync(async () => {
      await Promise.resolve();
      return r.ddp.syncGradients;
    });
    expect(r.ddp.syncGradients).toBe(false);
    expect(await pending).toBe(false);
    expect(r.ddp.syncGradients).toBe(true);
    r.ddp.syncGradients = false;
    expect(() => r.ddp.finishGradientSync()).toThrow(/noSync/);
  });

  it('enqueues the buckets during backward, in bucket order, the first well before backward ends', () => {
    const { groups, log } = loopbackGroups(1);
    const model = smallResNet(1).eval();
    const ddp = new DistributedDataParallel(model, groups[0]!, { bucketCapMb: 0.1 });
    expect(ddp.buckets.length).toBeGreaterThan(4);
    groups[0]!.takeCollectiveRecords();
    log.length = 0;
    const loss = new CrossEntropyLoss();
    const x = images(0, 2);
    loss.forward(ddp.forward(x), labels(0, 2));
    ddp.backward(loss.backward());
    const backwardEndMs = Number(process.hrtime.bigint()) / 1e6;
    expect(log.map((c) => c.numel)).toEqual(ddp.buckets.map((b) => b.length));
    expect(log.every((c) => c.op === 'allReduce' && c.reduce === 'avg' && c.atMs < backwardEndMs)).toBe(true);
    ddp.finishGradientSync();
    const records = groups[0]!.takeCollectiveRecords();
    expect(records.length).toBe(ddp.buckets.length);
    expect(records[0]!.startMs).toBeLessThan(backwardEndMs);
    // The first bucket (fc, layer4.1) is ready long before the stem's gradients are computed.
    expect(records[0]!.startMs).toBeLessThan(records[records.length - 1]!.startMs);
    // A second synced backward without finishGradientSync is refused.
    loss.forward(ddp.forward(x), labels(0, 2));
    ddp.backward(loss.backward());
    expect(() => ddp.forward(x)).toThrow(/finishGradientSync/);
    loss.forward(model.forward(x), labels(0, 2));
    expect(() => model.backward(loss.backward())).toThrow(/second synced backward/);
    ddp.finishGradientSync();
    ddp.dispose();
  });

  it('bf16 compression: gradients within bf16 rounding of the f32 average', () => {
    const reference = referenceSteps(1, 4);
    const rs = ranks(2, { gradientCompression: 'bf16', bucketCapMb: 2 });
    rs.forEach((r, rank) => {
      const x = images(rank * 2, 2);
      r.loss.forward(r.ddp.forward(x), labels(rank * 2, 2));
      r.ddp.backward(r.loss.backward());
    });
    for (const r of rs) r.ddp.finishGradientSync();
    const own = [referenceSteps(1, 2, 0).grads[0]!, referenceSteps(1, 2, 2).grads[0]!];
    for (const r of rs) expectBf16Close(grads(r.model), reference.grads[0]!, own);
    expect(rs[0]!.ddp.bytesLastSync).toBe(rs[0]!.model.arena().size * 2);
  });

  it('GradScaler: an overflow on one rank skips the same step on every rank', () => {
    const { groups } = loopbackGroups(2);
    const models = groups.map((_, r) => smallResNet(1 + r).eval());
    const ddps = constructTogether(models, groups, {});
    const scalers = models.map(() => new GradScaler({ initScale: 1024 }));
    const optimizers = models.map((m) => new SGD(m, { lr: 0.1 }));
    const losses = models.map(() => new CrossEntropyLoss());
    const step = (overflowRank: number | null): void => {
      models.forEach((_, rank) => {
        const x = images(rank * 2, 2);
        if (rank === overflowRank) {
          // One input value at infinity: this rank's gradients are inf/NaN, the other's finite.
          const values = x.toFloat32Array();
          values[5] = Infinity;
          x.copyFromHost(values);
        }
        scalers[rank]!.scale(losses[rank]!);
        losses[rank]!.forward(ddps[rank]!.forward(x), labels(rank * 2, 2));
        ddps[rank]!.backward(losses[rank]!.backward());
      });
      models.forEach((_, rank) => {
        ddps[rank]!.finishGradientSync();
        scalers[rank]!.step(optimizers[rank]!);
        scalers[rank]!.update();
        optimizers[rank]!.zeroGrad();
      });
    };
    const before = models.map((m) => m.arena().params.toFloat32Array());
    step(1);
    expect(scalers.map((s) => s.skippedLastStep)).toEqual([true, true]);
    expect(scalers.map((s) => s.lossScale)).toEqual([512, 512]);
    expect(optimizers.map((o) => o.stepCount)).toEqual([0, 0]);
    models.forEach((m, r) => expect(same(m.arena().params.toFloat32Array(), before[r]!)).toBe(true));
    step(null);
    expect(scalers.map((s) => s.skippedLastStep)).toEqual([false, false]);
    const after = models.map((m) => m.arena().params.toFloat32Array());
    expect(same(after[1]!, after[0]!)).toBe(true);
    expect(same(after[0]!, before[0]!)).toBe(false);
  });

  it('frozen parameters never block a bucket and are not reduced', () => {
    const { groups, log } = loopbackGroups(1);
    const model = smallResNet(1).eval();
    const ddp = new DistributedDataParallel(model, groups[0]!, { bucketCapMb: 0.1 });
    model.getSubmodule('layer4').setRequiresGrad(false);
    log.length = 0;
    const loss = new CrossEntropyLoss();
    const x = images(0, 2);
    loss.forward(ddp.forward(x), labels(0, 2));
    ddp.backward(loss.backward());
    const frozen = new Set(model.getSubmodule('layer4').parameters());
    const trainable = ddp.buckets.filter((b) => b.parameters.some((p) => !frozen.has(p)));
    expect(trainable.length).toBeLessThan(ddp.buckets.length);
    // Launched during backward, every trainable bucket (the first holds fc beside layer4's last).
    expect(log.map((c) => c.numel)).toEqual(trainable.map((b) => b.length));
    ddp.finishGradientSync();
    expect(log.length).toBe(trainable.length);
  });

  it('unused parameters: finishGradientSync reduces the buckets no backward completed', () => {
    class WithUnused extends Module {
      readonly used: Linear;
      constructor() {
        super();
        this.used = this.registerModule('used', new Linear({ inFeatures: 4, outFeatures: 3, seed: 1 }));
        this.registerModule('unused', new Linear({ inFeatures: 4, outFeatures: 3, seed: 2 }));
      }
      override forward(x: Tensor): Tensor {
        this.prepare(x, 'WithUnused');
        return this.used.forward(x);
      }
      override backward(g: Tensor): Tensor | null {
        return this.backwardOnce('WithUnused', () => this.used.backward(g));
      }
    }
    const { groups, log } = loopbackGroups(1);
    const model = new WithUnused().to('cpu');
    const ddp = new DistributedDataParallel(model, groups[0]!, { bucketCapMb: 1e-5 });
    expect(ddp.buckets.length).toBe(4);
    log.length = 0;
    const x = Tensor.randn([2, 4], { seed: 1 });
    model.forward(x);
    model.backward(Tensor.full([2, 3], 1));
    // Buckets in reverse arena order: unused.bias, unused.weight, used.bias, used.weight; the
    // unused ones block the order, so nothing is enqueued before finishGradientSync.
    expect(log.length).toBe(0);
    ddp.finishGradientSync();
    expect(log.length).toBe(4);
  });

  it('propagates errors of the group', () => {
    const { groups } = loopbackGroups(1);
    const model = smallResNet(1).eval();
    const ddp = new DistributedDataParallel(model, groups[0]!, { bucketCapMb: 1 });
    groups[0]!.allReduce = () => {
      throw new Error('rank 1 was lost');
    };
    const loss = new CrossEntropyLoss();
    const x = images(0, 2);
    loss.forward(ddp.forward(x), labels(0, 2));
    expect(() => ddp.backward(loss.backward())).toThrow('rank 1 was lost');
    expect(() => ddp.finishGradientSync()).toThrow('rank 1 was lost');
    groups[0]!.wait = () => {
      throw new Error('timed out after 1 s waiting for rank 1');
    };
    expect(() => ddp.syncBuffers()).toThrow('waiting for rank 1');
  });

  it('refuses bad input with the parameter named', () => {
    const { groups } = loopbackGroups(1);
    const group = groups[0]!;
    const model = smallResNet(1);
    expect(() => new DistributedDataParallel({} as never, group)).toThrow(/model/);
    expect(() => new DistributedDataParallel(model, {} as never)).toThrow(/group/);
    expect(() => new DistributedDataParallel(model, group, { bucketCapMb: 0 })).toThrow(/bucketCapMb/);
    expect(() => new DistributedDataParallel(model, group, { gradientCompression: 'fp8' as never })).toThrow(
      /gradientCompression/,
    );
    expect(() => new DistributedDataParallel(model, group, { broadcastBuffers: 1 as never })).toThrow(
      /broadcastBuffers/,
    );
    expect(() => new DistributedDataParallel(model, group, { bucket_cap_mb: 1 } as never)).toThrow(/bucket_cap_mb/);
    const unplaced = new Linear({ inFeatures: 2, outFeatures: 2, seed: 1 });
    expect(() => new DistributedDataParallel(unplaced, group)).toThrow(/not materialised.*model\.to\('cpu'\)/);
    const ddp = new DistributedDataParallel(model, group);
    ddp.dispose();
    expect(() => ddp.finishGradientSync()).toThrow(/disposed/);
  });
});

describe('DistributedDataParallel over Gloo, 2 processes', () => {
  let dir = '';
  let runs: RankRun[] = [];
  const sizes = smallResNet(1)
    .parameters()
    .map((p) => p.numel);

  /** A rank's saved arrays, split back into parameters. */
  function load(name: string, rank: number): Float32Array[] {
    const bytes = readFileSync(join(dir, `${name}-rank${rank}.f32`));
    const flat = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
    const out: Float32Array[] = [];
    let at = 0;
    for (const n of sizes) {
      out.push(flat.slice(at, at + n));
      at += n;
    }
    expect(at).toBe(flat.length);
    return out;
  }

  function report(rank: number): Record<string, unknown> {
    const line = runs[rank]!.stdout.trim().split('\n').pop() ?? '';
    return JSON.parse(line) as Record<string, unknown>;
  }

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'rc-ddp-'));
    runs = await runRanks(rankScript('ddp-train'), { worldSize: 2, args: [dir], timeoutMs: 240_000 });
  }, 300_000);
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('both ranks finish', () => {
    for (const run of runs) expect({ rank: run.rank, code: run.code, stderr: run.stderr }).toMatchObject({ code: 0 });
  });

  it('2 ranks x batch 2 give the gradients and weights of 1 process x batch 4 over 2 steps', () => {
    const reference = referenceSteps(2, 4);
    for (const rank of [0, 1]) {
      expectClose(load('grads-step0', rank), reference.grads[0]!, 1e-5);
      expectClose(load('grads-step1', rank), reference.grads[1]!, 1e-5);
      expectClose(load('weights', rank), reference.weights, 1e-5);
      expect(report(rank).bytesLastSync).toBe(smallResNet(1).arena().size * 4);
    }
  });

  it('noSync accumulation equals one batch of 4; bf16 compression within bf16 rounding', () => {
    const reference = referenceSteps(1, 4);
    const own = [referenceSteps(1, 2, 0).grads[0]!, referenceSteps(1, 2, 2).grads[0]!];
    for (const rank of [0, 1]) {
      expectClose(load('grads-nosync', rank), reference.grads[0]!, 1e-5);
      expectBf16Close(load('grads-bf16', rank), reference.grads[0]!, own);
      expect(report(rank).bf16Bytes).toBe(smallResNet(1).arena().size * 2);
    }
  });

  it('the GradScaler skips the same step on both ranks when only rank 1 overflows', () => {
    for (const rank of [0, 1]) {
      expect(report(rank).scaler).toEqual([
        { skipped: true, scale: 512, steps: 0 },
        { skipped: false, scale: 512, steps: 1 },
      ]);
    }
    const [w0, w1] = [load('weights-scaler', 0), load('weights-scaler', 1)];
    expect(w0.every((a, t) => same(a, w1[t]!))).toBe(true);
  });

  it("a training-mode forward starts from rank 0's running statistics", () => {
    const flat = (name: string, rank: number): Float32Array => {
      const bytes = readFileSync(join(dir, `${name}-rank${rank}.f32`));
      return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
    };
    expect(same(flat('buffers-diverged', 0), flat('buffers-diverged', 1))).toBe(false);
    expect(same(flat('buffers-synced', 0), flat('buffers-synced', 1))).toBe(true);
  });

  it("the first bucket's all-reduce starts before backward ends", () => {
    for (const rank of [0, 1]) {
      const r = report(rank);
      const timing = r.timing as {
        backwardStartMs: number;
        backwardEndMs: number;
        records: { startMs: number; endMs: number }[];
      };
      expect(timing.records.length).toBe(r.buckets);
      expect(timing.records[0]!.startMs).toBeGreaterThan(timing.backwardStartMs);
      expect(timing.records[0]!.startMs).toBeLessThan(timing.backwardEndMs);
    }
  });
});

describe('DistributedDataParallel on a one-rank Gloo group', () => {
  it("hands each bucket to the group's thread while backward runs; f32 unchanged, bf16 rounded once", () => {
    const group = soloGroup('gloo', undefined, 30);
    try {
      const reference = referenceSteps(1, 2);
      for (const gradientCompression of ['none', 'bf16'] as const) {
        const model = smallResNet(1).eval();
        const ddp = new DistributedDataParallel(model, group, { bucketCapMb: 0.1, gradientCompression });
        group.synchronize();
        group.takeCollectiveRecords();
        const loss = new CrossEntropyLoss();
        const x = images(0, 2);
        loss.forward(ddp.forward(x), labels(0, 2));
        const backwardStartMs = Number(process.hrtime.bigint()) / 1e6;
        ddp.backward(loss.backward());
        const backwardEndMs = Number(process.hrtime.bigint()) / 1e6;
        ddp.finishGradientSync();
        group.synchronize();
        const records = group.takeCollectiveRecords().filter((r) => r.op === 'allReduce');
        expect(records.length).toBe(ddp.buckets.length);
        // The first bucket is handed to the group's thread during backward. When that thread starts
        // it depends on a free core: on 2 cores backward's OpenMP threads may hold both until the
        // end (measured once: a start 0.03 ms after backward ended), so only the hand-over is timed
        // here; the two-rank test above times the start against a longer backward.
        expect(records[0]!.enqueuedMs).toBeGreaterThan(backwardStartMs);
        expect(records[0]!.enqueuedMs).toBeLessThan(backwardEndMs);
        expect(records[0]!.startMs).toBeGreaterThanOrEqual(records[0]!.enqueuedMs);
        const bytesPer = gradientCompression === 'bf16' ? 2 : 4;
        expect(records.map((r) => r.bytes)).toEqual(ddp.buckets.map((b) => b.length * bytesPer));
        const g = grads(model);
        if (gradientCompression === 'none') expectClose(g, reference.grads[0]!, 0);
        else expectBf16Close(g, reference.grads[0]!, [reference.grads[0]!, reference.grads[0]!]);
        ddp.dispose();
        model.dispose();
      }
    } finally {
      group.destroy();
    }
  });
});
