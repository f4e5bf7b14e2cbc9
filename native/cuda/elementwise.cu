// Element-wise kernels: relu and its gradient, add, dtype casts, fill, lerp, bias add and bias
// gradient, f32 gradient accumulation and the input conversion (u8 NHWC -> normalised float,
// optional flip).
// Flat kernels move 16-byte packs when every pointer is aligned and n is a multiple of the pack,
// else single elements; all are grid-stride loops.
#include <cstring>

#include "device_utils.cuh"
#include "kernels.h"

namespace rc::cuda {

namespace {

// ---- flat kernels ------------------------------------------------------------------------------

template <typename T, int V>
__global__ void relu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t packs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[V];
    loadPack<T, V>(x + p * V, v);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = reluValue(v[i]);
    storePack<T, V>(y + p * V, v);
  }
}

template <typename T, int V>
__global__ void relu_bwd_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t packs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float out[V], g[V];
    loadPack<T, V>(y + p * V, out);
    loadPack<T, V>(dy + p * V, g);
#pragma unroll
    for (int i = 0; i < V; ++i) g[i] = reluGrad(out[i], g[i]);
    storePack<T, V>(dx + p * V, g);
  }
}

template <typename T, int V>
__global__ void add_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t packs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float va[V], vb[V];
    loadPack<T, V>(a + p * V, va);
    loadPack<T, V>(b + p * V, vb);
#pragma unroll
    for (int i = 0; i < V; ++i) va[i] += vb[i];
    storePack<T, V>(out + p * V, va);
  }
}

// No restrict: out may be a or b (an in-place mask); each pack is read whole before it is written.
template <typename T, int V>
__global__ void mul_kernel(const T* a, const T* b, T* out, int64_t packs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float va[V], vb[V];
    loadPack<T, V>(a + p * V, va);
    loadPack<T, V>(b + p * V, vb);
#pragma unroll
    for (int i = 0; i < V; ++i) va[i] *= vb[i];
    storePack<T, V>(out + p * V, va);
  }
}

template <typename S, typename D, int V>
__global__ void cast_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t packs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[V];
    loadPack<S, V>(src + p * V, v);
    storePack<D, V>(dst + p * V, v);
  }
}

// Fills with a bit pattern of the element's width (U is an unsigned type of that width).
template <typename U, int V>
__global__ void fill_kernel(U* __restrict__ data, U value, int64_t packs) {
  Pack<U, V> pack;
#pragma unroll
  for (int i = 0; i < V; ++i) pack.v[i] = value;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    reinterpret_cast<Pack<U, V>*>(data)[p] = pack;
  }
}

// dst (f32) += src; V f32 = 16 bytes.
template <typename T, int V>
__global__ void accumulate_f32_kernel(const T* __restrict__ src, float* __restrict__ dst, int64_t packs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s[V], d[V];
    loadPack<T, V>(src + p * V, s);
    loadPack<float, V>(dst + p * V, d);
#pragma unroll
    for (int i = 0; i < V; ++i) d[i] += s[i];
    storePack<float, V>(dst + p * V, d);
  }
}

// a += weight * (b - a) as PyTorch computes it: from a below weight 0.5, from b above, so that
// weight 1 gives b exactly.
__global__ void lerp_kernel(float* __restrict__ a, const float* __restrict__ b, int64_t n, float weight) {
  const bool fromA = weight < 0.5f;
  const float complement = 1.0f - weight;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = a[i], y = b[i];
    a[i] = fromA ? x + weight * (y - x) : y - (y - x) * complement;
  }
}

// ---- rows x channels kernels (see ChannelTiling) -------------------------------------------------

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    add_bias_kernel(T* __restrict__ y, const float* __restrict__ bias, int64_t rows, int64_t channels) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c >= channels) return;
  float b[V];
  loadChannels<V>(bias, c, b);
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    float v[V];
    loadPack<T, V>(y + r * channels + c, v);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] += b[i];
    storePack<T, V>(y + r * channels + c, v);
  }
}

