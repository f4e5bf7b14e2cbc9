// conv2d on oneDNN: NHWC activations and OHWI f32 master weights (see weighted_passes.h). Where
// oneDNN runs its AVX2 kernels, a strided 1x1 convolution runs at stride 1 on a copy of the pixels
// it reads, the weight gradient of a larger kernel is computed as matrix products over gathered
// patches, and that of a 1x1 layer with many multiply-adds per element reads x and dy copied into
// oneDNN's channel-blocked layout. 1x1 stride-1 layers may run their weight gradient, and the input
// gradient they add into another, as matrix products (bench/RESULTS.md).
#include <cstring>

#include "compute_type.h"
#include "cpu_ops.h"
#include "patch_gradient.h"
#include "weighted_passes.h"

namespace rc::cpu {

namespace {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using dnnl::memory;

using Forward = dnnl::convolution_forward;
using BackwardData = dnnl::convolution_backward_data;
using BackwardWeights = dnnl::convolution_backward_weights;

// A 1x1 convolution with stride s and no padding reads only every s-th pixel: the same as a stride-1
// convolution of those pixels. Pixel (oh, ow) of `compact` is pixel (oh * sh, ow * sw) of `full`;
// both NHWC with the same channels and element type, addressed here by byte offsets of pixel rows.
struct PixelSampling {
  Shape full, compact;
  int64_t sh, sw;
  size_t row;  // bytes per pixel

  PixelSampling(const Tensor& f, const Tensor& c, int64_t strideH, int64_t strideW)
      : full(f.shape()),
        compact(c.shape()),
        sh(strideH),
        sw(strideW),
        row(static_cast<size_t>(c.dim(3)) * dtypeSize(f.dtype())) {}
  size_t fullAt(int64_t n, int64_t h, int64_t w) const {
    return static_cast<size_t>((n * full[1] + h) * full[2] + w) * row;
  }
  size_t compactAt(int64_t n, int64_t oh, int64_t ow) const {
    return static_cast<size_t>((n * compact[1] + oh) * compact[2] + ow) * row;
  }
};

// compact = the sampled pixels of full.
void gatherPixels(const PixelSampling& p, const void* full, void* compact) {
  const auto* src = static_cast<const char*>(full);
  auto* dst = static_cast<char*>(compact);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < p.compact[0]; ++n) {
    for (int64_t oh = 0; oh < p.compact[1]; ++oh) {
      for (int64_t ow = 0; ow < p.compact[2]; ++ow) {
        std::memcpy(dst + p.compactAt(n, oh, ow), src + p.fullAt(n, oh * p.sh, ow * p.sw), p.row);
      }
    }
  }
}

// The gradient of gatherPixels: full = compact at the sampled pixels, zero elsewhere.
void scatterPixels(const PixelSampling& p, const void* compact, void* full) {
  const auto* src = static_cast<const char*>(compact);
  auto* dst = static_cast<char*>(full);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < p.full[0]; ++n) {
    for (int64_t h = 0; h < p.full[1]; ++h) {
      const int64_t oh = h / p.sh;
      const bool sampledRow = h % p.sh == 0 && oh < p.compact[1];
      for (int64_t w = 0; w < p.full[2]; ++w) {
        const int64_t ow = w / p.sw;
        char* to = dst + p.fullAt(n, h, w);
        if (sampledRow && w % p.sw == 0 && ow < p.compact[2]) {
          std::memcpy(to, src + p.compactAt(n, oh, ow), p.row);
        } else {
          std::memset(to, 0, p.row);
        }
      }
    }
  }
}

// Whether `c` is a 1x1 stride-1 convolution without padding: a matrix product over its N*H*W rows.
bool pointwise(const Conv2dParams& c) {
  return c.kernelH == 1 && c.kernelW == 1 && c.strideH == 1 && c.strideW == 1 && c.padH == 0 && c.padW == 0;
}

// The most rows (N*H*W) for which an f32 1x1 layer's weight gradient is one matmul (rowGradient).
constexpr int64_t kRowGradientMaxRows = 4096;

class CpuConv2dPlan final : public WeightedPlan<Conv2dPlan, Forward, BackwardData, BackwardWeights> {
 public:
  CpuConv2dPlan(CpuContext& ctx, const Conv2dParams& p) : WeightedPlan(p.str()), ctx_(ctx), p_(p), g_(p) {
    checkCpuComputeType(p.dtype, "conv2d");
    dnnlGuard(p.str(), [&] { build(); });
  }

