// Batch normalisation over NHWC rows with fused residual add and ReLU. Statistics are two-stage
// reductions without float atomics, so every run gives the same bits: stage one has each block
// reduce a fixed range of rows for a tile of channels into `partial`; stage two has one warp per
// channel combine the row blocks in order. Means and variances use Welford per thread and Chan's
// merge across threads and blocks, which stays accurate at millions of rows and when |mean| >> std.
//
// The dual batch norm of a downsample block, y = relu(bn_a(a) + bn_b(b)), runs on the same kernels
// (a second input selected by blockIdx.z or blockIdx.y in the statistics kernels, a kDual template
// parameter in the element-wise ones): the statistics of both inputs in one launch, one pass that
// reads a and b and writes y; backward, both reductions from one read of the masked gradient and
// both input gradients in one pass.
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

// partial: mean[C][rowBlocks] then m2[C][rowBlocks] of each row block; with gridDim.z == 2 the
// blocks of z == 1 reduce x2 into the 2 * C * rowBlocks floats that follow (a dual batch norm).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    batchnorm_stats_kernel(const T* __restrict__ x, const T* __restrict__ x2, int64_t rows, int64_t channels,
                           int64_t rowsPerBlock, float* __restrict__ partial) {
  __shared__ float sN[kThreads];
  __shared__ float sMean[kThreads * V];
  __shared__ float sM2[kThreads * V];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  const int64_t first = blockIdx.y * rowsPerBlock;
  const int64_t last = min(first + rowsPerBlock, rows);
  if (blockIdx.z != 0) {
    x = x2;
    partial += 2 * channels * static_cast<int64_t>(gridDim.y);
  }

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

// Where one batch norm's training statistics go: saved for the backward, tracked in the running
// averages with its momentum; eps is its own.
struct StatsOut {
  float* runningMean;
  float* runningVar;
  float* saveMean;
  float* saveInvStd;
  float momentum;
  float eps;
};

// One warp per channel: merges the row blocks, then saves and tracks the statistics. With
// gridDim.y == 2 the blocks of y == 1 finalise the second input's partials into `second` (a dual
// batch norm); otherwise `second` is not read.
__global__ void batchnorm_stats_finalize_kernel(const float* __restrict__ partial, int64_t rowBlocks,
                                                int64_t rowsPerBlock, int64_t rows, int64_t channels, StatsOut first,
                                                StatsOut second) {
  const int lane = threadIdx.x % 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (c >= channels) return;  // whole warps leave together, so the shuffles below stay full
  const StatsOut& out = blockIdx.y == 0 ? first : second;
  float n = 0.0f, mean = 0.0f, m2 = 0.0f;
  mergeRowBlocks(partial + blockIdx.y * 2 * channels * rowBlocks, rowBlocks, rowsPerBlock, rows, channels, c, lane, n,
                 mean, m2);
  if (lane != 0) return;
  const float var = m2 / n;
  out.saveMean[c] = mean;
  out.saveInvStd[c] = 1.0f / sqrtf(var + out.eps);
  out.runningMean[c] = (1.0f - out.momentum) * out.runningMean[c] + out.momentum * mean;
  out.runningVar[c] = (1.0f - out.momentum) * out.runningVar[c] + out.momentum * (var * n / (n - 1.0f));
}

// ---- normalisation -----------------------------------------------------------------------------

// The per-channel vectors one batch norm normalises with: its affine parameters and statistics,
// the saved mean and inverse std (training) or the running mean and variance (inference).
struct NormChannels {
  const float* gamma;
  const float* beta;
  const float* mean;
  const float* spread;
  float eps;
};

// scale = gamma * invStd, shift = beta - mean * scale for the V channels at c; kFromVariance: the
// spread is a variance (inference), else an inverse std.
template <int V, bool kFromVariance>
__device__ __forceinline__ void scaleShift(const NormChannels& p, int64_t c, float (&scale)[V], float (&shift)[V]) {
  float mu[V], s[V];
  loadChannels<V>(p.gamma, c, scale);
  loadChannels<V>(p.beta, c, shift);
  loadChannels<V>(p.mean, c, mu);
  loadChannels<V>(p.spread, c, s);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    scale[i] *= kFromVariance ? 1.0f / sqrtf(s[i] + p.eps) : s[i];
    shift[i] -= mu[i] * scale[i];
  }
}

