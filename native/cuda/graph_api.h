// A small layer over cuDNN's backend (graph) API: descriptors owned one each (RAII), built from
// typed attribute setters, and an execution plan chosen by cuDNN's heuristics for a graph of
// operations, run with a variant pack that maps each non-virtual tensor's unique id to its memory.
// Every status is checked and a failure names the descriptor or operation and cuDNN's own message.
// Reference: https://docs.nvidia.com/deeplearning/cudnn/backend/latest/api/cudnn-graph-library.html
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <string>
#include <vector>

#include "handles.h"

namespace rc::cuda::graph {

using DescriptorHandle = Handle<cudnnBackendDescriptor_t, cudnnBackendDestroyDescriptor>;

// One backend descriptor of one type; `what` names it in errors ("conv-bn tensor x").
class Descriptor {
 public:
  Descriptor(cudnnBackendDescriptorType_t type, std::string what);

  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                  const void* values);
  Descriptor& setInt(cudnnBackendAttributeName_t name, int64_t value);
  Descriptor& setInts(cudnnBackendAttributeName_t name, const std::vector<int64_t>& values);
  Descriptor& setFloat(cudnnBackendAttributeName_t name, float value);
  Descriptor& setDataType(cudnnBackendAttributeName_t name, cudnnDataType_t value);
  Descriptor& setDescriptor(cudnnBackendAttributeName_t name, const Descriptor& value);
  Descriptor& setDescriptors(cudnnBackendAttributeName_t name, const std::vector<const Descriptor*>& values);
  Descriptor& setHandle(cudnnBackendAttributeName_t name, cudnnHandle_t handle);
  Descriptor& finalize();

  cudnnBackendDescriptor_t get() const { return handle_; }
  const std::string& what() const { return what_; }

 private:
  DescriptorHandle handle_;
  std::string what_;
};

// A tensor of logical dims [N, C, H, W] (filters [K, C, R, S]) laid out channels-last (NHWC /
// KRSC), its memory aligned to `alignment` bytes; a virtual tensor lives only inside the fused
// kernel.
struct TensorSpec {
  int64_t uid = 0;
  std::vector<int64_t> dims;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int64_t alignment = 16;
  bool isVirtual = false;
  std::string what;
};
Descriptor channelsLastTensor(const TensorSpec& spec);

// A 2-D cross-correlation with f32 accumulation.
struct Convolution2dSpec {
  int64_t padH = 0, padW = 0, strideH = 1, strideW = 1, dilationH = 1, dilationW = 1;
};
Descriptor convolution2d(const Convolution2dSpec& spec, const std::string& what);

// The operation nodes: y = conv(x, w); dx = the gradient of conv(x, w) with respect to x, from dy;
// dw = that with respect to w, from x and dy; y = x <mode> b (b null for unary modes); dx = dy where
// x > 0, else 0 (x the ReLU's input); the per-channel sum and sum of squares of x.
Descriptor convolutionForward(const Descriptor& conv, const Descriptor& x, const Descriptor& w, const Descriptor& y,
                              const std::string& what);
Descriptor convolutionBackwardData(const Descriptor& conv, const Descriptor& dy, const Descriptor& w,
                                   const Descriptor& dx, const std::string& what);
Descriptor convolutionBackwardFilter(const Descriptor& conv, const Descriptor& x, const Descriptor& dy,
                                     const Descriptor& dw, const std::string& what);
Descriptor reluBackward(const Descriptor& x, const Descriptor& dy, const Descriptor& dx, const std::string& what);
// (pointwise: y = x <mode> alpha2 * b for the binary modes; alpha2 = -1 makes ADD a subtraction.)
Descriptor pointwise(cudnnPointwiseMode_t mode, const Descriptor& x, const Descriptor* b, const Descriptor& y,
                     const std::string& what, float alpha2 = 1.0f);
Descriptor genStats(const Descriptor& x, const Descriptor& sum, const Descriptor& sqSum, const std::string& what);

// An operation graph's execution plan: the first engine configuration of cuDNN's heuristics
// (mode A, then the fallback list) that finalizes; its workspace size is fixed with it.
class ExecutionPlan {
 public:
  ExecutionPlan(cudnnHandle_t handle, const std::vector<const Descriptor*>& ops, const std::string& what);

  int64_t workspaceBytes() const { return workspaceBytes_; }
  // Queues the plan on the handle's stream; host work only besides that, so it may be captured.
  void execute(cudnnHandle_t handle, const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
               void* workspace) const;

 private:
  std::string what_;
  DescriptorHandle plan_;
  int64_t workspaceBytes_ = 0;
};

}  // namespace rc::cuda::graph
