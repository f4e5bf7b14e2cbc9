/**
 * Fine-tuning from pretrained weights: the frozen backbone and the backbone's lower learning rate
 * (lib/optim/fine-tune.ts), and on the command line `train --pretrained` with a `.pth` file,
 * `--freeze-backbone`, `--backbone-lr-scale` (recorded and resumed), and `eval --weights` on a `.pth`.
 */
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CrossEntropyLoss, ResNet18, SGD, Tensor } from '../lib/index.js';
import { ShapesDataset } from '../lib/data/shapes-dataset.js';
import type { StateDict } from '../lib/nn/module.js';
import { backboneGroups, freezeBackbone } from '../lib/optim/fine-tune.js';
import { decodeSafetensors } from '../lib/train/checkpoint.js';
import { runCli } from './helpers/cli.js';
import { defined, lookup } from './helpers/defined.js';
import { torchSave } from './helpers/torch-save.js';

const dir = mkdtempSync(join(tmpdir(), 'rc-fine-tune-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** One training step's forward and backward on a fixed batch. */
function backward(model: ReturnType<typeof ResNet18>): void {
  const x = Tensor.randn([4, 8, 8, 3], { seed: 7 });
  const loss = new CrossEntropyLoss();
  loss.forward(model.forward(x), Int32Array.from([0, 1, 2, 1]));
  model.backward(loss.backward());
}

describe('fine-tuning groups', () => {
  it('steps the backbone at its own learning rate and the classifier at the optimizer’s', () => {
    using model = ResNet18({ numClasses: 3, smallInput: true, seed: 1 });
    const groups = backboneGroups(model, { backboneLr: 0.001 });
    expect(groups.map((g) => [g.params.length, g.lr])).toEqual([
      [2, undefined],
      [60, 0.001],
    ]);
    const opt = new SGD(groups, { lr: 0.1 });
    backward(model);
    const named = model.namedParameters();
    const before = named.map(([, p]) => p.values());
    const grads = named.map(([, p]) => p.grad.toFloat32Array());
    opt.step();
    named.forEach(([name, p], i) => {
      const lr = name.startsWith('fc.') ? 0.1 : 0.001;
      const after = p.values();
      for (const k of [0, Math.floor(after.length / 2), after.length - 1]) {
        expect(after[k], `${name}[${k}]`).toBeCloseTo(before[i]![k]! - lr * grads[i]![k]!, 6);
      }
    });
    // With the usual weight-decay split, each group is split again, its settings kept.
    const split = backboneGroups(model, {
      backboneLr: 0.01,
      groups: [
        { params: model.parameters().filter((p) => p.kind === 'weight'), weightDecay: 1e-4 },
        { params: model.parameters().filter((p) => p.kind !== 'weight'), weightDecay: 0 },
      ],
    });
    expect(split.map((g) => [g.params.length, g.weightDecay, g.lr])).toEqual([
      [1, 1e-4, undefined],
      [1, 0, undefined],
      [20, 1e-4, 0.01],
      [40, 0, 0.01],
    ]);
    expect(() => backboneGroups(model, { backboneLr: -1 })).toThrow(/backboneLr/);
    expect(() => backboneGroups(model, { backboneLr: 0.1, head: 'classifier' })).toThrow(/No submodule 'classifier'/);
  });

  it('freezes everything but the classifier', () => {
    using model = ResNet18({ numClasses: 3, smallInput: true, seed: 2 });
    const frozen = freezeBackbone(model);
    expect(frozen).toBe(model.numParameters() - (512 * 3 + 3));
    const opt = new SGD(model, { lr: 0.1 });
    backward(model);
    const before = model.stateDict();
    opt.step();
    for (const [name, entry] of model.stateDict()) {
      if (!name.includes('running') && !name.endsWith('num_batches_tracked')) {
        const same = Buffer.from(entry.data.buffer).equals(Buffer.from(lookup(before, name).data.buffer));
        expect(same, name).toBe(!name.startsWith('fc.'));
      }
    }
  });
});

describe('train --pretrained', () => {
  const data = join(dir, 'shapes');
  /** A ResNet-18 (small stem, 3 classes) saved as PyTorch's torch.save writes a state dict. */
  const pth = join(dir, 'pretrained.pth');
  let pretrained: StateDict;
  const common = [
    '--max-steps',
    '1',
    '-b',
    '8',
    '-j',
    '0',
    '--train-crop-size',
    '16',
    '--no-tensorboard',
    '--no-plots',
  ];

  beforeAll(async () => {
    await ShapesDataset.writeImageFolder(join(data, 'train'), { count: 16, size: 16, seed: 1 });
    await ShapesDataset.writeImageFolder(join(data, 'val'), { count: 8, size: 16, seed: 2 });
    using model = ResNet18({ numClasses: 3, smallInput: true, seed: 5 });
    pretrained = model.stateDict();
    writeFileSync(pth, torchSave(pretrained));
  });

  /** The tensors and metadata of a safetensors file the run wrote. */
  function readRunFile(path: string): { tensors: StateDict; metadata: Record<string, string> } {
    return decodeSafetensors(readFileSync(path), path);
  }

  it('starts from a .pth with a new classifier and trains only fc with --freeze-backbone', async () => {
    const out = join(dir, 'frozen');
    const run = await runCli(
      ['train', data, '--pretrained', pth, '--freeze-backbone', '--lr', '0.05', '--output-dir', out, ...common],
      dir,
    );
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toMatch(
      /loaded .*pretrained\.pth without its classifier \(3 classes; this run has 4\): fc is new/,
    );
    expect(run.stderr).toMatch(/froze the backbone: only fc trains \(11,168,832 parameters frozen\)/);
    const trained = readRunFile(join(out, 'model.safetensors')).tensors;
    expect(lookup(trained, 'fc.weight').shape).toEqual([4, 512]);
    for (const [name, entry] of pretrained) {
      if (name.startsWith('fc.') || name.includes('running') || name.endsWith('num_batches_tracked')) continue;
      expect(Buffer.from(lookup(trained, name).data.buffer).equals(Buffer.from(entry.data.buffer)), name).toBe(true);
    }
    const config = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')) as Record<string, unknown>;
    expect(config).toMatchObject({ weights: pth, freezeBackbone: true });
  });

  it('trains the backbone at --lr x --backbone-lr-scale, records it, and keeps it when resumed', async () => {
    const out = join(dir, 'scaled');
    const args = ['train', data, '--pretrained', pth, '--backbone-lr-scale', '0.1', '--lr', '0.05'];
    const run = await runCli([...args, '--norm-weight-decay', '0', '--output-dir', out, ...common], dir);
    expect(run.code, run.stderr).toBe(0);
    const config = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')) as Record<string, unknown>;
    expect(config.backboneLrScale).toBe(0.1);
    const lrs = () => {
      const latest = readdirSync(join(out, 'checkpoints'))
        .filter((f) => f.endsWith('.safetensors'))
        .sort();
      const file = join(out, 'checkpoints', defined(latest.at(-1), 'a checkpoint'));
      const optimizer = JSON.parse(defined(readRunFile(file).metadata.optimizer, 'optimizer metadata')) as {
        paramGroups: { lr: number; weightDecay: number }[];
      };
      return optimizer.paramGroups.map((g) => [Number(g.lr.toPrecision(12)), g.weightDecay]);
    };
    // fc's weight and bias (decay, none), then the backbone's, at a tenth of the (constant) lr.
    const want = [
      [0.05, 1e-4],
      [0.05, 0],
      [0.005, 1e-4],
      [0.005, 0],
    ];
    expect(lrs()).toEqual(want);
    const resumed = await runCli(['train', '--resume', out, '--max-steps', '2'], dir);
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(lrs()).toEqual(want);
  });

  it('refuses fine-tuning options without --pretrained, and the two together', async () => {
    const alone = await runCli(['train', data, '--freeze-backbone', ...common], dir);
    expect(alone.code).toBe(2);
    expect(alone.stderr).toMatch(/--freeze-backbone needs --pretrained FILE/);
    const both = await runCli(
      ['train', data, '--pretrained', pth, '--freeze-backbone', '--backbone-lr-scale', '0.1', ...common],
      dir,
    );
    expect(both.code).toBe(2);
    expect(both.stderr).toMatch(/--freeze-backbone and --backbone-lr-scale contradict each other/);
    const bad = await runCli(['train', data, '--pretrained', pth, '--backbone-lr-scale', '2', ...common], dir);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--backbone-lr-scale/);
  });

  it('evaluates a .pth as it evaluates the same weights in safetensors, and distils from one', async () => {
    const four = join(dir, 'four.pth');
    using model = ResNet18({ numClasses: 4, smallInput: true, seed: 9 });
    const state = model.stateDict();
    writeFileSync(four, torchSave(state, 'four'));
    const safetensors = join(dir, 'four.safetensors');
    const { encodeSafetensors } = await import('../lib/train/checkpoint.js');
    writeFileSync(safetensors, encodeSafetensors(state));
    const evaluate = (file: string) => runCli(['eval', join(data, 'val'), '--weights', file, '--json', '-j', '0'], dir);
    const [a, b] = [await evaluate(four), await evaluate(safetensors)];
    expect(a.code, a.stderr).toBe(0);
    expect(b.code, b.stderr).toBe(0);
    const result = JSON.parse(a.stdout) as { count: number; acc1: number; confusion: number[][] };
    expect(result.count).toBe(8);
    expect(result).toEqual(JSON.parse(b.stdout));
    // A .pth teacher for distillation too.
    const distil = await runCli(
      ['train', data, '--teacher', four, '--output-dir', join(dir, 'distil'), ...common],
      dir,
    );
    expect(distil.code, distil.stderr).toBe(0);
    expect(distil.stderr).toMatch(/distilling a resnet18 teacher from weights .*four\.pth/);
  });
});
