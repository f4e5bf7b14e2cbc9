/**
 * Misuse of tensors and ops through the public API and the raw binding: shapes whose sizes
 * overflow, numbers that do not fit the dtype, and op arguments of the wrong dtype, shape or
 * device. Every case returns the right result or throws a coded error naming the parameter; the
 * cases that once crashed the process run in a child process (isolated.ts), against dist/.
 */
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { addon } from '../../lib/binding.js';
import { Tensor } from '../../lib/index.js';
import { describeResult, runIsolated } from './isolated.js';

/** Asserts that `fn` throws an error with `code` whose message matches `names`. */
function expectCoded(fn: () => unknown, code: string, names: RegExp): void {
  let caught: unknown;
  try {
    fn();
  } catch (e) {
    caught = e;
  }
  expect(caught, 'expected an error').toBeInstanceOf(Error);
  const error = caught as Error & { code?: string };
  expect(error.code, error.message).toBe(code);
  expect(error.message).toMatch(names);
}

const emulator = resolve('build/Release/libresnet_cuda_emulator.so');
const dist = resolve('dist/lib/index.js');

describe('sgd step arguments', () => {
  const params = () => Tensor.zeros([4]);
  const step = (extra: Record<string, unknown>) => () =>
    addon().sgdStep({
      params: params().raw,
      grads: Tensor.zeros([4]).raw,
      groups: [{ lr: 0.1 }],
      segments: Int32Array.of(0, 4, 0),
      ...extra,
    });

  it('refuses a found-inf flag that is not f32', () => {
    expectCoded(
      step({ foundInf: Tensor.zeros([1], { dtype: 'i32' }).raw }),
      'ERR_RC_INVALID_ARGUMENT',
      /foundInf.*f32/,
    );
  });

  it('accepts an f32[1] found-inf flag and skips the step when it is set', () => {
    const p = Tensor.full([4], 1);
    addon().sgdStep({
      params: p.raw,
      grads: Tensor.full([4], 1).raw,
      groups: [{ lr: 0.5 }],
      segments: Int32Array.of(0, 4, 0),
      foundInf: Tensor.full([1], 1).raw,
    });
    expect([...p.toFloat32Array()]).toEqual([1, 1, 1, 1]);
  });

  it.skipIf(!existsSync(emulator) || !existsSync(dist))(
    'refuses grads and a found-inf flag on another device than params',
    () => {
      for (const moved of ['grads', 'foundInf']) {
        const result = runIsolated(
          `const { addon } = await import(${JSON.stringify(resolve('dist/lib/binding.js'))});
         const cpu = (shape) => rc.Tensor.zeros(shape).raw, gpu = (shape) => rc.Tensor.zeros(shape, { device: 'cuda:0' }).raw;
         addon().sgdStep({ params: cpu([4]), grads: ${moved === 'grads' ? 'gpu' : 'cpu'}([4]), groups: [{ lr: 0.1 }],
           segments: Int32Array.of(0, 4, 0), foundInf: ${moved === 'foundInf' ? 'gpu' : 'cpu'}([1]) });`,
          { env: { RESNET_CUDA_BACKEND_LIBRARY: emulator } },
        );
        expect(result.signal, describeResult(result)).toBeNull();
        expect(result.outcome, describeResult(result)).toMatchObject({ ok: false, code: 'ERR_RC_INVALID_ARGUMENT' });
        expect(result.outcome && !result.outcome.ok && result.outcome.message).toMatch(/different devices|not on/);
      }
    },
  );
});

/** A seeded generator of test values (xorshift32), so that a failing case can be replayed. */
function seeded(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s / 2 ** 32;
  };
}

const CODED_SIZE_ERROR = /^ERR_RC_(OUT_OF_MEMORY|INVALID_ARGUMENT)$/;

/** Asserts that a snippet run in a child process ended normally with a coded error naming `names`. */
function expectIsolatedCoded(body: string, names: RegExp): void {
  const result = runIsolated(body);
  expect(result.signal, describeResult(result)).toBeNull();
  expect(result.outcome?.ok, describeResult(result)).toBe(false);
  const outcome = result.outcome as { code?: string; message: string };
  expect(outcome.code, describeResult(result)).toMatch(CODED_SIZE_ERROR);
  expect(outcome.message).toMatch(names);
}

