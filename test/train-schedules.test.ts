/**
 * Learning-rate schedules against PyTorch's formulas at chosen steps. The expected numbers were
 * worked out from torch.optim.lr_scheduler's closed forms (OneCycleLR's from its phase table and
 * annealing functions), not from this implementation.
 */
import { describe, expect, it } from 'vitest';
import {
  ConstantSchedule,
  ConstantWarmup,
  CosineAnnealingLR,
  ExponentialLR,
  LinearWarmup,
  MultiStepLR,
  OneCycleLR,
  ReduceLROnPlateau,
  Scheduler,
  SequentialSchedule,
  StepLR,
  scaleLrForBatch,
  type LrGroups,
  type ReduceLROnPlateauState,
  type Schedule,
  type SchedulerState,
} from '../lib/train/schedules.js';
import type { SGD } from '../lib/optim/sgd.js';

// Compile-time check that the real optimizer fits what schedulers drive (type-only: no addon load).
export const sgdFitsScheduler: (o: SGD) => LrGroups = (o) => o;

/** Equal to within a relative 1e-12: the formulas are the same, the operation order may differ. */
function close(actual: number, expected: number): void {
  expect(Math.abs(actual - expected)).toBeLessThanOrEqual(1e-12 * Math.max(1e-3, Math.abs(expected)));
}

function values(s: Schedule, baseLr: number, steps: number[], stepsPerEpoch?: number): number[] {
  return steps.map((t) => s.lrAt(t, baseLr, stepsPerEpoch));
}

function code(f: () => unknown): string | undefined {
  try {
    f();
  } catch (e) {
    return (e as { code?: string }).code;
  }
  return undefined;
}

describe('warmups', () => {
  it('LinearWarmup is LinearLR: base * (start + (end - start) * min(t, total) / total)', () => {
    // torchvision's recipe: lr 0.5, lr_warmup_decay 0.01, 5 warmup epochs.
    const w = new LinearWarmup({ totalIters: 5, startFactor: 0.01 });
    close(w.lrAt(0, 0.5), 0.005);
    close(w.lrAt(2, 0.5), 0.5 * (0.01 + 0.99 * 0.4)); // 0.203
    close(w.lrAt(5, 0.5), 0.5);
    close(w.lrAt(10, 0.5), 0.5);
    // PyTorch's default start factor is 1/3.
    const dflt = new LinearWarmup({ totalIters: 4 });
    close(dflt.lrAt(0, 0.3), 0.1);
    close(dflt.lrAt(2, 0.3), 0.2);
    close(dflt.lrAt(4, 0.3), 0.3);
  });

  it('ConstantWarmup is ConstantLR: base * factor before totalIters, then base', () => {
    const w = new ConstantWarmup({ factor: 0.5, totalIters: 3 });
    expect(values(w, 0.1, [0, 1, 2, 3, 100])).toEqual([0.05, 0.05, 0.05, 0.1, 0.1]);
    expect(new ConstantSchedule().lrAt(1234, 0.7)).toBe(0.7);
  });
});

describe('decays', () => {
  it('CosineAnnealingLR: minLr + (base - minLr) * (1 + cos(pi t / tMax)) / 2, periodic past tMax as in PyTorch', () => {
    const c = new CosineAnnealingLR({ tMax: 10, minLr: 0.001 });
    close(c.lrAt(0, 0.1), 0.1);
    close(c.lrAt(2, 0.1), 0.0905463412215599); // cos(0.2 pi) = 0.809017
    close(c.lrAt(5, 0.1), 0.0505);
    close(c.lrAt(10, 0.1), 0.001);
    close(c.lrAt(15, 0.1), 0.0505);
    close(c.lrAt(20, 0.1), 0.1);
  });

  it('StepLR counted in epochs changes at the first step of each period', () => {
    const s = new StepLR({ stepSize: 30, gamma: 0.1, interval: 'epoch' });
    close(s.lrAt(0, 0.1, 100), 0.1);
    close(s.lrAt(2999, 0.1, 100), 0.1);
    close(s.lrAt(3000, 0.1, 100), 0.01);
    close(s.lrAt(6000, 0.1, 100), 0.001);
    expect(code(() => s.lrAt(10, 0.1))).toBe('ERR_RC_INVALID_ARGUMENT'); // no stepsPerEpoch
  });

  it('MultiStepLR: gamma ** (milestones <= t), repeated milestones counting twice', () => {
    const m = new MultiStepLR({ milestones: [80, 30], gamma: 0.1 });
    close(m.lrAt(29, 0.1), 0.1);
    close(m.lrAt(30, 0.1), 0.01);
    close(m.lrAt(79, 0.1), 0.01);
    close(m.lrAt(80, 0.1), 0.001);
    close(new MultiStepLR({ milestones: [30, 30], gamma: 0.5 }).lrAt(30, 1), 0.25);
  });

  it('ExponentialLR: base * gamma ** t', () => {
    close(new ExponentialLR({ gamma: 0.9 }).lrAt(3, 1), 0.729);
    close(new ExponentialLR({ gamma: 0.9, interval: 'epoch' }).lrAt(35, 2, 10), 2 * 0.729);
  });
});

