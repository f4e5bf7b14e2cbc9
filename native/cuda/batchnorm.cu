// Batch normalisation over NHWC rows with fused residual add and ReLU. Statistics are two-stage
// reductions without float atomics, so every run gives the same bits: stage one has each block
// reduce a fixed range of rows for a tile of channels into `partial`; stage two has one warp per
// channel combine the row blocks in order. Means and variances use Welford per thread and Chan's
// merge across threads and blocks, which stays accurate at millions of rows and when |mean| >> std.
#include "device_utils.cuh"
#include "kernels.h"

namespace rc::cuda {

namespace {

// Chan et al.'s merge of (n, mean, m2) with (nb, meanb, m2b); m2 is the sum of squared deviations.
__device__ __forceinline__ void chanMerge(float& n, float& mean, float& m2, float nb, float meanb, float m2b) {
  if (nb == 0.0f) return;
  const float total = n + nb;
  const float delta = meanb - mean;
  const float wb = nb / total;
  mean += delta * wb;
  m2 += m2b + delta * delta * n * wb;
  n = total;
}

// Rows of row block b (the last one may be short).
__device__ __forceinline__ float rowBlockCount(int64_t b, int64_t rowsPerBlock, int64_t rows) {
  return static_cast<float>(min(rowsPerBlock, rows - b * rowsPerBlock));
}

// ---- training statistics -----------------------------------------------------------------------

// partial: mean[C][rowBlocks] then m2[C][rowBlocks] of each row block.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    batchnorm_stats_kernel(const T* __restrict__ x, int64_t rows, int64_t channels, int64_t rowsPerBlock,
                           float* __restrict__ partial) {
  __shared__ float sN[kThreads];
  __shared__ float sMean[kThreads * V];
  __shared__ float sM2[kThreads * V];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  const int64_t first = blockIdx.y * rowsPerBlock;
  const int64_t last = min(first + rowsPerBlock, rows);

  float n = 0.0f, mean[V], m2[V];
#pragma unroll
  for (int i = 0; i < V; ++i) mean[i] = m2[i] = 0.0f;
  if (c < channels) {
    for (int64_t r = first + threadIdx.y; r < last; r += blockDim.y) {
      float v[V];
      loadPack<T, V>(x + r * channels + c, v);
      n += 1.0f;
      const float inv = 1.0f / n;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float delta = v[i] - mean[i];
        mean[i] += delta * inv;
        m2[i] += delta * (v[i] - mean[i]);
      }
    }
  }

  // Tree over the threads of a column (same channels), always in the same order.
  sN[tid] = n;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    sMean[tid * V + i] = mean[i];
    sM2[tid * V + i] = m2[i];
  }
  __syncthreads();
  for (int half = blockDim.y / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.y) < half) {
      const int other = tid + half * blockDim.x;
      const float nb = sN[other];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        float ni = n;  // every channel of the pack shares the count
        chanMerge(ni, mean[i], m2[i], nb, sMean[other * V + i], sM2[other * V + i]);
        sMean[tid * V + i] = mean[i];
        sM2[tid * V + i] = m2[i];
      }
      n += nb;
      sN[tid] = n;
    }
    __syncthreads();
  }

  if (threadIdx.y == 0 && c < channels) {
    const int64_t rowBlocks = gridDim.y;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      partial[(c + i) * rowBlocks + blockIdx.y] = mean[i];
      partial[(channels + c + i) * rowBlocks + blockIdx.y] = m2[i];
    }
  }
}

