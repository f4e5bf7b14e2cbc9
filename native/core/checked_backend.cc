#include "checked_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "error.h"

namespace rc {

namespace {

int64_t channels(const Tensor& t) { return t.rank() == 0 ? 1 : t.dim(t.rank() - 1); }

void validateSameLayout(const Tensor& a, const Tensor& b, const char* op) {
  checkDefined(a, op, "input");
  checkDefined(b, op, "output");
  checkSameDevice(a, b, op);
  RC_CHECK_ARG(a.shape() == b.shape() && a.dtype() == b.dtype(),
               op << ": tensors must match in shape and dtype, got " << a.describe() << " and " << b.describe());
}

// cuDNN, cuBLAS and our pooling kernels take sizes as 32-bit ints, so every backend keeps to them;
// checked before any size is computed from them, which then cannot overflow 64 bits.
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();

void checkDims(std::initializer_list<int64_t> dims, const char* op, const std::string& params) {
  for (int64_t d : dims) {
    RC_CHECK_ARG(d <= kMaxDim,
                 op << ": every size must be at most " << kMaxDim << " (the libraries' 32-bit limit): " << params);
  }
}

// An activation plane (H*W) and one sample (H*W*C) are indexed with 32 bits by the kernels.
void checkPlane(int64_t h, int64_t w, int64_t c, const char* op, const std::string& params) {
  RC_CHECK_ARG(h * w * c <= kMaxDim, op << ": an input sample of " << h << "x" << w << "x" << c
                                        << " exceeds the libraries' 32-bit limit: " << params);
}

void validateConv2dParams(const Conv2dParams& p) {
  const char* op = "conv2d";
  RC_CHECK_ARG(p.n > 0 && p.h > 0 && p.w > 0 && p.c > 0 && p.k > 0 && p.kernelH > 0 && p.kernelW > 0,
               op << ": all sizes must be positive: " << p.str());
  RC_CHECK_ARG(p.strideH > 0 && p.strideW > 0 && p.dilationH > 0 && p.dilationW > 0 && p.padH >= 0 && p.padW >= 0,
               op << ": stride and dilation must be positive and padding non-negative: " << p.str());
  checkDims(
      {p.n, p.h, p.w, p.c, p.k, p.kernelH, p.kernelW, p.strideH, p.strideW, p.padH, p.padW, p.dilationH, p.dilationW},
      op, p.str());
  checkPlane(p.h, p.w, p.c, op, p.str());
  RC_CHECK_ARG(p.k * p.kernelH * p.kernelW * p.c <= kMaxDim,
               op << ": the filter exceeds the libraries' 32-bit limit: " << p.str());
  RC_CHECK_ARG(p.outH() > 0 && p.outW() > 0, op << ": the kernel does not fit the padded input: " << p.str());
  checkPlane(p.outH(), p.outW(), p.k, op, p.str());
  RC_CHECK_ARG(isFloating(p.dtype), op << ": dtype must be floating point, got " << dtypeName(p.dtype));
}

void validateLinearParams(const LinearParams& p) {
  const char* op = "linear";
  RC_CHECK_ARG(p.n > 0 && p.in > 0 && p.out > 0, op << ": all sizes must be positive: " << p.str());
  checkDims({p.n, p.in, p.out}, op, p.str());
  RC_CHECK_ARG(isFloating(p.dtype), op << ": dtype must be floating point, got " << dtypeName(p.dtype));
}

void validatePool2dParams(const Pool2dParams& p) {
  const char* op = "pool2d";
  RC_CHECK_ARG(p.n > 0 && p.h > 0 && p.w > 0 && p.c > 0 && p.kernelH > 0 && p.kernelW > 0 && p.strideH > 0 &&
                   p.strideW > 0 && p.padH >= 0 && p.padW >= 0,
               op << ": sizes and strides must be positive and padding non-negative: " << p.str());
  checkDims({p.n, p.h, p.w, p.c, p.kernelH, p.kernelW, p.strideH, p.strideW, p.padH, p.padW}, op, p.str());
  checkPlane(p.h, p.w, p.c, op, p.str());
  RC_CHECK_ARG(p.padH * 2 <= p.kernelH && p.padW * 2 <= p.kernelW,
               op << ": padding must be at most half the kernel: " << p.str());
  RC_CHECK_ARG(p.outH() > 0 && p.outW() > 0, op << ": the kernel does not fit the padded input: " << p.str());
  RC_CHECK_ARG(isFloating(p.dtype), op << ": dtype must be floating point, got " << dtypeName(p.dtype));
}

void validateBatchNormForward(const BatchNormForwardArgs& a) {
  const char* op = "batchnorm forward";
  checkDefined(a.x, op, "x");
  RC_CHECK_ARG(isFloating(a.x.dtype()), op << ": x must be floating point, got " << a.x.describe());
  validateSameLayout(a.x, a.y, op);
  if (a.residual.defined()) validateSameLayout(a.x, a.residual, op);
  const Shape c{channels(a.x)};
  for (const Tensor* t : {&a.gamma, &a.beta, &a.runningMean, &a.runningVar}) {
    checkDType(*t, DType::F32, op, "gamma, beta and running statistics");
    checkShape(*t, c, op, "gamma, beta and running statistics");
  }
  if (a.training || a.saveMean.defined() || a.saveInvStd.defined()) {
    checkShape(a.saveMean, c, op, "saveMean");
    checkShape(a.saveInvStd, c, op, "saveInvStd");
  }
  if (a.training) {
    RC_CHECK_ARG(a.x.numel() / c[0] > 1,
                 op << ": training needs more than one value per channel, got " << a.x.describe());
  }
}

// The convolution a fused op's arguments describe: x [N,H,W,C], a filter-shaped tensor [K,R,S,C]
// (the weight or its gradient) and the arguments' window, checked as conv2d's parameters.
template <typename Args>
Conv2dParams fusedConvParams(const Args& a, const Tensor& filter) {
  Conv2dParams p;
  p.n = a.x.dim(0), p.h = a.x.dim(1), p.w = a.x.dim(2), p.c = a.x.dim(3);
  p.k = filter.dim(0), p.kernelH = filter.dim(1), p.kernelW = filter.dim(2);
  p.strideH = a.strideH, p.strideW = a.strideW, p.padH = a.padH, p.padW = a.padW;
  p.dilationH = a.dilationH, p.dilationW = a.dilationW, p.dtype = a.x.dtype();
  validateConv2dParams(p);
  return p;
}

// The activations of the fused backward graphs: bf16 or f16.
void checkFusedBackwardActivations(const Tensor& x, const char* op) {
  RC_CHECK_ARG(x.dtype() == DType::BF16 || x.dtype() == DType::F16,
               op << ": x is " << dtypeName(x.dtype())
                  << "; the fused backward takes bf16 or f16 activations (cuDNN's runtime fusion engines fuse "
                     "16-bit convolutions); use the unfused path for f32");
}

void validateConvBnForward(const ConvBnForwardArgs& a) {
  const char* op = "conv-bn";
  checkDefined(a.x, op, "x");
  checkDefined(a.weight, op, "weight");
  checkDefined(a.y, op, "y");
  RC_CHECK_ARG(a.x.rank() == 4 && a.weight.rank() == 4 && a.y.rank() == 4,
               op << ": x, weight and y must be 4-D (NHWC, KRSC), got " << a.x.describe() << ", " << a.weight.describe()
                  << ", " << a.y.describe());
  const Conv2dParams p = fusedConvParams(a, a.weight);
  checkShape(a.weight, {p.k, p.kernelH, p.kernelW, p.c}, op, "weight");
  RC_CHECK_ARG(a.weight.dtype() == DType::F32 || a.weight.dtype() == a.x.dtype(),
               op << ": weight must be f32 or x's dtype, got " << a.weight.describe());
  checkShape(a.y, {p.n, p.outH(), p.outW(), p.k}, op, "y");
  checkDType(a.y, a.x.dtype(), op, "y");
  RC_CHECK_ARG(a.scale.defined() == a.shift.defined(), op << ": scale and shift come together");
  if (a.scale.defined()) {
    for (const Tensor* t : {&a.scale, &a.shift}) {
      checkDType(*t, DType::F32, op, "scale and shift");
      checkShape(*t, {p.c}, op, "scale and shift");
    }
  }
  RC_CHECK_ARG(a.sum.defined() == a.sqSum.defined(), op << ": sum and sqSum come together");
  if (a.sum.defined()) {
    for (const Tensor* t : {&a.sum, &a.sqSum}) {
      checkDType(*t, DType::F32, op, "sum and sqSum");
      checkShape(*t, {p.k}, op, "sum and sqSum");
    }
  }
}

// Whether the byte ranges of two defined tensors overlap.
bool overlaps(const Tensor& a, const Tensor& b) {
  const auto* pa = static_cast<const char*>(a.data());
  const auto* pb = static_cast<const char*>(b.data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()) % 16 == 0; }

// Every argument check of convDgradDbn (ConvDgradDbnArgs), the CUDA graph's constraints included:
// the fusion engines take 16-bit NHWC operands, 16-byte aligned, with channel counts that are
// multiples of 8.
void validateConvDgradDbn(const ConvDgradDbnArgs& a) {
  const char* op = "conv dgrad dbn";
  checkDefined(a.dy, op, "dy");
  checkDefined(a.weight, op, "weight");
  checkDefined(a.x, op, "x");
  checkDefined(a.dz, op, "dz");
  RC_CHECK_ARG(a.dy.rank() == 4 && a.weight.rank() == 4 && a.x.rank() == 4,
               op << ": dy, weight and x must be 4-D (NHWC, KRSC), got " << a.dy.describe() << ", "
                  << a.weight.describe() << ", " << a.x.describe());
  checkFusedBackwardActivations(a.x, op);
  const Conv2dParams p = fusedConvParams(a, a.weight);
  checkShape(a.weight, {p.k, p.kernelH, p.kernelW, p.c}, op, "weight");
  RC_CHECK_ARG(a.weight.dtype() == DType::F32 || a.weight.dtype() == a.x.dtype(),
               op << ": weight must be f32 or x's dtype, got " << a.weight.describe());
  checkShape(a.dy, {p.n, p.outH(), p.outW(), p.k}, op, "dy");
  checkDType(a.dy, a.x.dtype(), op, "dy");
  checkShape(a.dz, a.x.shape(), op, "dz");
  checkDType(a.dz, a.x.dtype(), op, "dz");
  RC_CHECK_ARG(p.c % 8 == 0 && p.k % 8 == 0, op << ": x's channels (" << p.c << ") and dy's channels (" << p.k
                                                << ") must be multiples of 8 for the fused backward");
  RC_CHECK_ARG(
      aligned16(a.dy) && aligned16(a.x) && aligned16(a.dz) && (a.weight.dtype() != a.x.dtype() || aligned16(a.weight)),
      op << ": dy, x, dz and the weights must be 16-byte aligned");
  RC_CHECK_ARG(!overlaps(a.dz, a.x) && !overlaps(a.dz, a.dy),
               op << ": dz must not share memory with x or dy (the graph reads them while it writes dz)");
  const Shape c{p.c};
  struct Named {
    const Tensor* t;
    const char* name;
  };
  for (const Named& v :
       {Named{&a.scale, "scale"}, Named{&a.shift, "shift"}, Named{&a.gamma, "gamma"}, Named{&a.saveMean, "saveMean"},
        Named{&a.saveInvStd, "saveInvStd"}, Named{&a.dGamma, "dGamma"}, Named{&a.dBeta, "dBeta"},
        Named{&a.eqDz, "eqDz"}, Named{&a.eqX, "eqX"}, Named{&a.eqBias, "eqBias"}}) {
    checkDefined(*v.t, op, v.name);
    checkDType(*v.t, DType::F32, op, v.name);
    checkShape(*v.t, c, op, v.name);
  }
}

// Every argument check of convBnSupport (ConvBnSupportArgs): a shape the fused ops take.
void validateConvBnSupport(const ConvBnSupportArgs& a) {
  RC_CHECK_ARG(a.dtype == DType::BF16 || a.dtype == DType::F16,
               "conv-bn support: dtype is " << dtypeName(a.dtype) << "; the fused path takes bf16 or f16");
  RC_CHECK_ARG(a.n > 0 && a.h > 0 && a.w > 0 && a.c > 0 && a.k > 0 && a.r > 0 && a.s > 0,
               "conv-bn support: n, h, w, c, k, kernelH and kernelW must be positive");
  RC_CHECK_ARG(a.c % 8 == 0 && a.k % 8 == 0, "conv-bn support: input channels ("
                                                 << a.c << ") and output channels (" << a.k
                                                 << ") must be multiples of 8 for the fused convolution");
  RC_CHECK_ARG(a.strideH > 0 && a.strideW > 0 && a.dilationH > 0 && a.dilationW > 0 && a.padH >= 0 && a.padW >= 0,
               "conv-bn support: strides and dilations must be positive and paddings non-negative");
  RC_CHECK_ARG(windowOutputSize(a.h, a.r, a.strideH, a.padH, a.dilationH) > 0 &&
                   windowOutputSize(a.w, a.s, a.strideW, a.padW, a.dilationW) > 0,
               "conv-bn support: the window (" << a.r << "x" << a.s << ") is larger than the padded input (" << a.h
                                               << "x" << a.w << ")");
}

// Every argument check of convWgradSbr (ConvWgradSbrArgs), the CUDA graph's constraints included.
void validateConvWgradSbr(const ConvWgradSbrArgs& a) {
  const char* op = "conv wgrad sbr";
  checkDefined(a.x, op, "x");
  checkDefined(a.dy, op, "dy");
  checkDefined(a.dWeight, op, "dWeight");
  RC_CHECK_ARG(a.x.rank() == 4 && a.dy.rank() == 4 && a.dWeight.rank() == 4,
               op << ": x, dy and dWeight must be 4-D (NHWC, KRSC), got " << a.x.describe() << ", " << a.dy.describe()
                  << ", " << a.dWeight.describe());
  checkFusedBackwardActivations(a.x, op);
  const Conv2dParams p = fusedConvParams(a, a.dWeight);
  checkShape(a.dWeight, {p.k, p.kernelH, p.kernelW, p.c}, op, "dWeight");
  checkDType(a.dWeight, DType::F32, op, "dWeight");
  checkShape(a.dy, {p.n, p.outH(), p.outW(), p.k}, op, "dy");
  checkDType(a.dy, a.x.dtype(), op, "dy");
  RC_CHECK_ARG(p.c % 8 == 0 && p.k % 8 == 0, op << ": x's channels (" << p.c << ") and dy's channels (" << p.k
                                                << ") must be multiples of 8 for the fused backward");
  RC_CHECK_ARG(aligned16(a.x) && aligned16(a.dy), op << ": x and dy must be 16-byte aligned");
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&a.scale, "scale"}, {&a.shift, "shift"}}) {
    checkDefined(*t, op, name);
    checkDType(*t, DType::F32, op, name);
    checkShape(*t, {p.c}, op, name);
  }
}

