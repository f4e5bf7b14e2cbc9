// AdamW, LAMB, the gradient norm, unscale-and-check, gradient clipping and the GradScaler's scale
// update over arena segments (semantics in core/backend.h, the segment table in kernels.h).
// Chunk g of the table goes to block g % gridDim.x, which finds its segment by binary search over
// the firstChunk column. Every element is updated by exactly one thread, and every reduction
// adds per-thread values in a fixed order, per-block values with cub's fixed tree, and per-chunk
// partials in chunk order in a second kernel, so nothing depends on the grid or on timing.
#include "device_utils.cuh"
#include "kernels.h"
#include "optim_chunks.cuh"

namespace rc::cuda {

namespace {

__global__ void __launch_bounds__(kThreads)
    adamw_kernel(float* __restrict__ params, const float* __restrict__ grads, float* __restrict__ expAvg,
                 float* __restrict__ expAvgSq, const int64_t* __restrict__ segments, int64_t segmentCount,
                 int64_t chunkCount, const AdamGroupParams* __restrict__ groups, int64_t groupCount, int64_t step,
                 const int32_t* __restrict__ stepCount, const float* __restrict__ foundInf, float gradScaleInv) {
  extern __shared__ AdamCoeffs sCoeffs[];
  if (skipStep(foundInf)) return;  // GradScaler found inf/NaN: the same for every thread
  loadCoeffs(sCoeffs, groups, groupCount, step, stepCount);
  for (int64_t chunk = blockIdx.x; chunk < chunkCount; chunk += gridDim.x) {
    const ChunkRange r = findChunk(segments, segmentCount, chunk);
    const AdamCoeffs c = sCoeffs[r.group];
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
      adamwElement(params[i], expAvg[i], expAvgSq[i], grads[i] * gradScaleInv, c);
    }
  }
}

// LAMB pass one: moments, and per chunk the sums of p^2 and u^2 into partial[2 * chunk + {0, 1}].
__global__ void __launch_bounds__(kThreads)
    lamb_moments_kernel(const float* __restrict__ params, const float* __restrict__ grads, float* __restrict__ expAvg,
                        float* __restrict__ expAvgSq, const int64_t* __restrict__ segments, int64_t segmentCount,
                        int64_t chunkCount, const AdamGroupParams* __restrict__ groups, int64_t groupCount,
                        int64_t step, const int32_t* __restrict__ stepCount, const float* __restrict__ foundInf,
                        float gradScaleInv, double* __restrict__ partial) {
  extern __shared__ AdamCoeffs sCoeffs[];
  __shared__ typename BlockReduceDouble::TempStorage reduceStorage;
  if (skipStep(foundInf)) return;
  loadCoeffs(sCoeffs, groups, groupCount, step, stepCount);
  for (int64_t chunk = blockIdx.x; chunk < chunkCount; chunk += gridDim.x) {
    const ChunkRange r = findChunk(segments, segmentCount, chunk);
    const AdamCoeffs c = sCoeffs[r.group];
    double pp = 0.0, uu = 0.0;
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
      lambMomentsElement(params[i], expAvg[i], expAvgSq[i], grads[i] * gradScaleInv, c, pp, uu);
    }
    storeLambPartials(reduceStorage, pp, uu, chunk, partial);
  }
}

