#include "backend.h"

#include <sstream>

#include "error.h"

namespace rc {

std::string Conv2dParams::str() const {
  std::ostringstream out;
  out << "conv2d x=" << dtypeName(dtype) << "[" << n << "," << h << "," << w << "," << c << "] w=[" << k << ","
      << kernelH << "," << kernelW << "," << c << "] stride=" << strideH << "x" << strideW << " pad=" << padH << "x"
      << padW << " dilation=" << dilationH << "x" << dilationW << (bias ? " bias" : "");
  return out.str();
}

std::string LinearParams::str() const {
  std::ostringstream text;
  text << "linear x=" << dtypeName(dtype) << "[" << n << "," << in << "] w=[" << out << "," << in << "]"
       << (bias ? " bias" : "");
  return text.str();
}

std::string Pool2dParams::str() const {
  std::ostringstream out;
  out << (kind == PoolKind::Max ? "maxpool2d" : "avgpool2d") << " x=" << dtypeName(dtype) << "[" << n << "," << h << ","
      << w << "," << c << "] kernel=" << kernelH << "x" << kernelW << " stride=" << strideH << "x" << strideW
      << " pad=" << padH << "x" << padW;
  return out.str();
}

Tensor Backend::empty(const Shape& shape, DType dtype) {
  RC_CHECK_ARG(supports(dtype), dtypeName(dtype) << " tensors are not supported on " << device().str());
  auto storage = std::make_shared<Storage>(&allocator(), device(), shapeBytes(shape, dtype));
  return Tensor(std::move(storage), 0, shape, dtype);
}

std::unique_ptr<JpegDecoder> Backend::createJpegDecoder() {
  RC_THROW(code::kBackendUnavailable, "decoding JPEGs on the device needs a CUDA device; the "
                                          << info().name << " backend decodes them with libjpeg-turbo on the CPU");
}

void Backend::convBnForward(const ConvBnForwardArgs&) {
  RC_THROW(code::kBackendUnavailable, "conv-bn: the fused convolution needs a CUDA device (cuDNN's graph API); the "
                                          << info().name << " backend runs the convolution and batch norm unfused");
}

void Backend::batchNormFinalize(const BatchNormFinalizeArgs&) {
  RC_THROW(code::kBackendUnavailable,
           "batch norm finalize: part of the conv-bn fused path, which needs a CUDA device; "
           "the "
               << info().name << " backend runs batch norm unfused");
}

void Backend::fusedSgdStep(const FusedSgdArgs& a) {
  SgdArgs sgd = a;
  if (a.checkFinite) {
    UnscaleArgs unscale;
    unscale.grads = a.grads;
    unscale.foundInf = a.foundInf;
    unscale.segments = a.segments;
    unscale.invScale = a.gradScaleInv;
    unscaleAndCheck(unscale);
    sgd.gradScaleInv = 1.0f;
  }
  sgdStep(sgd);
  if (a.scale.defined()) {
    const ScalerUpdateArgs update = a.scalerUpdate();
    scalerUpdate(update);
  }
  if (a.zeroGrads) {
    for (const ArenaSegment& s : a.segments)
      if (s.count > 0) fill(a.grads.view(s.offset, {s.count}), 0.0);
  }
}

}  // namespace rc
