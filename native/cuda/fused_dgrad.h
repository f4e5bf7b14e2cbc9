// The backward of the `conv-bn` prologue on CUDA: the dgrad-drelu-dbn cuDNN graph
// (fused_dgrad.cc, see ConvDgradDbnArgs) and the kernels around it (fused_dgrad.cu): the
// accumulation of the graph's dGamma/dBeta into the caller's, and the batch norm's input gradient
// from the graph's coefficients (BatchNormBackwardApplyArgs).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "cuda_context.h"
#include "plan_cache.h"

namespace rc::cuda {

class DgradDbnGraph;

// The fused backward convolutions of one backend: one cuDNN execution plan per shape, built on
// first use and kept with the backend's context.
class DgradDbnFusion {
 public:
  explicit DgradDbnFusion(CudaContext& ctx);
  ~DgradDbnFusion();
  DgradDbnFusion(const DgradDbnFusion&) = delete;
  DgradDbnFusion& operator=(const DgradDbnFusion&) = delete;

  // The arguments are checked by the caller (validateConvDgradDbn).
  void run(const ConvDgradDbnArgs& args);

  // "" when cuDNN accepts the graph of shape `a`, building and keeping its plan; else cuDNN's
  // refusal.
  std::string refusal(const ConvBnSupportArgs& a);

 private:
  CudaContext& ctx_;
  PlanCache<DgradDbnGraph> plans_;  // by shape
};

// beta[c] = shift[c] + mean[c] * scale[c]: the batch norm's beta from the prologue's affine map
// (shift = beta - mean * scale), one thread per channel.
void shiftToBeta(const float* shift, const float* mean, const float* scale, float* beta, int64_t channels,
                 cudaStream_t stream);

// dGamma[c] += partial[c], dBeta[c] += partial[channels + c], one thread per channel.
void accumulateBnGrads(const float* partial, float* dGamma, float* dBeta, int64_t channels, cudaStream_t stream);

// dx = eqDz[c] * dz + eqX[c] * x + eqBias[c] over rows x channels (NHWC, c the last dim); dx may
// be dz.
void batchNormBackwardApply(DType dtype, const void* dz, const void* x, const float* eqDz, const float* eqX,
                            const float* eqBias, void* dx, int64_t rows, int64_t channels, cudaStream_t stream);

}  // namespace rc::cuda
