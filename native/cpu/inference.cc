// The inference plan on oneDNN (native/core/inference_plan.h): every primitive, weight layout and
// buffer is made when the plan is created, and `run` only binds the caller's input and output and
// executes the primitives in order.
//
// - Convolutions are created with `format_tag::any` weights, so oneDNN lays them out for its
//   kernel; f32 outputs are channel-blocked (nChw16c) with AVX-512 and NHWC with AVX2, bf16
//   outputs in the layout oneDNN picks. Each convolution reads its input in the layout its producer wrote.
//   Bias, the residual add (a `sum` post-op) and the ReLU (an `eltwise_relu` post-op after it) run
//   inside the convolution.
// - The weights (OHWI f32 with batch norm folded in) are reordered once into the layout, and the
//   dtype, the primitive wants.
// - Max pooling, global average pooling and the final inner product run on the same layouts. The
//   input is reordered from NHWC f32 once at the start; the logits are written as f32 straight
//   into the caller's output.
// - Activations live in one arena, planned by liveness: a value's buffer is reused once its last
//   reader has run, and a convolution that adds a residual read by nobody after it accumulates
//   into that residual's buffer (the sum post-op reads it in place). One scratchpad serves all
//   primitives (`scratchpad_mode::user`).
//
// INT8 plans (`params.int8`) are built elsewhere; this builder refuses them.
#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include "../core/error.h"
#include "compute_type.h"
#include "cpu_ops.h"

namespace rc::cpu {

namespace {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using dnnl::memory;

constexpr int kUserInput = -1;
constexpr int kUserOutput = -2;
constexpr int kScratchpad = -3;
constexpr int kFixed = -4;  // a memory made at creation (weights, bias)

// Where a primitive argument lives: an arena slot, the caller's input or output, the scratchpad, or
// a memory that owns its data (weights).
struct MemRef {
  int slot = kFixed;
  memory::desc desc;
  memory fixed;
};

struct Step {
  dnnl::primitive primitive;
  std::vector<std::pair<int, MemRef>> refs;
  std::unordered_map<int, memory> args;  // made from refs once the arena exists
};

// Activation buffers by liveness: a slot holds one value at a time and grows to the largest value it
// ever holds; the arena lays the slots out once planning is done.
class SlotPlanner {
 public:
  int acquire(size_t bytes) {
    int best = -1;
    for (int s : free_) {
      // The smallest free slot that fits; failing that, the largest one (it grows).
      if (best < 0) {
        best = s;
        continue;
      }
      const bool fits = sizes_[s] >= bytes, bestFits = sizes_[best] >= bytes;
      if ((fits && (!bestFits || sizes_[s] < sizes_[best])) || (!fits && !bestFits && sizes_[s] > sizes_[best])) {
        best = s;
      }
    }
    if (best < 0) {
      best = static_cast<int>(sizes_.size());
      sizes_.push_back(0);
    } else {
      free_.erase(std::find(free_.begin(), free_.end(), best));
    }
    sizes_[best] = std::max(sizes_[best], bytes);
    return best;
  }
  void release(int slot) { free_.push_back(slot); }
  // Byte offsets of the slots in an arena of `total` bytes (each 64-byte aligned).
  std::vector<size_t> layout(size_t& total) const {
    std::vector<size_t> offsets;
    total = 0;
    for (size_t bytes : sizes_) {
      offsets.push_back(total);
      total += (bytes + 63) / 64 * 64;
    }
    return offsets;
  }

