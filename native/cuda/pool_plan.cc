// Pooling plans over our own NHWC kernels (pool.cu); max pooling keeps its argmax in the
// workspace the module owns between forward and backward.
#include "cuda_check.h"
#include "cuda_ops.h"
#include "kernels.h"

namespace rc::cuda {

namespace {

class CudaPool2dPlan final : public Pool2dPlan {
 public:
  CudaPool2dPlan(CudaContext& ctx, const Pool2dParams& p) : ctx_(ctx), p_(p) {
    RC_CHECK_ARG(p.n > 0 && p.h > 0 && p.w > 0 && p.c > 0 && p.kernelH > 0 && p.kernelW > 0 && p.strideH > 0 &&
                     p.strideW > 0 && p.padH >= 0 && p.padW >= 0,
                 "pool2d: sizes and strides must be positive and padding non-negative: " << p.str());
    RC_CHECK_ARG(p.padH * 2 <= p.kernelH && p.padW * 2 <= p.kernelW,
                 "pool2d: padding must be at most half the kernel: " << p.str());
    RC_CHECK_ARG(p.outH() > 0 && p.outW() > 0, "pool2d: the kernel does not fit the padded input: " << p.str());
    RC_CHECK_ARG(isFloating(p.dtype), "pool2d: dtype must be floating point, got " << dtypeName(p.dtype));
    RC_CHECK_ARG(p.h * p.w <= 0x7fffffff, "pool2d: an input plane of " << p.h << "x" << p.w << " is too large");
  }

  size_t workspaceBytes() const override {
    return p_.kind == PoolKind::Max ? static_cast<size_t>(p_.n * p_.outH() * p_.outW() * p_.c) * sizeof(int32_t) : 0;
  }

  void forward(const Tensor& x, const Tensor& y, const Tensor& workspace) override {
    check(x, {p_.n, p_.h, p_.w, p_.c}, "pool2d forward", "x");
    check(y, {p_.n, p_.outH(), p_.outW(), p_.c}, "pool2d forward", "y");
    checkWorkspace(workspace);
    DeviceGuard guard(ctx_.device());
    if (p_.kind == PoolKind::Max) {
      maxPoolForward(p_.dtype, x.data(), y.data(), workspace.ptr<int32_t>(), p_.n, p_.h, p_.w, p_.c, p_.outH(), p_.outW(),
                     k(p_.kernelH), k(p_.kernelW), k(p_.strideH), k(p_.strideW), k(p_.padH), k(p_.padW), ctx_.stream());
    } else {
      avgPoolForward(p_.dtype, x.data(), y.data(), p_.n, p_.h, p_.w, p_.c, p_.outH(), p_.outW(), k(p_.kernelH),
                     k(p_.kernelW), k(p_.strideH), k(p_.strideW), k(p_.padH), k(p_.padW), ctx_.stream());
    }
  }

  void backward(const Tensor& dy, const Tensor& dx, const Tensor& workspace) override {
    check(dy, {p_.n, p_.outH(), p_.outW(), p_.c}, "pool2d backward", "dy");
    check(dx, {p_.n, p_.h, p_.w, p_.c}, "pool2d backward", "dx");
    checkWorkspace(workspace);
    DeviceGuard guard(ctx_.device());
    if (p_.kind == PoolKind::Max) {
      maxPoolBackward(p_.dtype, dy.data(), dx.data(), workspace.ptr<int32_t>(), p_.n, p_.h, p_.w, p_.c, p_.outH(),
                      p_.outW(), k(p_.kernelH), k(p_.kernelW), k(p_.strideH), k(p_.strideW), k(p_.padH), k(p_.padW),
                      ctx_.stream());
    } else {
      avgPoolBackward(p_.dtype, dy.data(), dx.data(), p_.n, p_.h, p_.w, p_.c, p_.outH(), p_.outW(), k(p_.kernelH),
                      k(p_.kernelW), k(p_.strideH), k(p_.strideW), k(p_.padH), k(p_.padW), ctx_.stream());
    }
  }

 private:
  static int k(int64_t v) { return static_cast<int>(v); }

  void check(const Tensor& t, const Shape& shape, const char* op, const char* what) const {
    checkShape(t, shape, op, what);
    checkDType(t, p_.dtype, op, what);
    RC_CHECK_ARG(t.device() == ctx_.rcDevice(), op << ": " << what << " is on " << t.device().str() << ", the plan on cuda:"
                                                   << ctx_.device());
  }

  void checkWorkspace(const Tensor& workspace) const {
    if (workspaceBytes() == 0) return;
    checkDefined(workspace, "pool2d", "workspace");
    RC_CHECK_ARG(workspace.nbytes() >= workspaceBytes(),
                 "pool2d: workspace needs " << workspaceBytes() << " bytes, got " << workspace.describe());
  }

  CudaContext& ctx_;
  Pool2dParams p_;
};

}  // namespace

std::unique_ptr<Pool2dPlan> createPool2dPlan(CudaContext& ctx, const Pool2dParams& params) {
  return std::make_unique<CudaPool2dPlan>(ctx, params);
}

}  // namespace rc::cuda
