// The chunk lookup of the multi-tensor optimizer kernels (optim.cu, fused_optim.cu) over the
// segment table of kernels.h: rows {offset, count, group, firstChunk}, in offset order.
#pragma once

#include <cstdint>

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

}  // namespace rc::cuda
