// The optimizer end of a step fused over the parameter arena (FusedSgdArgs in core/backend.h):
// the GradScaler's inf/NaN check, the SGD update with the unscale applied as the gradients are
// read, the scale update and the gradient zeroing. The check must see every gradient before any
// parameter moves, and blocks cannot wait for each other, so with a check there are two launches:
// a read-only pass that raises the flag, then one pass that reads each gradient once, updates the
// parameter and its momentum, and writes the gradient's zero. Unfused, the same work reads and
// writes the gradients in the unscale, reads them again in the update and writes them again in
// the zeroing (8 + 4 + 4 bytes per parameter against 4 + 4 + 4 here, and five launches against
// two). The segment table and chunking are optim.cu's (kernels.h), so every element is handled by
// exactly one thread and the result does not depend on the grid.
#include "device_utils.cuh"
#include "kernels.h"
#include "optim_chunks.cuh"

namespace rc::cuda {

namespace {

// Raises *foundInf when a gradient in the segments is inf or NaN; reads only.
__global__ void __launch_bounds__(kThreads)
    fused_finite_check_kernel(const float* __restrict__ grads, const int64_t* __restrict__ segments,
                              int64_t segmentCount, int64_t chunkCount, float* __restrict__ foundInf) {
  bool nonFinite = false;
  for (int64_t chunk = blockIdx.x; chunk < chunkCount; chunk += gridDim.x) {
    const ChunkRange r = findChunk(segments, segmentCount, chunk);
#pragma unroll 4
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) nonFinite = nonFinite || !isfinite(grads[i]);
  }
  if (nonFinite) *foundInf = 1.0f;  // benign race: every writer stores 1
}

// The scale update of optim.cu's scaler_update_kernel (PyTorch's _amp_update_scale_).
__device__ void updateScale(float* scale, int32_t* growthTracker, const float* foundInf, const FusedScalerParams& s) {
  if (*foundInf != 0.0f) {
    *scale *= s.backoffFactor;
    *growthTracker = 0;
    return;
  }
  const int64_t successful = static_cast<int64_t>(*growthTracker) + 1;
  if (successful >= s.growthInterval) {
    const float grown = *scale * s.growthFactor;
    if (isfinite(grown)) *scale = grown;
    *growthTracker = 0;
  } else {
    *growthTracker = static_cast<int32_t>(successful);
  }
}

// SGD as sgd.cu's sgd_step_kernel with g = grad * invScale, then grad = 0 when zeroGrads; the
// scale update by one thread (no thread of this kernel writes foundInf, so it reads one value).
__global__ void __launch_bounds__(kThreads)
    fused_sgd_kernel(float* __restrict__ params, float* __restrict__ grads, float* __restrict__ momentumBuffer,
                     const int64_t* __restrict__ segments, int64_t segmentCount, int64_t chunkCount,
                     const SgdGroupParams* __restrict__ groups, bool firstStep, const float* __restrict__ foundInf,
                     float invScale, bool zeroGrads, float* __restrict__ scale, int32_t* __restrict__ growthTracker,
                     FusedScalerParams scaler) {
  if (scale != nullptr && blockIdx.x == 0 && threadIdx.x == 0) updateScale(scale, growthTracker, foundInf, scaler);
  const bool skip = foundInf != nullptr && *foundInf != 0.0f;
  if (skip && !zeroGrads) return;
  for (int64_t chunk = blockIdx.x; chunk < chunkCount; chunk += gridDim.x) {
    const ChunkRange r = findChunk(segments, segmentCount, chunk);
    const SgdGroupParams p = groups[r.group];
    const bool useMomentum = p.momentum != 0.0f;
#pragma unroll 4
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += kThreads) {
      if (!skip) {
        const float param = params[i];
        const float g = grads[i] * invScale;
        float d = g + p.weightDecay * param;
        if (useMomentum) {
          const float b = firstStep ? d : p.momentum * momentumBuffer[i] + (1.0f - p.dampening) * d;
          momentumBuffer[i] = b;
          d = p.nesterov ? d + p.momentum * b : b;
        }
        params[i] = param - p.lr * d;
      }
      if (zeroGrads) grads[i] = 0.0f;
    }
  }
}

unsigned fusedBlocks(int64_t chunkCount) {
  return static_cast<unsigned>(std::clamp<int64_t>(chunkCount, 1, kMaxGridStrideBlocks));
}

}  // namespace

void fusedSgdStep(float* params, float* grads, float* momentumBuffer, const int64_t* segments, int64_t segmentCount,
                  int64_t chunkCount, const SgdGroupParams* groups, bool firstStep, float* foundInf, bool checkFinite,
                  float invScale, bool zeroGrads, float* scale, int32_t* growthTracker, FusedScalerParams scaler,
                  cudaStream_t stream) {
  const bool work = segmentCount > 0 && chunkCount > 0;
  if (checkFinite && work) {
    fused_finite_check_kernel<<<fusedBlocks(chunkCount), kThreads, 0, stream>>>(grads, segments, segmentCount,
                                                                                chunkCount, foundInf);
    checkLaunch("fused_finite_check_kernel");
  }
  if (!work && scale == nullptr) return;
  fused_sgd_kernel<<<fusedBlocks(work ? chunkCount : 0), kThreads, 0, stream>>>(
      params, grads, momentumBuffer, segments, work ? segmentCount : 0, work ? chunkCount : 0, groups, firstStep,
      foundInf, invScale, zeroGrads, scale, growthTracker, scaler);
  checkLaunch("fused_sgd_kernel");
}

}  // namespace rc::cuda
