// Quantization-aware training: fake quantization and its straight-through gradient, the symmetric
// abs-max scales of the weights and the moving-average min/max observer of the activations.
// The scales are read from tensors, as on CUDA, where they never leave the device.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "cpu_ops.h"

namespace rc::cpu {

namespace {

constexpr int64_t kChunk = 1 << 14;

// Elements of x that share one scale: all of them (per tensor) or one dim-0 slice (per channel).
int64_t scaleGroup(const Tensor& x, const Tensor& scale) {
  return scale.numel() == 1 ? x.numel() : x.numel() / x.dim(0);
}

// rint rounds half to even in the default rounding mode, as PyTorch's nearbyint and ONNX's QuantizeLinear.
inline float quantLevel(float v, float s) { return std::nearbyint(v / s); }

// Runs body(offset, count) over [0, n) in chunks that never straddle a scale group, in parallel.
template <typename Body>
void forGroups(int64_t n, int64_t group, Body body) {
  const int64_t perGroup = (group + kChunk - 1) / kChunk;
  const int64_t chunks = (n / group) * perGroup;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t g = i / perGroup, part = i % perGroup;
    const int64_t at = g * group + part * kChunk;
    body(g, at, std::min(kChunk, (g + 1) * group - at));
  }
}

}  // namespace

void fakeQuantize(const FakeQuantizeArgs& a) {
  const float* scales = a.scale.ptr<float>();
  const float lo = static_cast<float>(a.qmin), hi = static_cast<float>(a.qmax);
  dispatchFloat(a.x.dtype(), "fake quantize", [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<T>();
    T* y = a.y.ptr<T>();
    forGroups(a.x.numel(), scaleGroup(a.x, a.scale), [&](int64_t g, int64_t at, int64_t count) {
      const float s = scales[a.scale.numel() == 1 ? 0 : g];
      for (int64_t i = at; i < at + count; ++i) {
        y[i] = fromF<T>(std::min(std::max(quantLevel(toF(x[i]), s), lo), hi) * s);
      }
    });
  });
}

void fakeQuantizeBackward(const FakeQuantizeBackwardArgs& a) {
  const float* scales = a.scale.ptr<float>();
  const float lo = static_cast<float>(a.qmin), hi = static_cast<float>(a.qmax);
  dispatchFloat(a.x.dtype(), "fake quantize backward", [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<T>();
    const T* dy = a.dy.ptr<T>();
    T* dx = a.dx.ptr<T>();
    forGroups(a.x.numel(), scaleGroup(a.x, a.scale), [&](int64_t g, int64_t at, int64_t count) {
      const float s = scales[a.scale.numel() == 1 ? 0 : g];
      for (int64_t i = at; i < at + count; ++i) {
        const float q = quantLevel(toF(x[i]), s);
        dx[i] = q >= lo && q <= hi ? dy[i] : fromF<T>(0.0f);
      }
    });
  });
}

void absMaxScale(const AbsMaxScaleArgs& a) {
  const int64_t groups = a.scale.numel();
  const int64_t group = a.x.numel() / groups;
  float* scale = a.scale.ptr<float>();
  dispatchFloat(a.x.dtype(), "abs max scale", [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<T>();
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      float m = 0.0f;
      for (int64_t i = g * group; i < (g + 1) * group; ++i) m = std::max(m, std::fabs(toF(x[i])));
      scale[g] = std::max(m / a.qmax, FLT_EPSILON);
    }
  });
}

void observeMinMax(const ObserveMinMaxArgs& a) {
  const int64_t n = a.x.numel();
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  dispatchFloat(a.x.dtype(), "observe min max", [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<T>();
#pragma omp parallel for schedule(static) reduction(min : lo) reduction(max : hi)
    for (int64_t i = 0; i < n; ++i) {
      const float v = toF(x[i]);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  });
  float* state = a.minMax.ptr<float>();
  if (std::isinf(state[0]) && state[0] > 0 && std::isinf(state[1]) && state[1] < 0) {
    state[0] = lo;
    state[1] = hi;
  } else {
    state[0] += a.averagingConstant * (lo - state[0]);
    state[1] += a.averagingConstant * (hi - state[1]);
  }
  const float range = std::max(std::max(-state[0], state[1]), 0.0f);
  a.scale.ptr<float>()[0] = std::max(range / a.qmax, FLT_EPSILON);
}

}  // namespace rc::cpu