void validateBatchNormBackwardApply(const BatchNormBackwardApplyArgs& a) {
  const char* op = "batch norm backward apply";
  checkDefined(a.dz, op, "dz");
  checkDefined(a.x, op, "x");
  checkDefined(a.dx, op, "dx");
  RC_CHECK_ARG(isFloating(a.dz.dtype()) && a.dz.rank() >= 1,
               op << ": dz must be a floating point tensor [..., C], got " << a.dz.describe());
  checkShape(a.x, a.dz.shape(), op, "x");
  checkDType(a.x, a.dz.dtype(), op, "x");
  checkShape(a.dx, a.dz.shape(), op, "dx");
  checkDType(a.dx, a.dz.dtype(), op, "dx");
  RC_CHECK_ARG(a.dx.data() == a.dz.data() || !overlaps(a.dx, a.dz),
               op << ": dx must be dz itself or not share memory with it");
  RC_CHECK_ARG(!overlaps(a.dx, a.x), op << ": dx must not share memory with x");
  const Shape c{channels(a.dz)};
  for (const auto& [t, name] :
       {std::pair<const Tensor*, const char*>{&a.eqDz, "eqDz"}, {&a.eqX, "eqX"}, {&a.eqBias, "eqBias"}}) {
    checkDefined(*t, op, name);
    checkDType(*t, DType::F32, op, name);
    checkShape(*t, c, op, name);
  }
}

