// Shared by the .cu kernels: f32/bf16/f16 load/store (compute is always f32), 16-byte packs,
// dtype dispatch, launch checks and grid sizing, including the row partition of the per-channel
// reductions, which batchNormScratchFloats sizes and which fixes their summation order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "../core/dtype.h"
#include "../core/error.h"

namespace rc::cuda {

// ---- element conversions (the intrinsics round to nearest even) ------------------------------

__device__ __forceinline__ float toFloat(float v) { return v; }
__device__ __forceinline__ float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float toFloat(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T fromFloat(float v);
template <>
__device__ __forceinline__ float fromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half fromFloat<__half>(float v) {
  return __float2half_rn(v);
}

// ---- ReLU with PyTorch's NaN semantics ------------------------------------------------------

// max(v, 0) that keeps NaN (torch.relu(nan) is nan): written so that a NaN fails the comparison.
__device__ __forceinline__ float reluValue(float v) { return v < 0.0f ? 0.0f : v; }

// The ReLU's gradient from its output, as torch's threshold_backward: zero where out <= 0, the
// incoming gradient elsewhere, a NaN output included.
__device__ __forceinline__ float reluGrad(float out, float g) { return out <= 0.0f ? 0.0f : g; }

// ---- packs: V consecutive elements moved with one load or store (16 bytes at the widest) ------

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Elements of T in a 16-byte pack.
template <typename T>
constexpr int kPack = static_cast<int>(16 / sizeof(T));

template <typename T, int V>
__device__ __forceinline__ void loadPack(const T* p, float (&out)[V]) {
  const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = toFloat(pack.v[i]);
}

template <typename T, int V>
__device__ __forceinline__ void storePack(T* p, const float (&in)[V]) {
  Pack<T, V> pack;
#pragma unroll
  for (int i = 0; i < V; ++i) pack.v[i] = fromFloat<T>(in[i]);
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
}

// Per-channel f32 parameters (gamma, bias, statistics) for the V channels at c.
template <int V>
__device__ __forceinline__ void loadChannels(const float* p, int64_t c, float (&out)[V]) {
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = __ldg(p + c + i);
}

// ---- host helpers ----------------------------------------------------------------------------

__host__ __device__ constexpr int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline bool isAligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Calls f(T{}) with T the device element type of a floating dtype.
template <typename F>
void dispatchFloat(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(__nv_bfloat16{}); return;
    case DType::F16: f(__half{}); return;
    default: RC_THROW(code::kInvalidArgument, op << ": expected f32, bf16 or f16, got " << dtypeName(dtype));
  }
}

// Calls f(std::integral_constant<int, V>{}) with V = kPack<T> when `packed`, else 1, so kernels are
// instantiated for the 16-byte path and the scalar fallback only.
template <typename T, typename F>
void dispatchPack(bool packed, F&& f) {
  if (packed) {
    f(std::integral_constant<int, kPack<T>>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

// Throws for a failed launch (bad configuration, or an earlier asynchronous error surfacing here).
inline void checkLaunch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    RC_THROW(code::kCuda, "CUDA kernel " << kernel << " failed: " << cudaGetErrorName(status) << " ("
                                         << cudaGetErrorString(status) << ")");
  }
}

// Blocks for a grid-stride loop over `work` items: enough to fill an H100 a few times over, and
// few enough that each thread amortises its setup.
constexpr int kThreads = 256;
constexpr int64_t kMaxGridStrideBlocks = 4096;
inline unsigned gridFor(int64_t work, int threads = kThreads) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceilDiv(work, threads), 1, kMaxGridStrideBlocks));
}

// Rows x channels kernels (NHWC, C contiguous): a block is tx x ty threads, tx walking packs of
// V channels (so a warp reads whole rows when C is small), ty walking rows; gridDim.x tiles the
// channels.
struct ChannelTiling {
  int tx, ty;
  unsigned channelTiles;
};

inline ChannelTiling channelTiling(int64_t channels, int vec) {
  const int64_t packs = ceilDiv(channels, vec);
  int tx = 1;
  while (tx < packs && tx < 32) tx *= 2;
  return {tx, kThreads / tx, static_cast<unsigned>(ceilDiv(packs, tx))};
}

// Grid of the element-wise rows x channels kernels: the channel tiles times enough row blocks for
// a grid-stride loop over the rows.
inline dim3 rowsGrid(const ChannelTiling& t, int64_t rows) {
  const int64_t maxRowBlocks = std::max<int64_t>(1, kMaxGridStrideBlocks / t.channelTiles);
  return dim3(t.channelTiles, static_cast<unsigned>(std::clamp<int64_t>(ceilDiv(rows, t.ty), 1, maxRowBlocks)));
}

// The 16-byte path of a rows x channels kernel needs C to be a multiple of the pack and every
// (non-null) pointer 16-byte aligned, so that every row starts aligned.
template <typename T>
bool channelPackable(int64_t channels, std::initializer_list<const void*> pointers) {
  bool packed = channels % kPack<T> == 0;
  for (const void* p : pointers) packed = packed && (p == nullptr || isAligned(p, 16));
  return packed;
}

// Row partition of the two-stage per-channel reductions (batchnorm statistics and gradients, bias
// gradients): stage one reduces blocks of rowsPerBlock rows into partials, stage two combines the
// partials of each channel in block order. It depends on (rows, channels) only, so the scratch
// size is known to the caller and the result bits do not depend on the device. Up to ~2048 blocks
// per channel tile of 256 keeps every SM busy at 3M rows while partials stay small.
constexpr int64_t kReduceBlocks = 2048;
constexpr int64_t kReduceMinRows = 32;
inline int64_t reductionRowsPerBlock(int64_t rows, int64_t channels) {
  const int64_t maxBlocks = std::max<int64_t>(1, kReduceBlocks / ceilDiv(channels, 256));
  const int64_t blocks = std::max<int64_t>(1, std::min(ceilDiv(rows, kReduceMinRows), maxBlocks));
  return std::max<int64_t>(1, ceilDiv(rows, blocks));
}
inline int64_t reductionRowBlocks(int64_t rows, int64_t channels) {
  return ceilDiv(rows, reductionRowsPerBlock(rows, channels));
}

// crossEntropy's grid (blocks stride over rows); each block leaves one partial loss, so its scratch
// is min(n, kCrossEntropyBlocks) floats, which batchNormScratchFloats(n, 1) always covers.
constexpr int64_t kCrossEntropyBlocks = 1024;

}  // namespace rc::cuda
