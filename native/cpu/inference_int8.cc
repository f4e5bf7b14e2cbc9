// The INT8 inference plan on oneDNN (native/core/inference_plan.h, params.int8). Nodes with weight
// scales run as oneDNN int8 convolutions and inner products: u8 or s8 source (u8 when the input
// follows a ReLU), s8 weights quantized per output channel once at creation, f32 bias, the source,
// per-channel weight and destination scales (oneDNN 3.x: dst = post_ops(src_scale * wei_scale[k] *
// acc + bias[k]) / dst_scale), and the residual add (sum post-op) and ReLU (eltwise post-op) fused
// in. The other nodes run in f32.
//
// Every value keeps the representation its producer writes (f32, or u8/s8 with a scale) plus any
// others its consumers need, each made once by a oneDNN reorder right after it is first needed
// (quantize f32 -> int8, dequantize int8 -> f32, or a layout change). A quantized convolution
// writes its output directly in u8/s8, requantized to its consumers' input scale, when that is
// exact: every consumer is a quantized node (or a max pooling, which commutes with quantization)
// reading the value with the same scale and signedness, and none adds it as a residual. Otherwise
// it writes f32. A residual is summed in f32: the convolution writes into the residual's own buffer
// when nothing later reads the residual, else into its own buffer after a copy.
//
// Activations use the layouts the primitives choose (format_tag::any). All primitives, weights and
// buffers are made at creation, buffers shared between values whose lifetimes do not overlap, and
// `run` only executes the steps. Quantizing an f32 value into int8 of the same layout (after each
// residual sum) is a pass of this file's own: oneDNN 3.x's reorder with a scale given at execution
// ran at half the speed of 2.x's with a constant one (bench/RESULTS.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../core/error.h"
#include "compute_type.h"
#include "cpu_ops.h"
#include "isa.h"

namespace rc::cpu {

namespace {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using dnnl::memory;

constexpr int kInput = -1;   // the buffer id of the plan's input x
constexpr int kOutput = -2;  // the buffer id of the plan's output y

// One representation of a value: its type, layout, scale (value = scale * stored; 1 for f32) and
// the buffer that holds it.
struct Rep {
  dt type = dt::f32;
  memory::desc md;
  float scale = 1.0f;
  int buffer = 0;
};

// A buffer's size and the steps between which it is live.
struct Buffer {
  size_t bytes = 0;
  size_t first = 0, last = 0;
  int slot = -1;
};

struct StepArg {
  int arg;
  int buffer;
  memory::desc md;
};

// y = saturate(round_half_even(x * multiplier)) from f32 into u8 or s8, element by element: what
// oneDNN's reorder computes with that source scale. NaN becomes 0.
template <typename Q>
RC_ALWAYS_INLINE void quantizeImpl(const float* __restrict x, Q* __restrict y, int64_t n, float multiplier) {
  constexpr float lo = std::numeric_limits<Q>::min(), hi = std::numeric_limits<Q>::max();
  // Adding and subtracting 1.5 * 2^23 rounds a float of magnitude below 2^22 to an integer, half
  // to even, in plain float arithmetic (which vectorises, where nearbyint does not).
  constexpr float kRound = 12582912.0f;
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] * multiplier;
    v = v == v ? v : 0.0f;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    y[i] = static_cast<Q>(static_cast<int32_t>((v + kRound) - kRound));
  }
}
RC_ISA_DISPATCH(quantizeRun, quantizeImpl, (const float* __restrict x, T* __restrict y, int64_t n, float multiplier),
                (x, y, n, multiplier))

constexpr int64_t kQuantizeChunk = 1 << 16;

template <typename Q>
void quantizeValues(const float* x, Q* y, int64_t n, float multiplier) {
  const int64_t chunks = (n + kQuantizeChunk - 1) / kQuantizeChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t at = c * kQuantizeChunk;
    quantizeRun<Q>(x + at, y + at, std::min(kQuantizeChunk, n - at), multiplier);
  }
}

// A quantizing step of this file's own (Step::quantize).
struct QuantizeStep {
  int64_t count = 0;
  float multiplier = 1.0f;
  bool isUnsigned = false;
};

