// The `conv-bn` fused path on CUDA: convolutions with batch normalisation's statistics in their
// epilogue and its affine map + ReLU in their prologue, through cuDNN's graph API (fused_conv.cc),
// and the finalize between them (fused_conv_finalize.cu).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "cuda_context.h"
#include "plan_cache.h"

namespace rc::cuda {

class ConvBnGraph;

// The fused convolutions of one backend: y = conv(prologue ? relu(x * scale + shift) : x, weight),
// with the channel sums of y when asked (see ConvBnForwardArgs). One cuDNN execution plan per shape,
// built on first use and kept with the backend's context.
class ConvBnFusion {
 public:
  explicit ConvBnFusion(CudaContext& ctx);
  ~ConvBnFusion();
  ConvBnFusion(const ConvBnFusion&) = delete;
  ConvBnFusion& operator=(const ConvBnFusion&) = delete;

  void forward(const ConvBnForwardArgs& args);

  // "" when cuDNN accepts the forward graph of shape `a` with the statistics epilogue (and the
  // prologue when `prologue`), building and keeping its plan; else cuDNN's refusal.
  std::string refusal(const ConvBnSupportArgs& a, bool prologue);

 private:
  CudaContext& ctx_;
  PlanCache<ConvBnGraph> plans_;  // by shape
};

// saveMean, saveInvStd, running statistics and the next prologue's scale and shift from a
// convolution's channel sums (see BatchNormFinalizeArgs), one thread per channel; runningMean,
// runningVar and variance (the biased batch variance) may be null.
void batchNormFinalize(const float* sum, const float* sqSum, const float* gamma, const float* beta, float* runningMean,
                       float* runningVar, float* saveMean, float* saveInvStd, float* scale, float* shift,
                       float* variance, int64_t channels, int64_t count, float momentum, float eps,
                       cudaStream_t stream);

}  // namespace rc::cuda
