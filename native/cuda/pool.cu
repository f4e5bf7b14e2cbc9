// NHWC max and average pooling in floor mode (PyTorch semantics: max pooling ignores padding and
// propagates NaN; average pooling divides by kh*kw, padding included). Each thread owns a pack of
// V channels of one output (or, for average backward, input) pixel, so loads are contiguous.
#include "device_utils.cuh"
#include "kernels.h"

namespace rc::cuda {

namespace {

// Window geometry, passed by value to the kernels.
struct PoolGeometry {
  int64_t n, h, w, c, oh, ow;
  int kh, kw, sh, sw, ph, pw;
};

// Splits a flat pack index over [n, oh, ow, c / V] into its pixel and first channel.
template <int V>
__device__ __forceinline__ void splitPixel(int64_t p, int64_t rowsW, int64_t cols, int64_t channels, int64_t& sample,
                                           int64_t& row, int64_t& col, int64_t& channel) {
  const int64_t packs = channels / V;
  channel = (p % packs) * V;
  p /= packs;
  col = p % cols;
  p /= cols;
  row = p % rowsW;
  sample = p / rowsW;
}

template <typename T, int V>
__global__ void maxpool_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int32_t* __restrict__ argmax,
                                   PoolGeometry g, int64_t packs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t s, oy, ox, c;
    splitPixel<V>(p, g.oh, g.ow, g.c, s, oy, ox, c);
    const int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
    const int64_t yBegin = max(y0, int64_t{0}), yEnd = min(y0 + g.kh, g.h);
    const int64_t xBegin = max(x0, int64_t{0}), xEnd = min(x0 + g.kw, g.w);
    // Starting from the first in-bounds element keeps argmax valid for windows of -inf (PyTorch does too).
    float best[V];
    int32_t at[V];
#pragma unroll
    for (int i = 0; i < V; ++i) {
      best[i] = -INFINITY;
      at[i] = static_cast<int32_t>(yBegin * g.w + xBegin);
    }
    const T* plane = x + s * g.h * g.w * g.c + c;
    for (int64_t iy = yBegin; iy < yEnd; ++iy) {
      for (int64_t ix = xBegin; ix < xEnd; ++ix) {
        float v[V];
        loadPack<T, V>(plane + (iy * g.w + ix) * g.c, v);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          if (v[i] > best[i] || isnan(v[i])) {
            best[i] = v[i];
            at[i] = static_cast<int32_t>(iy * g.w + ix);
          }
        }
      }
    }
    storePack<T, V>(y + p * V, best);
    if (argmax) {
#pragma unroll
      for (int i = 0; i < V; ++i) argmax[p * V + i] = at[i];
    }
  }
}

// The outputs whose windows cover input row (or column) i: [begin, end). Output o covers i when
// o*stride - pad <= i < o*stride - pad + kernel.
__device__ __forceinline__ void coveringOutputs(int64_t i, int kernel, int stride, int pad, int64_t outputs,
                                                int64_t& begin, int64_t& end) {
  const int64_t low = i + pad - kernel + 1;
  begin = low <= 0 ? 0 : (low + stride - 1) / stride;
  end = min((i + pad) / stride + 1, outputs);
}

