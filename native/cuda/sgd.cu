// One multi-tensor SGD step (torch.optim.SGD) over arena segments in a single launch. Segments are
// cut into chunks of kChunk elements; chunk g of the whole list goes to block g % gridDim.x. Each
// block walks the segment table a tile at a time, scanning the tile's chunk counts in shared
// memory, so no prefix table is needed on the device and the segments may be in any order or have
// gaps. Every element is updated by exactly one thread, so results do not depend on the grid.
#include <cub/block/block_scan.cuh>

#include "device_utils.cuh"
#include "kernels.h"
#include "optim_chunks.cuh"

namespace rc::cuda {

namespace {

// 16 elements per thread: long enough to amortise the per-chunk lookup, short enough that a
// ResNet-50 arena (25.6M) still splits into thousands of chunks.
constexpr int64_t kChunk = kThreads * 16;

__global__ void __launch_bounds__(kThreads)
    sgd_step_kernel(float* __restrict__ params, const float* __restrict__ grads, float* __restrict__ momentumBuffer,
                    const int64_t* __restrict__ segments, int64_t segmentCount,
                    const SgdGroupParams* __restrict__ groups, bool firstStep, const float* __restrict__ foundInf,
                    float gradScaleInv) {
  using BlockScan = cub::BlockScan<int64_t, kThreads>;
  __shared__ typename BlockScan::TempStorage scanStorage;
  __shared__ int64_t sChunkEnd[kThreads];                // inclusive prefix of the tile's chunk counts
  if (foundInf != nullptr && *foundInf != 0.0f) return;  // GradScaler found inf/NaN: skip the step

  const int64_t grid = gridDim.x;
  int64_t tileBase = 0;  // global index of the current tile's first chunk
  for (int64_t tile = 0; tile < segmentCount; tile += kThreads) {
    const int64_t s = tile + threadIdx.x;
    const int64_t chunks = s < segmentCount ? ceilDiv(segments[3 * s + 1], kChunk) : 0;
    int64_t chunkEnd;
    BlockScan(scanStorage).InclusiveSum(chunks, chunkEnd);
    sChunkEnd[threadIdx.x] = chunkEnd;
    __syncthreads();
    const int64_t tileChunks = sChunkEnd[kThreads - 1];

    // This block's first chunk in the tile: the smallest g >= tileBase with g % grid == blockIdx.x.
    for (int64_t g = tileBase + ((blockIdx.x - tileBase) % grid + grid) % grid; g < tileBase + tileChunks; g += grid) {
      const int64_t local = g - tileBase;
      int lo = 0, hi = kThreads - 1;  // first segment of the tile whose chunks end after `local`
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (sChunkEnd[mid] > local) hi = mid;
        else lo = mid + 1;
      }
      const int64_t chunk = local - (lo == 0 ? 0 : sChunkEnd[lo - 1]);
      const int64_t* seg = segments + 3 * (tile + lo);
      const int64_t begin = seg[0] + chunk * kChunk;
      const int64_t end = seg[0] + min(seg[1], (chunk + 1) * kChunk);
      const SgdGroupParams p = groups[seg[2]];
#pragma unroll 4
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
        sgdElement(params, momentumBuffer, i, grads[i] * gradScaleInv, p, firstStep);
      }
    }
    tileBase += tileChunks;
    __syncthreads();  // sChunkEnd and the scan storage are rewritten by the next tile
  }
}

}  // namespace

void sgdStep(float* params, const float* grads, float* momentumBuffer, const int64_t* segments, int64_t segmentCount,
             int64_t totalElements, const SgdGroupParams* groups, bool firstStep, const float* foundInf,
             float gradScaleInv, cudaStream_t stream) {
  if (segmentCount <= 0 || totalElements <= 0) return;
  // Chunks number at most totalElements / kChunk plus one partial chunk per segment.
  const int64_t chunks = ceilDiv(totalElements, kChunk) + segmentCount;
  const unsigned blocks = static_cast<unsigned>(std::min(chunks, kMaxGridStrideBlocks));
  sgd_step_kernel<<<blocks, kThreads, 0, stream>>>(params, grads, momentumBuffer, segments, segmentCount, groups,
                                                   firstStep, foundInf, gradScaleInv);
  checkLaunch("sgd_step_kernel");
}

}  // namespace rc::cuda
