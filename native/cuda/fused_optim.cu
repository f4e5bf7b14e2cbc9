// The optimizer end of a step fused over the parameter arena (FusedStepEnd in core/backend.h): the
// GradScaler's inf/NaN check, the SGD, AdamW or LAMB update with the unscale applied as the
// gradients are read, the scale update and the gradient zeroing. The check must see every
// gradient before any parameter moves, and blocks cannot wait for each other, so with a check
// there is a read-only first pass that raises the flag; it also copies what the later passes
// read on the device and the last pass changes (the scale of a captured step, the step count)
// into scratch, so that no thread reads a value another thread of the same pass writes. Then one
// pass reads each gradient once, updates the parameter and its state and writes the gradient's
// zero (LAMB: the moments pass does, then the trust ratios, then the update pass).
//
// Unfused, with a GradScaler, the same work reads and writes the gradients in the unscale, reads
// them again in the update and writes them again in the zeroing: 4 bytes per parameter more than
// here, and the scale update (and a captured step's step count) is a launch of its own. Per
// parameter: SGD 8 + 12 + 4 bytes against 4 + 12 + 4, AdamW 8 + 28 + 4 against 4 + 28 + 4; launches
// SGD 4 against 2, AdamW 4 (5 captured) against 2, LAMB 6 (7) against 4. The segment table and
// chunking are optim.cu's (kernels.h), so every element is handled by exactly one thread, every
// reduction is added in a fixed order, and the result does not depend on the grid.
#include "device_utils.cuh"
#include "kernels.h"
#include "optim_chunks.cuh"

namespace rc::cuda {

namespace {

// What the first pass copies for the later ones.
struct FusedSnapshot {
  float invScale;     // (float)(1.0 / *scale), when the scale is read on the device
  int32_t stepsDone;  // *stepCount as the step starts, when there is a device step count
};

// The scratch the snapshot takes ahead of LAMB's partial sums (keeps them 256-byte aligned).
constexpr size_t kSnapshotBytes = 256;

// The first pass: raises *foundInf when a gradient in the segments is inf or NaN (checkFinite;
// chunkCount 0 otherwise), and block 0 fills the snapshot. Reads only the gradients.
__global__ void __launch_bounds__(kThreads)
    fused_first_pass_kernel(const float* __restrict__ grads, const int64_t* __restrict__ segments, int64_t segmentCount,
                            int64_t chunkCount, float* __restrict__ foundInf, const float* __restrict__ scale,
                            const int32_t* __restrict__ stepCount, FusedSnapshot* __restrict__ snapshot) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    // Rounded as the host rounds 1 / scale, as optim.cu's unscale_kernel does.
    if (scale) snapshot->invScale = static_cast<float>(1.0 / static_cast<double>(*scale));
    if (stepCount) snapshot->stepsDone = *stepCount;
  }
  bool nonFinite = false;
  for (int64_t chunk = blockIdx.x; chunk < chunkCount; chunk += gridDim.x) {
    const ChunkRange r = findChunk(segments, segmentCount, chunk);
#pragma unroll 4
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) nonFinite = nonFinite || !isfinite(grads[i]);
  }
  if (nonFinite) *foundInf = 1.0f;  // benign race: every writer stores 1
}

// The end of the step, by one thread of the last pass: the scale update and the step count's
// advance. The other threads of that pass read neither the scale nor the count (only the
// snapshot), and no thread of it writes foundInf, so each reads one value.
__device__ void finishStep(const FusedEnd& e, int32_t* stepCount, const FusedSnapshot* snapshot) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  if (e.scale != nullptr) {
    updateScale(e.scale, e.growthTracker, e.foundInf, e.scaler.growthFactor, e.scaler.backoffFactor,
                e.scaler.growthInterval);
  }
  if (stepCount != nullptr && !skipStep(e.foundInf)) *stepCount = snapshot->stepsDone + 1;
}

__device__ __forceinline__ float unscaleFactor(const FusedEnd& e, const FusedSnapshot* snapshot) {
  return e.scaleFromDevice ? snapshot->invScale : e.invScale;
}

// t of this step: one more than the device's count as the step started, or the host's `step`.
__device__ __forceinline__ int64_t stepOf(int64_t step, const int32_t* stepCount, const FusedSnapshot* snapshot) {
  return stepCount ? static_cast<int64_t>(snapshot->stepsDone) + 1 : step;
}

// SGD as sgd.cu's sgd_step_kernel with g = grad * invScale, then grad = 0 when zeroGrads.
__global__ void __launch_bounds__(kThreads)
    fused_sgd_kernel(float* __restrict__ params, float* __restrict__ grads, float* __restrict__ momentumBuffer,
                     const int64_t* __restrict__ segments, int64_t segmentCount, int64_t chunkCount,
                     const SgdGroupParams* __restrict__ groups, bool firstStep, FusedEnd end,
                     const FusedSnapshot* __restrict__ snapshot) {
  finishStep(end, nullptr, snapshot);
  const bool skip = skipStep(end.foundInf);
  if (skip && !end.zeroGrads) return;
  const float invScale = unscaleFactor(end, snapshot);
  for (int64_t chunk = blockIdx.x; chunk < chunkCount; chunk += gridDim.x) {
    const ChunkRange r = findChunk(segments, segmentCount, chunk);
    const SgdGroupParams p = groups[r.group];
#pragma unroll 4
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += kThreads) {
      if (!skip) sgdElement(params, momentumBuffer, i, grads[i] * invScale, p, firstStep);
      if (end.zeroGrads) grads[i] = 0.0f;
    }
  }
}