 private:
  std::vector<size_t> sizes_;
  std::vector<int> free_;
};

bool isReference(const std::string& impl) { return impl.rfind("ref", 0) == 0; }

class CpuInferencePlan final : public InferencePlan {
 public:
  CpuInferencePlan(CpuContext& ctx, const InferencePlanParams& p) : ctx_(ctx), p_(p) {
    RC_CHECK_ARG(!p.int8, "inference plan: INT8 plans are not built by the floating-point builder");
    RC_CHECK_ARG(p.dtype == DType::F32 || p.dtype == DType::BF16 || p.dtype == DType::F16,
                 "inference plan: dtype must be f32, bf16 or f16, got " << dtypeName(p.dtype));
    shapes_ = inferenceValueShapes(p);
    act_ = computeType(ctx.engine(), p.dtype);
    chooseOutputLayout();
    try {
      build();
    } catch (const dnnl::error& e) {
      // oneDNN has f16 kernels only on some CPUs and versions: say so rather than "unimplemented".
      RC_CHECK_ARG(p.dtype != DType::F16 || e.status != dnnl_unimplemented,
                   "inference plan: oneDNN " << dnnlVersion() << " has no f16 kernel for this network on this CPU ("
                                             << isaName() << "); use f32 or bf16");
      RC_THROW(code::kOneDnn, "oneDNN failed in " << p.str() << ": " << e.what() << " (status " << e.status << ")");
    }
  }

  void run(const Tensor& x, const Tensor& y) override {
    dnnlGuard("inference run", [&] {
      xMem_.set_data_handle(x.data());
      yMem_.set_data_handle(y.data());
      for (Step& s : steps_) s.primitive.execute(ctx_.stream(), s.args);
      ctx_.stream().wait();
    });
  }

  std::string implementation() const override { return implementation_; }

 private:
  // The f32 convolutions' output layout. With AVX-512 channel-blocked (nChw16c), where oneDNN's
  // direct kernels run: given NHWC, oneDNN takes its brgemm kernels, which measured 1.1-1.5x slower
  // on ResNet-50 at batch 1 and 16 with oneDNN 2.6, and level at batch 1 with 3.2. With AVX2 NHWC:
  // there the brgemm kernels measured 5-7% faster than the blocked (nChw8c) direct ones at batch 1
  // and level at batch 4 and 16 (bench/RESULTS.md, a Zen 3), and `any` would pick the blocked ones.
  // bf16 keeps `any`: its AMX kernels want NHWC.
  void chooseOutputLayout() {
    if (act_ != dt::f32) return;
    using isa = dnnl::cpu_isa;
    const isa effective = dnnl::get_effective_cpu_isa();
    if (effective == isa::avx512_core || effective == isa::avx512_core_vnni || effective == isa::avx512_core_bf16 ||
        effective == isa::avx512_core_fp16 || effective == isa::avx512_core_amx ||
        effective == isa::avx512_core_amx_fp16) {
      outputTag_ = tag::nChw16c;
      outputBlock_ = 16;
    } else if (effective == isa::avx2 || effective == isa::avx2_vnni || effective == isa::avx2_vnni_2) {
      outputTag_ = tag::nhwc;
      outputBlock_ = 1;
    }
  }

  // The layout a value was written in, the slot holding it and the node reading it last.
  struct Value {
    memory::desc desc;
    int slot = kUserInput;
    int64_t lastUse = -1;
  };

