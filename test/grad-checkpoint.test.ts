/**
 * Gradient checkpointing (lib/nn/checkpoint.ts): a ResNet with checkpointed segments against the
 * same ResNet without, from the same seed, over training steps with SGD and an evaluation pass
 * of another batch size between them. Loss, every parameter gradient, the evaluation logits, and
 * after the steps the whole state dict (weights, BN running statistics, num_batches_tracked) must
 * be bit-for-bit equal on the CPU in f32: the recomputed forward runs the same plans on the same
 * inputs, and the recomputation does not touch the running statistics. Also the allocator's peak
 * (lower with checkpointing), the segments, switching off, and bad options.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  CrossEntropyLoss,
  ResNet,
  SGD,
  Tensor,
  benchmarkTraining,
  listBackends,
  memoryStats,
  resetPeakMemory,
  type ResNetDepth,
  type StateDict,
} from '../lib/index.js';
import { checkpointingOf, type CheckpointSegments } from '../lib/nn/checkpoint.js';
import { runCli } from './helpers/cli.js';
import { lookup } from './helpers/defined.js';

interface Run {
  losses: number[];
  grads: Float32Array[];
  evalLogits: Float32Array[];
  state: StateDict;
}

const CLASSES = 5;

function labels(batch: number): number[] {
  return Array.from({ length: batch }, (_, i) => (i * 3) % CLASSES);
}

/** Two SGD steps with an evaluation forward (batch - 1 images) after each; everything read back. */
function train(
  depth: ResNetDepth,
  segments: CheckpointSegments | null,
  device: string,
  batch: number,
  size: number,
): Run {
  const model = new ResNet(depth, { numClasses: CLASSES, smallInput: true, seed: 7, device });
  if (segments !== null) model.checkpointing({ segments });
  const loss = new CrossEntropyLoss();
  const optimizer = new SGD(model, { lr: 0.1, momentum: 0.9, weightDecay: 1e-4 });
  const x = Tensor.randn([batch, size, size, 3], { seed: 11, device });
  const xEval = Tensor.randn([batch - 1, size, size, 3], { seed: 12, device });
  const run: Run = { losses: [], grads: [], evalLogits: [], state: new Map() };
  try {
    for (let step = 0; step < 2; step++) {
      model.train();
      optimizer.zeroGrad();
      run.losses.push(loss.forward(model.forward(x), labels(batch)).item());
      model.backward(loss.backward());
      run.grads.push(model.arena().grads.toFloat32Array());
      optimizer.step();
      model.eval();
      run.evalLogits.push(model.forward(xEval).toFloat32Array());
    }
    run.state = model.stateDict();
    return run;
  } finally {
    optimizer.dispose();
    loss.dispose();
    x.dispose();
    xEval.dispose();
    model.dispose();
  }
}

/** The first index where two arrays differ bitwise (NaN equal to NaN), or -1. */
function firstDifference(a: ArrayLike<number | bigint>, b: ArrayLike<number | bigint>): number {
  if (a.length !== b.length) return 0;
  for (let i = 0; i < a.length; i++) {
    if (!Object.is(a[i], b[i])) return i;
  }
  return -1;
}

function expectIdentical(plain: Run, checkpointed: Run): void {
  expect(checkpointed.losses).toEqual(plain.losses);
  plain.grads.forEach((g, step) => {
    expect(firstDifference(g, checkpointed.grads[step]!), `first differing gradient value at step ${step + 1}`).toBe(
      -1,
    );
  });
  plain.evalLogits.forEach((logits, step) => {
    expect(firstDifference(logits, checkpointed.evalLogits[step]!), `evaluation logits after step ${step + 1}`).toBe(
      -1,
    );
  });
  expect([...checkpointed.state.keys()]).toEqual([...plain.state.keys()]);
  for (const [name, entry] of plain.state) {
    expect(firstDifference(entry.data, lookup(checkpointed.state, name).data), name).toBe(-1);
  }
  // One running-statistics update per training step (a second one in the recomputation would
  // make these 4), and the statistics moved away from their initial zeros.
  expect(checkpointed.state.get('layer1.0.bn1.num_batches_tracked')?.data).toEqual(BigInt64Array.of(2n));
  expect(checkpointed.state.get('layer4.1.bn2.num_batches_tracked')?.data).toEqual(BigInt64Array.of(2n));
  const mean = lookup(checkpointed.state, 'layer2.0.bn1.running_mean').data as Float32Array;
  expect(mean.some((v) => v !== 0)).toBe(true);
}

