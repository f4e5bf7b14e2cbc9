#include "compute_type.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <vector>

#include "cpu_context.h"
#include "cpu_ops.h"

namespace rc::cpu {

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

bool probeBf16(dnnl::engine& engine) {
  // oneDNN refuses every bf16 primitive, its reference ones included, where the CPU lacks bf16
  // support (status unimplemented); a 1x1 convolution stands for them all.
  try {
    const dnnl::memory::desc x({1, 16, 2, 2}, dt::bf16, tag::nhwc);
    const dnnl::memory::desc w({16, 16, 1, 1}, dt::bf16, tag::any);
    dnnl::convolution_forward::primitive_desc(engine, dnnl::prop_kind::forward_training,
                                              dnnl::algorithm::convolution_direct, x, w, x, {1, 1}, {0, 0}, {0, 0});
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

// A 1x1 convolution of 256 channels on 28x28 pixels (about 0.1 GFLOP) in data type `type`, ready
// to time: the middle of ResNet-50, where its time goes.
class ProbeConv {
 public:
  ProbeConv(dnnl::engine& engine, dt type) : engine_(engine) {
    const dnnl::memory::desc x({1, kChannels, kPixels, kPixels}, type, tag::nhwc);
    const dnnl::memory::desc w({kChannels, kChannels, 1, 1}, type, tag::any);
    const dnnl::convolution_forward::primitive_desc pd(engine, dnnl::prop_kind::forward_training,
                                                       dnnl::algorithm::convolution_direct, x, w, x, {1, 1}, {0, 0},
                                                       {0, 0});
    conv_ = dnnl::convolution_forward(pd);
    src_ = filled(pd.src_desc(), type);
    weights_ = filled(pd.weights_desc(), type);
    dst_ = dnnl::memory(pd.dst_desc(), engine);
  }

  // Seconds one run takes (the primitive called and waited for).
  double run(dnnl::stream& stream) {
    const auto start = std::chrono::steady_clock::now();
    conv_.execute(stream, {{DNNL_ARG_SRC, src_}, {DNNL_ARG_WEIGHTS, weights_}, {DNNL_ARG_DST, dst_}});
    stream.wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  static constexpr int64_t kChannels = 256;
  static constexpr int64_t kPixels = 28;

  // Memory of `md` holding 1.0 in every element (uninitialised bytes could be denormals, which
  // slow some CPUs' arithmetic down and would skew the timing).
  dnnl::memory filled(const dnnl::memory::desc& md, dt type) {
    dnnl::memory m(md, engine_);
    const size_t bytes = md.get_size();
    if (type == dt::bf16) {
      std::vector<uint16_t> one(bytes / sizeof(uint16_t), 0x3f80);
      std::memcpy(m.get_data_handle(), one.data(), bytes);
    } else {
      std::vector<float> one(bytes / sizeof(float), 1.0f);
      std::memcpy(m.get_data_handle(), one.data(), bytes);
    }
    return m;
  }

  dnnl::engine& engine_;
  dnnl::convolution_forward conv_;
  dnnl::memory src_, weights_, dst_;
};

// The fastest of several alternated runs of the bf16 and the f32 probe convolutions, after a
// warm-up of each, in seconds.
std::pair<double, double> timeBf16AgainstF32(dnnl::engine& engine) {
  ProbeConv bf16(engine, dt::bf16);
  ProbeConv f32(engine, dt::f32);
  dnnl::stream stream(engine);
  constexpr int kWarmup = 3;
  constexpr int kRuns = 9;
  for (int i = 0; i < kWarmup; ++i) {
    bf16.run(stream);
    f32.run(stream);
  }
  double fastestBf16 = 1e30;
  double fastestF32 = 1e30;
  for (int i = 0; i < kRuns; ++i) {
    fastestBf16 = std::min(fastestBf16, bf16.run(stream));
    fastestF32 = std::min(fastestF32, f32.run(stream));
  }
  return {fastestBf16, fastestF32};
}

bool hasAmx() {
  using isa = dnnl::cpu_isa;
  const isa effective = dnnl::get_effective_cpu_isa();
  return effective == isa::avx512_core_amx || effective == isa::avx512_core_amx_fp16;
}

// RESNET_CPU_BF16: "auto" (or unset), "native" or "f32".
std::string bf16Setting() {
  const char* value = std::getenv("RESNET_CPU_BF16");
  const std::string setting = value == nullptr || *value == '\0' ? "auto" : value;
  if (setting != "auto" && setting != "native" && setting != "f32") {
    RC_THROW(code::kInvalidArgument, "RESNET_CPU_BF16 expects auto, native or f32, got '" << setting << "'");
  }
  return setting;
}

Bf16Compute decideBf16(dnnl::engine& engine) {
  const std::string setting = bf16Setting();
  const bool kernels = probeBf16(engine);
  if (setting == "native") {
    if (!kernels) {
      RC_THROW(code::kInvalidArgument,
               "RESNET_CPU_BF16=native, but oneDNN has no bf16 kernels on this CPU (" << isaName() << ")");
    }
    return {true, "RESNET_CPU_BF16=native"};
  }
  if (setting == "f32") return {false, "RESNET_CPU_BF16=f32"};
  if (!kernels) return {false, "oneDNN has no bf16 kernels on this CPU (" + isaName() + ")"};
  if (hasAmx()) return {true, "AMX"};
  constexpr double kMargin = 1.1;
  const auto [bf16, f32] = timeBf16AgainstF32(engine);
  std::ostringstream why;
  why.precision(0);
  why << std::fixed << "oneDNN's bf16 1x1 convolution took " << bf16 * 1e6 << " us against " << f32 * 1e6
      << " us in f32 on this CPU (" << isaName() << ")";
  return {bf16 <= kMargin * f32, why.str()};
}

// Whether the primitive's view of `t` (md) is an f32 copy of a bf16 tensor; anything else must
// match exactly.
bool isStaged(const Tensor& t, const dnnl::memory::desc& md) {
  const dt want = md.get_data_type();
  if (want == toDnnl(t.dtype())) return false;
  if (t.dtype() != DType::BF16 || want != dt::f32) {
    RC_THROW(code::kInternal, "a oneDNN primitive was built for another data type than its " << t.describe());
  }
  return true;
}

}  // namespace

const Bf16Compute& bf16Compute(dnnl::engine& engine) {
  // call_once runs the decision again after it threw (a bad RESNET_CPU_BF16), so every caller
  // gets the error.
  static std::once_flag once;
  static Bf16Compute decided;
  std::call_once(once, [&] { decided = decideBf16(engine); });
  return decided;
}

bool hasNativeBf16(dnnl::engine& engine) { return bf16Compute(engine).native; }

bool hasInt8DotProducts() {
  using isa = dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case isa::avx2_vnni:
    case isa::avx2_vnni_2:
    case isa::avx512_core_vnni:
    case isa::avx512_core_bf16:
    case isa::avx512_core_fp16:
    case isa::avx512_core_amx:
    case isa::avx512_core_amx_fp16: return true;
    default: return false;
  }
}

dnnl::memory::data_type computeType(dnnl::engine& engine, DType t) {
  return t == DType::BF16 && !hasNativeBf16(engine) ? dt::f32 : toDnnl(t);
}

void* stageInput(CpuContext& ctx, const Tensor& t, const dnnl::memory::desc& md, int slot) {
  if (!isStaged(t, md)) return t.data();
  const Tensor wide = ctx.staging(slot, t.shape());
  cast(t, wide);
  return wide.data();
}

void* stageOutput(CpuContext& ctx, const Tensor& t, const dnnl::memory::desc& md, int slot) {
  if (!isStaged(t, md)) return t.data();
  return ctx.staging(slot, t.shape()).data();
}

void finishOutput(CpuContext& ctx, const Tensor& t, const dnnl::memory::desc& md, int slot) {
  if (isStaged(t, md)) cast(ctx.staging(slot, t.shape()), t);
}

}  // namespace rc::cpu