// Gather: each input element sums, in f32, the dy of the covering outputs whose argmax is this
// element, in output order, and is written once (deterministic; no zeroing, no atomics).
template <typename T, int V>
__global__ void maxpool_bwd_kernel(const T* __restrict__ dy, T* __restrict__ dx, const int32_t* __restrict__ argmax,
                                   PoolGeometry g, int64_t packs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t s, iy, ix, c;
    splitPixel<V>(p, g.h, g.w, g.c, s, iy, ix, c);
    int64_t oyBegin, oyEnd, oxBegin, oxEnd;
    coveringOutputs(iy, g.kh, g.sh, g.ph, g.oh, oyBegin, oyEnd);
    coveringOutputs(ix, g.kw, g.sw, g.pw, g.ow, oxBegin, oxEnd);
    const int32_t self = static_cast<int32_t>(iy * g.w + ix);
    float sum[V];
#pragma unroll
    for (int i = 0; i < V; ++i) sum[i] = 0.0f;
    const int64_t sampleOffset = s * g.oh * g.ow * g.c + c;
    for (int64_t oy = oyBegin; oy < oyEnd; ++oy) {
      for (int64_t ox = oxBegin; ox < oxEnd; ++ox) {
        const int64_t at = sampleOffset + (oy * g.ow + ox) * g.c;
        float v[V];
        loadPack<T, V>(dy + at, v);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          if (argmax[at + i] == self) sum[i] += v[i];
        }
      }
    }
    storePack<T, V>(dx + p * V, sum);
  }
}

template <typename T, int V>
__global__ void avgpool_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, PoolGeometry g, int64_t packs) {
  const float inv = 1.0f / static_cast<float>(g.kh * g.kw);
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t s, oy, ox, c;
    splitPixel<V>(p, g.oh, g.ow, g.c, s, oy, ox, c);
    const int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
    const int64_t yBegin = max(y0, int64_t{0}), yEnd = min(y0 + g.kh, g.h);
    const int64_t xBegin = max(x0, int64_t{0}), xEnd = min(x0 + g.kw, g.w);
    float sum[V];
#pragma unroll
    for (int i = 0; i < V; ++i) sum[i] = 0.0f;
    const T* plane = x + s * g.h * g.w * g.c + c;
    for (int64_t iy = yBegin; iy < yEnd; ++iy) {
      for (int64_t ix = xBegin; ix < xEnd; ++ix) {
        float v[V];
        loadPack<T, V>(plane + (iy * g.w + ix) * g.c, v);
#pragma unroll
        for (int i = 0; i < V; ++i) sum[i] += v[i];
      }
    }
#pragma unroll
    for (int i = 0; i < V; ++i) sum[i] *= inv;
    storePack<T, V>(y + p * V, sum);
  }
}

// Gather: each input pixel sums dy over the outputs whose windows cover it (no atomics; every dx
// element is written once).
template <typename T, int V>
__global__ void avgpool_bwd_kernel(const T* __restrict__ dy, T* __restrict__ dx, PoolGeometry g, int64_t packs) {
  const float inv = 1.0f / static_cast<float>(g.kh * g.kw);
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t s, iy, ix, c;
    splitPixel<V>(p, g.h, g.w, g.c, s, iy, ix, c);
    int64_t oyBegin, oyEnd, oxBegin, oxEnd;
    coveringOutputs(iy, g.kh, g.sh, g.ph, g.oh, oyBegin, oyEnd);
    coveringOutputs(ix, g.kw, g.sw, g.pw, g.ow, oxBegin, oxEnd);
    float sum[V];
#pragma unroll
    for (int i = 0; i < V; ++i) sum[i] = 0.0f;
    const T* plane = dy + s * g.oh * g.ow * g.c + c;
    for (int64_t oy = oyBegin; oy < oyEnd; ++oy) {
      for (int64_t ox = oxBegin; ox < oxEnd; ++ox) {
        float v[V];
        loadPack<T, V>(plane + (oy * g.ow + ox) * g.c, v);
#pragma unroll
        for (int i = 0; i < V; ++i) sum[i] += v[i];
      }
    }
#pragma unroll
    for (int i = 0; i < V; ++i) sum[i] *= inv;
    storePack<T, V>(dx + p * V, sum);
  }
}