// Stage one of the bias gradient: partial[C][rowBlocks] = sums of each block of rows, added in a
// fixed tree so the result is the same every run (as batchnorm's statistics).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    bias_grad_partial_kernel(const T* __restrict__ dy, int64_t rows, int64_t channels, int64_t rowsPerBlock,
                             float* __restrict__ partial) {
  __shared__ float sSum[kThreads * V];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  const int64_t first = blockIdx.y * rowsPerBlock;
  const int64_t last = min(first + rowsPerBlock, rows);
  float sum[V];
#pragma unroll
  for (int i = 0; i < V; ++i) sum[i] = 0.0f;
  if (c < channels) {
    for (int64_t r = first + threadIdx.y; r < last; r += blockDim.y) {
      float v[V];
      loadPack<T, V>(dy + r * channels + c, v);
#pragma unroll
      for (int i = 0; i < V; ++i) sum[i] += v[i];
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) sSum[tid * V + i] = sum[i];
  __syncthreads();
  for (int half = blockDim.y / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.y) < half) {
      const int other = tid + half * blockDim.x;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        sum[i] += sSum[other * V + i];
        sSum[tid * V + i] = sum[i];
      }
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && c < channels) {
#pragma unroll
    for (int i = 0; i < V; ++i) partial[(c + i) * gridDim.y + blockIdx.y] = sum[i];
  }
}

// Stage two: one warp per channel adds its row blocks in order into dBias.
__global__ void bias_grad_finalize_kernel(const float* __restrict__ partial, int64_t rowBlocks, int64_t channels,
                                          float* __restrict__ dBias) {
  const int lane = threadIdx.x % 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (c >= channels) return;
  float sum = 0.0f;
  for (int64_t b = lane; b < rowBlocks; b += 32) sum += partial[c * rowBlocks + b];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if (lane == 0) dBias[c] += sum;
}

// ---- input conversion --------------------------------------------------------------------------

constexpr int kMaxInputChannels = 16;

// One block per image row (sample, y): reads the row mirrored when flip[sample] != 0.
template <typename T>
__global__ void convert_input_kernel(const uint8_t* __restrict__ src, T* __restrict__ dst,
                                     const uint8_t* __restrict__ flip, const float* __restrict__ meanStd, int64_t h,
                                     int w, int c) {
  __shared__ float sScale[kMaxInputChannels];
  __shared__ float sShift[kMaxInputChannels];
  // Same folding as the CPU backend: v * (1 / (255 std)) + (-mean / std).
  if (static_cast<int>(threadIdx.x) < c) {
    const float mean = meanStd[threadIdx.x], std = meanStd[c + threadIdx.x];
    sScale[threadIdx.x] = 1.0f / (255.0f * std);
    sShift[threadIdx.x] = -mean / std;
  }
  __syncthreads();
  const int64_t row = blockIdx.x;
  const bool mirrored = flip != nullptr && flip[row / h] != 0;
  const int rowElements = w * c;
  const uint8_t* srcRow = src + row * rowElements;
  T* dstRow = dst + row * rowElements;
  for (int j = threadIdx.x; j < rowElements; j += blockDim.x) {
    const int x = j / c, k = j - x * c;
    const int from = mirrored ? (w - 1 - x) * c + k : j;
    dstRow[j] = fromFloat<T>(static_cast<float>(srcRow[from]) * sScale[k] + sShift[k]);
  }
}

// ---- launch helpers ----------------------------------------------------------------------------

// Runs a flat kernel on 16-byte packs of T when n and all pointers allow, else element by element.
template <typename T, typename F>
void launchFlat(int64_t n, std::initializer_list<const void*> pointers, F&& launch) {
  bool packed = n % kPack<T> == 0;
  for (const void* p : pointers) packed = packed && isAligned(p, 16);
  dispatchPack<T>(packed, [&](auto pack) {
    constexpr int V = decltype(pack)::value;
    launch(pack, gridFor(n / V), n / V);
  });
}

template <typename U>
void fillBits(void* data, int64_t n, U value, cudaStream_t stream) {
  constexpr int kV = static_cast<int>(16 / sizeof(U));
  const bool packed = n % kV == 0 && isAligned(data, 16);
  if (packed) {
    fill_kernel<U, kV><<<gridFor(n / kV), kThreads, 0, stream>>>(static_cast<U*>(data), value, n / kV);
  } else {
    fill_kernel<U, 1><<<gridFor(n), kThreads, 0, stream>>>(static_cast<U*>(data), value, n);
  }
  checkLaunch("fill_kernel");
}

}  // namespace