// AdamW as optim.cu's adamw_kernel with g = grad * invScale, then grad = 0 when zeroGrads.
__global__ void __launch_bounds__(kThreads)
    fused_adamw_kernel(float* __restrict__ params, float* __restrict__ grads, float* __restrict__ expAvg,
                       float* __restrict__ expAvgSq, const int64_t* __restrict__ segments, int64_t segmentCount,
                       int64_t chunkCount, const AdamGroupParams* __restrict__ groups, int64_t groupCount, int64_t step,
                       int32_t* __restrict__ stepCount, FusedEnd end, const FusedSnapshot* __restrict__ snapshot) {
  extern __shared__ AdamCoeffs sCoeffs[];
  finishStep(end, stepCount, snapshot);
  const bool skip = skipStep(end.foundInf);
  if (skip && !end.zeroGrads) return;
  const float invScale = unscaleFactor(end, snapshot);
  if (!skip) loadCoeffs(sCoeffs, groups, groupCount, stepOf(step, stepCount, snapshot), nullptr);
  for (int64_t chunk = blockIdx.x; chunk < chunkCount; chunk += gridDim.x) {
    const ChunkRange r = findChunk(segments, segmentCount, chunk);
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
      if (!skip) adamwElement(params[i], expAvg[i], expAvgSq[i], grads[i] * invScale, sCoeffs[r.group]);
      if (end.zeroGrads) grads[i] = 0.0f;
    }
  }
}

// LAMB's first update pass, as optim.cu's lamb_moments_kernel with g = grad * invScale: the
// moments and per chunk the sums of p^2 and u^2 into partial[2 * chunk + {0, 1}]; then grad = 0
// when zeroGrads (the later passes read the moments, not the gradients).
__global__ void __launch_bounds__(kThreads)
    fused_lamb_moments_kernel(const float* __restrict__ params, float* __restrict__ grads, float* __restrict__ expAvg,
                              float* __restrict__ expAvgSq, const int64_t* __restrict__ segments, int64_t segmentCount,
                              int64_t chunkCount, const AdamGroupParams* __restrict__ groups, int64_t groupCount,
                              int64_t step, const int32_t* __restrict__ stepCount, FusedEnd end,
                              const FusedSnapshot* __restrict__ snapshot, double* __restrict__ partial) {
  extern __shared__ AdamCoeffs sCoeffs[];
  __shared__ typename BlockReduceDouble::TempStorage reduceStorage;
  const bool skip = skipStep(end.foundInf);
  if (skip) {
    if (!end.zeroGrads) return;
    for (int64_t chunk = blockIdx.x; chunk < chunkCount; chunk += gridDim.x) {
      const ChunkRange r = findChunk(segments, segmentCount, chunk);
      for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) grads[i] = 0.0f;
    }
    return;
  }
  const float invScale = unscaleFactor(end, snapshot);
  loadCoeffs(sCoeffs, groups, groupCount, stepOf(step, stepCount, snapshot), nullptr);
  for (int64_t chunk = blockIdx.x; chunk < chunkCount; chunk += gridDim.x) {
    const ChunkRange r = findChunk(segments, segmentCount, chunk);
    const AdamCoeffs c = sCoeffs[r.group];
    double pp = 0.0, uu = 0.0;
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
      lambMomentsElement(params[i], expAvg[i], expAvgSq[i], grads[i] * invScale, c, pp, uu);
      if (end.zeroGrads) grads[i] = 0.0f;
    }
    storeLambPartials(reduceStorage, pp, uu, chunk, partial);
  }
}

// LAMB's last pass, as optim.cu's lamb_update_kernel: u again from the stored moments, then
// p -= lr * ratio * u; and the end of the step.
__global__ void __launch_bounds__(kThreads)
    fused_lamb_update_kernel(float* __restrict__ params, const float* __restrict__ expAvg,
                             const float* __restrict__ expAvgSq, const int64_t* __restrict__ segments,
                             int64_t segmentCount, int64_t chunkCount, const AdamGroupParams* __restrict__ groups,
                             int64_t groupCount, int64_t step, int32_t* __restrict__ stepCount, FusedEnd end,
                             const FusedSnapshot* __restrict__ snapshot, const float* __restrict__ ratio) {
  extern __shared__ AdamCoeffs sCoeffs[];
  finishStep(end, stepCount, snapshot);
  if (skipStep(end.foundInf)) return;
  loadCoeffs(sCoeffs, groups, groupCount, stepOf(step, stepCount, snapshot), nullptr);
  for (int64_t chunk = blockIdx.x; chunk < chunkCount; chunk += gridDim.x) {
    const ChunkRange r = findChunk(segments, segmentCount, chunk);
    const AdamCoeffs c = sCoeffs[r.group];
    const float trust = ratio[r.segment];
#pragma unroll 4
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
      lambUpdateElement(params[i], expAvg[i], expAvgSq[i], trust, c);
    }
  }
}

