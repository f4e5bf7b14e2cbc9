import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { CosineAnnealingLR, CrossEntropyLoss, ResNet18, SGD, Scheduler, Tensor } from '../lib/index.js';
import { loadCheckpoint, loadWeights, saveCheckpoint, saveWeights } from '../lib/train/checkpoint.js';
import { lookup } from './helpers/defined.js';
import { stringMatching } from './helpers/matchers.js';

const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-checkpoint-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function sameBits(a: ArrayBufferView, b: ArrayBufferView): boolean {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}

describe('weights and checkpoints', () => {
  it('writes safetensors with torchvision names that read back bit-exactly', async () => {
    const a = ResNet18({ numClasses: 3, smallInput: true, seed: 1 });
    a.forward(Tensor.randn([2, 8, 8, 3], { seed: 2 }));
    const path = join(dir, 'weights.safetensors');
    await saveWeights(path, a);
    // An independent read of the layout: little-endian header length, JSON header, raw data.
    const bytes = readFileSync(path);
    const headerLength = Number(bytes.readBigUInt64LE(0));
    const header = JSON.parse(bytes.subarray(8, 8 + headerLength).toString()) as Record<
      string,
      { dtype: string; shape: number[]; data_offsets: number[] }
    >;
    expect(header['conv1.weight']).toMatchObject({ dtype: 'F32', shape: [64, 3, 3, 3] });
    expect(header['bn1.num_batches_tracked']).toMatchObject({ dtype: 'I64', shape: [] });
    const fc = header['fc.weight']!;
    const fcBytes = bytes.subarray(8 + headerLength + fc.data_offsets[0]!, 8 + headerLength + fc.data_offsets[1]!);
    expect(sameBits(fcBytes, lookup(a.stateDict(), 'fc.weight').data)).toBe(true);

    const b = ResNet18({ numClasses: 3, smallInput: true, seed: 9 });
    await loadWeights(path, b);
    for (const [key, entry] of a.stateDict()) {
      expect(sameBits(lookup(b.stateDict(), key).data, entry.data), key).toBe(true);
    }
  });

  it('resumes a run exactly: the same losses as the uninterrupted run, bit for bit', async () => {
    const x = Tensor.randn([8, 8, 8, 3], { seed: 3 });
    const labels = [0, 1, 2, 3, 0, 1, 2, 3];
    const make = (seed: number) => {
      const model = ResNet18({ numClasses: 4, smallInput: true, seed });
      const optimizer = new SGD(model, { lr: 0.05, momentum: 0.9, weightDecay: 1e-4, nesterov: true });
      const scheduler = new Scheduler(optimizer, new CosineAnnealingLR({ tMax: 10, minLr: 0.001 }));
      const loss = new CrossEntropyLoss({ labelSmoothing: 0.1 });
      const step = () => {
        const value = loss.forward(model.forward(x), labels).item();
        model.backward(loss.backward());
        optimizer.step();
        optimizer.zeroGrad();
        scheduler.step();
        return value;
      };
      return { model, optimizer, scheduler, step };
    };
    const run = make(5);
    for (let i = 0; i < 3; i++) run.step();
    const path = join(dir, 'latest.ckpt');
    await saveCheckpoint(
      path,
      { model: run.model, optimizer: run.optimizer, scheduler: run.scheduler },
      { epoch: 1, step: 3, extra: { bestTop1: 0.5 } },
    );
    const uninterrupted = [run.step(), run.step(), run.step()];

    const resumed = make(77);
    const progress = await loadCheckpoint(path, {
      model: resumed.model,
      optimizer: resumed.optimizer,
      scheduler: resumed.scheduler,
    });
    expect(progress).toEqual({ epoch: 1, step: 3, extra: { bestTop1: 0.5 } });
    const after = [resumed.step(), resumed.step(), resumed.step()];
    expect(after).toEqual(uninterrupted);
    expect(sameBits(resumed.model.arena().params.toFloat32Array(), run.model.arena().params.toFloat32Array())).toBe(
      true,
    );
  });

  it('names the file and the problem for a truncated or foreign file', async () => {
    const model = ResNet18({ numClasses: 2, smallInput: true, seed: 1 });
    const path = join(dir, 'truncated.ckpt');
    await saveCheckpoint(path, { model }, { epoch: 0, step: 0 });
    const whole = readFileSync(path);
    writeFileSync(path, whole.subarray(0, whole.length - 1000));
    await expect(loadCheckpoint(path, { model })).rejects.toMatchObject({
      code: 'ERR_RC_CHECKPOINT',
      message: stringMatching(/truncated\.ckpt: tensor '.*' lies outside the file/),
    });
    writeFileSync(path, whole.subarray(0, 4));
    await expect(loadCheckpoint(path, { model })).rejects.toThrow(/truncated\.ckpt: is 4 bytes long/);
    const weights = join(dir, 'plain.safetensors');
    await saveWeights(weights, model);
    await expect(loadCheckpoint(weights, { model })).rejects.toThrow(/not a resnet-cuda checkpoint/);
    await expect(loadCheckpoint(join(dir, 'missing.ckpt'), { model })).rejects.toThrow(/missing\.ckpt: cannot be read/);
  });
});