describe('shapes whose sizes overflow', () => {
  it.skipIf(!existsSync(dist))('refuse them where they once crashed the process', () => {
    expectIsolatedCoded(
      `new rc.InputNormalize().forward(rc.Tensor.empty([2 ** 31, 2 ** 31, 4, 3], { dtype: 'u8' }));`,
      /shape|elements|bytes/,
    );
    expectIsolatedCoded(
      `new rc.Linear({ inFeatures: 4, outFeatures: 4 }).forward(rc.Tensor.empty([2 ** 62, 4]));`,
      /shape|elements|bytes/,
    );
  });

  it('refuse them when creating a tensor, whatever the dtype', () => {
    const random = seeded(12);
    const big = [2 ** 30, 2 ** 31, 2 ** 32, 2 ** 40, 2 ** 52, 2 ** 53];
    for (let i = 0; i < 60; i++) {
      const rank = 2 + Math.floor(random() * 3);
      const shape = Array.from({ length: rank }, () => big[Math.floor(random() * big.length)]!);
      const dtype = (['f32', 'bf16', 'f16', 'i32', 'i64', 'u8'] as const)[Math.floor(random() * 6)]!;
      if (shape.reduce((a, b) => a * b, 1) < 2 ** 63) continue;
      expectCoded(() => Tensor.empty(shape, { dtype }), 'ERR_RC_INVALID_ARGUMENT', /shape/);
      expectCoded(() => Tensor.full(shape, 1, { dtype }), 'ERR_RC_INVALID_ARGUMENT', /shape/);
    }
    expectCoded(() => Tensor.full([2 ** 30, 2 ** 30, 2 ** 30], 1), 'ERR_RC_INVALID_ARGUMENT', /shape/);
    expectCoded(() => Tensor.zeros([2 ** 62, 4]), 'ERR_RC_INVALID_ARGUMENT', /shape/);
  });

  it('refuse byte counts past what memory can hold as out of memory', () => {
    // 2^61 f32 elements: the element count fits 64 bits, the byte count does not.
    expectCoded(() => Tensor.empty([2 ** 31, 2 ** 30], { dtype: 'f32' }), 'ERR_RC_OUT_OF_MEMORY', /bytes|GiB/);
    expectCoded(() => Tensor.empty([2 ** 31, 2 ** 31], { dtype: 'i64' }), 'ERR_RC_OUT_OF_MEMORY', /bytes|GiB/);
  });

  it('refuse views and reshapes whose element count overflows', () => {
    const t = Tensor.zeros([4]);
    expectCoded(() => t.reshape([2 ** 62, 4]), 'ERR_RC_INVALID_ARGUMENT', /shape/);
    expectCoded(() => t.view(0, [2 ** 62, 4]), 'ERR_RC_INVALID_ARGUMENT', /shape/);
    expectCoded(() => t.view(2 ** 62, [1]), 'ERR_RC_INVALID_ARGUMENT', /offset|outside/);
  });
});

