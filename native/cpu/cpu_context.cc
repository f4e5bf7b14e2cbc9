#include "cpu_context.h"
#include "weighted_passes.h"

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

const Tensor& CpuContext::grown(Tensor& buffer, size_t bytes) {
  if (!buffer.defined() || buffer.nbytes() < bytes) {
    buffer = Tensor();  // the old buffer goes back to the allocator before the larger one is taken
    buffer = allocateBytes(bytes);
  }
  return buffer;
}

void* CpuContext::scratch(size_t bytes) { return grown(scratch_, bytes).data(); }

Tensor CpuContext::grownAs(Tensor& buffer, const Shape& shape, DType dtype) {
  const Tensor& grownBuffer = grown(buffer, static_cast<size_t>(shapeNumel(shape)) * dtypeSize(dtype));
  return Tensor(grownBuffer.storage(), grownBuffer.byteOffset(), shape, dtype);
}

Tensor CpuContext::staging(int slot, const Shape& shape) {
  RC_CHECK_ARG(slot == 0 || slot == 1, "CpuContext::staging: slot must be 0 or 1, got " << slot);
  return grownAs(staging_[slot], shape, DType::F32);
}

void* CpuContext::layoutCopy(int slot, size_t bytes) {
  RC_CHECK_ARG(slot == 0 || slot == 1, "CpuContext::layoutCopy: slot must be 0 or 1, got " << slot);
  return grown(layoutCopies_[slot], bytes).data();
}

Tensor CpuContext::strideCopy(const Shape& shape, DType dtype) { return grownAs(strideCopy_, shape, dtype); }

Tensor CpuContext::addend(const Shape& shape, DType dtype) { return grownAs(addend_, shape, dtype); }

Tensor CpuContext::allocate(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shapeNumel(shape)) * dtypeSize(dtype);
  return Tensor(std::make_shared<Storage>(allocator_.get(), Device{DeviceType::Cpu, 0}, bytes), 0, shape, dtype);
}

Tensor CpuContext::allocateBytes(size_t bytes) { return allocate(Shape{static_cast<int64_t>(bytes)}, DType::U8); }

void* WeightReorder::laidOut(const Tensor& weight, const Tensor& buffer) {
  auto& eng = ctx_->engine();
  const dnnl::memory::desc plain(dims_, toDnnl(weight.dtype()), plainTag_);
  if (plain == target_) return weight.data();
  auto it = reorders_.find(weight.dtype());
  if (it == reorders_.end()) {
    it =
        reorders_.emplace(weight.dtype(), dnnl::reorder(dnnl::reorder::primitive_desc(eng, plain, eng, target_))).first;
  }
  dnnl::memory src(plain, eng, weight.data());
  dnnl::memory dst(target_, eng, buffer.data());
  it->second.execute(ctx_->stream(), src, dst);
  return buffer.data();
}

dnnl::reorder accumulatingReorder(CpuContext& ctx, const dnnl::memory::desc& from, const dnnl::memory::desc& to) {
  dnnl::primitive_attr attr;
  dnnl::post_ops sum;
  sum.append_sum(1.0f);
  attr.set_post_ops(sum);
  return dnnl::reorder(dnnl::reorder::primitive_desc(ctx.engine(), from, ctx.engine(), to, attr));
}

LayoutCopy::LayoutCopy(CpuContext& ctx, const dnnl::memory::desc& from, const dnnl::memory::desc& to, int slot)
    : ctx_(&ctx), from_(from), to_(to), slot_(slot) {
  if (from_ != to_) reorder_ = dnnl::reorder(dnnl::reorder::primitive_desc(ctx.engine(), from_, ctx.engine(), to_));
}

dnnl::memory LayoutCopy::operator()(void* data) {
  auto& eng = ctx_->engine();
  if (!reorder_) return dnnl::memory(from_, eng, data);
  dnnl::memory copy(to_, eng, ctx_->layoutCopy(slot_, to_.get_size()));
  dnnl::memory source(from_, eng, data);
  reorder_->execute(ctx_->stream(), source, copy);
  return copy;
}

std::unique_ptr<AccumulatingMatmul> AccumulatingMatmul::create(CpuContext& ctx, const dnnl::memory::desc& a,
                                                               const dnnl::memory::desc& b,
                                                               const dnnl::memory::desc& c) {
  dnnl::primitive_attr attr;
  dnnl::post_ops sum;
  sum.append_sum(1.0f);
  attr.set_post_ops(sum);
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    dnnl::matmul::primitive_desc pd(ctx.engine(), a, b, c, attr);
    if (std::string(pd.impl_info_str()).rfind("brg", 0) != 0) return nullptr;
    return std::make_unique<AccumulatingMatmul>(ctx, pd);
  } catch (const dnnl::error&) {
    return nullptr;  // no matmul for this layout: the convolution's primitive does it
  }
}

AccumulatingMatmul::AccumulatingMatmul(CpuContext& ctx, dnnl::matmul::primitive_desc pd)
    : ctx_(&ctx), pd_(std::move(pd)), matmul_(pd_) {}

void AccumulatingMatmul::run(const Tensor& a, const Tensor& b, const Tensor& c) {
  auto& eng = ctx_->engine();
  const auto scratch = pd_.scratchpad_desc();
  matmul_.execute(ctx_->stream(),
                  {{DNNL_ARG_SRC, dnnl::memory(pd_.src_desc(), eng, a.data())},
                   {DNNL_ARG_WEIGHTS, dnnl::memory(pd_.weights_desc(), eng, b.data())},
                   {DNNL_ARG_DST, dnnl::memory(pd_.dst_desc(), eng, c.data())},
                   {DNNL_ARG_SCRATCHPAD, dnnl::memory(scratch, eng, ctx_->scratch(scratch.get_size()))}});
}

std::unique_ptr<RowGradientMatmul> RowGradientMatmul::create(CpuContext& ctx, int64_t rows, int64_t in, int64_t out,
                                                             dnnl::memory::data_type act) {
  using dims = dnnl::memory::dims;
  // dy^T: dy is [rows, out] row-major, read as [out, rows]; x is [rows, in]; dW is [out, in].
  const dnnl::memory::desc dyT({out, rows}, act, dims{1, out});
  const dnnl::memory::desc x({rows, in}, act, dims{in, 1});
  const dnnl::memory::desc dW({out, in}, dnnl::memory::data_type::f32, dims{in, 1});
  auto matmul = AccumulatingMatmul::create(ctx, dyT, x, dW);
  return matmul ? std::make_unique<RowGradientMatmul>(std::move(matmul)) : nullptr;
}

void RowGradientMatmul::run(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& /*dBias*/) {
  matmul_->run(dy, x, dWeight);
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
    case isa::avx2_vnni_2: return "avx2_vnni_2";
    case isa::avx512_core: return "avx512_core";
    case isa::avx512_core_vnni: return "avx512_core_vnni";
    case isa::avx512_core_bf16: return "avx512_core_bf16";
    case isa::avx512_core_fp16: return "avx512_core_fp16";
    case isa::avx512_core_amx: return "avx512_core_amx";
    case isa::avx512_core_amx_fp16: return "avx512_core_amx_fp16";
    default: return "other";
  }
}

}  // namespace rc::cpu
