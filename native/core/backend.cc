#include "backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "error.h"

namespace rc {

namespace {
int64_t channels(const Tensor& t) { return t.rank() == 0 ? 1 : t.dim(t.rank() - 1); }
}  // namespace

std::string Conv2dParams::str() const {
  std::ostringstream out;
  out << "conv2d x=" << dtypeName(dtype) << "[" << n << "," << h << "," << w << "," << c << "] w=[" << k
      << "," << r << "," << s << "," << c << "] stride=" << strideH << "x" << strideW << " pad=" << padH
      << "x" << padW << " dilation=" << dilationH << "x" << dilationW << (bias ? " bias" : "");
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
  out << (kind == PoolKind::Max ? "maxpool2d" : "avgpool2d") << " x=" << dtypeName(dtype) << "[" << n
      << "," << h << "," << w << "," << c << "] kernel=" << kernelH << "x" << kernelW
      << " stride=" << strideH << "x" << strideW << " pad=" << padH << "x" << padW;
  return out.str();
}

Tensor Backend::empty(const Shape& shape, DType dtype) {
  RC_CHECK_ARG(supports(dtype), dtypeName(dtype) << " tensors are not supported on " << device().str());
  const size_t bytes = static_cast<size_t>(shapeNumel(shape)) * dtypeSize(dtype);
  auto storage = std::make_shared<Storage>(&allocator(), device(), bytes);
  return Tensor(std::move(storage), 0, shape, dtype);
}

void validateSameLayout(const Tensor& a, const Tensor& b, const char* op) {
  checkDefined(a, op, "input");
  checkDefined(b, op, "output");
  checkSameDevice(a, b, op);
  RC_CHECK_ARG(a.shape() == b.shape() && a.dtype() == b.dtype(),
               op << ": tensors must match in shape and dtype, got " << a.describe() << " and "
                  << b.describe());
}

void validateConv2dParams(const Conv2dParams& p) {
  RC_CHECK_ARG(p.n > 0 && p.h > 0 && p.w > 0 && p.c > 0 && p.k > 0 && p.r > 0 && p.s > 0,
               "conv2d: all sizes must be positive: " << p.str());
  RC_CHECK_ARG(p.strideH > 0 && p.strideW > 0 && p.dilationH > 0 && p.dilationW > 0 && p.padH >= 0 &&
                   p.padW >= 0,
               "conv2d: stride and dilation must be positive and padding non-negative: " << p.str());
  RC_CHECK_ARG(p.outH() > 0 && p.outW() > 0, "conv2d: the kernel does not fit the padded input: " << p.str());
  RC_CHECK_ARG(isFloating(p.dtype), "conv2d: dtype must be floating point, got " << dtypeName(p.dtype));
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
}

void validateSgd(const SgdArgs& a) {
  const char* op = "sgd step";
  checkDType(a.params, DType::F32, op, "params");
  checkDType(a.grads, DType::F32, op, "grads");
  RC_CHECK_ARG(a.grads.numel() == a.params.numel(), op << ": grads " << a.grads.describe()
                                                        << " do not match params " << a.params.describe());
  bool needsMomentum = false;
  for (const auto& g : a.groups) needsMomentum = needsMomentum || g.momentum != 0.0f;
  if (needsMomentum) {
    checkDType(a.momentumBuffer, DType::F32, op, "momentumBuffer");
    RC_CHECK_ARG(a.momentumBuffer.numel() == a.params.numel(), op << ": momentumBuffer size mismatch");
  }
  for (const auto& s : a.segments) {
    RC_CHECK_ARG(s.offset >= 0 && s.count >= 0 && s.offset + s.count <= a.params.numel(),
                 op << ": segment [" << s.offset << ", +" << s.count << ") is outside the arena of "
                    << a.params.numel());
    RC_CHECK_ARG(s.group >= 0 && static_cast<size_t>(s.group) < a.groups.size(),
                 op << ": segment names group " << s.group << " of " << a.groups.size());
  }
  if (a.foundInf.defined()) checkShape(a.foundInf, Shape{1}, op, "foundInf");
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& s : a.segments) ranges.emplace_back(s.offset, s.offset + s.count);
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    RC_CHECK_ARG(ranges[i].first >= ranges[i - 1].second,
                 op << ": segments overlap at element " << ranges[i].first << "; each parameter may appear once");
  }
}