// A step: a oneDNN primitive, or (quantize set) the quantizing pass from DNNL_ARG_FROM to DNNL_ARG_TO.
struct Step {
  dnnl::primitive prim;
  std::vector<StepArg> args;
  std::unordered_map<int, memory> bound;  // filled once the buffers are placed
  std::optional<QuantizeStep> quantize;

  void execute(dnnl::stream& stream) {
    if (!quantize) {
      prim.execute(stream, bound);
      return;
    }
    const auto* x = static_cast<const float*>(bound.at(DNNL_ARG_FROM).get_data_handle());
    void* y = bound.at(DNNL_ARG_TO).get_data_handle();
    if (quantize->isUnsigned) {
      quantizeValues(x, static_cast<uint8_t*>(y), quantize->count, quantize->multiplier);
    } else {
      quantizeValues(x, static_cast<int8_t*>(y), quantize->count, quantize->multiplier);
    }
  }
};

// Whether `from` (f32) and `to` (int8) lay out the same elements at the same offsets, without padding.
bool sameDenseLayout(const memory::desc& from, const memory::desc& to) {
  if (from.get_format_kind() != dnnl::memory::format_kind::blocked ||
      to.get_format_kind() != dnnl::memory::format_kind::blocked || from.get_dims() != to.get_dims() ||
      from.get_strides() != to.get_strides() || from.get_inner_nblks() != 0 || to.get_inner_nblks() != 0) {
    return false;
  }
  int64_t n = 1;
  for (const auto d : to.get_dims()) n *= d;
  return from.get_size() == static_cast<size_t>(n) * sizeof(float) && to.get_size() == static_cast<size_t>(n);
}

// How a value is consumed, for the choice of its producer's output type.
struct Quant {
  bool valid = false;
  float scale = 0;
  bool isUnsigned = false;
};

// Symmetric per-channel quantization of OHWI (or OI) weights: round-half-even, clamped to [-127, 127].
std::vector<int8_t> quantizeWeights(const InferenceNode& node) {
  const size_t k = static_cast<size_t>(node.outChannels);
  const size_t per = node.weight.size() / k;
  std::vector<int8_t> q(node.weight.size());
  for (size_t o = 0; o < k; ++o) {
    // Divided in double, as the calibration computes the scales' inverse: multiplying by a rounded
    // f32 reciprocal moves values that lie within an ulp of a rounding boundary to the other side.
    const double scale = node.weightScales[o];
    for (size_t i = 0; i < per; ++i) {
      const double v = std::nearbyint(static_cast<double>(node.weight[o * per + i]) / scale);
      q[o * per + i] = static_cast<int8_t>(std::min(127.0, std::max(-127.0, v)));
    }
  }
  return q;
}

// Whether quantized weights fit in 7 bits ([-63, 63]: calibrated with `weightBits: 7`).
bool withinSevenBits(const std::vector<int8_t>& q) {
  return std::all_of(q.begin(), q.end(), [](int8_t v) { return v >= -63 && v <= 63; });
}

// Whether a quantized convolution's primitive halves its weights. oneDNN's direct int8 convolution
// kernels on CPUs without VNNI add pairs of u8 x s8 products in saturating 16-bit sums; for a signed
// source they shift it into u8 and halve the weights (rounding odd ones), doubling the result.
// Its gemm-based kernels do neither, and its reference kernels sum in 32 bits.
bool halvesSignedInputWeights(const InferenceNode& node, const std::string& implementation) {
  return !node.inputUnsigned && !hasInt8DotProducts() && implementation.find("gemm") == std::string::npos &&
         implementation.find("ref") == std::string::npos;
}

class Int8InferencePlan final : public InferencePlan {
 public:
  Int8InferencePlan(CpuContext& ctx, const InferencePlanParams& p) : ctx_(ctx), p_(p) {
    shapes_ = inferenceValueShapes(p_);
    dnnlGuard(p_.str(), [&] { build(); });
  }

