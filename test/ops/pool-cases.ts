/**
 * Max and average pooling cases, forward and backward.
 * @packageDocumentation
 */
import type { DTypeName } from '../../lib/binding.js';
import {
  avgPool2dBackward,
  avgPool2dForward,
  distinctValues,
  maxPool2dBackward,
  maxPool2dForward,
  resolvePool2d,
  type Pool2dGeometry,
} from '../reference/index.js';
import { fmtShape, session, tolerance, type OpCase, type Session } from './harness.js';

const BOTH: DTypeName[] = ['f32', 'bf16'];

interface PoolShape extends Pool2dGeometry {
  kind: 'max' | 'avg';
}

const POOL_SHAPES: PoolShape[] = [
  // ResNet's stem pool, odd and even inputs.
  { kind: 'max', n: 2, h: 9, w: 9, c: 4, kernelH: 3, kernelW: 3, strideH: 2, strideW: 2, padH: 1, padW: 1 },
  { kind: 'max', n: 1, h: 16, w: 16, c: 3, kernelH: 3, kernelW: 3, strideH: 2, strideW: 2, padH: 1, padW: 1 },
  { kind: 'max', n: 2, h: 8, w: 8, c: 3, kernelH: 2, kernelW: 2, strideH: 2, strideW: 2 },
  // Floor mode drops the last row and column.
  { kind: 'max', n: 1, h: 7, w: 5, c: 2, kernelH: 2, kernelW: 2, strideH: 2, strideW: 2 },
  // Adaptive average pooling to 1x1 is a kernel covering the whole input.
  { kind: 'avg', n: 2, h: 7, w: 7, c: 8, kernelH: 7, kernelW: 7 },
  { kind: 'avg', n: 1, h: 3, w: 5, c: 4, kernelH: 3, kernelW: 5 },
  // count_include_pad: border windows divide by the full 9.
  { kind: 'avg', n: 2, h: 9, w: 9, c: 3, kernelH: 3, kernelW: 3, strideH: 2, strideW: 2, padH: 1, padW: 1 },
  { kind: 'avg', n: 1, h: 6, w: 6, c: 4, kernelH: 2, kernelW: 2, strideH: 2, strideW: 2 },
];

function poolLabel(p: PoolShape): string {
  const g = resolvePool2d(p);
  return `x${fmtShape([g.n, g.h, g.w, g.c])} k${g.kernelH}x${g.kernelW} s${g.strideH}x${g.strideW} p${g.padH}x${g.padW}`;
}

function setup(s: Session, shape: PoolShape) {
  const { kind, ...geometry } = shape;
  const g = resolvePool2d(geometry);
  const plan = s.own(new s.native.Pool2dPlan({ device: s.ctx.device, dtype: s.ctx.dtype, kind, ...geometry }));
  const bytes = plan.workspaceBytes();
  const workspace = bytes > 0 ? s.tensor([bytes], 'u8') : undefined;
  const count = g.n * g.h * g.w * g.c;
  // Max pooling gets distinct values so that no window has a tie (bf16 would have many).
  const x = kind === 'max' ? distinctValues(s.rng, count) : s.q(s.rng.normals(count));
  const xT = s.tensor([g.n, g.h, g.w, g.c], s.ctx.dtype, x);
  const y = s.poisoned([g.n, g.outH, g.outW, g.c]);
  plan.forward({ x: xT, y, ...(workspace ? { workspace } : {}) });
  return { g, plan, workspace, x, y };
}

function casesFor(shape: PoolShape): OpCase[] {
  const label = poolLabel(shape);
  const op = `${shape.kind}pool2d`;
  return [
    {
      name: `${op}.forward ${label}`,
      dtypes: BOTH,
      run: (ctx) =>
        session(ctx, `${op}.forward`, label, (s) => {
          const { g, x, y } = setup(s, shape);
          const ref = shape.kind === 'max' ? maxPool2dForward(g, x).y : avgPool2dForward(g, x);
          s.check('y', s.read(y), ref, tolerance(ctx.dtype));
        }),
    },
    {
      name: `${op}.backward ${label}`,
      dtypes: BOTH,
      run: (ctx) =>
        session(ctx, `${op}.backward`, label, (s) => {
          const { g, plan, workspace, x } = setup(s, shape);
          const dy = s.q(s.rng.normals(g.n * g.outH * g.outW * g.c));
          const dx = s.poisoned([g.n, g.h, g.w, g.c]);
          plan.backward({
            dy: s.tensor([g.n, g.outH, g.outW, g.c], ctx.dtype, dy),
            dx,
            ...(workspace ? { workspace } : {}),
          });
          const ref = shape.kind === 'max' ? maxPool2dBackward(g, x, dy) : avgPool2dBackward(g, dy);
          s.check('dx', s.read(dx), ref, tolerance(ctx.dtype));
        }),
    },
  ];
}

/** Pooling forward and backward over every shape. */
export const poolCases: OpCase[] = POOL_SHAPES.flatMap(casesFor);
