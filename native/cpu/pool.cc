// max and average pooling on oneDNN (NHWC); max pooling keeps its argmax in a workspace that the
// module owns between forward and backward.
#include "cpu_ops.h"

namespace rc::cpu {

namespace {

using tag = dnnl::memory::format_tag;
using dnnl::memory;

class CpuPool2dPlan final : public Pool2dPlan {
 public:
  CpuPool2dPlan(CpuContext& ctx, const Pool2dParams& p) : ctx_(ctx), p_(p) {
    checkCpuComputeType(p.dtype, "pool2d");
    dnnlGuard(p.str(), [&] { build(); });
  }

  size_t workspaceBytes() const override { return fwdPd_.workspace_desc().get_size(); }

  void forward(const Tensor& x, const Tensor& y, const Tensor& workspace) override {
    dnnlGuard(p_.str() + " forward", [&] {
      auto& eng = ctx_.engine();
      std::unordered_map<int, memory> args{
          {DNNL_ARG_SRC, memory(xMd_, eng, x.data())},
          {DNNL_ARG_DST, memory(yMd_, eng, y.data())},
          {DNNL_ARG_SCRATCHPAD,
           memory(fwdPd_.scratchpad_desc(), eng, ctx_.scratch(fwdPd_.scratchpad_desc().get_size()))}};
      if (workspaceBytes() > 0) args.emplace(DNNL_ARG_WORKSPACE, memory(fwdPd_.workspace_desc(), eng, workspace.data()));
      fwd_.execute(ctx_.stream(), args);
    });
  }

  void backward(const Tensor& dy, const Tensor& dx, const Tensor& workspace) override {
    dnnlGuard(p_.str() + " backward", [&] {
      auto& eng = ctx_.engine();
      std::unordered_map<int, memory> args{
          {DNNL_ARG_DIFF_DST, memory(yMd_, eng, dy.data())},
          {DNNL_ARG_DIFF_SRC, memory(xMd_, eng, dx.data())},
          {DNNL_ARG_SCRATCHPAD,
           memory(bwdPd_.scratchpad_desc(), eng, ctx_.scratch(bwdPd_.scratchpad_desc().get_size()))}};
      if (workspaceBytes() > 0) args.emplace(DNNL_ARG_WORKSPACE, memory(fwdPd_.workspace_desc(), eng, workspace.data()));
      bwd_.execute(ctx_.stream(), args);
    });
  }

 private:
  void build() {
    auto& eng = ctx_.engine();
    const auto act = toDnnl(p_.dtype);
    xMd_ = memory::desc({p_.n, p_.c, p_.h, p_.w}, act, tag::nhwc);
    yMd_ = memory::desc({p_.n, p_.c, p_.outH(), p_.outW()}, act, tag::nhwc);
    const auto algo =
        p_.kind == PoolKind::Max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_include_padding;
    const memory::dims strides{p_.strideH, p_.strideW}, kernel{p_.kernelH, p_.kernelW}, padL{p_.padH, p_.padW};
    const memory::dims padR{farPadding(p_.h, p_.outH(), p_.kernelH, p_.strideH, p_.padH),
                            farPadding(p_.w, p_.outW(), p_.kernelW, p_.strideW, p_.padW)};
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::pooling_forward::desc fwdDesc(dnnl::prop_kind::forward_training, algo, xMd_, yMd_, strides, kernel, padL,
                                        padR);
    fwdPd_ = dnnl::pooling_forward::primitive_desc(fwdDesc, attr, eng);
    fwd_ = dnnl::pooling_forward(fwdPd_);
    dnnl::pooling_backward::desc bwdDesc(algo, xMd_, yMd_, strides, kernel, padL, padR);
    bwdPd_ = dnnl::pooling_backward::primitive_desc(bwdDesc, attr, eng, fwdPd_);
    bwd_ = dnnl::pooling_backward(bwdPd_);
  }

  CpuContext& ctx_;
  Pool2dParams p_;
  memory::desc xMd_, yMd_;
  dnnl::pooling_forward::primitive_desc fwdPd_;
  dnnl::pooling_backward::primitive_desc bwdPd_;
  dnnl::pooling_forward fwd_;
  dnnl::pooling_backward bwd_;
};

}  // namespace

std::unique_ptr<Pool2dPlan> createPool2dPlan(CpuContext& ctx, const Pool2dParams& params) {
  return std::make_unique<CpuPool2dPlan>(ctx, params);
}

}  // namespace rc::cpu
