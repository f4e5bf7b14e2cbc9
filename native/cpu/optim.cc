// AdamW and LAMB steps, the gradient norm, GradScaler's unscale-and-check and scale update, and
// gradient clipping, over segments of the flat f32 arenas (PyTorch's semantics; see backend.h).
// Work is cut into chunks of at most kArenaChunk elements of one segment, spread over OpenMP threads;
// reductions leave one partial per chunk and add the partials in chunk order, so results do not
// depend on the number of threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../core/adam_coeffs.h"
#include "arena_chunks.h"
#include "cpu_ops.h"
#include "isa.h"

namespace rc::cpu {

namespace {

// The segments an op without groups works on: the ones given, else the whole tensor.
std::vector<ArenaSegment> segmentsOrAll(const std::vector<ArenaSegment>& segments, const Tensor& t) {
  if (!segments.empty()) return segments;
  return {ArenaSegment{0, t.numel(), 0}};
}

bool skipped(const Tensor& foundInf) { return foundInf.defined() && foundInf.ptr<float>()[0] != 0.0f; }

// 1 when x is inf or NaN (all exponent bits set), as an integer so that OR-ing it over a loop
// vectorises.
RC_ALWAYS_INLINE uint32_t nonFinite(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return (bits & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
}

// Reductions keep kLanes double partial sums, lane j taking elements j, j + kLanes, ...: the loop
// vectorises without reassociating any sum, and the result does not depend on the ISA.
constexpr int kLanes = 8;

RC_ALWAYS_INLINE double sumLanes(const double (&lanes)[kLanes]) {
  double sum = 0.0;
  for (int j = 0; j < kLanes; ++j) sum += lanes[j];
  return sum;
}

template <typename T>
RC_ALWAYS_INLINE void adamwImpl(float* __restrict p, const float* __restrict g, float* __restrict m,
                                float* __restrict v, int64_t n, const AdamCoeffs& c, float inv) {
  for (int64_t i = 0; i < n; ++i) {
    const float grad = g[i] * inv;
    const float param = p[i] * c.decay;
    const float mi = c.beta1 * m[i] + c.oneMinusBeta1 * grad;
    const float vi = c.beta2 * v[i] + c.oneMinusBeta2 * grad * grad;
    m[i] = mi;
    v[i] = vi;
    p[i] = param - c.stepSize * (mi / (std::sqrt(vi) / c.bc2Sqrt + c.eps));
  }
}
RC_ISA_DISPATCH(adamwChunk, adamwImpl,
                (float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v, int64_t n,
                 const AdamCoeffs& c, float inv),
                (p, g, m, v, n, c, inv))

// LAMB's direction u = mhat / (sqrt(vhat) + eps) + wd * p, the same f32 operations in both passes.
RC_ALWAYS_INLINE float lambDirection(float m, float v, float p, const AdamCoeffs& c) {
  return (m / c.bc1) / (std::sqrt(v) / c.bc2Sqrt + c.eps) + c.weightDecay * p;
}

RC_ALWAYS_INLINE void lambMomentsOne(const float* __restrict p, const float* __restrict g, float* __restrict m,
                                     float* __restrict v, int64_t i, const AdamCoeffs& c, float inv, double& pp,
                                     double& uu) {
  const float grad = g[i] * inv;
  const float mi = c.beta1 * m[i] + c.oneMinusBeta1 * grad;
  const float vi = c.beta2 * v[i] + c.oneMinusBeta2 * grad * grad;
  m[i] = mi;
  v[i] = vi;
  const float u = lambDirection(mi, vi, p[i], c);
  pp += static_cast<double>(p[i]) * p[i];
  uu += static_cast<double>(u) * u;
}

// LAMB's first pass: moments, and the chunk's sums of p^2 and u^2 into sums[0] and sums[1].
template <typename T>
RC_ALWAYS_INLINE void lambMomentsImpl(const float* __restrict p, const float* __restrict g, float* __restrict m,
                                      float* __restrict v, int64_t n, const AdamCoeffs& c, float inv, double* sums) {
  double pp[kLanes] = {}, uu[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lambMomentsOne(p, g, m, v, i + j, c, inv, pp[j], uu[j]);
  }
  for (int j = 0; i < n; ++i, ++j) lambMomentsOne(p, g, m, v, i, c, inv, pp[j], uu[j]);
  sums[0] = sumLanes(pp);
  sums[1] = sumLanes(uu);
}
RC_ISA_DISPATCH(lambMomentsChunk, lambMomentsImpl,
                (const float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                 int64_t n, const AdamCoeffs& c, float inv, double* sums),
                (p, g, m, v, n, c, inv, sums))

// LAMB's second pass: u again from the stored moments, then p -= lr * ratio * u.
template <typename T>
RC_ALWAYS_INLINE void lambUpdateImpl(float* __restrict p, const float* __restrict m, const float* __restrict v,
                                     int64_t n, const AdamCoeffs& c, float ratio) {
  for (int64_t i = 0; i < n; ++i) p[i] = p[i] - c.lr * (lambDirection(m[i], v[i], p[i], c) * ratio);
}
RC_ISA_DISPATCH(lambUpdateChunk, lambUpdateImpl,
                (float* __restrict p, const float* __restrict m, const float* __restrict v, int64_t n,
                 const AdamCoeffs& c, float ratio),
                (p, m, v, n, c, ratio))

// Sum of squares, and whether an element is inf or NaN (*bad != 0).
template <typename T>
RC_ALWAYS_INLINE void sumSquaresImpl(const float* __restrict g, int64_t n, double* sum, uint32_t* bad) {
  double lanes[kLanes] = {};
  uint32_t flags = 0;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float x = g[i + j];
      lanes[j] += static_cast<double>(x) * x;
      flags |= nonFinite(x);
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    lanes[j] += static_cast<double>(g[i]) * g[i];
    flags |= nonFinite(g[i]);
  }
  *sum = sumLanes(lanes);
  *bad = flags;
}
RC_ISA_DISPATCH(sumSquaresChunk, sumSquaresImpl, (const float* __restrict g, int64_t n, double* sum, uint32_t* bad),
                (g, n, sum, bad))

// grads *= invScale; *bad != 0 when an element was inf or NaN.
template <typename T>
RC_ALWAYS_INLINE void unscaleImpl(float* __restrict g, int64_t n, float invScale, uint32_t* bad) {
  uint32_t flags = 0;
  for (int64_t i = 0; i < n; ++i) {
    flags |= nonFinite(g[i]);
    g[i] *= invScale;
  }
  *bad = flags;
}
RC_ISA_DISPATCH(unscaleChunk, unscaleImpl, (float* __restrict g, int64_t n, float invScale, uint32_t* bad),
                (g, n, invScale, bad))

template <typename T>
RC_ALWAYS_INLINE void scaleImpl(float* __restrict g, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i) g[i] *= factor;
}
RC_ISA_DISPATCH(scaleChunk, scaleImpl, (float* __restrict g, int64_t n, float factor), (g, n, factor))

// Chunk-ordered sum of squares over `segments` of `grads`; `bad` says whether an element was not
// finite.
double sumSquares(const float* grads, const std::vector<ArenaSegment>& segments, bool* bad) {
  const std::vector<ArenaChunk> chunks = arenaChunks(segments);
  const int64_t count = static_cast<int64_t>(chunks.size());
  std::vector<double> partial(chunks.size());
  std::vector<uint32_t> nonfinite(chunks.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    sumSquaresChunk<float>(grads + chunks[i].begin, chunks[i].end - chunks[i].begin, &partial[i], &nonfinite[i]);
  }
  double sum = 0.0;
  bool any = false;
  for (int64_t i = 0; i < count; ++i) {
    sum += partial[i];
    any = any || nonfinite[i] != 0;
  }
  *bad = any;
  return sum;
}

// Every group's coefficients for this step.
std::vector<AdamCoeffs> coefficientsOf(const AdamWArgs& args) {
  std::vector<AdamCoeffs> groups;
  for (const AdamGroup& g : args.groups) groups.push_back(adamCoeffs(g, args.step));
  return groups;
}

}  // namespace