// One warp merges the row blocks of channel c of the stats kernel's partials, in a fixed order;
// lane 0 ends with the channel's count, mean and M2.
__device__ __forceinline__ void mergeRowBlocks(const float* __restrict__ partial, int64_t rowBlocks,
                                               int64_t rowsPerBlock, int64_t rows, int64_t channels, int64_t c,
                                               int lane, float& n, float& mean, float& m2) {
  const float* pMean = partial + c * rowBlocks;
  const float* pM2 = partial + (channels + c) * rowBlocks;
  for (int64_t b = lane; b < rowBlocks; b += 32)
    chanMerge(n, mean, m2, rowBlockCount(b, rowsPerBlock, rows), pMean[b], pM2[b]);
  for (int offset = 16; offset > 0; offset /= 2) {
    const float nb = __shfl_down_sync(0xffffffffu, n, offset);
    const float meanb = __shfl_down_sync(0xffffffffu, mean, offset);
    const float m2b = __shfl_down_sync(0xffffffffu, m2, offset);
    chanMerge(n, mean, m2, nb, meanb, m2b);
  }
}

// One warp per channel: merges the row blocks, then saves and tracks the statistics.
__global__ void batchnorm_stats_finalize_kernel(const float* __restrict__ partial, int64_t rowBlocks,
                                                int64_t rowsPerBlock, int64_t rows, int64_t channels, float momentum,
                                                float eps, float* __restrict__ runningMean,
                                                float* __restrict__ runningVar, float* __restrict__ saveMean,
                                                float* __restrict__ saveInvStd) {
  const int lane = threadIdx.x % 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (c >= channels) return;  // whole warps leave together, so the shuffles below stay full
  float n = 0.0f, mean = 0.0f, m2 = 0.0f;
  mergeRowBlocks(partial, rowBlocks, rowsPerBlock, rows, channels, c, lane, n, mean, m2);
  if (lane != 0) return;
  const float var = m2 / n;
  saveMean[c] = mean;
  saveInvStd[c] = 1.0f / sqrtf(var + eps);
  runningMean[c] = (1.0f - momentum) * runningMean[c] + momentum * mean;
  runningVar[c] = (1.0f - momentum) * runningVar[c] + momentum * (var * n / (n - 1.0f));
}

// ---- normalisation -----------------------------------------------------------------------------

// y = relu?(x * scale + shift + residual?), scale = gamma * invStd, shift = beta - mean * scale.
// Training passes the saved inverse std; inference passes the running variance (kFromVariance).
template <typename T, int V, bool kFromVariance>
__global__ void __launch_bounds__(kThreads)
    batchnorm_fwd_kernel(const T* __restrict__ x, const T* __restrict__ residual, T* __restrict__ y,
                         const float* __restrict__ gamma, const float* __restrict__ beta,
                         const float* __restrict__ mean, const float* __restrict__ spread, float eps, int64_t rows,
                         int64_t channels, bool relu) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c >= channels) return;
  float scale[V], shift[V], mu[V], s[V], b[V];
  loadChannels<V>(gamma, c, scale);
  loadChannels<V>(beta, c, b);
  loadChannels<V>(mean, c, mu);
  loadChannels<V>(spread, c, s);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    scale[i] *= kFromVariance ? 1.0f / sqrtf(s[i] + eps) : s[i];
    shift[i] = b[i] - mu[i] * scale[i];
  }
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const int64_t at = r * channels + c;
    float v[V];
    loadPack<T, V>(x + at, v);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = v[i] * scale[i] + shift[i];
    if (residual) {
      float res[V];
      loadPack<T, V>(residual + at, res);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] += res[i];
    }
    if (relu) {
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = reluValue(v[i]);
    }
    storePack<T, V>(y + at, v);
  }
}

// ---- backward ----------------------------------------------------------------------------------

// The gradient reaching the BN output: dy, masked where the fused ReLU clipped.
template <int V>
__device__ __forceinline__ void maskByOutput(const float (&out)[V], float (&g)[V]) {
#pragma unroll
  for (int i = 0; i < V; ++i) g[i] = reluGrad(out[i], g[i]);
}

