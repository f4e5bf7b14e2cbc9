// The emulated cuDNN backend (graph) API (see cudnn.h for the descriptor types, attributes and
// statuses it accepts).
//
// Every descriptor records the attributes set on it; cudnnBackendFinalize checks them and copies
// what the computation needs into the descriptor (tensors into operations, operations into the
// graph, the graph into the engine, configuration and plan), so that a descriptor may be destroyed
// once a later one is finalized, as with cuDNN. cudnnBackendExecute queues an interpreter of the
// plan's graph: the operations run in dependency order over dense double-precision arrays, every
// tensor's values rounded to its data type.
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dnn_errors.h"
#include "rc_emu/numeric.h"
#include "rc_emu/runtime.h"

namespace {

// ---- errors -----------------------------------------------------------------------------------

cudnnStatus_t fail(cudnnStatus_t status, const std::string& message) {
  rc_emu::setDnnLastError(message);
  return status;
}

#define RC_GRAPH_TRY(expr)                                             \
  do {                                                                 \
    const cudnnStatus_t rcGraphStatus_ = (expr);                       \
    if (rcGraphStatus_ != CUDNN_STATUS_SUCCESS) return rcGraphStatus_; \
  } while (0)

// ---- values -----------------------------------------------------------------------------------

size_t elementBytes(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_DOUBLE: return 8;
    case CUDNN_DATA_FLOAT: return 4;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16: return 2;
    default: return 0;
  }
}

double roundTo(cudnnDataType_t t, double v) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return static_cast<float>(v);
    case CUDNN_DATA_HALF: return rc_emu::halfBitsToFloat(rc_emu::floatToHalfBits(static_cast<float>(v)));
    case CUDNN_DATA_BFLOAT16: return rc_emu::bf16BitsToFloat(rc_emu::floatToBf16Bits(static_cast<float>(v)));
    default: return v;
  }
}

double load(cudnnDataType_t t, const void* base, int64_t i) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return static_cast<const float*>(base)[i];
    case CUDNN_DATA_DOUBLE: return static_cast<const double*>(base)[i];
    case CUDNN_DATA_HALF: return rc_emu::halfBitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case CUDNN_DATA_BFLOAT16: return rc_emu::bf16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    default: return 0.0;
  }
}

void store(cudnnDataType_t t, void* base, int64_t i, double v) {
  switch (t) {
    case CUDNN_DATA_FLOAT: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case CUDNN_DATA_DOUBLE: static_cast<double*>(base)[i] = v; break;
    case CUDNN_DATA_HALF: static_cast<uint16_t*>(base)[i] = rc_emu::floatToHalfBits(static_cast<float>(v)); break;
    case CUDNN_DATA_BFLOAT16: static_cast<uint16_t*>(base)[i] = rc_emu::floatToBf16Bits(static_cast<float>(v)); break;
    default: break;
  }
}

// ---- what finalized descriptors hold ------------------------------------------------------------

struct TensorInfo {
  int64_t uid = 0;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  std::vector<int64_t> dims, strides;
  int64_t alignment = 0;
  bool isVirtual = false;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  // Bytes from the first element to one past the last.
  size_t extentBytes() const {
    int64_t last = 0;
    for (size_t i = 0; i < dims.size(); ++i) last += (dims[i] - 1) * strides[i];
    return static_cast<size_t>(last + 1) * elementBytes(type);
  }
  // The memory offset (in elements) of dense (row-major over dims) index `i`.
  int64_t offsetOf(int64_t i) const {
    int64_t off = 0;
    for (size_t d = dims.size(); d-- > 0;) {
      off += (i % dims[d]) * strides[d];
      i /= dims[d];
    }
    return off;
  }
  bool sameAs(const TensorInfo& o) const {
    return uid == o.uid && type == o.type && dims == o.dims && strides == o.strides && isVirtual == o.isVirtual;
  }
};

struct ConvInfo {
  cudnnDataType_t computeType = CUDNN_DATA_FLOAT;
  std::vector<int64_t> prePad, postPad, strides, dilations;
};

enum class NodeKind { Conv, ConvBwdData, ConvBwdFilter, Pointwise, GenStats, BnBwdWeights };

struct NodeInfo {
  NodeKind kind = NodeKind::Conv;
  ConvInfo conv;
  double alpha = 1.0, beta = 0.0;  // conv forward; pointwise alpha1 and alpha2
  cudnnPointwiseMode_t mode = CUDNN_POINTWISE_ADD;
  // conv: x, w; backward data: dy, w; backward filter: x, dy; pointwise: x[, b]; RELU_BWD: x, dy;
  // genstats: x; bn backward weights: x, dy, mean, invStd, scale.
  std::vector<TensorInfo> inputs;
  // conv: y; backward data: dx; backward filter: dw; pointwise: y; RELU_BWD: dx; genstats: sum,
  // sqsum; bn backward weights: dScale, dBias, eqDy, eqX, eqBias.
  std::vector<TensorInfo> outputs;
  const char* name() const {
    switch (kind) {
      case NodeKind::Conv: return "CONVOLUTION_FORWARD";
      case NodeKind::ConvBwdData: return "CONVOLUTION_BACKWARD_DATA";
      case NodeKind::ConvBwdFilter: return "CONVOLUTION_BACKWARD_FILTER";
      case NodeKind::Pointwise: return "POINTWISE";
      case NodeKind::BnBwdWeights: return "BN_BWD_WEIGHTS";
      default: return "GEN_STATS";
    }
  }
};

struct GraphInfo {
  std::vector<NodeInfo> nodes;  // in dependency order
  std::vector<TensorInfo> io;   // the non-virtual tensors, by first appearance
  int64_t workspaceBytes = 0;   // the emulated engine stages the virtual tensors there
};

struct Attr {
  cudnnBackendAttributeType_t type;
  std::vector<unsigned char> bytes;
  int64_t count = 0;
};

constexpr uint64_t kMagic = 0x6772617068617069ull;

struct Desc {
  uint64_t magic = kMagic;
  cudnnBackendDescriptorType_t type;
  bool finalized = false;
  std::map<int, Attr> attrs;
  // Filled by finalize, by type.
  TensorInfo tensor;
  ConvInfo conv;
  cudnnPointwiseMode_t pointwise = CUDNN_POINTWISE_ADD;
  NodeInfo node;
  std::shared_ptr<const GraphInfo> graph;
  cudnnHandle_t handle = nullptr;
  std::vector<int64_t> packUids;
  std::vector<void*> packPointers;
  void* packWorkspace = nullptr;
};

std::mutex gLiveMutex;
std::set<const Desc*> gLive;

bool live(const void* p) {
  std::lock_guard<std::mutex> lock(gLiveMutex);
  return gLive.count(static_cast<const Desc*>(p)) != 0;
}

const char* typeName(cudnnBackendDescriptorType_t t) {
  switch (t) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: return "POINTWISE";
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: return "CONVOLUTION";
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: return "ENGINE";
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: return "ENGINECFG";
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: return "ENGINEHEUR";
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: return "EXECUTION_PLAN";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR: return "OPERATION_CONVOLUTION_FORWARD";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR: return "OPERATION_CONVOLUTION_BACKWARD_DATA";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR: return "OPERATION_CONVOLUTION_BACKWARD_FILTER";
    case CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR: return "OPERATION_BN_BWD_WEIGHTS";
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return "OPERATION_POINTWISE";
    case CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR: return "OPERATION_GEN_STATS";
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return "OPERATIONGRAPH";
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return "VARIANT_PACK";
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return "TENSOR";
    default: return nullptr;
  }
}