describe('numbers that do not fit the dtype', () => {
  it('refuses out-of-range and non-integral values for integer dtypes, naming data', () => {
    expectCoded(() => Tensor.from([300, -1, 1.7], [3], { dtype: 'u8' }), 'ERR_RC_INVALID_ARGUMENT', /u8 for data\[0\]/);
    expectCoded(() => Tensor.from([1, -1], [2], { dtype: 'u8' }), 'ERR_RC_INVALID_ARGUMENT', /data\[1\]/);
    expectCoded(() => Tensor.from([1.5], [1], { dtype: 'i32' }), 'ERR_RC_INVALID_ARGUMENT', /i32 for data\[0\]/);
    expectCoded(() => Tensor.from([0, NaN], [2], { dtype: 'i32' }), 'ERR_RC_INVALID_ARGUMENT', /data\[1\]/);
    expectCoded(() => Tensor.from([1e20], [1], { dtype: 'i32' }), 'ERR_RC_INVALID_ARGUMENT', /data\[0\]/);
    expect([...Tensor.from([0, 255, 7], [3], { dtype: 'u8' }).toArray()]).toEqual([0, 255, 7]);
    expect([...Tensor.from([-(2 ** 31), 2 ** 31 - 1], [2], { dtype: 'i32' }).toArray()]).toEqual([
      -(2 ** 31),
      2 ** 31 - 1,
    ]);
  });

  it('refuses fill values that the dtype cannot hold, naming value', () => {
    expectCoded(() => Tensor.full([2], 1e10, { dtype: 'u8' }), 'ERR_RC_INVALID_ARGUMENT', /value.*u8/);
    expectCoded(() => Tensor.full([2], 0.5, { dtype: 'i32' }), 'ERR_RC_INVALID_ARGUMENT', /value.*i32/);
    expectCoded(() => Tensor.full([2], 2 ** 31, { dtype: 'i32' }), 'ERR_RC_INVALID_ARGUMENT', /value/);
    expectCoded(() => Tensor.full([2], NaN, { dtype: 'i64' }), 'ERR_RC_INVALID_ARGUMENT', /value/);
    expectCoded(() => Tensor.full([2], 1e6, { dtype: 'f16' }), 'ERR_RC_INVALID_ARGUMENT', /value.*f16/);
    expectCoded(() => Tensor.full([2], '1' as unknown as number), 'ERR_RC_INVALID_ARGUMENT', /value/);
    expect([...Tensor.full([2], 255, { dtype: 'u8' }).toArray()]).toEqual([255, 255]);
    expect([...Tensor.full([1], -7, { dtype: 'i64' }).toArray()]).toEqual([-7n]);
    expect(Number.isNaN(Tensor.full([1], NaN).item())).toBe(true);
  });

  it('refuses fill values that the dtype cannot hold in the raw binding too', () => {
    expectCoded(
      () => addon().fill({ tensor: Tensor.zeros([2], { dtype: 'u8' }).raw, value: 256 }),
      'ERR_RC_INVALID_ARGUMENT',
      /value.*u8/,
    );
    expectCoded(
      () => addon().fill({ tensor: Tensor.zeros([2], { dtype: 'i32' }).raw, value: 1.25 }),
      'ERR_RC_INVALID_ARGUMENT',
      /value.*i32/,
    );
  });

  it('refuses a mean or std that is not finite, naming it', () => {
    expectCoded(() => Tensor.randn([2], { std: NaN }), 'ERR_RC_INVALID_ARGUMENT', /std/);
    expectCoded(() => Tensor.randn([2], { std: -1 }), 'ERR_RC_INVALID_ARGUMENT', /std/);
    expectCoded(() => Tensor.randn([2], { mean: Infinity }), 'ERR_RC_INVALID_ARGUMENT', /mean/);
    expectCoded(() => Tensor.randn([2], { dtype: 'u8' }), 'ERR_RC_INVALID_ARGUMENT', /dtype/);
  });

  it('refuses a typed array whose element type is not the tensor dtype, naming data', () => {
    const t = Tensor.zeros([4]);
    expectCoded(
      () => t.copyFromHost(new Uint8Array(16)),
      'ERR_RC_INVALID_ARGUMENT',
      /Float32Array for a f32 tensor for data/,
    );
    expectCoded(
      () => Tensor.zeros([4], { dtype: 'i32' }).copyFromHost(new Float32Array(4)),
      'ERR_RC_INVALID_ARGUMENT',
      /Int32Array .*for data/,
    );
    expectCoded(
      () => Tensor.zeros([2], { dtype: 'bf16' }).copyFromHost(new Int16Array(2)),
      'ERR_RC_INVALID_ARGUMENT',
      /Uint16Array .*for data/,
    );
    t.copyFromHost(Float32Array.of(1, 2, 3, 4));
    expect([...t.toFloat32Array()]).toEqual([1, 2, 3, 4]);
  });
});