// partial: sum(g)[C][rowBlocks] then sum(g * xhat)[C][rowBlocks] of each row block.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    batchnorm_bwd_stats_kernel(const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ dy,
                               const float* __restrict__ saveMean, const float* __restrict__ saveInvStd, int64_t rows,
                               int64_t channels, int64_t rowsPerBlock, bool relu, float* __restrict__ partial) {
  __shared__ float sG[kThreads * V];
  __shared__ float sGX[kThreads * V];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  const int64_t first = blockIdx.y * rowsPerBlock;
  const int64_t last = min(first + rowsPerBlock, rows);

  float sumG[V], sumGX[V];
#pragma unroll
  for (int i = 0; i < V; ++i) sumG[i] = sumGX[i] = 0.0f;
  if (c < channels) {
    float mu[V], invStd[V];
    loadChannels<V>(saveMean, c, mu);
    loadChannels<V>(saveInvStd, c, invStd);
    for (int64_t r = first + threadIdx.y; r < last; r += blockDim.y) {
      const int64_t at = r * channels + c;
      float xv[V], g[V];
      loadPack<T, V>(x + at, xv);
      loadPack<T, V>(dy + at, g);
      if (relu) {
        float out[V];
        loadPack<T, V>(y + at, out);
        maskByOutput<V>(out, g);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) {
        sumG[i] += g[i];
        sumGX[i] += g[i] * (xv[i] - mu[i]) * invStd[i];
      }
    }
  }

#pragma unroll
  for (int i = 0; i < V; ++i) {
    sG[tid * V + i] = sumG[i];
    sGX[tid * V + i] = sumGX[i];
  }
  __syncthreads();
  for (int half = blockDim.y / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.y) < half) {
      const int other = tid + half * blockDim.x;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        sumG[i] += sG[other * V + i];
        sumGX[i] += sGX[other * V + i];
        sG[tid * V + i] = sumG[i];
        sGX[tid * V + i] = sumGX[i];
      }
    }
    __syncthreads();
  }

  if (threadIdx.y == 0 && c < channels) {
    const int64_t rowBlocks = gridDim.y;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      partial[(c + i) * rowBlocks + blockIdx.y] = sumG[i];
      partial[(channels + c + i) * rowBlocks + blockIdx.y] = sumGX[i];
    }
  }
}

// One warp sums the row blocks of channel c of the backward stats kernel's partials, in a fixed
// order; lane 0 ends with sum(g) and sum(g * xhat).
__device__ __forceinline__ void sumRowBlocks(const float* __restrict__ partial, int64_t rowBlocks, int64_t channels,
                                             int64_t c, int lane, float& sumG, float& sumGX) {
  const float* pG = partial + c * rowBlocks;
  const float* pGX = partial + (channels + c) * rowBlocks;
  for (int64_t b = lane; b < rowBlocks; b += 32) {
    sumG += pG[b];
    sumGX += pGX[b];
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    sumG += __shfl_down_sync(0xffffffffu, sumG, offset);
    sumGX += __shfl_down_sync(0xffffffffu, sumGX, offset);
  }
}

// One warp per channel: sums the row blocks in order, accumulates dGamma/dBeta and leaves
// coef = [mean_rows(g)[C], invStd * mean_rows(g * xhat)[C]] for the dx kernel.
__global__ void batchnorm_bwd_finalize_kernel(const float* __restrict__ partial, int64_t rowBlocks, int64_t rows,
                                              int64_t channels, const float* __restrict__ saveInvStd,
                                              float* __restrict__ dGamma, float* __restrict__ dBeta,
                                              float* __restrict__ coef) {
  const int lane = threadIdx.x % 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (c >= channels) return;
  float sumG = 0.0f, sumGX = 0.0f;
  sumRowBlocks(partial, rowBlocks, channels, c, lane, sumG, sumGX);
  if (lane != 0) return;
  dGamma[c] += sumGX;
  dBeta[c] += sumG;
  const float m = static_cast<float>(rows);
  coef[c] = sumG / m;
  coef[channels + c] = saveInvStd[c] * (sumGX / m);
}

