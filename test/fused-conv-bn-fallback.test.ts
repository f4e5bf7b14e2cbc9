/**
 * The `conv-bn` fused path where cuDNN refuses a graph: the emulated device's engines refuse the
 * bf16 dgrad-drelu-dbn graph (RESNET_CUDA_EMU_GRAPH_REFUSE, read as each execution plan is built,
 * so it is set before any plan of this process), as a GPU whose engines support the pattern in
 * FP16 only would. convBnSupport answers per shape without throwing; a Bottleneck's step in bf16
 * then runs its batch norm + convolution pairs unfused (the convolutions keep their statistics
 * epilogue), equal to the step where nothing pairs them, with one warning per refusal; in f16,
 * which is not refused, it still takes the fused ops. The CUDA cases run in the
 * 'cuda-emulator-cases' project on the emulated device (test/cuda-emulator) and are skipped without
 * a usable CUDA backend; the op's argument checks and the CPU backend's refusal run on the CPU.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { BatchNorm2d, Tensor, listBackends } from '../lib/index.js';
import { addon } from '../lib/binding.js';
import type { Module } from '../lib/nn/module.js';
import { type StepResult, bottleneck, bottleneckData, moduleStep } from './helpers/fused-runs.js';

const REFUSE_ENV = 'RESNET_CUDA_EMU_GRAPH_REFUSE';
const savedRefuse = process.env[REFUSE_ENV];
process.env[REFUSE_ENV] = 'dgrad-dbn:bf16';
afterAll(() => {
  if (savedRefuse === undefined) delete process.env.RESNET_CUDA_EMU_GRAPH_REFUSE;
  else process.env[REFUSE_ENV] = savedRefuse;
});

const cuda = listBackends().find((b) => b.name === 'cuda');
const onlyCuda = process.env.RESNET_TEST_BACKENDS === 'cuda';
const reason = cuda?.available ? undefined : (cuda?.reason ?? 'no CUDA backend');
const DEVICE = 'cuda:0';

/** Hooks every batch norm's forward on the instance, which keeps the containers from pairing it. */
function unpaired(model: Module): Module {
  for (const [, m] of model.namedModules()) {
    if (m instanceof BatchNorm2d) {
      const own = m.forward.bind(m);
      m.forward = (h: Tensor, residual?: Tensor): Tensor => own(h, residual);
    }
  }
  return model;
}

/** Expects two steps' outputs, gradients and buffers to be bit for bit equal. */
function expectSameStep(a: StepResult, b: StepResult): void {
  expect(a.output).toEqual(b.output);
  expect(a.inputGrad).toEqual(b.inputGrad);
  expect([...a.grads.keys()]).toEqual([...b.grads.keys()]);
  for (const [name, g] of b.grads) expect(a.grads.get(name), `gradient of ${name}`).toEqual(g);
  expect([...a.buffers.keys()]).toEqual([...b.buffers.keys()]);
  for (const [name, t] of b.buffers) expect(a.buffers.get(name), `buffer ${name}`).toEqual(t);
}

describe.skipIf(onlyCuda)('convBnSupport on the CPU', () => {
  const shape = { device: 'cpu', n: 2, h: 8, w: 8, c: 8, k: 8, kernelH: 3, kernelW: 3 };

  it('refuses bad shapes, naming them, and answers that the CPU backend has no conv-bn path', () => {
    expect(() => addon().convBnSupport({ ...shape, dtype: 'f32' })).toThrow(/dtype is f32/);
    expect(() => addon().convBnSupport({ ...shape, dtype: 'bf16', c: 6 })).toThrow(/input channels \(6\)/);
    expect(() => addon().convBnSupport({ ...shape, dtype: 'bf16', kernelH: 20 })).toThrow(/window \(20x3\)/);
    expect(() => addon().convBnSupport({ ...shape, dtype: 'bf16', strideH: 0 })).toThrow(/strides and dilations/);
    expect(() => addon().convBnSupport({ ...shape, dtype: 'bf16' })).toThrow(/needs a CUDA device/);
  });
});

describe.skipIf(reason !== undefined)(
  `conv-bn where cuDNN refuses a graph${reason ? ` (skipped: ${reason})` : ''}`,
  () => {
    const shape = {
      device: DEVICE,
      n: 2,
      h: 8,
      w: 8,
      c: 8,
      k: 8,
      kernelH: 3,
      kernelW: 3,
      strideH: 2,
      strideW: 2,
      padH: 1,
      padW: 1,
    };

    it('convBnSupport answers per shape and dtype, with cuDNN refusal as the reason, without throwing', () => {
      const refused = addon().convBnSupport({ ...shape, dtype: 'bf16', prologue: true });
      expect(refused.ok).toBe(false);
      expect(refused.reason).toMatch(/conv dgrad dbn dy\[2,4,4,8\] w\[8,3,3,8\] x\[2,8,8,8\] stride 2x2 pad 1x1.*bf16/);
      expect(refused.reason).toMatch(/dgrad-dbn pattern with bf16 I\/O/);
      // Asked again: the same answer (the refusal kept with the shape).
      expect(addon().convBnSupport({ ...shape, dtype: 'bf16', prologue: true })).toEqual(refused);
      expect(addon().convBnSupport({ ...shape, dtype: 'bf16', prologue: false })).toEqual({ ok: true });
      expect(addon().convBnSupport({ ...shape, dtype: 'f16', prologue: true })).toEqual({ ok: true });
    });

    it('a Bottleneck step (bf16, dgrad-dbn refused): the pairs run unfused, as when nothing pairs them, warned once per shape', () => {
      const { input, gradOf } = bottleneckData(DEVICE, 'bf16');
      const on = moduleStep('conv-bn', DEVICE, bottleneck, input, gradOf, { steps: 2 });
      const off = moduleStep('conv-bn', DEVICE, () => unpaired(bottleneck()), input, gradOf, { steps: 2 });
      // Both steps: conv1, conv2, conv3 and the downsample convolution with the statistics
      // epilogue, no prologue, none of the pairs' backward ops.
      for (const r of [on, off]) {
        expect(r.convBnCalls).toBe(8);
        expect(r.prologueCalls).toBe(0);
        expect(r.dgradDbnCalls + r.wgradCalls + r.applyCalls).toBe(0);
      }
      expectSameStep(on, off);
      // bn1 -> conv2 (3x3, stride 2) and bn2 -> conv3 (1x1): two shapes refused, each said once
      // over both steps; the reference never asked.
      expect(on.warnings).toHaveLength(2);
      expect(on.warnings[0]).toMatch(
        /input \[2, 8, 8, 8\] bf16 -> 8 channels, kernel 3x3, stride 2x2.*runs unfused\. cuDNN: .*dgrad-dbn pattern/,
      );
      expect(on.warnings[1]).toMatch(/input \[2, 4, 4, 8\] bf16 -> 32 channels, kernel 1x1/);
      expect(off.warnings).toHaveLength(0);
    });

    it('a Bottleneck step (f16, not refused) still takes the fused ops, without a warning', () => {
      const { input, gradOf } = bottleneckData(DEVICE, 'f16');
      const on = moduleStep('conv-bn', DEVICE, bottleneck, input, gradOf);
      expect(on.convBnCalls).toBe(4);
      expect(on.prologueCalls).toBe(2);
      expect(on.dgradDbnCalls).toBe(2);
      expect(on.wgradCalls).toBe(2);
      expect(on.applyCalls).toBe(2);
      expect(on.warnings).toHaveLength(0);
    });
  },
);
