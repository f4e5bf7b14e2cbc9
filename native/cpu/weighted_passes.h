// The three passes of a oneDNN plan over f32 master weights (conv2d and linear): the weights are
// reordered into each primitive's preferred layout before forward and backward data (read as they
// are where a primitive takes the master layout), and the weight gradient is reordered back with a
// sum post-op (+=) into the f32 master gradient; the bias gradient is summed on the host. A plan
// may compute the weight gradient otherwise (WeightGradientPath): where it is one matrix product
// over the rows (a 1x1 stride-1 convolution without bias: dW[K,C] += dy^T x), a matmul with a sum
// post-op writes it straight into the master gradient (RowGradientMatmul); conv.cc also has matrix
// products over gathered patches (patch_gradient.h). The backward-weights primitive may read x and
// dy in a layout of its own (the plan chooses): they are copied into it first (LayoutCopy). The
// layout's x and y are in the compute type (compute_type.h): bf16 tensors pass through f32 staging
// copies where oneDNN has no bf16 kernels.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "compute_type.h"
#include "cpu_context.h"

namespace rc::cpu {

// The memory descriptors a plan builds its primitives from.
struct WeightedLayout {
  dnnl::memory::desc x, y, weightF32, bias;
  dnnl::memory::dims weightDims;       // the master weights' logical dims, in oneDNN's order
  dnnl::memory::format_tag weightTag;  // their plain layout (OHWI for conv, [out,in] for linear)
  int64_t biasCount = 0;               // 0 without a bias
};

// A weight gradient computed otherwise than by the backward-weights primitive: from x and dy in the
// plan's layouts, added (+=) into the plain f32 master gradient and bias gradient.
class WeightGradientPath {
 public:
  virtual ~WeightGradientPath() = default;
  virtual void run(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& dBias) = 0;
  // What computes it, for the plan's implementation line.
  virtual std::string implementation() const = 0;
};

// c += a b as one oneDNN matmul whose sum post-op accumulates into c in place, built only where
// oneDNN runs it with its brgemm kernels (its generic gemm or reference matmul would not beat the
// convolution primitives it stands in for).
class AccumulatingMatmul {
 public:
  // The matmul for these operands, or nothing when oneDNN has no brgemm kernel for it on this CPU.
  static std::unique_ptr<AccumulatingMatmul> create(CpuContext& ctx, const dnnl::memory::desc& a,
                                                    const dnnl::memory::desc& b, const dnnl::memory::desc& c);
  AccumulatingMatmul(CpuContext& ctx, dnnl::matmul::primitive_desc pd);
  // c += a b, each tensor laid out as the descriptor it was created with.
  void run(const Tensor& a, const Tensor& b, const Tensor& c);
  std::string implementation() const { return pd_.impl_info_str(); }

 private:
  CpuContext* ctx_;
  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul matmul_;
};

// dW[out,in] += dy[rows,out]^T x[rows,in] as one AccumulatingMatmul into the plain f32 gradient:
// no blocked gradient buffer and no accumulating reorder pass. It computes no bias gradient: build
// it only for a layer without a bias.
class RowGradientMatmul final : public WeightGradientPath {
 public:
  // The matmul for these sizes, or nothing when oneDNN has no brgemm kernel for it on this CPU
  // (then the convolution's own backward-weights primitive is the better choice).
  static std::unique_ptr<RowGradientMatmul> create(CpuContext& ctx, int64_t rows, int64_t in, int64_t out,
                                                   dnnl::memory::data_type act);
  explicit RowGradientMatmul(std::unique_ptr<AccumulatingMatmul> matmul) : matmul_(std::move(matmul)) {}
  void run(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& dBias) override;
  std::string implementation() const override { return "matmul " + matmul_->implementation(); }

 private:
  std::unique_ptr<AccumulatingMatmul> matmul_;
};

// A primitive's input in the layout the primitive reads (`to`) when the plan holds it in another
// (`from`): a oneDNN reorder into layout slot `slot` of the context; no copy when they agree.
class LayoutCopy {
 public:
  LayoutCopy(CpuContext& ctx, const dnnl::memory::desc& from, const dnnl::memory::desc& to, int slot);
  bool copies() const { return reorder_.has_value(); }
  // The memory the primitive reads: `data` (laid out as `from`) itself, or its copy.
  dnnl::memory operator()(void* data);