// dx = gamma * invStd * (g - mean(g) - xhat * mean(g * xhat)), written with (x - mean) rather than
// xhat so that four per-channel values stay in registers (four blocks per SM at 16-byte packs);
// without batch statistics (evaluation mode) dx = gamma * invStd * g; dResidual = g.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads, 4)
    batchnorm_bwd_kernel(const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                         T* __restrict__ dResidual, const float* __restrict__ gamma, const float* __restrict__ saveMean,
                         const float* __restrict__ saveInvStd, const float* __restrict__ coef, int64_t rows,
                         int64_t channels, bool relu, bool batchStats) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c >= channels) return;
  float a[V], mu[V], meanG[V], k[V];
  loadChannels<V>(gamma, c, a);
  loadChannels<V>(saveMean, c, mu);
  loadChannels<V>(coef, c, meanG);
  loadChannels<V>(coef + channels, c, k);
#pragma unroll
  for (int i = 0; i < V; ++i) a[i] *= __ldg(saveInvStd + c + i);
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const int64_t at = r * channels + c;
    float xv[V], g[V];
    loadPack<T, V>(x + at, xv);
    loadPack<T, V>(dy + at, g);
    if (relu) {
      float out[V];
      loadPack<T, V>(y + at, out);
      maskByOutput<V>(out, g);
    }
    if (dResidual) storePack<T, V>(dResidual + at, g);
#pragma unroll
    for (int i = 0; i < V; ++i) xv[i] = batchStats ? a[i] * (g[i] - meanG[i] - (xv[i] - mu[i]) * k[i]) : a[i] * g[i];
    storePack<T, V>(dx + at, xv);
  }
}

// The constants of a backward in evaluation mode: the running mean and 1/sqrt(running var + eps),
// as batchnorm_fwd_kernel computes them.
__global__ void batchnorm_save_running_kernel(const float* __restrict__ runningMean,
                                              const float* __restrict__ runningVar, float eps, int64_t channels,
                                              float* __restrict__ saveMean, float* __restrict__ saveInvStd) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < channels;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    saveMean[c] = runningMean[c];
    saveInvStd[c] = 1.0f / sqrtf(runningVar[c] + eps);
  }
}

// ---- SyncBatchNorm -----------------------------------------------------------------------------

// One warp per channel: this rank's count, mean and M2 into stats[3, C].
__global__ void syncbn_stats_finalize_kernel(const float* __restrict__ partial, int64_t rowBlocks, int64_t rowsPerBlock,
                                             int64_t rows, int64_t channels, float* __restrict__ stats) {
  const int lane = threadIdx.x % 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (c >= channels) return;
  float n = 0.0f, mean = 0.0f, m2 = 0.0f;
  mergeRowBlocks(partial, rowBlocks, rowsPerBlock, rows, channels, c, lane, n, mean, m2);
  if (lane != 0) return;
  stats[c] = n;
  stats[channels + c] = mean;
  stats[2 * channels + c] = m2;
}

// One thread per channel: merges every rank's (count, mean, M2) of stats[ranks, 3, C] in double
// (global mean first, then M2 = sum of M2 + count * (rank mean - global mean)^2), saves the global
// mean and inverse std and tracks them. A global count of at most 1 gives inf/NaN, as in PyTorch.
__global__ void syncbn_merge_kernel(const float* __restrict__ stats, int64_t ranks, int64_t channels, float momentum,
                                    float eps, float* __restrict__ runningMean, float* __restrict__ runningVar,
                                    float* __restrict__ saveMean, float* __restrict__ saveInvStd) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < channels;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double n = 0.0, sum = 0.0;
    for (int64_t r = 0; r < ranks; ++r) {
      const float* s = stats + r * 3 * channels;
      if (s[c] <= 0.0f) continue;
      n += s[c];
      sum += static_cast<double>(s[c]) * s[channels + c];
    }
    const double mean = sum / n;
    double m2 = 0.0;
    for (int64_t r = 0; r < ranks; ++r) {
      const float* s = stats + r * 3 * channels;
      if (s[c] <= 0.0f) continue;
      const double delta = s[channels + c] - mean;
      m2 += s[2 * channels + c] + s[c] * delta * delta;
    }
    saveMean[c] = static_cast<float>(mean);
    saveInvStd[c] = static_cast<float>(1.0 / sqrt(m2 / n + eps));
    runningMean[c] = static_cast<float>((1.0 - momentum) * runningMean[c] + momentum * mean);
    runningVar[c] = static_cast<float>((1.0 - momentum) * runningVar[c] + momentum * m2 / (n - 1.0));
  }
}

