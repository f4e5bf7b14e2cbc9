/**
 * Knowledge distillation on the built-in generated dataset: a teacher is trained once, then a
 * ResNet-18 student is trained for the same short budget twice per seed, alone (cross-entropy)
 * and distilled from the teacher, from the same initialisation and the same batches. Prints the
 * validation top-1 of each run, per seed and on average, and a JSON line with every number.
 *
 *   node dist/examples/distillation.js [--teacher-model resnet18|resnet34|resnet50] [--teacher-steps 200]
 *     [--student-steps 40] [--seeds 1,2,3,4,5,6] [--temperature 2] [--alpha 0.5] [--size 16] [--batch 16]
 *     [--train 1600] [--lr 0.02] [--device cpu] [--amp bf16] [--teacher-file FILE]
 *
 * With --teacher-file, the teacher's weights are read from FILE when it exists (its training is
 * skipped), and written there after training otherwise, so that other student settings can be
 * tried against the same teacher.
 */
import { existsSync } from 'node:fs';
import { parseArgs } from 'node:util';
import {
  CosineAnnealingLR,
  DataLoader,
  LinearWarmup,
  ResNet,
  SGD,
  SequentialSchedule,
  ShapesDataset,
  Trainer,
  listBackends,
  loadWeights,
  saveWeights,
  type TrainerOptions,
} from '../lib/index.js';

const { values } = parseArgs({
  options: {
    'teacher-model': { type: 'string', default: 'resnet18' },
    'teacher-steps': { type: 'string', default: '200' },
    'student-steps': { type: 'string', default: '40' },
    seeds: { type: 'string', default: '1,2,3,4,5,6' },
    temperature: { type: 'string', default: '2' },
    alpha: { type: 'string', default: '0.5' },
    size: { type: 'string', default: '16' },
    batch: { type: 'string', default: '16' },
    train: { type: 'string', default: '1600' },
    lr: { type: 'string', default: '0.02' },
    device: { type: 'string', default: 'cpu' },
    amp: { type: 'string', default: 'none' },
    'teacher-file': { type: 'string' },
  },
});
const DEPTHS = { resnet18: 18, resnet34: 34, resnet50: 50 } as const;
const teacherName = values['teacher-model'] as keyof typeof DEPTHS;
if (!(teacherName in DEPTHS)) throw new Error(`--teacher-model: one of ${Object.keys(DEPTHS).join(', ')}`);
const teacherSteps = Number(values['teacher-steps']);
const studentSteps = Number(values['student-steps']);
const seeds = values.seeds.split(',').map(Number);
const temperature = Number(values.temperature);
const alpha = Number(values.alpha);
const size = Number(values.size);
const batchSize = Number(values.batch);
const lr = Number(values.lr);
const device = values.device;
const amp = values.amp === 'bf16' ? 'bf16' : values.amp === 'fp16' ? 'fp16' : false;
const classes = 4;

const train = new ShapesDataset({ length: Number(values.train), size, classes, seed: 0 });
const val = new ShapesDataset({ length: 512, size, classes, seed: 1 });
const valLoader = new DataLoader(val, { batchSize: 128, workers: 0, device });

/** Linear warm-up over a tenth of the steps, then cosine decay to zero. */
function schedule(steps: number): SequentialSchedule {
  const warmup = Math.max(1, Math.round(steps / 10));
  return new SequentialSchedule({
    schedules: [
      new LinearWarmup({ totalIters: warmup, startFactor: 0.1 }),
      new CosineAnnealingLR({ tMax: steps - warmup }),
    ],
    milestones: [warmup],
  });
}