PoolGeometry geometry(int64_t n, int64_t h, int64_t w, int64_t c, int64_t oh, int64_t ow, int kh, int kw, int sh,
                      int sw, int ph, int pw) {
  RC_CHECK_ARG(kh > 0 && kw > 0 && sh > 0 && sw > 0 && ph >= 0 && pw >= 0 && 2 * ph <= kh && 2 * pw <= kw,
               "pool2d: kernel " << kh << "x" << kw << ", stride " << sh << "x" << sw << ", padding " << ph << "x" << pw
                                 << " (padding must be at most half the kernel)");
  RC_CHECK_ARG(oh == (h + 2 * ph - kh) / sh + 1 && ow == (w + 2 * pw - kw) / sw + 1,
               "pool2d: output " << oh << "x" << ow << " does not match input " << h << "x" << w << " in floor mode");
  return {n, h, w, c, oh, ow, kh, kw, sh, sw, ph, pw};
}

}  // namespace

void maxPoolForward(DType dtype, const void* x, void* y, int32_t* argmax, int64_t n, int64_t h, int64_t w, int64_t c,
                    int64_t oh, int64_t ow, int kh, int kw, int sh, int sw, int ph, int pw, cudaStream_t stream) {
  const PoolGeometry g = geometry(n, h, w, c, oh, ow, kh, kw, sh, sw, ph, pw);
  if (n <= 0 || c <= 0 || oh <= 0 || ow <= 0) return;
  dispatchFloat(dtype, "max pool forward", [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(c, {x, y}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const int64_t packs = n * oh * ow * (c / V);
      maxpool_fwd_kernel<T, V>
          <<<gridFor(packs), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), argmax, g, packs);
      checkLaunch("maxpool_fwd_kernel");
    });
  });
}

void maxPoolBackward(DType dtype, const void* dy, void* dx, const int32_t* argmax, int64_t n, int64_t h, int64_t w,
                     int64_t c, int64_t oh, int64_t ow, int kh, int kw, int sh, int sw, int ph, int pw,
                     cudaStream_t stream) {
  const PoolGeometry g = geometry(n, h, w, c, oh, ow, kh, kw, sh, sw, ph, pw);
  if (n <= 0 || h <= 0 || w <= 0 || c <= 0) return;
  dispatchFloat(dtype, "max pool backward", [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(c, {dy, dx}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const int64_t packs = n * h * w * (c / V);
      maxpool_bwd_kernel<T, V>
          <<<gridFor(packs), kThreads, 0, stream>>>(static_cast<const T*>(dy), static_cast<T*>(dx), argmax, g, packs);
      checkLaunch("maxpool_bwd_kernel");
    });
  });
}

void avgPoolForward(DType dtype, const void* x, void* y, int64_t n, int64_t h, int64_t w, int64_t c, int64_t oh,
                    int64_t ow, int kh, int kw, int sh, int sw, int ph, int pw, cudaStream_t stream) {
  const PoolGeometry g = geometry(n, h, w, c, oh, ow, kh, kw, sh, sw, ph, pw);
  if (n <= 0 || c <= 0 || oh <= 0 || ow <= 0) return;
  dispatchFloat(dtype, "avg pool forward", [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(c, {x, y}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const int64_t packs = n * oh * ow * (c / V);
      avgpool_fwd_kernel<T, V>
          <<<gridFor(packs), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), g, packs);
      checkLaunch("avgpool_fwd_kernel");
    });
  });
}

void avgPoolBackward(DType dtype, const void* dy, void* dx, int64_t n, int64_t h, int64_t w, int64_t c, int64_t oh,
                     int64_t ow, int kh, int kw, int sh, int sw, int ph, int pw, cudaStream_t stream) {
  const PoolGeometry g = geometry(n, h, w, c, oh, ow, kh, kw, sh, sw, ph, pw);
  if (n <= 0 || h <= 0 || w <= 0 || c <= 0) return;
  dispatchFloat(dtype, "avg pool backward", [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(c, {dy, dx}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const int64_t packs = n * h * w * (c / V);
      avgpool_bwd_kernel<T, V>
          <<<gridFor(packs), kThreads, 0, stream>>>(static_cast<const T*>(dy), static_cast<T*>(dx), g, packs);
      checkLaunch("avgpool_bwd_kernel");
    });
  });
}

}  // namespace rc::cuda
