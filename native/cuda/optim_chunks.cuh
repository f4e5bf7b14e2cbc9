// What the multi-tensor optimizer kernels of optim.cu, sgd.cu and fused_optim.cu share: the chunk
// lookup over the segment table of kernels.h (rows {offset, count, group, firstChunk}, in offset
// order), the skip on the GradScaler's flag, the per-element updates of SGD, AdamW and LAMB with
// AdamW's and LAMB's per-group coefficients, LAMB's per-chunk norm partials, the GradScaler's scale
// update, and the launch geometry and scratch layout on the host. One definition of each keeps the
// fused and unfused steps equal to the bit.
#pragma once

#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "../core/adam_coeffs.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace rc::cuda {

// One kOptimChunk-element chunk of the arena: its element range, its segment's row and group.
struct ChunkRange {
  int64_t begin, end;
  int64_t segment, group;
};

// Chunk `chunk` of the table: it lies in the last segment whose firstChunk <= chunk (binary search).
__device__ __forceinline__ ChunkRange findChunk(const int64_t* __restrict__ segments, int64_t segmentCount,
                                                int64_t chunk) {
  int64_t lo = 0, hi = segmentCount - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (segments[4 * mid + 3] <= chunk) lo = mid;
    else hi = mid - 1;
  }
  const int64_t* seg = segments + 4 * lo;
  const int64_t local = chunk - seg[3];
  return {seg[0] + local * kOptimChunk, seg[0] + min(seg[1], (local + 1) * kOptimChunk), lo, seg[2]};
}

// Whether the GradScaler found inf/NaN (foundInf may be null: no scaler); the same for every thread.
__device__ __forceinline__ bool skipStep(const float* foundInf) { return foundInf != nullptr && *foundInf != 0.0f; }

// Every block computes the coefficients of all groups once into shared memory (groupCount <=
// kMaxOptimGroups, sized at launch), so no per-step table has to be uploaded. t is `step`, or the
// device's step count when one is given (a captured step).
__device__ inline void loadCoeffs(AdamCoeffs* sCoeffs, const AdamGroupParams* __restrict__ groups, int64_t groupCount,
                                  int64_t step, const int32_t* __restrict__ stepCount) {
  const int64_t t = stepCount ? static_cast<int64_t>(*stepCount) : step;
  for (int64_t k = threadIdx.x; k < groupCount; k += blockDim.x) sCoeffs[k] = adamCoeffs(groups[k], t);
  __syncthreads();
}

// LAMB's update direction from the stored moments: u = mhat / (sqrt(vhat) + eps) + wd * p.
__device__ __forceinline__ float lambDirection(float m, float v, float p, const AdamCoeffs& c) {
  return (m / c.bc1) / (sqrtf(v) / c.bc2Sqrt + c.eps) + c.weightDecay * p;
}

// torch.optim.SGD on element i with the (unscaled) gradient g: weight decay, momentum (the
// buffer is read only when the group has momentum; it may be null otherwise), Nesterov.
__device__ __forceinline__ void sgdElement(float* __restrict__ params, float* __restrict__ momentumBuffer, int64_t i,
                                           float g, const SgdGroupParams& p, bool firstStep) {
  const float param = params[i];
  float d = g + p.weightDecay * param;
  if (p.momentum != 0.0f) {
    const float b = firstStep ? d : p.momentum * momentumBuffer[i] + (1.0f - p.dampening) * d;
    momentumBuffer[i] = b;
    d = p.nesterov ? d + p.momentum * b : b;
  }
  params[i] = param - p.lr * d;
}

// AdamW's and LAMB's first and second moments of one element, updated in place from g.
struct Moments {
  float m, v;
};
__device__ __forceinline__ Moments updateMoments(float& expAvg, float& expAvgSq, float g, const AdamCoeffs& c) {
  const float m = c.beta1 * expAvg + c.oneMinusBeta1 * g;
  const float v = c.beta2 * expAvgSq + c.oneMinusBeta2 * g * g;
  expAvg = m;
  expAvgSq = v;
  return {m, v};
}

