// The dgrad-drelu-dbn graph of the conv-bn prologue's backward (see ConvDgradDbnArgs), one cuDNN
// operation graph:
//
//   dA = CONV_BWD_DATA(dy, w)                                      (virtual, f32)
//   t = ADD(MUL(MUL(ADD(x, -1 * mean), invStd), gamma), beta)      (virtual, f32: the BN output)
//   dz = RELU_BWD(t, dA)                                           (written, x's dtype)
//   dScale, dBias, eqDz, eqX, eqBias = BN_BWD_WEIGHTS(x, dz, mean, invStd, gamma)   (f32[C])
//
// the DgradDreluBNBwdWeight pattern of cuDNN's specialized fusion engines, the dgrad, dReLU and
// batch-norm-backward-weights step of ResNet-50's fused training
// (https://docs.nvidia.com/deeplearning/cudnn/backend/latest/developer/graph-api.html, "Specialized
// Pre-Compiled Engines", DgradDreluBNBwdWeight; the node is CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_
// DESCRIPTOR, whose outputs are the scale and bias gradients and the three coefficients of dx). The
// batch norm's output is recomputed in the documented form of the pattern, (x - mean) * invStd *
// gamma + beta, its subtraction an ADD with alpha2 = -1; dA and the recomputation are virtual f32
// tensors, and only dz (the gradient at the batch norm's output) is written, in x's dtype. beta is
// not an argument (the caller has the prologue's scale and shift): a kernel forms it first as
// shift + mean * scale (= beta - mean * scale + mean * scale), into the plan's own buffer.
// NVIDIA documents the pattern's engine for FP16 dy, w and x, and FP32 statistics and outputs; the
// bf16 graph is built the same way, and where cuDNN has no engine for it ExecutionPlan throws with
// each engine's refusal.
//
// The backward weights op writes dScale and dBias (it does not accumulate), so the plan writes them
// into a buffer of its own and accumulateBnGrads adds them to the caller's dGamma and dBeta.
//
// The algebra of the coefficients, against batchNormBackward (batchnorm.cu) in training: with
// xhat = (x - mean) * invStd, g = dz and sums over the M rows of a channel,
//   dx = gamma * invStd * (g - sum(g) / M - xhat * sum(g * xhat) / M)
//      = (gamma * invStd) * g
//        + (-gamma * invStd^3 * sum(g * (x - mean)) / M) * x
//        + (gamma * invStd^3 * sum(g * (x - mean)) / M * mean - gamma * invStd * sum(g) / M)
//      = eqDz * g + eqX * x + eqBias,
// eqDz = gamma * invStd, eqX = -gamma * invStd^3 * sum(g * (x - mean)) / M,
// eqBias = -eqX * mean - eqDz * sum(g) / M; and dGamma = sum(g * xhat), dBeta = sum(g).
#include <memory>
#include <sstream>

#include "cuda_check.h"
#include "fused_dgrad.h"
#include "graph_api.h"
#include "kernels.h"

namespace rc::cuda {

namespace {

enum Uid : int64_t {
  kDy = 1,
  kW,
  kX,
  kBeta,
  kDz,
  kMean,
  kInvStd,
  kGamma,
  kDScale,
  kDBias,
  kEqDz,
  kEqX,
  kEqBias,
  kDA,
  kCentered,
  kNormalized,
  kScaled,
  kShifted
};

struct DgradDbnShape {
  int64_t n, h, w, c, k, r, s, p, q;
  int64_t strideH, strideW, padH, padW, dilationH, dilationW;
  DType dtype;

