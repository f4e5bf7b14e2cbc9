/**
 * Knowledge distillation: DistillationLoss against the float64 reference (and, when
 * `RESNET_TORCH_PYTHON` names a Python with torch, against PyTorch's own float64 loss and autograd
 * gradient) and against the cross-entropy at alpha = 0; its refusals; and the Trainer's
 * distillation option, whose teacher runs on the student's input, gets no gradients and keeps its
 * weights.
 */
import { execFileSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import {
  AdaptiveAvgPool2d,
  BatchNorm2d,
  CenterCrop,
  Compose,
  Conv2d,
  CrossEntropyLoss,
  DataLoader,
  DistillationLoss,
  Flatten,
  Linear,
  ReLU,
  ResNet18,
  SGD,
  Sequential,
  ShapesDataset,
  Tensor,
  Trainer,
  type Module,
  type TrainerOptions,
} from '../lib/index.js';
import { defined } from './helpers/defined.js';
import { distillationLoss as reference, relError, Rng } from './reference/index.js';

const rng = new Rng(20260512);

/** Values rounded to f32, as the tensors hold them. */
function f32(values: ArrayLike<number>): Float64Array {
  return Float64Array.from(Float32Array.from(values));
}

/**
 * PyTorch's distillation loss in float64, written as its users write it, with the gradient of the
 * student's logits by autograd. Reads `{ s, t, labels, n, k, temperature, alpha, labelSmoothing }`
 * as JSON on stdin; prints `{ loss, grad }`.
 */
const TORCH_KD = `
import json, sys
import torch
import torch.nn.functional as F
a = json.load(sys.stdin)
n, k, T, alpha = a['n'], a['k'], a['temperature'], a['alpha']
s = torch.tensor(a['s'], dtype=torch.float64).reshape(n, k).requires_grad_()
t = torch.tensor(a['t'], dtype=torch.float64).reshape(n, k)
y = torch.tensor(a['labels'])
soft = F.kl_div(F.log_softmax(s / T, 1), F.softmax(t / T, 1), reduction='batchmean') * T * T
hard = F.cross_entropy(s, y, label_smoothing=a['labelSmoothing'])
loss = alpha * soft + (1 - alpha) * hard
loss.backward()
print(json.dumps({'loss': loss.item(), 'grad': s.grad.reshape(-1).tolist()}))
`;

describe('DistillationLoss', () => {
  const n = 6;
  const k = 7;
  const python = process.env.RESNET_TORCH_PYTHON;
  it.skipIf(!python)(
    `matches PyTorch's float64 F.kl_div + F.cross_entropy and its autograd gradient${python ? '' : ' (skipped: set RESNET_TORCH_PYTHON to a Python with torch)'}`,
    () => {
      for (const o of [
        { temperature: 1, alpha: 0.5, labelSmoothing: 0 },
        { temperature: 4, alpha: 0.9, labelSmoothing: 0.1 },
        { temperature: 2, alpha: 0, labelSmoothing: 0.2 },
      ]) {
        const s = f32(rng.normals(n * k, 0, 3));
        const t = f32(rng.normals(n * k, 0, 3));
        const labels = Array.from({ length: n }, () => rng.int(0, k));
        const torch = JSON.parse(
          execFileSync(defined(python, 'RESNET_TORCH_PYTHON'), ['-c', TORCH_KD], {
            input: JSON.stringify({ s: [...s], t: [...t], labels, n, k, ...o }),
            encoding: 'utf8',
          }),
        ) as { loss: number; grad: number[] };
        const loss = new DistillationLoss(o);
        const logits = Tensor.from(Float32Array.from(s), [n, k]);
        const teacher = Tensor.from(Float32Array.from(t), [n, k]);
        try {
          const value = loss.forward(logits, teacher, labels).item();
          const what = JSON.stringify(o);
          expect(Math.abs(value - torch.loss) / torch.loss, what).toBeLessThan(1e-6);
          expect(relError(loss.backward().toFloat32Array(), torch.grad), what).toBeLessThan(1e-5);
          // The float64 reference of the other tests is PyTorch's loss.
          const ref = reference(s, t, labels, { n, k, ...o, gradScale: 1 });
          expect(Math.abs(ref.loss - torch.loss) / torch.loss, what).toBeLessThan(1e-12);
          expect(relError(ref.dLogits, torch.grad), what).toBeLessThan(1e-12);
        } finally {
          loss.dispose();
          logits.dispose();
          teacher.dispose();
        }
      }
    },
  );

  for (const o of [
    { temperature: 1, alpha: 0.5, labelSmoothing: 0 },
    { temperature: 4, alpha: 0.9, labelSmoothing: 0.1 },
    { temperature: 10, alpha: 1, labelSmoothing: 0 },
    { temperature: 2, alpha: 0.25, labelSmoothing: 0.3 },
  ]) {
    it(`matches the float64 reference: T=${o.temperature} alpha=${o.alpha} smoothing=${o.labelSmoothing}`, () => {
      const s = f32(rng.normals(n * k, 0, 3));
      const t = f32(rng.normals(n * k, 0, 3));
      const labels = Array.from({ length: n }, () => rng.int(0, k));
      const loss = new DistillationLoss(o);
      loss.gradScale = 0.5;
      const logits = Tensor.from(Float32Array.from(s), [n, k]);
      const teacher = Tensor.from(Float32Array.from(t), [n, k]);
      try {
        const value = loss.forward(logits, teacher, labels).item();
        const ref = reference(s, t, labels, { n, k, ...o, gradScale: 0.5 });
        expect(Math.abs(value - ref.loss) / ref.loss).toBeLessThan(1e-6);
        expect(relError(loss.backward().toFloat32Array(), ref.dLogits)).toBeLessThan(1e-5);
        // Labels as a device tensor give the same result.
        const labelTensor = Tensor.from(Int32Array.from(labels), [n], { dtype: 'i32' });
        expect(loss.forward(logits, teacher, labelTensor).item()).toBe(value);
        labelTensor.dispose();
      } finally {
        loss.dispose();
        logits.dispose();
        teacher.dispose();
      }
    });
  }

  it('is zero with zero gradient when the student already matches the teacher and alpha is 1', () => {
    const s = Float32Array.from(rng.normals(n * k, 0, 3));
    const logits = Tensor.from(s, [n, k]);
    const teacher = Tensor.from(s, [n, k]);
    const loss = new DistillationLoss({ temperature: 3, alpha: 1 });
    expect(Math.abs(loss.forward(logits, teacher, new Array<number>(n).fill(0)).item())).toBeLessThan(1e-7);
    expect(Math.max(...loss.backward().toFloat32Array().map(Math.abs))).toBeLessThan(1e-7);
    for (const t of [logits, teacher, loss]) t.dispose();
  });

  it('with alpha = 0 is exactly the cross-entropy, whatever the teacher says', () => {
    const logits = Tensor.from(Float32Array.from(rng.normals(n * k, 0, 3)), [n, k]);
    const teacher = Tensor.from(Float32Array.from(rng.normals(n * k, 0, 3)), [n, k]);
    const labels = Array.from({ length: n }, () => rng.int(0, k));
    const kd = new DistillationLoss({ temperature: 5, alpha: 0, labelSmoothing: 0.1 });
    const ce = new CrossEntropyLoss({ labelSmoothing: 0.1 });
    expect(kd.forward(logits, teacher, labels).item()).toBe(ce.forward(logits, labels).item());
    expect(kd.backward().toFloat32Array()).toEqual(ce.backward().toFloat32Array());
    for (const t of [logits, teacher, kd, ce]) t.dispose();
  });

  it('refuses a temperature <= 0, alpha outside [0, 1], and teacher logits that do not match', () => {
    for (const temperature of [0, -2, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => new DistillationLoss({ temperature })).toThrow(/temperature/);
    }
    for (const alpha of [-0.1, 1.01, Number.NaN]) {
      expect(() => new DistillationLoss({ alpha })).toThrow(/alpha/);
    }
    expect(() => new DistillationLoss({ labelSmoothing: 2 })).toThrow(/labelSmoothing/);
    expect(() => new DistillationLoss({ temp: 2 } as never)).toThrow(/temp/);
    const loss = new DistillationLoss();
    const logits = Tensor.zeros([2, 4]);
    const fewer = Tensor.zeros([2, 3]);
    const bf16 = Tensor.zeros([2, 4], { dtype: 'bf16' });
    expect(() => loss.forward(logits, fewer, [0, 1])).toThrow(
      /as many classes as the student\) for teacherLogits but received \[2, 3\]/,
    );
    expect(() => loss.forward(logits, bf16, [0, 1])).toThrow(/teacherLogits/);
    expect(() => loss.forward(logits, logits, [0, 4])).toThrow(/labels\[1\]/);
    expect(() => loss.backward()).toThrow(/before forward/);
    for (const t of [logits, fewer, bf16, loss]) t.dispose();
  });
});