void adamwStep(const AdamWArgs& args) {
  if (skipped(args.foundInf)) return;
  const std::vector<AdamCoeffs> groups = coefficientsOf(args);
  const std::vector<ArenaChunk> chunks = arenaChunks(args.segments);
  const int64_t count = static_cast<int64_t>(chunks.size());
  float* p = args.params.ptr<float>();
  const float* g = args.grads.ptr<float>();
  float* m = args.expAvg.ptr<float>();
  float* v = args.expAvgSq.ptr<float>();
  const float inv = args.gradScaleInv;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const ArenaChunk& c = chunks[i];
    adamwChunk<float>(p + c.begin, g + c.begin, m + c.begin, v + c.begin, c.end - c.begin,
                      groups[args.segments[c.segment].group], inv);
  }
}

void lambStep(const LambArgs& args) {
  if (skipped(args.foundInf)) return;
  const std::vector<AdamCoeffs> groups = coefficientsOf(args);
  const std::vector<ArenaChunk> chunks = arenaChunks(args.segments);
  const int64_t count = static_cast<int64_t>(chunks.size());
  float* p = args.params.ptr<float>();
  const float* g = args.grads.ptr<float>();
  float* m = args.expAvg.ptr<float>();
  float* v = args.expAvgSq.ptr<float>();
  const float inv = args.gradScaleInv;
  std::vector<double> sums(2 * chunks.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const ArenaChunk& c = chunks[i];
    lambMomentsChunk<float>(p + c.begin, g + c.begin, m + c.begin, v + c.begin, c.end - c.begin,
                            groups[args.segments[c.segment].group], inv, &sums[2 * i]);
  }
  // Per segment, in chunk order: ||p||^2 and ||u||^2, then the trust ratio.
  std::vector<double> pp(args.segments.size(), 0.0), uu(args.segments.size(), 0.0);
  for (int64_t i = 0; i < count; ++i) {
    pp[chunks[i].segment] += sums[2 * i];
    uu[chunks[i].segment] += sums[2 * i + 1];
  }
  std::vector<float> ratio(args.segments.size(), 1.0f);
  for (size_t s = 0; s < args.segments.size(); ++s) {
    if (groups[args.segments[s].group].adapt && pp[s] > 0.0 && uu[s] > 0.0) {
      ratio[s] = static_cast<float>(std::sqrt(pp[s]) / std::sqrt(uu[s]));
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const ArenaChunk& c = chunks[i];
    lambUpdateChunk<float>(p + c.begin, m + c.begin, v + c.begin, c.end - c.begin,
                           groups[args.segments[c.segment].group], ratio[c.segment]);
  }
}

void gradNorm(const GradNormArgs& args) {
  bool bad = false;
  const double sum = sumSquares(args.grads.ptr<float>(), segmentsOrAll(args.segments, args.grads), &bad);
  args.out.ptr<float>()[0] = static_cast<float>(std::sqrt(sum));
  if (bad && args.foundInf.defined()) args.foundInf.ptr<float>()[0] = 1.0f;
}

void unscaleAndCheck(const UnscaleArgs& args) {
  const std::vector<ArenaChunk> chunks = arenaChunks(segmentsOrAll(args.segments, args.grads));
  const int64_t count = static_cast<int64_t>(chunks.size());
  float* g = args.grads.ptr<float>();
  bool any = false;
#pragma omp parallel for schedule(static) reduction(|| : any)
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bad = 0;
    unscaleChunk<float>(g + chunks[i].begin, chunks[i].end - chunks[i].begin, args.invScale, &bad);
    any = any || bad != 0;
  }
  if (any) args.foundInf.ptr<float>()[0] = 1.0f;
}

