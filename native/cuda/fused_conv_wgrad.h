// The filter gradient of the `conv-bn` prologue's convolution on CUDA (see ConvWgradSbrArgs):
// the scale-bias-ReLU-wgrad cuDNN graph (fused_conv_wgrad.cc).
#pragma once

#include <memory>
#include <string>

#include "cuda_context.h"
#include "plan_cache.h"

namespace rc::cuda {

class WgradSbrGraph;

// The fused filter-gradient convolutions of one backend: one cuDNN execution plan per shape,
// built on first use and kept with the backend's context.
class WgradSbrFusion {
 public:
  explicit WgradSbrFusion(CudaContext& ctx);
  ~WgradSbrFusion();
  WgradSbrFusion(const WgradSbrFusion&) = delete;
  WgradSbrFusion& operator=(const WgradSbrFusion&) = delete;

  // The arguments are checked by the caller (validateConvWgradSbr).
  void run(const ConvWgradSbrArgs& args);

  // "" when cuDNN accepts the graph of shape `a`, building and keeping its plan; else cuDNN's
  // refusal.
  std::string refusal(const ConvBnSupportArgs& a);

 private:
  CudaContext& ctx_;
  PlanCache<WgradSbrGraph> plans_;  // by shape
};

}  // namespace rc::cuda