void validateBatchNormFinalize(const BatchNormFinalizeArgs& a) {
  const char* op = "batch norm finalize";
  checkDefined(a.sum, op, "sum");
  const Shape c{a.sum.numel()};
  for (const Tensor* t : {&a.sum, &a.sqSum, &a.gamma, &a.beta, &a.saveMean, &a.saveInvStd, &a.scale, &a.shift}) {
    checkDType(*t, DType::F32, op, "sums, gamma, beta and the outputs");
    checkShape(*t, c, op, "sums, gamma, beta and the outputs");
  }
  if (a.variance.defined()) {
    checkDType(a.variance, DType::F32, op, "variance");
    checkShape(a.variance, c, op, "variance");
  }
  RC_CHECK_ARG(a.runningMean.defined() == a.runningVar.defined(), op << ": runningMean and runningVar come together");
  if (a.runningMean.defined()) {
    for (const Tensor* t : {&a.runningMean, &a.runningVar}) {
      checkDType(*t, DType::F32, op, "running statistics");
      checkShape(*t, c, op, "running statistics");
    }
  }
  RC_CHECK_ARG(a.count > 1, op << ": count must be more than one value per channel, got " << a.count);
  RC_CHECK_ARG(a.eps > 0.0f, op << ": eps must be positive, got " << a.eps);
}

void validateBatchNormBackward(const BatchNormBackwardArgs& a) {
  const char* op = "batchnorm backward";
  checkDefined(a.x, op, "x");
  validateSameLayout(a.x, a.dy, op);
  validateSameLayout(a.x, a.dx, op);
  if (a.relu) validateSameLayout(a.x, a.y, op);
  if (a.dResidual.defined()) validateSameLayout(a.x, a.dResidual, op);
  const Shape c{channels(a.x)};
  for (const Tensor* t : {&a.gamma, &a.saveMean, &a.saveInvStd, &a.dGamma, &a.dBeta}) {
    checkDType(*t, DType::F32, op, "gamma, saved statistics and their gradients");
    checkShape(*t, c, op, "gamma, saved statistics and their gradients");
  }
  if (a.beta.defined()) {
    checkDType(a.beta, DType::F32, op, "beta");
    checkShape(a.beta, c, op, "beta");
  }
}

// Both sides of a dual batch norm: inputs of one layout (one shape and dtype), per-channel f32
// vectors of its channel count.
void validateDualSides(const Tensor& a, const Tensor& b, const char* op) {
  checkDefined(a, op, "a.x");
  checkDefined(b, op, "b.x");
  RC_CHECK_ARG(isFloating(a.dtype()) && a.rank() >= 1,
               op << ": a.x must be a floating point tensor [..., C], got " << a.describe());
  RC_CHECK_ARG(
      a.shape() == b.shape() && a.dtype() == b.dtype() && a.device() == b.device(),
      op << ": a.x and b.x must match in shape, dtype and device, got " << a.describe() << " and " << b.describe());
}

void validateDualBatchNormForward(const DualBatchNormForwardArgs& a) {
  const char* op = "dual batchnorm forward";
  validateDualSides(a.a.x, a.b.x, op);
  validateSameLayout(a.a.x, a.y, op);
  const Shape c{channels(a.a.x)};
  for (const DualBatchNormSide* s : {&a.a, &a.b}) {
    for (const Tensor* t : {&s->gamma, &s->beta, &s->runningMean, &s->runningVar}) {
      checkDType(*t, DType::F32, op, "gamma, beta and running statistics of both sides");
      checkShape(*t, c, op, "gamma, beta and running statistics of both sides");
    }
    if (a.training || s->saveMean.defined() || s->saveInvStd.defined()) {
      checkShape(s->saveMean, c, op, "saveMean");
      checkShape(s->saveInvStd, c, op, "saveInvStd");
    }
  }
  if (a.training) {
    RC_CHECK_ARG(a.a.x.numel() / c[0] > 1,
                 op << ": training needs more than one value per channel, got " << a.a.x.describe());
  }
}

void validateDualBatchNormBackward(const DualBatchNormBackwardArgs& a) {
  const char* op = "dual batchnorm backward";
  validateDualSides(a.a.x, a.b.x, op);
  validateSameLayout(a.a.x, a.dy, op);
  if (a.relu) validateSameLayout(a.a.x, a.y, op);
  const Shape c{channels(a.a.x)};
  for (const DualBatchNormGradSide* s : {&a.a, &a.b}) {
    validateSameLayout(a.a.x, s->dx, op);
    for (const Tensor* t : {&s->gamma, &s->saveMean, &s->saveInvStd, &s->dGamma, &s->dBeta}) {
      checkDType(*t, DType::F32, op, "gamma, saved statistics and their gradients of both sides");
      checkShape(*t, c, op, "gamma, saved statistics and their gradients of both sides");
    }
  }
  // One pass writes a.dx after it read a.x and b.x at the same place, then b.dx: a.dx may not be b.x.
  RC_CHECK_ARG(a.a.dx.data() != a.b.x.data(), op << ": a.dx must not be b.x (b.x is read after a.dx is written)");
}

// Checks the per-channel f32 tensors of the SyncBatchNorm ops against x's channel count.
void checkChannelVectors(std::initializer_list<const Tensor*> tensors, int64_t c, const char* op, const char* what) {
  for (const Tensor* t : tensors) {
    checkDType(*t, DType::F32, op, what);
    checkShape(*t, Shape{c}, op, what);
  }
}

void validateSyncBatchNormStats(const SyncBatchNormStatsArgs& a) {
  const char* op = "sync batchnorm stats";
  checkDefined(a.x, op, "x");
  RC_CHECK_ARG(isFloating(a.x.dtype()) && a.x.rank() >= 1 && a.x.numel() > 0,
               op << ": x must be a non-empty floating point tensor, got " << a.x.describe());
  checkDType(a.stats, DType::F32, op, "stats");
  checkShape(a.stats, Shape{3, channels(a.x)}, op, "stats ([3, C]: count, mean, M2)");
}

void validateSyncBatchNormForward(const SyncBatchNormForwardArgs& a) {
  const char* op = "sync batchnorm forward";
  checkDefined(a.x, op, "x");
  RC_CHECK_ARG(isFloating(a.x.dtype()) && a.x.rank() >= 1 && a.x.numel() > 0,
               op << ": x must be a non-empty floating point tensor, got " << a.x.describe());
  validateSameLayout(a.x, a.y, op);
  if (a.residual.defined()) validateSameLayout(a.x, a.residual, op);
  const int64_t c = channels(a.x);
  checkChannelVectors({&a.gamma, &a.beta, &a.runningMean, &a.runningVar, &a.saveMean, &a.saveInvStd}, c, op,
                      "gamma, beta, running and saved statistics");
  checkDefined(a.stats, op, "stats");
  checkDType(a.stats, DType::F32, op, "stats");
  RC_CHECK_ARG(a.stats.rank() == 3 && a.stats.dim(0) >= 1 && a.stats.dim(1) == 3 && a.stats.dim(2) == c,
               op << ": stats must be f32[worldSize, 3, " << c << "] (every rank's count, mean, M2), got "
                  << a.stats.describe());
}

void validateSyncBatchNormBackwardReduce(const SyncBatchNormBackwardReduceArgs& a) {
  const char* op = "sync batchnorm backward reduce";
  checkDefined(a.x, op, "x");
  RC_CHECK_ARG(isFloating(a.x.dtype()), op << ": x must be floating point, got " << a.x.describe());
  validateSameLayout(a.x, a.dy, op);
  if (a.relu) validateSameLayout(a.x, a.y, op);
  const int64_t c = channels(a.x);
  checkChannelVectors({&a.saveMean, &a.saveInvStd, &a.dGamma, &a.dBeta}, c, op,
                      "saved statistics and the gradients of gamma and beta");
  checkDType(a.sums, DType::F32, op, "sums");
  checkShape(a.sums, Shape{3, c}, op, "sums ([3, C]: sum(g), sum(g * xhat), count)");
}