 private:
  CpuContext* ctx_;
  dnnl::memory::desc from_, to_;
  int slot_;
  std::optional<dnnl::reorder> reorder_;
};

template <typename Forward, typename BackwardData, typename BackwardWeights>
class WeightedPasses {
 public:
  using ForwardPd = typename Forward::primitive_desc;
  using BackwardDataPd = typename BackwardData::primitive_desc;
  using BackwardWeightsPd = typename BackwardWeights::primitive_desc;

  // `ownGradient`, when given, computes the weight gradient in place of the primitive.
  void build(CpuContext& ctx, const WeightedLayout& layout, ForwardPd fwdPd, BackwardDataPd bwdDataPd,
             BackwardWeightsPd bwdWeightsPd, std::unique_ptr<WeightGradientPath> ownGradient = nullptr) {
    ctx_ = &ctx;
    layout_ = layout;
    fwdPd_ = fwdPd;
    bwdDataPd_ = bwdDataPd;
    bwdWeightsPd_ = bwdWeightsPd;
    fwd_ = Forward(fwdPd_);
    bwdData_ = BackwardData(bwdDataPd_);
    bwdWeights_ = BackwardWeights(bwdWeightsPd_);
    accumulateWeight_ = accumulatingReorder(ctx, bwdWeightsPd_.diff_weights_desc(), layout.weightF32);
    fwdReorder_.emplace(ctx, layout.weightDims, layout.weightTag, fwdPd_.weights_desc());
    bwdReorder_.emplace(ctx, layout.weightDims, layout.weightTag, bwdDataPd_.weights_desc());
    fwdWeight_ = ctx.allocateBytes(fwdPd_.weights_desc().get_size());
    bwdWeight_ = ctx.allocateBytes(bwdDataPd_.weights_desc().get_size());
    ownGradient_ = std::move(ownGradient);
    if (!ownGradient_) diffWeight_ = ctx.allocateBytes(bwdWeightsPd_.diff_weights_desc().get_size());
    xForGradient_.emplace(ctx, layout.x, bwdWeightsPd_.src_desc(), 0);
    dyForGradient_.emplace(ctx, layout.y, bwdWeightsPd_.diff_dst_desc(), 1);
    if (layout.biasCount > 0) diffBias_ = ctx.allocate({layout.biasCount}, DType::F32);
  }

  // Whether the weight gradient runs otherwise than the primitive on the plan's own layouts.
  bool hasOwnWeightGradientPath() const { return ownGradient_ || xForGradient_->copies() || dyForGradient_->copies(); }

  // The weight gradient's implementation: the plan's own path when it has one, else the primitive's.
  std::string weightGradientImplementation() const {
    if (ownGradient_) return ownGradient_->implementation();
    const std::string primitive = bwdWeightsPd_.impl_info_str();
    return xForGradient_->copies() || dyForGradient_->copies() ? primitive + " on channel-blocked copies" : primitive;
  }

  const ForwardPd& forwardPd() const { return fwdPd_; }