  void run(const Tensor& x, const Tensor& y) override {
    const Shape in{p_.n, p_.h, p_.w, p_.c};
    RC_CHECK_ARG(x.shape() == in && x.dtype() == DType::F32, "inference plan: x must be f32 "
                                                                 << shapeStr(in) << ", got " << dtypeName(x.dtype())
                                                                 << " " << shapeStr(x.shape()));
    RC_CHECK_ARG(y.shape() == shapes_.back() && y.dtype() == DType::F32,
                 "inference plan: y must be f32 " << shapeStr(shapes_.back()) << ", got " << dtypeName(y.dtype()) << " "
                                                  << shapeStr(y.shape()));
    xMem_.set_data_handle(x.data());
    yMem_.set_data_handle(y.data());
    // A CPU stream runs each primitive before execute returns, so the own steps fall in order.
    dnnlGuard(p_.str(), [&] {
      for (auto& s : steps_) s.execute(ctx_.stream());
      ctx_.stream().wait();
    });
  }

  std::string implementation() const override { return impl_; }

 private:
  bool quantized(const InferenceNode& node) const { return p_.int8 && !node.weightScales.empty(); }

  memory::dims dimsOf(int64_t value) const {
    const Shape& s = shapes_[static_cast<size_t>(value)];
    if (s.size() == 4) return {s[0], s[3], s[1], s[2]};
    return {s[0], s[1], 1, 1};  // [n, features] after global pooling, as 1x1 images
  }

  // The exact INT8 form the consumers of `value` read it in, when they all read it in one.
  Quant wanted(int64_t value) const {
    Quant out;
    if (value == static_cast<int64_t>(p_.nodes.size())) return out;  // the plan's output
    bool any = false;
    for (size_t j = static_cast<size_t>(value); j < p_.nodes.size(); ++j) {
      const InferenceNode& node = p_.nodes[j];
      if (node.residual == value) return {};
      if (node.input != value) continue;
      Quant q;
      if (node.op == InferenceOp::MaxPool) {
        q = wanted(static_cast<int64_t>(j) + 1);
      } else if ((node.op == InferenceOp::Conv || node.op == InferenceOp::Linear) && quantized(node)) {
        q = {true, node.inputScale, node.inputUnsigned};
      }
      if (!q.valid) return {};
      if (any && (q.scale != out.scale || q.isUnsigned != out.isUnsigned)) return {};
      out = q;
      any = true;
    }
    return out;
  }

  // Whether a node after `node` reads `value`.
  bool readAfter(int64_t value, size_t node) const {
    for (size_t j = node + 1; j < p_.nodes.size(); ++j) {
      if (p_.nodes[j].input == value || p_.nodes[j].residual == value) return true;
    }
    return false;
  }

  int newBuffer(const memory::desc& md) {
    buffers_.push_back({md.get_size(), steps_.size(), steps_.size(), -1});
    return static_cast<int>(buffers_.size()) - 1;
  }

  void use(int buffer) {
    if (buffer >= 0) buffers_[static_cast<size_t>(buffer)].last = steps_.size();
  }

  void addStep(dnnl::primitive prim, std::vector<StepArg> args, const dnnl::primitive_desc_base& pd) {
    for (const auto& a : args) use(a.buffer);
    scratchBytes_ = std::max(scratchBytes_, pd.scratchpad_desc().get_size());
    kernels_[pd.impl_info_str()]++;
    steps_.push_back({std::move(prim), std::move(args), {}, std::nullopt});
  }

