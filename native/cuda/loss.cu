// Softmax cross-entropy with label smoothing, and knowledge distillation's loss: one block per
// row (blocks stride over the rows when there are more than kCrossEntropyBlocks), an online
// max/sum-exp pass, then the gradient pass. The batch mean is deterministic: each block adds its
// rows' losses in row order into one partial, and a single block adds the partials in a fixed tree.
#include "device_utils.cuh"
#include "kernels.h"

namespace rc::cuda {

namespace {

// Running log-sum-exp state: m = max seen, s = sum exp(z - m). The sum is kept in double: with a
// confident prediction it is 1 + a small remainder, and in f32 that remainder (the whole loss) would
// keep only a few digits.
struct SoftmaxState {
  float m;
  double s;
};

__device__ __forceinline__ SoftmaxState mergeSoftmax(SoftmaxState a, SoftmaxState b) {
  // Empty states (threads that saw no element) must not turn -inf - -inf into NaN.
  if (b.m == -INFINITY) return a;
  if (a.m == -INFINITY) return b;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * static_cast<double>(expf(a.m - m)) + b.s * static_cast<double>(expf(b.m - m))};
}

// log(sum exp(z)) of a reduced state.
__device__ __forceinline__ float logSumExp(SoftmaxState v) { return v.m + static_cast<float>(log(v.s)); }

// log(sum exp(z)) - z0, without rounding log(sum exp(z)) to the scale of the maximum first: when z0
// is the maximum (a correct prediction) the difference is log(s) alone, tiny and exact to f32.
__device__ __forceinline__ float logSumExpMinus(SoftmaxState v, float z0) {
  return (v.m - z0) + static_cast<float>(log(v.s));
}

__device__ __forceinline__ SoftmaxState shuffleDown(SoftmaxState v, int offset) {
  return {__shfl_down_sync(0xffffffffu, v.m, offset), __shfl_down_sync(0xffffffffu, v.s, offset)};
}

constexpr int kMaxWarps = kThreads / 32;

// Block-wide reduction of (softmax state, sum of logits) in a fixed order; the result is returned
// to every thread. Ends with a barrier, so the shared arrays can be reused right away.
__device__ void blockReduce(SoftmaxState& state, float& sum, SoftmaxState* sState, float* sSum) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) {
    state = mergeSoftmax(state, shuffleDown(state, offset));
    sum += __shfl_down_sync(0xffffffffu, sum, offset);
  }
  if (lane == 0) {
    sState[warp] = state;
    sSum[warp] = sum;
  }
  __syncthreads();
  if (warp == 0) {
    state = lane < warps ? sState[lane] : SoftmaxState{-INFINITY, 0.0};
    sum = lane < warps ? sSum[lane] : 0.0f;
    for (int offset = kMaxWarps / 2; offset > 0; offset /= 2) {
      state = mergeSoftmax(state, shuffleDown(state, offset));
      sum += __shfl_down_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) {
      sState[kMaxWarps] = state;
      sSum[kMaxWarps] = sum;
    }
  }
  __syncthreads();
  state = sState[kMaxWarps];
  sum = sSum[kMaxWarps];
  __syncthreads();
}

