import { describe, expect, it } from 'vitest';
import {
  Conv2d,
  CrossEntropyLoss,
  Flatten,
  Linear,
  ReLU,
  ResNet101,
  ResNet50,
  Sequential,
  Tensor,
  type Module,
} from '../lib/index.js';
import { GradientPool } from '../lib/nn/gradient-pool.js';

function sameMemory(a: Tensor, b: Tensor): boolean {
  return a.raw.sharesStorage(b.raw);
}

describe('GradientPool', () => {
  it('hands out a buffer no one holds, and the same memory again once it is released', () => {
    const pool = new GradientPool();
    const a = pool.acquire([2, 3], 'f32', 'cpu');
    const b = pool.acquire([2, 3], 'f32', 'cpu');
    expect(a.shape).toEqual([2, 3]);
    expect(sameMemory(a, b)).toBe(false);
    pool.release(a);
    const c = pool.acquire([3, 2], 'f32', 'cpu');
    expect(c.shape).toEqual([3, 2]);
    expect(sameMemory(c, a)).toBe(true);
    // Another element count, dtype or device is another buffer.
    expect(sameMemory(pool.acquire([6], 'bf16', 'cpu'), c)).toBe(false);
    expect(sameMemory(pool.acquire([7], 'f32', 'cpu'), c)).toBe(false);
    pool.dispose();
  });

  it('leaves alone a tensor it did not hand out and a second release of one', () => {
    const pool = new GradientPool();
    const own = Tensor.zeros([4]);
    const a = pool.acquire([4], 'f32', 'cpu');
    pool.release(own);
    pool.release(a);
    pool.release(a);
    const b = pool.acquire([4], 'f32', 'cpu');
    const c = pool.acquire([4], 'f32', 'cpu');
    expect(sameMemory(b, a)).toBe(true);
    expect(sameMemory(c, a)).toBe(false);
    expect(sameMemory(c, own)).toBe(false);
    expect(pool.bytes()).toBe(2 * 4 * 4);
    own.dispose();
    pool.dispose();
  });

  it('repeats a pass buffer for buffer after a reset, allocating nothing', () => {
    const pool = new GradientPool();
    const pass = () => {
      const a = pool.acquire([8], 'f32', 'cpu');
      const b = pool.acquire([8], 'f32', 'cpu');
      pool.release(a);
      const c = pool.acquire([8], 'f32', 'cpu');
      const d = pool.acquire([8], 'f32', 'cpu');
      return [a, b, c, d];
    };
    const first = pass();
    const bytes = pool.bytes();
    pool.reset();
    const second = pass();
    expect(pool.bytes()).toBe(bytes);
    second.forEach((t, i) => expect(sameMemory(t, first[i]!), `buffer ${i}`).toBe(true));
    pool.dispose();
  });
});

/** One training step's backward of `model` on a fixed batch. */
function trainingStep(model: Module, x: Tensor, labels: number[]): void {
  const loss = new CrossEntropyLoss();
  loss.forward(model.forward(x), labels);
  model.backward(loss.backward());
}

describe('input gradients in a backward pass', () => {
  it('share memory across blocks: ResNet-101 holds as much gradient memory as ResNet-50', () => {
    const x = Tensor.randn([2, 32, 32, 3], { seed: 1 });
    const bytes = (model: Module) => {
      trainingStep(model, x, [1, 2]);
      trainingStep(model, x, [1, 2]);
      const held = model.gradientPoolBytes;
      model.dispose();
      return held;
    };
    const resnet50 = bytes(ResNet50({ numClasses: 4, seed: 0 }));
    const resnet101 = bytes(ResNet101({ numClasses: 4, seed: 0 }));
    expect(resnet50).toBeGreaterThan(0);
    // ResNet-101 has 17 more blocks in its third stage; they reuse the buffers of the first six.
    expect(resnet101).toBe(resnet50);
  });

  it('a gradient reshaped by the module it was passed to is not handed out while the reshape is read', () => {
    // Flatten's backward returns a reshape of the Linear's input gradient; the convolution reads
    // it while writing its own input gradient, a buffer of the same element count.
    const parts = () => {
      const conv = new Conv2d({ inChannels: 3, outChannels: 3, kernelSize: 3, padding: 1, seed: 2 });
      const fc = new Linear({ inFeatures: 4 * 4 * 3, outFeatures: 5, seed: 3 });
      return { conv, fc };
    };
    const x = Tensor.randn([2, 4, 4, 3], { seed: 4 });
    const dy = Tensor.randn([2, 5], { seed: 5 });

    const chained = parts();
    const model = new Sequential(chained.conv, new Flatten(), chained.fc);
    model.forward(x);
    const dx = defined(model.backward(dy)).toFloat32Array();

    // Each module as a root of its own, the reshape done here.
    const alone = parts();
    const h = alone.conv.forward(x);
    alone.fc.forward(h.reshape([2, 48]));
    const dh = defined(alone.fc.backward(dy)).reshape(h.shape);
    const want = defined(alone.conv.backward(dh)).toFloat32Array();
    expect(Array.from(dx)).toEqual(Array.from(want));
    expect(Array.from(chained.conv.weight.grad.toFloat32Array())).toEqual(
      Array.from(alone.conv.weight.grad.toFloat32Array()),
    );
    model.dispose();
    alone.conv.dispose();
    alone.fc.dispose();
  });

  it('the gradient a model returns stays as it is through another model’s backward, until its own next one', () => {
    const make = () =>
      new Sequential(new Conv2d({ inChannels: 2, outChannels: 2, kernelSize: 3, padding: 1, seed: 6 }), new ReLU());
    const a = make();
    const b = make();
    const x = Tensor.randn([1, 5, 5, 2], { seed: 7 });
    a.forward(x);
    const gradA = defined(a.backward(Tensor.randn([1, 5, 5, 2], { seed: 8 })));
    const kept = gradA.toFloat32Array();
    b.forward(x);
    b.backward(Tensor.randn([1, 5, 5, 2], { seed: 9 }));
    expect(Array.from(gradA.toFloat32Array())).toEqual(Array.from(kept));
    a.dispose();
    b.dispose();
  });
});

function defined<T>(value: T | null): T {
  if (value === null) throw new Error('backward returned no input gradient');
  return value;
}
