/**
 * Calls the native layer must reject with a typed error rather than compute garbage or crash.
 * @packageDocumentation
 */
import { session, type OpCase, type Session } from './harness.js';

const INVALID = 'ERR_RC_INVALID_ARGUMENT';
const DISPOSED = 'ERR_RC_DISPOSED';

function rejectCase(name: string, body: (s: Session) => void): OpCase {
  return { name: `reject ${name}`, dtypes: ['f32'], run: (ctx) => session(ctx, `reject ${name}`, '', body) };
}

function smallConv(s: Session) {
  return s.own(
    new s.native.Conv2dPlan({
      device: s.ctx.device,
      dtype: 'f32',
      n: 1,
      h: 4,
      w: 4,
      c: 2,
      k: 3,
      kernelH: 3,
      kernelW: 3,
      padH: 1,
      padW: 1,
    }),
  );
}

/** Wrong shapes, wrong dtypes, out-of-range labels and disposed objects. */
export const badInputCases: OpCase[] = [
  rejectCase('conv2d.forward x of the wrong shape', (s) => {
    const plan = smallConv(s);
    s.expectThrow('x [1,4,5,2] for a plan of [1,4,4,2]', INVALID, () =>
      plan.forward({
        x: s.tensor([1, 4, 5, 2], 'f32'),
        weight: s.tensor([3, 3, 3, 2], 'f32'),
        y: s.tensor([1, 4, 4, 3], 'f32'),
      }),
    );
    s.expectThrow('weight in HWIO order [3,3,2,3]', INVALID, () =>
      plan.forward({
        x: s.tensor([1, 4, 4, 2], 'f32'),
        weight: s.tensor([3, 3, 2, 3], 'f32'),
        y: s.tensor([1, 4, 4, 3], 'f32'),
      }),
    );
  }),
  rejectCase('a window that does not fit the padded input, by less than one stride', (s) => {
    // (2 - 3) / 2 rounds to 0 when divided towards zero, which once made a 1x1 output of a window
    // that reads past the input; the division is floored.
    s.expectThrow('max pool 3x3 stride 2 over 2x2', INVALID, () =>
      s.own(
        new s.native.Pool2dPlan({
          device: s.ctx.device,
          dtype: 'f32',
          kind: 'max',
          n: 1,
          h: 2,
          w: 2,
          c: 1,
          kernelH: 3,
          kernelW: 3,
          strideH: 2,
          strideW: 2,
          padH: 0,
          padW: 0,
        }),
      ),
    );
    s.expectThrow('conv 3x3 stride 2 over 2x2', INVALID, () =>
      s.own(
        new s.native.Conv2dPlan({
          device: s.ctx.device,
          dtype: 'f32',
          n: 1,
          h: 2,
          w: 2,
          c: 1,
          k: 1,
          kernelH: 3,
          kernelW: 3,
          strideH: 2,
          strideW: 2,
        }),
      ),
    );
  }),
  rejectCase('conv2d.forward x of the wrong dtype', (s) => {
    const plan = smallConv(s);
    s.expectThrow('bf16 x for an f32 plan', INVALID, () =>
      plan.forward({
        x: s.tensor([1, 4, 4, 2], 'bf16'),
        weight: s.tensor([3, 3, 3, 2], 'f32'),
        y: s.tensor([1, 4, 4, 3], 'f32'),
      }),
    );
  }),
  rejectCase('relu with mismatched dtypes and shapes', (s) => {
    s.expectThrow('f32 x, bf16 y', INVALID, () =>
      s.native.relu({ x: s.tensor([2, 3], 'f32'), y: s.tensor([2, 3], 'bf16') }),
    );
    s.expectThrow('x [2,3], y [3,2]', INVALID, () =>
      s.native.relu({ x: s.tensor([2, 3], 'f32'), y: s.tensor([3, 2], 'f32') }),
    );
    s.expectThrow('i32 tensors', INVALID, () =>
      s.native.relu({ x: s.tensor([2, 3], 'i32'), y: s.tensor([2, 3], 'i32') }),
    );
  }),
  rejectCase('crossEntropy labels out of range', (s) => {
    for (const bad of [10, -1]) {
      const labels = s.tensor([4], 'i32', [0, 3, bad, 9]);
      // A device that does not wait for the kernel reports the label when the host next waits for it
      // (here, reading the loss), and only once.
      const loss = s.tensor([1], 'f32');
      s.expectThrow(`label ${bad} with 10 classes`, INVALID, () => {
        s.native.crossEntropy({ logits: s.tensor([4, 10], 'f32', new Float64Array(40)), labels, loss });
        s.read(loss);
      });
      s.read(loss);
    }
    s.expectThrow('f32 labels', INVALID, () =>
      s.native.crossEntropy({
        logits: s.tensor([4, 10], 'f32'),
        labels: s.tensor([4], 'f32'),
        loss: s.tensor([1], 'f32'),
      }),
    );
  }),
  rejectCase('batchnorm gamma of the wrong shape', (s) => {
    const c = (n: number) => s.tensor([n], 'f32');
    s.expectThrow('gamma [3] for 4 channels', INVALID, () =>
      s.native.batchNormForward({
        x: s.tensor([2, 2, 2, 4], 'f32'),
        gamma: c(3),
        beta: c(4),
        y: s.tensor([2, 2, 2, 4], 'f32'),
        runningMean: c(4),
        runningVar: c(4),
        saveMean: c(4),
        saveInvStd: c(4),
        training: true,
      }),
    );
  }),
  rejectCase('batchnorm backward beta of the wrong shape or dtype', (s) => {
    const c = (n: number, dtype: 'f32' | 'bf16' = 'f32') => s.tensor([n], dtype);
    const x = () => s.tensor([2, 2, 2, 4], 'f32');
    const backward = (beta: ReturnType<typeof c>) => () =>
      s.native.batchNormBackward({
        x: x(),
        y: x(),
        dy: x(),
        gamma: c(4),
        beta,
        saveMean: c(4),
        saveInvStd: c(4),
        dx: x(),
        dGamma: c(4),
        dBeta: c(4),
        relu: true,
      });
    s.expectThrow('beta [3] for 4 channels', INVALID, backward(c(3)));
    s.expectThrow('bf16 beta', INVALID, backward(c(4, 'bf16')));
  }),
  rejectCase('sgdStep segment outside the arena', (s) => {
    s.expectThrow('segment [90, +20) of an arena of 100', INVALID, () =>
      s.native.sgdStep({
        params: s.tensor([100], 'f32'),
        grads: s.tensor([100], 'f32'),
        groups: [{ lr: 0.1 }],
        segments: Int32Array.from([90, 20, 0]),
      }),
    );
  }),
  rejectCase('lerp with bad tensors or weights', (s) => {
    const a = s.tensor([10], 'f32');
    s.expectThrow('bf16 a', INVALID, () =>
      s.native.lerp({ a: s.tensor([10], 'bf16'), b: s.tensor([10], 'f32'), weight: 0.5 }),
    );
    s.expectThrow('i32 b', INVALID, () => s.native.lerp({ a, b: s.tensor([10], 'i32'), weight: 0.5 }));
    s.expectThrow('b of 11 elements for a of 10', INVALID, () =>
      s.native.lerp({ a, b: s.tensor([11], 'f32'), weight: 0.5 }),
    );
    for (const weight of [-0.1, 1.5, NaN, Infinity]) {
      s.expectThrow(`weight ${weight}`, INVALID, () => s.native.lerp({ a, b: s.tensor([10], 'f32'), weight }));
    }
    if (s.ctx.device !== 'cpu') {
      const onCpu = s.own(new s.native.NativeTensor({ shape: [10], dtype: 'f32', device: 'cpu' }));
      s.expectThrow(`b on cpu for a on ${s.ctx.device}`, INVALID, () => s.native.lerp({ a, b: onCpu, weight: 0.5 }));
    }
  }),
  rejectCase('disposed tensor', (s) => {
    const x = s.tensor([2, 3], 'f32');
    x.dispose();
    s.expectThrow('relu on a disposed x', DISPOSED, () => s.native.relu({ x, y: s.tensor([2, 3], 'f32') }));
    s.expectThrow('copyToHost of a disposed tensor', DISPOSED, () => x.copyToHost(new Float32Array(6)));
  }),
  rejectCase('disposed plan', (s) => {
    const plan = smallConv(s);
    plan.dispose();
    s.expectThrow('forward on a disposed Conv2dPlan', DISPOSED, () =>
      plan.forward({
        x: s.tensor([1, 4, 4, 2], 'f32'),
        weight: s.tensor([3, 3, 3, 2], 'f32'),
        y: s.tensor([1, 4, 4, 3], 'f32'),
      }),
    );
  }),
];