// LAMB's trust ratio of each segment from its chunks' partials, added in chunk order.
__global__ void __launch_bounds__(kThreads)
    lamb_ratio_kernel(const int64_t* __restrict__ segments, int64_t segmentCount,
                      const AdamGroupParams* __restrict__ groups, const float* __restrict__ foundInf,
                      const double* __restrict__ partial, float* __restrict__ ratio) {
  __shared__ typename BlockReduceDouble::TempStorage reduceStorage;
  if (skipStep(foundInf)) return;
  for (int64_t s = blockIdx.x; s < segmentCount; s += gridDim.x) {
    const int64_t* seg = segments + 4 * s;
    const int64_t first = seg[3], chunks = ceilDiv(seg[1], kOptimChunk);
    double pp = 0.0, uu = 0.0;
    for (int64_t k = threadIdx.x; k < chunks; k += blockDim.x) {
      pp += partial[2 * (first + k)];
      uu += partial[2 * (first + k) + 1];
    }
    const double sumPp = BlockReduceDouble(reduceStorage).Sum(pp);
    __syncthreads();
    const double sumUu = BlockReduceDouble(reduceStorage).Sum(uu);
    __syncthreads();
    if (threadIdx.x == 0) {
      const AdamGroupParams& g = groups[seg[2]];
      const bool adapt = g.weightDecay != 0.0f || g.alwaysAdapt != 0;
      ratio[s] = adapt && sumPp > 0.0 && sumUu > 0.0 ? static_cast<float>(sqrt(sumPp) / sqrt(sumUu)) : 1.0f;
    }
  }
}

// LAMB pass two: u again from the stored moments, then p -= lr * ratio * u.
__global__ void __launch_bounds__(kThreads)
    lamb_update_kernel(float* __restrict__ params, const float* __restrict__ expAvg, const float* __restrict__ expAvgSq,
                       const int64_t* __restrict__ segments, int64_t segmentCount, int64_t chunkCount,
                       const AdamGroupParams* __restrict__ groups, int64_t groupCount, int64_t step,
                       const int32_t* __restrict__ stepCount, const float* __restrict__ foundInf,
                       const float* __restrict__ ratio) {
  extern __shared__ AdamCoeffs sCoeffs[];
  if (skipStep(foundInf)) return;
  loadCoeffs(sCoeffs, groups, groupCount, step, stepCount);
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

// Per chunk: the sum of squares into partial[chunk]; an inf/NaN element raises *foundInf.
__global__ void __launch_bounds__(kThreads)
    sum_squares_kernel(const float* __restrict__ grads, const int64_t* __restrict__ segments, int64_t segmentCount,
                       int64_t chunkCount, float* __restrict__ foundInf, double* __restrict__ partial) {
  __shared__ typename BlockReduceDouble::TempStorage reduceStorage;
  bool nonFinite = false;
  for (int64_t chunk = blockIdx.x; chunk < chunkCount; chunk += gridDim.x) {
    const ChunkRange r = findChunk(segments, segmentCount, chunk);
    double sum = 0.0;
#pragma unroll 4
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
      const float g = grads[i];
      sum += static_cast<double>(g) * g;
      nonFinite = nonFinite || !isfinite(g);
    }
    const double blockSum = BlockReduceDouble(reduceStorage).Sum(sum);
    __syncthreads();
    if (threadIdx.x == 0) partial[chunk] = blockSum;
  }
  // Every writer stores the same value, so the race is benign (as in PyTorch's kernels).
  if (nonFinite && foundInf != nullptr) *foundInf = 1.0f;
}

// One block: *out = sqrt(sum of the partials), added per thread in order, then a fixed tree.
__global__ void __launch_bounds__(kThreads)
    norm_finish_kernel(const double* __restrict__ partial, int64_t count, float* __restrict__ out) {
  __shared__ typename BlockReduceDouble::TempStorage reduceStorage;
  double sum = 0.0;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) sum += partial[k];
  const double total = BlockReduceDouble(reduceStorage).Sum(sum);
  if (threadIdx.x == 0) *out = static_cast<float>(sqrt(total));
}