// ---- the attributes each descriptor type accepts ------------------------------------------------

struct AttrSpec {
  cudnnBackendDescriptorType_t desc;
  cudnnBackendAttributeName_t name;
  cudnnBackendAttributeType_t type;
  int64_t minCount, maxCount;
  bool required;
  // For CUDNN_TYPE_BACKEND_DESCRIPTOR: the descriptor type the elements must have, and whether
  // they must be finalized; -1: any operation type.
  int elementType;
  bool elementFinalized;
};

constexpr int kAnyOperation = -1;

const std::vector<AttrSpec>& attrSpecs() {
  static const std::vector<AttrSpec> specs = {
      {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, 1, true, 0, false},
      {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, 1, true, 0, false},
      {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 1, CUDNN_DIM_MAX, true, 0,
       false},
      {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 1, CUDNN_DIM_MAX, true, 0, false},
      {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, 1, true, 0, false},
      {CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, 1, false, 0, false},

      {CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, 1, true, 0,
       false},
      {CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, 1, true,
       0, false},
      {CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, 1, true, 0,
       false},
      {CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 1, CUDNN_DIM_MAX - 2,
       true, 0, false},
      {CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 1,
       CUDNN_DIM_MAX - 2, true, 0, false},
      {CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 1,
       CUDNN_DIM_MAX - 2, true, 0, false},
      {CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 1,
       CUDNN_DIM_MAX - 2, true, 0, false},

      {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, 1, true, 0, false},
      {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, 1, true, 0, false},

      {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
       CUDNN_TYPE_FLOAT, 1, 1, false, 0, false},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
       CUDNN_TYPE_FLOAT, 1, 1, false, 0, false},

      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true,
       CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
       CUDNN_TYPE_FLOAT, 1, 1, false, 0, false},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
       CUDNN_TYPE_FLOAT, 1, 1, false, 0, false},

      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true,
       CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_TYPE_FLOAT, 1, 1, false, 0, false},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
       CUDNN_TYPE_FLOAT, 1, 1, false, 0, false},

      {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, false, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      // YDESC for the forward modes, DXDESC and DYDESC for RELU_BWD: checked by finalize.
      {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, false, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_DXDESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, false, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_DYDESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, false, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, 1,
       false, 0, false},
      {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, 1,
       false, 0, false},

      {CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, 1,
       true, 0, false},
      {CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1,
       1, true, 0, false},
      {CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, CUDNN_ATTR_OPERATION_GENSTATS_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
       1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},

      {CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC,
       CUDNN_TYPE_DATA_TYPE, 1, 1, true, 0, false},
      {CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},
      {CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS,
       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true, CUDNN_BACKEND_TENSOR_DESCRIPTOR, true},

      {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, 1, true, 0,
       false},
      {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 64,
       true, kAnyOperation, true},

      {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1,
       true, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, true},
      {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, 1, true, 0, false},

      {CUDNN_BACKEND_ENGINE_DESCRIPTOR, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true,
       CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, true},
      {CUDNN_BACKEND_ENGINE_DESCRIPTOR, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, 1, true, 0, false},

      {CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1, true,
       CUDNN_BACKEND_ENGINE_DESCRIPTOR, true},

      {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, 1, true, 0,
       false},
      {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR,
       1, 1, true, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, true},

      {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 0, 1024, true, 0,
       false},
      {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 0, 1024, true,
       0, false},
      {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, 1, false, 0,
       false},
  };
  return specs;
}

const AttrSpec* findSpec(cudnnBackendDescriptorType_t desc, cudnnBackendAttributeName_t name) {
  for (const AttrSpec& s : attrSpecs()) {
    if (s.desc == desc && s.name == name) return &s;
  }
  return nullptr;
}

size_t attrElementBytes(cudnnBackendAttributeType_t t) {
  switch (t) {
    case CUDNN_TYPE_HANDLE: return sizeof(cudnnHandle_t);
    case CUDNN_TYPE_DATA_TYPE: return sizeof(cudnnDataType_t);
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_INT64: return sizeof(int64_t);
    case CUDNN_TYPE_FLOAT: return sizeof(float);
    case CUDNN_TYPE_DOUBLE: return sizeof(double);
    case CUDNN_TYPE_VOID_PTR: return sizeof(void*);
    case CUDNN_TYPE_CONVOLUTION_MODE: return sizeof(cudnnConvolutionMode_t);
    case CUDNN_TYPE_HEUR_MODE: return sizeof(cudnnBackendHeurMode_t);
    case CUDNN_TYPE_POINTWISE_MODE: return sizeof(cudnnPointwiseMode_t);
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(cudnnBackendDescriptor_t);
    case CUDNN_TYPE_GENSTATS_MODE: return sizeof(cudnnGenStatsMode_t);
    default: return 0;
  }
}

bool isOperation(cudnnBackendDescriptorType_t t) {
  return t == CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR ||
         t == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR ||
         t == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR ||
         t == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR || t == CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR ||
         t == CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR;
}

// ---- reading recorded attributes ----------------------------------------------------------------

template <typename T>
std::vector<T> values(const Desc& d, cudnnBackendAttributeName_t name) {
  auto it = d.attrs.find(name);
  if (it == d.attrs.end()) return {};
  std::vector<T> out(static_cast<size_t>(it->second.count));
  if (!out.empty()) std::memcpy(out.data(), it->second.bytes.data(), out.size() * sizeof(T));
  return out;
}

template <typename T>
T value(const Desc& d, cudnnBackendAttributeName_t name, T fallback) {
  auto it = d.attrs.find(name);
  if (it == d.attrs.end() || it->second.count < 1) return fallback;
  T out;
  std::memcpy(&out, it->second.bytes.data(), sizeof(T));
  return out;
}

const Desc* child(const Desc& d, cudnnBackendAttributeName_t name) {
  auto v = values<cudnnBackendDescriptor_t>(d, name);
  return v.empty() ? nullptr : static_cast<const Desc*>(v[0]);
}

std::string where(const Desc& d) { return std::string("cudnnBackendFinalize(") + typeName(d.type) + ")"; }

// ---- finalize, by descriptor type --------------------------------------------------------------

