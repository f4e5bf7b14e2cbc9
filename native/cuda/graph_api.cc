// The layer over cuDNN's backend API (see graph_api.h).
#include "graph_api.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "cuda_check.h"

namespace rc::cuda::graph {

namespace {

// cuDNN's explanation of the last failure on this thread.
std::string lastError() {
  char message[512] = {0};
  cudnnGetLastErrorString(message, sizeof message);
  return message;
}

#define RC_GRAPH_CHECK(expr, what) RC_CUDNN_CHECK(expr, what << " (" << lastError() << ")")

}  // namespace

Descriptor::Descriptor(cudnnBackendDescriptorType_t type, std::string what) : what_(std::move(what)) {
  RC_GRAPH_CHECK(cudnnBackendCreateDescriptor(type, handle_.out()), what_);
}

Descriptor& Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                            const void* values) {
  RC_GRAPH_CHECK(cudnnBackendSetAttribute(handle_, name, type, count, values),
                 what_ << ", attribute " << static_cast<int>(name));
  return *this;
}

Descriptor& Descriptor::setInt(cudnnBackendAttributeName_t name, int64_t value) {
  return set(name, CUDNN_TYPE_INT64, 1, &value);
}

Descriptor& Descriptor::setInts(cudnnBackendAttributeName_t name, const std::vector<int64_t>& values) {
  return set(name, CUDNN_TYPE_INT64, static_cast<int64_t>(values.size()), values.data());
}

Descriptor& Descriptor::setFloat(cudnnBackendAttributeName_t name, float value) {
  return set(name, CUDNN_TYPE_FLOAT, 1, &value);
}

Descriptor& Descriptor::setDataType(cudnnBackendAttributeName_t name, cudnnDataType_t value) {
  return set(name, CUDNN_TYPE_DATA_TYPE, 1, &value);
}

Descriptor& Descriptor::setDescriptor(cudnnBackendAttributeName_t name, const Descriptor& value) {
  cudnnBackendDescriptor_t d = value.get();
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
}

Descriptor& Descriptor::setDescriptors(cudnnBackendAttributeName_t name, const std::vector<const Descriptor*>& values) {
  std::vector<cudnnBackendDescriptor_t> raw;
  raw.reserve(values.size());
  for (const Descriptor* d : values) raw.push_back(d->get());
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(raw.size()), raw.data());
}

Descriptor& Descriptor::setHandle(cudnnBackendAttributeName_t name, cudnnHandle_t handle) {
  return set(name, CUDNN_TYPE_HANDLE, 1, &handle);
}

Descriptor& Descriptor::finalize() {
  RC_GRAPH_CHECK(cudnnBackendFinalize(handle_), what_);
  return *this;
}

Descriptor channelsLastTensor(const TensorSpec& s) {
  RC_CHECK_ARG(s.dims.size() == 4, s.what << ": 4 dims expected, got " << s.dims.size());
  const int64_t c = s.dims[1], h = s.dims[2], w = s.dims[3];
  Descriptor d(CUDNN_BACKEND_TENSOR_DESCRIPTOR, s.what);
  d.setInt(CUDNN_ATTR_TENSOR_UNIQUE_ID, s.uid)
      .setDataType(CUDNN_ATTR_TENSOR_DATA_TYPE, s.type)
      .setInts(CUDNN_ATTR_TENSOR_DIMENSIONS, s.dims)
      .setInts(CUDNN_ATTR_TENSOR_STRIDES, {h * w * c, 1, w * c, c})
      .setInt(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, s.alignment);
  const bool isVirtual = s.isVirtual;
  d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &isVirtual);
  return std::move(d.finalize());
}

Descriptor convolution2d(const Convolution2dSpec& s, const std::string& what) {
  Descriptor d(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, what);
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  d.setDataType(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_DATA_FLOAT)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .setInt(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 2)
      .setInts(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, {s.padH, s.padW})
      .setInts(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, {s.padH, s.padW})
      .setInts(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, {s.strideH, s.strideW})
      .setInts(CUDNN_ATTR_CONVOLUTION_DILATIONS, {s.dilationH, s.dilationW});
  return std::move(d.finalize());
}

Descriptor convolutionForward(const Descriptor& conv, const Descriptor& x, const Descriptor& w, const Descriptor& y,
                              const std::string& what) {
  Descriptor d(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, what);
  d.setDescriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv)
      .setDescriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x)
      .setDescriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w)
      .setDescriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y)
      .setFloat(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, 1.0f)
      .setFloat(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, 0.0f);
  return std::move(d.finalize());
}