  // The forward's implementation, the weight gradient's when a matmul or copies in another layout
  // compute it, and the matmul that adds the input gradient into another when the plan has one.
  std::string implementation() const override {
    std::string forward = passes_.forwardPd().impl_info_str();
    if (subsampled_) forward += " on a subsampled copy (stride 1)";
    if (passes_.forwardPd().src_desc().get_data_type() != toDnnl(p_.dtype)) forward += " (bf16 computed in f32)";
    if (passes_.hasOwnWeightGradientPath()) forward += ", weight gradient " + passes_.weightGradientImplementation();
    if (dataMatmul_) forward += ", added input gradient matmul " + dataMatmul_->implementation();
    return forward;
  }

  void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y) override {
    WeightedPlan::forward(subsampled_ ? subsampled(x) : x, weight, bias, y);
  }

  void backwardData(const Tensor& dy, const Tensor& weight, const Tensor& dx) override {
    if (!subsampled_) return WeightedPlan::backwardData(dy, weight, dx);
    const Tensor compact = ctx_.strideCopy(compactShape(), dx.dtype());
    WeightedPlan::backwardData(dy, weight, compact);
    scatterPixels(PixelSampling(dx, compact, p_.strideH, p_.strideW), compact.data(), dx.data());
  }

  // dx += conv_transpose(dy, weight): one matrix product whose sum post-op adds into dx where the
  // plan has one (dataMatmul), else the gradient into a buffer of its own, then added.
  void backwardDataAccumulate(const Tensor& dy, const Tensor& weight, const Tensor& dx) override {
    if (dataMatmul_) {
      dnnlGuard(p_.str() + " backward data", [&] { dataMatmul_->run(dy, weight, dx); });
      return;
    }
    const Tensor part = ctx_.addend(dx.shape(), dx.dtype());
    backwardData(dy, weight, part);
    add(dx, part, dx);
  }

  void backwardWeights(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& dBias) override {
    WeightedPlan::backwardWeights(subsampled_ ? subsampled(x) : x, dy, dWeight, dBias);
  }

 private:
  void build() {
    subsampled_ = subsamples();
    if (subsampled_) {
      g_.h = p_.outH();
      g_.w = p_.outW();
      g_.strideH = g_.strideW = 1;
    }
    const dt act = computeType(ctx_.engine(), p_.dtype);
    const WeightedLayout l = layout(act);
    const auto fwdPd = forwardPd(l, act);
    auto& eng = ctx_.engine();
    const auto direct = dnnl::algorithm::convolution_direct;
    const memory::desc wAny(l.weightDims, act, tag::any);
    const memory::desc dwAny(l.weightDims, dt::f32, tag::any);
    const Window win = window();
    const BackwardData::primitive_desc bwdDataPd(eng, direct, l.x, wAny, l.y, win.strides, win.dilates, win.padL,
                                                 win.padR, fwdPd, attr());
    // The weight gradient from x and dy in the given layouts (the plan's NHWC, or `any`).
    const auto backwardWeights = [&](const memory::desc& x, const memory::desc& dy) {
      return g_.bias ? BackwardWeights::primitive_desc(eng, direct, x, dwAny, l.bias, dy, win.strides, win.dilates,
                                                       win.padL, win.padR, fwdPd, attr())
                     : BackwardWeights::primitive_desc(eng, direct, x, dwAny, dy, win.strides, win.dilates, win.padL,
                                                       win.padR, fwdPd, attr());
    };
    auto bwdWPd = backwardWeights(l.x, l.y);
    std::unique_ptr<WeightGradientPath> ownGradient = rowGradient(act);
    if (!ownGradient && gathersPatches(bwdWPd, act)) ownGradient = std::make_unique<PatchGradient>(ctx_, g_, l);
    if (!ownGradient && copiesForWeightGradient(bwdWPd)) {
      bwdWPd =
          backwardWeights(memory::desc(l.x.get_dims(), act, tag::any), memory::desc(l.y.get_dims(), act, tag::any));
    }
    passes_.build(ctx_, l, fwdPd, bwdDataPd, bwdWPd, std::move(ownGradient));
    dataMatmul_ = dataMatmul(act);
  }

  // The stride, dilation and padding of the geometry the primitives run on (g_).
  struct Window {
    memory::dims strides, dilates, padL, padR;
  };
  Window window() const {
    return {{g_.strideH, g_.strideW},
            {g_.dilationH - 1, g_.dilationW - 1},
            {g_.padH, g_.padW},
            {farPadding(g_.h, g_.outH(), g_.dilationH * (g_.kernelH - 1) + 1, g_.strideH, g_.padH),
             farPadding(g_.w, g_.outW(), g_.dilationW * (g_.kernelW - 1) + 1, g_.strideW, g_.padW)}};
  }

  // NHWC activations in the compute type and OHWI f32 master weights, for g_.
  WeightedLayout layout(dt act) const {
    const memory::dims wDims{g_.k, g_.c, g_.kernelH, g_.kernelW};
    WeightedLayout l;
    l.x = memory::desc({g_.n, g_.c, g_.h, g_.w}, act, tag::nhwc);
    l.y = memory::desc({g_.n, g_.k, g_.outH(), g_.outW()}, act, tag::nhwc);
    l.weightF32 = memory::desc(wDims, dt::f32, tag::acdb);
    l.bias = memory::desc({g_.k}, dt::f32, tag::x);
    l.weightDims = wDims;
    l.weightTag = tag::acdb;
    l.biasCount = g_.bias ? g_.k : 0;
    return l;
  }

  static dnnl::primitive_attr attr() {
    dnnl::primitive_attr a;
    a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return a;
  }

  Forward::primitive_desc forwardPd(const WeightedLayout& l, dt act) const {
    auto& eng = ctx_.engine();
    const Window win = window();
    const memory::desc wAny(l.weightDims, act, tag::any);
    const auto direct = dnnl::algorithm::convolution_direct;
    const auto training = dnnl::prop_kind::forward_training;
    return g_.bias ? Forward::primitive_desc(eng, training, direct, l.x, wAny, l.bias, l.y, win.strides, win.dilates,
                                             win.padL, win.padR, attr())
                   : Forward::primitive_desc(eng, training, direct, l.x, wAny, l.y, win.strides, win.dilates, win.padL,
                                             win.padR, attr());
  }

  // Whether this 1x1 strided convolution without padding runs as a stride-1 convolution of the
  // pixels it reads, copied out first (and its input gradient scattered back, zero elsewhere).
  // oneDNN's strided NHWC kernels for AVX2 (`brgconv_1x1:avx2` forward, `brgconv_strided:avx2`
  // backward data) ran ResNet-50's downsampling layers 1.1-1.8x slower than its stride-1 kernels on
  // the same multiply-adds (bench/RESULTS.md, a Zen 3); the copies read a quarter of x and write
  // dx once. Asked before build() changes g_, so that it sees the strided forward.
  bool subsamples() const {
    const bool strided1x1 =
        p_.kernelH == 1 && p_.kernelW == 1 && (p_.strideH > 1 || p_.strideW > 1) && p_.padH == 0 && p_.padW == 0;
    if (!strided1x1) return false;
    const dt act = computeType(ctx_.engine(), p_.dtype);
    return std::string(forwardPd(layout(act), act).impl_info_str()) == "brgconv_1x1:avx2";
  }

  Shape compactShape() const { return {g_.n, g_.h, g_.w, g_.c}; }

  // x's sampled pixels, in the context's stride copy.
  Tensor subsampled(const Tensor& x) {
    const Tensor compact = ctx_.strideCopy(compactShape(), x.dtype());
    gatherPixels(PixelSampling(x, compact, p_.strideH, p_.strideW), x.data(), compact.data());
    return compact;
  }

  // Whether the weight gradient is computed as matrix products over gathered patches
  // (patch_gradient.h): for an f32 kernel of more than one tap where oneDNN's backward-weights
  // primitive is its AVX2 direct kernel (`jit:avx2`, no AVX-512). Over ResNet-50's 3x3 and 7x7
  // layers at batch 16 on a Zen 3 it was 1.0-1.6x faster than that kernel on channel-blocked copies
  // (the 3x3 layers of stages 2 and 3 level, the 7x7 stem, stage 1, the strided layers and stage 4
  // 1.2-1.6x), and 1.0-1.9x on smaller layers of 3 to 64 channels (bench/RESULTS.md). 1x1 layers keep
  // `jit_1x1:avx2`, which was 0.5-1.2x its time there.
  bool gathersPatches(const BackwardWeights::primitive_desc& nhwcPd, dt act) const {
    return act == dt::f32 && g_.kernelH * g_.kernelW > 1 && std::string(nhwcPd.impl_info_str()) == "jit:avx2";
  }

  // Whether the weight gradient reads x and dy copied into oneDNN's channel-blocked layout. oneDNN's
  // f32 weight-gradient kernels for AVX2 (`jit:avx2`, `jit_1x1:avx2`, which `nhwcPd` runs where the
  // CPU has no AVX-512) read NHWC 1.1-1.8x slower than their own layout (bench/RESULTS.md, ResNet-50's
  // layers on a Zen 3). The copy is a pass over x and dy (about 0.4 ns per element on two cores); the
  // gain about a third of the kernel's time (about 4 ps per multiply-add): it pays from about 100
  // multiply-adds per copied element, and takes effect from 128 (the 1x1 layers of ResNet-50's last
  // two stages; those of its first two stages would not gain; its larger kernels gather patches).
  bool copiesForWeightGradient(const BackwardWeights::primitive_desc& nhwcPd) const {
    const std::string impl = nhwcPd.impl_info_str();
    if (impl != "jit:avx2" && impl != "jit_1x1:avx2") return false;
    const double macs = static_cast<double>(g_.n) * g_.outH() * g_.outW() * g_.k * g_.c * g_.kernelH * g_.kernelW;
    const double copied = static_cast<double>(g_.n) * (g_.h * g_.w * g_.c + g_.outH() * g_.outW() * g_.k);
    return macs >= 128.0 * copied;
  }

  // A 1x1 stride-1 convolution without padding or bias is a matrix product over the N*H*W rows, and
  // so is its weight gradient: dW[K,C] += dy[rows,K]^T x[rows,C], with OHWI weights being [K,C].
  // Used in bf16, where oneDNN's brgemm matmul on AMX measured 1.1-11x faster than its
  // backward-weights convolution for most of ResNet-50's 1x1 layers (bench/RESULTS.md). In f32 on
  // AVX-512 (`brg:avx512_core`), where the matmul adds into the plain gradient in its own pass and
  // the convolution writes a blocked one that a reorder adds: at batch 16 the matmul was 1.0-1.4x
  // faster on the layers of ResNet-50's last two stages (784 and 3,136 rows), 0.8-1.1x on those of
  // its first two (12,544 and 50,176), so f32 takes it up to kRowGradientMaxRows rows. Elsewhere
  // (and for bf16 computed in f32) the convolution keeps it.
  std::unique_ptr<WeightGradientPath> rowGradient(dt act) const {
    if (!pointwise(g_) || g_.bias) return nullptr;
    const int64_t rows = g_.n * g_.h * g_.w;
    if (act == dt::bf16) return RowGradientMatmul::create(ctx_, rows, g_.c, g_.k, act);
    if (act != dt::f32 || p_.dtype != DType::F32 || rows > kRowGradientMaxRows) return nullptr;
    auto matmul = RowGradientMatmul::create(ctx_, rows, g_.c, g_.k, act);
    if (!matmul || matmul->implementation().rfind("matmul brg:avx512", 0) != 0) return nullptr;
    return matmul;
  }

  // A 1x1 stride-1 f32 convolution without padding is a matrix product over the N*H*W rows, and so
  // is its input gradient: dx[rows,C] += dy[rows,K] W[K,C], with OHWI weights being [K,C]. As one
  // matmul with a sum post-op it adds into dx in the pass that computes it: on AVX-512
  // (`brg:avx512_core`) it took about the time of the backward-data convolution alone, which with
  // the add after it took 1.1-1.6x as long over ResNet-50's first 1x1 layers of each block at batch
  // 16 (bench/RESULTS.md). Not measured elsewhere, so other kernels keep the convolution and add.
  std::unique_ptr<AccumulatingMatmul> dataMatmul(dt act) const {
    if (!pointwise(p_) || act != dt::f32 || p_.dtype != DType::F32) return nullptr;
    using dims = memory::dims;
    const int64_t rows = p_.n * p_.h * p_.w;
    auto matmul = AccumulatingMatmul::create(ctx_, memory::desc({rows, p_.k}, dt::f32, dims{p_.k, 1}),
                                             memory::desc({p_.k, p_.c}, dt::f32, dims{p_.c, 1}),
                                             memory::desc({rows, p_.c}, dt::f32, dims{p_.c, 1}));
    if (!matmul || matmul->implementation().rfind("brg:avx512", 0) != 0) return nullptr;
    return matmul;
  }

  CpuContext& ctx_;
  Conv2dParams p_;  // the convolution asked for
  Conv2dParams g_;  // the one the primitives run: p_, or its stride-1 form on the subsampled input
  bool subsampled_ = false;
  std::unique_ptr<AccumulatingMatmul> dataMatmul_;  // backwardDataAccumulate's matmul, or none
};

}  // namespace

std::unique_ptr<Conv2dPlan> createConv2dPlan(CpuContext& ctx, const Conv2dParams& params) {
  return std::make_unique<CpuConv2dPlan>(ctx, params);
}

}  // namespace rc::cpu