cudnnStatus_t finalizeTensor(Desc& d) {
  TensorInfo& t = d.tensor;
  t.uid = value<int64_t>(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, 0);
  t.type = value<cudnnDataType_t>(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_DATA_FLOAT);
  t.dims = values<int64_t>(d, CUDNN_ATTR_TENSOR_DIMENSIONS);
  t.strides = values<int64_t>(d, CUDNN_ATTR_TENSOR_STRIDES);
  t.alignment = value<int64_t>(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 0);
  t.isVirtual = value<bool>(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, false);
  if (t.dims.size() != t.strides.size()) {
    return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": " + std::to_string(t.dims.size()) + " dimensions but " +
                                            std::to_string(t.strides.size()) + " strides");
  }
  for (size_t i = 0; i < t.dims.size(); ++i) {
    if (t.dims[i] <= 0 || t.strides[i] <= 0) {
      return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": dimension " + std::to_string(i) + " has size " +
                                              std::to_string(t.dims[i]) + " and stride " +
                                              std::to_string(t.strides[i]) + "; both must be positive");
    }
  }
  if (t.alignment <= 0 || (t.alignment & (t.alignment - 1)) != 0) {
    return fail(CUDNN_STATUS_BAD_PARAM,
                where(d) + ": the byte alignment " + std::to_string(t.alignment) + " is not a power of two");
  }
  if (elementBytes(t.type) == 0) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where(d) +
                                                ": the emulator computes FLOAT, DOUBLE, HALF and BFLOAT16 "
                                                "tensors only");
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalizeConvolution(Desc& d) {
  ConvInfo& c = d.conv;
  c.computeType = value<cudnnDataType_t>(d, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_DATA_FLOAT);
  const int64_t spatial = value<int64_t>(d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 0);
  c.prePad = values<int64_t>(d, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS);
  c.postPad = values<int64_t>(d, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS);
  c.strides = values<int64_t>(d, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES);
  c.dilations = values<int64_t>(d, CUDNN_ATTR_CONVOLUTION_DILATIONS);
  for (const auto* v : {&c.prePad, &c.postPad, &c.strides, &c.dilations}) {
    if (static_cast<int64_t>(v->size()) != spatial) {
      return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": a padding, stride or dilation list does not have the " +
                                              std::to_string(spatial) + " elements of SPATIAL_DIMS");
    }
  }
  for (size_t i = 0; i < c.strides.size(); ++i) {
    if (c.strides[i] <= 0 || c.dilations[i] <= 0 || c.prePad[i] < 0 || c.postPad[i] < 0) {
      return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": strides and dilations must be positive, paddings not negative");
    }
  }
  if (spatial != 2) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where(d) + ": the emulator computes 2-D convolutions only");
  }
  if (value<cudnnConvolutionMode_t>(d, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_CONVOLUTION) !=
      CUDNN_CROSS_CORRELATION) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where(d) + ": the emulator computes CUDNN_CROSS_CORRELATION only");
  }
  if (c.computeType != CUDNN_DATA_FLOAT && c.computeType != CUDNN_DATA_DOUBLE) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where(d) + ": the compute type must be FLOAT or DOUBLE");
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalizePointwise(Desc& d) {
  d.pointwise = value<cudnnPointwiseMode_t>(d, CUDNN_ATTR_POINTWISE_MODE, CUDNN_POINTWISE_ADD);
  if (d.pointwise != CUDNN_POINTWISE_ADD && d.pointwise != CUDNN_POINTWISE_MUL &&
      d.pointwise != CUDNN_POINTWISE_RELU_FWD && d.pointwise != CUDNN_POINTWISE_RELU_BWD) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                where(d) + ": the emulator computes the ADD, MUL, RELU_FWD and RELU_BWD modes only");
  }
  const cudnnDataType_t prec = value<cudnnDataType_t>(d, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT);
  if (prec != CUDNN_DATA_FLOAT && prec != CUDNN_DATA_DOUBLE) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where(d) + ": the math precision must be FLOAT or DOUBLE");
  }
  return CUDNN_STATUS_SUCCESS;
}

std::string dimsText(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

// The shape checks every convolution node shares, on the forward's x [N,C,H,W], w [K,C,R,S] and
// y [N,K,P,Q] (whichever of them the node reads or writes): 4-D, and y the size conv(x, w) makes.
cudnnStatus_t checkConvShapes(const Desc& d, const ConvInfo& conv, const TensorInfo& x, const TensorInfo& w,
                              const TensorInfo& y, const char* xName, const char* yName) {
  if (x.dims.size() != 4 || w.dims.size() != 4 || y.dims.size() != 4) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where(d) + ": the emulator convolves 4-D tensors only");
  }
  std::vector<int64_t> expect = {x.dims[0], w.dims[0], 0, 0};
  for (int i = 0; i < 2; ++i) {
    const int64_t span = x.dims[2 + i] + conv.prePad[i] + conv.postPad[i] - conv.dilations[i] * (w.dims[2 + i] - 1) - 1;
    expect[2 + i] = span < 0 ? 0 : span / conv.strides[i] + 1;
  }
  if (w.dims[1] != x.dims[1] || y.dims != expect) {
    return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": " + xName + " " + dimsText(x.dims) + " and w " +
                                            dimsText(w.dims) + " make " + yName + " " + dimsText(expect) + ", not " +
                                            dimsText(y.dims));
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalizeConvForward(Desc& d) {
  NodeInfo& n = d.node;
  n.kind = NodeKind::Conv;
  n.conv = child(d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC)->conv;
  n.alpha = value<float>(d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, 1.0f);
  n.beta = value<float>(d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, 0.0f);
  const TensorInfo& x = child(d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X)->tensor;
  const TensorInfo& w = child(d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W)->tensor;
  const TensorInfo& y = child(d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y)->tensor;
  n.inputs = {x, w};
  n.outputs = {y};
  RC_GRAPH_TRY(checkConvShapes(d, n.conv, x, w, y, "x", "y"));
  if (x.uid == y.uid || w.uid == y.uid) {
    return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": y has the unique id of an input");
  }
  return CUDNN_STATUS_SUCCESS;
}

// dx [N,C,H,W] = the gradient of conv(x, w) with respect to x, from dy [N,K,P,Q] and w [K,C,R,S].
cudnnStatus_t finalizeConvBackwardData(Desc& d) {
  NodeInfo& n = d.node;
  n.kind = NodeKind::ConvBwdData;
  n.conv = child(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC)->conv;
  n.alpha = value<float>(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, 1.0f);
  n.beta = value<float>(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, 0.0f);
  const TensorInfo& dx = child(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX)->tensor;
  const TensorInfo& w = child(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W)->tensor;
  const TensorInfo& dy = child(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY)->tensor;
  n.inputs = {dy, w};
  n.outputs = {dx};
  RC_GRAPH_TRY(checkConvShapes(d, n.conv, dx, w, dy, "dx", "dy"));
  if (dx.uid == dy.uid || dx.uid == w.uid) {
    return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": dx has the unique id of an input");
  }
  return CUDNN_STATUS_SUCCESS;
}

// dw [K,C,R,S] = the gradient of conv(x, w) with respect to w, from x [N,C,H,W] and dy [N,K,P,Q].
cudnnStatus_t finalizeConvBackwardFilter(Desc& d) {
  NodeInfo& n = d.node;
  n.kind = NodeKind::ConvBwdFilter;
  n.conv = child(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC)->conv;
  n.alpha = value<float>(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, 1.0f);
  n.beta = value<float>(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, 0.0f);
  const TensorInfo& x = child(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X)->tensor;
  const TensorInfo& dw = child(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW)->tensor;
  const TensorInfo& dy = child(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY)->tensor;
  n.inputs = {x, dy};
  n.outputs = {dw};
  RC_GRAPH_TRY(checkConvShapes(d, n.conv, x, dw, dy, "x", "dy"));
  if (dw.uid == x.uid || dw.uid == dy.uid) {
    return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": dw has the unique id of an input");
  }
  return CUDNN_STATUS_SUCCESS;
}