/** A small classifier; without batch norm its training and evaluation forwards are the same function. */
function tinyNet(seed: number, classes = 4, bn = true): Module {
  const layers: Module[] = [new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 3, padding: 1, seed })];
  if (bn) layers.push(new BatchNorm2d({ numFeatures: 8 }));
  layers.push(
    new ReLU(),
    new AdaptiveAvgPool2d(1),
    new Flatten(),
    new Linear({ inFeatures: 8, outFeatures: classes, seed: seed + 1 }),
  );
  return new Sequential(...layers).to('cpu');
}

function loader(): DataLoader {
  return new DataLoader(new ShapesDataset({ length: 48, size: 16, classes: 4, seed: 3 }), {
    batchSize: 16,
    transform: new Compose([new CenterCrop({ size: 16 })]),
    workers: 0,
    shuffle: true,
    seed: 7,
  });
}

function trainer(model: Module, extra: Partial<TrainerOptions> = {}): Trainer {
  return new Trainer({
    model,
    optimizer: new SGD(model, { lr: 0.05, momentum: 0.9 }),
    progress: false,
    ...extra,
  });
}

/** Every parameter value and buffer of a model, on the host. */
function snapshot(model: Module): Float32Array[] {
  return [...model.stateDict().values()].filter((e) => e.dtype === 'f32').map((e) => e.data as Float32Array);
}

