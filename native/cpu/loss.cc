// Softmax cross-entropy with label smoothing, forward and gradient in one pass over the logits.
#include <cmath>
#include <vector>

#include "cpu_ops.h"

namespace rc::cpu {

namespace {

// sum_j q_j (logSumExp - z_j) with q = (1 - eps) onehot + eps / k, leaving out the terms whose
// weight is 0: as in PyTorch, a logit of -inf away from the label gives a finite loss without
// smoothing (not 0 * inf = NaN), and -inf at the label an infinite one.
double smoothedLoss(double logSumExp, double zLabel, double sumZ, double eps, double k) {
  const double hard = eps < 1.0 ? (1.0 - eps) * (logSumExp - zLabel) : 0.0;
  const double smooth = eps > 0.0 ? eps * logSumExp - eps / k * sumZ : 0.0;
  return hard + smooth;
}

}  // namespace

void crossEntropy(const CrossEntropyArgs& args) {
  const int64_t n = args.logits.dim(0), k = args.logits.dim(1);
  const int32_t* labels = args.labels.ptr<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    RC_CHECK_ARG(labels[i] >= 0 && labels[i] < k,
                 "cross entropy: label " << labels[i] << " at index " << i << " is outside [0, " << k << ")");
  }
  const double eps = args.labelSmoothing;
  std::vector<double> rowLoss(n);
  dispatchFloat(args.logits.dtype(), "cross entropy", [&](auto tag) {
    using T = decltype(tag);
    const T* logits = args.logits.ptr<T>();
    T* grad = args.dLogits.defined() ? args.dLogits.ptr<T>() : nullptr;
    const double gradScale = static_cast<double>(args.gradScale) / static_cast<double>(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const T* z = logits + i * k;
      double maxZ = -INFINITY;
      for (int64_t j = 0; j < k; ++j) maxZ = std::max(maxZ, static_cast<double>(toF(z[j])));
      double sumExp = 0.0, sumZ = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        const double v = toF(z[j]);
        sumExp += std::exp(v - maxZ);
        sumZ += v;
      }
      const double logSumExp = maxZ + std::log(sumExp);
      const double zLabel = toF(z[labels[i]]);
      rowLoss[i] = smoothedLoss(logSumExp, zLabel, sumZ, eps, static_cast<double>(k));
      if (grad) {
        T* g = grad + i * k;
        for (int64_t j = 0; j < k; ++j) {
          const double p = std::exp(static_cast<double>(toF(z[j])) - logSumExp);
          const double q = (j == labels[i] ? 1.0 - eps : 0.0) + eps / static_cast<double>(k);
          g[j] = fromF<T>(static_cast<float>((p - q) * gradScale));
        }
      }
    }
  });
  double total = 0.0;
  for (double v : rowLoss) total += v;
  args.loss.ptr<float>()[0] = static_cast<float>(total / static_cast<double>(n));
}

}  // namespace rc::cpu