bool broadcastsTo(const TensorInfo& t, const TensorInfo& y) {
  if (t.dims.size() != y.dims.size()) return false;
  for (size_t i = 0; i < t.dims.size(); ++i) {
    if (t.dims[i] != y.dims[i] && t.dims[i] != 1) return false;
  }
  return true;
}

// RELU_BWD: dx = relu'(x) * dy, from XDESC (the forward's input), DYDESC and into DXDESC; no
// YDESC or BDESC.
cudnnStatus_t finalizeReluBackward(Desc& d) {
  NodeInfo& n = d.node;
  const Desc* dy = child(d, CUDNN_ATTR_OPERATION_POINTWISE_DYDESC);
  const Desc* dx = child(d, CUDNN_ATTR_OPERATION_POINTWISE_DXDESC);
  if (dy == nullptr || dx == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": RELU_BWD needs DYDESC and DXDESC");
  if (child(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC) != nullptr ||
      child(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC) != nullptr) {
    return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": RELU_BWD takes no YDESC or BDESC (its output is DXDESC)");
  }
  const TensorInfo& x = child(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC)->tensor;
  n.inputs = {x, dy->tensor};
  n.outputs = {dx->tensor};
  for (const TensorInfo& in : n.inputs) {
    if (in.dims != dx->tensor.dims) {
      return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": RELU_BWD's x and dy " + dimsText(in.dims) +
                                              " must have dx's dims " + dimsText(dx->tensor.dims));
    }
    if (in.uid == dx->tensor.uid) return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": dx has the unique id of an input");
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalizePointwiseOp(Desc& d) {
  NodeInfo& n = d.node;
  n.kind = NodeKind::Pointwise;
  n.mode = child(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR)->pointwise;
  n.alpha = value<float>(d, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, 1.0f);
  n.beta = value<float>(d, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, 1.0f);
  if (n.mode == CUDNN_POINTWISE_RELU_BWD) return finalizeReluBackward(d);
  const Desc* yDesc = child(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
  if (yDesc == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": a forward mode needs YDESC");
  if (child(d, CUDNN_ATTR_OPERATION_POINTWISE_DXDESC) != nullptr ||
      child(d, CUDNN_ATTR_OPERATION_POINTWISE_DYDESC) != nullptr) {
    return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": DXDESC and DYDESC belong to the backward modes");
  }
  const TensorInfo& x = child(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC)->tensor;
  const TensorInfo& y = yDesc->tensor;
  n.inputs = {x};
  n.outputs = {y};
  const Desc* b = child(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
  const bool binary = n.mode != CUDNN_POINTWISE_RELU_FWD;
  if (binary != (b != nullptr)) {
    return fail(CUDNN_STATUS_BAD_PARAM,
                where(d) + (binary ? ": a binary mode needs BDESC" : ": RELU_FWD takes no BDESC"));
  }
  if (b != nullptr) n.inputs.push_back(b->tensor);
  for (const TensorInfo& in : n.inputs) {
    if (!broadcastsTo(in, y)) {
      return fail(CUDNN_STATUS_BAD_PARAM,
                  where(d) + ": an input " + dimsText(in.dims) + " does not broadcast to y " + dimsText(y.dims));
    }
    if (in.uid == y.uid) return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": y has the unique id of an input");
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalizeGenStats(Desc& d) {
  NodeInfo& n = d.node;
  n.kind = NodeKind::GenStats;
  if (value<cudnnGenStatsMode_t>(d, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_GENSTATS_SUM_SQSUM) !=
      CUDNN_GENSTATS_SUM_SQSUM) {
    return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": the mode must be CUDNN_GENSTATS_SUM_SQSUM");
  }
  const TensorInfo& x = child(d, CUDNN_ATTR_OPERATION_GENSTATS_XDESC)->tensor;
  const TensorInfo& sum = child(d, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC)->tensor;
  const TensorInfo& sq = child(d, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC)->tensor;
  n.inputs = {x};
  n.outputs = {sum, sq};
  std::vector<int64_t> expect(x.dims.size(), 1);
  if (x.dims.size() >= 2) expect[1] = x.dims[1];
  if (x.dims.size() < 2 || sum.dims != expect || sq.dims != expect) {
    return fail(CUDNN_STATUS_BAD_PARAM,
                where(d) + ": the sums of x " + dimsText(x.dims) + " are " + dimsText(expect) + " (one per channel)");
  }
  if (sum.type != CUDNN_DATA_FLOAT || sq.type != CUDNN_DATA_FLOAT) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where(d) + ": the sums must be FLOAT");
  }
  return CUDNN_STATUS_SUCCESS;
}

// The batch norm's backward weights: inputs x, dy [N,C,...] and mean, invStd, scale; outputs
// dScale, dBias, eqDy, eqX, eqBias; the per-channel ones [1,C,1,...] FLOAT (see cudnn.h).
cudnnStatus_t finalizeBnBackwardWeights(Desc& d) {
  NodeInfo& n = d.node;
  n.kind = NodeKind::BnBwdWeights;
  const cudnnDataType_t prec =
      value<cudnnDataType_t>(d, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC, CUDNN_DATA_FLOAT);
  if (prec != CUDNN_DATA_FLOAT)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where(d) + ": the math precision must be FLOAT");
  auto t = [&](cudnnBackendAttributeName_t name) { return child(d, name)->tensor; };
  const TensorInfo x = t(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC);
  const TensorInfo dy = t(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC);
  n.inputs = {x, dy, t(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC),
              t(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC), t(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC)};
  n.outputs = {t(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC),
               t(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC),
               t(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC),
               t(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC), t(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS)};
  if (x.dims.size() < 2 || dy.dims != x.dims) {
    return fail(CUDNN_STATUS_BAD_PARAM,
                where(d) + ": x " + dimsText(x.dims) + " and dy " + dimsText(dy.dims) + " must match, [N,C,...]");
  }
  std::vector<int64_t> perChannel(x.dims.size(), 1);
  perChannel[1] = x.dims[1];
  for (size_t i = 2; i < n.inputs.size() + n.outputs.size(); ++i) {
    const TensorInfo& v = i < n.inputs.size() ? n.inputs[i] : n.outputs[i - n.inputs.size()];
    if (v.dims != perChannel || v.type != CUDNN_DATA_FLOAT) {
      return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": mean, inverse std, scale and the outputs must be FLOAT " +
                                              dimsText(perChannel) + " (one per channel of x), got " +
                                              dimsText(v.dims));
    }
  }
  std::set<int64_t> outs;
  for (const TensorInfo& o : n.outputs) outs.insert(o.uid);
  if (outs.size() != n.outputs.size()) {
    return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": the five outputs need five unique ids");
  }
  for (const TensorInfo& in : n.inputs) {
    if (outs.count(in.uid) != 0)
      return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": an output has the unique id of an input");
  }
  return CUDNN_STATUS_SUCCESS;
}