  void build() {
    auto& eng = ctx_.engine();
    values_.resize(p_.nodes.size() + 1);
    for (size_t i = 0; i < p_.nodes.size(); ++i) {
      const InferenceNode& node = p_.nodes[i];
      values_[node.input].lastUse = static_cast<int64_t>(i);
      if (node.residual >= 0) values_[node.residual].lastUse = static_cast<int64_t>(i);
    }
    values_[0].desc = memory::desc({p_.n, p_.c, p_.h, p_.w}, dt::f32, tag::nhwc);
    values_[0].slot = kUserInput;
    for (size_t i = 0; i < p_.nodes.size(); ++i) {
      const InferenceNode& node = p_.nodes[i];
      switch (node.op) {
        case InferenceOp::Conv: addConv(i, node); break;
        case InferenceOp::MaxPool: addPool(i, node, dnnl::algorithm::pooling_max); break;
        case InferenceOp::GlobalAvgPool: addPool(i, node, dnnl::algorithm::pooling_avg_exclude_padding); break;
        case InferenceOp::Linear: addLinear(i, node); break;
      }
      // Values whose last reader was this node give their slot back (unless this node took it over).
      releaseAfter(static_cast<int64_t>(i));
    }
    size_t total = 0;
    const std::vector<size_t> offsets = slots_.layout(total);
    arena_ = ctx_.allocateBytes(std::max<size_t>(total, 64));
    scratchpad_ = ctx_.allocateBytes(std::max<size_t>(scratchpadBytes_, 64));
    xMem_ = memory(values_[0].desc, eng, DNNL_MEMORY_NONE);
    yMem_ = memory(outputDesc_, eng, DNNL_MEMORY_NONE);
    for (Step& s : steps_) {
      for (auto& [arg, ref] : s.refs) {
        switch (ref.slot) {
          case kUserInput: s.args[arg] = xMem_; break;
          case kUserOutput: s.args[arg] = yMem_; break;
          case kScratchpad: s.args[arg] = memory(ref.desc, eng, scratchpad_.data()); break;
          case kFixed: s.args[arg] = ref.fixed; break;
          default: s.args[arg] = memory(ref.desc, eng, static_cast<char*>(arena_.data()) + offsets[ref.slot]);
        }
      }
      s.refs.clear();
    }
    describe();
  }

  void releaseAfter(int64_t i) {
    for (size_t v = 0; v < values_.size(); ++v) {
      Value& value = values_[v];
      if (value.lastUse == i && value.slot >= 0 && !takenOver_.count(v)) slots_.release(value.slot);
    }
  }

  // A memory of `want` holding value `v`: the value itself when its layout matches, else a reorder
  // into a temporary slot (given back after the node).
  MemRef source(size_t v, const memory::desc& want) {
    const Value& value = values_[v];
    if (value.desc == want) return MemRef{value.slot, want, {}};
    const int slot = slots_.acquire(want.get_size());
    tempSlots_.push_back(slot);
    addReorder(MemRef{value.slot, value.desc, {}}, MemRef{slot, want, {}});
    ++reorders_;
    return MemRef{slot, want, {}};
  }

  void addReorder(const MemRef& from, const MemRef& to) {
    auto& eng = ctx_.engine();
    Step s;
    s.primitive = dnnl::reorder(dnnl::reorder::primitive_desc(eng, from.desc, eng, to.desc));
    s.refs = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    steps_.push_back(std::move(s));
  }

  void releaseTemps() {
    for (int slot : tempSlots_) slots_.release(slot);
    tempSlots_.clear();
  }

  // The output slot of node i: the residual's own buffer when this node reads it last, it is not
  // the node's input, and it has the output's layout; else a new slot.
  int outputSlot(size_t i, const InferenceNode& node, const memory::desc& dst, bool& inPlace) {
    inPlace = false;
    if (node.residual > 0) {
      Value& r = values_[node.residual];
      if (r.lastUse == static_cast<int64_t>(i) && node.residual != node.input && r.desc == dst && r.slot >= 0) {
        inPlace = true;
        takenOver_.insert(static_cast<size_t>(node.residual));
        return r.slot;
      }
    }
    return slots_.acquire(dst.get_size());
  }

  void addScratchpad(Step& s, const memory::desc& pad) {
    scratchpadBytes_ = std::max(scratchpadBytes_, pad.get_size());
    if (pad.get_size() > 0) s.refs.push_back({DNNL_ARG_SCRATCHPAD, MemRef{kScratchpad, pad, {}}});
  }

  // Weights from plain f32 host values into the layout (and dtype) a primitive wants.
  MemRef weights(const std::vector<float>& host, const memory::dims& dims, tag plain, const memory::desc& want) {
    auto& eng = ctx_.engine();
    Tensor owned = ctx_.allocateBytes(std::max<size_t>(want.get_size(), 64));
    memory src(memory::desc(dims, dt::f32, plain), eng, const_cast<float*>(host.data()));
    memory dst(want, eng, owned.data());
    dnnl::reorder(src, dst).execute(ctx_.stream(), src, dst);
    ctx_.stream().wait();
    weights_.push_back(owned);
    return MemRef{kFixed, want, dst};
  }

