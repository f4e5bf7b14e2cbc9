/**
 * Peak figures of the GPUs the roofline model knows: dense bf16/fp16 tensor-core FLOP/s and memory
 * bandwidth, from NVIDIA's datasheets and product pages. NVIDIA quotes tensor throughput "with
 * sparsity" (2:4 structured sparsity, twice the dense rate); the dense figure, which a
 * convolution reaches at best, is half of it, and that is what the table holds.
 * @packageDocumentation
 */
import { expectOneOf } from '../errors.js';

/** The GPUs of {@link GPU_PEAKS}. */
export const GPU_NAMES = ['h100', 'h200', 'a100', 'b200', 'l4'] as const;

/** A GPU of {@link GPU_PEAKS}. */
export type GpuName = (typeof GPU_NAMES)[number];

/** The peak figures of one GPU. */
export interface GpuPeak {
  /** The product, as NVIDIA names it. */
  name: string;
  /** Dense bf16 tensor-core FLOP/s (f32 accumulation). */
  bf16Flops: number;
  /** Dense fp16 tensor-core FLOP/s (f32 accumulation). */
  fp16Flops: number;
  /** Memory bandwidth, bytes/s (HBM; GDDR6 on the L4). */
  bandwidth: number;
  /** Where the figures come from. */
  source: string;
  /** How the figures were read from the source. */
  note: string;
}

/** The peaks table, by {@link GpuName}. */
export const GPU_PEAKS: Readonly<Record<GpuName, Readonly<GpuPeak>>> = Object.freeze({
  h100: {
    name: 'H100 SXM',
    bf16Flops: 989.5e12,
    fp16Flops: 989.5e12,
    bandwidth: 3.35e12,
    source: 'https://www.nvidia.com/en-us/data-center/h100/',
    note: 'datasheet: BF16/FP16 Tensor Core 1,979 TFLOPS with sparsity (dense: half), GPU memory bandwidth 3.35 TB/s',
  },
  h200: {
    name: 'H200 SXM',
    bf16Flops: 989.5e12,
    fp16Flops: 989.5e12,
    bandwidth: 4.8e12,
    source: 'https://www.nvidia.com/en-us/data-center/h200/',
    note: 'datasheet: BF16/FP16 Tensor Core 1,979 TFLOPS with sparsity (dense: half), GPU memory bandwidth 4.8 TB/s',
  },
  a100: {
    name: 'A100 SXM 80GB',
    bf16Flops: 312e12,
    fp16Flops: 312e12,
    bandwidth: 2.039e12,
    source: 'https://www.nvidia.com/en-us/data-center/a100/',
    note: 'datasheet: BF16/FP16 Tensor Core 312 TFLOPS (624 with sparsity), GPU memory bandwidth 2,039 GB/s (80GB SXM)',
  },
  b200: {
    name: 'B200 (HGX)',
    bf16Flops: 2.25e15,
    fp16Flops: 2.25e15,
    bandwidth: 7.7e12,
    source: 'https://www.nvidia.com/en-us/data-center/hgx/',
    note: 'HGX B200 specifications, per GPU: FP16/BF16 Tensor Core 4.5 PFLOPS with sparsity (dense: half), 7.7 TB/s (62 TB/s for 8 GPUs)',
  },
  l4: {
    name: 'L4',
    bf16Flops: 121e12,
    fp16Flops: 121e12,
    bandwidth: 300e9,
    source: 'https://www.nvidia.com/en-us/data-center/l4/',
    note: 'datasheet: BF16/FP16 Tensor Core 242 TFLOPS with sparsity (dense: half), GPU memory bandwidth 300 GB/s',
  },
});

/** The peaks of `name` (one of {@link GPU_NAMES}); a clear error names the parameter otherwise. */
export function gpuPeak(name: string, parameter = 'gpu'): Readonly<GpuPeak> {
  return GPU_PEAKS[expectOneOf(parameter, name, GPU_NAMES)];
}
