// Element-wise kernels: relu and its gradient, add, dtype casts, fill, lerp, and the input
// conversion (u8 NHWC -> normalised float with optional horizontal flip).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu_ops.h"
#include "isa.h"

namespace rc::cpu {

namespace {

constexpr int64_t kChunk = 1 << 14;
// Below this, zeroing stays on the calling thread (a parallel region costs more than it saves).
constexpr size_t kParallelZeroBytes = size_t{1} << 20;

template <typename T>
RC_ALWAYS_INLINE void reluImpl(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = toF(x[i]);
    y[i] = fromF<T>(reluValue(v));
  }
}
RC_ISA_DISPATCH(reluChunk, reluImpl, (const T* x, T* y, int64_t n), (x, y, n))

template <typename T>
RC_ALWAYS_INLINE void reluBackwardImpl(const T* y, const T* dy, T* dx, int64_t n) {
  const auto* dyWords = words(dy);
  auto* dxWords = words(dx);
  for (int64_t i = 0; i < n; ++i) dxWords[i] = reluGradWord(toF(y[i]), dyWords[i]);
}
RC_ISA_DISPATCH(reluBackwardChunk, reluBackwardImpl, (const T* y, const T* dy, T* dx, int64_t n), (y, dy, dx, n))

template <typename T>
RC_ALWAYS_INLINE void addImpl(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = fromF<T>(toF(a[i]) + toF(b[i]));
}
RC_ISA_DISPATCH(addChunk, addImpl, (const T* a, const T* b, T* out, int64_t n), (a, b, out, n))

// No restrict: out may be a or b (an in-place mask).
template <typename T>
RC_ALWAYS_INLINE void mulImpl(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = fromF<T>(toF(a[i]) * toF(b[i]));
}
RC_ISA_DISPATCH(mulChunk, mulImpl, (const T* a, const T* b, T* out, int64_t n), (a, b, out, n))

// PyTorch's two forms of lerp, chosen once per call by the weight, so that weight 1 gives b
// exactly.
template <typename T>
RC_ALWAYS_INLINE void lerpImpl(float* a, const float* b, int64_t n, float weight) {
  if (weight < 0.5f) {
    for (int64_t i = 0; i < n; ++i) a[i] = a[i] + weight * (b[i] - a[i]);
  } else {
    const float complement = 1.0f - weight;
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] - (b[i] - a[i]) * complement;
  }
}
RC_ISA_DISPATCH(lerpChunk, lerpImpl, (float* a, const float* b, int64_t n, float weight), (a, b, n, weight))

// Runs body(offset, count) over chunks of [0, n) in parallel.
template <typename Body>
void forChunks(int64_t n, Body body) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < chunks; ++i) body(i * kChunk, std::min(kChunk, n - i * kChunk));
}

}  // namespace

void relu(const Tensor& x, const Tensor& y) {
  dispatchFloat(x.dtype(), "relu", [&](auto tag) {
    using T = decltype(tag);
    const T* src = x.ptr<T>();
    T* dst = y.ptr<T>();
    forChunks(x.numel(), [&](int64_t at, int64_t count) { reluChunk<T>(src + at, dst + at, count); });
  });
}

void reluBackward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  dispatchFloat(y.dtype(), "relu backward", [&](auto tag) {
    using T = decltype(tag);
    const T* out = y.ptr<T>();
    const T* g = dy.ptr<T>();
    T* dst = dx.ptr<T>();
    forChunks(y.numel(), [&](int64_t at, int64_t count) { reluBackwardChunk<T>(out + at, g + at, dst + at, count); });
  });
}

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatchFloat(a.dtype(), "add", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.ptr<T>();
    const T* pb = b.ptr<T>();
    T* po = out.ptr<T>();
    forChunks(a.numel(), [&](int64_t at, int64_t count) { addChunk<T>(pa + at, pb + at, po + at, count); });
  });
}

void mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatchFloat(a.dtype(), "mul", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.ptr<T>();
    const T* pb = b.ptr<T>();
    T* po = out.ptr<T>();
    forChunks(a.numel(), [&](int64_t at, int64_t count) { mulChunk<T>(pa + at, pb + at, po + at, count); });
  });
}

void cast(const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype()) {
    std::memcpy(dst.data(), src.data(), src.nbytes());
    return;
  }
  dispatchFloat(src.dtype(), "cast", [&](auto srcTag) {
    dispatchFloat(dst.dtype(), "cast", [&](auto dstTag) {
      using S = decltype(srcTag);
      using D = decltype(dstTag);
      const S* s = src.ptr<S>();
      D* d = dst.ptr<D>();
      const int64_t n = src.numel();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) d[i] = fromF<D>(toF(s[i]));
    });
  });
}

void fill(const Tensor& t, double value) {
  const int64_t n = t.numel();
  if (value == 0.0) {
    // Large tensors (the gradient arena) in chunks on every thread: one thread's memset writes
    // about half the bandwidth of two.
    auto* bytes = static_cast<uint8_t*>(t.data());
    if (t.nbytes() < kParallelZeroBytes) std::memset(bytes, 0, t.nbytes());
    else
      forChunks(static_cast<int64_t>(t.nbytes()),
                [&](int64_t at, int64_t count) { std::memset(bytes + at, 0, static_cast<size_t>(count)); });
    return;
  }
  switch (t.dtype()) {
    case DType::I32: {
      int32_t* p = t.ptr<int32_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(value);
      return;
    }
    case DType::I64: {
      int64_t* p = t.ptr<int64_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int64_t>(value);
      return;
    }
    case DType::U8: {
      std::memset(t.data(), static_cast<int>(value) & 0xff, t.nbytes());
      return;
    }
    default:
      dispatchFloat(t.dtype(), "fill", [&](auto tag) {
        using T = decltype(tag);
        T* p = t.ptr<T>();
        const T v = fromF<T>(static_cast<float>(value));
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) p[i] = v;
      });
  }
}

void lerp(const LerpArgs& args) {
  float* a = args.a.ptr<float>();
  const float* b = args.b.ptr<float>();
  if (a == b) return;  // lerp of a tensor with itself leaves it as it is
  forChunks(args.a.numel(), [&](int64_t at, int64_t count) { lerpChunk<float>(a + at, b + at, count, args.weight); });
}

void convertInput(const ConvertInputArgs& args) {
  const int64_t n = args.src.dim(0), h = args.src.dim(1), w = args.src.dim(2), c = args.src.dim(3);
  std::vector<float> scale(c), shift(c);
  for (int64_t k = 0; k < c; ++k) {
    scale[k] = 1.0f / (255.0f * args.std[k]);
    shift[k] = -args.mean[k] / args.std[k];
  }
  const uint8_t* flip = args.flip.defined() ? args.flip.ptr<uint8_t>() : nullptr;
  dispatchFloat(args.dst.dtype(), "convert input", [&](auto tag) {
    using T = decltype(tag);
    const uint8_t* src = args.src.ptr<uint8_t>();
    T* dst = args.dst.ptr<T>();
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t y = 0; y < h; ++y) {
        const bool mirrored = flip && flip[i];
        const uint8_t* srcRow = src + ((i * h + y) * w) * c;
        T* dstRow = dst + ((i * h + y) * w) * c;
        for (int64_t x = 0; x < w; ++x) {
          const uint8_t* px = srcRow + (mirrored ? w - 1 - x : x) * c;
          for (int64_t k = 0; k < c; ++k) dstRow[x * c + k] = fromF<T>(px[k] * scale[k] + shift[k]);
        }
      }
    }
  });
}

}  // namespace rc::cpu
