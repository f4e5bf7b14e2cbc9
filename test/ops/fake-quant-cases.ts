/**
 * Cases for the quantization-aware training ops: fake quantization (per tensor and per channel,
 * s8 and u8 ranges) and its straight-through gradient, the abs-max weight scales and the
 * moving-average min/max observer, against test/reference/fake-quant.ts, and the inputs they refuse.
 * @packageDocumentation
 */
import type { DTypeName } from '../../lib/binding.js';
import {
  absMaxScale,
  fakeQuantize,
  fakeQuantizeBackward,
  observeMinMax,
  quantLevel,
  roundHalfEven,
} from '../reference/index.js';
import { fmtShape, session, tolerance, type OpCase, type Session } from './harness.js';

const BOTH: DTypeName[] = ['f32', 'bf16'];
const INVALID = 'ERR_RC_INVALID_ARGUMENT';
const S8 = { qmin: -128, qmax: 127 };
const U8 = { qmin: 0, qmax: 255 };

function count(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

interface FqVariant {
  /** Per channel (scales along dim 0) or per tensor. */
  perChannel: boolean;
  range: { qmin: number; qmax: number };
  shape: number[];
}

/**
 * Inputs spread past the scale's range (so that some clamp) and values on exact rounding ties
 * (k + 1/2 times the scale), where half-to-even rounding shows.
 */
function inputs(s: Session, v: FqVariant, scales: Float64Array): Float64Array {
  const n = count(v.shape);
  const per = n / scales.length;
  const x = s.rng.normals(n, v.range.qmin === 0 ? 1 : 0, 1);
  for (let i = 0; i < n; i += 7) {
    const k = s.rng.int(v.range.qmin - 2, v.range.qmax + 2);
    x[i] = (k + 0.5) * scales[Math.floor(i / per)]!;
  }
  return s.q(x);
}

/** Scales whose ranges cover about 2 standard deviations, powers of two so that the ties are exact. */
function scalesFor(s: Session, v: FqVariant): Float64Array {
  const k = v.perChannel ? v.shape[0]! : 1;
  return Float64Array.from({ length: k }, () => 2 ** -s.rng.int(5, 7));
}

function fqText(v: FqVariant): string {
  return `x${fmtShape(v.shape)} ${v.perChannel ? 'per channel' : 'per tensor'} [${v.range.qmin}, ${v.range.qmax}]`;
}

function fakeQuantizeCase(v: FqVariant): OpCase {
  const text = fqText(v);
  return {
    name: `fakeQuantize ${text}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'fakeQuantize', text, (s) => {
        const scales = scalesFor(s, v);
        const x = inputs(s, v, scales);
        const y = s.poisoned(v.shape);
        s.native.fakeQuantize({
          x: s.tensor(v.shape, ctx.dtype, x),
          scale: s.tensor([scales.length], 'f32', scales),
          y,
          ...v.range,
        });
        // The kernels round x / s in f32 and the product to the output dtype, as the reference does: exact.
        s.checkExact('y', s.read(y), s.q(fakeQuantize(x, scales, v.range.qmin, v.range.qmax)));
      }),
  };
}

function fakeQuantizeBackwardCase(v: FqVariant): OpCase {
  const text = fqText(v);
  return {
    name: `fakeQuantizeBackward ${text}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'fakeQuantizeBackward', text, (s) => {
        const scales = scalesFor(s, v);
        const x = inputs(s, v, scales);
        const dy = s.q(s.rng.normals(x.length));
        const dx = s.poisoned(v.shape);
        s.native.fakeQuantizeBackward({
          x: s.tensor(v.shape, ctx.dtype, x),
          scale: s.tensor([scales.length], 'f32', scales),
          dy: s.tensor(v.shape, ctx.dtype, dy),
          dx,
          ...v.range,
        });
        const ref = fakeQuantizeBackward(x, scales, dy, v.range.qmin, v.range.qmax);
        if (!ref.some((g, i) => g === 0 && dy[i] !== 0)) s.fail('the inputs never leave the range: nothing is masked');
        s.checkExact('dx', s.read(dx), ref);
      }),
  };
}

const FQ_VARIANTS: FqVariant[] = [
  // Larger than one CPU chunk (16384) and not a multiple of any vector width.
  { perChannel: false, range: S8, shape: [3, 7, 2003] },
  { perChannel: false, range: U8, shape: [2, 5, 5, 33] },
  // OHWI weights of 17 output channels; and one of many small channels.
  { perChannel: true, range: S8, shape: [17, 3, 3, 5] },
  { perChannel: true, range: S8, shape: [300, 7] },
];