// One warp per channel: this rank's sum(g), sum(g * xhat) and row count into sums[3, C]; the local
// dGamma and dBeta accumulated.
__global__ void syncbn_bwd_reduce_finalize_kernel(const float* __restrict__ partial, int64_t rowBlocks, int64_t rows,
                                                  int64_t channels, float* __restrict__ sums,
                                                  float* __restrict__ dGamma, float* __restrict__ dBeta) {
  const int lane = threadIdx.x % 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (c >= channels) return;
  float sumG = 0.0f, sumGX = 0.0f;
  sumRowBlocks(partial, rowBlocks, channels, c, lane, sumG, sumGX);
  if (lane != 0) return;
  sums[c] = sumG;
  sums[channels + c] = sumGX;
  sums[2 * channels + c] = static_cast<float>(rows);
  dGamma[c] += sumGX;
  dBeta[c] += sumG;
}

// coef = [sum(g) / M, invStd * sum(g * xhat) / M] from the sums over all ranks (M their count), as
// batchnorm_bwd_finalize_kernel leaves them for batchnorm_bwd_kernel.
__global__ void syncbn_bwd_coef_kernel(const float* __restrict__ sums, const float* __restrict__ saveInvStd,
                                       int64_t channels, float* __restrict__ coef) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < channels;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float m = sums[2 * channels + c];
    coef[c] = sums[c] / m;
    coef[channels + c] = saveInvStd[c] * (sums[channels + c] / m);
  }
}

// The finalize kernels run one warp per channel.
constexpr int kFinalizeWarps = kThreads / 32;

// Launches batchnorm_fwd_kernel alone, for statistics that already exist (running or merged ones).
template <bool kFromVariance>
void normalise(DType dtype, const char* what, const void* x, const void* residual, void* y, const float* gamma,
               const float* beta, const float* mean, const float* spread, float eps, int64_t rows, int64_t channels,
               bool relu, cudaStream_t stream) {
  dispatchFloat(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(channels, {x, residual, y}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const ChannelTiling t = channelTiling(channels, V);
      batchnorm_fwd_kernel<T, V, kFromVariance><<<rowsGrid(t, rows), dim3(t.tx, t.ty), 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(residual), static_cast<T*>(y), gamma, beta, mean, spread, eps,
          rows, channels, relu);
      checkLaunch("batchnorm_fwd_kernel");
    });
  });
}

}  // namespace

// partial[0, 2*C*rowBlocks): per-row-block partials; partial[2*C*rowBlocks, +2*C): backward's
// per-channel coefficients. At least min(rows, kCrossEntropyBlocks) floats, so that crossEntropy's
// per-block losses fit in batchNormScratchFloats(n, 1) too.
size_t batchNormScratchFloats(int64_t rows, int64_t channels) {
  const int64_t statFloats = 2 * channels * (reductionRowBlocks(rows, channels) + 1);
  return static_cast<size_t>(std::max<int64_t>(statFloats, std::min(rows, kCrossEntropyBlocks)));
}