/** Trains `model` for `steps` optimizer steps on the training set (shuffled by `seed`); returns the validation top-1. */
async function trainAndEvaluate(
  model: ResNet,
  steps: number,
  seed: number,
  extra: Partial<TrainerOptions> = {},
): Promise<{ acc1: number; seconds: number }> {
  const loader = new DataLoader(train, { batchSize, shuffle: true, seed, workers: 0, device, dropLast: true });
  const trainer = new Trainer({
    model,
    optimizer: new SGD(model, { lr, momentum: 0.9, weightDecay: 5e-4, nesterov: true }),
    device,
    amp,
    schedule: schedule(steps),
    progress: false,
    ...extra,
  });
  const started = performance.now();
  try {
    await trainer.fit(loader, { epochs: Math.ceil(steps / loader.length), maxSteps: steps });
    const seconds = (performance.now() - started) / 1000;
    return { acc1: (await trainer.evaluate(valLoader)).acc1, seconds };
  } finally {
    await trainer.dispose();
    await loader.close();
  }
}

/** The validation top-1 of `model` as it is. */
async function evaluateOnly(model: ResNet): Promise<number> {
  const trainer = new Trainer({ model, optimizer: new SGD(model, { lr }), device, amp, progress: false });
  try {
    return (await trainer.evaluate(valLoader)).acc1;
  } finally {
    await trainer.dispose();
  }
}

function build(depth: 18 | 34 | 50, seed: number): ResNet {
  return new ResNet(depth, { numClasses: classes, smallInput: true, seed, device });
}

const cpu = listBackends().find((b) => b.name === 'cpu');
console.log(
  `knowledge distillation on generated shapes: ${size} px, ${classes} classes, ${train.length} training and ${val.length} validation images, batch ${batchSize}, ${device}` +
    (cpu?.properties
      ? ` [oneDNN ${cpu.properties.onednn}, ${cpu.properties.isa}, ${cpu.properties.threads} threads]`
      : ''),
);
const teacher = build(DEPTHS[teacherName], 1000);
const teacherFile = values['teacher-file'];
let teacherAcc1: number;
if (teacherFile !== undefined && existsSync(teacherFile)) {
  await loadWeights(teacherFile, teacher);
  teacherAcc1 = await evaluateOnly(teacher);
  console.log(`teacher ${teacherName}: weights from ${teacherFile}, val acc@1 ${(100 * teacherAcc1).toFixed(2)}%`);
} else {
  const teacherRun = await trainAndEvaluate(teacher, teacherSteps, 1000);
  teacherAcc1 = teacherRun.acc1;
  console.log(
    `teacher ${teacherName}: ${teacherSteps} steps, val acc@1 ${(100 * teacherRun.acc1).toFixed(2)}% (${teacherRun.seconds.toFixed(0)} s)`,
  );
  if (teacherFile !== undefined) await saveWeights(teacherFile, teacher);
}
console.log(`students: ResNet-18, ${studentSteps} steps each; distilled with T = ${temperature}, alpha = ${alpha}`);

const rows: { seed: number; alone: number; distilled: number }[] = [];
for (const seed of seeds) {
  const alone = build(18, seed);
  const a = await trainAndEvaluate(alone, studentSteps, seed);
  alone.dispose();
  const student = build(18, seed);
  const d = await trainAndEvaluate(student, studentSteps, seed, { distillation: { teacher, temperature, alpha } });
  student.dispose();
  rows.push({ seed, alone: a.acc1, distilled: d.acc1 });
  console.log(
    `seed ${seed}: alone ${(100 * a.acc1).toFixed(2)}% (${a.seconds.toFixed(0)} s), distilled ${(100 * d.acc1).toFixed(2)}% (${d.seconds.toFixed(0)} s)`,
  );
}
const mean = (f: (r: (typeof rows)[number]) => number): number => rows.reduce((s, r) => s + f(r), 0) / rows.length;
console.log(
  `mean over ${rows.length} seeds: alone ${(100 * mean((r) => r.alone)).toFixed(2)}%, distilled ${(100 * mean((r) => r.distilled)).toFixed(2)}%, ` +
    `distilled better in ${rows.filter((r) => r.distilled > r.alone).length} of ${rows.length}`,
);
console.log(
  JSON.stringify({
    teacher: { model: teacherName, steps: teacherSteps, acc1: teacherAcc1 },
    student: { model: 'resnet18', steps: studentSteps, temperature, alpha },
    size,
    batchSize,
    train: train.length,
    rows,
  }),
);
teacher.dispose();