// y = relu?(x * scale + shift + residual?), scale = gamma * invStd, shift = beta - mean * scale.
// Training passes the saved inverse std; inference passes the running variance (kFromVariance).
// kDual: the residual is normalised too, with its own batch norm's channels (`res`): y =
// relu?(bn(x) + bn_res(residual)).
template <typename T, int V, bool kFromVariance, bool kDual>
__global__ void __launch_bounds__(kThreads)
    batchnorm_fwd_kernel(const T* __restrict__ x, const T* __restrict__ residual, T* __restrict__ y, NormChannels norm,
                         NormChannels res, int64_t rows, int64_t channels, bool relu) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c >= channels) return;
  float scale[V], shift[V], resScale[V], resShift[V];
  scaleShift<V, kFromVariance>(norm, c, scale, shift);
  if (kDual) scaleShift<V, kFromVariance>(res, c, resScale, resShift);
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const int64_t at = r * channels + c;
    float v[V];
    loadPack<T, V>(x + at, v);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = v[i] * scale[i] + shift[i];
    if (residual) {
      float rv[V];
      loadPack<T, V>(residual + at, rv);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] += kDual ? rv[i] * resScale[i] + resShift[i] : rv[i];
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

// The statistics a training forward saved (or a backward in evaluation mode's running ones).
struct SavedStats {
  const float* mean;
  const float* invStd;
};

// partial: sum(g)[C][rowBlocks] then sum(g * xhat)[C][rowBlocks] of each row block; kDual: then
// sum(g * xhat2)[C][rowBlocks], xhat2 being the second input x2 normalised with `saved2` (the two
// batch norms of a dual pass share g, so one read of dy and y serves both).
template <typename T, int V, bool kDual>
__global__ void __launch_bounds__(kThreads)
    batchnorm_bwd_stats_kernel(const T* __restrict__ x, const T* __restrict__ x2, const T* __restrict__ y,
                               const T* __restrict__ dy, SavedStats saved, SavedStats saved2, int64_t rows,
                               int64_t channels, int64_t rowsPerBlock, bool relu, float* __restrict__ partial) {
  constexpr int kSums = kDual ? 3 : 2;
  __shared__ float sSum[kSums * kThreads * V];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  const int64_t first = blockIdx.y * rowsPerBlock;
  const int64_t last = min(first + rowsPerBlock, rows);

  float sum[kSums][V];
#pragma unroll
  for (int s = 0; s < kSums; ++s)
#pragma unroll
    for (int i = 0; i < V; ++i) sum[s][i] = 0.0f;
  if (c < channels) {
    float mu[V], invStd[V], mu2[V] = {}, invStd2[V] = {};
    loadChannels<V>(saved.mean, c, mu);
    loadChannels<V>(saved.invStd, c, invStd);
    if (kDual) {
      loadChannels<V>(saved2.mean, c, mu2);
      loadChannels<V>(saved2.invStd, c, invStd2);
    }
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
        sum[0][i] += g[i];
        sum[1][i] += g[i] * (xv[i] - mu[i]) * invStd[i];
      }
      if (kDual) {
        loadPack<T, V>(x2 + at, xv);
#pragma unroll
        for (int i = 0; i < V; ++i) sum[kSums - 1][i] += g[i] * (xv[i] - mu2[i]) * invStd2[i];
      }
    }
  }

#pragma unroll
  for (int s = 0; s < kSums; ++s)
#pragma unroll
    for (int i = 0; i < V; ++i) sSum[(s * kThreads + tid) * V + i] = sum[s][i];
  __syncthreads();
  for (int half = blockDim.y / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.y) < half) {
      const int other = tid + half * blockDim.x;
#pragma unroll
      for (int s = 0; s < kSums; ++s)
#pragma unroll
        for (int i = 0; i < V; ++i) {
          sum[s][i] += sSum[(s * kThreads + other) * V + i];
          sSum[(s * kThreads + tid) * V + i] = sum[s][i];
        }
    }
    __syncthreads();
  }

  if (threadIdx.y == 0 && c < channels) {
    const int64_t rowBlocks = gridDim.y;
#pragma unroll
    for (int s = 0; s < kSums; ++s)
#pragma unroll
      for (int i = 0; i < V; ++i) partial[(s * channels + c + i) * rowBlocks + blockIdx.y] = sum[s][i];
  }
}

// One warp sums the row blocks of one channel's partials p[rowBlocks] in a fixed order; lane 0 ends
// with the total.
__device__ __forceinline__ float sumRowBlocks(const float* __restrict__ p, int64_t rowBlocks, int lane) {
  float sum = 0.0f;
  for (int64_t b = lane; b < rowBlocks; b += 32) sum += p[b];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  return sum;
}

