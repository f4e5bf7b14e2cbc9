import { describe, expect, it } from 'vitest';
import { Conv2d, Module, ResNet, ResNet18, Sequential, Tensor, summary, type ResNetDepth } from '../lib/index.js';

// torchvision.models.resnetXX(num_classes=1000): sum(p.numel() for p in model.parameters()), and
// the GFLOPS column of https://pytorch.org/vision/stable/models.html (multiply-accumulates of the
// convolutions and the classifier for one 224x224 image; torchvision counts a MAC as one "FLOP").
// `macs`: the exact count behind that column, from forward hooks on torchvision 0.29's models
// (for each Conv2d: output elements x in_channels / groups x kernel area; for each Linear: output
// elements x in_features) run on a 1x3x224x224 input.
const PUBLISHED: Record<ResNetDepth, { params: number; gmacs: string; macs: number }> = {
  18: { params: 11_689_512, gmacs: '1.81', macs: 1_814_073_344 },
  34: { params: 21_797_672, gmacs: '3.66', macs: 3_663_761_408 },
  50: { params: 25_557_032, gmacs: '4.09', macs: 4_089_184_256 },
  101: { params: 44_549_160, gmacs: '7.80', macs: 7_801_405_440 },
  152: { params: 60_192_808, gmacs: '11.51', macs: 11_513_626_624 },
};

describe('model summary', () => {
  for (const [depth, published] of Object.entries(PUBLISHED)) {
    it(`ResNet-${depth} at 224 px: torchvision's parameter count and GMACs`, () => {
      using model = new ResNet(Number(depth) as ResNetDepth, { seed: 1 });
      const s = model.summary({ inputSize: 224 });
      expect(s.totalParams).toBe(published.params);
      expect(s.trainableParams).toBe(published.params);
      expect(s.frozenParams).toBe(0);
      expect((s.macs / 1e9).toFixed(2)).toBe(published.gmacs);
      expect(s.macs).toBe(published.macs);
      expect(s.paramBytes).toBe(published.params * 4);
      const root = s.rows[0];
      expect(root?.outputShape).toEqual([1, 1000]);
      // The leaves' parameters add up to the total: nothing counted twice or left out.
      const leaves = s.rows.filter((r) => r.leaf);
      expect(leaves.reduce((n, r) => n + r.params, 0)).toBe(published.params);
      expect(leaves.reduce((n, r) => n + r.macs, 0)).toBe(s.macs);
    });
  }

  it("counts one layer's MACs and activation bytes as computed by hand", () => {
    using conv = new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 3, stride: 2, padding: 1 });
    const s = summary(conv, { inputSize: [9, 7], batchSize: 2 });
    // oh = floor((9 + 2 - 2 - 1) / 2) + 1 = 5, ow = floor((7 + 2 - 2 - 1) / 2) + 1 = 4
    expect(s.rows[0]?.outputShape).toEqual([2, 5, 4, 8]);
    expect(s.macs).toBe(2 * 5 * 4 * 8 * (3 * 3 * 3));
    expect(s.activationBytes).toBe(2 * 5 * 4 * 8 * 4);
    expect(s.totalParams).toBe(8 * 3 * 3 * 3);
    expect(s.inputBytes).toBe(2 * 9 * 7 * 3 * 4);

    // ResNet-18's stem at 224 px in bf16, batch 2: 112x112x64 outputs of 147 MACs each.
    using model = ResNet18({ seed: 0 });
    const stem = model.summary({ inputSize: 224, batchSize: 2, dtype: 'bf16' }).rows.find((r) => r.name === 'conv1');
    expect(stem).toMatchObject({
      type: 'Conv2d',
      depth: 1,
      outputShape: [2, 112, 112, 64],
      params: 64 * 3 * 7 * 7,
      macs: 2 * 112 * 112 * 64 * 147,
      activationBytes: 2 * 112 * 112 * 64 * 2,
    });
  });

  it('agrees with the shapes a real forward produces, and follows the small-image stem', () => {
    using model = ResNet18({ numClasses: 7, smallInput: true, seed: 0 });
    const s = model.summary({ inputSize: 32, batchSize: 3 });
    const x = Tensor.from(new Float32Array(3 * 32 * 32 * 3), [3, 32, 32, 3]);
    expect(model.forward(x).shape).toEqual(s.rows[0]?.outputShape);
    expect(s.rows.find((r) => r.name === 'layer4')?.outputShape).toEqual([3, 4, 4, 512]);
    expect(s.rows.some((r) => r.name === 'maxpool')).toBe(false);
    x.dispose();
  });

  it('counts a frozen submodule as non-trainable', () => {
    using model = ResNet18({ seed: 0 });
    const layer1 = model.getSubmodule('layer1');
    layer1.setRequiresGrad(false);
    const frozen = layer1.numParameters();
    expect(frozen).toBe(2 * (2 * 64 * 64 * 9 + 4 * 64));
    const s = model.summary({ inputSize: 64 });
    expect(s.frozenParams).toBe(frozen);
    expect(s.trainableParams).toBe(11_689_512 - frozen);
    expect(s.rows.find((r) => r.name === 'layer1')?.trainableParams).toBe(0);
    expect(s.rows.find((r) => r.name === 'layer2')?.trainableParams).toBe(
      s.rows.find((r) => r.name === 'layer2')?.params,
    );
    const text = s.format();
    expect(text).toContain(`Non-trainable params: ${frozen.toLocaleString('en-US')}`);
    expect(text).toContain('layer1 (Sequential)');
    expect(text).toContain(`(${frozen.toLocaleString('en-US')} frozen)`);
  });

  it('formats a table whose depth can be limited', () => {
    using model = ResNet18({ seed: 0 });
    const s = model.summary({ inputSize: 224 });
    const shallow = s.format({ depth: 1 });
    expect(shallow).toContain('Total params: 11,689,512');
    expect(shallow).toContain('Total mult-adds (G): 1.81');
    expect(shallow).not.toContain('conv1 (Conv2d)\n    ');
    expect(shallow.split('\n').filter((l) => l.includes('(Conv2d)'))).toHaveLength(1); // the stem only
    expect(
      s
        .format()
        .split('\n')
        .filter((l) => l.includes('(BasicBlock)')),
    ).toHaveLength(8);
    expect(String(s)).toBe(s.format());
  });

  it('refuses bad options and layers it cannot size', () => {
    using model = ResNet18({ seed: 0 });
    const bad: [unknown, RegExp][] = [
      [{}, /inputSize/],
      [{ inputSize: 0 }, /inputSize/],
      [{ inputSize: [224] }, /inputSize/],
      [{ inputSize: 224, dtype: 'f64' }, /dtype/],
      [{ inputSize: 224, batchSize: 0 }, /batchSize/],
      [{ inputSize: 224, batch: 2 }, /batch/],
    ];
    for (const [options, pattern] of bad) {
      expect(() => summary(model, options as { inputSize: number })).toThrow(pattern);
    }
    using conv = new Conv2d({ inChannels: 3, outChannels: 4, kernelSize: 5 });
    expect(() => summary(conv, { inputSize: 3 })).toThrow(/kernel size/);
    class Custom extends Module {
      forward(x: Tensor): Tensor {
        return x;
      }
      backward(g: Tensor): Tensor {
        return g;
      }
    }
    expect(() => summary(new Sequential(new Custom()), { inputSize: 8, channels: 3 })).toThrow(/0 \(Custom\)/);
  });
});