void validateSyncBatchNormBackwardElementwise(const SyncBatchNormBackwardElementwiseArgs& a) {
  const char* op = "sync batchnorm backward elementwise";
  checkDefined(a.x, op, "x");
  RC_CHECK_ARG(isFloating(a.x.dtype()), op << ": x must be floating point, got " << a.x.describe());
  validateSameLayout(a.x, a.dy, op);
  validateSameLayout(a.x, a.dx, op);
  if (a.relu) validateSameLayout(a.x, a.y, op);
  if (a.dResidual.defined()) validateSameLayout(a.x, a.dResidual, op);
  const int64_t c = channels(a.x);
  checkChannelVectors({&a.gamma, &a.saveMean, &a.saveInvStd}, c, op, "gamma and the saved statistics");
  checkDType(a.sums, DType::F32, op, "sums");
  checkShape(a.sums, Shape{3, c}, op, "sums ([3, C]: sum(g), sum(g * xhat), count over all ranks)");
}

// A scalar that a CUDA kernel reads when it runs (a captured graph's changing value): f32[1] or
// i32[1], on a CUDA device (the CPU ops take their scalars as values).
void validateDeviceScalar(const Tensor& t, DType dtype, const char* op, const char* what) {
  checkDType(t, dtype, op, what);
  checkShape(t, Shape{1}, op, what);
  RC_CHECK_ARG(t.device().type == DeviceType::Cuda,
               op << ": " << what << " (a value read on the device, for CUDA graphs) needs a CUDA tensor, got "
                  << t.describe() << "; on the CPU pass the value itself");
}

void validateCrossEntropy(const CrossEntropyArgs& a) {
  const char* op = "cross entropy";
  checkDefined(a.logits, op, "logits");
  RC_CHECK_ARG(a.logits.rank() == 2 && isFloating(a.logits.dtype()),
               op << ": logits must be a floating [N, K] tensor, got " << a.logits.describe());
  checkDType(a.labels, DType::I32, op, "labels");
  checkShape(a.labels, Shape{a.logits.dim(0)}, op, "labels");
  checkDType(a.loss, DType::F32, op, "loss");
  checkShape(a.loss, Shape{1}, op, "loss");
  if (a.dLogits.defined()) validateSameLayout(a.logits, a.dLogits, op);
  RC_CHECK_ARG(a.labelSmoothing >= 0.0f && a.labelSmoothing <= 1.0f,
               op << ": labelSmoothing must be in [0, 1], got " << a.labelSmoothing);
  if (a.gradScaleFrom.defined()) validateDeviceScalar(a.gradScaleFrom, DType::F32, op, "gradScaleFrom");
}

void validateDistillation(const DistillationArgs& a) {
  const char* op = "distillation loss";
  checkDefined(a.logits, op, "logits");
  RC_CHECK_ARG(a.logits.rank() == 2 && isFloating(a.logits.dtype()),
               op << ": logits must be a floating [N, K] tensor, got " << a.logits.describe());
  checkDefined(a.teacherLogits, op, "teacherLogits");
  checkSameDevice(a.logits, a.teacherLogits, op);
  RC_CHECK_ARG(a.teacherLogits.shape() == a.logits.shape() && a.teacherLogits.dtype() == a.logits.dtype(),
               op << ": teacherLogits must match the student's logits in shape and dtype, got "
                  << a.teacherLogits.describe() << " and " << a.logits.describe());
  checkDType(a.labels, DType::I32, op, "labels");
  checkShape(a.labels, Shape{a.logits.dim(0)}, op, "labels");
  checkDType(a.loss, DType::F32, op, "loss");
  checkShape(a.loss, Shape{1}, op, "loss");
  if (a.dLogits.defined()) validateSameLayout(a.logits, a.dLogits, op);
  RC_CHECK_ARG(std::isfinite(a.temperature) && a.temperature > 0.0f,
               op << ": temperature must be a finite number > 0, got " << a.temperature);
  RC_CHECK_ARG(a.alpha >= 0.0f && a.alpha <= 1.0f, op << ": alpha must be in [0, 1], got " << a.alpha);
  RC_CHECK_ARG(a.labelSmoothing >= 0.0f && a.labelSmoothing <= 1.0f,
               op << ": labelSmoothing must be in [0, 1], got " << a.labelSmoothing);
}

// Segments must lie inside an arena of `numel` elements and not overlap (each parameter appears
// once); `groups` < 0 means the op has no groups and ignores the group field.
void validateSegments(const std::vector<ArenaSegment>& segments, int64_t numel, int64_t groups, const char* op) {
  for (const auto& s : segments) {
    RC_CHECK_ARG(s.offset >= 0 && s.count >= 0 && s.offset + s.count <= numel,
                 op << ": segment [" << s.offset << ", +" << s.count << ") is outside the arena of " << numel);
    RC_CHECK_ARG(groups < 0 || (s.group >= 0 && s.group < groups),
                 op << ": segment names group " << s.group << " of " << groups);
  }
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& s : segments) ranges.emplace_back(s.offset, s.offset + s.count);
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    RC_CHECK_ARG(ranges[i].first >= ranges[i - 1].second,
                 op << ": segments overlap at element " << ranges[i].first << "; each parameter may appear once");
  }
}

void validateFlag(const Tensor& t, DType dtype, const char* op, const char* what) {
  checkDType(t, dtype, op, what);
  checkShape(t, Shape{1}, op, what);
}

// The optional found-inf flag of the optimizer and norm ops: f32[1].
void validateOptionalFoundInf(const Tensor& flag, const char* op) {
  if (flag.defined()) validateFlag(flag, DType::F32, op, "foundInf");
}

void validateArenaTensor(const Tensor& t, const Tensor& params, const char* op, const char* what) {
  checkDType(t, DType::F32, op, what);
  RC_CHECK_ARG(t.numel() == params.numel(),
               op << ": " << what << " " << t.describe() << " does not match params " << params.describe());
}

void validateSgd(const SgdArgs& a, const char* op = "sgd step") {
  checkDType(a.params, DType::F32, op, "params");
  validateArenaTensor(a.grads, a.params, op, "grads");
  bool needsMomentum = false;
  for (const auto& g : a.groups) needsMomentum = needsMomentum || g.momentum != 0.0f;
  if (needsMomentum) validateArenaTensor(a.momentumBuffer, a.params, op, "momentumBuffer");
  validateSegments(a.segments, a.params.numel(), static_cast<int64_t>(a.groups.size()), op);
  validateOptionalFoundInf(a.foundInf, op);
  RC_CHECK_ARG(
      !a.tablesOnly || a.params.device().type == DeviceType::Cuda,
      op << ": tablesOnly (the tables of a captured CUDA graph) needs CUDA tensors, got " << a.params.describe());
}

void validateScalerUpdate(const ScalerUpdateArgs& a);

// FusedStepEnd's settings of the fused optimizer op `op`, whose found-inf flag is `foundInf`.
void validateFusedEnd(const FusedStepEnd& e, const Tensor& foundInf, const char* op) {
  RC_CHECK_ARG(!e.checkFinite || foundInf.defined(), op << ": checkFinite needs foundInf, the flag the check sets");
  RC_CHECK_ARG(e.scale.defined() == e.growthTracker.defined(),
               op << ": scale and growthTracker come together (the scaler update needs both)");
  RC_CHECK_ARG(!e.scaleFromDevice || (e.scale.defined() && e.checkFinite),
               op << ": scaleFromDevice needs scale and checkFinite (the unscale reads the scale as it checks)");
  if (e.scale.defined()) {
    RC_CHECK_ARG(foundInf.defined(), op << ": the scaler update (scale) needs foundInf");
    validateScalerUpdate(e.scalerUpdate(foundInf));
  }
}

void validateFusedSgd(const FusedSgdArgs& a) {
  const char* op = "fused sgd step";
  validateSgd(a, op);
  validateFusedEnd(a, a.foundInf, op);
}