void relu(DType dtype, const void* x, void* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  dispatchFloat(dtype, "relu", [&](auto tag) {
    using T = decltype(tag);
    launchFlat<T>(n, {x, y}, [&](auto pack, unsigned grid, int64_t packs) {
      relu_fwd_kernel<T, decltype(pack)::value>
          <<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), packs);
    });
    checkLaunch("relu_fwd_kernel");
  });
}

void reluBackward(DType dtype, const void* y, const void* dy, void* dx, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  dispatchFloat(dtype, "relu backward", [&](auto tag) {
    using T = decltype(tag);
    launchFlat<T>(n, {y, dy, dx}, [&](auto pack, unsigned grid, int64_t packs) {
      relu_bwd_kernel<T, decltype(pack)::value><<<grid, kThreads, 0, stream>>>(
          static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), packs);
    });
    checkLaunch("relu_bwd_kernel");
  });
}

void add(DType dtype, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  dispatchFloat(dtype, "add", [&](auto tag) {
    using T = decltype(tag);
    launchFlat<T>(n, {a, b, out}, [&](auto pack, unsigned grid, int64_t packs) {
      add_kernel<T, decltype(pack)::value><<<grid, kThreads, 0, stream>>>(
          static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), packs);
    });
    checkLaunch("add_kernel");
  });
}

void mul(DType dtype, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  dispatchFloat(dtype, "mul", [&](auto tag) {
    using T = decltype(tag);
    launchFlat<T>(n, {a, b, out}, [&](auto pack, unsigned grid, int64_t packs) {
      mul_kernel<T, decltype(pack)::value><<<grid, kThreads, 0, stream>>>(
          static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), packs);
    });
    checkLaunch("mul_kernel");
  });
}

void cast(DType srcType, const void* src, DType dstType, void* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (srcType == dstType) {
    const cudaError_t status =
        cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtypeSize(srcType), cudaMemcpyDeviceToDevice, stream);
    if (status != cudaSuccess) {
      RC_THROW(code::kCuda, "cast: cudaMemcpyAsync failed: " << cudaGetErrorName(status) << " ("
                                                             << cudaGetErrorString(status) << ")");
    }
    return;
  }
  dispatchFloat(srcType, "cast", [&](auto srcTag) {
    dispatchFloat(dstType, "cast", [&](auto dstTag) {
      using S = decltype(srcTag);
      using D = decltype(dstTag);
      // Packs of 4: 16 bytes of f32 on one side, 8 bytes of bf16/f16 on the other.
      constexpr int kV = 4;
      if (n % kV == 0 && isAligned(src, kV * sizeof(S)) && isAligned(dst, kV * sizeof(D))) {
        cast_kernel<S, D, kV>
            <<<gridFor(n / kV), kThreads, 0, stream>>>(static_cast<const S*>(src), static_cast<D*>(dst), n / kV);
      } else {
        cast_kernel<S, D, 1><<<gridFor(n), kThreads, 0, stream>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
      }
      checkLaunch("cast_kernel");
    });
  });
}

void fill(DType dtype, void* data, int64_t n, double value, cudaStream_t stream) {
  if (n <= 0) return;
  // Same conversions as the CPU backend; zero (the common case: gradients) is a memset.
  if (value == 0.0) {
    const cudaError_t status = cudaMemsetAsync(data, 0, static_cast<size_t>(n) * dtypeSize(dtype), stream);
    if (status != cudaSuccess) {
      RC_THROW(code::kCuda, "fill: cudaMemsetAsync failed: " << cudaGetErrorName(status) << " ("
                                                             << cudaGetErrorString(status) << ")");
    }
    return;
  }
  switch (dtype) {
    case DType::F32: {
      const float f = static_cast<float>(value);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      return fillBits<uint32_t>(data, n, bits, stream);
    }
    case DType::BF16: return fillBits<uint16_t>(data, n, floatToBf16(static_cast<float>(value)), stream);
    case DType::F16: return fillBits<uint16_t>(data, n, floatToHalf(static_cast<float>(value)), stream);
    case DType::I32: return fillBits<uint32_t>(data, n, static_cast<uint32_t>(static_cast<int32_t>(value)), stream);
    case DType::I64: return fillBits<uint64_t>(data, n, static_cast<uint64_t>(static_cast<int64_t>(value)), stream);
    case DType::U8: return fillBits<uint8_t>(data, n, static_cast<uint8_t>(static_cast<int>(value) & 0xff), stream);
  }
  RC_THROW(code::kInvalidArgument, "fill: unknown dtype " << static_cast<int>(dtype));
}