// Orders the operations so that each runs after those producing its inputs; checks that unique
// ids name one tensor each, that each tensor has one producer, and that virtual tensors are made.
cudnnStatus_t finalizeGraph(Desc& d) {
  d.handle = value<cudnnHandle_t>(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, nullptr);
  if (d.handle == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": the handle is null");
  auto graph = std::make_shared<GraphInfo>();
  std::vector<NodeInfo> pending;
  for (cudnnBackendDescriptor_t op : values<cudnnBackendDescriptor_t>(d, CUDNN_ATTR_OPERATIONGRAPH_OPS)) {
    pending.push_back(static_cast<const Desc*>(op)->node);
  }
  std::map<int64_t, TensorInfo> byUid;
  std::map<int64_t, int> producers;
  auto note = [&](const TensorInfo& t) -> cudnnStatus_t {
    auto it = byUid.find(t.uid);
    if (it == byUid.end()) {
      byUid[t.uid] = t;
      if (!t.isVirtual) graph->io.push_back(t);
    } else if (!it->second.sameAs(t)) {
      return fail(CUDNN_STATUS_BAD_PARAM,
                  where(d) + ": unique id " + std::to_string(t.uid) + " names two different tensors");
    }
    return CUDNN_STATUS_SUCCESS;
  };
  for (const NodeInfo& n : pending) {
    for (const TensorInfo& t : n.inputs) RC_GRAPH_TRY(note(t));
    for (const TensorInfo& t : n.outputs) {
      RC_GRAPH_TRY(note(t));
      if (++producers[t.uid] > 1) {
        return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": tensor " + std::to_string(t.uid) + " is written twice");
      }
    }
  }
  for (const NodeInfo& n : pending) {
    for (const TensorInfo& t : n.inputs) {
      if (t.isVirtual && producers.count(t.uid) == 0) {
        return fail(CUDNN_STATUS_BAD_PARAM,
                    where(d) + ": virtual tensor " + std::to_string(t.uid) + " is read but no operation writes it");
      }
    }
  }
  std::set<int64_t> ready;
  for (const auto& [uid, t] : byUid) {
    if (producers.count(uid) == 0) ready.insert(uid);
  }
  while (!pending.empty()) {
    auto next = std::find_if(pending.begin(), pending.end(), [&](const NodeInfo& n) {
      return std::all_of(n.inputs.begin(), n.inputs.end(), [&](const TensorInfo& t) { return ready.count(t.uid); });
    });
    if (next == pending.end()) {
      return fail(CUDNN_STATUS_NOT_SUPPORTED, where(d) + ": the operations form a cycle");
    }
    for (const TensorInfo& t : next->outputs) ready.insert(t.uid);
    graph->nodes.push_back(*next);
    pending.erase(next);
  }
  for (const auto& [uid, t] : byUid) {
    if (t.isVirtual) graph->workspaceBytes += t.numel() * static_cast<int64_t>(elementBytes(t.type));
  }
  d.graph = graph;
  return CUDNN_STATUS_SUCCESS;
}

// The fusion pattern of a graph as RESNET_CUDA_EMU_GRAPH_REFUSE names it: "dgrad-dbn" (a batch
// norm's backward weights node), "wgrad-sbr" (a backward filter convolution), "conv-sbr" (a forward
// convolution after pointwise nodes: the scale-bias-ReLU prologue), "conv-genstats" (a forward
// convolution with statistics), else "other".
std::string patternName(const GraphInfo& g) {
  bool bnBwd = false, wgrad = false, conv = false, pointwise = false, stats = false;
  for (const NodeInfo& n : g.nodes) {
    bnBwd |= n.kind == NodeKind::BnBwdWeights;
    wgrad |= n.kind == NodeKind::ConvBwdFilter;
    conv |= n.kind == NodeKind::Conv;
    pointwise |= n.kind == NodeKind::Pointwise;
    stats |= n.kind == NodeKind::GenStats;
  }
  if (bnBwd) return "dgrad-dbn";
  if (wgrad) return "wgrad-sbr";
  if (conv && pointwise) return "conv-sbr";
  if (conv && stats) return "conv-genstats";
  return "other";
}

// The I/O type of a graph: that of its first non-virtual tensor of a 16-bit type, else "f32".
std::string ioTypeName(const GraphInfo& g) {
  for (const TensorInfo& t : g.io) {
    if (t.type == CUDNN_DATA_BFLOAT16) return "bf16";
    if (t.type == CUDNN_DATA_HALF) return "f16";
  }
  return "f32";
}

// Whether RESNET_CUDA_EMU_GRAPH_REFUSE makes every engine refuse `g`: a comma-separated list of
// patterns, each a pattern name (see patternName) or "name:type" (bf16, f16, f32), e.g.
// "dgrad-dbn:bf16", as a real GPU's engines may refuse a graph; tests of the fallback set it. The
// variable is read at each plan's finalize.
bool refusedByEnvironment(const GraphInfo& g) {
  const char* text = std::getenv("RESNET_CUDA_EMU_GRAPH_REFUSE");
  if (text == nullptr || *text == '\0') return false;
  const std::string name = patternName(g), typed = name + ":" + ioTypeName(g);
  std::string list(text);
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(start, end - start);
    if (item == name || item == typed) return true;
    start = end + 1;
  }
  return false;
}

cudnnStatus_t finalizeEngine(Desc& d) {
  if (value<int64_t>(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, -1) != 0) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where(d) + ": the emulator has one engine, global index 0");
  }
  d.graph = child(d, CUDNN_ATTR_ENGINE_OPERATION_GRAPH)->graph;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize(Desc& d) {
  for (const AttrSpec& s : attrSpecs()) {
    if (s.desc == d.type && s.required && d.attrs.count(s.name) == 0) {
      return fail(CUDNN_STATUS_BAD_PARAM,
                  where(d) + ": required attribute " + std::to_string(static_cast<int>(s.name)) + " is not set");
    }
  }
  switch (d.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return finalizeTensor(d);
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: return finalizeConvolution(d);
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: return finalizePointwise(d);
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR: return finalizeConvForward(d);
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR: return finalizeConvBackwardData(d);
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR: return finalizeConvBackwardFilter(d);
    case CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR: return finalizeBnBackwardWeights(d);
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return finalizePointwiseOp(d);
    case CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR: return finalizeGenStats(d);
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return finalizeGraph(d);
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      d.graph = child(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)->graph;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: return finalizeEngine(d);
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      d.graph = child(d, CUDNN_ATTR_ENGINECFG_ENGINE)->graph;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      d.handle = value<cudnnHandle_t>(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, nullptr);
      if (d.handle == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": the handle is null");
      d.graph = child(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG)->graph;
      if (d.graph && refusedByEnvironment(*d.graph)) {
        return fail(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN,
                    where(d) + ": no engine supports the " + patternName(*d.graph) + " pattern with " +
                        ioTypeName(*d.graph) + " I/O (refused by RESNET_CUDA_EMU_GRAPH_REFUSE)");
      }
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      d.packUids = values<int64_t>(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
      d.packPointers = values<void*>(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
      d.packWorkspace = value<void*>(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, nullptr);
      if (d.packUids.size() != d.packPointers.size()) {
        return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": " + std::to_string(d.packUids.size()) + " unique ids but " +
                                                std::to_string(d.packPointers.size()) + " data pointers");
      }
      return CUDNN_STATUS_SUCCESS;
    default: return fail(CUDNN_STATUS_NOT_SUPPORTED, where(d) + ": not an emulated descriptor type");
  }
}

// ---- the interpreter (runs when the stream runs) ------------------------------------------------

using Values = std::map<int64_t, std::vector<double>>;

void convolve(const NodeInfo& n, const std::vector<double>& x, const std::vector<double>& w, std::vector<double>& y) {
  const TensorInfo &xt = n.inputs[0], &wt = n.inputs[1], &yt = n.outputs[0];
  const int64_t N = xt.dims[0], C = xt.dims[1], H = xt.dims[2], W = xt.dims[3];
  const int64_t K = wt.dims[0], R = wt.dims[2], S = wt.dims[3], P = yt.dims[2], Q = yt.dims[3];
  const ConvInfo& c = n.conv;
  for (int64_t in = 0; in < N; ++in) {
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t q = 0; q < Q; ++q) {
          double acc = 0.0;
          for (int64_t r = 0; r < R; ++r) {
            const int64_t h = p * c.strides[0] - c.prePad[0] + r * c.dilations[0];
            if (h < 0 || h >= H) continue;
            for (int64_t s = 0; s < S; ++s) {
              const int64_t ww = q * c.strides[1] - c.prePad[1] + s * c.dilations[1];
              if (ww < 0 || ww >= W) continue;
              for (int64_t ch = 0; ch < C; ++ch) {
                acc += x[((in * C + ch) * H + h) * W + ww] * w[((k * C + ch) * R + r) * S + s];
              }
            }
          }
          double& out = y[((in * K + k) * P + p) * Q + q];
          out = n.alpha * acc + (n.beta != 0.0 ? n.beta * out : 0.0);
        }
      }
    }
  }
}