void validateAdamW(const AdamWArgs& a, const char* op = "adamw step") {
  checkDType(a.params, DType::F32, op, "params");
  validateArenaTensor(a.grads, a.params, op, "grads");
  validateArenaTensor(a.expAvg, a.params, op, "expAvg");
  validateArenaTensor(a.expAvgSq, a.params, op, "expAvgSq");
  RC_CHECK_ARG(a.step >= 1, op << ": step must be at least 1 (the first step is 1), got " << a.step);
  for (size_t i = 0; i < a.groups.size(); ++i) {
    const AdamGroup& g = a.groups[i];
    RC_CHECK_ARG(g.lr >= 0.0f && g.eps >= 0.0f && g.weightDecay >= 0.0f && g.beta1 >= 0.0f && g.beta1 < 1.0f &&
                     g.beta2 >= 0.0f && g.beta2 < 1.0f,
                 op << ": group " << i << " needs lr, eps, weightDecay >= 0 and betas in [0, 1), got lr=" << g.lr
                    << " betas=(" << g.beta1 << ", " << g.beta2 << ") eps=" << g.eps
                    << " weightDecay=" << g.weightDecay);
  }
  validateSegments(a.segments, a.params.numel(), static_cast<int64_t>(a.groups.size()), op);
  validateOptionalFoundInf(a.foundInf, op);
  if (a.stepCount.defined()) validateDeviceScalar(a.stepCount, DType::I32, op, "stepCount");
  RC_CHECK_ARG(
      !a.tablesOnly || a.params.device().type == DeviceType::Cuda,
      op << ": tablesOnly (the tables of a captured CUDA graph) needs CUDA tensors, got " << a.params.describe());
}

void validateFusedAdam(const FusedAdamWArgs& a, const char* op) {
  validateAdamW(a, op);
  validateFusedEnd(a, a.foundInf, op);
}

void validateGradNorm(const GradNormArgs& a) {
  const char* op = "grad norm";
  checkDType(a.grads, DType::F32, op, "grads");
  validateFlag(a.out, DType::F32, op, "out");
  validateOptionalFoundInf(a.foundInf, op);
  validateSegments(a.segments, a.grads.numel(), -1, op);
}

void validateUnscale(const UnscaleArgs& a) {
  const char* op = "unscale and check";
  checkDType(a.grads, DType::F32, op, "grads");
  validateFlag(a.foundInf, DType::F32, op, "foundInf");
  validateSegments(a.segments, a.grads.numel(), -1, op);
  if (a.scale.defined()) validateDeviceScalar(a.scale, DType::F32, op, "scale");
}

void validateClipGradNorm(const ClipGradNormArgs& a) {
  const char* op = "clip grad norm";
  checkDType(a.grads, DType::F32, op, "grads");
  validateFlag(a.norm, DType::F32, op, "norm");
  RC_CHECK_ARG(std::isfinite(a.maxNorm) && a.maxNorm >= 0.0f,
               op << ": maxNorm must be finite and >= 0, got " << a.maxNorm);
  validateSegments(a.segments, a.grads.numel(), -1, op);
}

void validateScalerUpdate(const ScalerUpdateArgs& a) {
  const char* op = "scaler update";
  validateFlag(a.scale, DType::F32, op, "scale");
  validateFlag(a.growthTracker, DType::I32, op, "growthTracker");
  validateFlag(a.foundInf, DType::F32, op, "foundInf");
  RC_CHECK_ARG(
      std::isfinite(a.growthFactor) && std::isfinite(a.backoffFactor) && a.growthFactor > 0.0f &&
          a.backoffFactor > 0.0f,
      op << ": growthFactor and backoffFactor must be positive, got " << a.growthFactor << " and " << a.backoffFactor);
  RC_CHECK_ARG(a.growthInterval >= 1 && a.growthInterval <= INT32_MAX,
               op << ": growthInterval must be a positive 32-bit integer, got " << a.growthInterval);
}

void validateLerp(const LerpArgs& a) {
  const char* op = "lerp";
  checkDType(a.a, DType::F32, op, "a");
  checkDType(a.b, DType::F32, op, "b");
  RC_CHECK_ARG(a.a.numel() == a.b.numel(),
               op << ": a " << a.a.describe() << " and b " << a.b.describe() << " differ in element count");
  RC_CHECK_ARG(std::isfinite(a.weight) && a.weight >= 0.0f && a.weight <= 1.0f,
               op << ": weight must be finite and in [0, 1], got " << a.weight);
}

void validateConvertInput(const ConvertInputArgs& a) {
  const char* op = "convert input";
  checkDType(a.src, DType::U8, op, "src");
  RC_CHECK_ARG(a.src.rank() == 4, op << ": src must be u8[N,H,W,C], got " << a.src.describe());
  checkShape(a.dst, a.src.shape(), op, "dst");
  RC_CHECK_ARG(isFloating(a.dst.dtype()), op << ": dst must be floating point, got " << a.dst.describe());
  const size_t c = static_cast<size_t>(a.src.dim(3));
  RC_CHECK_ARG(a.mean.size() == c && a.std.size() == c,
               op << ": mean and std need " << c << " values each, got " << a.mean.size() << " and " << a.std.size());
  for (float s : a.std) RC_CHECK_ARG(s > 0.0f, op << ": std values must be positive, got " << s);
  if (a.flip.defined()) {
    checkDType(a.flip, DType::U8, op, "flip");
    checkShape(a.flip, Shape{a.src.dim(0)}, op, "flip");
  }
}

void validateElementwise(std::initializer_list<const Tensor*> tensors, const char* op) {
  const Tensor& first = **tensors.begin();
  checkDefined(first, op, "input");
  RC_CHECK_ARG(isFloating(first.dtype()), op << ": expected a floating-point tensor, got " << first.describe());
  for (const Tensor* t : tensors) validateSameLayout(first, *t, op);
}

// The scale of a fake quantization or abs-max reduction: f32, one value or one per slice of dim 0.
void checkQuantScale(const Tensor& x, const Tensor& scale, const char* op) {
  checkDType(scale, DType::F32, op, "scale");
  RC_CHECK_ARG(x.rank() >= 1, op << ": x must have at least one dimension, got " << x.describe());
  RC_CHECK_ARG(scale.rank() == 1 && (scale.numel() == 1 || scale.numel() == x.dim(0)),
               op << ": scale must be f32[1] (per tensor) or f32[" << x.dim(0) << "] (per channel along dim 0), got "
                  << scale.describe());
}

void checkQuantRange(int64_t qmin, int64_t qmax, const char* op) {
  RC_CHECK_ARG(qmin < qmax && qmin >= -32768 && qmax <= 65535,
               op << ": qmin must be below qmax, both 16-bit integers, got qmin=" << qmin << " qmax=" << qmax);
}

void checkQmax(float qmax, const char* op) {
  RC_CHECK_ARG(std::isfinite(qmax) && qmax >= 1.0f, op << ": qmax must be finite and at least 1, got " << qmax);
}

void validateFakeQuantize(const FakeQuantizeArgs& a) {
  const char* op = "fake quantize";
  validateElementwise({&a.x, &a.y}, op);
  checkQuantScale(a.x, a.scale, op);
  checkQuantRange(a.qmin, a.qmax, op);
}

void validateFakeQuantizeBackward(const FakeQuantizeBackwardArgs& a) {
  const char* op = "fake quantize backward";
  validateElementwise({&a.x, &a.dy, &a.dx}, op);
  checkQuantScale(a.x, a.scale, op);
  checkQuantRange(a.qmin, a.qmax, op);
}

void validateAbsMaxScale(const AbsMaxScaleArgs& a) {
  const char* op = "abs max scale";
  checkDefined(a.x, op, "x");
  RC_CHECK_ARG(isFloating(a.x.dtype()), op << ": x must be floating point, got " << a.x.describe());
  checkQuantScale(a.x, a.scale, op);
  checkQmax(a.qmax, op);
}

void validateObserveMinMax(const ObserveMinMaxArgs& a) {
  const char* op = "observe min max";
  checkDefined(a.x, op, "x");
  RC_CHECK_ARG(isFloating(a.x.dtype()) && a.x.numel() > 0,
               op << ": x must be a non-empty floating-point tensor, got " << a.x.describe());
  checkDType(a.minMax, DType::F32, op, "minMax");
  checkShape(a.minMax, Shape{2}, op, "minMax");
  validateFlag(a.scale, DType::F32, op, "scale");
  RC_CHECK_ARG(std::isfinite(a.averagingConstant) && a.averagingConstant > 0.0f && a.averagingConstant <= 1.0f,
               op << ": averagingConstant must be in (0, 1], got " << a.averagingConstant);
  checkQmax(a.qmax, op);
}