namespace {

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

void validateArenaTensor(const Tensor& t, const Tensor& params, const char* op, const char* what) {
  checkDType(t, DType::F32, op, what);
  checkSameDevice(params, t, op);
  RC_CHECK_ARG(t.numel() == params.numel(),
               op << ": " << what << " " << t.describe() << " does not match params " << params.describe());
}

}  // namespace

void validateAdamW(const AdamWArgs& a, const char* op) {
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
  if (a.foundInf.defined()) {
    validateFlag(a.foundInf, DType::F32, op, "foundInf");
    checkSameDevice(a.params, a.foundInf, op);
  }
}

void validateLamb(const LambArgs& a) { validateAdamW(a, "lamb step"); }

void validateGradNorm(const GradNormArgs& a) {
  const char* op = "grad norm";
  checkDType(a.grads, DType::F32, op, "grads");
  validateFlag(a.out, DType::F32, op, "out");
  checkSameDevice(a.grads, a.out, op);
  if (a.foundInf.defined()) {
    validateFlag(a.foundInf, DType::F32, op, "foundInf");
    checkSameDevice(a.grads, a.foundInf, op);
  }
  validateSegments(a.segments, a.grads.numel(), -1, op);
}

void validateUnscale(const UnscaleArgs& a) {
  const char* op = "unscale and check";
  checkDType(a.grads, DType::F32, op, "grads");
  validateFlag(a.foundInf, DType::F32, op, "foundInf");
  checkSameDevice(a.grads, a.foundInf, op);
  validateSegments(a.segments, a.grads.numel(), -1, op);
}

void validateClipGradNorm(const ClipGradNormArgs& a) {
  const char* op = "clip grad norm";
  checkDType(a.grads, DType::F32, op, "grads");
  validateFlag(a.norm, DType::F32, op, "norm");
  checkSameDevice(a.grads, a.norm, op);
  RC_CHECK_ARG(std::isfinite(a.maxNorm) && a.maxNorm >= 0.0f, op << ": maxNorm must be finite and >= 0, got " << a.maxNorm);
  validateSegments(a.segments, a.grads.numel(), -1, op);
}

void validateScalerUpdate(const ScalerUpdateArgs& a) {
  const char* op = "scaler update";
  validateFlag(a.scale, DType::F32, op, "scale");
  validateFlag(a.growthTracker, DType::I32, op, "growthTracker");
  validateFlag(a.foundInf, DType::F32, op, "foundInf");
  checkSameDevice(a.scale, a.growthTracker, op);
  checkSameDevice(a.scale, a.foundInf, op);
  RC_CHECK_ARG(std::isfinite(a.growthFactor) && std::isfinite(a.backoffFactor) && a.growthFactor > 0.0f &&
                   a.backoffFactor > 0.0f,
               op << ": growthFactor and backoffFactor must be positive, got " << a.growthFactor << " and "
                  << a.backoffFactor);
  RC_CHECK_ARG(a.growthInterval >= 1 && a.growthInterval <= INT32_MAX,
               op << ": growthInterval must be a positive 32-bit integer, got " << a.growthInterval);
}

void validateLerp(const LerpArgs& a) {
  const char* op = "lerp";
  checkDType(a.a, DType::F32, op, "a");
  checkDType(a.b, DType::F32, op, "b");
  checkSameDevice(a.a, a.b, op);
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
               op << ": mean and std need " << c << " values each, got " << a.mean.size() << " and "
                  << a.std.size());
  for (float s : a.std) RC_CHECK_ARG(s > 0.0f, op << ": std values must be positive, got " << s);
  if (a.flip.defined()) {
    checkDType(a.flip, DType::U8, op, "flip");
    checkShape(a.flip, Shape{a.src.dim(0)}, op, "flip");
  }
}

}  // namespace rc