describe('layer sizes beyond what the libraries take', () => {
  it('names the parameter for Conv2d, Linear and BatchNorm2d sizes past 32 bits or too many weights', async () => {
    const { BatchNorm2d, Conv2d, Linear } = await import('../../lib/index.js');
    expectCoded(
      () => new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 2 ** 31 }),
      'ERR_RC_INVALID_ARGUMENT',
      /kernelSize/,
    );
    expectCoded(
      () => new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: [3, 2 ** 31] }),
      'ERR_RC_INVALID_ARGUMENT',
      /kernelSize/,
    );
    expectCoded(
      () => new Conv2d({ inChannels: 3, outChannels: 1e9, kernelSize: 3 }),
      'ERR_RC_INVALID_ARGUMENT',
      /outChannels/,
    );
    expectCoded(
      () => new Conv2d({ inChannels: 2 ** 31, outChannels: 1, kernelSize: 1 }),
      'ERR_RC_INVALID_ARGUMENT',
      /inChannels/,
    );
    expectCoded(
      () => new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 3, stride: 2 ** 31 }),
      'ERR_RC_INVALID_ARGUMENT',
      /stride/,
    );
    expectCoded(
      () => new Conv2d({ inChannels: 3, outChannels: 8, kernelSize: 3, padding: 2 ** 40 }),
      'ERR_RC_INVALID_ARGUMENT',
      /padding/,
    );
    expectCoded(() => new Linear({ inFeatures: 1e9, outFeatures: 1e9 }), 'ERR_RC_INVALID_ARGUMENT', /outFeatures/);
    expectCoded(() => new BatchNorm2d({ numFeatures: 2 ** 40 }), 'ERR_RC_INVALID_ARGUMENT', /numFeatures/);
    expect(new Conv2d({ inChannels: 3, outChannels: 4, kernelSize: 3 }).weight.shape).toEqual([4, 3, 3, 3]);
  });

  it('refuses plan sizes past 32 bits in the raw binding with a coded error', () => {
    const conv = { device: 'cpu', dtype: 'f32' as const, n: 1, h: 8, w: 8, c: 3, k: 4, kernelH: 3, kernelW: 3 };
    for (const [key, value] of [
      ['n', 2 ** 31],
      ['k', 2 ** 40],
      ['kernelH', 2 ** 31],
      ['padH', 2 ** 62],
      ['strideW', 2 ** 32],
    ] as const) {
      expectCoded(() => new (addon().Conv2dPlan)({ ...conv, [key]: value }), 'ERR_RC_INVALID_ARGUMENT', /32-bit/);
    }
    expectCoded(
      () => new (addon().LinearPlan)({ device: 'cpu', dtype: 'f32', n: 2 ** 62, in: 4, out: 4 }),
      'ERR_RC_INVALID_ARGUMENT',
      /32-bit/,
    );
    const pool = {
      device: 'cpu',
      dtype: 'f32' as const,
      kind: 'max' as const,
      n: 1,
      h: 8,
      w: 8,
      c: 3,
      kernelH: 2,
      kernelW: 2,
    };
    expectCoded(() => new (addon().Pool2dPlan)({ ...pool, h: 2 ** 40 }), 'ERR_RC_INVALID_ARGUMENT', /32-bit/);
  });
});

