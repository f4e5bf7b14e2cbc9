// The weight gradient of an f32 convolution as matrix products over the patches its outputs read
// (im2col): dW[K, R*S*C] += dy[P, K]^T patches(x)[P, R*S*C] over the P = N*OH*OW output pixels,
// and dBias[K] += the column sums of dy. Each thread takes a contiguous share of the output pixels,
// gathers their patches a chunk at a time into a buffer that stays in cache, and multiplies each
// chunk into a partial gradient of its own with oneDNN's single-threaded sgemm; the partials are
// then added into the plain (OHWI) f32 master gradient. The scratch holds one partial gradient
// per thread (K*R*S*C floats each: 9.4 MB for ResNet-50's largest 3x3 layer) and one chunk of
// patches per thread.
//
// Where oneDNN has no AVX-512 its backward-weights convolution is a direct kernel (`jit:avx2`)
// that ran ResNet-50's 3x3 and 7x7 weight gradients 1.0-1.6x slower than this, layer by layer,
// its channel-blocked copies included (bench/RESULTS.md); conv.cc decides where this runs.
#pragma once

#include <string>

#include "cpu_context.h"
#include "weighted_passes.h"

namespace rc::cpu {

class PatchGradient final : public WeightGradientPath {
 public:
  // For the convolution `p` (f32 compute; NHWC x and dy described by the plan's layout).
  PatchGradient(CpuContext& ctx, const Conv2dParams& p, const WeightedLayout& layout);
  void run(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& dBias) override;
  std::string implementation() const override { return "sgemm over gathered patches"; }

  // Output pixels per gathered chunk: 64 to 768 measured within noise of each other.
  static constexpr int64_t kChunkRows = 128;

 private:
  // One thread's share: output pixels [begin, end) into its partial gradient and bias sums (zero
  // when the share is empty); the first status other than success that sgemm returned, if any.
  dnnl::status accumulateRows(const float* x, const float* dy, int64_t begin, int64_t end, float* patches,
                              float* partial, float* partialBias) const;
  // The patch of output pixel `pixel`, R*S*C values in (r, s, c) order, zero where it reads padding.
  void gatherPatch(const float* x, int64_t pixel, float* patch) const;

  CpuContext* ctx_;
  Conv2dParams p_;
  WeightedLayout layout_;
  int64_t pixels_;     // N*OH*OW
  int64_t patchSize_;  // R*S*C
};

}  // namespace rc::cpu
