// conv2d on oneDNN: NHWC activations and OHWI f32 master weights (see weighted_passes.h).
#include "compute_type.h"
#include "cpu_ops.h"
#include "weighted_passes.h"

namespace rc::cpu {

namespace {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using dnnl::memory;

using Forward = dnnl::convolution_forward;
using BackwardData = dnnl::convolution_backward_data;
using BackwardWeights = dnnl::convolution_backward_weights;

class CpuConv2dPlan final : public WeightedPlan<Conv2dPlan, Forward, BackwardData, BackwardWeights> {
 public:
  CpuConv2dPlan(CpuContext& ctx, const Conv2dParams& p) : WeightedPlan(p.str()), ctx_(ctx), p_(p) {
    checkCpuComputeType(p.dtype, "conv2d");
    dnnlGuard(p.str(), [&] { build(); });
  }

  // The forward's implementation, and the weight gradient's when a matmul or copies in another
  // layout compute it.
  std::string implementation() const override {
    std::string forward = passes_.forwardPd().impl_info_str();
    if (passes_.forwardPd().src_desc().get_data_type() != toDnnl(p_.dtype)) forward += " (bf16 computed in f32)";
    return passes_.hasOwnWeightGradientPath() ? forward + ", weight gradient " + passes_.weightGradientImplementation()
                                              : forward;
  }

 private:
  void build() {
    auto& eng = ctx_.engine();
    const memory::dims xDims{p_.n, p_.c, p_.h, p_.w};
    const memory::dims yDims{p_.n, p_.k, p_.outH(), p_.outW()};
    const memory::dims wDims{p_.k, p_.c, p_.kernelH, p_.kernelW};
    const memory::dims strides{p_.strideH, p_.strideW};
    const memory::dims dilates{p_.dilationH - 1, p_.dilationW - 1};
    const memory::dims padL{p_.padH, p_.padW};
    const memory::dims padR{farPadding(p_.h, p_.outH(), p_.dilationH * (p_.kernelH - 1) + 1, p_.strideH, p_.padH),
                            farPadding(p_.w, p_.outW(), p_.dilationW * (p_.kernelW - 1) + 1, p_.strideW, p_.padW)};
    const dt act = computeType(ctx_.engine(), p_.dtype);
    WeightedLayout l;
    l.x = memory::desc(xDims, act, tag::nhwc);
    l.y = memory::desc(yDims, act, tag::nhwc);
    l.weightF32 = memory::desc(wDims, dt::f32, tag::acdb);
    l.bias = memory::desc({p_.k}, dt::f32, tag::x);
    l.weightDims = wDims;
    l.weightTag = tag::acdb;
    l.biasCount = p_.bias ? p_.k : 0;
    const memory::desc wAny(wDims, act, tag::any);
    const memory::desc dwAny(wDims, dt::f32, tag::any);

    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);

    const auto direct = dnnl::algorithm::convolution_direct;
    const auto training = dnnl::prop_kind::forward_training;
    const auto fwdPd =
        p_.bias
            ? Forward::primitive_desc(eng, training, direct, l.x, wAny, l.bias, l.y, strides, dilates, padL, padR, attr)
            : Forward::primitive_desc(eng, training, direct, l.x, wAny, l.y, strides, dilates, padL, padR, attr);
    const BackwardData::primitive_desc bwdDataPd(eng, direct, l.x, wAny, l.y, strides, dilates, padL, padR, fwdPd,
                                                 attr);
    // The weight gradient from x and dy in the given layouts (the plan's NHWC, or `any`).
    const auto backwardWeights = [&](const memory::desc& x, const memory::desc& dy) {
      return p_.bias ? BackwardWeights::primitive_desc(eng, direct, x, dwAny, l.bias, dy, strides, dilates, padL, padR,
                                                       fwdPd, attr)
                     : BackwardWeights::primitive_desc(eng, direct, x, dwAny, dy, strides, dilates, padL, padR, fwdPd,
                                                       attr);
    };
    auto bwdWPd = backwardWeights(l.x, l.y);
    if (copiesForWeightGradient(bwdWPd)) {
      bwdWPd = backwardWeights(memory::desc(xDims, act, tag::any), memory::desc(yDims, act, tag::any));
    }
    passes_.build(ctx_, l, fwdPd, bwdDataPd, bwdWPd, rowGradient(act));
  }

  // Whether the weight gradient reads x and dy copied into oneDNN's channel-blocked layout. oneDNN's
  // f32 weight-gradient kernels for AVX2 (`jit:avx2`, `jit_1x1:avx2`, which `nhwcPd` runs where the
  // CPU has no AVX-512) read NHWC 1.1-1.8x slower than their own layout (bench/RESULTS.md, ResNet-50's
  // layers on a Zen 3). The copy is a pass over x and dy (about 0.4 ns per element on two cores); the
  // gain about a third of the kernel's time (about 4 ps per multiply-add): it pays from about 100
  // multiply-adds per copied element, and takes effect from 128 (every 3x3 layer of ResNet-50 and the
  // 1x1 layers of its last two stages; the 1x1 layers of its first two stages would not gain).
  bool copiesForWeightGradient(const BackwardWeights::primitive_desc& nhwcPd) const {
    const std::string impl = nhwcPd.impl_info_str();
    if (impl != "jit:avx2" && impl != "jit_1x1:avx2") return false;
    const double macs = static_cast<double>(p_.n) * p_.outH() * p_.outW() * p_.k * p_.c * p_.kernelH * p_.kernelW;
    const double copied = static_cast<double>(p_.n) * (p_.h * p_.w * p_.c + p_.outH() * p_.outW() * p_.k);
    return macs >= 128.0 * copied;
  }

  // A 1x1 stride-1 convolution without padding or bias is a matrix product over the N*H*W rows, and
  // so is its weight gradient: dW[K,C] += dy[rows,K]^T x[rows,C], with OHWI weights being [K,C].
  // Used in bf16, where oneDNN's brgemm matmul on AMX measured 1.1-11x faster than its
  // backward-weights convolution for most of ResNet-50's 1x1 layers (bench/RESULTS.md); in f32 the
  // two measured within noise of each other over the set, either one faster layer by layer, so f32
  // (and bf16 computed in f32) keeps the convolution.
  std::optional<RowGradientMatmul> rowGradient(dt act) const {
    const bool pointwise = p_.kernelH == 1 && p_.kernelW == 1 && p_.strideH == 1 && p_.strideW == 1 && p_.padH == 0 &&
                           p_.padW == 0 && !p_.bias;
    if (!pointwise || act != dt::bf16) return std::nullopt;
    return RowGradientMatmul::create(ctx_, p_.n * p_.h * p_.w, p_.c, p_.k, act);
  }

  CpuContext& ctx_;
  Conv2dParams p_;
};

}  // namespace

std::unique_ptr<Conv2dPlan> createConv2dPlan(CpuContext& ctx, const Conv2dParams& params) {
  return std::make_unique<CpuConv2dPlan>(ctx, params);
}

}  // namespace rc::cpu