// Where one batch norm's backward reductions go: dGamma/dBeta accumulated; its inverse std scales
// the dx coefficient.
struct GradOut {
  const float* saveInvStd;
  float* dGamma;
  float* dBeta;
};

// One warp per channel: sums the row blocks in order, accumulates dGamma/dBeta and leaves
// coef = [mean_rows(g)[C], invStd * mean_rows(g * xhat)[C]] for the dx kernel; kDual: the second
// batch norm's dGamma += sum(g * xhat2), dBeta += sum(g), and coef's third row invStd2 *
// mean_rows(g * xhat2).
template <bool kDual>
__global__ void batchnorm_bwd_finalize_kernel(const float* __restrict__ partial, int64_t rowBlocks, int64_t rows,
                                              int64_t channels, GradOut out, GradOut out2, float* __restrict__ coef) {
  const int lane = threadIdx.x % 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (c >= channels) return;
  const float sumG = sumRowBlocks(partial + c * rowBlocks, rowBlocks, lane);
  const float sumGX = sumRowBlocks(partial + (channels + c) * rowBlocks, rowBlocks, lane);
  const float sumGX2 = kDual ? sumRowBlocks(partial + (2 * channels + c) * rowBlocks, rowBlocks, lane) : 0.0f;
  if (lane != 0) return;
  out.dGamma[c] += sumGX;
  out.dBeta[c] += sumG;
  const float m = static_cast<float>(rows);
  coef[c] = sumG / m;
  coef[channels + c] = out.saveInvStd[c] * (sumGX / m);
  if (kDual) {
    out2.dGamma[c] += sumGX2;
    out2.dBeta[c] += sumG;
    coef[2 * channels + c] = out2.saveInvStd[c] * (sumGX2 / m);
  }
}

// The per-channel vectors of one batch norm's input gradient.
struct GradChannels {
  const float* gamma;
  const float* saveMean;
  const float* saveInvStd;
};

// dx = gamma * invStd * (g - mean(g) - xhat * mean(g * xhat)), written with (x - mean) rather than
// xhat so that four per-channel values stay in registers (four blocks per SM at 16-byte packs);
// without batch statistics (evaluation mode) dx = gamma * invStd * g; dResidual = g. kDual: also
// dx2 of the second batch norm (x2, `p2`, coef's third row) from the same g, and no dResidual.
template <typename T, int V, bool kDual>
__global__ void __launch_bounds__(kThreads, kDual ? 2 : 4)
    batchnorm_bwd_kernel(const T* __restrict__ x, const T* __restrict__ x2, const T* __restrict__ y,
                         const T* __restrict__ dy, T* __restrict__ dx, T* __restrict__ dx2, T* __restrict__ dResidual,
                         GradChannels p, GradChannels p2, const float* __restrict__ coef, int64_t rows,
                         int64_t channels, bool relu, bool batchStats) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c >= channels) return;
  float a[V], mu[V], meanG[V], k[V], a2[V] = {}, mu2[V] = {}, k2[V] = {};
  loadChannels<V>(p.gamma, c, a);
  loadChannels<V>(p.saveMean, c, mu);
  loadChannels<V>(coef, c, meanG);
  loadChannels<V>(coef + channels, c, k);
#pragma unroll
  for (int i = 0; i < V; ++i) a[i] *= __ldg(p.saveInvStd + c + i);
  if (kDual) {
    loadChannels<V>(p2.gamma, c, a2);
    loadChannels<V>(p2.saveMean, c, mu2);
    loadChannels<V>(coef + 2 * channels, c, k2);
#pragma unroll
    for (int i = 0; i < V; ++i) a2[i] *= __ldg(p2.saveInvStd + c + i);
  }
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
    if (!kDual && dResidual) storePack<T, V>(dResidual + at, g);
#pragma unroll
    for (int i = 0; i < V; ++i) xv[i] = batchStats ? a[i] * (g[i] - meanG[i] - (xv[i] - mu[i]) * k[i]) : a[i] * g[i];
    storePack<T, V>(dx + at, xv);
    if (kDual) {
      loadPack<T, V>(x2 + at, xv);
#pragma unroll
      for (int i = 0; i < V; ++i)
        xv[i] = batchStats ? a2[i] * (g[i] - meanG[i] - (xv[i] - mu2[i]) * k2[i]) : a2[i] * g[i];
      storePack<T, V>(dx2 + at, xv);
    }
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
  const float sumG = sumRowBlocks(partial + c * rowBlocks, rowBlocks, lane);
  const float sumGX = sumRowBlocks(partial + (channels + c) * rowBlocks, rowBlocks, lane);
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