describe('Trainer with distillation', () => {
  it('trains the student on the distillation loss; the teacher gets no gradients and keeps its weights', async () => {
    const teacher = tinyNet(11);
    // Batch statistics moved away from their initial values, so that evaluation mode matters.
    const warm = trainer(teacher);
    await warm.fit(loader(), { epochs: 1 });
    await warm.dispose();
    teacher.train();
    const before = snapshot(teacher);
    const student = tinyNet(5);
    const t = trainer(student, { distillation: { teacher, temperature: 3, alpha: 0.7 } });
    await t.fit(loader(), { epochs: 2 });
    expect(t.distillation?.teacher).toBe(teacher);
    // Evaluation mode throughout, and not one value of the teacher changed: no optimizer step, no
    // running-statistics update.
    expect(teacher.training).toBe(false);
    expect(snapshot(teacher)).toEqual(before);
    expect(Math.max(...teacher.arena().grads.toFloat32Array().map(Math.abs))).toBe(0);
    // The student learned.
    const initial = tinyNet(5);
    expect(snapshot(student)).not.toEqual(snapshot(initial));
    await t.dispose();
    for (const m of [teacher, student, initial]) m.dispose();
  });

  it('runs the teacher on the input the student sees: a copy of the student as teacher gives a zero first loss', async () => {
    // Without batch norm, the student's training forward and the teacher's evaluation forward are
    // the same function, so alpha = 1 against an identical teacher is a loss of exactly 0.
    const student = tinyNet(5, 4, false);
    const teacher = tinyNet(5, 4, false);
    const losses: number[] = [];
    const t = trainer(student, {
      distillation: { teacher, temperature: 2, alpha: 1 },
      callbacks: [{ onStepEnd: (_, info) => void losses.push(info.loss()) }],
    });
    await t.fit(loader(), { epochs: 1, maxSteps: 2 });
    expect(losses[0]).toBe(0);
    // After a step the student differs from the teacher only if it got a gradient: it did not.
    expect(snapshot(student)).toEqual(snapshot(teacher));
    await t.dispose();
    student.dispose();
    teacher.dispose();
  });

  it('with alpha = 0 trains exactly as without distillation, and evaluates the student with the plain cross-entropy', async () => {
    const plainModel = tinyNet(5);
    const plain = trainer(plainModel, { labelSmoothing: 0.1 });
    await plain.fit(loader(), { epochs: 1 });
    const teacher = tinyNet(11);
    const kdModel = tinyNet(5);
    const kd = trainer(kdModel, { labelSmoothing: 0.1, distillation: { teacher, temperature: 4, alpha: 0 } });
    await kd.fit(loader(), { epochs: 1 });
    expect(snapshot(kdModel)).toEqual(snapshot(plainModel));
    const a = await plain.evaluate(loader());
    const b = await kd.evaluate(loader());
    expect(b.loss).toBe(a.loss);
    expect(b.acc1).toBe(a.acc1);
    for (const x of [plain, kd]) await x.dispose();
    for (const m of [plainModel, teacher, kdModel]) m.dispose();
  });

  it('refuses a teacher with other classes, the student itself, and bad temperature or alpha', () => {
    const student = ResNet18({ numClasses: 4, smallInput: true });
    const other = ResNet18({ numClasses: 10, smallInput: true });
    const teacher = ResNet18({ numClasses: 4, smallInput: true });
    expect(() => trainer(student, { distillation: { teacher: other } })).toThrow(
      /distillation\.teacher has 10 classes but the student 4/,
    );
    expect(() => trainer(student, { distillation: { teacher: student } })).toThrow(/separate model/);
    expect(() => trainer(student, { distillation: { teacher, temperature: 0 } })).toThrow(/distillation\.temperature/);
    expect(() => trainer(student, { distillation: { teacher, alpha: 1.5 } })).toThrow(/distillation\.alpha/);
    expect(() => trainer(student, { distillation: { teacher: 'resnet18' as never } })).toThrow(/distillation\.teacher/);
    expect(() => trainer(student, { distillation: { teacher, beta: 1 } as never })).toThrow(/beta/);
    for (const m of [student, other, teacher]) m.dispose();
  });

  it('refuses, at the first step, a teacher whose logits do not match the student (no class count declared)', async () => {
    const student = tinyNet(5);
    const teacher = tinyNet(11, 3);
    const t = trainer(student, { distillation: { teacher } });
    await expect(t.fit(loader(), { epochs: 1 })).rejects.toThrow(/teacherLogits/);
    await t.dispose();
    student.dispose();
    teacher.dispose();
  });
});
