// What the multi-tensor optimizer kernels of optim.cu and fused_optim.cu share: the chunk lookup
// over the segment table of kernels.h (rows {offset, count, group, firstChunk}, in offset order),
// the skip on the GradScaler's flag, and AdamW's and LAMB's per-group coefficients and direction.
#pragma once

#include <cstdint>

#include "../core/adam_coeffs.h"
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

}  // namespace rc::cuda
