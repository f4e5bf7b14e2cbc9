/**
 * The layouts of the CPU convolutions where oneDNN runs its AVX2 kernels (native/cpu/conv.cc): the
 * weight gradient of a kernel larger than 1x1 is computed as matrix products over gathered patches;
 * a 1x1 convolution that does at least 128 multiply-adds per element of x and dy has its weight
 * gradient read them copied into oneDNN's channel-blocked layout, which its kernel reads faster
 * than NHWC, smaller ones read NHWC; a strided 1x1 convolution runs as a stride-1 one on a copy of
 * the pixels it reads. On AVX-512, a 1x1 stride-1 f32 convolution adds its input gradient into
 * another tensor (a residual block's sum) with a matrix product, and over up to 4096 rows computes
 * its weight gradient as one too. The op table checks the values of all of them (test/ops/conv-cases.ts); this
 * file checks which path each takes. The 'cpu-avx2' test project runs it under ONEDNN_MAX_CPU_ISA=AVX2,
 * so the AVX2 paths are checked on every machine.
 */
import { describe, expect, it } from 'vitest';
import { Conv2d, Tensor, listBackends } from '../lib/index.js';

const isa = listBackends().find((b) => b.name === 'cpu')?.properties?.isa ?? '';
const COPIES = 'on channel-blocked copies';
const SUBSAMPLED = 'on a subsampled copy';
const PATCHES = 'weight gradient sgemm over gathered patches';
const ADDING = 'added input gradient matmul';

/** The implementation a convolution reports after one forward and backward on an n x size x size x inChannels input. */
function implementationOf(
  inChannels: number,
  outChannels: number,
  kernelSize: number,
  size: number,
  stride = 1,
): string {
  const conv = new Conv2d({ inChannels, outChannels, kernelSize, stride, padding: (kernelSize - 1) / 2, seed: 1 });
  const x = Tensor.randn([2, size, size, inChannels], { seed: 2 });
  const y = conv.forward(x);
  const dy = Tensor.randn(y.shape, { seed: 3 });
  conv.backward(dy)?.dispose();
  const implementation = conv.implementation();
  for (const t of [x, y, dy]) t.dispose();
  conv.dispose();
  return implementation;
}

describe('the CPU convolution layouts', () => {
  // 2x6x6x30 -> 34, 3x3: 2*36*34*30*9 multiply-adds over 2*36*(30+34) elements, 143 per element.
  const dense = (): string => implementationOf(30, 34, 3, 6);
  // 2x8x8x16 -> 16, 3x3: 72 multiply-adds per element.
  const light = (): string => implementationOf(16, 16, 3, 8);
  // 2x4x4x260 -> 266, 1x1: 131 multiply-adds per element.
  const densePointwise = (): string => implementationOf(260, 266, 1, 4);
  // 2x8x8x16 -> 16, 1x1: 8 multiply-adds per element.
  const lightPointwise = (): string => implementationOf(16, 16, 1, 8);

  // 2x8x8x16 -> 32, 1x1 stride 2.
  const strided = (): string => implementationOf(16, 32, 1, 8, 2);

  it.runIf(isa === 'avx2')('on AVX2, gathers patches for the weight gradient of every kernel larger than 1x1', () => {
    expect(dense()).toMatch(/^brgconv:avx2, weight gradient sgemm over gathered patches$/);
    expect(light()).toContain(PATCHES);
    expect(implementationOf(3, 8, 7, 16, 2)).toContain(PATCHES);
    for (const pointwise of [densePointwise(), lightPointwise(), strided()]) expect(pointwise).not.toContain(PATCHES);
  });

  it.runIf(isa === 'avx2')(
    'on AVX2, copies x and dy for a 1x1 layer with 128 or more multiply-adds per element',
    () => {
      expect(densePointwise()).toMatch(/weight gradient jit_1x1:avx2 on channel-blocked copies$/);
      expect(lightPointwise()).not.toContain(COPIES);
    },
  );

  it.runIf(isa === 'avx2')('on AVX2, runs a strided 1x1 convolution at stride 1 on the pixels it reads', () => {
    expect(strided()).toMatch(/^brgconv_1x1:avx2 on a subsampled copy \(stride 1\)/);
    expect(dense()).not.toContain(SUBSAMPLED);
  });

  it.runIf(isa.startsWith('avx512'))(
    'on AVX-512, reads NHWC as it is: the copies and patches were measured only on AVX2',
    () => {
      for (const implementation of [dense(), light(), densePointwise(), strided()]) {
        expect(implementation).not.toContain(COPIES);
        expect(implementation).not.toContain(SUBSAMPLED);
        expect(implementation).not.toContain(PATCHES);
      }
    },
  );

  it.runIf(isa.startsWith('avx512'))(
    'on AVX-512, computes the f32 weight gradient of a 1x1 stride-1 layer of up to 4096 rows as a matmul',
    () => {
      // 2x8x8 = 128 and 2x45x45 = 4050 rows; 2x46x46 = 4232 rows keep the convolution.
      expect(lightPointwise()).toContain('weight gradient matmul brg:avx512');
      expect(implementationOf(16, 16, 1, 45)).toContain('weight gradient matmul brg:avx512');
      expect(implementationOf(16, 16, 1, 46)).not.toContain('weight gradient matmul');
      expect(dense()).not.toContain('weight gradient matmul');
    },
  );

  it.runIf(isa.startsWith('avx512'))(
    'on AVX-512, adds the input gradient of a 1x1 stride-1 layer with a matmul',
    () => {
      expect(lightPointwise()).toMatch(/, added input gradient matmul brg:avx512/);
      expect(densePointwise()).toContain(ADDING);
      for (const implementation of [dense(), strided()]) expect(implementation).not.toContain(ADDING);
    },
  );

  it.runIf(isa === 'avx2')(
    'on AVX2, adds the input gradient after the convolution (the matmul was not measured there)',
    () => {
      for (const implementation of [lightPointwise(), densePointwise(), dense()]) {
        expect(implementation).not.toContain(ADDING);
      }
    },
  );
});