__global__ void __launch_bounds__(kThreads)
    unscale_kernel(float* __restrict__ grads, const int64_t* __restrict__ segments, int64_t segmentCount,
                   int64_t chunkCount, float invScale, const float* __restrict__ scale, float* __restrict__ foundInf) {
  // A scale on the device (a captured step): its reciprocal rounded as the host rounds 1 / scale.
  if (scale) invScale = static_cast<float>(1.0 / static_cast<double>(*scale));
  bool nonFinite = false;
  for (int64_t chunk = blockIdx.x; chunk < chunkCount; chunk += gridDim.x) {
    const ChunkRange r = findChunk(segments, segmentCount, chunk);
#pragma unroll 4
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
      const float g = grads[i];
      nonFinite = nonFinite || !isfinite(g);
      grads[i] = g * invScale;
    }
  }
  if (nonFinite) *foundInf = 1.0f;  // benign race: every writer stores 1
}

__global__ void __launch_bounds__(kThreads)
    clip_kernel(float* __restrict__ grads, const int64_t* __restrict__ segments, int64_t segmentCount,
                int64_t chunkCount, const float* __restrict__ norm, float maxNorm) {
  const float coef = maxNorm / (*norm + 1e-6f);
  // min(1, coef), keeping a NaN coefficient (NaN norm) as NaN, as torch.clamp does.
  const float factor = coef > 1.0f ? 1.0f : coef;
  if (factor == 1.0f) return;  // x * 1 == x: nothing to write
  for (int64_t chunk = blockIdx.x; chunk < chunkCount; chunk += gridDim.x) {
    const ChunkRange r = findChunk(segments, segmentCount, chunk);
#pragma unroll 4
    for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) grads[i] *= factor;
  }
}

__global__ void scaler_update_kernel(float* __restrict__ scale, int32_t* __restrict__ growthTracker,
                                     const float* __restrict__ foundInf, float growthFactor, float backoffFactor,
                                     int32_t growthInterval) {
  updateScale(scale, growthTracker, foundInf, growthFactor, backoffFactor, growthInterval);
}

// The device's step count of a captured optimizer step: one more, unless the step is skipped.
__global__ void step_count_kernel(int32_t* __restrict__ stepCount, const float* __restrict__ foundInf) {
  if (!skipStep(foundInf)) ++*stepCount;
}

void advanceStepCount(int32_t* stepCount, const float* foundInf, cudaStream_t stream) {
  if (stepCount == nullptr) return;
  step_count_kernel<<<1, 1, 0, stream>>>(stepCount, foundInf);
  checkLaunch("step_count_kernel");
}

void checkGroups(int64_t groupCount, const char* op) {
  RC_CHECK_ARG(groupCount >= 1 && groupCount <= kMaxOptimGroups,
               op << ": the CUDA backend takes 1 to " << kMaxOptimGroups << " parameter groups, got " << groupCount);
}

}  // namespace

void adamwStep(float* params, const float* grads, float* expAvg, float* expAvgSq, const int64_t* segments,
               int64_t segmentCount, int64_t chunkCount, const AdamGroupParams* groups, int64_t groupCount,
               int64_t step, int32_t* stepCount, const float* foundInf, float gradScaleInv, cudaStream_t stream) {
  if (segmentCount <= 0 || chunkCount <= 0) return;
  checkGroups(groupCount, "adamw step");
  advanceStepCount(stepCount, foundInf, stream);
  adamw_kernel<<<optimBlocks(chunkCount), kThreads, coeffBytes(groupCount), stream>>>(
      params, grads, expAvg, expAvgSq, segments, segmentCount, chunkCount, groups, groupCount, step, stepCount,
      foundInf, gradScaleInv);
  checkLaunch("adamw_kernel");
}

size_t lambScratchBytes(int64_t segmentCount, int64_t chunkCount) {
  return alignUp256(static_cast<size_t>(2 * chunkCount) * sizeof(double)) +
         static_cast<size_t>(segmentCount) * sizeof(float);
}

