// linear on oneDNN's inner product: y = x W^T + b with W as [out, in] (torchvision's layout).
#include <optional>

#include "cpu_ops.h"

namespace rc::cpu {

namespace {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using dnnl::memory;

class CpuLinearPlan final : public LinearPlan {
 public:
  CpuLinearPlan(CpuContext& ctx, const LinearParams& p) : ctx_(ctx), p_(p) {
    checkCpuComputeType(p.dtype, "linear");
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
        for (int64_t i = 0; i < p_.out; ++i) dst[i] += src[i];
      }
    });
  }

 private:
  void build() {
    auto& eng = ctx_.engine();
    const dt act = toDnnl(p_.dtype);
    xMd_ = memory::desc({p_.n, p_.in}, act, tag::nc);
    yMd_ = memory::desc({p_.n, p_.out}, act, tag::nc);
    weightF32Md_ = memory::desc({p_.out, p_.in}, dt::f32, tag::oi);
    biasMd_ = memory::desc({p_.out}, dt::f32, tag::x);
    const memory::desc wAny({p_.out, p_.in}, act, tag::any);
    const memory::desc dwAny({p_.out, p_.in}, dt::f32, tag::any);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);

    auto fwdDesc = p_.bias ? dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, xMd_, wAny,
                                                               biasMd_, yMd_)
                           : dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, xMd_, wAny, yMd_);
    fwdPd_ = dnnl::inner_product_forward::primitive_desc(fwdDesc, attr, eng);
    fwd_ = dnnl::inner_product_forward(fwdPd_);
    dnnl::inner_product_backward_data::desc bwdDataDesc(xMd_, wAny, yMd_);
    bwdDataPd_ = dnnl::inner_product_backward_data::primitive_desc(bwdDataDesc, attr, eng, fwdPd_);
    bwdData_ = dnnl::inner_product_backward_data(bwdDataPd_);
    auto bwdWDesc = p_.bias ? dnnl::inner_product_backward_weights::desc(xMd_, dwAny, biasMd_, yMd_)
                            : dnnl::inner_product_backward_weights::desc(xMd_, dwAny, yMd_);
    bwdWeightsPd_ = dnnl::inner_product_backward_weights::primitive_desc(bwdWDesc, attr, eng, fwdPd_);
    bwdWeights_ = dnnl::inner_product_backward_weights(bwdWeightsPd_);

    accumulateWeight_ = accumulatingReorder(ctx_, bwdWeightsPd_.diff_weights_desc(), weightF32Md_);
    fwdReorder_.emplace(ctx_, memory::dims{p_.out, p_.in}, tag::oi, fwdPd_.weights_desc());
    bwdReorder_.emplace(ctx_, memory::dims{p_.out, p_.in}, tag::oi, bwdDataPd_.weights_desc());

    fwdWeight_ = ctx_.allocateBytes(fwdPd_.weights_desc().get_size());
    bwdWeight_ = ctx_.allocateBytes(bwdDataPd_.weights_desc().get_size());
    diffWeight_ = ctx_.allocateBytes(bwdWeightsPd_.diff_weights_desc().get_size());
    if (p_.bias) diffBias_ = ctx_.allocate({p_.out}, DType::F32);
  }

  CpuContext& ctx_;
  LinearParams p_;
  memory::desc xMd_, yMd_, weightF32Md_, biasMd_;
  dnnl::inner_product_forward::primitive_desc fwdPd_;
  dnnl::inner_product_backward_data::primitive_desc bwdDataPd_;
  dnnl::inner_product_backward_weights::primitive_desc bwdWeightsPd_;
  dnnl::inner_product_forward fwd_;
  dnnl::inner_product_backward_data bwdData_;
  dnnl::inner_product_backward_weights bwdWeights_;
  dnnl::reorder accumulateWeight_;
  std::optional<WeightReorder> fwdReorder_, bwdReorder_;
  Tensor fwdWeight_, bwdWeight_, diffWeight_, diffBias_;
};

}  // namespace

std::unique_ptr<LinearPlan> createLinearPlan(CpuContext& ctx, const LinearParams& params) {
  return std::make_unique<CpuLinearPlan>(ctx, params);
}

}  // namespace rc::cpu