Descriptor convolutionBackwardData(const Descriptor& conv, const Descriptor& dy, const Descriptor& w,
                                   const Descriptor& dx, const std::string& what) {
  Descriptor d(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, what);
  d.setDescriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv)
      .setDescriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, dy)
      .setDescriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, w)
      .setDescriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, dx)
      .setFloat(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, 1.0f)
      .setFloat(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, 0.0f);
  return std::move(d.finalize());
}

Descriptor convolutionBackwardFilter(const Descriptor& conv, const Descriptor& x, const Descriptor& dy,
                                     const Descriptor& dw, const std::string& what) {
  Descriptor d(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, what);
  d.setDescriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, conv)
      .setDescriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, x)
      .setDescriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, dy)
      .setDescriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, dw)
      .setFloat(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, 1.0f)
      .setFloat(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, 0.0f);
  return std::move(d.finalize());
}

Descriptor reluBackward(const Descriptor& x, const Descriptor& dy, const Descriptor& dx, const std::string& what) {
  Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what + " mode");
  const cudnnPointwiseMode_t mode = CUDNN_POINTWISE_RELU_BWD;
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .setDataType(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT)
      .finalize();
  Descriptor d(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
  d.setDescriptor(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
      .setDescriptor(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)
      .setDescriptor(CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, dy)
      .setDescriptor(CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, dx);
  return std::move(d.finalize());
}

Descriptor pointwise(cudnnPointwiseMode_t mode, const Descriptor& x, const Descriptor* b, const Descriptor& y,
                     const std::string& what, float alpha2) {
  Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what + " mode");
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .setDataType(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT)
      .finalize();
  Descriptor d(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
  d.setDescriptor(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
      .setDescriptor(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  if (b != nullptr) d.setDescriptor(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  if (alpha2 != 1.0f) d.setFloat(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, alpha2);
  d.setDescriptor(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  return std::move(d.finalize());
}

Descriptor genStats(const Descriptor& x, const Descriptor& sum, const Descriptor& sqSum, const std::string& what) {
  Descriptor d(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, what);
  const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
  d.set(CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode)
      .setDataType(CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_DATA_FLOAT)
      .setDescriptor(CUDNN_ATTR_OPERATION_GENSTATS_XDESC, x)
      .setDescriptor(CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum)
      .setDescriptor(CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, sqSum);
  return std::move(d.finalize());
}

ExecutionPlan::ExecutionPlan(cudnnHandle_t handle, const std::vector<const Descriptor*>& ops, const std::string& what)
    : what_(what) {
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what + " operation graph");
  graph.setHandle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle)
      .setDescriptors(CUDNN_ATTR_OPERATIONGRAPH_OPS, ops)
      .finalize();
  std::ostringstream refusals;
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what + " heuristics");
    heuristics.setDescriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode)
        .finalize();
    constexpr int kMaxConfigs = 8;
    std::vector<Descriptor> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int i = 0; i < kMaxConfigs; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, what + " engine configuration");
      raw.push_back(configs.back().get());
    }
    int64_t count = 0;
    RC_GRAPH_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxConfigs, &count, raw.data()),
                   what << " heuristics results");
    for (int64_t i = 0; i < std::min<int64_t>(count, kMaxConfigs); ++i) {
      DescriptorHandle plan;
      RC_GRAPH_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, plan.out()),
                     what << " execution plan");
      cudnnBackendDescriptor_t cfg = raw[static_cast<size_t>(i)];
      RC_GRAPH_CHECK(cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle),
                     what << " execution plan");
      RC_GRAPH_CHECK(cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg),
                     what << " execution plan");
      // An engine the heuristics list may still refuse this graph: the next one is tried.
      const cudnnStatus_t status = cudnnBackendFinalize(plan);
      if (status != CUDNN_STATUS_SUCCESS) {
        refusals << " [" << cudnnGetErrorString(status) << ": " << lastError() << "]";
        continue;
      }
      int64_t got = 0;
      RC_GRAPH_CHECK(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                                              &workspaceBytes_),
                     what << " execution plan workspace size");
      plan_ = std::move(plan);
      return;
    }
  }
  RC_THROW(code::kCudnn, "cuDNN has no engine for " << what << "; engines refused it:" << refusals.str());
}

void ExecutionPlan::execute(cudnnHandle_t handle, const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
                            void* workspace) const {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, what_ + " variant pack");
  pack.setInts(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
           pointers.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace)
      .finalize();
  RC_GRAPH_CHECK(cudnnBackendExecute(handle, plan_, pack.get()), what_);
}

}  // namespace rc::cuda::graph