// Grid of the finalize kernels: one warp per channel, `sides` batch norms along y.
dim3 finalizeGrid(int64_t channels, unsigned sides = 1) {
  return dim3(static_cast<unsigned>(ceilDiv(channels, kFinalizeWarps)), sides);
}

// Launches batchnorm_fwd_kernel alone, for statistics that already exist (running or merged ones);
// kDual: the residual is normalised with `res`.
template <bool kFromVariance, bool kDual = false>
void normalise(DType dtype, const char* what, const void* x, const void* residual, void* y, const NormChannels& norm,
               const NormChannels& res, int64_t rows, int64_t channels, bool relu, cudaStream_t stream) {
  dispatchFloat(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(channels, {x, residual, y}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const ChannelTiling t = channelTiling(channels, V);
      batchnorm_fwd_kernel<T, V, kFromVariance, kDual><<<rowsGrid(t, rows), dim3(t.tx, t.ty), 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(residual), static_cast<T*>(y), norm, res, rows, channels,
          relu);
      checkLaunch("batchnorm_fwd_kernel");
    });
  });
}

// Batch statistics of x (and x2, when non-null: a dual batch norm) into the saved and running
// statistics of `first` (and `second`).
void trainingStats(DType dtype, const char* what, const void* x, const void* x2, const StatsOut& first,
                   const StatsOut& second, int64_t rows, int64_t channels, float* partial, cudaStream_t stream) {
  const int64_t rowsPerBlock = reductionRowsPerBlock(rows, channels);
  const int64_t rowBlocks = reductionRowBlocks(rows, channels);
  const unsigned sides = x2 ? 2 : 1;
  dispatchFloat(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(channels, {x, x2}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const ChannelTiling t = channelTiling(channels, V);
      batchnorm_stats_kernel<T, V>
          <<<dim3(t.channelTiles, static_cast<unsigned>(rowBlocks), sides), dim3(t.tx, t.ty), 0, stream>>>(
              static_cast<const T*>(x), static_cast<const T*>(x2), rows, channels, rowsPerBlock, partial);
      checkLaunch("batchnorm_stats_kernel");
    });
  });
  batchnorm_stats_finalize_kernel<<<finalizeGrid(channels, sides), kThreads, 0, stream>>>(
      partial, rowBlocks, rowsPerBlock, rows, channels, first, second);
  checkLaunch("batchnorm_stats_finalize_kernel");
}

// The backward's reductions into `partial`: sum(g) and sum(g * xhat) (kDual: and sum(g * xhat2)).
template <bool kDual>
void backwardSums(DType dtype, const char* what, const void* x, const void* x2, const void* y, const void* dy,
                  const SavedStats& saved, const SavedStats& saved2, int64_t rows, int64_t channels, bool relu,
                  float* partial, cudaStream_t stream) {
  const int64_t rowsPerBlock = reductionRowsPerBlock(rows, channels);
  const int64_t rowBlocks = reductionRowBlocks(rows, channels);
  dispatchFloat(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(channels, {x, x2, relu ? y : nullptr, dy}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const ChannelTiling t = channelTiling(channels, V);
      batchnorm_bwd_stats_kernel<T, V, kDual>
          <<<dim3(t.channelTiles, static_cast<unsigned>(rowBlocks)), dim3(t.tx, t.ty), 0, stream>>>(
              static_cast<const T*>(x), static_cast<const T*>(x2), static_cast<const T*>(y), static_cast<const T*>(dy),
              saved, saved2, rows, channels, rowsPerBlock, relu, partial);
      checkLaunch("batchnorm_bwd_stats_kernel");
    });
  });
}

// The backward's element-wise pass: dx (and dResidual; kDual: dx2) from coef.
template <bool kDual>
void backwardInputs(DType dtype, const char* what, const void* x, const void* x2, const void* y, const void* dy,
                    void* dx, void* dx2, void* dResidual, const GradChannels& p, const GradChannels& p2,
                    const float* coef, int64_t rows, int64_t channels, bool relu, bool batchStats,
                    cudaStream_t stream) {
  dispatchFloat(dtype, what, [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(channels, {x, x2, relu ? y : nullptr, dy, dx, dx2, dResidual}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const ChannelTiling t = channelTiling(channels, V);
      batchnorm_bwd_kernel<T, V, kDual><<<rowsGrid(t, rows), dim3(t.tx, t.ty), 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(x2), static_cast<const T*>(y), static_cast<const T*>(dy),
          static_cast<T*>(dx), static_cast<T*>(dx2), static_cast<T*>(dResidual), p, p2, coef, rows, channels, relu,
          batchStats);
      checkLaunch("batchnorm_bwd_kernel");
    });
  });
}

