// linear on oneDNN's inner product: y = x W^T + b with W as [out, in] (torchvision's layout).
#include "compute_type.h"
#include "cpu_ops.h"
#include "weighted_passes.h"

namespace rc::cpu {

namespace {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using dnnl::memory;

using Forward = dnnl::inner_product_forward;
using BackwardData = dnnl::inner_product_backward_data;
using BackwardWeights = dnnl::inner_product_backward_weights;

class CpuLinearPlan final : public WeightedPlan<LinearPlan, Forward, BackwardData, BackwardWeights> {
 public:
  CpuLinearPlan(CpuContext& ctx, const LinearParams& p) : WeightedPlan(p.str()), ctx_(ctx), p_(p) {
    checkCpuComputeType(p.dtype, "linear");
    dnnlGuard(p.str(), [&] { build(); });
  }

 private:
  void build() {
    auto& eng = ctx_.engine();
    const dt act = computeType(ctx_.engine(), p_.dtype);
    WeightedLayout l;
    l.x = memory::desc({p_.n, p_.in}, act, tag::nc);
    l.y = memory::desc({p_.n, p_.out}, act, tag::nc);
    l.weightF32 = memory::desc({p_.out, p_.in}, dt::f32, tag::oi);
    l.bias = memory::desc({p_.out}, dt::f32, tag::x);
    l.weightDims = {p_.out, p_.in};
    l.weightTag = tag::oi;
    l.biasCount = p_.bias ? p_.out : 0;
    const memory::desc wAny({p_.out, p_.in}, act, tag::any);
    const memory::desc dwAny({p_.out, p_.in}, dt::f32, tag::any);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);

    const auto training = dnnl::prop_kind::forward_training;
    const auto fwdPd = p_.bias ? Forward::primitive_desc(eng, training, l.x, wAny, l.bias, l.y, attr)
                               : Forward::primitive_desc(eng, training, l.x, wAny, l.y, attr);
    const BackwardData::primitive_desc bwdDataPd(eng, l.x, wAny, l.y, fwdPd, attr);
    const auto bwdWPd = p_.bias ? BackwardWeights::primitive_desc(eng, l.x, dwAny, l.bias, l.y, fwdPd, attr)
                                : BackwardWeights::primitive_desc(eng, l.x, dwAny, l.y, fwdPd, attr);
    passes_.build(ctx_, l, fwdPd, bwdDataPd, bwdWPd);
  }

  CpuContext& ctx_;
  LinearParams p_;
};

}  // namespace

std::unique_ptr<LinearPlan> createLinearPlan(CpuContext& ctx, const LinearParams& params) {
  return std::make_unique<CpuLinearPlan>(ctx, params);
}

}  // namespace rc::cpu