  // A representation of `value` of `type`, `scale` (int8) and layout `md` (or any layout when
  // `md` is zero), made by a reorder from its first representation if it has none yet.
  const Rep& repFor(int64_t value, dt type, float scale, const memory::desc* md) {
    auto& reps = reps_[static_cast<size_t>(value)];
    for (const Rep& r : reps) {
      if (r.type == type && (type == dt::f32 || r.scale == scale) && (md == nullptr || r.md == *md)) return r;
    }
    const Rep& from = reps.front();
    const memory::desc target = md != nullptr ? *md : memory::desc(from.md.get_dims(), type, tag::nhwc);
    if (from.type == dt::f32 && type != dt::f32 && sameDenseLayout(from.md, target)) {
      return addQuantize(value, from, target, type, scale);
    }
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // stored_target = stored_from * from.scale / scale: the ratio as the source's scale.
    const float ratio = from.scale / (type == dt::f32 ? 1.0f : scale);
    if (ratio != 1.0f) attr.set_scales_mask(DNNL_ARG_FROM, 0);
    auto& eng = ctx_.engine();
    const dnnl::reorder::primitive_desc pd(eng, from.md, eng, target, attr);
    const int buffer = newBuffer(target);
    addStep(dnnl::reorder(pd), {{DNNL_ARG_FROM, from.buffer, from.md}, {DNNL_ARG_TO, buffer, target}}, pd);
    if (ratio != 1.0f) bindScales(DNNL_ARG_FROM, {ratio});
    ++reorders_;
    reps.push_back({type, target, type == dt::f32 ? 1.0f : scale, buffer});
    return reps.back();
  }

  // The quantizing pass of the f32 `from` into int8 `target` of the same layout (repFor).
  const Rep& addQuantize(int64_t value, const Rep& from, const memory::desc& target, dt type, float scale) {
    const int buffer = newBuffer(target);
    const std::vector<StepArg> args{{DNNL_ARG_FROM, from.buffer, from.md}, {DNNL_ARG_TO, buffer, target}};
    for (const auto& a : args) use(a.buffer);
    // As the reorder's ratio (repFor): stored = stored_from * from.scale / scale.
    const QuantizeStep q{static_cast<int64_t>(target.get_size()), from.scale / scale, type == dt::u8};
    steps_.push_back({dnnl::primitive(), args, {}, q});
    kernels_["quantize:own"]++;
    ++quantizePasses_;
    auto& reps = reps_[static_cast<size_t>(value)];
    reps.push_back({type, target, scale, buffer});
    return reps.back();
  }

  const Rep* findRep(int64_t value, dt type, float scale) const {
    for (const Rep& r : reps_[static_cast<size_t>(value)]) {
      if (r.type == type && (type == dt::f32 || r.scale == scale)) return &r;
    }
    return nullptr;
  }

  // A weight held by the plan, reordered once from its plain form into `target`.
  void addWeight(const void* data, const memory::desc& plain, const memory::desc& target) {
    auto& eng = ctx_.engine();
    Tensor buffer = ctx_.allocateBytes(target.get_size());
    memory src(plain, eng, const_cast<void*>(data));
    memory dst(target, eng, buffer.data());
    dnnl::reorder(src, dst).execute(ctx_.stream(), src, dst);
    ctx_.stream().wait();
    weights_.push_back({std::move(buffer), dst});
  }

  // The scales of argument `arg` (DNNL_ARG_SRC, ...) of the last step: one value, or one per
  // channel of the mask the primitive was created with. Held by the plan like a weight.
  void bindScales(int arg, const std::vector<float>& values) {
    const memory::desc md({static_cast<int64_t>(values.size())}, dt::f32, tag::x);
    Tensor buffer = ctx_.allocateBytes(std::max<size_t>(md.get_size(), 64));
    std::copy(values.begin(), values.end(), buffer.ptr<float>());
    const memory mem(md, ctx_.engine(), buffer.data());
    steps_.back().bound[DNNL_ARG_ATTR_SCALES | arg] = mem;
    weights_.push_back({std::move(buffer), mem});
  }

  void build() {
    auto& eng = ctx_.engine();
    reps_.resize(p_.nodes.size() + 1);
    const memory::desc xMd({p_.n, p_.c, p_.h, p_.w}, dt::f32, tag::nhwc);
    xMem_ = memory(xMd, eng, DNNL_MEMORY_NONE);
    reps_[0].push_back({dt::f32, xMd, 1.0f, kInput});
    for (size_t i = 0; i < p_.nodes.size(); ++i) {
      const InferenceNode& node = p_.nodes[i];
      switch (node.op) {
        case InferenceOp::Conv: buildConv(i); break;
        case InferenceOp::MaxPool: buildMaxPool(i); break;
        case InferenceOp::GlobalAvgPool: buildAvgPool(i); break;
        case InferenceOp::Linear: buildLinear(i); break;
      }
    }
    place();
    describe();
  }

