// The inference plan: a whole network lowered for deployment (lib/inference/graph.ts) and run in
// one call. Batch norm is already folded into the convolutions; each convolution carries its bias,
// an optional residual value added before the ReLU, and an optional ReLU, so a backend can run it
// as one fused call (oneDNN post-ops, cuDNN's convolution-bias-activation). Weights are host
// copies: a backend converts and lays them out once, when the plan is created.
//
// Values are numbered: value 0 is the input [n, h, w, c] (f32, NHWC), node i produces value i + 1,
// and the last node's value is the output [n, classes] (f32). Nodes read only earlier values.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dtype.h"
#include "tensor.h"

namespace rc {

enum class InferenceOp : int { Conv = 0, MaxPool = 1, GlobalAvgPool = 2, Linear = 3 };

struct InferenceNode {
  InferenceOp op = InferenceOp::Conv;
  int64_t input = 0;      // the value read
  int64_t residual = -1;  // conv: the value added before the ReLU, or -1
  bool relu = false;      // conv: a ReLU follows (after the residual add)
  // conv: input and output channels; linear: input and output features.
  int64_t inChannels = 0, outChannels = 0;
  // conv and max pooling windows.
  int64_t kernelH = 1, kernelW = 1, strideH = 1, strideW = 1, padH = 0, padW = 0, dilationH = 1, dilationW = 1;
  std::vector<float> weight;  // conv: [outChannels, kernelH, kernelW, inChannels] (OHWI); linear: [out, in]
  std::vector<float> bias;    // conv and linear: [outChannels]
  // INT8 (plans created with int8): the input is inputScale * q (q in u8 when inputUnsigned, else
  // s8), the weights of output channel k are weightScales[k] * q (q in s8). Empty weightScales: the
  // node runs in the plan's floating-point dtype.
  float inputScale = 0;
  bool inputUnsigned = false;
  std::vector<float> weightScales;
};

struct InferencePlanParams {
  int64_t n = 0, h = 0, w = 0, c = 0;  // the input, NHWC f32
  DType dtype = DType::F32;            // the floating-point compute dtype (F32, BF16 or F16)
  bool int8 = false;                   // nodes with weightScales run in INT8
  std::vector<InferenceNode> nodes;
  std::string str() const;
};

// The shapes of every value (index 0: the input), NHWC for images and [n, features] after global
// pooling. Throws ERR_RC_INVALID_ARGUMENT, naming the node, when the nodes do not fit together
// (value indices, channels, window sizes, weight and bias lengths, residual shapes, the output).
std::vector<Shape> inferenceValueShapes(const InferencePlanParams& params);

class InferencePlan {
 public:
  virtual ~InferencePlan() = default;
  // y[n, classes] (f32) = the network applied to x[n, h, w, c] (f32), both on the plan's device.
  virtual void run(const Tensor& x, const Tensor& y) = 0;
  // The implementation chosen, for logs and benchmarks ("onednn:nChw16c f32", "cudnn:fused").
  virtual std::string implementation() const = 0;
};

}  // namespace rc