/**
 * The allocator's peak over a model's life (construction, two training steps), after a warm-up
 * model has grown the backend's shared scratch memory, so that both runs start from the same state.
 */
function peakBytes(depth: ResNetDepth, segments: CheckpointSegments | null, batch: number, size: number): number {
  const x = Tensor.randn([batch, size, size, 3], { seed: 11 });
  const loss = new CrossEntropyLoss();
  try {
    resetPeakMemory();
    const base = memoryStats().allocatedBytes;
    const model = new ResNet(depth, { numClasses: CLASSES, smallInput: true, seed: 7 });
    if (segments !== null) model.checkpointing({ segments });
    for (let step = 0; step < 2; step++) {
      loss.forward(model.forward(x), labels(batch));
      model.backward(loss.backward());
    }
    const peak = memoryStats().peakAllocatedBytes - base;
    model.dispose();
    return peak;
  } finally {
    loss.dispose();
    x.dispose();
  }
}

// In the test project that runs on the emulated CUDA device (RESNET_TEST_BACKENDS=cuda), only the
// CUDA cases run; the CPU cases run in 'main'.
const onlyCuda = process.env.RESNET_TEST_BACKENDS === 'cuda';

describe.skipIf(onlyCuda)('gradient checkpointing on the CPU (f32, bit-for-bit)', () => {
  it.each([
    [18, 'stage'],
    [18, { every: 1 }],
    [50, 'stage'],
    [50, { every: 2 }],
  ] as const)('ResNet-%i with segments %j: same loss, gradients, logits and state as without', (depth, segments) => {
    const plain = train(depth, null, 'cpu', 3, 8);
    const checkpointed = train(depth, segments, 'cpu', 3, 8);
    expectIdentical(plain, checkpointed);
  });

  it('lowers the allocator peak of a small ResNet-50 step', () => {
    const batch = 4;
    const size = 16;
    peakBytes(50, null, batch, size); // grows the shared scratch memory to its size for these shapes
    const plain = peakBytes(50, null, batch, size);
    const stage = peakBytes(50, 'stage', batch, size);
    const everyBlock = peakBytes(50, { every: 1 }, batch, size);
    // Parameters, gradients and plans are the same in all three; the activations and their
    // gradients shrink to the largest segment's (plus each segment's output), so smaller segments
    // save more.
    expect(stage).toBeLessThan(plain);
    expect(everyBlock).toBeLessThan(stage);
  });

  it('lists its segments, reports its pool, and switches off', () => {
    const model = new ResNet(50, { numClasses: CLASSES, smallInput: true, seed: 7 });
    try {
      model.checkpointing({ segments: { every: 2 } });
      expect(checkpointingOf(model)?.segments).toEqual([
        ['layer1.0', 'layer1.1'],
        ['layer1.2'],
        ['layer2.0', 'layer2.1'],
        ['layer2.2', 'layer2.3'],
        ['layer3.0', 'layer3.1'],
        ['layer3.2', 'layer3.3'],
        ['layer3.4', 'layer3.5'],
        ['layer4.0', 'layer4.1'],
        ['layer4.2'],
      ]);
      expect(checkpointingOf(model)?.poolBytes).toBe(0);
      const x = Tensor.randn([2, 8, 8, 3], { seed: 1 });
      model.forward(x);
      expect(checkpointingOf(model)?.poolBytes).toBeGreaterThan(0);
      model.checkpointing({ segments: 'stage' });
      expect(checkpointingOf(model)?.segments.map((s) => s.length)).toEqual([3, 4, 6, 3]);
      model.checkpointing(false);
      expect(checkpointingOf(model)).toBeNull();
      const logits = model.forward(x).toFloat32Array();
      expect(logits.every(Number.isFinite)).toBe(true);
      x.dispose();
    } finally {
      model.dispose();
    }
  });

  it('refuses bad options, naming them', () => {
    const model = new ResNet(18, { numClasses: CLASSES, smallInput: true, seed: 7 });
    try {
      const bad = (options: unknown) => () => model.checkpointing(options as never);
      expect(bad({ segments: 'layer' })).toThrow(/'stage' or \{ every: k \}.* for segments/);
      expect(bad({ segments: { every: 0 } })).toThrow(/segments\.every/);
      expect(bad({ segments: { every: 1.5 } })).toThrow(/segments\.every/);
      expect(bad({ segments: { each: 2 } })).toThrow(/Unknown option 'each' in segments/);
      expect(bad({ segment: 'stage' })).toThrow(/Unknown option 'segment'/);
      expect(bad('stage')).toThrow(/checkpointing options/);
      expect(checkpointingOf(model)).toBeNull();
    } finally {
      model.dispose();
    }
  });
});

