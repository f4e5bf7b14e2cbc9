// Average pooling on oneDNN (NHWC; bf16 through f32 copies where oneDNN has no bf16 kernels, see
// compute_type.h). Max pooling is our own loop, because oneDNN's max drops NaN (a window holding
// NaN and inf gives inf) where PyTorch propagates it; it keeps the argmax, as an int32 index into
// the sample's H*W plane, in a workspace that the module owns between forward and backward.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "compute_type.h"
#include "cpu_ops.h"
#include "isa.h"

namespace rc::cpu {

namespace {

using tag = dnnl::memory::format_tag;
using dnnl::memory;

// The window of one output pixel over channels [c0, c0 + n), n <= kChannelChunk: the running
// maximum and its index in registers-sized local arrays, updated without branches so that the
// channel loop vectorises. PyTorch's rule: a NaN wins and the last NaN holds the index
// (`v > best || v is NaN`); padding never wins; a window of -inf keeps its first element. The
// output is gathered from the input at the chosen index, so it keeps the input's exact bits.
constexpr int64_t kChannelChunk = 64;

struct Window {
  int64_t yBegin, yEnd, xBegin, xEnd;
};

template <typename T>
RC_ALWAYS_INLINE void maxPoolWindowImpl(const T* plane, int64_t w, int64_t c, int64_t c0, int64_t n, Window win, T* y,
                                        int32_t* argmax) {
  float best[kChannelChunk];
  int32_t at[kChannelChunk];
  for (int64_t k = 0; k < n; ++k) {
    best[k] = -INFINITY;
    at[k] = static_cast<int32_t>(win.yBegin * w + win.xBegin);
  }
  for (int64_t iy = win.yBegin; iy < win.yEnd; ++iy) {
    for (int64_t ix = win.xBegin; ix < win.xEnd; ++ix) {
      const T* px = plane + (iy * w + ix) * c + c0;
      const auto index = static_cast<int32_t>(iy * w + ix);
      for (int64_t k = 0; k < n; ++k) {
        const float v = toF(px[k]);
        const bool take = (v > best[k]) | (v != v);
        best[k] = take ? v : best[k];
        at[k] = take ? index : at[k];
      }
    }
  }
  for (int64_t k = 0; k < n; ++k) {
    y[c0 + k] = plane[static_cast<int64_t>(at[k]) * c + c0 + k];
    argmax[c0 + k] = at[k];
  }
}
RC_ISA_DISPATCH(maxPoolWindow, maxPoolWindowImpl,
                (const T* plane, int64_t w, int64_t c, int64_t c0, int64_t n, Window win, T* y, int32_t* argmax),
                (plane, w, c, c0, n, win, y, argmax))

// y = the max of each window, argmax its index into the sample's H*W plane (see maxPoolWindow).
template <typename T>
void maxPoolForward(const Pool2dParams& p, const T* x, T* y, int32_t* argmax) {
  const int64_t oh = p.outH(), ow = p.outW(), c = p.c;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t s = 0; s < p.n; ++s) {
    for (int64_t oy = 0; oy < oh; ++oy) {
      const T* plane = x + s * p.h * p.w * c;
      for (int64_t ox = 0; ox < ow; ++ox) {
        const int64_t y0 = oy * p.strideH - p.padH, x0 = ox * p.strideW - p.padW;
        const Window win{std::max<int64_t>(y0, 0), std::min(y0 + p.kernelH, p.h), std::max<int64_t>(x0, 0),
                         std::min(x0 + p.kernelW, p.w)};
        const int64_t at = ((s * oh + oy) * ow + ox) * c;
        if (win.yBegin >= win.yEnd || win.xBegin >= win.xEnd) {
          // A window entirely in the padding (not reachable with PyTorch's padding <= kernel / 2).
          std::fill(y + at, y + at + c, fromF<T>(-INFINITY));
          std::fill(argmax + at, argmax + at + c, static_cast<int32_t>(win.yBegin * p.w + win.xBegin));
          continue;
        }
        for (int64_t c0 = 0; c0 < c; c0 += kChannelChunk) {
          maxPoolWindow<T>(plane, p.w, c, c0, std::min(kChannelChunk, c - c0), win, y + at, argmax + at);
        }
      }
    }
  }
}

// dx = each dy added, in f32 and in output order, to the element its window chose. `sum` holds
// n*H*W*C floats; for f32 it is dx itself.
template <typename T>
void maxPoolBackward(const Pool2dParams& p, const T* dy, T* dx, const int32_t* argmax, float* sum) {
  const int64_t plane = p.h * p.w * p.c, pixels = p.outH() * p.outW(), c = p.c;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < p.n; ++s) {
    float* acc = sum + s * plane;
    std::fill(acc, acc + plane, 0.0f);
    const T* g = dy + s * pixels * c;
    const int32_t* from = argmax + s * pixels * c;
    for (int64_t o = 0; o < pixels; ++o) {
      for (int64_t k = 0; k < c; ++k) acc[static_cast<int64_t>(from[o * c + k]) * c + k] += toF(g[o * c + k]);
    }
    if constexpr (!std::is_same_v<T, float>) {
      T* d = dx + s * plane;
      for (int64_t i = 0; i < plane; ++i) d[i] = fromF<T>(acc[i]);
    }
  }
}

