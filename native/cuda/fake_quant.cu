// Quantization-aware training: fake quantization and its straight-through gradient, the symmetric
// abs-max scales of the weights and the moving-average min/max observer of the activations. Scales
// and observer state stay on the device: nothing here synchronises with the host.
#include <cfloat>

#include "device_utils.cuh"
#include "kernels.h"

namespace rc::cuda {

namespace {

// rintf rounds half to even, as PyTorch's nearbyint and ONNX's QuantizeLinear.
__device__ __forceinline__ float quantLevel(float v, float s) { return rintf(v / s); }

// `group` consecutive elements share scale[i / group] (group = n for one per-tensor scale).
template <typename T>
__global__ void fake_quant_fwd_kernel(const T* x, const float* __restrict__ scale, T* y, int64_t n, int64_t group,
                                      float lo, float hi) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float s = scale[i / group];
    y[i] = fromFloat<T>(fminf(fmaxf(quantLevel(toFloat(x[i]), s), lo), hi) * s);
  }
}

template <typename T>
__global__ void fake_quant_bwd_kernel(const T* x, const float* __restrict__ scale, const T* dy, T* dx, int64_t n,
                                      int64_t group, float lo, float hi) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float q = quantLevel(toFloat(x[i]), scale[i / group]);
    dx[i] = q >= lo && q <= hi ? dy[i] : fromFloat<T>(0.0f);
  }
}

// Tree reduction of the block's values in shared memory; thread 0 ends with the result.
template <typename Op>
__device__ float blockReduce(float* shared, float v, Op op) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + stride]);
    __syncthreads();
  }
  return shared[0];
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct MinOp {
  __device__ float operator()(float a, float b) const { return fminf(a, b); }
};

// One block per scale group: scale[g] = max(max |x| / qmax, eps).
template <typename T>
__global__ void abs_max_scale_kernel(const T* __restrict__ x, float* __restrict__ scale, int64_t group, float qmax) {
  __shared__ float shared[kThreads];
  const T* row = x + blockIdx.x * group;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x) m = fmaxf(m, fabsf(toFloat(row[i])));
  m = blockReduce(shared, m, MaxOp{});
  if (threadIdx.x == 0) scale[blockIdx.x] = fmaxf(m / qmax, FLT_EPSILON);
}

// Each block's min and max over its grid-stride share of x, to partial[2 * block] and partial[2 * block + 1].
template <typename T>
__global__ void observe_partial_kernel(const T* __restrict__ x, int64_t n, float* __restrict__ partial) {
  __shared__ float shared[kThreads];
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = toFloat(x[i]);
    lo = fminf(lo, v);
    hi = fmaxf(hi, v);
  }
  lo = blockReduce(shared, lo, MinOp{});
  __syncthreads();
  hi = blockReduce(shared, hi, MaxOp{});
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = lo;
    partial[2 * blockIdx.x + 1] = hi;
  }
}

// One block: the batch's min and max from the partials, the moving average, the scale.
__global__ void observe_update_kernel(const float* __restrict__ partial, int blocks, float* __restrict__ minMax,
                                      float* __restrict__ scale, float averagingConstant, float qmax) {
  __shared__ float shared[kThreads];
  float lo = INFINITY, hi = -INFINITY;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) {
    lo = fminf(lo, partial[2 * b]);
    hi = fmaxf(hi, partial[2 * b + 1]);
  }
  lo = blockReduce(shared, lo, MinOp{});
  __syncthreads();
  hi = blockReduce(shared, hi, MaxOp{});
  if (threadIdx.x == 0) {
    float runMin = minMax[0], runMax = minMax[1];
    if (isinf(runMin) && runMin > 0.0f && isinf(runMax) && runMax < 0.0f) {
      runMin = lo;
      runMax = hi;
    } else {
      runMin += averagingConstant * (lo - runMin);
      runMax += averagingConstant * (hi - runMax);
    }
    minMax[0] = runMin;
    minMax[1] = runMax;
    scale[0] = fmaxf(fmaxf(fmaxf(-runMin, runMax), 0.0f) / qmax, FLT_EPSILON);
  }
}

// Blocks of the observer's first pass: enough to fill the device, few enough for one block to combine.
constexpr int64_t kObserveBlocks = 1024;

}  // namespace

size_t observeScratchBytes() { return 2 * kObserveBlocks * sizeof(float); }

void fakeQuantize(DType dtype, const void* x, const float* scale, void* y, int64_t n, int64_t group, int64_t qmin,
                  int64_t qmax, cudaStream_t stream) {
  if (n <= 0) return;
  dispatchFloat(dtype, "fake quantize", [&](auto tag) {
    using T = decltype(tag);
    fake_quant_fwd_kernel<T><<<gridFor(n), kThreads, 0, stream>>>(static_cast<const T*>(x), scale, static_cast<T*>(y),
                                                                  n, group, static_cast<float>(qmin),
                                                                  static_cast<float>(qmax));
  });
  checkLaunch("fake_quant_fwd_kernel");
}

void fakeQuantizeBackward(DType dtype, const void* x, const float* scale, const void* dy, void* dx, int64_t n,
                          int64_t group, int64_t qmin, int64_t qmax, cudaStream_t stream) {
  if (n <= 0) return;
  dispatchFloat(dtype, "fake quantize backward", [&](auto tag) {
    using T = decltype(tag);
    fake_quant_bwd_kernel<T><<<gridFor(n), kThreads, 0, stream>>>(
        static_cast<const T*>(x), scale, static_cast<const T*>(dy), static_cast<T*>(dx), n, group,
        static_cast<float>(qmin), static_cast<float>(qmax));
  });
  checkLaunch("fake_quant_bwd_kernel");
}

void absMaxScale(DType dtype, const void* x, float* scale, int64_t groups, int64_t group, float qmax,
                 cudaStream_t stream) {
  if (groups <= 0) return;
  dispatchFloat(dtype, "abs max scale", [&](auto tag) {
    using T = decltype(tag);
    abs_max_scale_kernel<T>
        <<<static_cast<unsigned>(groups), kThreads, 0, stream>>>(static_cast<const T*>(x), scale, group, qmax);
  });
  checkLaunch("abs_max_scale_kernel");
}

void observeMinMax(DType dtype, const void* x, int64_t n, float* minMax, float* scale, float averagingConstant,
                   float qmax, float* scratch, cudaStream_t stream) {
  const int blocks = static_cast<int>(std::min<int64_t>(gridFor(n), kObserveBlocks));
  dispatchFloat(dtype, "observe min max", [&](auto tag) {
    using T = decltype(tag);
    observe_partial_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(x), n, scratch);
  });
  checkLaunch("observe_partial_kernel");
  observe_update_kernel<<<1, kThreads, 0, stream>>>(scratch, blocks, minMax, scale, averagingConstant, qmax);
  checkLaunch("observe_update_kernel");
}

}  // namespace rc::cuda