// loss_i = logsumexp(z) - (1 - s) z[label] - s/k sum(z);
// dz_j = gradScale / n * (softmax_j - (1 - s) [j == label] - s/k).
// An invalid label flags *invalidLabel, adds 0 to the loss and leaves a zero gradient row.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(const T* __restrict__ logits, const int32_t* __restrict__ labels, T* __restrict__ dLogits,
                         int64_t n, int64_t k, float smoothing, float gradScale,
                         const float* __restrict__ gradScaleFrom, int32_t* __restrict__ invalidLabel,
                         float* __restrict__ partial) {
  __shared__ SoftmaxState sState[kMaxWarps + 1];
  __shared__ float sSum[kMaxWarps + 1];
  const float scale = (gradScaleFrom ? *gradScaleFrom : gradScale) / static_cast<float>(n);
  const float offLabel = smoothing / static_cast<float>(k);
  float blockLoss = 0.0f;  // meaningful in thread 0 only
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const T* z = logits + row * k;
    const int32_t label = labels[row];
    const bool valid = label >= 0 && label < k;
    if (!valid) {
      if (threadIdx.x == 0 && invalidLabel) *invalidLabel = 1;
      if (dLogits) {
        for (int64_t j = threadIdx.x; j < k; j += blockDim.x) dLogits[row * k + j] = fromFloat<T>(0.0f);
      }
      continue;
    }
    SoftmaxState state{-INFINITY, 0.0};
    float sumZ = 0.0f;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
      const float v = toFloat(z[j]);
      // exp(v - v): 1, or NaN for an infinite logit, so +inf gives a NaN loss as in PyTorch, where
      // the shift by the row's maximum turns inf - inf into NaN (-inf elements still add nothing).
      state = mergeSoftmax(state, SoftmaxState{v, isfinite(v) ? 1.0 : static_cast<double>(NAN)});
      sumZ += v;
    }
    blockReduce(state, sumZ, sState, sSum);
    const float lse = logSumExp(state);
    if (threadIdx.x == 0) {
      // sum_j q_j (logSumExp - z_j), leaving out the terms whose weight is 0: a logit of -inf away
      // from the label then gives a finite loss without smoothing (not 0 * inf = NaN), as in PyTorch.
      const float hard = smoothing < 1.0f ? (1.0f - smoothing) * logSumExpMinus(state, toFloat(z[label])) : 0.0f;
      const float smooth = smoothing > 0.0f ? smoothing * lse - offLabel * sumZ : 0.0f;
      blockLoss += hard + smooth;
    }
    if (dLogits) {
      T* g = dLogits + row * k;
      for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
        const float q = (j == label ? 1.0f - smoothing : 0.0f) + offLabel;
        g[j] = fromFloat<T>((expf(toFloat(z[j]) - lse) - q) * scale);
      }
    }
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = blockLoss;
}

// One block: *loss = sum(partial) / n, strided per thread then a fixed tree.
__global__ void __launch_bounds__(kThreads)
    cross_entropy_mean_kernel(const float* __restrict__ partial, int64_t count, int64_t n, float* __restrict__ loss) {
  __shared__ float sSum[kThreads];
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += partial[i];
  sSum[threadIdx.x] = sum;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) sSum[threadIdx.x] += sSum[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = sSum[0] / static_cast<float>(n);
}

// The running (max, sum exp) state of one element, NaN for an infinite one as in cross_entropy_kernel.
__device__ __forceinline__ SoftmaxState elementState(float v) {
  return SoftmaxState{v, isfinite(v) ? 1.0 : static_cast<double>(NAN)};
}

// Knowledge distillation, per row: loss_i = alpha T^2 KL(pt || ps) + (1 - alpha) CE_i with
// ps = softmax(s/T), pt = softmax(t/T); dz = gradScale / n * (alpha T (ps - pt) + (1 - alpha) (softmax(s) - q)).
// One pass for the three log-sum-exps and the sum of the logits, a second for the KL sum and the
// gradient. Labels are handled as in cross_entropy_kernel.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    distillation_kernel(const T* __restrict__ logits, const T* __restrict__ teacher, const int32_t* __restrict__ labels,
                        T* __restrict__ dLogits, int64_t n, int64_t k, DistillationParams p,
                        int32_t* __restrict__ invalidLabel, float* __restrict__ partial) {
  __shared__ SoftmaxState sState[kMaxWarps + 1];
  __shared__ float sSum[kMaxWarps + 1];
  const float scale = p.gradScale / static_cast<float>(n);
  const float offLabel = p.labelSmoothing / static_cast<float>(k);
  const float inv = 1.0f / p.temperature;
  const float kdWeight = p.alpha > 0.0f ? p.alpha * p.temperature * p.temperature : 0.0f;
  const float ceWeight = 1.0f - p.alpha;
  float blockLoss = 0.0f;  // meaningful in thread 0 only
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const T* s = logits + row * k;
    const T* t = teacher + row * k;
    const int32_t label = labels[row];
    if (!(label >= 0 && label < k)) {
      if (threadIdx.x == 0 && invalidLabel) *invalidLabel = 1;
      if (dLogits) {
        for (int64_t j = threadIdx.x; j < k; j += blockDim.x) dLogits[row * k + j] = fromFloat<T>(0.0f);
      }
      continue;
    }
    SoftmaxState plain{-INFINITY, 0.0}, soft{-INFINITY, 0.0}, soft_t{-INFINITY, 0.0};
    float sumZ = 0.0f, unused = 0.0f;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
      const float v = toFloat(s[j]);
      plain = mergeSoftmax(plain, elementState(v));
      soft = mergeSoftmax(soft, elementState(v * inv));
      soft_t = mergeSoftmax(soft_t, elementState(toFloat(t[j]) * inv));
      sumZ += v;
    }
    blockReduce(plain, sumZ, sState, sSum);
    blockReduce(soft, unused, sState, sSum);
    blockReduce(soft_t, unused, sState, sSum);
    const float lsePlain = logSumExp(plain);
    const float lseSoft = logSumExp(soft);
    const float lseTeacher = logSumExp(soft_t);
    float kl = 0.0f;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
      const float v = toFloat(s[j]);
      const float logPt = toFloat(t[j]) * inv - lseTeacher;
      const float pt = expf(logPt);
      const float logPs = v * inv - lseSoft;
      // A class of teacher probability 0 adds nothing (torch's xlogy).
      if (pt != 0.0f) kl += pt * (logPt - logPs);
      if (dLogits) {
        const float q = (j == label ? 1.0f - p.labelSmoothing : 0.0f) + offLabel;
        const float d = p.alpha * p.temperature * (expf(logPs) - pt) + ceWeight * (expf(v - lsePlain) - q);
        dLogits[row * k + j] = fromFloat<T>(d * scale);
      }
    }
    SoftmaxState none{-INFINITY, 0.0};
    blockReduce(none, kl, sState, sSum);
    if (threadIdx.x == 0) {
      const float sm = p.labelSmoothing;
      const float hard = sm < 1.0f ? (1.0f - sm) * logSumExpMinus(plain, toFloat(s[label])) : 0.0f;
      const float smooth = sm > 0.0f ? sm * lsePlain - offLabel * sumZ : 0.0f;
      // Terms of weight 0 are left out: alpha = 0 is the plain cross-entropy, alpha = 1 ignores labels.
      blockLoss += (kdWeight > 0.0f ? kdWeight * kl : 0.0f) + (ceWeight > 0.0f ? ceWeight * (hard + smooth) : 0.0f);
    }
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = blockLoss;
}

}  // namespace