// The first pass, when there is something to read before the update: returns the snapshot (in
// `scratch`) the later passes read. `chunkCount` is 0 when there is no work.
const FusedSnapshot* firstPass(const float* grads, const int64_t* segments, int64_t segmentCount, int64_t chunkCount,
                               const FusedEnd& end, const int32_t* stepCount, void* scratch, cudaStream_t stream) {
  auto* snapshot = static_cast<FusedSnapshot*>(scratch);
  if (!end.checkFinite && !end.scaleFromDevice && stepCount == nullptr) return snapshot;
  const int64_t checked = end.checkFinite ? chunkCount : 0;
  fused_first_pass_kernel<<<optimBlocks(checked), kThreads, 0, stream>>>(
      grads, segments, segmentCount, checked, end.foundInf, end.scaleFromDevice ? end.scale : nullptr, stepCount,
      snapshot);
  checkLaunch("fused_first_pass_kernel");
  return snapshot;
}

}  // namespace

size_t fusedStepScratchBytes(int64_t segmentCount, int64_t chunkCount, bool lamb) {
  return kSnapshotBytes + (lamb ? lambScratchBytes(segmentCount, chunkCount) : 0);
}

void fusedSgdStep(float* params, float* grads, float* momentumBuffer, const int64_t* segments, int64_t segmentCount,
                  int64_t chunkCount, const SgdGroupParams* groups, bool firstStep, const FusedEnd& end, void* scratch,
                  cudaStream_t stream) {
  const bool work = segmentCount > 0 && chunkCount > 0;
  if (!work) segmentCount = chunkCount = 0;
  const FusedSnapshot* snapshot = firstPass(grads, segments, segmentCount, chunkCount, end, nullptr, scratch, stream);
  if (!work && end.scale == nullptr) return;
  fused_sgd_kernel<<<optimBlocks(chunkCount), kThreads, 0, stream>>>(
      params, grads, momentumBuffer, segments, segmentCount, chunkCount, groups, firstStep, end, snapshot);
  checkLaunch("fused_sgd_kernel");
}

void fusedAdamStep(bool lamb, float* params, float* grads, float* expAvg, float* expAvgSq, const int64_t* segments,
                   int64_t segmentCount, int64_t chunkCount, const AdamGroupParams* groups, int64_t groupCount,
                   int64_t step, int32_t* stepCount, const FusedEnd& end, void* scratch, cudaStream_t stream) {
  const bool work = segmentCount > 0 && chunkCount > 0;
  if (!work) {
    // As the unfused step: nothing to update leaves the step count alone; the scale still updates.
    segmentCount = chunkCount = groupCount = 0;
    stepCount = nullptr;
  }
  RC_CHECK_ARG(!work || (groupCount >= 1 && groupCount <= kMaxOptimGroups),
               (lamb ? "fused lamb step" : "fused adamw step")
                   << ": the CUDA backend takes 1 to " << kMaxOptimGroups << " parameter groups, got " << groupCount);
  const FusedSnapshot* snapshot = firstPass(grads, segments, segmentCount, chunkCount, end, stepCount, scratch, stream);
  if (!work && end.scale == nullptr) return;
  const unsigned blocks = optimBlocks(chunkCount);
  if (!lamb) {
    fused_adamw_kernel<<<blocks, kThreads, coeffBytes(groupCount), stream>>>(
        params, grads, expAvg, expAvgSq, segments, segmentCount, chunkCount, groups, groupCount, step, stepCount, end,
        snapshot);
    checkLaunch("fused_adamw_kernel");
    return;
  }
  const LambScratch ls = lambScratch(static_cast<char*>(scratch) + kSnapshotBytes, chunkCount);
  if (work) {
    fused_lamb_moments_kernel<<<blocks, kThreads, coeffBytes(groupCount), stream>>>(
        params, grads, expAvg, expAvgSq, segments, segmentCount, chunkCount, groups, groupCount, step, stepCount, end,
        snapshot, ls.partial);
    checkLaunch("fused_lamb_moments_kernel");
    lambTrustRatios(segments, segmentCount, groups, end.foundInf, ls.partial, ls.ratio, stream);
  }
  fused_lamb_update_kernel<<<blocks, kThreads, coeffBytes(groupCount), stream>>>(
      params, expAvg, expAvgSq, segments, segmentCount, chunkCount, groups, groupCount, step, stepCount, end, snapshot,
      ls.ratio);
  checkLaunch("fused_lamb_update_kernel");
}

}  // namespace rc::cuda
