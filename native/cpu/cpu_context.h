// The CPU backend's shared state: the oneDNN engine and stream, a growable scratchpad shared by
// all plans (ops run one at a time on the host), and helpers for element access by dtype.
#pragma once

#include <dnnl.hpp>

#include <map>
#include <memory>
#include <string>

#include "../core/backend.h"
#include "../core/error.h"

namespace rc::cpu {

class CpuContext {
 public:
  CpuContext();
  dnnl::engine& engine() { return engine_; }
  dnnl::stream& stream() { return stream_; }
  Allocator& allocator() { return *allocator_; }
  // A scratch buffer of at least `bytes`, valid until the next call.
  void* scratch(size_t bytes);
  // An f32 tensor of `shape` in staging slot 0 or 1 (compute_type.h's copies at a primitive's
  // edges), valid until the next call with the same slot.
  Tensor staging(int slot, const Shape& shape);
  // At least `bytes` in layout slot 0 or 1 (a primitive's input copied into the layout it reads
  // fastest, weighted_passes.h), valid until the next call with the same slot.
  void* layoutCopy(int slot, size_t bytes);
  // A tensor of `shape` and `dtype` for the pixels a strided 1x1 convolution reads, or their
  // gradient (conv.cc), valid until the next call.
  Tensor strideCopy(const Shape& shape, DType dtype);
  // A tensor of `shape` and `dtype` for an input gradient computed apart and then added into
  // another (conv.cc's backwardDataAccumulate), valid until the next call.
  Tensor addend(const Shape& shape, DType dtype);
  Tensor allocate(const Shape& shape, DType dtype);
  Tensor allocateBytes(size_t bytes);

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::unique_ptr<CachingAllocator> allocator_;
  // `buffer`, replaced by a larger one when it holds fewer than `bytes`.
  const Tensor& grown(Tensor& buffer, size_t bytes);
  // `buffer`, grown to hold `shape` of `dtype`, viewed as such.
  Tensor grownAs(Tensor& buffer, const Shape& shape, DType dtype);

  Tensor scratch_;
  Tensor staging_[2];
  Tensor layoutCopies_[2];
  Tensor strideCopy_;
  Tensor addend_;
};

dnnl::memory::data_type toDnnl(DType t);
std::string isaName();

// Reorders plain weights (f32 masters, or already in the compute type) into the layout a primitive
// prefers, keeping one reorder primitive per source type.
class WeightReorder {
 public:
  WeightReorder(CpuContext& ctx, dnnl::memory::dims dims, dnnl::memory::format_tag plainTag, dnnl::memory::desc target)
      : ctx_(&ctx), dims_(std::move(dims)), plainTag_(plainTag), target_(std::move(target)) {}
  // The weights as the primitive reads them: `weight`'s own data where it is already in the
  // target's layout and type, else its reorder into `buffer`.
  void* laidOut(const Tensor& weight, const Tensor& buffer);

 private:
  CpuContext* ctx_;
  dnnl::memory::dims dims_;
  dnnl::memory::format_tag plainTag_;
  dnnl::memory::desc target_;
  std::map<DType, dnnl::reorder> reorders_;
};

// A reorder from a primitive's f32 weight-gradient layout to the plain f32 gradient that adds (+=)
// instead of overwriting, so parameter gradients accumulate as in PyTorch.
dnnl::reorder accumulatingReorder(CpuContext& ctx, const dnnl::memory::desc& from, const dnnl::memory::desc& to);

// Runs `body`, turning oneDNN exceptions into rc::Error naming the op and its shapes.
template <typename F>
auto dnnlGuard(const std::string& what, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const dnnl::error& e) {
    RC_THROW(code::kOneDnn, "oneDNN failed in " << what << ": " << e.what() << " (status " << e.status << ")");
  }
}

// Element access by storage type, used by the element-wise kernels.
struct Bf16 {
  uint16_t bits;
};
struct Half {
  uint16_t bits;
};
inline __attribute__((always_inline)) float toF(float v) { return v; }
inline __attribute__((always_inline)) float toF(Bf16 v) { return bf16ToFloat(v.bits); }
inline float toF(Half v) { return halfToFloat(v.bits); }
template <typename T>
inline T fromF(float v);
template <>
inline __attribute__((always_inline)) float fromF<float>(float v) {
  return v;
}
template <>
inline __attribute__((always_inline)) Bf16 fromF<Bf16>(float v) {
  return Bf16{floatToBf16(v)};
}
template <>
inline Half fromF<Half>(float v) {
  return Half{floatToHalf(v)};
}

// max(v, 0) that keeps NaN (torch.relu(nan) is nan): written so that a NaN fails the comparison.
inline __attribute__((always_inline)) float reluValue(float v) { return v < 0.0f ? 0.0f : v; }

// The ReLU's gradient from its output, as torch's threshold_backward: zero where out <= 0, the
// incoming gradient elsewhere, a NaN output included.
inline __attribute__((always_inline)) float reluGrad(float out, float g) { return out <= 0.0f ? 0.0f : g; }

// The storage word of an element type: the float itself, or a 16-bit type's bits (Bf16 and Half
// are standard-layout structs of one uint16_t, so a pointer to one is a pointer to its bits).
// Kernels that move values without arithmetic work on words: no round trip through f32 (bits
// kept exactly), and the compiler vectorises a select between words where it leaves a select
// between two structs as a branch per element.
template <typename T>
struct StorageWord {
  using type = uint16_t;
};
template <>
struct StorageWord<float> {
  using type = float;
};
template <typename T>
inline typename StorageWord<T>::type* words(T* p) {
  return reinterpret_cast<typename StorageWord<T>::type*>(p);
}
template <typename T>
inline const typename StorageWord<T>::type* words(const T* p) {
  return reinterpret_cast<const typename StorageWord<T>::type*>(p);
}

// reluGrad on a storage word: the incoming gradient's word where out > 0 (or NaN), zero elsewhere.
template <typename W>
inline __attribute__((always_inline)) W reluGradWord(float out, W g) {
  return out <= 0.0f ? W{0} : g;
}

// Calls body.template operator()<T>() with T the storage type of a floating dtype.
template <typename Body>
void dispatchFloat(DType dtype, const char* op, Body&& body) {
  switch (dtype) {
    case DType::F32: body(float{}); return;
    case DType::BF16: body(Bf16{}); return;
    case DType::F16: body(Half{}); return;
    default: RC_THROW(code::kInvalidArgument, op << ": unsupported dtype " << dtypeName(dtype));
  }
}

// The oneDNN plans compute in f32 or bf16 on the CPU (f16 tensors are storage only there).
inline void checkCpuComputeType(DType t, const char* op) {
  RC_CHECK_ARG(t == DType::F32 || t == DType::BF16, op << ": the CPU backend computes in f32 or bf16, got "
                                                       << dtypeName(t) << " (use bf16 for mixed precision on the CPU)");
}

// Padding on the far side that makes oneDNN produce PyTorch's floor-mode output size.
inline int64_t farPadding(int64_t in, int64_t out, int64_t kernelExtent, int64_t stride, int64_t padNear) {
  const int64_t pad = (out - 1) * stride + kernelExtent - in - padNear;
  return pad < 0 ? 0 : pad;
}

}  // namespace rc::cpu