// partial: min(n, kCrossEntropyBlocks) floats (<= batchNormScratchFloats(n, 1)). *invalidLabel is
// only ever set, never cleared: the caller zeroes it.
void crossEntropy(DType dtype, const void* logits, const int32_t* labels, float* loss, void* dLogits, int64_t n,
                  int64_t k, float labelSmoothing, float gradScale, const float* gradScaleFrom, int32_t* invalidLabel,
                  float* partial, cudaStream_t stream) {
  RC_CHECK_ARG(n > 0 && k > 0, "cross entropy: needs at least one row and one class, got [" << n << ", " << k << "]");
  const int64_t blocks = std::min(n, kCrossEntropyBlocks);
  // Threads for about four logits each: a full warp for small k, 256 from k = 1024 up.
  const int threads = static_cast<int>(std::clamp<int64_t>(ceilDiv(ceilDiv(k, 4), 32) * 32, 32, kThreads));
  dispatchFloat(dtype, "cross entropy", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        static_cast<const T*>(logits), labels, static_cast<T*>(dLogits), n, k, labelSmoothing, gradScale, gradScaleFrom,
        invalidLabel, partial);
    checkLaunch("cross_entropy_kernel");
  });
  cross_entropy_mean_kernel<<<1, kThreads, 0, stream>>>(partial, blocks, n, loss);
  checkLaunch("cross_entropy_mean_kernel");
}

void distillationLoss(DType dtype, const void* logits, const void* teacherLogits, const int32_t* labels, float* loss,
                      void* dLogits, int64_t n, int64_t k, DistillationParams params, int32_t* invalidLabel,
                      float* partial, cudaStream_t stream) {
  RC_CHECK_ARG(n > 0 && k > 0,
               "distillation loss: needs at least one row and one class, got [" << n << ", " << k << "]");
  const int64_t blocks = std::min(n, kCrossEntropyBlocks);
  const int threads = static_cast<int>(std::clamp<int64_t>(ceilDiv(ceilDiv(k, 4), 32) * 32, 32, kThreads));
  dispatchFloat(dtype, "distillation loss", [&](auto tag) {
    using T = decltype(tag);
    distillation_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        static_cast<const T*>(logits), static_cast<const T*>(teacherLogits), labels, static_cast<T*>(dLogits), n, k,
        params, invalidLabel, partial);
    checkLaunch("distillation_kernel");
  });
  cross_entropy_mean_kernel<<<1, kThreads, 0, stream>>>(partial, blocks, n, loss);
  checkLaunch("cross_entropy_mean_kernel");
}

}  // namespace rc::cuda