// AdamW on one element with the (unscaled) gradient g: decoupled decay, the moments, the step.
__device__ __forceinline__ void adamwElement(float& param, float& expAvg, float& expAvgSq, float g,
                                             const AdamCoeffs& c) {
  const float p = param * c.decay;
  const Moments mv = updateMoments(expAvg, expAvgSq, g, c);
  param = p - c.stepSize * (mv.m / (sqrtf(mv.v) / c.bc2Sqrt + c.eps));
}

// LAMB's first pass on one element with the (unscaled) gradient g: the moments, and p^2 and u^2
// added to this thread's sums pp and uu.
__device__ __forceinline__ void lambMomentsElement(float p, float& expAvg, float& expAvgSq, float g,
                                                   const AdamCoeffs& c, double& pp, double& uu) {
  const Moments mv = updateMoments(expAvg, expAvgSq, g, c);
  const float u = lambDirection(mv.m, mv.v, p, c);
  pp += static_cast<double>(p) * p;
  uu += static_cast<double>(u) * u;
}

// LAMB's last pass on one element: u again from the stored moments, then p -= lr * (u * trust).
__device__ __forceinline__ void lambUpdateElement(float& param, float expAvg, float expAvgSq, float trust,
                                                  const AdamCoeffs& c) {
  const float p = param;
  param = p - c.lr * (lambDirection(expAvg, expAvgSq, p, c) * trust);
}

using BlockReduceDouble = cub::BlockReduce<double, kThreads>;

// The block's sums of the threads' pp and uu (cub's fixed tree) into partial[2 * chunk + {0, 1}]:
// LAMB's norm partials of one chunk. Every thread of the block calls it.
__device__ inline void storeLambPartials(typename BlockReduceDouble::TempStorage& reduceStorage, double pp, double uu,
                                         int64_t chunk, double* __restrict__ partial) {
  const double blockPp = BlockReduceDouble(reduceStorage).Sum(pp);
  __syncthreads();  // the temp storage is reused right away
  const double blockUu = BlockReduceDouble(reduceStorage).Sum(uu);
  __syncthreads();
  if (threadIdx.x == 0) {
    partial[2 * chunk] = blockPp;
    partial[2 * chunk + 1] = blockUu;
  }
}

// PyTorch's _amp_update_scale_, by one thread: back off and reset the tracker after an inf/NaN,
// else grow the scale every growthInterval successful steps.
__device__ inline void updateScale(float* scale, int32_t* growthTracker, const float* foundInf, float growthFactor,
                                   float backoffFactor, int32_t growthInterval) {
  if (*foundInf != 0.0f) {
    *scale *= backoffFactor;
    *growthTracker = 0;
    return;
  }
  const int64_t successful = static_cast<int64_t>(*growthTracker) + 1;
  if (successful >= growthInterval) {
    const float grown = *scale * growthFactor;
    if (isfinite(grown)) *scale = grown;  // never grow past the f32 range to inf
    *growthTracker = 0;
  } else {
    *growthTracker = static_cast<int32_t>(successful);
  }
}

// ---- host side ------------------------------------------------------------------------------

// Blocks of a pass over `chunkCount` chunks (one chunk per block, at most kMaxGridStrideBlocks).
inline unsigned optimBlocks(int64_t chunkCount) {
  return static_cast<unsigned>(std::clamp<int64_t>(chunkCount, 1, kMaxGridStrideBlocks));
}

// Dynamic shared memory of the AdamW and LAMB kernels: the coefficients of every group.
inline size_t coeffBytes(int64_t groupCount) { return static_cast<size_t>(groupCount) * sizeof(AdamCoeffs); }

inline size_t alignUp256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// LAMB's scratch (lambScratchBytes): the per-chunk partials, then, 256-byte aligned, the
// per-segment trust ratios.
struct LambScratch {
  double* partial;
  float* ratio;
};
inline LambScratch lambScratch(void* scratch, int64_t chunkCount) {
  auto* base = static_cast<char*>(scratch);
  return {reinterpret_cast<double*>(base),
          reinterpret_cast<float*>(base + alignUp256(static_cast<size_t>(2 * chunkCount) * sizeof(double)))};
}

}  // namespace rc::cuda