function absMaxCase(shape: number[], perChannel: boolean): OpCase {
  const text = `x${fmtShape(shape)} ${perChannel ? 'per channel' : 'per tensor'}`;
  return {
    name: `absMaxScale ${text}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'absMaxScale', text, (s) => {
        const x = s.q(s.rng.normals(count(shape), 0, 0.2));
        const groups = perChannel ? shape[0]! : 1;
        // A channel of zeros takes the floor, not 0 (a zero scale would divide by zero).
        if (perChannel) x.fill(0, 0, count(shape) / groups);
        const scale = s.poisoned([groups], 'f32');
        s.native.absMaxScale({ x: s.tensor(shape, ctx.dtype, x), scale, qmax: 127 });
        s.checkExact('scale', s.read(scale), absMaxScale(x, groups, 127));
      }),
  };
}

function observeCase(unsigned: boolean, averagingConstant: number): OpCase {
  const shape = [4, 9, 9, 130];
  const text = `x${fmtShape(shape)} ${unsigned ? 'u8' : 's8'} c=${averagingConstant}`;
  return {
    name: `observeMinMax ${text}`,
    dtypes: BOTH,
    run: (ctx) =>
      session(ctx, 'observeMinMax', text, (s) => {
        const qmax = unsigned ? 255 : 127;
        const batch = (mean: number): Float64Array => {
          const x = s.rng.normals(count(shape), mean, 2);
          return s.q(unsigned ? x.map((v) => Math.max(v, 0)) : x);
        };
        const minMax = s.tensor([2], 'f32', [Infinity, -Infinity]);
        const scale = s.poisoned([1], 'f32');
        let state: [number, number] = [Infinity, -Infinity];
        // The first batch sets the range; the next ones move it by the averaging constant.
        for (const mean of [0.5, -1, 3]) {
          const x = batch(mean);
          s.native.observeMinMax({ x: s.tensor(shape, ctx.dtype, x), minMax, scale, averagingConstant, qmax });
          const ref = observeMinMax(x, state, averagingConstant, qmax);
          state = ref.minMax;
          s.check('minMax', s.read(minMax), ref.minMax, tolerance('f32'));
          s.check('scale', s.read(scale), [ref.scale], tolerance('f32'));
        }
      }),
  };
}

/** The reference's own rounding, on the ties that tell half-to-even from half-up. */
const roundingCase: OpCase = {
  name: 'fakeQuantize rounds half to even, as rint and ONNX QuantizeLinear',
  dtypes: ['f32'],
  run: (ctx) =>
    session(ctx, 'fakeQuantize', 'x[8] ties', (s) => {
      const x = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5];
      const levels = [0, 2, 2, -0, -2, -2, 126, 128];
      if (x.some((v, i) => roundHalfEven(v) !== levels[i] || quantLevel(v, 1) !== levels[i])) {
        s.fail(`reference rounding of ${x.join(', ')}: ${x.map(roundHalfEven).join(', ')}`);
      }
      // 127.5 rounds to 128, which s8 clamps to 127.
      const expected = [0, 2, 2, -0, -2, -2, 126, 127];
      const y = s.poisoned([x.length]);
      s.native.fakeQuantize({ x: s.tensor([x.length], 'f32', x), scale: s.tensor([1], 'f32', [1]), y, ...S8 });
      s.checkExact('y', s.read(y), expected);
    }),
};

/** Every op case of quantization-aware training. */
export const fakeQuantCases: OpCase[] = [
  roundingCase,
  ...FQ_VARIANTS.map(fakeQuantizeCase),
  ...FQ_VARIANTS.map(fakeQuantizeBackwardCase),
  absMaxCase([17, 3, 3, 5], true),
  absMaxCase([64, 2048], true),
  absMaxCase([3, 7, 2003], false),
  observeCase(false, 0.01),
  observeCase(true, 0.25),
];

function rejectCase(name: string, body: (s: Session) => void): OpCase {
  return { name: `reject ${name}`, dtypes: ['f32'], run: (ctx) => session(ctx, `reject ${name}`, '', body) };
}

/** The inputs the quantization-aware training ops refuse. */
export const fakeQuantBadInputCases: OpCase[] = [
  rejectCase('fakeQuantize with a bad scale or range', (s) => {
    const x = s.tensor([4, 3], 'f32');
    const y = s.tensor([4, 3], 'f32');
    s.expectThrow('scale of 3 for 4 channels', INVALID, () =>
      s.native.fakeQuantize({ x, scale: s.tensor([3], 'f32'), y, ...S8 }),
    );
    s.expectThrow('bf16 scale', INVALID, () => s.native.fakeQuantize({ x, scale: s.tensor([1], 'bf16'), y, ...S8 }));
    s.expectThrow('qmin above qmax', INVALID, () =>
      s.native.fakeQuantize({ x, scale: s.tensor([1], 'f32'), y, qmin: 5, qmax: 4 }),
    );
    s.expectThrow('y of another shape', INVALID, () =>
      s.native.fakeQuantize({ x, scale: s.tensor([1], 'f32'), y: s.tensor([12], 'f32'), ...S8 }),
    );
    s.expectThrow('i32 x', INVALID, () =>
      s.native.fakeQuantizeBackward({
        x: s.tensor([4, 3], 'i32'),
        scale: s.tensor([1], 'f32'),
        dy: s.tensor([4, 3], 'i32'),
        dx: s.tensor([4, 3], 'i32'),
        ...S8,
      }),
    );
  }),
  rejectCase('absMaxScale and observeMinMax with bad state or constants', (s) => {
    const x = s.tensor([4, 3], 'f32');
    s.expectThrow('qmax 0', INVALID, () => s.native.absMaxScale({ x, scale: s.tensor([4], 'f32'), qmax: 0 }));
    const args = { x, minMax: s.tensor([2], 'f32'), scale: s.tensor([1], 'f32'), averagingConstant: 0.01, qmax: 127 };
    s.expectThrow('minMax of 3', INVALID, () => s.native.observeMinMax({ ...args, minMax: s.tensor([3], 'f32') }));
    s.expectThrow('scale of 2', INVALID, () => s.native.observeMinMax({ ...args, scale: s.tensor([2], 'f32') }));
    s.expectThrow('averagingConstant 0', INVALID, () => s.native.observeMinMax({ ...args, averagingConstant: 0 }));
    s.expectThrow('averagingConstant 1.5', INVALID, () => s.native.observeMinMax({ ...args, averagingConstant: 1.5 }));
  }),
];