  MemRef bias(const std::vector<float>& host) {
    auto& eng = ctx_.engine();
    const memory::desc d({static_cast<int64_t>(host.size())}, dt::f32, tag::x);
    Tensor owned = ctx_.allocateBytes(std::max<size_t>(d.get_size(), 64));
    std::copy(host.begin(), host.end(), owned.ptr<float>());
    weights_.push_back(owned);
    return MemRef{kFixed, d, memory(d, eng, owned.data())};
  }

  static memory::dims padRight(const InferenceNode& node, const Shape& in, const Shape& out) {
    return {farPadding(in[1], out[1], node.dilationH * (node.kernelH - 1) + 1, node.strideH, node.padH),
            farPadding(in[2], out[2], node.dilationW * (node.kernelW - 1) + 1, node.strideW, node.padW)};
  }

  dnnl::convolution_forward::primitive_desc convPd(const InferenceNode& node, const memory::desc& src,
                                                   const memory::desc& dst, const dnnl::primitive_attr& attr,
                                                   const Shape& in, const Shape& out) {
    const memory::dims wDims{node.outChannels, node.inChannels, node.kernelH, node.kernelW};
    return dnnl::convolution_forward::primitive_desc(
        ctx_.engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src,
        memory::desc(wDims, act_, tag::any), memory::desc({node.outChannels}, dt::f32, tag::x), dst,
        {node.strideH, node.strideW}, {node.dilationH - 1, node.dilationW - 1}, {node.padH, node.padW},
        padRight(node, in, out), attr);
  }

  void addConv(size_t i, const InferenceNode& node) {
    const Shape& in = shapes_[node.input];
    const Shape& out = shapes_[i + 1];
    const memory::dims srcDims{in[0], in[3], in[1], in[2]};
    const memory::dims dstDims{out[0], out[3], out[1], out[2]};
    dnnl::post_ops ops;
    if (node.residual >= 0) ops.append_sum(1.0f);
    if (node.relu) ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    attr.set_post_ops(ops);

    const memory::desc anySrc(srcDims, act_, tag::any);
    const bool ownLayout = outputTag_ != tag::any && node.outChannels % outputBlock_ == 0;
    const memory::desc anyDst(dstDims, act_, ownLayout ? outputTag_ : tag::any);
    // Read the input where it is (its producer's layout and dtype) unless oneDNN has only its
    // reference kernel for that; the network's input is always converted.
    const bool internal = node.input > 0;
    auto pd = convPd(node, internal ? values_[node.input].desc : anySrc, anyDst, attr, in, out);
    if (internal && isReference(pd.impl_info_str())) pd = convPd(node, anySrc, anyDst, attr, in, out);
    // Accumulate into the residual's buffer when this is its last reader: the output takes its layout.
    if (node.residual > 0 && values_[node.residual].lastUse == static_cast<int64_t>(i) &&
        values_[node.residual].desc != pd.dst_desc() && node.residual != node.input) {
      auto fixed = convPd(node, pd.src_desc(), values_[node.residual].desc, attr, in, out);
      if (!isReference(fixed.impl_info_str())) pd = fixed;
    }
    RC_CHECK_ARG(!isReference(pd.impl_info_str()) || p_.dtype != DType::F16,
                 "inference plan: oneDNN " << dnnlVersion() << " has only its reference f16 convolution on this CPU ("
                                           << isaName() << "); use f32 or bf16");

    Step s;
    s.primitive = dnnl::convolution_forward(pd);
    const MemRef src = source(static_cast<size_t>(node.input), pd.src_desc());
    bool inPlace = false;
    const int slot = outputSlot(i, node, pd.dst_desc(), inPlace);
    const MemRef dst{slot, pd.dst_desc(), {}};
    if (node.residual >= 0 && !inPlace) {
      // The sum post-op adds what the output buffer holds: copy the residual there first.
      addReorder(MemRef{values_[node.residual].slot, values_[node.residual].desc, {}}, dst);
      ++residualCopies_;
    }
    s.refs = {{DNNL_ARG_SRC, src},
              {DNNL_ARG_WEIGHTS, weights(node.weight, {node.outChannels, node.inChannels, node.kernelH, node.kernelW},
                                         tag::acdb, pd.weights_desc())},
              {DNNL_ARG_BIAS, bias(node.bias)},
              {DNNL_ARG_DST, dst}};
    addScratchpad(s, pd.scratchpad_desc());
    steps_.push_back(std::move(s));
    releaseTemps();
    values_[i + 1].desc = pd.dst_desc();
    values_[i + 1].slot = slot;
    ++convKernels_[pd.impl_info_str()];
  }

