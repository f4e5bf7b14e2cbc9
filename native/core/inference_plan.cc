#include "inference_plan.h"

#include <sstream>

#include "backend.h"
#include "error.h"

namespace rc {

namespace {

const char* opName(InferenceOp op) {
  switch (op) {
    case InferenceOp::Conv: return "conv";
    case InferenceOp::MaxPool: return "maxpool";
    case InferenceOp::GlobalAvgPool: return "globalavgpool";
    case InferenceOp::Linear: return "linear";
  }
  return "?";
}

// The shape a windowed node (convolution or max pooling) makes of an NHWC input.
Shape windowShape(const InferenceNode& node, size_t i, const Shape& in, int64_t channels) {
  RC_CHECK_ARG(node.kernelH >= 1 && node.kernelW >= 1 && node.strideH >= 1 && node.strideW >= 1 && node.padH >= 0 &&
                   node.padW >= 0 && node.dilationH >= 1 && node.dilationW >= 1,
               "inference node " << i << " (" << opName(node.op) << "): bad window " << node.kernelH << "x"
                                 << node.kernelW << " stride " << node.strideH << "x" << node.strideW << " pad "
                                 << node.padH << "x" << node.padW << " dilation " << node.dilationH << "x"
                                 << node.dilationW);
  const int64_t oh = windowOutputSize(in[1], node.kernelH, node.strideH, node.padH, node.dilationH);
  const int64_t ow = windowOutputSize(in[2], node.kernelW, node.strideW, node.padW, node.dilationW);
  RC_CHECK_ARG(oh >= 1 && ow >= 1, "inference node " << i << " (" << opName(node.op)
                                                     << "): the window does not fit its " << in[1] << "x" << in[2]
                                                     << " input");
  return {in[0], oh, ow, channels};
}

void checkSize(const std::vector<float>& v, size_t expected, size_t i, const char* what) {
  RC_CHECK_ARG(v.size() == expected,
               "inference node " << i << ": " << what << " has " << v.size() << " values, expected " << expected);
}

void checkQuantization(const InferenceNode& node, size_t i) {
  if (node.weightScales.empty()) return;
  checkSize(node.weightScales, static_cast<size_t>(node.outChannels), i, "weightScales");
  RC_CHECK_ARG(node.inputScale > 0, "inference node " << i << ": inputScale must be positive, got " << node.inputScale);
  for (float s : node.weightScales) {
    RC_CHECK_ARG(s > 0, "inference node " << i << ": weightScales must be positive, got " << s);
  }
}

}  // namespace

std::string InferencePlanParams::str() const {
  std::ostringstream s;
  s << "inference n=" << n << " h=" << h << " w=" << w << " c=" << c << " dtype=" << dtypeName(dtype)
    << (int8 ? " int8" : "") << " nodes=" << nodes.size();
  return s.str();
}

std::vector<Shape> inferenceValueShapes(const InferencePlanParams& p) {
  RC_CHECK_ARG(p.n >= 1 && p.h >= 1 && p.w >= 1 && p.c >= 1,
               "inference plan: the input must be [n, h, w, c] with every size positive, got ["
                   << p.n << ", " << p.h << ", " << p.w << ", " << p.c << "]");
  RC_CHECK_ARG(!p.nodes.empty(), "inference plan: no nodes");
  std::vector<Shape> shapes{{p.n, p.h, p.w, p.c}};
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const InferenceNode& node = p.nodes[i];
    RC_CHECK_ARG(node.input >= 0 && node.input <= static_cast<int64_t>(i),
                 "inference node " << i << ": input value " << node.input << " is not computed before it");
    const Shape& in = shapes[node.input];
    const bool image = in.size() == 4;
    switch (node.op) {
      case InferenceOp::Conv: {
        RC_CHECK_ARG(image && in[3] == node.inChannels, "inference node " << i << " (conv): expects NHWC input of "
                                                                          << node.inChannels << " channels, got "
                                                                          << shapeStr(in));
        RC_CHECK_ARG(node.outChannels >= 1, "inference node " << i << " (conv): outChannels must be positive");
        checkSize(node.weight, static_cast<size_t>(node.outChannels * node.kernelH * node.kernelW * node.inChannels), i,
                  "the conv weight");
        checkSize(node.bias, static_cast<size_t>(node.outChannels), i, "the conv bias");
        checkQuantization(node, i);
        Shape out = windowShape(node, i, in, node.outChannels);
        if (node.residual >= 0) {
          RC_CHECK_ARG(node.residual <= static_cast<int64_t>(i) && shapes[node.residual] == out,
                       "inference node " << i << " (conv): the residual value " << node.residual
                                         << " must be computed before it and have the output's shape "
                                         << shapeStr(out));
        }
        shapes.push_back(out);
        break;
      }
      case InferenceOp::MaxPool:
        RC_CHECK_ARG(image, "inference node " << i << " (maxpool): expects an NHWC input, got " << shapeStr(in));
        shapes.push_back(windowShape(node, i, in, in[3]));
        break;
      case InferenceOp::GlobalAvgPool:
        RC_CHECK_ARG(image, "inference node " << i << " (globalavgpool): expects an NHWC input, got " << shapeStr(in));
        shapes.push_back({in[0], in[3]});
        break;
      case InferenceOp::Linear:
        RC_CHECK_ARG(!image && in[1] == node.inChannels, "inference node " << i << " (linear): expects [n, "
                                                                           << node.inChannels << "], got "
                                                                           << shapeStr(in));
        RC_CHECK_ARG(node.outChannels >= 1, "inference node " << i << " (linear): outFeatures must be positive");
        checkSize(node.weight, static_cast<size_t>(node.outChannels * node.inChannels), i, "the linear weight");
        checkSize(node.bias, static_cast<size_t>(node.outChannels), i, "the linear bias");
        checkQuantization(node, i);
        shapes.push_back({in[0], node.outChannels});
        break;
      default: RC_THROW(code::kInvalidArgument, "inference node " << i << ": unknown op " << static_cast<int>(node.op));
    }
    RC_CHECK_ARG(node.op == InferenceOp::Conv || node.residual < 0,
                 "inference node " << i << " (" << opName(node.op) << "): only convolutions take a residual");
  }
  RC_CHECK_ARG(shapes.back().size() == 2,
               "inference plan: the last node must give [n, classes], got " << shapeStr(shapes.back()));
  return shapes;
}

}  // namespace rc
