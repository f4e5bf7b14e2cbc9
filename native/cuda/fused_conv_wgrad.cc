// The filter gradient of y = conv(relu(x * scale + shift), w) (see ConvWgradSbrArgs) as one cuDNN
// operation graph:
//
//   t1 = MUL(x, scale), t2 = ADD(t1, shift), a = RELU_FWD(t2)   (virtual, f32: the forward's operand)
//   dw = CONV_BWD_FILTER(a, dy)                                  (written, x's dtype)
//
// the ConvBNwgrad pattern (scale + bias + ReLU + wgrad) of cuDNN's fusion engines
// (https://docs.nvidia.com/deeplearning/cudnn/backend/latest/developer/graph-api.html, "Specialized
// Pre-Compiled Engines", ConvBNwgrad, which needs all intermediate tensors virtual and 16-byte
// aligned NHWC I/O), so the normalised activation is recomputed as the convolution loads x and
// never written. NVIDIA documents that pre-compiled engine for FP16 x, scale, bias and dy; here
// scale and shift stay f32 (the forward prologue's) and bf16 graphs are built the same way, so on
// a device where no engine takes the graph ExecutionPlan throws with each engine's refusal. dw is
// written in x's dtype, as the unfused backward filter writes it, into a buffer of the plan's own;
// accumulateF32 then adds it to the caller's f32 master gradient.
#include "fused_conv_wgrad.h"

#include <memory>
#include <sstream>

#include "cuda_check.h"
#include "graph_api.h"
#include "kernels.h"

namespace rc::cuda {

namespace {

enum Uid : int64_t { kX = 1, kDy, kDw, kScale, kShift, kScaled, kShifted, kActivated };

struct WgradSbrShape {
  int64_t n, h, w, c, k, r, s, p, q;
  int64_t strideH, strideW, padH, padW, dilationH, dilationW;
  DType dtype;

  std::string str() const {
    std::ostringstream out;
    out << "conv wgrad sbr x[" << n << "," << h << "," << w << "," << c << "] dy[" << n << "," << p << "," << q << ","
        << k << "] dw[" << k << "," << r << "," << s << "," << c << "] stride " << strideH << "x" << strideW << " pad "
        << padH << "x" << padW << " dilation " << dilationH << "x" << dilationW << " " << dtypeName(dtype);
    return out.str();
  }
};

cudnnDataType_t cudnnType(DType d) { return d == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

}  // namespace

// One shape's execution plan and its low-precision filter gradient.
class WgradSbrGraph {
 public:
  WgradSbrGraph(CudaContext& ctx, const WgradSbrShape& s) : shape_(s) {
    using graph::Descriptor;
    using graph::TensorSpec;
    const std::string what = s.str();
    const cudnnDataType_t io = cudnnType(s.dtype);
    auto act = [&](int64_t uid, cudnnDataType_t type, bool isVirtual, const char* name) {
      return graph::channelsLastTensor(TensorSpec{uid, {s.n, s.c, s.h, s.w}, type, 16, isVirtual, what + name});
    };
    auto vec = [&](int64_t uid, const char* name) {
      return graph::channelsLastTensor(TensorSpec{uid, {1, s.c, 1, 1}, CUDNN_DATA_FLOAT, 4, false, what + name});
    };
    Descriptor x = act(kX, io, false, " x");
    Descriptor dy = graph::channelsLastTensor(TensorSpec{kDy, {s.n, s.k, s.p, s.q}, io, 16, false, what + " dy"});
    Descriptor dw = graph::channelsLastTensor(TensorSpec{kDw, {s.k, s.c, s.r, s.s}, io, 16, false, what + " dw"});
    Descriptor scale = vec(kScale, " scale"), shift = vec(kShift, " shift");
    Descriptor scaled = act(kScaled, CUDNN_DATA_FLOAT, true, " x*scale");
    Descriptor shifted = act(kShifted, CUDNN_DATA_FLOAT, true, " x*scale+shift");
    Descriptor activated = act(kActivated, CUDNN_DATA_FLOAT, true, " relu(x*scale+shift)");
    Descriptor conv = graph::convolution2d(
        graph::Convolution2dSpec{s.padH, s.padW, s.strideH, s.strideW, s.dilationH, s.dilationW}, what);
    Descriptor mul = graph::pointwise(CUDNN_POINTWISE_MUL, x, &scale, scaled, what + " prologue mul");
    Descriptor add = graph::pointwise(CUDNN_POINTWISE_ADD, scaled, &shift, shifted, what + " prologue add");
    Descriptor relu = graph::pointwise(CUDNN_POINTWISE_RELU_FWD, shifted, nullptr, activated, what + " prologue relu");
    Descriptor wgrad = graph::convolutionBackwardFilter(conv, activated, dy, dw, what + " convolution backward filter");
    plan_ = std::make_unique<graph::ExecutionPlan>(ctx.cudnn(),
                                                   std::vector<const Descriptor*>{&mul, &add, &relu, &wgrad}, what);
    lowGrad_ = ctx.allocate({s.k, s.r, s.s, s.c}, s.dtype);
  }

  void run(CudaContext& ctx, const ConvWgradSbrArgs& a) {
    const std::vector<int64_t> uids = {kX, kDy, kDw, kScale, kShift};
    const std::vector<void*> pointers = {a.x.data(), a.dy.data(), lowGrad_.data(), a.scale.data(), a.shift.data()};
    const auto bytes = static_cast<size_t>(plan_->workspaceBytes());
    void* workspace = bytes > 0 ? ctx.scratch(bytes) : nullptr;
    plan_->execute(ctx.cudnn(), uids, pointers, workspace);
    accumulateF32(shape_.dtype, lowGrad_.data(), a.dWeight.ptr<float>(), a.dWeight.numel(), ctx.stream());
  }

 private:
  WgradSbrShape shape_;
  std::unique_ptr<graph::ExecutionPlan> plan_;
  Tensor lowGrad_;
};

WgradSbrFusion::WgradSbrFusion(CudaContext& ctx) : ctx_(ctx) {}

WgradSbrFusion::~WgradSbrFusion() = default;

void WgradSbrFusion::run(const ConvWgradSbrArgs& a) {
  const Shape& xs = a.x.shape();
  const Shape& ws = a.dWeight.shape();
  const Shape& ys = a.dy.shape();
  const WgradSbrShape s{xs[0], xs[1],     xs[2],     xs[3],  ws[0],  ws[1],       ws[2],       ys[1],
                        ys[2], a.strideH, a.strideW, a.padH, a.padW, a.dilationH, a.dilationW, a.x.dtype()};
  DeviceGuard guard(ctx_.device());
  plans_.get(s.str(), [&] { return std::make_unique<WgradSbrGraph>(ctx_, s); })->run(ctx_, a);
}

std::string WgradSbrFusion::refusal(const ConvBnSupportArgs& a) {
  const int64_t p = windowOutputSize(a.h, a.r, a.strideH, a.padH, a.dilationH);
  const int64_t q = windowOutputSize(a.w, a.s, a.strideW, a.padW, a.dilationW);
  const WgradSbrShape s{a.n, a.h,       a.w,       a.c,    a.k,    a.r,         a.s,         p,
                        q,   a.strideH, a.strideW, a.padH, a.padW, a.dilationH, a.dilationW, a.dtype};
  DeviceGuard guard(ctx_.device());
  return plans_.refusal(s.str(), [&] { return std::make_unique<WgradSbrGraph>(ctx_, s); });
}

}  // namespace rc::cuda