  std::string str() const {
    std::ostringstream out;
    out << "conv dgrad dbn dy[" << n << "," << p << "," << q << "," << k << "] w[" << k << "," << r << "," << s << ","
        << c << "] x[" << n << "," << h << "," << w << "," << c << "] stride " << strideH << "x" << strideW << " pad "
        << padH << "x" << padW << " dilation " << dilationH << "x" << dilationW << " " << dtypeName(dtype);
    return out.str();
  }
};

cudnnDataType_t cudnnType(DType d) { return d == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

// The batch norm's backward weights node (see the file comment).
graph::Descriptor bnBackwardWeights(const graph::Descriptor& x, const graph::Descriptor& dy,
                                    const graph::Descriptor& mean, const graph::Descriptor& invStd,
                                    const graph::Descriptor& gamma, const graph::Descriptor& dScale,
                                    const graph::Descriptor& dBias, const graph::Descriptor& eqDy,
                                    const graph::Descriptor& eqX, const graph::Descriptor& eqBias,
                                    const std::string& what) {
  graph::Descriptor d(CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, what);
  d.setDataType(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC, CUDNN_DATA_FLOAT)
      .setDescriptor(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC, mean)
      .setDescriptor(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC, invStd)
      .setDescriptor(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC, gamma)
      .setDescriptor(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC, x)
      .setDescriptor(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC, dy)
      .setDescriptor(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC, dScale)
      .setDescriptor(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC, dBias)
      .setDescriptor(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC, eqDy)
      .setDescriptor(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC, eqX)
      .setDescriptor(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS, eqBias);
  return std::move(d.finalize());
}

}  // namespace

// One shape's execution plan, its low-precision copy of the f32 master weights and the buffer of
// the graph's dScale and dBias (f32[2, C]).
class DgradDbnGraph {
 public:
  DgradDbnGraph(CudaContext& ctx, const DgradDbnShape& s) : shape_(s) {
    using graph::Descriptor;
    using graph::TensorSpec;
    const std::string what = s.str();
    const cudnnDataType_t io = cudnnType(s.dtype);
    auto act = [&](int64_t uid, int64_t channels, int64_t h, int64_t w, cudnnDataType_t type, bool isVirtual,
                   const char* name) {
      return graph::channelsLastTensor(TensorSpec{uid, {s.n, channels, h, w}, type, 16, isVirtual, what + name});
    };
    auto vec = [&](int64_t uid, const char* name) {
      return graph::channelsLastTensor(TensorSpec{uid, {1, s.c, 1, 1}, CUDNN_DATA_FLOAT, 4, false, what + name});
    };
    Descriptor dy = act(kDy, s.k, s.p, s.q, io, false, " dy");
    Descriptor w = graph::channelsLastTensor(TensorSpec{kW, {s.k, s.c, s.r, s.s}, io, 16, false, what + " w"});
    Descriptor x = act(kX, s.c, s.h, s.w, io, false, " x");
    Descriptor dz = act(kDz, s.c, s.h, s.w, io, false, " dz");
    Descriptor dA = act(kDA, s.c, s.h, s.w, CUDNN_DATA_FLOAT, true, " conv_backward_data(dy, w)");
    Descriptor centered = act(kCentered, s.c, s.h, s.w, CUDNN_DATA_FLOAT, true, " x-mean");
    Descriptor normalized = act(kNormalized, s.c, s.h, s.w, CUDNN_DATA_FLOAT, true, " (x-mean)*invStd");
    Descriptor scaled = act(kScaled, s.c, s.h, s.w, CUDNN_DATA_FLOAT, true, " (x-mean)*invStd*gamma");
    Descriptor shifted = act(kShifted, s.c, s.h, s.w, CUDNN_DATA_FLOAT, true, " (x-mean)*invStd*gamma+beta");
    Descriptor beta = vec(kBeta, " beta"), mean = vec(kMean, " mean");
    Descriptor invStd = vec(kInvStd, " invStd"), gamma = vec(kGamma, " gamma"), dScale = vec(kDScale, " dScale");
    Descriptor dBias = vec(kDBias, " dBias"), eqDz = vec(kEqDz, " eqDz"), eqX = vec(kEqX, " eqX");
    Descriptor eqBias = vec(kEqBias, " eqBias");
    Descriptor conv = graph::convolution2d(
        graph::Convolution2dSpec{s.padH, s.padW, s.strideH, s.strideW, s.dilationH, s.dilationW}, what);
    Descriptor dgrad = graph::convolutionBackwardData(conv, dy, w, dA, what + " convolution backward data");
    Descriptor center = graph::pointwise(CUDNN_POINTWISE_ADD, x, &mean, centered, what + " recompute x-mean", -1.0f);
    Descriptor normalize =
        graph::pointwise(CUDNN_POINTWISE_MUL, centered, &invStd, normalized, what + " recompute *invStd");
    Descriptor scaleBy = graph::pointwise(CUDNN_POINTWISE_MUL, normalized, &gamma, scaled, what + " recompute *gamma");
    Descriptor shiftBy = graph::pointwise(CUDNN_POINTWISE_ADD, scaled, &beta, shifted, what + " recompute +beta");
    Descriptor drelu = graph::reluBackward(shifted, dA, dz, what + " relu backward");
    Descriptor dbn =
        bnBackwardWeights(x, dz, mean, invStd, gamma, dScale, dBias, eqDz, eqX, eqBias, what + " bn backward weights");
    plan_ = std::make_unique<graph::ExecutionPlan>(
        ctx.cudnn(), std::vector<const Descriptor*>{&dgrad, &center, &normalize, &scaleBy, &shiftBy, &drelu, &dbn},
        what);
    lowWeight_ = ctx.allocate({s.k, s.r, s.s, s.c}, s.dtype);
    partial_ = ctx.allocate({3, s.c}, DType::F32);
  }