  void addPool(size_t i, const InferenceNode& node, dnnl::algorithm algorithm) {
    const Shape& in = shapes_[node.input];
    const Shape& out = shapes_[i + 1];
    const bool global = algorithm != dnnl::algorithm::pooling_max;
    const memory::dims srcDims{in[0], in[3], in[1], in[2]};
    const memory::dims dstDims{in[0], in[3], global ? 1 : out[1], global ? 1 : out[2]};
    const memory::dims kernel = global ? memory::dims{in[1], in[2]} : memory::dims{node.kernelH, node.kernelW};
    const memory::dims strides = global ? memory::dims{1, 1} : memory::dims{node.strideH, node.strideW};
    const memory::dims padL = global ? memory::dims{0, 0} : memory::dims{node.padH, node.padW};
    const memory::dims padR = global ? memory::dims{0, 0} : padRight(node, in, out);
    const memory::desc src = node.input > 0 ? values_[node.input].desc : memory::desc(srcDims, act_, tag::nhwc);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::pooling_forward::primitive_desc pd(ctx_.engine(), dnnl::prop_kind::forward_inference, algorithm, src,
                                                   memory::desc(dstDims, act_, tag::any), strides, kernel,
                                                   memory::dims{0, 0}, padL, padR, attr);
    Step s;
    s.primitive = dnnl::pooling_forward(pd);
    const MemRef from = source(static_cast<size_t>(node.input), pd.src_desc());
    bool inPlace = false;
    const int slot = outputSlot(i, node, pd.dst_desc(), inPlace);
    s.refs = {{DNNL_ARG_SRC, from}, {DNNL_ARG_DST, MemRef{slot, pd.dst_desc(), {}}}};
    addScratchpad(s, pd.scratchpad_desc());
    steps_.push_back(std::move(s));
    releaseTemps();
    values_[i + 1].desc = pd.dst_desc();
    values_[i + 1].slot = slot;
    if (i + 1 == p_.nodes.size()) {
      // A network that ends in global pooling: its [n, c] features are the output, in f32.
      outputDesc_ = memory::desc(dstDims, dt::f32, tag::nchw);  // [n, c, 1, 1]: the bytes of [n, c]
      addReorder(MemRef{slot, pd.dst_desc(), {}}, MemRef{kUserOutput, outputDesc_, {}});
    }
  }

