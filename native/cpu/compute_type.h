// The type oneDNN computes a dtype in on this CPU, the copies at a primitive's edges when that
// type is not the tensor's own, and whether its int8 kernels compute exactly.
//
// oneDNN has bf16 kernels only on CPUs with AVX-512 (or AVX2-VNNI-2); elsewhere (AVX2 CPUs such
// as AMD Zen 2/3 or Intel client parts) a bf16 plan builds its primitives in f32 and converts:
// bf16 inputs widened to f32 before a primitive reads them, f32 outputs rounded to bf16 (nearest
// even) after it writes them. The results are those of f32 arithmetic on the bf16 values, as
// PyTorch's CPU kernels compute bf16 where the CPU has no bf16 instructions; there is no speed-up
// over f32 there.
//
// Having bf16 kernels does not make them faster: AVX512-BF16's dot product runs at twice the f32
// FMA rate on some CPUs (AMD Zen 5) and at half of it on others (Intel Xeons whose AMX is not
// available), where the f32 kernels win. So without AMX the choice is measured once per process
// (bf16Compute), and RESNET_CPU_BF16 (auto, native or f32) overrides it.
#pragma once

#include <dnnl.hpp>
#include <string>

#include "../core/backend.h"

namespace rc::cpu {

class CpuContext;

// How this process computes bf16, decided once: natively in oneDNN's bf16 kernels, or in f32 on
// the bf16 values, and why (for BackendInfo, `doctor` and the CLI's warning).
struct Bf16Compute {
  bool native = false;
  std::string reason;
};

// The decision, in order: RESNET_CPU_BF16=f32 or native (native where oneDNN has no bf16 kernels
// is an error); no bf16 kernels: f32; AMX: native; otherwise native when oneDNN's bf16 1x1
// convolution takes at most 1.1x its f32 one, timed here (the margin pays for the conversions
// at the edges of each f32 primitive). Throws kInvalidArgument for another RESNET_CPU_BF16 value.
const Bf16Compute& bf16Compute(dnnl::engine& engine);

// bf16Compute(engine).native.
bool hasNativeBf16(dnnl::engine& engine);

// Whether oneDNN's int8 kernels sum u8 x s8 products in 32 bits on this CPU (VNNI or AMX). Without
// VNNI (AVX2, or AVX-512 before Cascade Lake) they add pairs of products in saturating 16-bit
// integers first (255 x 127 x 2 overflows), and halve the weights of layers with signed inputs to
// avoid it: INT8 results there are close to the quantized arithmetic, not equal to it.
bool hasInt8DotProducts();

// The oneDNN data type the plans compute `t` in: t's own, except bf16 on a CPU without bf16
// kernels, which computes in f32.
dnnl::memory::data_type computeType(dnnl::engine& engine, DType t);

// The buffer a primitive reads for `t`, described by `md` (plain, in t's element order): t's own
// memory when md has t's data type, else t widened to f32 in staging slot `slot` of the context.
void* stageInput(CpuContext& ctx, const Tensor& t, const dnnl::memory::desc& md, int slot);

// The buffer a primitive writes for `t`: t's own memory when md has t's data type, else staging
// slot `slot`, which finishOutput then rounds into t.
void* stageOutput(CpuContext& ctx, const Tensor& t, const dnnl::memory::desc& md, int slot);
void finishOutput(CpuContext& ctx, const Tensor& t, const dnnl::memory::desc& md, int slot);

}  // namespace rc::cpu