void lerp(float* a, const float* b, int64_t n, float weight, cudaStream_t stream) {
  if (n <= 0 || a == b) return;
  lerp_kernel<<<gridFor(n), kThreads, 0, stream>>>(a, b, n, weight);
  checkLaunch("lerp_kernel");
}

void addBias(DType dtype, void* y, const float* bias, int64_t rows, int64_t channels, cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  dispatchFloat(dtype, "add bias", [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(channels, {y}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const ChannelTiling t = channelTiling(channels, V);
      add_bias_kernel<T, V>
          <<<rowsGrid(t, rows), dim3(t.tx, t.ty), 0, stream>>>(static_cast<T*>(y), bias, rows, channels);
      checkLaunch("add_bias_kernel");
    });
  });
}

// partial: C * reductionRowBlocks(rows, C) floats, within batchNormScratchFloats(rows, C).
void accumulateBiasGrad(DType dtype, const void* dy, float* dBias, int64_t rows, int64_t channels, float* partial,
                        cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return;
  const int64_t rowsPerBlock = reductionRowsPerBlock(rows, channels);
  const int64_t rowBlocks = reductionRowBlocks(rows, channels);
  dispatchFloat(dtype, "bias gradient", [&](auto tag) {
    using T = decltype(tag);
    dispatchPack<T>(channelPackable<T>(channels, {dy}), [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const ChannelTiling t = channelTiling(channels, V);
      bias_grad_partial_kernel<T, V>
          <<<dim3(t.channelTiles, static_cast<unsigned>(rowBlocks)), dim3(t.tx, t.ty), 0, stream>>>(
              static_cast<const T*>(dy), rows, channels, rowsPerBlock, partial);
      checkLaunch("bias_grad_partial_kernel");
    });
  });
  bias_grad_finalize_kernel<<<static_cast<unsigned>(ceilDiv(channels, kThreads / 32)), kThreads, 0, stream>>>(
      partial, rowBlocks, channels, dBias);
  checkLaunch("bias_grad_finalize_kernel");
}

void accumulateF32(DType srcType, const void* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  dispatchFloat(srcType, "accumulate f32", [&](auto tag) {
    using T = decltype(tag);
    // Packs of 4: 16 bytes of the f32 destination.
    constexpr int kV = 4;
    if (n % kV == 0 && isAligned(src, kV * sizeof(T)) && isAligned(dst, 16)) {
      accumulate_f32_kernel<T, kV><<<gridFor(n / kV), kThreads, 0, stream>>>(static_cast<const T*>(src), dst, n / kV);
    } else {
      accumulate_f32_kernel<T, 1><<<gridFor(n), kThreads, 0, stream>>>(static_cast<const T*>(src), dst, n);
    }
    checkLaunch("accumulate_f32_kernel");
  });
}

void convertInput(const uint8_t* src, DType dstType, void* dst, const uint8_t* flip, const float* meanStd, int64_t n,
                  int64_t h, int64_t w, int64_t c, cudaStream_t stream) {
  if (n <= 0 || h <= 0 || w <= 0 || c <= 0) return;
  RC_CHECK_ARG(c <= kMaxInputChannels, "convert input: at most " << kMaxInputChannels << " channels, got " << c);
  RC_CHECK_ARG(w * c <= INT32_MAX && n * h <= INT32_MAX,
               "convert input: [" << n << ", " << h << ", " << w << ", " << c << "] is too large for one launch");
  dispatchFloat(dstType, "convert input", [&](auto tag) {
    using T = decltype(tag);
    // A 224x3 row is 672 elements: 256 threads cover it in three steps.
    convert_input_kernel<T><<<static_cast<unsigned>(n * h), kThreads, 0, stream>>>(
        src, static_cast<T*>(dst), flip, meanStd, h, static_cast<int>(w), static_cast<int>(c));
    checkLaunch("convert_input_kernel");
  });
}

}  // namespace rc::cuda