void validateCast(const Tensor& src, const Tensor& dst) {
  const char* op = "cast";
  checkDefined(src, op, "src");
  checkDefined(dst, op, "dst");
  RC_CHECK_ARG(src.shape() == dst.shape(), op << ": shapes differ: " << src.describe() << " and " << dst.describe());
  RC_CHECK_ARG(
      src.dtype() == dst.dtype() || (isFloating(src.dtype()) && isFloating(dst.dtype())),
      op << ": converts between floating-point types only, got " << src.describe() << " and " << dst.describe());
}

// The range a fill value must lie in for `dtype`: integers must be integral and representable;
// floats may be NaN or infinite, but a finite value must not overflow to infinity.
void validateFill(const Tensor& t, double value) {
  const char* op = "fill";
  checkDefined(t, op, "tensor");
  const auto fits = [&](double lo, double hi) { return value >= lo && value <= hi; };
  switch (t.dtype()) {
    case DType::U8:
    case DType::I32:
    case DType::I64: {
      const double lo = t.dtype() == DType::U8 ? 0.0 : t.dtype() == DType::I32 ? -2147483648.0 : -9223372036854775808.0;
      const double hi = t.dtype() == DType::U8 ? 255.0 : t.dtype() == DType::I32 ? 2147483647.0 : 9223372036854774784.0;
      RC_CHECK_ARG(std::trunc(value) == value && fits(lo, hi),
                   op << ": value " << value << " is not an integer in the range of " << dtypeName(t.dtype()) << " ["
                      << lo << ", " << hi << "]");
      return;
    }
    default: {
      const double max = t.dtype() == DType::F16 ? 65504.0 : std::numeric_limits<float>::max();
      RC_CHECK_ARG(!std::isfinite(value) || fits(-max, max), op << ": value " << value << " overflows "
                                                                << dtypeName(t.dtype()) << " (largest finite " << max
                                                                << ")");
    }
  }
}

void validateHostCopy(const Tensor& t, size_t bytes, const char* op) {
  checkDefined(t, op, "tensor");
  RC_CHECK_ARG(bytes == t.nbytes(), op << ": a host buffer of " << bytes << " bytes does not match " << t.describe()
                                       << " (" << t.nbytes() << " bytes)");
}

// The tensors of one plan call: shapes from the plan's parameters, activations in its dtype,
// weights in f32 or its dtype, parameter gradients and bias in f32.
struct PlanTensors {
  const char* op;
  DType dtype;

  void activation(const Tensor& t, const Shape& shape, const char* what) const {
    checkShape(t, shape, op, what);
    checkDType(t, dtype, op, what);
  }

  void weight(const Tensor& t, const Shape& shape) const {
    checkShape(t, shape, op, "weight");
    RC_CHECK_ARG(t.dtype() == DType::F32 || t.dtype() == dtype,
                 op << ": weight must be f32 or " << dtypeName(dtype) << ", got " << t.describe());
  }

  void master(const Tensor& t, const Shape& shape, const char* what) const {
    checkShape(t, shape, op, what);
    checkDType(t, DType::F32, op, what);
  }

  void bias(const Tensor& t, bool planHasBias, int64_t size, const char* what) const {
    if (planHasBias) {
      master(t, Shape{size}, what);
    } else {
      RC_CHECK_ARG(!t.defined(), op << ": this plan was created without a bias, but " << what << " was given");
    }
  }
};

// Every defined tensor of a call must be on the backend's device.
void checkOnDevice(std::initializer_list<const Tensor*> tensors, Device device, const char* op) {
  for (const Tensor* t : tensors) {
    RC_CHECK_ARG(!t->defined() || t->device() == device,
                 op << ": tensors are on different devices: " << t->describe() << " is not on " << device.str());
  }
}

// A conv2d or linear plan: y = x W^T (+ b) over shapes fixed at creation.
struct WeightedShapes {
  Shape x, y, weight;
  int64_t biasSize;
  bool bias;
  DType dtype;
};

WeightedShapes shapesOf(const Conv2dParams& p) {
  return {{p.n, p.h, p.w, p.c}, {p.n, p.outH(), p.outW(), p.k}, {p.k, p.kernelH, p.kernelW, p.c}, p.k, p.bias, p.dtype};
}

WeightedShapes shapesOf(const LinearParams& p) {
  return {{p.n, p.in}, {p.n, p.out}, {p.out, p.in}, p.out, p.bias, p.dtype};
}

// Checks every call of a conv2d or linear plan against its shapes, then runs the backend's plan.
template <typename Plan>
class CheckedWeightedPlan : public Plan {
 public:
  CheckedWeightedPlan(std::unique_ptr<Plan> plan, WeightedShapes shapes, Device device, const char* name)
      : plan_(std::move(plan)), s_(std::move(shapes)), device_(device), name_(name) {}

  void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y) override {
    const PlanTensors t = tensors("forward");
    t.activation(x, s_.x, "x");
    t.activation(y, s_.y, "y");
    t.weight(weight, s_.weight);
    t.bias(bias, s_.bias, s_.biasSize, "bias");
    checkOnDevice({&x, &weight, &bias, &y}, device_, t.op);
    plan_->forward(x, weight, bias, y);
  }

  void backwardData(const Tensor& dy, const Tensor& weight, const Tensor& dx) override {
    checkBackwardData("backward data", dy, weight, dx);
    plan_->backwardData(dy, weight, dx);
  }

  void backwardWeights(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& dBias) override {
    const PlanTensors t = tensors("backward weights");
    t.activation(x, s_.x, "x");
    t.activation(dy, s_.y, "dy");
    t.master(dWeight, s_.weight, "dWeight");
    t.bias(dBias, s_.bias, s_.biasSize, "dBias");
    checkOnDevice({&x, &dy, &dWeight, &dBias}, device_, t.op);
    plan_->backwardWeights(x, dy, dWeight, dBias);
  }

 protected:
  Plan& plan() const { return *plan_; }

  void checkBackwardData(const char* pass, const Tensor& dy, const Tensor& weight, const Tensor& dx) {
    const PlanTensors t = tensors(pass);
    t.activation(dy, s_.y, "dy");
    t.activation(dx, s_.x, "dx");
    t.weight(weight, s_.weight);
    checkOnDevice({&dy, &weight, &dx}, device_, t.op);
  }

 private:
  PlanTensors tensors(const char* pass) {
    op_ = std::string(name_) + " " + pass;
    return PlanTensors{op_.c_str(), s_.dtype};
  }

  std::unique_ptr<Plan> plan_;
  WeightedShapes s_;
  Device device_;
  const char* name_;
  std::string op_;
};

class CheckedConv2dPlan final : public CheckedWeightedPlan<Conv2dPlan> {
 public:
  using CheckedWeightedPlan::CheckedWeightedPlan;
  void backwardDataAccumulate(const Tensor& dy, const Tensor& weight, const Tensor& dx) override {
    checkBackwardData("backward data (accumulating)", dy, weight, dx);
    plan().backwardDataAccumulate(dy, weight, dx);
  }
  std::string implementation() const override { return plan().implementation(); }
};

using CheckedLinearPlan = CheckedWeightedPlan<LinearPlan>;

class CheckedPool2dPlan final : public Pool2dPlan {
 public:
  CheckedPool2dPlan(std::unique_ptr<Pool2dPlan> plan, const Pool2dParams& p, Device device)
      : plan_(std::move(plan)),
        x_{p.n, p.h, p.w, p.c},
        y_{p.n, p.outH(), p.outW(), p.c},
        dtype_(p.dtype),
        device_(device) {}

  size_t workspaceBytes() const override { return plan_->workspaceBytes(); }

  void forward(const Tensor& x, const Tensor& y, const Tensor& workspace) override {
    check(x, y, workspace, "pool2d forward", "x", "y");
    plan_->forward(x, y, workspace);
  }

  void backward(const Tensor& dy, const Tensor& dx, const Tensor& workspace) override {
    check(dx, dy, workspace, "pool2d backward", "dx", "dy");
    plan_->backward(dy, dx, workspace);
  }

