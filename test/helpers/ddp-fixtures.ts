/**
 * The small model and fixed data the DistributedDataParallel tests share, in-process and in the
 * rank scripts: every process builds the same images and labels from the same seeds.
 * @packageDocumentation
 */
import { CrossEntropyLoss, ResNet, SGD, Tensor, type Module } from '../../lib/index.js';

/** Classes of the small model. */
export const CLASSES = 5;
/** Image side. */
export const SIZE = 8;

/** ResNet-18's structure with 4-channel inner convolutions (0.3 M parameters), for speed. */
export function smallResNet(seed: number): ResNet {
  const blockWidths = Array.from({ length: 8 }, () => [4]);
  return new ResNet(18, { numClasses: CLASSES, smallInput: true, seed, device: 'cpu', blockWidths });
}

/** `count` images starting at image `from` of a fixed random batch of 8. */
export function images(from: number, count: number): Tensor {
  const all = Tensor.randn([8, SIZE, SIZE, 3], { seed: 3 });
  const per = SIZE * SIZE * 3;
  const out = Tensor.from(all.toFloat32Array().slice(from * per, (from + count) * per), [count, SIZE, SIZE, 3]);
  all.dispose();
  return out;
}

/** The labels of those images. */
export function labels(from: number, count: number): number[] {
  return Array.from({ length: count }, (_, i) => ((from + i) * 3) % CLASSES);
}

/** Every parameter's gradient, read back. */
export function grads(model: Module): Float32Array[] {
  return model.parameters().map((p) => p.grad.toFloat32Array());
}

/**
 * One process: `steps` SGD steps (lr 0.1, momentum 0.9) on images [from, from + n) in one batch,
 * BatchNorm in eval mode; the gradients of each step and the final weights.
 */
export function referenceSteps(
  steps: number,
  n: number,
  from = 0,
): { grads: Float32Array[][]; weights: Float32Array[] } {
  const model = smallResNet(1).eval();
  const loss = new CrossEntropyLoss();
  const optimizer = new SGD(model, { lr: 0.1, momentum: 0.9 });
  const out: Float32Array[][] = [];
  for (let s = 0; s < steps; s++) {
    const x = images(from, n);
    loss.forward(model.forward(x), labels(from, n));
    model.backward(loss.backward());
    out.push(grads(model));
    optimizer.step();
    optimizer.zeroGrad();
    x.dispose();
  }
  const weights = model.parameters().map((p) => p.values());
  model.dispose();
  return { grads: out, weights };
}