describe.skipIf(onlyCuda)('train --grad-checkpoint', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rc-grad-checkpoint-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('trains with every block recomputed, and refuses a malformed value before any work', async () => {
    const common = [
      '--max-steps',
      '1',
      '--train-crop-size',
      '16',
      '-b',
      '8',
      '-j',
      '0',
      '--no-tensorboard',
      '--no-plots',
    ];
    const run = await runCli(['train', '--grad-checkpoint', '1', ...common, '--output-dir', join(dir, 'run')], dir);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toContain('gradient checkpointing: 8 segments recomputed in backward');
    for (const value of ['layer', '0', '1.5']) {
      const bad = await runCli(['train', '--grad-checkpoint', value, ...common, '--output-dir', join(dir, 'bad')], dir);
      expect(bad.code).toBe(2);
      expect(bad.stderr).toContain(`--grad-checkpoint expects stage or a number of blocks N >= 1, got '${value}'`);
    }
  });
});

describe.skipIf(onlyCuda)('bench --grad-checkpoint', () => {
  it('measures a checkpointed model, and refuses a malformed value', async () => {
    const args = ['bench', '--model', 'resnet18', '--small-input', '--size', '16', '-b', '4', '--steps', '1'];
    const run = await runCli([...args, '--warmup', '1', '--grad-checkpoint', 'stage'], tmpdir());
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/ms\/step, .* img\/s, peak memory .*, gradient checkpointing stage\)\n$/);
    const bad = await runCli([...args, '--grad-checkpoint', 'blocks'], tmpdir());
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("--grad-checkpoint expects stage or a number of blocks N >= 1, got 'blocks'");
  });
});

describe('gradient checkpointing on CUDA', () => {
  const cuda = listBackends().find((b) => b.name === 'cuda');
  it.skipIf(!cuda?.available).each([[{ every: 1 }]] as const)(
    `ResNet-18 with segments %j: same loss, gradients, logits and state as without${cuda?.available ? '' : ` (skipped: ${cuda?.reason ?? 'no CUDA backend'})`}`,
    (segments) => {
      const plain = train(18, null, 'cuda', 3, 4);
      const checkpointed = train(18, segments, 'cuda', 3, 4);
      expectIdentical(plain, checkpointed);
    },
  );

  it.skipIf(!cuda?.available)(
    `on CUDA: a checkpointed step captured as a CUDA graph trains as the plain one${cuda?.available ? '' : ' (skipped)'}`,
    () => {
      // Warm-up step, capture, one replay, two timed replays: the loss of the last one.
      const lossAfterReplays = (segments: CheckpointSegments | null): number => {
        const model = new ResNet(18, { numClasses: 4, smallInput: true, seed: 1, device: 'cuda' });
        if (segments !== null) model.checkpointing({ segments });
        try {
          const options = { model, device: 'cuda', numClasses: 4, batch: 2, size: 4, steps: 2, warmup: 1 };
          return benchmarkTraining({ ...options, cudaGraph: true }).loss;
        } finally {
          model.dispose();
        }
      };
      const plain = lossAfterReplays(null);
      expect(Number.isFinite(plain)).toBe(true);
      expect(lossAfterReplays({ every: 1 })).toBe(plain);
    },
  );
});
