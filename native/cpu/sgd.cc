// SGD with momentum, dampening, Nesterov and weight decay (PyTorch's torch.optim.SGD), as one
// parallel pass over the chunks of all arena segments; skipped when the GradScaler found inf/NaN.
// The hyperparameters are copied into a local struct and the loops are split by case, so that
// the compiler vectorises them (read through the argument structs, a float could alias the
// arrays written, and each element would reload them). Baseline x86-64 code only: the pass is
// bound by memory, and without FMA contraction every element is rounded as before and as PyTorch
// rounds it (separate multiply and add), whatever the CPU.
#include "arena_chunks.h"
#include "cpu_ops.h"

namespace rc::cpu {

namespace {

struct SgdCoeffs {
  float lr, momentum, dampeningComplement, weightDecay, gradScaleInv;
  bool nesterov;
};

// Without momentum: p -= lr * (g * inv + wd * p).
void sgdPlainChunk(float* __restrict p, const float* __restrict g, int64_t n, SgdCoeffs c) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = g[i] * c.gradScaleInv + c.weightDecay * p[i];
    p[i] -= c.lr * d;
  }
}

// With momentum: b = d on the first step, else momentum * b + (1 - dampening) * d; the step is
// d + momentum * b with Nesterov, else b.
void sgdMomentumChunk(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n, SgdCoeffs c,
                      bool first) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = g[i] * c.gradScaleInv + c.weightDecay * p[i];
    const float b = first ? d : c.momentum * buf[i] + c.dampeningComplement * d;
    buf[i] = b;
    p[i] -= c.lr * (c.nesterov ? d + c.momentum * b : b);
  }
}

}  // namespace

void sgdStep(const SgdArgs& args) {
  if (args.foundInf.defined() && args.foundInf.ptr<float>()[0] != 0.0f) return;
  float* params = args.params.ptr<float>();
  const float* grads = args.grads.ptr<float>();
  float* buf = args.momentumBuffer.defined() ? args.momentumBuffer.ptr<float>() : nullptr;
  std::vector<SgdCoeffs> coeffs;
  coeffs.reserve(args.groups.size());
  for (const SgdGroup& g : args.groups) {
    coeffs.push_back({g.lr, g.momentum, 1.0f - g.dampening, g.weightDecay, args.gradScaleInv, g.nesterov});
  }
  const std::vector<ArenaChunk> chunks = arenaChunks(args.segments);
  const int64_t count = static_cast<int64_t>(chunks.size());
  const bool first = args.firstStep;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const ArenaChunk& ch = chunks[i];
    const SgdCoeffs& c = coeffs[args.segments[ch.segment].group];
    const int64_t n = ch.end - ch.begin;
    if (c.momentum != 0.0f) {
      sgdMomentumChunk(params + ch.begin, grads + ch.begin, buf + ch.begin, n, c, first);
    } else {
      sgdPlainChunk(params + ch.begin, grads + ch.begin, n, c);
    }
  }
}

}  // namespace rc::cpu