void batchNormForwardTraining(DType dtype, const void* x, const void* residual, void* y, const float* gamma,
                              const float* beta, float* runningMean, float* runningVar, float* saveMean,
                              float* saveInvStd, int64_t rows, int64_t channels, float momentum, float eps, bool relu,
                              float* partial, cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  const int64_t rowsPerBlock = reductionRowsPerBlock(rows, channels);
  const int64_t rowBlocks = reductionRowBlocks(rows, channels);
  dispatchFloat(dtype, "batchnorm forward", [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(channels, {x, residual, y}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const ChannelTiling t = channelTiling(channels, V);
      const dim3 block(t.tx, t.ty);
      batchnorm_stats_kernel<T, V><<<dim3(t.channelTiles, static_cast<unsigned>(rowBlocks)), block, 0, stream>>>(
          static_cast<const T*>(x), rows, channels, rowsPerBlock, partial);
      checkLaunch("batchnorm_stats_kernel");
      batchnorm_stats_finalize_kernel<<<static_cast<unsigned>(ceilDiv(channels, kFinalizeWarps)), kThreads, 0,
                                        stream>>>(partial, rowBlocks, rowsPerBlock, rows, channels, momentum, eps,
                                                  runningMean, runningVar, saveMean, saveInvStd);
      checkLaunch("batchnorm_stats_finalize_kernel");
      batchnorm_fwd_kernel<T, V, false><<<rowsGrid(t, rows), block, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(residual), static_cast<T*>(y), gamma, beta, saveMean,
          saveInvStd, eps, rows, channels, relu);
      checkLaunch("batchnorm_fwd_kernel");
    });
  });
}

void batchNormForwardInference(DType dtype, const void* x, const void* residual, void* y, const float* gamma,
                               const float* beta, const float* runningMean, const float* runningVar, float* saveMean,
                               float* saveInvStd, int64_t rows, int64_t channels, float eps, bool relu,
                               cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  if (saveMean && saveInvStd) {
    batchnorm_save_running_kernel<<<static_cast<unsigned>(ceilDiv(channels, kThreads)), kThreads, 0, stream>>>(
        runningMean, runningVar, eps, channels, saveMean, saveInvStd);
    checkLaunch("batchnorm_save_running_kernel");
  }
  normalise<true>(dtype, "batchnorm inference", x, residual, y, gamma, beta, runningMean, runningVar, eps, rows,
                  channels, relu, stream);
}

void batchNormBackward(DType dtype, const void* x, const void* y, const void* dy, void* dx, void* dResidual,
                       const float* gamma, const float* saveMean, const float* saveInvStd, float* dGamma, float* dBeta,
                       int64_t rows, int64_t channels, bool relu, bool batchStats, float* partial,
                       cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  const int64_t rowsPerBlock = reductionRowsPerBlock(rows, channels);
  const int64_t rowBlocks = reductionRowBlocks(rows, channels);
  float* coef = partial + 2 * channels * rowBlocks;
  dispatchFloat(dtype, "batchnorm backward", [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(channels, {x, relu ? y : nullptr, dy, dx, dResidual}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const ChannelTiling t = channelTiling(channels, V);
      const dim3 block(t.tx, t.ty);
      batchnorm_bwd_stats_kernel<T, V><<<dim3(t.channelTiles, static_cast<unsigned>(rowBlocks)), block, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(dy), saveMean, saveInvStd, rows,
          channels, rowsPerBlock, relu, partial);
      checkLaunch("batchnorm_bwd_stats_kernel");
      batchnorm_bwd_finalize_kernel<<<static_cast<unsigned>(ceilDiv(channels, kFinalizeWarps)), kThreads, 0, stream>>>(
          partial, rowBlocks, rows, channels, saveInvStd, dGamma, dBeta, coef);
      checkLaunch("batchnorm_bwd_finalize_kernel");
      batchnorm_bwd_kernel<T, V><<<rowsGrid(t, rows), block, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx),
          static_cast<T*>(dResidual), gamma, saveMean, saveInvStd, coef, rows, channels, relu, batchStats);
      checkLaunch("batchnorm_bwd_kernel");
    });
  });
}