describe('op arguments of the wrong dtype, shape or device through the public API', () => {
  it('gives a coded error naming the argument, for a seeded choice of wrong tensors', async () => {
    const rc = await import('../../lib/index.js');
    const random = seeded(34);
    const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)]!;
    const wrongDtype = () => pick(['i32', 'i64', 'u8'] as const);
    const cases: [string, () => unknown, RegExp][] = [];
    for (let i = 0; i < 6; i++) {
      const n = 1 + Math.floor(random() * 3),
        hw = 4 + Math.floor(random() * 4),
        c = 1 + Math.floor(random() * 4);
      const dtype = wrongDtype();
      cases.push(
        [
          'Conv2d dtype',
          () =>
            new rc.Conv2d({ inChannels: c, outChannels: 2, kernelSize: 3 }).forward(
              rc.Tensor.zeros([n, hw, hw, c], { dtype }),
            ),
          /Conv2d input/,
        ],
        [
          'Conv2d channels',
          () =>
            new rc.Conv2d({ inChannels: c + 1, outChannels: 2, kernelSize: 3 }).forward(
              rc.Tensor.zeros([n, hw, hw, c]),
            ),
          /Conv2d input/,
        ],
        [
          'Conv2d rank',
          () => new rc.Conv2d({ inChannels: c, outChannels: 2, kernelSize: 3 }).forward(rc.Tensor.zeros([hw, hw, c])),
          /Conv2d input/,
        ],
        [
          'Conv2d kernel larger than input',
          () =>
            new rc.Conv2d({ inChannels: c, outChannels: 2, kernelSize: hw + 1 }).forward(
              rc.Tensor.zeros([n, hw, hw, c]),
            ),
          /Conv2d input/,
        ],
        [
          'BatchNorm2d channels',
          () => new rc.BatchNorm2d({ numFeatures: c + 1 }).forward(rc.Tensor.zeros([n, hw, hw, c])),
          /BatchNorm2d input/,
        ],
        ['ReLU dtype', () => new rc.ReLU().forward(rc.Tensor.zeros([n, c], { dtype })), /ReLU input/],
        [
          'MaxPool2d kernel larger than input',
          () => new rc.MaxPool2d({ kernelSize: hw + 1 }).forward(rc.Tensor.zeros([n, hw, hw, c])),
          /MaxPool2d input/,
        ],
        ['MaxPool2d padding', () => new rc.MaxPool2d({ kernelSize: 2, padding: 2 }), /padding/],
        [
          'Linear features',
          () => new rc.Linear({ inFeatures: c + 1, outFeatures: 2 }).forward(rc.Tensor.zeros([n, c])),
          /Linear input/,
        ],
        [
          'Linear dtype',
          () => new rc.Linear({ inFeatures: c, outFeatures: 2 }).forward(rc.Tensor.zeros([n, c], { dtype })),
          /Linear input/,
        ],
        [
          'CrossEntropyLoss labels',
          () =>
            new rc.CrossEntropyLoss().forward(
              rc.Tensor.zeros([n, c]),
              Array.from({ length: n + 1 }, () => 0),
            ),
          /labels/,
        ],
        ['InputNormalize dtype', () => new rc.InputNormalize().forward(rc.Tensor.zeros([n, hw, hw, 3])), /images/],
        [
          'ReLU gradOutput shape',
          () => {
            const relu = new rc.ReLU();
            relu.forward(rc.Tensor.zeros([n, c]));
            return relu.backward(rc.Tensor.zeros([n, c + 1]));
          },
          /ReLU gradOutput/,
        ],
      );
    }
    for (const [label, fn, names] of cases) {
      let caught: unknown;
      try {
        fn();
      } catch (e) {
        caught = e;
      }
      expect(caught, label).toBeInstanceOf(Error);
      expect((caught as { code?: string }).code, `${label}: ${String(caught)}`).toBe('ERR_RC_INVALID_ARGUMENT');
      expect((caught as Error).message, label).toMatch(names);
    }
  });

  it.skipIf(!existsSync(emulator) || !existsSync(dist))(
    'refuses tensors on another device than the module or op, without crashing',
    () => {
      const result = runIsolated(
        `const { addon } = await import(${JSON.stringify(resolve('dist/lib/binding.js'))});
       const cpu = (shape, dtype = 'f32') => rc.Tensor.zeros(shape, { dtype }), gpu = (shape, dtype = 'f32') => rc.Tensor.zeros(shape, { dtype, device: 'cuda:0' });
       const errors = [];
       const attempt = (label, fn) => { try { fn(); errors.push([label, 'no error']); } catch (e) { errors.push([label, e.code, e.message]); } };
       attempt('relu', () => addon().relu({ x: cpu([4]).raw, y: gpu([4]).raw }));
       attempt('add', () => addon().add({ a: gpu([4]).raw, b: gpu([4]).raw, out: cpu([4]).raw }));
       attempt('cast', () => addon().cast({ src: cpu([4]).raw, dst: gpu([4], 'bf16').raw }));
       attempt('lerp', () => addon().lerp({ a: gpu([4]).raw, b: cpu([4]).raw, weight: 0.5 }));
       attempt('gradNorm', () => addon().gradNorm({ grads: cpu([4]).raw, out: gpu([1]).raw }));
       attempt('scalerUpdate', () => addon().scalerUpdate({ scale: gpu([1]).raw, growthTracker: gpu([1], 'i32').raw, foundInf: cpu([1]).raw, growthFactor: 2, backoffFactor: 0.5, growthInterval: 10 }));
       const plan = new (addon().LinearPlan)({ device: 'cuda:0', dtype: 'f32', n: 2, in: 3, out: 4, bias: false });
       attempt('linear', () => plan.forward({ x: gpu([2, 3]).raw, weight: cpu([4, 3]).raw, y: gpu([2, 4]).raw }));
       const linear = new rc.Linear({ inFeatures: 3, outFeatures: 4 });
       linear.forward(cpu([2, 3]));
       attempt('Linear module placed on cpu', () => linear.forward(gpu([2, 3])));
       return errors;`,
        { env: { RESNET_CUDA_BACKEND_LIBRARY: emulator } },
      );
      expect(result.signal, describeResult(result)).toBeNull();
      expect(result.outcome?.ok, describeResult(result)).toBe(true);
      for (const [label, code, message] of (result.outcome as { value: [string, string, string][] }).value) {
        expect(code, `${label}: ${message}`).toMatch(/^ERR_RC_(INVALID_ARGUMENT|DEVICE)$/);
        expect(message, label).toMatch(/device|cuda:0|cpu/);
      }
    },
  );
});
