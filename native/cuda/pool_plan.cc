// Pooling plans over our own NHWC kernels (pool.cu); max pooling keeps its argmax in the
// workspace the module owns between forward and backward.
#include "cuda_check.h"
#include "cuda_ops.h"
#include "kernels.h"

namespace rc::cuda {

namespace {

class CudaPool2dPlan final : public Pool2dPlan {
 public:
  CudaPool2dPlan(CudaContext& ctx, const Pool2dParams& p) : ctx_(ctx), p_(p) {}

  size_t workspaceBytes() const override {
    return p_.kind == PoolKind::Max ? static_cast<size_t>(p_.n * p_.outH() * p_.outW() * p_.c) * sizeof(int32_t) : 0;
  }

  void forward(const Tensor& x, const Tensor& y, const Tensor& workspace) override {
    DeviceGuard guard(ctx_.device());
    if (p_.kind == PoolKind::Max) {
      maxPoolForward(p_.dtype, x.data(), y.data(), workspace.ptr<int32_t>(), p_.n, p_.h, p_.w, p_.c, p_.outH(),
                     p_.outW(), k(p_.kernelH), k(p_.kernelW), k(p_.strideH), k(p_.strideW), k(p_.padH), k(p_.padW),
                     ctx_.stream());
    } else {
      avgPoolForward(p_.dtype, x.data(), y.data(), p_.n, p_.h, p_.w, p_.c, p_.outH(), p_.outW(), k(p_.kernelH),
                     k(p_.kernelW), k(p_.strideH), k(p_.strideW), k(p_.padH), k(p_.padW), ctx_.stream());
    }
  }

  void backward(const Tensor& dy, const Tensor& dx, const Tensor& workspace) override {
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

  CudaContext& ctx_;
  Pool2dParams p_;
};

}  // namespace

std::unique_ptr<Pool2dPlan> createPool2dPlan(CudaContext& ctx, const Pool2dParams& params) {
  return std::make_unique<CudaPool2dPlan>(ctx, params);
}

}  // namespace rc::cuda
