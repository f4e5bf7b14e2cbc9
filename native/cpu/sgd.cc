// SGD with momentum, dampening, Nesterov and weight decay (PyTorch's torch.optim.SGD), as one
// pass over the arena segments; skipped when the GradScaler found inf/NaN.
#include "cpu_ops.h"

namespace rc::cpu {

void sgdStep(const SgdArgs& args) {
  if (args.foundInf.defined() && args.foundInf.ptr<float>()[0] != 0.0f) return;
  float* params = args.params.ptr<float>();
  const float* grads = args.grads.ptr<float>();
  float* buf = args.momentumBuffer.defined() ? args.momentumBuffer.ptr<float>() : nullptr;
  const float inv = args.gradScaleInv;
  for (const ArenaSegment& seg : args.segments) {
    const SgdGroup& g = args.groups[seg.group];
    const int64_t begin = seg.offset, end = seg.offset + seg.count;
    const bool useMomentum = g.momentum != 0.0f;
    const bool first = args.firstStep;
#pragma omp parallel for schedule(static)
    for (int64_t i = begin; i < end; ++i) {
      float d = grads[i] * inv + g.weightDecay * params[i];
      if (useMomentum) {
        const float b = first ? d : g.momentum * buf[i] + (1.0f - g.dampening) * d;
        buf[i] = b;
        d = g.nesterov ? d + g.momentum * b : b;
      }
      params[i] -= g.lr * d;
    }
  }
}

}  // namespace rc::cpu
