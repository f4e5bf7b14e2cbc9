// conv2d on oneDNN: NHWC activations, OHWI f32 master weights reordered into the primitive's
// preferred layout each call, weight gradients reordered back with a sum post-op (+=).
#include <optional>

#include "cpu_ops.h"

namespace rc::cpu {

namespace {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using dnnl::memory;

class CpuConv2dPlan final : public Conv2dPlan {
 public:
  CpuConv2dPlan(CpuContext& ctx, const Conv2dParams& p) : ctx_(ctx), p_(p) {
    checkCpuComputeType(p.dtype, "conv2d");
    dnnlGuard(p.str(), [&] { build(); });
  }

  void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y) override {
    dnnlGuard(p_.str() + " forward", [&] {
      auto& eng = ctx_.engine();
      fwdReorder_->run(weight, fwdWeight_);
      std::unordered_map<int, memory> args{
          {DNNL_ARG_SRC, memory(xMd_, eng, x.data())},
          {DNNL_ARG_WEIGHTS, memory(fwdPd_.weights_desc(), eng, fwdWeight_.data())},
          {DNNL_ARG_DST, memory(yMd_, eng, y.data())},
          {DNNL_ARG_SCRATCHPAD,
           memory(fwdPd_.scratchpad_desc(), eng, ctx_.scratch(fwdPd_.scratchpad_desc().get_size()))}};
      if (p_.bias) args.emplace(DNNL_ARG_BIAS, memory(biasMd_, eng, bias.data()));
      fwd_.execute(ctx_.stream(), args);
    });
  }

  void backwardData(const Tensor& dy, const Tensor& weight, const Tensor& dx) override {
    dnnlGuard(p_.str() + " backward data", [&] {
      auto& eng = ctx_.engine();
      bwdReorder_->run(weight, bwdWeight_);
      bwdData_.execute(ctx_.stream(),
                       {{DNNL_ARG_DIFF_DST, memory(yMd_, eng, dy.data())},
                        {DNNL_ARG_WEIGHTS, memory(bwdDataPd_.weights_desc(), eng, bwdWeight_.data())},
                        {DNNL_ARG_DIFF_SRC, memory(xMd_, eng, dx.data())},
                        {DNNL_ARG_SCRATCHPAD, memory(bwdDataPd_.scratchpad_desc(), eng,
                                                     ctx_.scratch(bwdDataPd_.scratchpad_desc().get_size()))}});
    });
  }

  void backwardWeights(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& dBias) override {
    dnnlGuard(p_.str() + " backward weights", [&] {
      auto& eng = ctx_.engine();
      auto& s = ctx_.stream();
      const auto dwMd = bwdWeightsPd_.diff_weights_desc();
      std::unordered_map<int, memory> args{
          {DNNL_ARG_SRC, memory(xMd_, eng, x.data())},
          {DNNL_ARG_DIFF_DST, memory(yMd_, eng, dy.data())},
          {DNNL_ARG_DIFF_WEIGHTS, memory(dwMd, eng, diffWeight_.data())},
          {DNNL_ARG_SCRATCHPAD, memory(bwdWeightsPd_.scratchpad_desc(), eng,
                                       ctx_.scratch(bwdWeightsPd_.scratchpad_desc().get_size()))}};
      if (p_.bias) args.emplace(DNNL_ARG_DIFF_BIAS, memory(biasMd_, eng, diffBias_.data()));
      bwdWeights_.execute(s, args);
      memory blocked(dwMd, eng, diffWeight_.data());
      memory plain(weightF32Md_, eng, dWeight.data());
      accumulateWeight_.execute(s, blocked, plain);
      if (p_.bias) {
        const float* src = diffBias_.ptr<float>();
        float* dst = dBias.ptr<float>();
        for (int64_t i = 0; i < p_.k; ++i) dst[i] += src[i];
      }
    });
  }

  std::string implementation() const override { return fwdPd_.impl_info_str(); }

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
    const dt act = toDnnl(p_.dtype);
    xMd_ = memory::desc(xDims, act, tag::nhwc);
    yMd_ = memory::desc(yDims, act, tag::nhwc);
    weightF32Md_ = memory::desc(wDims, dt::f32, tag::acdb);
    biasMd_ = memory::desc({p_.k}, dt::f32, tag::x);
    const memory::desc wAny(wDims, act, tag::any);
    const memory::desc dwAny(wDims, dt::f32, tag::any);

    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);

    auto fwdDesc = p_.bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                             dnnl::algorithm::convolution_direct, xMd_, wAny,
                                                             biasMd_, yMd_, strides, dilates, padL, padR)
                           : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                             dnnl::algorithm::convolution_direct, xMd_, wAny,
                                                             yMd_, strides, dilates, padL, padR);
    fwdPd_ = dnnl::convolution_forward::primitive_desc(fwdDesc, attr, eng);
    fwd_ = dnnl::convolution_forward(fwdPd_);

    dnnl::convolution_backward_data::desc bwdDataDesc(dnnl::algorithm::convolution_direct, xMd_, wAny, yMd_,
                                                      strides, dilates, padL, padR);
    bwdDataPd_ = dnnl::convolution_backward_data::primitive_desc(bwdDataDesc, attr, eng, fwdPd_);
    bwdData_ = dnnl::convolution_backward_data(bwdDataPd_);

    auto bwdWDesc = p_.bias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, xMd_,
                                                                       dwAny, biasMd_, yMd_, strides, dilates,
                                                                       padL, padR)
                            : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, xMd_,
                                                                       dwAny, yMd_, strides, dilates, padL, padR);
    bwdWeightsPd_ = dnnl::convolution_backward_weights::primitive_desc(bwdWDesc, attr, eng, fwdPd_);
    bwdWeights_ = dnnl::convolution_backward_weights(bwdWeightsPd_);

    accumulateWeight_ = accumulatingReorder(ctx_, bwdWeightsPd_.diff_weights_desc(), weightF32Md_);
    fwdReorder_.emplace(ctx_, memory::dims{p_.k, p_.c, p_.kernelH, p_.kernelW}, tag::acdb, fwdPd_.weights_desc());
    bwdReorder_.emplace(ctx_, memory::dims{p_.k, p_.c, p_.kernelH, p_.kernelW}, tag::acdb, bwdDataPd_.weights_desc());

    fwdWeight_ = ctx_.allocateBytes(fwdPd_.weights_desc().get_size());
    bwdWeight_ = ctx_.allocateBytes(bwdDataPd_.weights_desc().get_size());
    diffWeight_ = ctx_.allocateBytes(bwdWeightsPd_.diff_weights_desc().get_size());
    if (p_.bias) diffBias_ = ctx_.allocate({p_.k}, DType::F32);
  }

  CpuContext& ctx_;
  Conv2dParams p_;
  memory::desc xMd_, yMd_, weightF32Md_, biasMd_;
  dnnl::convolution_forward::primitive_desc fwdPd_;
  dnnl::convolution_backward_data::primitive_desc bwdDataPd_;
  dnnl::convolution_backward_weights::primitive_desc bwdWeightsPd_;
  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_data bwdData_;
  dnnl::convolution_backward_weights bwdWeights_;
  dnnl::reorder accumulateWeight_;
  std::optional<WeightReorder> fwdReorder_, bwdReorder_;
  Tensor fwdWeight_, bwdWeight_, diffWeight_, diffBias_;
};

}  // namespace

std::unique_ptr<Conv2dPlan> createConv2dPlan(CpuContext& ctx, const Conv2dParams& params) {
  return std::make_unique<CpuConv2dPlan>(ctx, params);
}

}  // namespace rc::cpu
