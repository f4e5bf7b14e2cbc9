// The kernels of the conv-bn prologue's backward (see fused_dgrad.h).
#include "device_utils.cuh"
#include "fused_dgrad.h"

namespace rc::cuda {

namespace {

__global__ void shift_to_beta_kernel(const float* __restrict__ shift, const float* __restrict__ mean,
                                     const float* __restrict__ scale, float* __restrict__ beta, int64_t channels) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  beta[c] = shift[c] + mean[c] * scale[c];
}

__global__ void accumulate_bn_grads_kernel(const float* __restrict__ partial, float* __restrict__ dGamma,
                                           float* __restrict__ dBeta, int64_t channels) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  dGamma[c] += partial[c];
  dBeta[c] += partial[channels + c];
}

// One pack of V channels of one row per step of a grid-stride loop over rows (ChannelTiling).
// No __restrict__ on dz and dx: they may be one buffer, each element read before it is written
// by the same thread.
template <typename T, int V>
__global__ void bn_backward_apply_kernel(const T* dz, const T* __restrict__ x, const float* __restrict__ eqDz,
                                         const float* __restrict__ eqX, const float* __restrict__ eqBias, T* dx,
                                         int64_t rows, int64_t channels) {
  const int64_t c = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * V;
  if (c >= channels) return;
  float a[V], b[V], k[V];
  loadChannels<V>(eqDz, c, a);
  loadChannels<V>(eqX, c, b);
  loadChannels<V>(eqBias, c, k);
  for (int64_t row = blockIdx.y * static_cast<int64_t>(blockDim.y) + threadIdx.y; row < rows;
       row += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const int64_t at = row * channels + c;
    float g[V], v[V];
    loadPack<T, V>(dz + at, g);
    loadPack<T, V>(x + at, v);
#pragma unroll
    for (int i = 0; i < V; ++i) g[i] = a[i] * g[i] + b[i] * v[i] + k[i];
    storePack<T, V>(dx + at, g);
  }
}

}  // namespace

void shiftToBeta(const float* shift, const float* mean, const float* scale, float* beta, int64_t channels,
                 cudaStream_t stream) {
  shift_to_beta_kernel<<<gridFor(channels), kThreads, 0, stream>>>(shift, mean, scale, beta, channels);
  checkLaunch("shift_to_beta_kernel");
}

void accumulateBnGrads(const float* partial, float* dGamma, float* dBeta, int64_t channels, cudaStream_t stream) {
  accumulate_bn_grads_kernel<<<gridFor(channels), kThreads, 0, stream>>>(partial, dGamma, dBeta, channels);
  checkLaunch("accumulate_bn_grads_kernel");
}

void batchNormBackwardApply(DType dtype, const void* dz, const void* x, const float* eqDz, const float* eqX,
                            const float* eqBias, void* dx, int64_t rows, int64_t channels, cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  dispatchFloat(dtype, "batch norm backward apply", [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(channels, {dz, x, dx}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const ChannelTiling t = channelTiling(channels, V);
      bn_backward_apply_kernel<T, V><<<rowsGrid(t, rows), dim3(t.tx, t.ty), 0, stream>>>(
          static_cast<const T*>(dz), static_cast<const T*>(x), eqDz, eqX, eqBias, static_cast<T*>(dx), rows, channels);
      checkLaunch("bn_backward_apply_kernel");
    });
  });
}

}  // namespace rc::cuda