void clipGradNorm(const ClipGradNormArgs& args) {
  const float coef = args.maxNorm / (args.norm.ptr<float>()[0] + 1e-6f);
  // min(1, coef) that keeps a NaN coefficient (NaN norm) as NaN, as torch.clamp does.
  const float factor = coef > 1.0f ? 1.0f : coef;
  if (factor == 1.0f) return;  // x * 1 == x: nothing to write
  const std::vector<ArenaChunk> chunks = arenaChunks(segmentsOrAll(args.segments, args.grads));
  const int64_t count = static_cast<int64_t>(chunks.size());
  float* g = args.grads.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) scaleChunk<float>(g + chunks[i].begin, chunks[i].end - chunks[i].begin, factor);
}

void scalerUpdate(const ScalerUpdateArgs& args) {
  float& scale = args.scale.ptr<float>()[0];
  int32_t& tracker = args.growthTracker.ptr<int32_t>()[0];
  if (args.foundInf.ptr<float>()[0] != 0.0f) {
    scale *= args.backoffFactor;
    tracker = 0;
    return;
  }
  const int64_t successful = static_cast<int64_t>(tracker) + 1;
  if (successful >= args.growthInterval) {
    const float grown = scale * args.growthFactor;
    if (std::isfinite(grown)) scale = grown;  // never grow past the f32 range to inf
    tracker = 0;
  } else {
    tracker = static_cast<int32_t>(successful);
  }
}

}  // namespace rc::cpu