// Calls f(n, k, p, q, c, h, w, r, s) for every product term of conv(x, w) = y: y[n,k,p,q] +=
// x[n,c,h,w] * w[k,c,r,s]; the dims are the forward's (x [N,C,H,W], w [K,C,R,S], y [N,K,P,Q]).
template <typename F>
void forEachConvTerm(const ConvInfo& c, const std::vector<int64_t>& xd, const std::vector<int64_t>& wd,
                     const std::vector<int64_t>& yd, F&& f) {
  const int64_t N = xd[0], C = xd[1], H = xd[2], W = xd[3];
  const int64_t K = wd[0], R = wd[2], S = wd[3], P = yd[2], Q = yd[3];
  for (int64_t in = 0; in < N; ++in) {
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t q = 0; q < Q; ++q) {
          for (int64_t r = 0; r < R; ++r) {
            const int64_t h = p * c.strides[0] - c.prePad[0] + r * c.dilations[0];
            if (h < 0 || h >= H) continue;
            for (int64_t s = 0; s < S; ++s) {
              const int64_t ww = q * c.strides[1] - c.prePad[1] + s * c.dilations[1];
              if (ww < 0 || ww >= W) continue;
              for (int64_t ch = 0; ch < C; ++ch) {
                f(((in * C + ch) * H + h) * W + ww, ((k * C + ch) * R + r) * S + s, ((in * K + k) * P + p) * Q + q);
              }
            }
          }
        }
      }
    }
  }
}

// out = alpha * acc + beta * out (out not read when beta == 0).
void blend(const NodeInfo& n, const std::vector<double>& acc, std::vector<double>& out) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = n.alpha * acc[i] + (n.beta != 0.0 ? n.beta * out[i] : 0.0);
}

// dx = convolution backward data of dy with w (inputs dy, w; output dx, the forward's x).
void convolveBackwardData(const NodeInfo& n, const std::vector<double>& dy, const std::vector<double>& w,
                          std::vector<double>& dx) {
  std::vector<double> acc(dx.size(), 0.0);
  forEachConvTerm(n.conv, n.outputs[0].dims, n.inputs[1].dims, n.inputs[0].dims,
                  [&](int64_t xi, int64_t wi, int64_t yi) { acc[xi] += dy[yi] * w[wi]; });
  blend(n, acc, dx);
}

// dw = convolution backward filter of x with dy (inputs x, dy; output dw, the forward's w).
void convolveBackwardFilter(const NodeInfo& n, const std::vector<double>& x, const std::vector<double>& dy,
                            std::vector<double>& dw) {
  std::vector<double> acc(dw.size(), 0.0);
  forEachConvTerm(n.conv, n.inputs[0].dims, n.outputs[0].dims, n.inputs[1].dims,
                  [&](int64_t xi, int64_t wi, int64_t yi) { acc[wi] += x[xi] * dy[yi]; });
  blend(n, acc, dw);
}

// The batch norm's backward weights (see cudnn.h), per channel over all other dimensions.
void bnBackwardWeights(const NodeInfo& n, const Values& v, std::vector<std::vector<double>>& outs) {
  const TensorInfo& xt = n.inputs[0];
  const std::vector<double>& x = v.at(xt.uid);
  const std::vector<double>& dy = v.at(n.inputs[1].uid);
  const std::vector<double>& mean = v.at(n.inputs[2].uid);
  const std::vector<double>& invStd = v.at(n.inputs[3].uid);
  const std::vector<double>& scale = v.at(n.inputs[4].uid);
  const int64_t C = xt.dims[1];
  int64_t inner = 1;
  for (size_t d = 2; d < xt.dims.size(); ++d) inner *= xt.dims[d];
  const double m = static_cast<double>(xt.numel() / C);
  std::vector<double> sumDy(static_cast<size_t>(C), 0.0), sumDyXc(static_cast<size_t>(C), 0.0);
  for (int64_t i = 0; i < xt.numel(); ++i) {
    const int64_t ch = (i / inner) % C;
    sumDy[ch] += dy[i];
    sumDyXc[ch] += dy[i] * (x[i] - mean[ch]);
  }
  for (int64_t ch = 0; ch < C; ++ch) {
    const double is = invStd[ch], eqDy = scale[ch] * is, eqX = -scale[ch] * is * is * is * sumDyXc[ch] / m;
    outs[0][ch] = sumDyXc[ch] * is;
    outs[1][ch] = sumDy[ch];
    outs[2][ch] = eqDy;
    outs[3][ch] = eqX;
    outs[4][ch] = -eqX * mean[ch] - eqDy * sumDy[ch] / m;
  }
}

// The dense index into `t` (which broadcasts to `y`) of dense index `i` of y.
int64_t broadcastIndex(const TensorInfo& t, const TensorInfo& y, int64_t i) {
  int64_t out = 0, scale = 1;
  for (size_t d = y.dims.size(); d-- > 0;) {
    const int64_t idx = i % y.dims[d];
    i /= y.dims[d];
    if (t.dims[d] != 1) out += idx * scale;
    scale *= t.dims[d];
  }
  return out;
}

void pointwise(const NodeInfo& n, const Values& v, std::vector<double>& y) {
  const TensorInfo& yt = n.outputs[0];
  const std::vector<double>& x = v.at(n.inputs[0].uid);
  if (n.mode == CUDNN_POINTWISE_RELU_BWD) {
    const std::vector<double>& dy = v.at(n.inputs[1].uid);
    for (int64_t i = 0; i < yt.numel(); ++i) y[i] = x[i] > 0.0 ? dy[i] : 0.0;
    return;
  }
  const std::vector<double>* b = n.inputs.size() > 1 ? &v.at(n.inputs[1].uid) : nullptr;
  for (int64_t i = 0; i < yt.numel(); ++i) {
    const double a = n.alpha * x[broadcastIndex(n.inputs[0], yt, i)];
    switch (n.mode) {
      case CUDNN_POINTWISE_ADD: y[i] = a + n.beta * (*b)[broadcastIndex(n.inputs[1], yt, i)]; break;
      case CUDNN_POINTWISE_MUL: y[i] = a * (n.beta * (*b)[broadcastIndex(n.inputs[1], yt, i)]); break;
      default: y[i] = a > 0.0 ? a : 0.0; break;
    }
  }
}