void syncBatchNormStats(DType dtype, const void* x, float* stats, int64_t rows, int64_t channels, float* partial,
                        cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  const int64_t rowsPerBlock = reductionRowsPerBlock(rows, channels);
  const int64_t rowBlocks = reductionRowBlocks(rows, channels);
  dispatchFloat(dtype, "sync batchnorm stats", [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(channels, {x}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const ChannelTiling t = channelTiling(channels, V);
      batchnorm_stats_kernel<T, V>
          <<<dim3(t.channelTiles, static_cast<unsigned>(rowBlocks)), dim3(t.tx, t.ty), 0, stream>>>(
              static_cast<const T*>(x), rows, channels, rowsPerBlock, partial);
      checkLaunch("batchnorm_stats_kernel");
    });
  });
  syncbn_stats_finalize_kernel<<<static_cast<unsigned>(ceilDiv(channels, kFinalizeWarps)), kThreads, 0, stream>>>(
      partial, rowBlocks, rowsPerBlock, rows, channels, stats);
  checkLaunch("syncbn_stats_finalize_kernel");
}

void syncBatchNormForward(DType dtype, const void* x, const void* residual, void* y, const float* gamma,
                          const float* beta, const float* stats, int64_t ranks, float* runningMean, float* runningVar,
                          float* saveMean, float* saveInvStd, int64_t rows, int64_t channels, float momentum, float eps,
                          bool relu, cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  syncbn_merge_kernel<<<static_cast<unsigned>(ceilDiv(channels, kThreads)), kThreads, 0, stream>>>(
      stats, ranks, channels, momentum, eps, runningMean, runningVar, saveMean, saveInvStd);
  checkLaunch("syncbn_merge_kernel");
  normalise<false>(dtype, "sync batchnorm forward", x, residual, y, gamma, beta, saveMean, saveInvStd, eps, rows,
                   channels, relu, stream);
}

void syncBatchNormBackwardReduce(DType dtype, const void* x, const void* y, const void* dy, const float* saveMean,
                                 const float* saveInvStd, float* sums, float* dGamma, float* dBeta, int64_t rows,
                                 int64_t channels, bool relu, float* partial, cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  const int64_t rowsPerBlock = reductionRowsPerBlock(rows, channels);
  const int64_t rowBlocks = reductionRowBlocks(rows, channels);
  dispatchFloat(dtype, "sync batchnorm backward reduce", [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(channels, {x, relu ? y : nullptr, dy}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const ChannelTiling t = channelTiling(channels, V);
      batchnorm_bwd_stats_kernel<T, V>
          <<<dim3(t.channelTiles, static_cast<unsigned>(rowBlocks)), dim3(t.tx, t.ty), 0, stream>>>(
              static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(dy), saveMean, saveInvStd, rows,
              channels, rowsPerBlock, relu, partial);
      checkLaunch("batchnorm_bwd_stats_kernel");
    });
  });
  syncbn_bwd_reduce_finalize_kernel<<<static_cast<unsigned>(ceilDiv(channels, kFinalizeWarps)), kThreads, 0, stream>>>(
      partial, rowBlocks, rows, channels, sums, dGamma, dBeta);
  checkLaunch("syncbn_bwd_reduce_finalize_kernel");
}

void syncBatchNormBackwardElementwise(DType dtype, const void* x, const void* y, const void* dy, void* dx,
                                      void* dResidual, const float* gamma, const float* saveMean,
                                      const float* saveInvStd, const float* sums, int64_t rows, int64_t channels,
                                      bool relu, float* coef, cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  syncbn_bwd_coef_kernel<<<static_cast<unsigned>(ceilDiv(channels, kThreads)), kThreads, 0, stream>>>(sums, saveInvStd,
                                                                                                      channels, coef);
  checkLaunch("syncbn_bwd_coef_kernel");
  dispatchFloat(dtype, "sync batchnorm backward elementwise", [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(channels, {x, relu ? y : nullptr, dy, dx, dResidual}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const ChannelTiling t = channelTiling(channels, V);
      batchnorm_bwd_kernel<T, V><<<rowsGrid(t, rows), dim3(t.tx, t.ty), 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx),
          static_cast<T*>(dResidual), gamma, saveMean, saveInvStd, coef, rows, channels, relu, true);
      checkLaunch("batchnorm_bwd_kernel");
    });
  });
}

}  // namespace rc::cuda