  void run(CudaContext& ctx, const ConvDgradDbnArgs& a) {
    const void* weight = a.weight.data();
    if (a.weight.dtype() != shape_.dtype) {
      cast(a.weight.dtype(), a.weight.data(), shape_.dtype, lowWeight_.data(), a.weight.numel(), ctx.stream());
      weight = lowWeight_.data();
    }
    auto* partial = partial_.ptr<float>();  // dScale, dBias, beta
    float* beta = partial + 2 * shape_.c;
    shiftToBeta(a.shift.ptr<float>(), a.saveMean.ptr<float>(), a.scale.ptr<float>(), beta, shape_.c, ctx.stream());
    const std::vector<int64_t> uids = {kDy,    kW,      kX,     kBeta, kDz,  kMean,  kInvStd,
                                       kGamma, kDScale, kDBias, kEqDz, kEqX, kEqBias};
    const std::vector<void*> pointers = {a.dy.data(),    const_cast<void*>(weight), a.x.data(),          beta,
                                         a.dz.data(),    a.saveMean.data(),         a.saveInvStd.data(), a.gamma.data(),
                                         partial,        partial + shape_.c,        a.eqDz.data(),       a.eqX.data(),
                                         a.eqBias.data()};
    const auto bytes = static_cast<size_t>(plan_->workspaceBytes());
    void* workspace = bytes > 0 ? ctx.scratch(bytes) : nullptr;
    plan_->execute(ctx.cudnn(), uids, pointers, workspace);
    accumulateBnGrads(partial, a.dGamma.ptr<float>(), a.dBeta.ptr<float>(), shape_.c, ctx.stream());
  }

 private:
  DgradDbnShape shape_;
  std::unique_ptr<graph::ExecutionPlan> plan_;
  Tensor lowWeight_;
  Tensor partial_;
};

DgradDbnFusion::DgradDbnFusion(CudaContext& ctx) : ctx_(ctx) {}

DgradDbnFusion::~DgradDbnFusion() = default;

void DgradDbnFusion::run(const ConvDgradDbnArgs& a) {
  const Shape& xs = a.x.shape();
  const Shape& ws = a.weight.shape();
  const Shape& ys = a.dy.shape();
  const DgradDbnShape s{xs[0], xs[1],     xs[2],     xs[3],  ws[0],  ws[1],       ws[2],       ys[1],
                        ys[2], a.strideH, a.strideW, a.padH, a.padW, a.dilationH, a.dilationW, a.x.dtype()};
  DeviceGuard guard(ctx_.device());
  plans_.get(s.str(), [&] { return std::make_unique<DgradDbnGraph>(ctx_, s); })->run(ctx_, a);
}

std::string DgradDbnFusion::refusal(const ConvBnSupportArgs& a) {
  const int64_t p = windowOutputSize(a.h, a.r, a.strideH, a.padH, a.dilationH);
  const int64_t q = windowOutputSize(a.w, a.s, a.strideW, a.padW, a.dilationW);
  const DgradDbnShape s{a.n, a.h,       a.w,       a.c,    a.k,    a.r,         a.s,         p,
                        q,   a.strideH, a.strideW, a.padH, a.padW, a.dilationH, a.dilationW, a.dtype};
  DeviceGuard guard(ctx_.device());
  return plans_.refusal(s.str(), [&] { return std::make_unique<DgradDbnGraph>(ctx_, s); });
}

}  // namespace rc::cuda