  void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y) {
    auto& eng = ctx_->engine();
    void* laidOut = fwdReorder_->laidOut(weight, fwdWeight_);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(layout_.x, eng, stageInput(*ctx_, x, layout_.x, 0))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(fwdPd_.weights_desc(), eng, laidOut)},
        {DNNL_ARG_DST, dnnl::memory(layout_.y, eng, stageOutput(*ctx_, y, layout_.y, 1))},
        {DNNL_ARG_SCRATCHPAD, scratchpad(fwdPd_.scratchpad_desc())}};
    if (hasBias()) args.emplace(DNNL_ARG_BIAS, dnnl::memory(layout_.bias, eng, bias.data()));
    fwd_.execute(ctx_->stream(), args);
    finishOutput(*ctx_, y, layout_.y, 1);
  }

  void backwardData(const Tensor& dy, const Tensor& weight, const Tensor& dx) {
    auto& eng = ctx_->engine();
    void* laidOut = bwdReorder_->laidOut(weight, bwdWeight_);
    bwdData_.execute(ctx_->stream(),
                     {{DNNL_ARG_DIFF_DST, dnnl::memory(layout_.y, eng, stageInput(*ctx_, dy, layout_.y, 0))},
                      {DNNL_ARG_WEIGHTS, dnnl::memory(bwdDataPd_.weights_desc(), eng, laidOut)},
                      {DNNL_ARG_DIFF_SRC, dnnl::memory(layout_.x, eng, stageOutput(*ctx_, dx, layout_.x, 1))},
                      {DNNL_ARG_SCRATCHPAD, scratchpad(bwdDataPd_.scratchpad_desc())}});
    finishOutput(*ctx_, dx, layout_.x, 1);
  }

  void backwardWeights(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& dBias) {
    if (ownGradient_) {
      ownGradient_->run(x, dy, dWeight, dBias);
      return;
    }
    auto& eng = ctx_->engine();
    auto& s = ctx_->stream();
    const auto dwMd = bwdWeightsPd_.diff_weights_desc();
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, (*xForGradient_)(stageInput(*ctx_, x, layout_.x, 0))},
        {DNNL_ARG_DIFF_DST, (*dyForGradient_)(stageInput(*ctx_, dy, layout_.y, 1))},
        {DNNL_ARG_DIFF_WEIGHTS, dnnl::memory(dwMd, eng, diffWeight_.data())},
        {DNNL_ARG_SCRATCHPAD, scratchpad(bwdWeightsPd_.scratchpad_desc())}};
    if (hasBias()) args.emplace(DNNL_ARG_DIFF_BIAS, dnnl::memory(layout_.bias, eng, diffBias_.data()));
    bwdWeights_.execute(s, args);
    dnnl::memory blocked(dwMd, eng, diffWeight_.data());
    dnnl::memory plain(layout_.weightF32, eng, dWeight.data());
    accumulateWeight_.execute(s, blocked, plain);
    if (hasBias()) {
      const float* src = diffBias_.ptr<float>();
      float* dst = dBias.ptr<float>();
      for (int64_t i = 0; i < layout_.biasCount; ++i) dst[i] += src[i];
    }
  }

 private:
  bool hasBias() const { return layout_.biasCount > 0; }

  dnnl::memory scratchpad(const dnnl::memory::desc& desc) {
    return dnnl::memory(desc, ctx_->engine(), ctx_->scratch(desc.get_size()));
  }

  CpuContext* ctx_ = nullptr;
  WeightedLayout layout_;
  ForwardPd fwdPd_;
  BackwardDataPd bwdDataPd_;
  BackwardWeightsPd bwdWeightsPd_;
  Forward fwd_;
  BackwardData bwdData_;
  BackwardWeights bwdWeights_;
  dnnl::reorder accumulateWeight_;
  std::optional<WeightReorder> fwdReorder_, bwdReorder_;
  std::unique_ptr<WeightGradientPath> ownGradient_;
  std::optional<LayoutCopy> xForGradient_, dyForGradient_;
  Tensor fwdWeight_, bwdWeight_, diffWeight_, diffBias_;
};

// Conv2dPlan or LinearPlan over WeightedPasses: each pass runs under dnnlGuard, named by the
// plan's description; the derived plan builds `passes_`.
template <typename Plan, typename Forward, typename BackwardData, typename BackwardWeights>
class WeightedPlan : public Plan {
 public:
  void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y) override {
    dnnlGuard(description_ + " forward", [&] { passes_.forward(x, weight, bias, y); });
  }

  void backwardData(const Tensor& dy, const Tensor& weight, const Tensor& dx) override {
    dnnlGuard(description_ + " backward data", [&] { passes_.backwardData(dy, weight, dx); });
  }

  void backwardWeights(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& dBias) override {
    dnnlGuard(description_ + " backward weights", [&] { passes_.backwardWeights(x, dy, dWeight, dBias); });
  }

 protected:
  explicit WeightedPlan(std::string description) : description_(std::move(description)) {}

  WeightedPasses<Forward, BackwardData, BackwardWeights> passes_;

 private:
  std::string description_;
};

}  // namespace rc::cpu
