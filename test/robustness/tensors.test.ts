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
    } as Parameters<ReturnType<typeof addon>['sgdStep']>[0]);

  it('refuses a found-inf flag that is not f32', () => {
    expectCoded(step({ foundInf: Tensor.zeros([1], { dtype: 'i32' }).raw }), 'ERR_RC_INVALID_ARGUMENT', /foundInf.*f32/);
  });

  it('accepts an f32[1] found-inf flag and skips the step when it is set', () => {
    const p = Tensor.full([4], 1);
    addon().sgdStep({ params: p.raw, grads: Tensor.full([4], 1).raw, groups: [{ lr: 0.5 }], segments: Int32Array.of(0, 4, 0), foundInf: Tensor.full([1], 1).raw });
    expect([...p.toFloat32Array()]).toEqual([1, 1, 1, 1]);
  });

  it.skipIf(!existsSync(emulator) || !existsSync(dist))('refuses grads and a found-inf flag on another device than params', () => {
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
  });
});
