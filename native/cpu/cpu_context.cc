#include "cpu_context.h"

#include <cstdlib>
#include <fstream>

namespace rc::cpu {

namespace {
void* hostAlloc(size_t bytes) { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
void hostFree(void* p) { std::free(p); }
size_t hostFreeMemory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t value = 0;
  std::string unit;
  while (meminfo >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}
}  // namespace

CpuContext::CpuContext()
    : engine_(dnnl::engine::kind::cpu, 0),
      stream_(engine_),
      allocator_(std::make_unique<CachingAllocator>(Device{DeviceType::Cpu, 0}, hostAlloc, hostFree, hostFreeMemory)) {}

void* CpuContext::scratch(size_t bytes) {
  if (!scratch_.defined() || scratch_.nbytes() < bytes) {
    scratch_ = Tensor();
    scratch_ = allocateBytes(bytes);
  }
  return scratch_.data();
}

Tensor CpuContext::allocate(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shapeNumel(shape)) * dtypeSize(dtype);
  return Tensor(std::make_shared<Storage>(allocator_.get(), Device{DeviceType::Cpu, 0}, bytes), 0, shape, dtype);
}

Tensor CpuContext::allocateBytes(size_t bytes) { return allocate(Shape{static_cast<int64_t>(bytes)}, DType::U8); }

void WeightReorder::run(const Tensor& weight, const Tensor& buffer) {
  auto& eng = ctx_->engine();
  const dnnl::memory::desc plain(dims_, toDnnl(weight.dtype()), plainTag_);
  auto it = reorders_.find(weight.dtype());
  if (it == reorders_.end()) {
    it =
        reorders_.emplace(weight.dtype(), dnnl::reorder(dnnl::reorder::primitive_desc(eng, plain, eng, target_))).first;
  }
  dnnl::memory src(plain, eng, weight.data());
  dnnl::memory dst(target_, eng, buffer.data());
  it->second.execute(ctx_->stream(), src, dst);
}

dnnl::reorder accumulatingReorder(CpuContext& ctx, const dnnl::memory::desc& from, const dnnl::memory::desc& to) {
  dnnl::primitive_attr attr;
  dnnl::post_ops sum;
  sum.append_sum(1.0f);
  attr.set_post_ops(sum);
  return dnnl::reorder(dnnl::reorder::primitive_desc(ctx.engine(), from, ctx.engine(), to, attr));
}

dnnl::memory::data_type toDnnl(DType t) {
  switch (t) {
    case DType::F32: return dnnl::memory::data_type::f32;
    case DType::BF16: return dnnl::memory::data_type::bf16;
    case DType::F16: return dnnl::memory::data_type::f16;
    case DType::I32: return dnnl::memory::data_type::s32;
    case DType::U8: return dnnl::memory::data_type::u8;
    default: RC_THROW(code::kInvalidArgument, "oneDNN has no data type for " << dtypeName(t));
  }
}

std::string isaName() {
  using isa = dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case isa::sse41: return "sse41";
    case isa::avx: return "avx";
    case isa::avx2: return "avx2";
    case isa::avx2_vnni: return "avx2_vnni";
    case isa::avx512_core: return "avx512_core";
    case isa::avx512_core_vnni: return "avx512_core_vnni";
    case isa::avx512_core_bf16: return "avx512_core_bf16";
    case isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

}  // namespace rc::cpu