 private:
  void check(const Tensor& in, const Tensor& out, const Tensor& workspace, const char* op, const char* inName,
             const char* outName) const {
    const PlanTensors t{op, dtype_};
    t.activation(in, x_, inName);
    t.activation(out, y_, outName);
    if (workspaceBytes() > 0) {
      checkDefined(workspace, op, "workspace");
      RC_CHECK_ARG(workspace.nbytes() >= workspaceBytes(),
                   op << ": workspace needs " << workspaceBytes() << " bytes, got " << workspace.describe());
    }
    checkOnDevice({&in, &out, &workspace}, device_, op);
  }

  std::unique_ptr<Pool2dPlan> plan_;
  Shape x_, y_;
  DType dtype_;
  Device device_;
};

// An inference plan: f32 input and output of the shapes its parameters give, on its device.
class CheckedInferencePlan final : public InferencePlan {
 public:
  CheckedInferencePlan(std::unique_ptr<InferencePlan> plan, const std::vector<Shape>& shapes, Device device)
      : plan_(std::move(plan)), x_(shapes.front()), y_(shapes.back()), device_(device) {}

  void run(const Tensor& x, const Tensor& y) override {
    const PlanTensors t{"inference run", DType::F32};
    t.activation(x, x_, "x");
    t.activation(y, y_, "y");
    checkOnDevice({&x, &y}, device_, "inference run");
    plan_->run(x, y);
  }

  std::string implementation() const override { return plan_->implementation(); }

 private:
  std::unique_ptr<InferencePlan> plan_;
  Shape x_, y_;
  Device device_;
};

class CheckedBackend final : public Backend {
 public:
  explicit CheckedBackend(std::unique_ptr<Backend> backend) : b_(std::move(backend)) {}

  Device device() const override { return b_->device(); }
  Allocator& allocator() override { return b_->allocator(); }
  BackendInfo info() override { return b_->info(); }
  bool supports(DType dtype) const override { return b_->supports(dtype); }

  std::unique_ptr<Conv2dPlan> createConv2d(const Conv2dParams& p) override {
    validateConv2dParams(p);
    return std::make_unique<CheckedConv2dPlan>(b_->createConv2d(p), shapesOf(p), device(), "conv2d");
  }

  std::unique_ptr<LinearPlan> createLinear(const LinearParams& p) override {
    validateLinearParams(p);
    return std::make_unique<CheckedLinearPlan>(b_->createLinear(p), shapesOf(p), device(), "linear");
  }

  std::unique_ptr<InferencePlan> createInferencePlan(const InferencePlanParams& p) override {
    const std::vector<Shape> shapes = inferenceValueShapes(p);
    RC_CHECK_ARG(p.dtype == DType::F32 || p.dtype == DType::BF16 || p.dtype == DType::F16,
                 "inference plan: dtype must be f32, bf16 or f16, got " << dtypeName(p.dtype));
    RC_CHECK_ARG(b_->supports(p.dtype),
                 "inference plan: " << device().str() << " does not support " << dtypeName(p.dtype));
    return std::make_unique<CheckedInferencePlan>(b_->createInferencePlan(p), shapes, device());
  }

  std::unique_ptr<Pool2dPlan> createPool2d(const Pool2dParams& p) override {
    validatePool2dParams(p);
    return std::make_unique<CheckedPool2dPlan>(b_->createPool2d(p), p, device());
  }

  void batchNormForward(const BatchNormForwardArgs& a) override {
    validateBatchNormForward(a);
    here({&a.x, &a.gamma, &a.beta, &a.residual, &a.y, &a.runningMean, &a.runningVar, &a.saveMean, &a.saveInvStd},
         "batchnorm forward");
    b_->batchNormForward(a);
  }

  void batchNormBackward(const BatchNormBackwardArgs& a) override {
    validateBatchNormBackward(a);
    here({&a.x, &a.y, &a.dy, &a.gamma, &a.beta, &a.saveMean, &a.saveInvStd, &a.dx, &a.dGamma, &a.dBeta, &a.dResidual},
         "batchnorm backward");
    b_->batchNormBackward(a);
  }

  void syncBatchNormStats(const SyncBatchNormStatsArgs& a) override {
    validateSyncBatchNormStats(a);
    here({&a.x, &a.stats}, "sync batchnorm stats");
    b_->syncBatchNormStats(a);
  }

  void syncBatchNormForward(const SyncBatchNormForwardArgs& a) override {
    validateSyncBatchNormForward(a);
    here({&a.x, &a.gamma, &a.beta, &a.residual, &a.y, &a.stats, &a.runningMean, &a.runningVar, &a.saveMean,
          &a.saveInvStd},
         "sync batchnorm forward");
    b_->syncBatchNormForward(a);
  }

  void syncBatchNormBackwardReduce(const SyncBatchNormBackwardReduceArgs& a) override {
    validateSyncBatchNormBackwardReduce(a);
    here({&a.x, &a.y, &a.dy, &a.saveMean, &a.saveInvStd, &a.sums, &a.dGamma, &a.dBeta},
         "sync batchnorm backward reduce");
    b_->syncBatchNormBackwardReduce(a);
  }

  void syncBatchNormBackwardElementwise(const SyncBatchNormBackwardElementwiseArgs& a) override {
    validateSyncBatchNormBackwardElementwise(a);
    here({&a.x, &a.y, &a.dy, &a.gamma, &a.saveMean, &a.saveInvStd, &a.sums, &a.dx, &a.dResidual},
         "sync batchnorm backward elementwise");
    b_->syncBatchNormBackwardElementwise(a);
  }

  void dualBatchNormForward(const DualBatchNormForwardArgs& a) override {
    validateDualBatchNormForward(a);
    for (const DualBatchNormSide* s : {&a.a, &a.b}) {
      here({&s->x, &s->gamma, &s->beta, &s->runningMean, &s->runningVar, &s->saveMean, &s->saveInvStd},
           "dual batchnorm forward");
    }
    here({&a.y}, "dual batchnorm forward");
    b_->dualBatchNormForward(a);
  }

  void dualBatchNormBackward(const DualBatchNormBackwardArgs& a) override {
    validateDualBatchNormBackward(a);
    for (const DualBatchNormGradSide* s : {&a.a, &a.b})
      here({&s->x, &s->gamma, &s->saveMean, &s->saveInvStd, &s->dx, &s->dGamma, &s->dBeta}, "dual batchnorm backward");
    here({&a.y, &a.dy}, "dual batchnorm backward");
    b_->dualBatchNormBackward(a);
  }

  void relu(const Tensor& x, const Tensor& y) override {
    validateElementwise({&x, &y}, "relu");
    here({&x, &y}, "relu");
    b_->relu(x, y);
  }

  void reluBackward(const Tensor& y, const Tensor& dy, const Tensor& dx) override {
    validateElementwise({&y, &dy, &dx}, "relu backward");
    here({&y, &dy, &dx}, "relu backward");
    b_->reluBackward(y, dy, dx);
  }