void genStats(const NodeInfo& n, const std::vector<double>& x, std::vector<double>& sum, std::vector<double>& sq) {
  const TensorInfo& xt = n.inputs[0];
  const int64_t C = xt.dims[1];
  int64_t inner = 1;
  for (size_t d = 2; d < xt.dims.size(); ++d) inner *= xt.dims[d];
  std::fill(sum.begin(), sum.end(), 0.0);
  std::fill(sq.begin(), sq.end(), 0.0);
  for (int64_t i = 0; i < xt.numel(); ++i) {
    const int64_t ch = (i / inner) % C;
    sum[ch] += x[i];
    sq[ch] += x[i] * x[i];
  }
}

void interpret(const GraphInfo& g, const std::map<int64_t, void*>& pointers, void* workspace) {
  Values v;
  for (const TensorInfo& t : g.io) {
    std::vector<double> dense(static_cast<size_t>(t.numel()));
    const void* base = pointers.at(t.uid);
    for (int64_t i = 0; i < t.numel(); ++i) dense[i] = load(t.type, base, t.offsetOf(i));
    v[t.uid] = std::move(dense);
  }
  for (const NodeInfo& n : g.nodes) {
    std::vector<std::vector<double>> outs;
    for (const TensorInfo& t : n.outputs) {
      auto it = v.find(t.uid);
      outs.push_back(it != v.end() ? it->second : std::vector<double>(static_cast<size_t>(t.numel()), 0.0));
    }
    switch (n.kind) {
      case NodeKind::Conv: convolve(n, v.at(n.inputs[0].uid), v.at(n.inputs[1].uid), outs[0]); break;
      case NodeKind::Pointwise: pointwise(n, v, outs[0]); break;
      case NodeKind::GenStats: genStats(n, v.at(n.inputs[0].uid), outs[0], outs[1]); break;
      case NodeKind::ConvBwdData: convolveBackwardData(n, v.at(n.inputs[0].uid), v.at(n.inputs[1].uid), outs[0]); break;
      case NodeKind::ConvBwdFilter:
        convolveBackwardFilter(n, v.at(n.inputs[0].uid), v.at(n.inputs[1].uid), outs[0]);
        break;
      case NodeKind::BnBwdWeights: bnBackwardWeights(n, v, outs); break;
    }
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      const TensorInfo& t = n.outputs[o];
      for (double& e : outs[o]) e = roundTo(t.type, e);
      if (!t.isVirtual) {
        void* base = pointers.at(t.uid);
        for (int64_t i = 0; i < t.numel(); ++i) store(t.type, base, t.offsetOf(i), outs[o][i]);
      }
      v[t.uid] = std::move(outs[o]);
    }
  }
  // The engine keeps the virtual tensors in its workspace: what was there is overwritten.
  if (g.workspaceBytes > 0) std::memset(workspace, rc_emu::kUninitializedByte, static_cast<size_t>(g.workspaceBytes));
}

// ---- argument checks shared by the entry points ------------------------------------------------

cudnnStatus_t checkLive(const char* call, const void* d) {
  if (d == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": the descriptor is null");
  if (!live(d)) return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": not a live backend descriptor");
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t checkElements(const AttrSpec& s, int64_t count, const void* elements) {
  if (s.type != CUDNN_TYPE_BACKEND_DESCRIPTOR) return CUDNN_STATUS_SUCCESS;
  const auto* list = static_cast<const cudnnBackendDescriptor_t*>(elements);
  for (int64_t i = 0; i < count; ++i) {
    if (list[i] == nullptr || !live(list[i])) {
      return fail(CUDNN_STATUS_BAD_PARAM,
                  "cudnnBackendSetAttribute: element " + std::to_string(i) + " is not a live backend descriptor");
    }
    const Desc& e = *static_cast<const Desc*>(list[i]);
    const bool typeOk = s.elementType == kAnyOperation ? isOperation(e.type) : e.type == s.elementType;
    if (!typeOk) {
      return fail(CUDNN_STATUS_BAD_PARAM, std::string("cudnnBackendSetAttribute: element ") + std::to_string(i) +
                                              " is a " + typeName(e.type) +
                                              " descriptor, which this attribute does "
                                              "not take");
    }
    if (s.elementFinalized && !e.finalized) {
      return fail(CUDNN_STATUS_BAD_PARAM, std::string("cudnnBackendSetAttribute: the ") + typeName(e.type) +
                                              " descriptor given is not finalized");
    }
  }
  return CUDNN_STATUS_SUCCESS;
}

