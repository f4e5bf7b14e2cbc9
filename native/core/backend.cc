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

void Backend::dualBatchNormForward(const DualBatchNormForwardArgs&) {
  RC_THROW(code::kBackendUnavailable, "the dual batch norm is a fused path of CUDA devices; the "
                                          << info().name << " backend runs the two batch norms one after the other");
}

void Backend::dualBatchNormBackward(const DualBatchNormBackwardArgs&) {
  RC_THROW(code::kBackendUnavailable, "the dual batch norm is a fused path of CUDA devices; the "
                                          << info().name << " backend runs the two batch norms one after the other");
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

void Backend::convDgradDbn(const ConvDgradDbnArgs&) {
  RC_THROW(code::kBackendUnavailable, "conv dgrad dbn: the fused backward needs a CUDA device (cuDNN's graph API); the "
                                          << info().name << " backend runs the convolution and batch norm unfused");
}

void Backend::batchNormBackwardApply(const BatchNormBackwardApplyArgs&) {
  RC_THROW(code::kBackendUnavailable,
           "batch norm backward apply: part of the conv-bn fused path, which needs a CUDA device; the "
               << info().name << " backend runs batch norm unfused");
}

void Backend::convWgradSbr(const ConvWgradSbrArgs&) {
  RC_THROW(code::kBackendUnavailable, "conv wgrad sbr: the fused backward needs a CUDA device (cuDNN's graph API); the "
                                          << info().name << " backend runs the ReLU and the convolution unfused");
}

ConvBnSupport Backend::convBnSupport(const ConvBnSupportArgs&) {
  RC_THROW(code::kBackendUnavailable, "conv-bn support: the fused path needs a CUDA device (cuDNN's graph API); the "
                                          << info().name << " backend runs the convolution and batch norm unfused");
}

namespace {

// The unfused ops around an optimizer step, in the order a fused step replaces: the unscale and
// check before `step` (which then reads the gradients with factor 1), the scale update and the
// zeroing after it.
template <typename Args, typename Step>
void composeFusedStep(Backend& backend, const Args& a, const FusedStepEnd& end, Step step) {
  Args stepArgs = a;
  if (end.checkFinite) {
    UnscaleArgs unscale;
    unscale.grads = a.grads;
    unscale.foundInf = a.foundInf;
    unscale.segments = a.segments;
    unscale.invScale = a.gradScaleInv;
    if (end.scaleFromDevice) unscale.scale = end.scale;
    backend.unscaleAndCheck(unscale);
    stepArgs.gradScaleInv = 1.0f;
  }
  step(stepArgs);
  if (end.scale.defined()) backend.scalerUpdate(end.scalerUpdate(a.foundInf));
  if (end.zeroGrads) {
    for (const ArenaSegment& s : a.segments)
      if (s.count > 0) backend.fill(a.grads.view(s.offset, {s.count}), 0.0);
  }
}

}  // namespace

void Backend::fusedSgdStep(const FusedSgdArgs& a) {
  const SgdArgs& sgd = a;
  if (a.tablesOnly) return sgdStep(sgd);
  composeFusedStep(*this, sgd, a, [this](const SgdArgs& s) { sgdStep(s); });
}

void Backend::fusedAdamwStep(const FusedAdamWArgs& a) {
  const AdamWArgs& adamw = a;
  if (a.tablesOnly) return adamwStep(adamw);
  composeFusedStep(*this, adamw, a, [this](const AdamWArgs& s) { adamwStep(s); });
}

void Backend::fusedLambStep(const FusedLambArgs& a) {
  LambArgs lamb;
  static_cast<AdamWArgs&>(lamb) = a;
  if (a.tablesOnly) return lambStep(lamb);
  composeFusedStep(*this, static_cast<const AdamWArgs&>(lamb), a, [this](const AdamWArgs& s) {
    LambArgs step;
    static_cast<AdamWArgs&>(step) = s;
    lambStep(step);
  });
}

}  // namespace rc
