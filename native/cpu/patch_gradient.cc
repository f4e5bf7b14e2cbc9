#include "patch_gradient.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "compute_type.h"

namespace rc::cpu {

PatchGradient::PatchGradient(CpuContext& ctx, const Conv2dParams& p, const WeightedLayout& layout)
    : ctx_(&ctx), p_(p), layout_(layout), pixels_(p.n * p.outH() * p.outW()), patchSize_(p.kernelH * p.kernelW * p.c) {
  RC_CHECK_ARG(layout.x.get_data_type() == dnnl::memory::data_type::f32,
               "PatchGradient: computes in f32 only, for " << p.str());
}

void PatchGradient::gatherPatch(const float* x, int64_t pixel, float* patch) const {
  const int64_t ow = pixel % p_.outW();
  const int64_t oh = pixel / p_.outW() % p_.outH();
  const int64_t n = pixel / (p_.outW() * p_.outH());
  const size_t channelBytes = sizeof(float) * static_cast<size_t>(p_.c);
  const int64_t w0 = ow * p_.strideW - p_.padW;
  // A kernel row reads one contiguous run of NHWC pixels when it is undilated and inside the image.
  const bool contiguousRow = p_.dilationW == 1 && w0 >= 0 && w0 + p_.kernelW <= p_.w;
  for (int64_t r = 0; r < p_.kernelH; ++r) {
    float* row = patch + r * p_.kernelW * p_.c;
    const int64_t ih = oh * p_.strideH - p_.padH + r * p_.dilationH;
    if (ih < 0 || ih >= p_.h) {
      std::memset(row, 0, channelBytes * static_cast<size_t>(p_.kernelW));
      continue;
    }
    const float* image = x + (n * p_.h + ih) * p_.w * p_.c;
    if (contiguousRow) {
      std::memcpy(row, image + w0 * p_.c, channelBytes * static_cast<size_t>(p_.kernelW));
      continue;
    }
    for (int64_t s = 0; s < p_.kernelW; ++s) {
      const int64_t iw = w0 + s * p_.dilationW;
      if (iw < 0 || iw >= p_.w) {
        std::memset(row + s * p_.c, 0, channelBytes);
      } else {
        std::memcpy(row + s * p_.c, image + iw * p_.c, channelBytes);
      }
    }
  }
}

dnnl::status PatchGradient::accumulateRows(const float* x, const float* dy, int64_t begin, int64_t end, float* patches,
                                           float* partial, float* partialBias) const {
  std::fill(partialBias, partialBias + p_.k, 0.0f);
  if (begin >= end) std::fill(partial, partial + p_.k * patchSize_, 0.0f);
  for (int64_t chunk = begin; chunk < end; chunk += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, end - chunk);
    for (int64_t i = 0; i < rows; ++i) gatherPatch(x, chunk + i, patches + i * patchSize_);
    const float* dyRows = dy + chunk * p_.k;
    // partial[K, RSC] (+)= dyRows[rows, K]^T patches[rows, RSC]; the first chunk overwrites.
    const dnnl::status status = dnnl::sgemm('T', 'N', p_.k, patchSize_, rows, 1.0f, dyRows, p_.k, patches, patchSize_,
                                            chunk == begin ? 0.0f : 1.0f, partial, patchSize_);
    if (status != dnnl::status::success) return status;
    if (p_.bias) {
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t k = 0; k < p_.k; ++k) partialBias[k] += dyRows[i * p_.k + k];
      }
    }
  }
  return dnnl::status::success;
}

void PatchGradient::run(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& dBias) {
  const auto* xs = static_cast<const float*>(stageInput(*ctx_, x, layout_.x, 0));
  const auto* dys = static_cast<const float*>(stageInput(*ctx_, dy, layout_.y, 1));
  const int64_t weights = p_.k * patchSize_;
  // Per thread: its partial gradient, its bias sums, its chunk of patches.
  const int64_t perThread = weights + p_.k + kChunkRows * patchSize_;
  const int maxThreads = omp_get_max_threads();
  auto* scratch = static_cast<float*>(ctx_->scratch(sizeof(float) * static_cast<size_t>(perThread * maxThreads)));
  int team = 1;
  std::atomic<int> failure{static_cast<int>(dnnl::status::success)};
#pragma omp parallel num_threads(maxThreads)
  {
    const int t = omp_get_thread_num();
    const int threads = omp_get_num_threads();
    if (t == 0) team = threads;
    float* own = scratch + t * perThread;
    const dnnl::status status = accumulateRows(xs, dys, pixels_ * t / threads, pixels_ * (t + 1) / threads,
                                               own + weights + p_.k, own, own + weights);
    if (status != dnnl::status::success) failure = static_cast<int>(status);
  }
  if (failure != static_cast<int>(dnnl::status::success)) {
    RC_THROW(code::kOneDnn,
             "oneDNN sgemm failed in the weight gradient of " << p_.str() << " (status " << failure.load() << ")");
  }
  float* dw = dWeight.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < weights; ++i) {
    float sum = dw[i];
    for (int t = 0; t < team; ++t) sum += scratch[t * perThread + i];
    dw[i] = sum;
  }
  if (!p_.bias) return;
  float* db = dBias.ptr<float>();
  for (int64_t k = 0; k < p_.k; ++k) {
    for (int t = 0; t < team; ++t) db[k] += scratch[t * perThread + weights + k];
  }
}

}  // namespace rc::cpu