class CpuPool2dPlan final : public Pool2dPlan {
 public:
  CpuPool2dPlan(CpuContext& ctx, const Pool2dParams& p) : ctx_(ctx), p_(p) {
    checkCpuComputeType(p.dtype, "pool2d");
    if (p.kind == PoolKind::Avg) dnnlGuard(p.str(), [&] { build(); });
  }

  size_t workspaceBytes() const override {
    if (p_.kind == PoolKind::Max) return static_cast<size_t>(p_.n * p_.outH() * p_.outW() * p_.c) * sizeof(int32_t);
    return fwdPd_.workspace_desc().get_size();
  }

  void forward(const Tensor& x, const Tensor& y, const Tensor& workspace) override {
    if (p_.kind == PoolKind::Max) {
      dispatchFloat(p_.dtype, "max pool forward", [&](auto t) {
        maxPoolForward(p_, x.ptr<decltype(t)>(), y.ptr<decltype(t)>(), workspace.ptr<int32_t>());
      });
      return;
    }
    dnnlGuard(p_.str() + " forward", [&] {
      auto& eng = ctx_.engine();
      std::unordered_map<int, memory> args{
          {DNNL_ARG_SRC, memory(xMd_, eng, stageInput(ctx_, x, xMd_, 0))},
          {DNNL_ARG_DST, memory(yMd_, eng, stageOutput(ctx_, y, yMd_, 1))},
          {DNNL_ARG_SCRATCHPAD,
           memory(fwdPd_.scratchpad_desc(), eng, ctx_.scratch(fwdPd_.scratchpad_desc().get_size()))}};
      if (workspaceBytes() > 0)
        args.emplace(DNNL_ARG_WORKSPACE, memory(fwdPd_.workspace_desc(), eng, workspace.data()));
      fwd_.execute(ctx_.stream(), args);
      finishOutput(ctx_, y, yMd_, 1);
    });
  }

  void backward(const Tensor& dy, const Tensor& dx, const Tensor& workspace) override {
    if (p_.kind == PoolKind::Max) {
      dispatchFloat(p_.dtype, "max pool backward", [&](auto t) {
        using T = decltype(t);
        float* sum = nullptr;
        if constexpr (std::is_same_v<T, float>) {
          sum = dx.ptr<float>();
        } else {
          sum = static_cast<float*>(ctx_.scratch(static_cast<size_t>(dx.numel()) * sizeof(float)));
        }
        maxPoolBackward(p_, dy.ptr<T>(), dx.ptr<T>(), workspace.ptr<int32_t>(), sum);
      });
      return;
    }
    dnnlGuard(p_.str() + " backward", [&] {
      auto& eng = ctx_.engine();
      std::unordered_map<int, memory> args{
          {DNNL_ARG_DIFF_DST, memory(yMd_, eng, stageInput(ctx_, dy, yMd_, 0))},
          {DNNL_ARG_DIFF_SRC, memory(xMd_, eng, stageOutput(ctx_, dx, xMd_, 1))},
          {DNNL_ARG_SCRATCHPAD,
           memory(bwdPd_.scratchpad_desc(), eng, ctx_.scratch(bwdPd_.scratchpad_desc().get_size()))}};
      if (workspaceBytes() > 0)
        args.emplace(DNNL_ARG_WORKSPACE, memory(fwdPd_.workspace_desc(), eng, workspace.data()));
      bwd_.execute(ctx_.stream(), args);
      finishOutput(ctx_, dx, xMd_, 1);
    });
  }

 private:
  void build() {
    auto& eng = ctx_.engine();
    const auto act = computeType(ctx_.engine(), p_.dtype);
    xMd_ = memory::desc({p_.n, p_.c, p_.h, p_.w}, act, tag::nhwc);
    yMd_ = memory::desc({p_.n, p_.c, p_.outH(), p_.outW()}, act, tag::nhwc);
    const auto algo = dnnl::algorithm::pooling_avg_include_padding;
    const memory::dims strides{p_.strideH, p_.strideW}, kernel{p_.kernelH, p_.kernelW}, padL{p_.padH, p_.padW};
    const memory::dims padR{farPadding(p_.h, p_.outH(), p_.kernelH, p_.strideH, p_.padH),
                            farPadding(p_.w, p_.outW(), p_.kernelW, p_.strideW, p_.padW)};
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const memory::dims dilation{0, 0};
    fwdPd_ = dnnl::pooling_forward::primitive_desc(eng, dnnl::prop_kind::forward_training, algo, xMd_, yMd_, strides,
                                                   kernel, dilation, padL, padR, attr);
    fwd_ = dnnl::pooling_forward(fwdPd_);
    bwdPd_ = dnnl::pooling_backward::primitive_desc(eng, algo, xMd_, yMd_, strides, kernel, dilation, padL, padR,
                                                    fwdPd_, attr);
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
