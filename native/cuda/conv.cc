// conv2d on cuDNN: NHWC activations and KRSC (OHWI) filters, so the tensor-core kernels run
// without layout transforms. Algorithms are benchmarked once per shape (cudnnFind*Ex, like
// PyTorch's cudnn.benchmark) and remembered for the process; the workspace is the context's scratch.
#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

#include "cuda_check.h"
#include "cuda_ops.h"
#include "handles.h"
#include "kernels.h"

namespace rc::cuda {

namespace {

// The algorithm of each pass with the math type cuDNN measured it under: the search may report
// its best result under another math type than the descriptor's, and an algorithm runs the kernel
// of the descriptor's math type, so each pass sets its own before it runs (as PyTorch does).
struct ConvAlgorithms {
  cudnnConvolutionFwdAlgo_t forward;
  cudnnConvolutionBwdDataAlgo_t backwardData;
  cudnnConvolutionBwdFilterAlgo_t backwardFilter;
  cudnnMathType_t forwardMath;
  cudnnMathType_t backwardDataMath;
  cudnnMathType_t backwardFilterMath;
  size_t workspaceBytes;
};

std::mutex gAlgorithmMutex;
std::map<std::string, ConvAlgorithms> gAlgorithms;  // by device, shape, dtype and math mode

// The most workspace an algorithm may ask for: a quarter of what is free, at most 1 GiB.
size_t workspaceLimit() {
  size_t freeBytes = 0, totalBytes = 0;
  RC_CUDA_CHECK(cudaMemGetInfo(&freeBytes, &totalBytes));
  return std::min(freeBytes / 4, size_t{1} << 30);
}

class CudaConv2dPlan final : public Conv2dPlan {
 public:
  CudaConv2dPlan(CudaContext& ctx, const Conv2dParams& p) : ctx_(ctx), p_(p) {
    DeviceGuard guard(ctx.device());
    RC_CUDNN_CHECK(cudnnCreateTensorDescriptor(xDesc_.out()), p.str());
    RC_CUDNN_CHECK(cudnnCreateTensorDescriptor(yDesc_.out()), p.str());
    RC_CUDNN_CHECK(cudnnCreateFilterDescriptor(wDesc_.out()), p.str());
    RC_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(convDesc_.out()), p.str());
    const cudnnDataType_t dt = toCudnn(p.dtype);
    RC_CUDNN_CHECK(cudnnSetTensor4dDescriptor(xDesc_, CUDNN_TENSOR_NHWC, dt, static_cast<int>(p.n),
                                              static_cast<int>(p.c), static_cast<int>(p.h), static_cast<int>(p.w)),
                   p.str());
    RC_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(yDesc_, CUDNN_TENSOR_NHWC, dt, static_cast<int>(p.n), static_cast<int>(p.k),
                                   static_cast<int>(p.outH()), static_cast<int>(p.outW())),
        p.str());
    RC_CUDNN_CHECK(
        cudnnSetFilter4dDescriptor(wDesc_, dt, CUDNN_TENSOR_NHWC, static_cast<int>(p.k), static_cast<int>(p.c),
                                   static_cast<int>(p.kernelH), static_cast<int>(p.kernelW)),
        p.str());
    RC_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(convDesc_, static_cast<int>(p.padH), static_cast<int>(p.padW),
                                                   static_cast<int>(p.strideH), static_cast<int>(p.strideW),
                                                   static_cast<int>(p.dilationH), static_cast<int>(p.dilationW),
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                   p.str());
    const bool f32 = p.dtype == DType::F32;
    // f32 uses plain FMA unless TF32 is allowed; bf16/f16 always use the tensor cores.
    const cudnnMathType_t math = f32 ? (ctx.allowTf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH) : CUDNN_TENSOR_OP_MATH;
    RC_CUDNN_CHECK(cudnnSetConvolutionMathType(convDesc_, math), p.str());
    currentMath_ = math;
    int on = 0, oc = 0, oh = 0, ow = 0;
    RC_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(convDesc_, xDesc_, wDesc_, &on, &oc, &oh, &ow), p.str());
    RC_CHECK_ARG(oh == p.outH() && ow == p.outW(),
                 "conv2d: cuDNN computes an output of " << oh << "x" << ow << " for " << p.str());
    algorithms_ = findAlgorithms(math);
    if (p.dtype != DType::F32) {
      lowWeight_ = ctx.allocate({p.k, p.kernelH, p.kernelW, p.c}, p.dtype);
      lowWeightGrad_ = ctx.allocate({p.k, p.kernelH, p.kernelW, p.c}, p.dtype);
    }
  }

  void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y) override {
    DeviceGuard guard(ctx_.device());
    setMath(algorithms_.forwardMath);
    const float one = 1.0f, zero = 0.0f;
    RC_CUDNN_CHECK(
        cudnnConvolutionForward(ctx_.cudnn(), &one, xDesc_, x.data(), wDesc_, computeWeight(weight), convDesc_,
                                algorithms_.forward, workspace(), algorithms_.workspaceBytes, &zero, yDesc_, y.data()),
        p_.str());
    if (p_.bias) addBias(p_.dtype, y.data(), bias.ptr<float>(), p_.n * p_.outH() * p_.outW(), p_.k, ctx_.stream());
  }

  void backwardData(const Tensor& dy, const Tensor& weight, const Tensor& dx) override {
    backwardDataBlended(dy, weight, dx, 0.0f);
  }

  // cuDNN blends the result into dx (beta = 1): no separate add pass.
  void backwardDataAccumulate(const Tensor& dy, const Tensor& weight, const Tensor& dx) override {
    backwardDataBlended(dy, weight, dx, 1.0f);
  }

  void backwardWeights(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& dBias) override {
    DeviceGuard guard(ctx_.device());
    setMath(algorithms_.backwardFilterMath);
    const float one = 1.0f, zero = 0.0f;
    if (p_.dtype == DType::F32) {
      // beta = 1 accumulates into the f32 gradient directly.
      RC_CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx_.cudnn(), &one, xDesc_, x.data(), yDesc_, dy.data(), convDesc_,
                                                    algorithms_.backwardFilter, workspace(), algorithms_.workspaceBytes,
                                                    &one, wDesc_, dWeight.data()),
                     p_.str());
    } else {
      // The filter gradient has the activations' type; accumulate it into the f32 master gradient.
      RC_CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx_.cudnn(), &one, xDesc_, x.data(), yDesc_, dy.data(), convDesc_,
                                                    algorithms_.backwardFilter, workspace(), algorithms_.workspaceBytes,
                                                    &zero, wDesc_, lowWeightGrad_.data()),
                     p_.str());
      accumulateF32(p_.dtype, lowWeightGrad_.data(), dWeight.ptr<float>(), dWeight.numel(), ctx_.stream());
    }
    if (p_.bias) {
      const int64_t rows = p_.n * p_.outH() * p_.outW();
      accumulateBiasGrad(p_.dtype, dy.data(), dBias.ptr<float>(), rows, p_.k,
                         static_cast<float*>(ctx_.scratch(batchNormScratchFloats(rows, p_.k) * sizeof(float))),
                         ctx_.stream());
    }
  }

  std::string implementation() const override {
    std::ostringstream out;
    out << "cudnn:fwd=" << static_cast<int>(algorithms_.forward)
        << ",bwd_data=" << static_cast<int>(algorithms_.backwardData)
        << ",bwd_filter=" << static_cast<int>(algorithms_.backwardFilter);
    return out.str();
  }

 private:
  // dx = conv_transpose(dy, weight) + beta * dx.
  void backwardDataBlended(const Tensor& dy, const Tensor& weight, const Tensor& dx, float beta) {
    DeviceGuard guard(ctx_.device());
    setMath(algorithms_.backwardDataMath);
    const float one = 1.0f;
    RC_CUDNN_CHECK(cudnnConvolutionBackwardData(ctx_.cudnn(), &one, wDesc_, computeWeight(weight), yDesc_, dy.data(),
                                                convDesc_, algorithms_.backwardData, workspace(),
                                                algorithms_.workspaceBytes, &beta, xDesc_, dx.data()),
                   p_.str());
  }

  // The weights in the compute type: f32 masters are converted into the plan's buffer.
  const void* computeWeight(const Tensor& weight) {
    if (weight.dtype() == p_.dtype) return weight.data();
    cast(DType::F32, weight.data(), p_.dtype, lowWeight_.data(), weight.numel(), ctx_.stream());
    return lowWeight_.data();
  }

  void* workspace() { return algorithms_.workspaceBytes ? ctx_.scratch(algorithms_.workspaceBytes) : nullptr; }

  // A host-side descriptor setting (no device work), so it is safe inside graph capture.
  void setMath(cudnnMathType_t math) {
    if (math == currentMath_) return;
    RC_CUDNN_CHECK(cudnnSetConvolutionMathType(convDesc_, math), p_.str());
    currentMath_ = math;
  }

  ConvAlgorithms findAlgorithms(cudnnMathType_t math) {
    std::ostringstream key;
    key << ctx_.device() << "|" << p_.str() << "|math" << static_cast<int>(math)
        << (ctx_.deterministic() ? "|det" : "");
    {
      std::lock_guard<std::mutex> lock(gAlgorithmMutex);
      auto it = gAlgorithms.find(key.str());
      if (it != gAlgorithms.end()) return it->second;
    }
    const size_t limit = workspaceLimit();
    // Benchmark on non-zero data: zeros can run faster than real values.
    Tensor x = ctx_.allocate({p_.n, p_.h, p_.w, p_.c}, p_.dtype);
    Tensor w = ctx_.allocate({p_.k, p_.kernelH, p_.kernelW, p_.c}, p_.dtype);
    Tensor y = ctx_.allocate({p_.n, p_.outH(), p_.outW(), p_.k}, p_.dtype);
    // Each search also writes its output (y, then x, then w), which the next one reads: refilled
    // before every search.
    auto fill = [&] {
      for (const Tensor* t : {&x, &w, &y}) RC_CUDA_CHECK(cudaMemsetAsync(t->data(), 0x3c, t->nbytes(), ctx_.stream()));
    };
    Tensor ws = ctx_.allocate({static_cast<int64_t>(limit)}, DType::U8);
    ConvAlgorithms chosen{};
    constexpr int kMax = 16;
    int returned = 0;
    {
      cudnnConvolutionFwdAlgoPerf_t perf[kMax];
      fill();
      RC_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(ctx_.cudnn(), xDesc_, x.data(), wDesc_, w.data(), convDesc_,
                                                            yDesc_, y.data(), kMax, &returned, perf, ws.data(), limit),
                     p_.str());
      const auto* best = pick(perf, returned, limit, "forward");
      chosen.forward = best->algo;
      chosen.forwardMath = best->mathType;
      chosen.workspaceBytes = std::max(chosen.workspaceBytes, best->memory);
    }
    {
      cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
      fill();
      RC_CUDNN_CHECK(
          cudnnFindConvolutionBackwardDataAlgorithmEx(ctx_.cudnn(), wDesc_, w.data(), yDesc_, y.data(), convDesc_,
                                                      xDesc_, x.data(), kMax, &returned, perf, ws.data(), limit),
          p_.str());
      const auto* best = pick(perf, returned, limit, "backward data");
      chosen.backwardData = best->algo;
      chosen.backwardDataMath = best->mathType;
      chosen.workspaceBytes = std::max(chosen.workspaceBytes, best->memory);
    }
    {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
      fill();
      RC_CUDNN_CHECK(
          cudnnFindConvolutionBackwardFilterAlgorithmEx(ctx_.cudnn(), xDesc_, x.data(), yDesc_, y.data(), convDesc_,
                                                        wDesc_, w.data(), kMax, &returned, perf, ws.data(), limit),
          p_.str());
      const auto* best = pick(perf, returned, limit, "backward filter");
      chosen.backwardFilter = best->algo;
      chosen.backwardFilterMath = best->mathType;
      chosen.workspaceBytes = std::max(chosen.workspaceBytes, best->memory);
    }
    std::lock_guard<std::mutex> lock(gAlgorithmMutex);
    gAlgorithms[key.str()] = chosen;
    return chosen;
  }

  // cudnnFind* returns candidates fastest first; take the first that ran, fits the workspace and,
  // in deterministic mode, gives the same bits on every run.
  template <typename Perf>
  const Perf* pick(const Perf* perf, int count, size_t limit, const char* pass) const {
    const bool deterministic = ctx_.deterministic();
    for (int i = 0; i < count; ++i) {
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit &&
          (!deterministic || perf[i].determinism == CUDNN_DETERMINISTIC)) {
        return &perf[i];
      }
    }
    RC_THROW(code::kCudnn, "cuDNN found no " << (deterministic ? "deterministic " : "") << pass << " algorithm for "
                                             << p_.str() << " within " << formatBytes(limit) << " of workspace");
  }

  CudaContext& ctx_;
  Conv2dParams p_;
  TensorDescriptor xDesc_, yDesc_;
  FilterDescriptor wDesc_;
  ConvolutionDescriptor convDesc_;
  ConvAlgorithms algorithms_{};
  cudnnMathType_t currentMath_ = CUDNN_DEFAULT_MATH;
  Tensor lowWeight_, lowWeightGrad_;
};

}  // namespace

std::unique_ptr<Conv2dPlan> createConv2dPlan(CudaContext& ctx, const Conv2dParams& params) {
  return std::make_unique<CudaConv2dPlan>(ctx, params);
}

}  // namespace rc::cuda