  // The fully connected layer on [n, features] (a global pooling's [n, c, 1, 1] output read as is,
  // or a plain [n, features] value). The last node writes f32 logits into the caller's output.
  void addLinear(size_t i, const InferenceNode& node) {
    const Shape& in = shapes_[node.input];
    const bool last = i + 1 == p_.nodes.size();
    const memory::desc& have = values_[node.input].desc;
    // A pooled value keeps its 4-D [n, c, 1, 1] desc; the weights then take the same rank.
    const bool spatial = node.input > 0 && have.get_ndims() == 4;
    const memory::dims wDims = spatial ? memory::dims{node.outChannels, node.inChannels, 1, 1}
                                       : memory::dims{node.outChannels, node.inChannels};
    const memory::desc src = spatial ? have : memory::desc({in[0], in[1]}, act_, tag::nc);
    outputDesc_ = memory::desc({in[0], node.outChannels}, dt::f32, tag::nc);
    const memory::desc dst = last ? outputDesc_ : memory::desc({in[0], node.outChannels}, act_, tag::nc);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::inner_product_forward::primitive_desc pd(ctx_.engine(), dnnl::prop_kind::forward_inference, src,
                                                         memory::desc(wDims, act_, tag::any),
                                                         memory::desc({node.outChannels}, dt::f32, tag::x), dst, attr);
    Step s;
    s.primitive = dnnl::inner_product_forward(pd);
    const MemRef from = source(static_cast<size_t>(node.input), pd.src_desc());
    int slot = kUserOutput;
    if (!last) {
      bool inPlace = false;
      slot = outputSlot(i, node, pd.dst_desc(), inPlace);
    }
    s.refs = {{DNNL_ARG_SRC, from},
              {DNNL_ARG_WEIGHTS, weights(node.weight, wDims, spatial ? tag::abcd : tag::ab, pd.weights_desc())},
              {DNNL_ARG_BIAS, bias(node.bias)},
              {DNNL_ARG_DST, MemRef{slot, pd.dst_desc(), {}}}};
    addScratchpad(s, pd.scratchpad_desc());
    steps_.push_back(std::move(s));
    releaseTemps();
    values_[i + 1].desc = pd.dst_desc();
    values_[i + 1].slot = slot;
    linearKernel_ = pd.impl_info_str();
  }

  static std::string dnnlVersion() {
    const dnnl_version_t* v = dnnl::version();
    return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  }

  // "onednn f32: convs brgconv:avx512_core x20, ...; fc gemm:jit; 2 reorders, 1 residual copy"
  // ("onednn bf16 computed in f32: ..." where oneDNN has no bf16 kernels, see compute_type.h)
  void describe() {
    std::ostringstream s;
    s << "onednn " << dtypeName(p_.dtype) << (act_ == toDnnl(p_.dtype) ? "" : " computed in f32") << ":";
    if (!convKernels_.empty()) {
      s << " convs";
      const char* sep = " ";
      for (const auto& [impl, count] : convKernels_) {
        s << sep << impl << " x" << count;
        sep = ", ";
      }
      s << ";";
    }
    if (!linearKernel_.empty()) s << " fc " << linearKernel_ << ";";
    s << " " << reorders_ << " activation reorder" << (reorders_ == 1 ? "" : "s") << ", " << residualCopies_
      << " residual cop" << (residualCopies_ == 1 ? "y" : "ies");
    implementation_ = s.str();
  }

  CpuContext& ctx_;
  // The parameters, read only while the constructor builds the plan (they hold host copies of all
  // the weights, which the plan does not keep).
  const InferencePlanParams& p_;
  std::vector<Shape> shapes_;
  dt act_ = dt::f32;
  tag outputTag_ = tag::any;  // the f32 convolutions' output layout (chooseOutputLayout), or any
  int64_t outputBlock_ = 1;   // its channel block: outputs with other channel counts take any
  std::vector<Value> values_;
  std::set<size_t> takenOver_;
  SlotPlanner slots_;
  std::vector<int> tempSlots_;
  std::vector<Step> steps_;
  std::vector<Tensor> weights_;
  size_t scratchpadBytes_ = 0;
  memory::desc outputDesc_;
  Tensor arena_, scratchpad_;
  memory xMem_, yMem_;
  std::map<std::string, int> convKernels_;
  std::string linearKernel_;
  int reorders_ = 0, residualCopies_ = 0;
  std::string implementation_;
};

}  // namespace

std::unique_ptr<InferencePlan> buildInferencePlan(CpuContext& ctx, const InferencePlanParams& params) {
  return std::make_unique<CpuInferencePlan>(ctx, params);
}

}  // namespace rc::cpu