  void add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    validateElementwise({&a, &b, &out}, "add");
    here({&a, &b, &out}, "add");
    b_->add(a, b, out);
  }

  void mul(const Tensor& a, const Tensor& b, const Tensor& out) override {
    validateElementwise({&a, &b, &out}, "mul");
    here({&a, &b, &out}, "mul");
    b_->mul(a, b, out);
  }

  void cast(const Tensor& src, const Tensor& dst) override {
    validateCast(src, dst);
    here({&src, &dst}, "cast");
    b_->cast(src, dst);
  }

  void fill(const Tensor& t, double value) override {
    validateFill(t, value);
    here({&t}, "fill");
    b_->fill(t, value);
  }

  void crossEntropy(const CrossEntropyArgs& a) override {
    validateCrossEntropy(a);
    here({&a.logits, &a.labels, &a.loss, &a.dLogits, &a.gradScaleFrom}, "cross entropy");
    b_->crossEntropy(a);
  }

  void distillationLoss(const DistillationArgs& a) override {
    validateDistillation(a);
    here({&a.logits, &a.teacherLogits, &a.labels, &a.loss, &a.dLogits}, "distillation loss");
    b_->distillationLoss(a);
  }

  void sgdStep(const SgdArgs& a) override {
    validateSgd(a);
    here({&a.params, &a.grads, &a.momentumBuffer, &a.foundInf}, "sgd step");
    b_->sgdStep(a);
  }

  void fusedSgdStep(const FusedSgdArgs& a) override {
    validateFusedSgd(a);
    here({&a.params, &a.grads, &a.momentumBuffer, &a.foundInf, &a.scale, &a.growthTracker}, "fused sgd step");
    b_->fusedSgdStep(a);
  }

  void convBnForward(const ConvBnForwardArgs& a) override {
    validateConvBnForward(a);
    here({&a.x, &a.weight, &a.y, &a.scale, &a.shift, &a.sum, &a.sqSum}, "conv-bn");
    b_->convBnForward(a);
  }

  void batchNormFinalize(const BatchNormFinalizeArgs& a) override {
    validateBatchNormFinalize(a);
    here({&a.sum, &a.sqSum, &a.gamma, &a.beta, &a.runningMean, &a.runningVar, &a.saveMean, &a.saveInvStd, &a.scale,
          &a.shift, &a.variance},
         "batch norm finalize");
    b_->batchNormFinalize(a);
  }

  void convDgradDbn(const ConvDgradDbnArgs& a) override {
    validateConvDgradDbn(a);
    here({&a.dy, &a.weight, &a.x, &a.scale, &a.shift, &a.gamma, &a.saveMean, &a.saveInvStd, &a.dz, &a.dGamma, &a.dBeta,
          &a.eqDz, &a.eqX, &a.eqBias},
         "conv dgrad dbn");
    b_->convDgradDbn(a);
  }

  void convWgradSbr(const ConvWgradSbrArgs& a) override {
    validateConvWgradSbr(a);
    here({&a.x, &a.dy, &a.scale, &a.shift, &a.dWeight}, "conv wgrad sbr");
    b_->convWgradSbr(a);
  }

  ConvBnSupport convBnSupport(const ConvBnSupportArgs& a) override {
    validateConvBnSupport(a);
    return b_->convBnSupport(a);
  }

  void batchNormBackwardApply(const BatchNormBackwardApplyArgs& a) override {
    validateBatchNormBackwardApply(a);
    here({&a.dz, &a.x, &a.eqDz, &a.eqX, &a.eqBias, &a.dx}, "batch norm backward apply");
    b_->batchNormBackwardApply(a);
  }

  void convertInput(const ConvertInputArgs& a) override {
    validateConvertInput(a);
    here({&a.src, &a.dst, &a.flip}, "convert input");
    b_->convertInput(a);
  }

  void fusedAdamwStep(const FusedAdamWArgs& a) override {
    validateFusedAdam(a, "fused adamw step");
    here({&a.params, &a.grads, &a.expAvg, &a.expAvgSq, &a.foundInf, &a.stepCount, &a.scale, &a.growthTracker},
         "fused adamw step");
    b_->fusedAdamwStep(a);
  }

  void fusedLambStep(const FusedLambArgs& a) override {
    validateFusedAdam(a, "fused lamb step");
    here({&a.params, &a.grads, &a.expAvg, &a.expAvgSq, &a.foundInf, &a.stepCount, &a.scale, &a.growthTracker},
         "fused lamb step");
    b_->fusedLambStep(a);
  }

  void adamwStep(const AdamWArgs& a) override {
    validateAdamW(a);
    here({&a.params, &a.grads, &a.expAvg, &a.expAvgSq, &a.foundInf, &a.stepCount}, "adamw step");
    b_->adamwStep(a);
  }

  void lambStep(const LambArgs& a) override {
    validateAdamW(a, "lamb step");
    here({&a.params, &a.grads, &a.expAvg, &a.expAvgSq, &a.foundInf, &a.stepCount}, "lamb step");
    b_->lambStep(a);
  }

  void gradNorm(const GradNormArgs& a) override {
    validateGradNorm(a);
    here({&a.grads, &a.out, &a.foundInf}, "grad norm");
    b_->gradNorm(a);
  }

  void unscaleAndCheck(const UnscaleArgs& a) override {
    validateUnscale(a);
    here({&a.grads, &a.foundInf, &a.scale}, "unscale and check");
    b_->unscaleAndCheck(a);
  }

  void clipGradNorm(const ClipGradNormArgs& a) override {
    validateClipGradNorm(a);
    here({&a.grads, &a.norm}, "clip grad norm");
    b_->clipGradNorm(a);
  }

  void scalerUpdate(const ScalerUpdateArgs& a) override {
    validateScalerUpdate(a);
    here({&a.scale, &a.growthTracker, &a.foundInf}, "scaler update");
    b_->scalerUpdate(a);
  }

  void lerp(const LerpArgs& a) override {
    validateLerp(a);
    here({&a.a, &a.b}, "lerp");
    b_->lerp(a);
  }

  void fakeQuantize(const FakeQuantizeArgs& a) override {
    validateFakeQuantize(a);
    here({&a.x, &a.scale, &a.y}, "fake quantize");
    b_->fakeQuantize(a);
  }

  void fakeQuantizeBackward(const FakeQuantizeBackwardArgs& a) override {
    validateFakeQuantizeBackward(a);
    here({&a.x, &a.scale, &a.dy, &a.dx}, "fake quantize backward");
    b_->fakeQuantizeBackward(a);
  }

  void absMaxScale(const AbsMaxScaleArgs& a) override {
    validateAbsMaxScale(a);
    here({&a.x, &a.scale}, "abs max scale");
    b_->absMaxScale(a);
  }

  void observeMinMax(const ObserveMinMaxArgs& a) override {
    validateObserveMinMax(a);
    here({&a.x, &a.minMax, &a.scale}, "observe min max");
    b_->observeMinMax(a);
  }

  void beginCapture() override { b_->beginCapture(); }
  int64_t endCapture() override { return b_->endCapture(); }
  void replay(int64_t graph) override { b_->replay(graph); }
  void destroyGraph(int64_t graph) override { b_->destroyGraph(graph); }

  std::string createUniqueId() override { return b_->createUniqueId(); }
  std::unique_ptr<Communicator> createCommunicator(const CommunicatorParams& p) override {
    RC_CHECK_ARG(p.backend == "nccl" || p.backend == "gloo",
                 "createCommunicator: backend must be 'nccl' or 'gloo', got '" << p.backend << "'");
    RC_CHECK_ARG(p.worldSize >= 1 && p.rank >= 0 && p.rank < p.worldSize,
                 "createCommunicator: rank " << p.rank << " is outside a world of " << p.worldSize);
    RC_CHECK_ARG(p.timeoutSeconds > 0, "createCommunicator: timeoutSeconds must be positive, got " << p.timeoutSeconds);
    if (p.backend == "gloo" && p.worldSize > 1) {
      RC_CHECK_ARG(!p.store.host.empty() && p.store.port > 0 && p.store.port < 65536,
                   "createCommunicator: Gloo needs the store's host and port, got '" << p.store.host << ":"
                                                                                     << p.store.port << "'");
    }
    return b_->createCommunicator(p);
  }

  int64_t profileMark(const ProfileMarkArgs& args) override { return b_->profileMark(args); }
  std::vector<double> profileRead() override { return b_->profileRead(); }

  void copyFromHost(const void* src, size_t bytes, const Tensor& dst) override {
    validateHostCopy(dst, bytes, "copy from host");
    here({&dst}, "copy from host");
    b_->copyFromHost(src, bytes, dst);
  }

  void copyToHost(const Tensor& src, void* dst, size_t bytes) override {
    validateHostCopy(src, bytes, "copy to host");
    here({&src}, "copy to host");
    b_->copyToHost(src, dst, bytes);
  }

  void copy(const Tensor& src, const Tensor& dst) override {
    validateSameLayout(src, dst, "copy");
    here({&src, &dst}, "copy");
    b_->copy(src, dst);
  }

  void synchronize() override { b_->synchronize(); }

  DeviceUtilization utilization() override { return b_->utilization(); }

  std::unique_ptr<JpegDecoder> createJpegDecoder() override { return b_->createJpegDecoder(); }

 private:
  void here(std::initializer_list<const Tensor*> tensors, const char* op) const {
    checkOnDevice(tensors, device(), op);
  }

  std::unique_ptr<Backend> b_;
};

}  // namespace

std::unique_ptr<Backend> checkedBackend(std::unique_ptr<Backend> backend) {
  return std::make_unique<CheckedBackend>(std::move(backend));
}

}  // namespace rc