// The running statistics as a backward in evaluation mode reads them (mean, 1/sqrt(var + eps)).
void saveRunning(const float* runningMean, const float* runningVar, float eps, int64_t channels, float* saveMean,
                 float* saveInvStd, cudaStream_t stream) {
  batchnorm_save_running_kernel<<<static_cast<unsigned>(ceilDiv(channels, kThreads)), kThreads, 0, stream>>>(
      runningMean, runningVar, eps, channels, saveMean, saveInvStd);
  checkLaunch("batchnorm_save_running_kernel");
}

}  // namespace

// partial[0, 2*C*rowBlocks): per-row-block partials; partial[2*C*rowBlocks, +2*C): backward's
// per-channel coefficients. At least min(rows, kCrossEntropyBlocks) floats, so that crossEntropy's
// per-block losses fit in batchNormScratchFloats(n, 1) too.
size_t batchNormScratchFloats(int64_t rows, int64_t channels) {
  const int64_t statFloats = 2 * channels * (reductionRowBlocks(rows, channels) + 1);
  return static_cast<size_t>(std::max<int64_t>(statFloats, std::min(rows, kCrossEntropyBlocks)));
}

// Forward: both inputs' partials (4*C*rowBlocks); backward: three sums' partials then three rows
// of coefficients (3*C*(rowBlocks + 1)).
size_t dualBatchNormScratchFloats(int64_t rows, int64_t channels) {
  return static_cast<size_t>(4 * channels * (reductionRowBlocks(rows, channels) + 1));
}

void batchNormForwardTraining(DType dtype, const void* x, const void* residual, void* y, const float* gamma,
                              const float* beta, float* runningMean, float* runningVar, float* saveMean,
                              float* saveInvStd, int64_t rows, int64_t channels, float momentum, float eps, bool relu,
                              float* partial, cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  const StatsOut out{runningMean, runningVar, saveMean, saveInvStd, momentum, eps};
  trainingStats(dtype, "batchnorm forward", x, nullptr, out, out, rows, channels, partial, stream);
  const NormChannels norm{gamma, beta, saveMean, saveInvStd, eps};
  normalise<false>(dtype, "batchnorm forward", x, residual, y, norm, norm, rows, channels, relu, stream);
}

void batchNormForwardInference(DType dtype, const void* x, const void* residual, void* y, const float* gamma,
                               const float* beta, const float* runningMean, const float* runningVar, float* saveMean,
                               float* saveInvStd, int64_t rows, int64_t channels, float eps, bool relu,
                               cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  if (saveMean && saveInvStd) saveRunning(runningMean, runningVar, eps, channels, saveMean, saveInvStd, stream);
  const NormChannels norm{gamma, beta, runningMean, runningVar, eps};
  normalise<true>(dtype, "batchnorm inference", x, residual, y, norm, norm, rows, channels, relu, stream);
}

void batchNormBackward(DType dtype, const void* x, const void* y, const void* dy, void* dx, void* dResidual,
                       const float* gamma, const float* saveMean, const float* saveInvStd, float* dGamma, float* dBeta,
                       int64_t rows, int64_t channels, bool relu, bool batchStats, float* partial,
                       cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  const int64_t rowBlocks = reductionRowBlocks(rows, channels);
  float* coef = partial + 2 * channels * rowBlocks;
  const SavedStats saved{saveMean, saveInvStd};
  backwardSums<false>(dtype, "batchnorm backward", x, nullptr, y, dy, saved, saved, rows, channels, relu, partial,
                      stream);
  const GradOut out{saveInvStd, dGamma, dBeta};
  batchnorm_bwd_finalize_kernel<false>
      <<<finalizeGrid(channels), kThreads, 0, stream>>>(partial, rowBlocks, rows, channels, out, out, coef);
  checkLaunch("batchnorm_bwd_finalize_kernel");
  const GradChannels p{gamma, saveMean, saveInvStd};
  backwardInputs<false>(dtype, "batchnorm backward", x, nullptr, y, dy, dx, nullptr, dResidual, p, p, coef, rows,
                        channels, relu, batchStats, stream);
}

