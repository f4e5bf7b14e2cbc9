// The conv-bn fused convolution (see fused_conv.h) as a cuDNN operation graph:
//
//   x --MUL scale--> t1 --ADD shift--> t2 --RELU--> t3 --CONV w--> y --GEN_STATS--> sum, sqSum
//   \______________ prologue (when scale/shift are given) ______/        \__ epilogue (when asked) __/
//
// the conv-genstats and scale-bias-relu-conv patterns of cuDNN's runtime fusion engines
// (https://docs.nvidia.com/deeplearning/cudnn/backend/latest/developer/graph-api.html, "Generic
// Runtime Fusion Engines"). The intermediates t1..t3 are virtual f32 tensors: the prologue runs on
// the operand as the convolution loads it, and y is written once. x, w and y are bf16 or f16 (the
// fusion engines' 16-bit I/O; f32 activations are refused), 16-byte aligned with channel counts
// that are multiples of 8; scale, shift and the sums are f32.
#include <memory>
#include <sstream>

#include "cuda_check.h"
#include "fused_conv.h"
#include "graph_api.h"
#include "kernels.h"

namespace rc::cuda {

namespace {

enum Uid : int64_t { kX = 1, kW, kY, kScale, kShift, kSum, kSqSum, kScaled, kShifted, kActivated };

struct ConvBnShape {
  int64_t n, h, w, c, k, r, s, p, q;
  int64_t strideH, strideW, padH, padW, dilationH, dilationW;
  DType dtype;
  bool prologue, stats;

  std::string str() const {
    std::ostringstream out;
    out << "conv-bn x[" << n << "," << h << "," << w << "," << c << "] w[" << k << "," << r << "," << s << "," << c
        << "] y[" << n << "," << p << "," << q << "," << k << "] stride " << strideH << "x" << strideW << " pad "
        << padH << "x" << padW << " dilation " << dilationH << "x" << dilationW << " " << dtypeName(dtype)
        << (prologue ? " +scale-bias-relu" : "") << (stats ? " +genstats" : "");
    return out.str();
  }
};

cudnnDataType_t cudnnType(DType d) { return d == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()) % 16 == 0; }

}  // namespace

// One shape's execution plan and its low-precision copy of the f32 master weights.
class ConvBnGraph {
 public:
  ConvBnGraph(CudaContext& ctx, const ConvBnShape& s) : shape_(s) {
    using graph::Descriptor;
    using graph::TensorSpec;
    const std::string what = s.str();
    const cudnnDataType_t io = cudnnType(s.dtype);
    Descriptor x = graph::channelsLastTensor(TensorSpec{kX, {s.n, s.c, s.h, s.w}, io, 16, false, what + " x"});
    Descriptor w = graph::channelsLastTensor(TensorSpec{kW, {s.k, s.c, s.r, s.s}, io, 16, false, what + " w"});
    Descriptor y = graph::channelsLastTensor(TensorSpec{kY, {s.n, s.k, s.p, s.q}, io, 16, false, what + " y"});
    Descriptor conv = graph::convolution2d(
        graph::Convolution2dSpec{s.padH, s.padW, s.strideH, s.strideW, s.dilationH, s.dilationW}, what);
    std::vector<Descriptor> owned;  // the prologue's tensors and nodes, kept until the plan is made
    std::vector<const Descriptor*> ops;
    const Descriptor* convInput = &x;
    if (s.prologue) {
      auto vec = [&](int64_t uid, const char* name) {
        return graph::channelsLastTensor(TensorSpec{uid, {1, s.c, 1, 1}, CUDNN_DATA_FLOAT, 4, false, what + name});
      };
      auto virt = [&](int64_t uid, const char* name) {
        return graph::channelsLastTensor(
            TensorSpec{uid, {s.n, s.c, s.h, s.w}, CUDNN_DATA_FLOAT, 16, true, what + name});
      };
      owned.reserve(9);
      owned.push_back(vec(kScale, " scale"));
      owned.push_back(vec(kShift, " shift"));
      owned.push_back(virt(kScaled, " x*scale"));
      owned.push_back(virt(kShifted, " x*scale+shift"));
      owned.push_back(virt(kActivated, " relu(x*scale+shift)"));
      owned.push_back(graph::pointwise(CUDNN_POINTWISE_MUL, x, &owned[0], owned[2], what + " prologue mul"));
      owned.push_back(graph::pointwise(CUDNN_POINTWISE_ADD, owned[2], &owned[1], owned[3], what + " prologue add"));
      owned.push_back(graph::pointwise(CUDNN_POINTWISE_RELU_FWD, owned[3], nullptr, owned[4], what + " prologue relu"));
      ops = {&owned[5], &owned[6], &owned[7]};
      convInput = &owned[4];
    }
    Descriptor forward = graph::convolutionForward(conv, *convInput, w, y, what + " convolution");
    ops.push_back(&forward);
    std::unique_ptr<Descriptor> sum, sqSum, stats;
    if (s.stats) {
      sum = std::make_unique<Descriptor>(
          graph::channelsLastTensor(TensorSpec{kSum, {1, s.k, 1, 1}, CUDNN_DATA_FLOAT, 4, false, what + " sum"}));
      sqSum = std::make_unique<Descriptor>(
          graph::channelsLastTensor(TensorSpec{kSqSum, {1, s.k, 1, 1}, CUDNN_DATA_FLOAT, 4, false, what + " sqsum"}));
      stats = std::make_unique<Descriptor>(graph::genStats(y, *sum, *sqSum, what + " statistics"));
      ops.push_back(stats.get());
    }
    plan_ = std::make_unique<graph::ExecutionPlan>(ctx.cudnn(), ops, what);
    lowWeight_ = ctx.allocate({s.k, s.r, s.s, s.c}, s.dtype);
  }