void lambStep(float* params, const float* grads, float* expAvg, float* expAvgSq, const int64_t* segments,
              int64_t segmentCount, int64_t chunkCount, const AdamGroupParams* groups, int64_t groupCount, int64_t step,
              int32_t* stepCount, const float* foundInf, float gradScaleInv, void* scratch, cudaStream_t stream) {
  if (segmentCount <= 0 || chunkCount <= 0) return;
  checkGroups(groupCount, "lamb step");
  advanceStepCount(stepCount, foundInf, stream);
  const LambScratch ls = lambScratch(scratch, chunkCount);
  const unsigned blocks = optimBlocks(chunkCount);
  lamb_moments_kernel<<<blocks, kThreads, coeffBytes(groupCount), stream>>>(
      params, grads, expAvg, expAvgSq, segments, segmentCount, chunkCount, groups, groupCount, step, stepCount,
      foundInf, gradScaleInv, ls.partial);
  checkLaunch("lamb_moments_kernel");
  lambTrustRatios(segments, segmentCount, groups, foundInf, ls.partial, ls.ratio, stream);
  lamb_update_kernel<<<blocks, kThreads, coeffBytes(groupCount), stream>>>(params, expAvg, expAvgSq, segments,
                                                                           segmentCount, chunkCount, groups, groupCount,
                                                                           step, stepCount, foundInf, ls.ratio);
  checkLaunch("lamb_update_kernel");
}

void lambTrustRatios(const int64_t* segments, int64_t segmentCount, const AdamGroupParams* groups,
                     const float* foundInf, const double* partial, float* ratio, cudaStream_t stream) {
  lamb_ratio_kernel<<<optimBlocks(segmentCount), kThreads, 0, stream>>>(segments, segmentCount, groups, foundInf,
                                                                        partial, ratio);
  checkLaunch("lamb_ratio_kernel");
}

size_t gradNormScratchBytes(int64_t chunkCount) {
  return static_cast<size_t>(std::max<int64_t>(chunkCount, 1)) * sizeof(double);
}

void gradNorm(const float* grads, const int64_t* segments, int64_t segmentCount, int64_t chunkCount, float* out,
              float* foundInf, void* scratch, cudaStream_t stream) {
  auto* partial = static_cast<double*>(scratch);
  if (segmentCount > 0 && chunkCount > 0) {
    sum_squares_kernel<<<optimBlocks(chunkCount), kThreads, 0, stream>>>(grads, segments, segmentCount, chunkCount,
                                                                         foundInf, partial);
    checkLaunch("sum_squares_kernel");
  } else {
    chunkCount = 0;  // nothing to add: the norm of no elements is 0
  }
  norm_finish_kernel<<<1, kThreads, 0, stream>>>(partial, chunkCount, out);
  checkLaunch("norm_finish_kernel");
}

void unscaleAndCheck(float* grads, const int64_t* segments, int64_t segmentCount, int64_t chunkCount, float invScale,
                     const float* scale, float* foundInf, cudaStream_t stream) {
  if (segmentCount <= 0 || chunkCount <= 0) return;
  unscale_kernel<<<optimBlocks(chunkCount), kThreads, 0, stream>>>(grads, segments, segmentCount, chunkCount, invScale,
                                                                   scale, foundInf);
  checkLaunch("unscale_kernel");
}

void clipGradNorm(float* grads, const int64_t* segments, int64_t segmentCount, int64_t chunkCount, const float* norm,
                  float maxNorm, cudaStream_t stream) {
  if (segmentCount <= 0 || chunkCount <= 0) return;
  clip_kernel<<<optimBlocks(chunkCount), kThreads, 0, stream>>>(grads, segments, segmentCount, chunkCount, norm,
                                                                maxNorm);
  checkLaunch("clip_kernel");
}

void scalerUpdate(float* scale, int32_t* growthTracker, const float* foundInf, float growthFactor, float backoffFactor,
                  int32_t growthInterval, cudaStream_t stream) {
  scaler_update_kernel<<<1, 1, 0, stream>>>(scale, growthTracker, foundInf, growthFactor, backoffFactor,
                                            growthInterval);
  checkLaunch("scaler_update_kernel");
}

}  // namespace rc::cuda