void dualBatchNormForward(DType dtype, const DualBnForwardSide& a, const DualBnForwardSide& b, void* y, int64_t rows,
                          int64_t channels, bool training, bool relu, float* partial, cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  if (training) {
    trainingStats(dtype, "dual batchnorm forward", a.x, b.x,
                  StatsOut{a.runningMean, a.runningVar, a.saveMean, a.saveInvStd, a.momentum, a.eps},
                  StatsOut{b.runningMean, b.runningVar, b.saveMean, b.saveInvStd, b.momentum, b.eps}, rows, channels,
                  partial, stream);
    normalise<false, true>(
        dtype, "dual batchnorm forward", a.x, b.x, y, NormChannels{a.gamma, a.beta, a.saveMean, a.saveInvStd, a.eps},
        NormChannels{b.gamma, b.beta, b.saveMean, b.saveInvStd, b.eps}, rows, channels, relu, stream);
    return;
  }
  for (const DualBnForwardSide* s : {&a, &b}) {
    if (s->saveMean && s->saveInvStd)
      saveRunning(s->runningMean, s->runningVar, s->eps, channels, s->saveMean, s->saveInvStd, stream);
  }
  normalise<true, true>(
      dtype, "dual batchnorm inference", a.x, b.x, y, NormChannels{a.gamma, a.beta, a.runningMean, a.runningVar, a.eps},
      NormChannels{b.gamma, b.beta, b.runningMean, b.runningVar, b.eps}, rows, channels, relu, stream);
}

void dualBatchNormBackward(DType dtype, const DualBnBackwardSide& a, const DualBnBackwardSide& b, const void* y,
                           const void* dy, int64_t rows, int64_t channels, bool relu, bool batchStats, float* partial,
                           cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  const int64_t rowBlocks = reductionRowBlocks(rows, channels);
  float* coef = partial + 3 * channels * rowBlocks;
  backwardSums<true>(dtype, "dual batchnorm backward", a.x, b.x, y, dy, SavedStats{a.saveMean, a.saveInvStd},
                     SavedStats{b.saveMean, b.saveInvStd}, rows, channels, relu, partial, stream);
  batchnorm_bwd_finalize_kernel<true><<<finalizeGrid(channels), kThreads, 0, stream>>>(
      partial, rowBlocks, rows, channels, GradOut{a.saveInvStd, a.dGamma, a.dBeta},
      GradOut{b.saveInvStd, b.dGamma, b.dBeta}, coef);
  checkLaunch("batchnorm_bwd_finalize_kernel");
  backwardInputs<true>(dtype, "dual batchnorm backward", a.x, b.x, y, dy, a.dx, b.dx, nullptr,
                       GradChannels{a.gamma, a.saveMean, a.saveInvStd}, GradChannels{b.gamma, b.saveMean, b.saveInvStd},
                       coef, rows, channels, relu, batchStats, stream);
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
              static_cast<const T*>(x), nullptr, rows, channels, rowsPerBlock, partial);
      checkLaunch("batchnorm_stats_kernel");
    });
  });
  syncbn_stats_finalize_kernel<<<finalizeGrid(channels), kThreads, 0, stream>>>(partial, rowBlocks, rowsPerBlock, rows,
                                                                                channels, stats);
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
  const NormChannels norm{gamma, beta, saveMean, saveInvStd, eps};
  normalise<false>(dtype, "sync batchnorm forward", x, residual, y, norm, norm, rows, channels, relu, stream);
}

void syncBatchNormBackwardReduce(DType dtype, const void* x, const void* y, const void* dy, const float* saveMean,
                                 const float* saveInvStd, float* sums, float* dGamma, float* dBeta, int64_t rows,
                                 int64_t channels, bool relu, float* partial, cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  const int64_t rowBlocks = reductionRowBlocks(rows, channels);
  const SavedStats saved{saveMean, saveInvStd};
  backwardSums<false>(dtype, "sync batchnorm backward reduce", x, nullptr, y, dy, saved, saved, rows, channels, relu,
                      partial, stream);
  syncbn_bwd_reduce_finalize_kernel<<<finalizeGrid(channels), kThreads, 0, stream>>>(partial, rowBlocks, rows, channels,
                                                                                     sums, dGamma, dBeta);
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
  const GradChannels p{gamma, saveMean, saveInvStd};
  backwardInputs<false>(dtype, "sync batchnorm backward elementwise", x, nullptr, y, dy, dx, nullptr, dResidual, p, p,
                        coef, rows, channels, relu, true, stream);
}

}  // namespace rc::cuda