describe('OneCycleLR', () => {
  // max_lr 0.1, total_steps 100, pct_start 0.3: initial = 0.1 / 25 = 0.004, min = 0.004 / 1e4 = 4e-7,
  // phase 1 ends at step 0.3 * 100 - 1 = 29, phase 2 at 99.
  const cycle = new OneCycleLR({ maxLr: 0.1, totalSteps: 100 });

  it('follows the phase table with cosine annealing', () => {
    close(cycle.lrAt(0, 123), 0.004); // the base lr is ignored when maxLr is given
    // 0.1 + (0.004 - 0.1) / 2 * (cos(pi * 14 / 29) + 1)
    close(cycle.lrAt(14, 123), 0.04940133238789996);
    close(cycle.lrAt(29, 123), 0.1);
    // halfway down: 4e-7 + (0.1 - 4e-7) / 2
    close(cycle.lrAt(64, 123), 0.0500002);
    close(cycle.lrAt(99, 123), 4e-7);
    // PyTorch accepts step == total_steps (one past the end) and rejects anything beyond.
    close(cycle.lrAt(100, 123), 5.074647154757325e-5);
    expect(code(() => cycle.lrAt(101, 123))).toBe('ERR_RC_INVALID_ARGUMENT');
  });

  it('linear annealing, fractional phase ends, three phases, and maxLr from the group', () => {
    const lin = new OneCycleLR({ maxLr: 0.1, totalSteps: 100, annealStrategy: 'linear' });
    close(lin.lrAt(10, 0), 0.004 + (0.1 - 0.004) * (10 / 29)); // 0.0371034...
    close(lin.lrAt(64, 0), 0.0500002);
    // pct_start 0.25 of 10 steps: phase 1 ends at step 1.5, as PyTorch's float end step.
    const short = new OneCycleLR({ totalSteps: 10, pctStart: 0.25 });
    close(short.lrAt(0, 1), 0.04);
    close(short.lrAt(1, 1), 0.7599999999999999);
    close(short.lrAt(2, 1), 0.9890738440717014);
    close(short.lrAt(9, 1), 4e-6);
    // Three phases: up to step 4, down to the initial lr at 8, to the minimum at 19.
    const three = new OneCycleLR({
      maxLr: 1,
      totalSteps: 20,
      pctStart: 0.25,
      divFactor: 10,
      finalDivFactor: 100,
      threePhase: true,
    });
    close(three.lrAt(4, 0), 1);
    close(three.lrAt(6, 0), 0.55);
    close(three.lrAt(8, 0), 0.1);
    close(three.lrAt(19, 0), 0.001);
  });
});

describe('SequentialSchedule', () => {
  it('warmup then cosine: the second schedule restarts its clock at the milestone (SequentialLR)', () => {
    const s = new SequentialSchedule({
      schedules: [new LinearWarmup({ totalIters: 5, startFactor: 0.1 }), new CosineAnnealingLR({ tMax: 10 })],
      milestones: [5],
    });
    close(s.lrAt(0, 1), 0.1);
    close(s.lrAt(4, 1), 0.82);
    close(s.lrAt(5, 1), 1);
    close(s.lrAt(10, 1), 0.5);
    close(s.lrAt(15, 1), 0);
  });

  it('mixes a per-step warmup with a per-epoch decay, milestones in epochs', () => {
    const s = new SequentialSchedule({
      schedules: [
        new LinearWarmup({ totalIters: 20 }),
        new MultiStepLR({ milestones: [3], gamma: 0.1, interval: 'epoch' }),
      ],
      milestones: [2],
      interval: 'epoch',
    });
    close(s.lrAt(19, 0.3, 10), 0.3 * (1 / 3 + (2 / 3) * (19 / 20)));
    close(s.lrAt(20, 0.3, 10), 0.3);
    close(s.lrAt(49, 0.3, 10), 0.3);
    close(s.lrAt(50, 0.3, 10), 0.03);
    expect(s.usesEpochs()).toBe(true);
  });

  it('rejects bad milestones', () => {
    const parts = [new ConstantSchedule(), new ConstantSchedule(), new ConstantSchedule()];
    expect(code(() => new SequentialSchedule({ schedules: parts, milestones: [5] }))).toBe('ERR_RC_INVALID_ARGUMENT');
    expect(code(() => new SequentialSchedule({ schedules: parts, milestones: [5, 5] }))).toBe(
      'ERR_RC_INVALID_ARGUMENT',
    );
    expect(() => new StepLR({ stepSize: 0 })).toThrow(/stepSize/);
    expect(() => new StepLR({ stepSize: 3, gama: 0.1 } as never)).toThrow(/Unknown option 'gama'/);
  });
});

