/**
 * A training loop written out by hand, without the Trainer: a small ResNet-18 on the built-in
 * generated dataset (coloured shapes on noise), printing the falling loss and the validation
 * accuracy. `resnet-cuda train` (npm run demo) does the same through the Trainer.
 *
 *   node dist/examples/training-loop.js [--steps 100] [--batch 32] [--dtype f32|bf16] [--device cpu] [--size 32] [--lr 0.01]
 */
import { parseArgs } from 'node:util';
import { CrossEntropyLoss, InputNormalize, ResNet18, SGD, Tensor, generateShapes, listBackends } from '../lib/index.js';

const { values } = parseArgs({
  options: {
    steps: { type: 'string', default: '100' },
    batch: { type: 'string', default: '32' },
    dtype: { type: 'string', default: 'f32' },
    device: { type: 'string', default: 'cpu' },
    size: { type: 'string', default: '32' },
    lr: { type: 'string', default: '0.01' },
    seed: { type: 'string', default: '1' },
  },
});
const steps = Number(values.steps);
const batch = Number(values.batch);
const size = Number(values.size);
const seed = Number(values.seed);
const dtype = values.dtype === 'bf16' ? 'bf16' : 'f32';
const device = values.device;

const cpu = listBackends().find((b) => b.name === 'cpu');
console.log(
  `resnet-cuda training loop: ResNet-18 (small-image stem) on generated shapes, ${size}px, batch ${batch}, ${dtype}, ${device}` +
    (cpu?.properties
      ? ` [oneDNN ${cpu.properties.onednn}, ${cpu.properties.isa}, ${cpu.properties.threads} threads]`
      : ''),
);

const train = generateShapes({ count: steps * batch, size, classes: 4, seed });
const val = generateShapes({ count: 512, size, classes: 4, seed: seed + 1 });
const model = ResNet18({ numClasses: 4, smallInput: true, seed, device });
const normalize = new InputNormalize({ mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25], dtype });
const loss = new CrossEntropyLoss({ labelSmoothing: 0.05 });
const peakLr = Number(values.lr);
const optimizer = new SGD(model, { lr: peakLr, momentum: 0.9, weightDecay: 5e-4, nesterov: true });
const imageBytes = size * size * 3;
const images = Tensor.empty([batch, size, size, 3], { dtype: 'u8', device });
const labels = Tensor.empty([batch], { dtype: 'i32', device });
const flip = new Uint8Array(batch);

const started = performance.now();
let recent = 0;
for (let step = 0; step < steps; step++) {
  // Linear warm-up over ten steps, then cosine decay to zero.
  optimizer.paramGroups[0]!.lr = peakLr * Math.min(1, (step + 1) / 10) * 0.5 * (1 + Math.cos((Math.PI * step) / steps));
  images.copyFromHost(train.images.subarray(step * batch * imageBytes, (step + 1) * batch * imageBytes));
  labels.copyFromHost(train.labels.subarray(step * batch, (step + 1) * batch));
  for (let i = 0; i < batch; i++) flip[i] = Math.random() < 0.5 ? 1 : 0;
  const logits = model.forward(normalize.forward(images, flip));
  const value = loss.forward(logits, labels);
  model.backward(loss.backward());
  optimizer.step();
  optimizer.zeroGrad();
  recent += value.item();
  if ((step + 1) % 10 === 0 || step === steps - 1) {
    const count = (step % 10) + 1;
    const seconds = (performance.now() - started) / 1000;
    console.log(
      `step ${String(step + 1).padStart(4)}/${steps}  loss ${(recent / count).toFixed(4)}  ${(((step + 1) * batch) / seconds).toFixed(1)} img/s`,
    );
    recent = 0;
  }
}

model.eval();
let correct = 0;
const evalBatch = 128;
const evalImages = Tensor.empty([evalBatch, size, size, 3], { dtype: 'u8', device });
for (let start = 0; start + evalBatch <= val.labels.length; start += evalBatch) {
  evalImages.copyFromHost(val.images.subarray(start * imageBytes, (start + evalBatch) * imageBytes));
  const logits = model.forward(normalize.forward(evalImages)).toFloat32Array();
  for (let i = 0; i < evalBatch; i++) {
    let best = 0;
    for (let k = 1; k < 4; k++) if (logits[i * 4 + k]! > logits[i * 4 + best]!) best = k;
    if (best === val.labels[start + i]) correct++;
  }
}
const evaluated = Math.floor(val.labels.length / evalBatch) * evalBatch;
console.log(
  `validation accuracy ${((100 * correct) / evaluated).toFixed(1)}% on ${evaluated} images (${val.classNames.join(', ')}); ${((performance.now() - started) / 1000).toFixed(1)} s in all`,
);
