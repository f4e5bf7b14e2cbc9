// linear on cuBLAS. Row-major y[n,out] = x[n,in] W[out,in]^T is the column-major product
// Y(out x n) = W^T(out x in) X(in x n), so no transposed copies are needed; the weight gradient
// accumulates into the f32 master gradient with beta = 1 even when the inputs are bf16/f16.
#include "cuda_check.h"
#include "cuda_ops.h"
#include "kernels.h"

namespace rc::cuda {

namespace {

class CudaLinearPlan final : public LinearPlan {
 public:
  CudaLinearPlan(CudaContext& ctx, const LinearParams& p) : ctx_(ctx), p_(p) {
    if (p.dtype != DType::F32) lowWeight_ = ctx.allocate({p.out, p.in}, p.dtype);
  }

  void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y) override {
    DeviceGuard guard(ctx_.device());
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t t = toCudaDataType(p_.dtype);
    RC_CUBLAS_CHECK(cublasGemmEx(ctx_.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, dim(p_.out), dim(p_.n), dim(p_.in), &one,
                                 computeWeight(weight), t, dim(p_.in), x.data(), t, dim(p_.in), &zero, y.data(), t,
                                 dim(p_.out), computeType(), CUBLAS_GEMM_DEFAULT),
                    p_.str());
    if (p_.bias) addBias(p_.dtype, y.data(), bias.ptr<float>(), p_.n, p_.out, ctx_.stream());
  }

  void backwardData(const Tensor& dy, const Tensor& weight, const Tensor& dx) override {
    DeviceGuard guard(ctx_.device());
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t t = toCudaDataType(p_.dtype);
    // DX(in x n) = W(in x out, column-major view of [out,in]) DY(out x n)
    RC_CUBLAS_CHECK(cublasGemmEx(ctx_.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, dim(p_.in), dim(p_.n), dim(p_.out), &one,
                                 computeWeight(weight), t, dim(p_.in), dy.data(), t, dim(p_.out), &zero, dx.data(), t,
                                 dim(p_.in), computeType(), CUBLAS_GEMM_DEFAULT),
                    p_.str());
  }

  void backwardWeights(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& dBias) override {
    DeviceGuard guard(ctx_.device());
    const float one = 1.0f;
    const cudaDataType_t t = toCudaDataType(p_.dtype);
    // DW(in x out) += X(in x n) DY(out x n)^T, written as f32 whatever the input type.
    RC_CUBLAS_CHECK(cublasGemmEx(ctx_.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, dim(p_.in), dim(p_.out), dim(p_.n), &one,
                                 x.data(), t, dim(p_.in), dy.data(), t, dim(p_.out), &one, dWeight.data(), CUDA_R_32F,
                                 dim(p_.in), computeType(), CUBLAS_GEMM_DEFAULT),
                    p_.str());
    if (p_.bias) {
      accumulateBiasGrad(p_.dtype, dy.data(), dBias.ptr<float>(), p_.n, p_.out,
                         static_cast<float*>(ctx_.scratch(batchNormScratchFloats(p_.n, p_.out) * sizeof(float))),
                         ctx_.stream());
    }
  }

 private:
  // Within int range: core checked every size against the libraries' 32-bit limit.
  static int dim(int64_t v) { return static_cast<int>(v); }

  cublasComputeType_t computeType() const {
    if (p_.dtype == DType::F32) return ctx_.allowTf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    return CUBLAS_COMPUTE_32F;
  }

  const void* computeWeight(const Tensor& weight) {
    if (weight.dtype() == p_.dtype) return weight.data();
    cast(DType::F32, weight.data(), p_.dtype, lowWeight_.data(), weight.numel(), ctx_.stream());
    return lowWeight_.data();
  }

  CudaContext& ctx_;
  LinearParams p_;
  Tensor lowWeight_;
};

}  // namespace

std::unique_ptr<LinearPlan> createLinearPlan(CudaContext& ctx, const LinearParams& params) {
  return std::make_unique<CudaLinearPlan>(ctx, params);
}

}  // namespace rc::cuda