  // The memory descriptor of node i's output when it is the plan's output (plain [n, features]).
  bool isLast(size_t i) const { return i + 1 == p_.nodes.size(); }

  // A quantized convolution's or inner product's scales: the source's (one), the weights' (one per
  // output channel: dimension 0 of both primitives' weights) and, when it writes int8, the
  // destination's (one). The bias stays in f32 units: oneDNN adds it after the scales.
  static void setQuantScales(dnnl::primitive_attr& attr, bool dstScaled) {
    attr.set_scales_mask(DNNL_ARG_SRC, 0);
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, 1 << 0);
    if (dstScaled) attr.set_scales_mask(DNNL_ARG_DST, 0);
  }

  // The values of setQuantScales' scales, bound to the last step.
  void bindQuantScales(const InferenceNode& node, const std::vector<float>& weightScales, float dstScale) {
    bindScales(DNNL_ARG_SRC, {node.inputScale});
    bindScales(DNNL_ARG_WEIGHTS, weightScales);
    if (dstScale != 1.0f) bindScales(DNNL_ARG_DST, {dstScale});
  }

  // The quantized weights of a convolution, and the scales that go with them. Where the primitive
  // halves the weights of a signed input (halvesSignedInputWeights) and they fit in 7 bits, they
  // are handed over doubled with halved scales: the halving then gives them back exactly and their
  // products never saturate, so the plan computes the quantized arithmetic exactly there too.
  std::pair<std::vector<int8_t>, std::vector<float>> convWeights(const InferenceNode& node,
                                                                 const std::string& implementation) {
    std::vector<int8_t> q = quantizeWeights(node);
    std::vector<float> scales = node.weightScales;
    if (halvesSignedInputWeights(node, implementation) && withinSevenBits(q)) {
      for (int8_t& v : q) v = static_cast<int8_t>(2 * v);
      for (float& v : scales) v *= 0.5f;
      ++doubledWeights_;
    }
    return {std::move(q), std::move(scales)};
  }

  void buildConv(size_t i) {
    const InferenceNode& node = p_.nodes[i];
    auto& eng = ctx_.engine();
    const bool q = quantized(node);
    const int64_t v = static_cast<int64_t>(i) + 1;
    const dt srcType = q ? (node.inputUnsigned ? dt::u8 : dt::s8) : dt::f32;
    const Quant out = q && node.residual < 0 ? wanted(v) : Quant{};
    const dt dstType = out.valid ? (out.isUnsigned ? dt::u8 : dt::s8) : dt::f32;
    const float dstScale = out.valid ? out.scale : 1.0f;

    const memory::dims xDims = dimsOf(node.input);
    const memory::dims yDims = dimsOf(v);
    const memory::dims wDims{node.outChannels, node.inChannels, node.kernelH, node.kernelW};
    const memory::dims strides{node.strideH, node.strideW};
    const memory::dims dilates{node.dilationH - 1, node.dilationW - 1};
    const memory::dims padL{node.padH, node.padW};
    const memory::dims padR{
        farPadding(xDims[2], yDims[2], node.dilationH * (node.kernelH - 1) + 1, node.strideH, node.padH),
        farPadding(xDims[3], yDims[3], node.dilationW * (node.kernelW - 1) + 1, node.strideW, node.padW)};

    const Rep* have = findRep(node.input, srcType, node.inputScale);
    const memory::desc srcMd = have != nullptr ? have->md : memory::desc(xDims, srcType, tag::any);
    const bool hasResidual = node.residual >= 0;
    const Rep residualFront = hasResidual ? reps_[static_cast<size_t>(node.residual)].front() : Rep{};
    const memory::desc dstMd =
        hasResidual && residualFront.type == dt::f32 ? residualFront.md : memory::desc(yDims, dstType, tag::any);
    const memory::desc wMd(wDims, q ? dt::s8 : dt::f32, tag::any);
    const memory::desc bMd({node.outChannels}, dt::f32, tag::x);

    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // The destination scale divides after the post-ops; a residual is summed in f32 (dstScale 1),
    // and the ReLU commutes with a positive scale.
    if (q) setQuantScales(attr, dstScale != 1.0f);
    dnnl::post_ops ops;
    if (hasResidual) ops.append_sum(1.0f);
    if (node.relu) ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
    const dnnl::convolution_forward::primitive_desc pd(eng, dnnl::prop_kind::forward_inference,
                                                       dnnl::algorithm::convolution_direct, srcMd, wMd, bMd, dstMd,
                                                       strides, dilates, padL, padR, attr);

    const memory::desc pdSrc = pd.src_desc();
    const Rep src = repFor(node.input, srcType, node.inputScale, &pdSrc);
    const memory::desc plainW(wDims, q ? dt::s8 : dt::f32, tag::acdb);
    std::vector<float> weightScales;
    if (q) {
      auto [wq, scales] = convWeights(node, pd.impl_info_str());
      addWeight(wq.data(), plainW, pd.weights_desc());
      weightScales = std::move(scales);
    } else {
      addWeight(node.weight.data(), plainW, pd.weights_desc());
    }
    addWeight(node.bias.data(), bMd, bMd);
    const size_t wIndex = weights_.size() - 2;

    int dst;
    if (hasResidual) {
      const memory::desc pdDst = pd.dst_desc();
      const Rep r = repFor(node.residual, dt::f32, 1.0f, &pdDst);
      if (!readAfter(node.residual, i) && r.buffer >= 0 && r.buffer != src.buffer) {
        dst = r.buffer;  // the sum post-op adds into the residual's own buffer
        ++inPlace_;
      } else {
        dst = newBuffer(pd.dst_desc());
        dnnl::primitive_attr copyAttr;
        copyAttr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        const dnnl::reorder::primitive_desc copy(eng, r.md, eng, pd.dst_desc(), copyAttr);
        addStep(dnnl::reorder(copy), {{DNNL_ARG_FROM, r.buffer, r.md}, {DNNL_ARG_TO, dst, pd.dst_desc()}}, copy);
        ++reorders_;
      }
    } else {
      dst = newBuffer(pd.dst_desc());
    }
    addStep(dnnl::convolution_forward(pd), {{DNNL_ARG_SRC, src.buffer, src.md}, {DNNL_ARG_DST, dst, pd.dst_desc()}},
            pd);
    steps_.back().bound[DNNL_ARG_WEIGHTS] = weights_[wIndex].second;
    steps_.back().bound[DNNL_ARG_BIAS] = weights_[wIndex + 1].second;
    if (q) bindQuantScales(node, weightScales, dstScale);
    reps_[static_cast<size_t>(v)].push_back({pd.dst_desc().get_data_type(), pd.dst_desc(), dstScale, dst});
    (q ? int8Nodes_ : floatNodes_)++;
    if (dstType != dt::f32) ++requantized_;
  }

  void buildMaxPool(size_t i) {
    const InferenceNode& node = p_.nodes[i];
    auto& eng = ctx_.engine();
    const int64_t v = static_cast<int64_t>(i) + 1;
    const Rep src = reps_[static_cast<size_t>(node.input)].front();
    const memory::dims xDims = dimsOf(node.input);
    const memory::dims yDims = dimsOf(v);
    const memory::dims padR{farPadding(xDims[2], yDims[2], node.kernelH, node.strideH, node.padH),
                            farPadding(xDims[3], yDims[3], node.kernelW, node.strideW, node.padW)};
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::pooling_forward::primitive_desc pd(
        eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::pooling_max, src.md,
        memory::desc(yDims, src.type, tag::any), {node.strideH, node.strideW}, {node.kernelH, node.kernelW}, {0, 0},
        {node.padH, node.padW}, padR, attr);
    const int dst = newBuffer(pd.dst_desc());
    addStep(dnnl::pooling_forward(pd), {{DNNL_ARG_SRC, src.buffer, src.md}, {DNNL_ARG_DST, dst, pd.dst_desc()}}, pd);
    reps_[static_cast<size_t>(v)].push_back({src.type, pd.dst_desc(), src.scale, dst});
  }

  void buildAvgPool(size_t i) {
    const InferenceNode& node = p_.nodes[i];
    auto& eng = ctx_.engine();
    const int64_t v = static_cast<int64_t>(i) + 1;
    const Rep src = repFor(node.input, dt::f32, 1.0f, nullptr);
    const memory::dims xDims = dimsOf(node.input);
    const memory::dims yDims = dimsOf(v);
    const memory::desc dstMd(yDims, dt::f32, isLast(i) ? tag::nchw : tag::any);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::pooling_forward::primitive_desc pd(eng, dnnl::prop_kind::forward_inference,
                                                   dnnl::algorithm::pooling_avg_exclude_padding, src.md, dstMd, {1, 1},
                                                   {xDims[2], xDims[3]}, {0, 0}, {0, 0}, {0, 0}, attr);
    const int dst = isLast(i) ? kOutput : newBuffer(pd.dst_desc());
    addStep(dnnl::pooling_forward(pd), {{DNNL_ARG_SRC, src.buffer, src.md}, {DNNL_ARG_DST, dst, pd.dst_desc()}}, pd);
    reps_[static_cast<size_t>(v)].push_back({dt::f32, pd.dst_desc(), 1.0f, dst});
  }

  void buildLinear(size_t i) {
    const InferenceNode& node = p_.nodes[i];
    auto& eng = ctx_.engine();
    const bool q = quantized(node);
    const int64_t v = static_cast<int64_t>(i) + 1;
    const dt srcType = q ? (node.inputUnsigned ? dt::u8 : dt::s8) : dt::f32;
    // The input's own dims: [n, c, 1, 1] after global pooling, [n, c] after another linear.
    const memory::dims xDims = reps_[static_cast<size_t>(node.input)].front().md.get_dims();
    const bool flat = xDims.size() == 2;
    const memory::dims wDims =
        flat ? memory::dims{node.outChannels, node.inChannels} : memory::dims{node.outChannels, node.inChannels, 1, 1};
    const memory::dims yDims{p_.n, node.outChannels};
    const Rep* have = findRep(node.input, srcType, node.inputScale);
    const memory::desc srcMd = have != nullptr ? have->md : memory::desc(xDims, srcType, tag::any);
    const memory::desc dstMd(yDims, dt::f32, isLast(i) ? tag::ab : tag::any);
    const memory::desc bMd({node.outChannels}, dt::f32, tag::x);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (q) setQuantScales(attr, false);
    const dnnl::inner_product_forward::primitive_desc pd(eng, dnnl::prop_kind::forward_inference, srcMd,
                                                         memory::desc(wDims, q ? dt::s8 : dt::f32, tag::any), bMd,
                                                         dstMd, attr);
    const memory::desc pdSrc = pd.src_desc();
    const Rep src = repFor(node.input, srcType, node.inputScale, &pdSrc);
    const memory::desc plainW(wDims, q ? dt::s8 : dt::f32, flat ? tag::ab : tag::abcd);
    if (q) {
      const std::vector<int8_t> wq = quantizeWeights(node);
      addWeight(wq.data(), plainW, pd.weights_desc());
    } else {
      addWeight(node.weight.data(), plainW, pd.weights_desc());
    }
    addWeight(node.bias.data(), bMd, bMd);
    const size_t wIndex = weights_.size() - 2;
    const int dst = isLast(i) ? kOutput : newBuffer(pd.dst_desc());
    addStep(dnnl::inner_product_forward(pd), {{DNNL_ARG_SRC, src.buffer, src.md}, {DNNL_ARG_DST, dst, pd.dst_desc()}},
            pd);
    steps_.back().bound[DNNL_ARG_WEIGHTS] = weights_[wIndex].second;
    steps_.back().bound[DNNL_ARG_BIAS] = weights_[wIndex + 1].second;
    if (q) bindQuantScales(node, node.weightScales, 1.0f);
    reps_[static_cast<size_t>(v)].push_back({dt::f32, pd.dst_desc(), 1.0f, dst});
    (q ? int8Nodes_ : floatNodes_)++;
  }

  // Places the buffers in slots shared by buffers whose lifetimes do not overlap, allocates the
  // slots and the scratchpad, and binds every step's memories.
  void place() {
    auto& eng = ctx_.engine();
    std::vector<size_t> slotBytes, slotFree;  // slotFree: the step after the last use of its occupant
    for (auto& b : buffers_) {
      int best = -1;
      for (size_t s = 0; s < slotBytes.size(); ++s) {
        if (slotFree[s] > b.first) continue;
        // Prefer the free slot whose size is closest to the buffer's.
        const auto gap = [&](size_t k) {
          return slotBytes[k] > b.bytes ? slotBytes[k] - b.bytes : 2 * (b.bytes - slotBytes[k]);
        };
        if (best < 0 || gap(s) < gap(static_cast<size_t>(best))) best = static_cast<int>(s);
      }
      if (best < 0) {
        slotBytes.push_back(0);
        slotFree.push_back(0);
        best = static_cast<int>(slotBytes.size()) - 1;
      }
      b.slot = best;
      slotBytes[static_cast<size_t>(best)] = std::max(slotBytes[static_cast<size_t>(best)], b.bytes);
      slotFree[static_cast<size_t>(best)] = b.last + 1;
    }
    for (size_t bytes : slotBytes) {
      slots_.push_back(ctx_.allocateBytes(bytes));
      activationBytes_ += bytes;
    }
    yMem_ = memory(memory::desc({1}, dt::f32, tag::x), eng, DNNL_MEMORY_NONE);
    scratch_ = ctx_.allocateBytes(std::max<size_t>(scratchBytes_, 64));
    const memory scratch(memory::desc({static_cast<int64_t>(scratch_.nbytes())}, dt::u8, tag::x), eng, scratch_.data());
    for (auto& s : steps_) {
      for (const auto& a : s.args) {
        if (a.buffer == kInput) {
          s.bound[a.arg] = xMem_;
        } else if (a.buffer == kOutput) {
          yMem_ = memory(a.md, eng, DNNL_MEMORY_NONE);
          s.bound[a.arg] = yMem_;
        } else {
          void* data = slots_[static_cast<size_t>(buffers_[static_cast<size_t>(a.buffer)].slot)].data();
          s.bound[a.arg] = memory(a.md, eng, data);
        }
      }
      s.bound[DNNL_ARG_SCRATCHPAD] = scratch;
    }
  }

  void describe() {
    std::ostringstream s;
    s << "onednn int8: " << int8Nodes_ << " int8 + " << floatNodes_ << " f32 conv/linear, " << requantized_
      << " with int8 output, " << reorders_ << " reorders, " << quantizePasses_ << " quantizing passes, " << inPlace_
      << " residual sums in place, ";
    if (doubledWeights_ > 0) s << doubledWeights_ << " signed-input convolutions given doubled 7-bit weights, ";
    s << (activationBytes_ + (1 << 20) - 1) / (1 << 20) << " MiB activations; kernels:";
    for (const auto& [name, count] : kernels_) s << " " << name << " x" << count << ";";
    impl_ = s.str();
  }

  CpuContext& ctx_;
  InferencePlanParams p_;
  std::vector<Shape> shapes_;
  std::vector<std::vector<Rep>> reps_;
  std::vector<Buffer> buffers_;
  std::vector<Step> steps_;
  std::vector<std::pair<Tensor, memory>> weights_;
  std::vector<Tensor> slots_;
  Tensor scratch_;
  size_t scratchBytes_ = 0, activationBytes_ = 0;
  memory xMem_, yMem_;
  std::map<std::string, int> kernels_;
  int int8Nodes_ = 0, floatNodes_ = 0, requantized_ = 0, reorders_ = 0, quantizePasses_ = 0, inPlace_ = 0,
      doubledWeights_ = 0;
  std::string impl_;
};

}  // namespace

std::unique_ptr<InferencePlan> buildInt8InferencePlan(CpuContext& ctx, const InferencePlanParams& params) {
  RC_CHECK_ARG(params.dtype == DType::F32,
               "inference plan: INT8 runs its floating-point nodes in f32 on the CPU, got " << dtypeName(params.dtype));
  return std::make_unique<Int8InferencePlan>(ctx, params);
}

}  // namespace rc::cpu