  void run(CudaContext& ctx, const ConvBnForwardArgs& a) {
    const void* weight = a.weight.data();
    if (a.weight.dtype() != shape_.dtype) {
      cast(a.weight.dtype(), a.weight.data(), shape_.dtype, lowWeight_.data(), a.weight.numel(), ctx.stream());
      weight = lowWeight_.data();
    }
    std::vector<int64_t> uids = {kX, kW, kY};
    std::vector<void*> pointers = {a.x.data(), const_cast<void*>(weight), a.y.data()};
    if (shape_.prologue) {
      uids.insert(uids.end(), {kScale, kShift});
      pointers.insert(pointers.end(), {a.scale.data(), a.shift.data()});
    }
    if (shape_.stats) {
      uids.insert(uids.end(), {kSum, kSqSum});
      pointers.insert(pointers.end(), {a.sum.data(), a.sqSum.data()});
    }
    const auto bytes = static_cast<size_t>(plan_->workspaceBytes());
    void* workspace = bytes > 0 ? ctx.scratch(bytes) : nullptr;
    plan_->execute(ctx.cudnn(), uids, pointers, workspace);
  }

 private:
  ConvBnShape shape_;
  std::unique_ptr<graph::ExecutionPlan> plan_;
  Tensor lowWeight_;
};

ConvBnFusion::ConvBnFusion(CudaContext& ctx) : ctx_(ctx) {}

ConvBnFusion::~ConvBnFusion() = default;

void ConvBnFusion::forward(const ConvBnForwardArgs& a) {
  const Shape& xs = a.x.shape();
  const Shape& ws = a.weight.shape();
  const Shape& ys = a.y.shape();
  const ConvBnShape s{xs[0],
                      xs[1],
                      xs[2],
                      xs[3],
                      ws[0],
                      ws[1],
                      ws[2],
                      ys[1],
                      ys[2],
                      a.strideH,
                      a.strideW,
                      a.padH,
                      a.padW,
                      a.dilationH,
                      a.dilationW,
                      a.x.dtype(),
                      a.scale.defined(),
                      a.sum.defined()};
  RC_CHECK_ARG(s.dtype == DType::BF16 || s.dtype == DType::F16,
               "conv-bn: x is " << dtypeName(s.dtype)
                                << "; the fused convolution takes bf16 or f16 activations (cuDNN's runtime fusion "
                                   "engines fuse 16-bit convolutions); use the unfused path for f32");
  RC_CHECK_ARG(s.c % 8 == 0 && s.k % 8 == 0, "conv-bn: input channels ("
                                                 << s.c << ") and output channels (" << s.k
                                                 << ") must be multiples of 8 for the fused convolution");
  RC_CHECK_ARG(aligned16(a.x) && aligned16(a.y) && (a.weight.dtype() != s.dtype || aligned16(a.weight)),
               "conv-bn: x, y and the weights must be 16-byte aligned");
  DeviceGuard guard(ctx_.device());
  plans_.get(s.str(), [&] { return std::make_unique<ConvBnGraph>(ctx_, s); })->run(ctx_, a);
}

std::string ConvBnFusion::refusal(const ConvBnSupportArgs& a, bool prologue) {
  const int64_t p = windowOutputSize(a.h, a.r, a.strideH, a.padH, a.dilationH);
  const int64_t q = windowOutputSize(a.w, a.s, a.strideW, a.padW, a.dilationW);
  const ConvBnShape s{a.n,       a.h,       a.w,    a.c,    a.k,         a.r,         a.s,     p,        q,
                      a.strideH, a.strideW, a.padH, a.padW, a.dilationH, a.dilationW, a.dtype, prologue, true};
  DeviceGuard guard(ctx_.device());
  return plans_.refusal(s.str(), [&] { return std::make_unique<ConvBnGraph>(ctx_, s); });
}

}  // namespace rc::cuda