describe('Scheduler', () => {
  it('scales every group from its own base lr and resumes exactly from state()', () => {
    const schedule = new SequentialSchedule({
      schedules: [new LinearWarmup({ totalIters: 3, startFactor: 0.25 }), new CosineAnnealingLR({ tMax: 8, minLr: 0 })],
      milestones: [3],
    });
    const opt = { paramGroups: [{ lr: 0.4 }, { lr: 0.04 }] };
    const sched = new Scheduler(opt, schedule);
    close(opt.paramGroups[0]!.lr, 0.1);
    close(opt.paramGroups[1]!.lr, 0.01);
    for (let i = 0; i < 5; i++) sched.step();
    expect(sched.stepCount).toBe(5);
    // step 5 = cosine step 2 of 8: 0.4 * (1 + cos(pi / 4)) / 2
    close(sched.lr, (0.4 * (1 + Math.SQRT1_2)) / 2);
    close(sched.lrs[1]!, (0.04 * (1 + Math.SQRT1_2)) / 2);

    const saved = JSON.parse(JSON.stringify(sched.state())) as SchedulerState;
    const opt2 = { paramGroups: [{ lr: 999 }, { lr: 999 }] };
    const resumed = new Scheduler(opt2, schedule);
    resumed.loadState(saved);
    expect(opt2.paramGroups.map((g) => g.lr)).toEqual(opt.paramGroups.map((g) => g.lr));
    for (let i = 0; i < 4; i++) {
      sched.step();
      resumed.step();
      expect(opt2.paramGroups.map((g) => g.lr)).toEqual(opt.paramGroups.map((g) => g.lr));
    }
    close(resumed.lrAt(11), 0); // the end of the cosine
  });

  it('needs stepsPerEpoch for epoch schedules and checks its state', () => {
    const opt = { paramGroups: [{ lr: 0.1 }] };
    expect(code(() => new Scheduler(opt, new StepLR({ stepSize: 1, interval: 'epoch' })))).toBe(
      'ERR_RC_INVALID_ARGUMENT',
    );
    const s = new Scheduler(opt, new StepLR({ stepSize: 2, interval: 'epoch' }), { stepsPerEpoch: 10 });
    for (let i = 0; i < 20; i++) s.step();
    close(opt.paramGroups[0]!.lr, 0.01);
    expect(code(() => s.loadState({ step: 1, baseLrs: [0.1, 0.2] }))).toBe('ERR_RC_INVALID_ARGUMENT');
    expect(code(() => s.loadState({ step: -1, baseLrs: [0.1] }))).toBe('ERR_RC_INVALID_ARGUMENT');
  });

  it('a step the schedule rejects (OneCycleLR past its end) changes nothing', () => {
    const opt = { paramGroups: [{ lr: 0.1 }] };
    const s = new Scheduler(opt, new OneCycleLR({ totalSteps: 4 }), { step: 3 });
    s.step(); // step 4 == totalSteps is allowed, as in PyTorch
    const lr = opt.paramGroups[0]!.lr;
    expect(code(() => s.step())).toBe('ERR_RC_INVALID_ARGUMENT');
    expect(s.stepCount).toBe(4);
    expect(opt.paramGroups[0]!.lr).toBe(lr);
  });

  it('scaleLrForBatch is the linear scaling rule', () => {
    close(scaleLrForBatch(0.1, 1024), 0.4);
    close(scaleLrForBatch(0.1, 64, 256), 0.025);
    close(scaleLrForBatch(0.5, 128, 1024), 0.0625);
    expect(code(() => scaleLrForBatch(0.1, 0))).toBe('ERR_RC_INVALID_ARGUMENT');
  });
});

