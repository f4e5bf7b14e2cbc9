#include "compute_type.h"

#include <mutex>

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

bool hasNativeBf16(dnnl::engine& engine) {
  static std::once_flag once;
  static bool native = false;
  std::call_once(once, [&] { native = probeBf16(engine); });
  return native;
}

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