// Writes one finalized engine configuration of `graph` into the caller's ENGINECFG descriptor.
cudnnStatus_t fillEngineConfig(cudnnBackendDescriptor_t out, const std::shared_ptr<const GraphInfo>& graph) {
  RC_GRAPH_TRY(checkLive("cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)", out));
  Desc& cfg = *static_cast<Desc*>(out);
  if (cfg.type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) {
    return fail(CUDNN_STATUS_BAD_PARAM,
                "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS): the results are ENGINECFG "
                "descriptors the caller created");
  }
  cfg.graph = graph;
  cfg.finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

// ---- entry points -----------------------------------------------------------------------------

extern "C" cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                                      cudnnBackendDescriptor_t* descriptor) {
  if (descriptor == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendCreateDescriptor: descriptor is null");
  if (typeName(descriptorType) == nullptr) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendCreateDescriptor: descriptor type " +
                                                std::to_string(static_cast<int>(descriptorType)) + " is not emulated");
  }
  Desc* d = new (std::nothrow) Desc();
  if (d == nullptr) return fail(CUDNN_STATUS_ALLOC_FAILED, "cudnnBackendCreateDescriptor: out of host memory");
  d->type = descriptorType;
  {
    std::lock_guard<std::mutex> lock(gLiveMutex);
    gLive.insert(d);
  }
  *descriptor = d;
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  RC_GRAPH_TRY(checkLive("cudnnBackendDestroyDescriptor", descriptor));
  Desc* d = static_cast<Desc*>(descriptor);
  {
    std::lock_guard<std::mutex> lock(gLiveMutex);
    gLive.erase(d);
  }
  delete d;
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                                  cudnnBackendAttributeName_t attributeName,
                                                  cudnnBackendAttributeType_t attributeType, int64_t elementCount,
                                                  const void* arrayOfElements) {
  RC_GRAPH_TRY(checkLive("cudnnBackendSetAttribute", descriptor));
  Desc& d = *static_cast<Desc*>(descriptor);
  const std::string call = std::string("cudnnBackendSetAttribute(") + typeName(d.type) + ", attribute " +
                           std::to_string(static_cast<int>(attributeName)) + ")";
  if (d.finalized) return fail(CUDNN_STATUS_NOT_INITIALIZED, call + ": the descriptor is already finalized");
  const AttrSpec* s = findSpec(d.type, attributeName);
  if (s == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, call + ": not an attribute of this descriptor type");
  if (s->type != attributeType) {
    return fail(CUDNN_STATUS_BAD_PARAM, call + ": attribute type " + std::to_string(static_cast<int>(attributeType)) +
                                            " given, " + std::to_string(static_cast<int>(s->type)) + " expected");
  }
  if (elementCount < s->minCount || elementCount > s->maxCount) {
    return fail(CUDNN_STATUS_BAD_PARAM, call + ": " + std::to_string(elementCount) + " elements, not " +
                                            std::to_string(s->minCount) + " to " + std::to_string(s->maxCount));
  }
  if (elementCount > 0 && arrayOfElements == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, call + ": the array is null");
  RC_GRAPH_TRY(checkElements(*s, elementCount, arrayOfElements));
  Attr a;
  a.type = attributeType;
  a.count = elementCount;
  const size_t bytes = static_cast<size_t>(elementCount) * attrElementBytes(attributeType);
  a.bytes.resize(bytes);
  if (bytes > 0) std::memcpy(a.bytes.data(), arrayOfElements, bytes);
  d.attrs[attributeName] = std::move(a);
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  RC_GRAPH_TRY(checkLive("cudnnBackendFinalize", descriptor));
  Desc& d = *static_cast<Desc*>(descriptor);
  if (d.finalized) return fail(CUDNN_STATUS_BAD_PARAM, where(d) + ": already finalized");
  RC_GRAPH_TRY(finalize(d));
  d.finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

extern "C" cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                                  cudnnBackendAttributeName_t attributeName,
                                                  cudnnBackendAttributeType_t attributeType,
                                                  int64_t requestedElementCount, int64_t* elementCount,
                                                  void* arrayOfElements) {
  RC_GRAPH_TRY(checkLive("cudnnBackendGetAttribute", descriptor));
  const Desc& d = *static_cast<const Desc*>(descriptor);
  const std::string call = std::string("cudnnBackendGetAttribute(") + typeName(d.type) + ", attribute " +
                           std::to_string(static_cast<int>(attributeName)) + ")";
  if (!d.finalized) return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, call + ": the descriptor is not finalized");
  if (requestedElementCount < 0 || (requestedElementCount > 0 && arrayOfElements == nullptr)) {
    return fail(CUDNN_STATUS_BAD_PARAM, call + ": a negative count or a null array");
  }
  auto scalar = [&](cudnnBackendAttributeType_t type, int64_t v) -> cudnnStatus_t {
    if (attributeType != type) return fail(CUDNN_STATUS_BAD_PARAM, call + ": the wrong attribute type");
    if (elementCount != nullptr) *elementCount = 1;
    if (requestedElementCount >= 1) *static_cast<int64_t*>(arrayOfElements) = v;
    return CUDNN_STATUS_SUCCESS;
  };
  if (d.type == CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR &&
      attributeName == CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT) {
    return scalar(CUDNN_TYPE_INT64, 1);
  }
  if (d.type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR && attributeName == CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE) {
    return scalar(CUDNN_TYPE_INT64, d.graph->workspaceBytes);
  }
  if (d.type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && attributeName == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
    return scalar(CUDNN_TYPE_INT64, d.graph->workspaceBytes);
  }
  if (d.type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && attributeName == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
    if (attributeType != CUDNN_TYPE_BACKEND_DESCRIPTOR) {
      return fail(CUDNN_STATUS_BAD_PARAM, call + ": the results are BACKEND_DESCRIPTOR elements");
    }
    if (elementCount != nullptr) *elementCount = 1;
    if (requestedElementCount >= 1) {
      RC_GRAPH_TRY(fillEngineConfig(static_cast<cudnnBackendDescriptor_t*>(arrayOfElements)[0], d.graph));
    }
    return CUDNN_STATUS_SUCCESS;
  }
  return fail(CUDNN_STATUS_NOT_SUPPORTED, call + ": the emulator does not report this attribute");
}

extern "C" cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                             cudnnBackendDescriptor_t variantPack) {
  const char* call = "cudnnBackendExecute";
  if (handle == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": the handle is null");
  RC_GRAPH_TRY(checkLive(call, executionPlan));
  RC_GRAPH_TRY(checkLive(call, variantPack));
  const Desc& plan = *static_cast<const Desc*>(executionPlan);
  const Desc& pack = *static_cast<const Desc*>(variantPack);
  if (plan.type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || pack.type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) {
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": an EXECUTION_PLAN and a VARIANT_PACK are expected");
  }
  if (!plan.finalized || !pack.finalized) {
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": the plan or the variant pack is not finalized");
  }
  std::map<int64_t, void*> pointers;
  for (size_t i = 0; i < pack.packUids.size(); ++i) pointers[pack.packUids[i]] = pack.packPointers[i];
  std::vector<std::pair<const void*, size_t>> buffers;
  for (const TensorInfo& t : plan.graph->io) {
    auto it = pointers.find(t.uid);
    if (it == pointers.end()) {
      return fail(CUDNN_STATUS_BAD_PARAM,
                  std::string(call) + ": the variant pack has no pointer for tensor " + std::to_string(t.uid));
    }
    if (it->second == nullptr || !rc_emu::isDeviceRange(it->second, t.extentBytes())) {
      return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": the pointer of tensor " + std::to_string(t.uid) +
                                              " is not " + std::to_string(t.extentBytes()) + " bytes of device memory");
    }
    if (reinterpret_cast<uintptr_t>(it->second) % static_cast<uintptr_t>(t.alignment) != 0) {
      return fail(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, std::string(call) + ": the pointer of tensor " +
                                                                 std::to_string(t.uid) + " is not aligned to " +
                                                                 std::to_string(t.alignment) + " bytes");
    }
    buffers.emplace_back(it->second, t.extentBytes());
  }
  const auto wsBytes = static_cast<size_t>(plan.graph->workspaceBytes);
  if (wsBytes > 0) {
    if (pack.packWorkspace == nullptr || !rc_emu::isDeviceRange(pack.packWorkspace, wsBytes)) {
      return fail(CUDNN_STATUS_BAD_PARAM,
                  std::string(call) + ": the workspace is not " + std::to_string(wsBytes) + " bytes of device memory");
    }
    buffers.emplace_back(pack.packWorkspace, wsBytes);
  }
  cudaStream_t stream = nullptr;
  RC_GRAPH_TRY(cudnnGetStream(handle, &stream));
  std::shared_ptr<const GraphInfo> graph = plan.graph;
  void* workspace = pack.packWorkspace;
  auto op = [graph, pointers, workspace, buffers]() {
    for (const auto& [p, bytes] : buffers) {
      if (!rc_emu::isDeviceRange(p, bytes)) {
        rc_emu::deviceFault("cudnnBackendExecute: a buffer is no longer allocated device memory when it runs");
        return;
      }
    }
    try {
      interpret(*graph, pointers, workspace);
    } catch (const std::bad_alloc&) {
      rc_emu::deviceFault("cudnnBackendExecute: the emulator ran out of host memory");
    }
  };
  cudaError_t e = rc_emu::checkLaunchDevice(stream);
  if (e == cudaSuccess) e = rc_emu::enqueue(stream, std::move(op), call);
  if (e != cudaSuccess) {
    return fail(CUDNN_STATUS_EXECUTION_FAILED,
                std::string(call) + ": the work could not be queued (CUDA error " + std::to_string(e) + ")");
  }
  return CUDNN_STATUS_SUCCESS;
}