describe('ReduceLROnPlateau', () => {
  it('reduces once more than `patience` evaluations fail to improve, then counts again from zero', () => {
    const opt = { paramGroups: [{ lr: 0.1 }] };
    const r = new ReduceLROnPlateau(opt, { patience: 2, factor: 0.5 });
    expect([1, 1, 1].map((m) => r.step(m))).toEqual([false, false, false]);
    expect(r.numBadEpochs).toBe(2);
    expect(r.step(1)).toBe(true); // 3 bad evaluations > patience 2
    close(opt.paramGroups[0]!.lr, 0.05);
    expect([1, 1].map((m) => r.step(m))).toEqual([false, false]);
    expect(r.step(1)).toBe(true);
    close(opt.paramGroups[0]!.lr, 0.025);
    // An improvement resets the count.
    expect([1, 1, 0.5, 1, 1].map((m) => r.step(m))).toEqual([false, false, false, false, false]);
    expect(r.best).toBe(0.5);
  });

  it('threshold: relative and absolute, min and max modes', () => {
    const opt = { paramGroups: [{ lr: 1 }] };
    const rel = new ReduceLROnPlateau(opt, { threshold: 0.1 });
    rel.step(1);
    rel.step(0.95); // needs < 1 * (1 - 0.1)
    expect([rel.best, rel.numBadEpochs]).toEqual([1, 1]);
    rel.step(0.89);
    expect([rel.best, rel.numBadEpochs]).toEqual([0.89, 0]);

    const abs = new ReduceLROnPlateau(opt, { threshold: 0.1, thresholdMode: 'abs' });
    abs.step(1);
    abs.step(0.95); // needs < 1 - 0.1
    expect(abs.numBadEpochs).toBe(1);
    abs.step(0.85);
    expect(abs.best).toBe(0.85);

    const max = new ReduceLROnPlateau(opt, { mode: 'max', threshold: 0.1 });
    max.step(1);
    max.step(1.05); // needs > 1 * 1.1
    expect([max.best, max.numBadEpochs]).toEqual([1, 1]);
    max.step(1.2);
    expect(max.best).toBe(1.2);

    const maxAbs = new ReduceLROnPlateau(opt, { mode: 'max', threshold: 0.5, thresholdMode: 'abs' });
    maxAbs.step(1);
    maxAbs.step(1.4);
    expect(maxAbs.best).toBe(1);
    maxAbs.step(1.6);
    expect(maxAbs.best).toBe(1.6);
  });

  it('cooldown: bad evaluations during the cooldown do not count', () => {
    const opt = { paramGroups: [{ lr: 1 }] };
    const r = new ReduceLROnPlateau(opt, { patience: 0, cooldown: 2, factor: 0.1 });
    // Reductions at evaluations 2 and 5: 3 and 4 are in the cooldown.
    expect([1, 1, 1, 1, 1].map((m) => r.step(m))).toEqual([false, true, false, false, true]);
    close(opt.paramGroups[0]!.lr, 0.01);
    expect(r.inCooldown).toBe(true);
  });

  it('minLr floors the lr (per group), and a reduction below eps is skipped', () => {
    const opt = { paramGroups: [{ lr: 0.1 }, { lr: 1 }] };
    const r = new ReduceLROnPlateau(opt, { patience: 0, factor: 0.1, minLr: [0.005, 0] });
    r.step(1);
    expect(r.step(1)).toBe(true);
    close(opt.paramGroups[0]!.lr, 0.01);
    expect(r.step(1)).toBe(true);
    expect(opt.paramGroups[0]!.lr).toBe(0.005);
    close(opt.paramGroups[1]!.lr, 0.01);
    const tiny = { paramGroups: [{ lr: 1e-8 }] };
    const t = new ReduceLROnPlateau(tiny, { patience: 0 });
    t.step(1);
    expect(t.step(1)).toBe(false); // 1e-8 - 1e-9 is not above eps = 1e-8
    expect(tiny.paramGroups[0]!.lr).toBe(1e-8);
  });

  it('state() survives JSON and restores the counters and lrs', () => {
    const opt = { paramGroups: [{ lr: 0.1 }] };
    const r = new ReduceLROnPlateau(opt, { patience: 1, cooldown: 3 });
    r.step(2);
    r.step(3);
    r.step(3); // reduces, cooldown starts
    r.step(4);
    const saved = JSON.parse(JSON.stringify(r.state())) as ReduceLROnPlateauState;
    const opt2 = { paramGroups: [{ lr: 0.1 }] };
    const r2 = new ReduceLROnPlateau(opt2, { patience: 1, cooldown: 3 });
    r2.loadState(saved);
    expect(opt2.paramGroups[0]!.lr).toBe(opt.paramGroups[0]!.lr);
    for (const m of [5, 5, 5, 5, 1, 2, 2, 2]) expect(r2.step(m)).toBe(r.step(m));
    expect(opt2.paramGroups[0]!.lr).toBe(opt.paramGroups[0]!.lr);
    // Before any evaluation the best is infinite, stored as null.
    expect(new ReduceLROnPlateau(opt).state().best).toBeNull();
    expect(() => new ReduceLROnPlateau(opt, { factor: 1 })).toThrow(/factor/);
  });
});
