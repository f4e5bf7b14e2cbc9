// Softmax cross-entropy with label smoothing, and knowledge distillation's loss (the temperature-
// softened KL divergence to a teacher mixed with that cross-entropy): forward and gradient in one
// pass over the logits.
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

// log(sum_j exp(scale * z_j)), shifted by the maximum; -inf for a row of -inf.
template <typename T>
double logSumExp(const T* z, int64_t k, double scale) {
  double maxV = -INFINITY;
  for (int64_t j = 0; j < k; ++j) maxV = std::max(maxV, scale * static_cast<double>(toF(z[j])));
  if (maxV == -INFINITY) return maxV;
  double sum = 0.0;
  for (int64_t j = 0; j < k; ++j) sum += std::exp(scale * static_cast<double>(toF(z[j])) - maxV);
  return maxV + std::log(sum);
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

void distillationLoss(const DistillationArgs& args) {
  const int64_t n = args.logits.dim(0), k = args.logits.dim(1);
  const int32_t* labels = args.labels.ptr<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    RC_CHECK_ARG(labels[i] >= 0 && labels[i] < k,
                 "distillation loss: label " << labels[i] << " at index " << i << " is outside [0, " << k << ")");
  }
  const double eps = args.labelSmoothing, alpha = args.alpha, temp = args.temperature, inv = 1.0 / temp;
  const double kd = static_cast<double>(k);
  std::vector<double> rowLoss(n);
  dispatchFloat(args.logits.dtype(), "distillation loss", [&](auto tag) {
    using T = decltype(tag);
    const T* student = args.logits.ptr<T>();
    const T* teacher = args.teacherLogits.ptr<T>();
    T* grad = args.dLogits.defined() ? args.dLogits.ptr<T>() : nullptr;
    const double gradScale = static_cast<double>(args.gradScale) / static_cast<double>(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const T* s = student + i * k;
      const T* t = teacher + i * k;
      const double lseS = logSumExp(s, k, 1.0);     // plain softmax, for the cross-entropy
      const double lseSoft = logSumExp(s, k, inv);  // softened student
      const double lseTeacher = logSumExp(t, k, inv);
      double kl = 0.0, sumZ = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        const double sj = toF(s[j]);
        const double logPt = inv * static_cast<double>(toF(t[j])) - lseTeacher;
        const double pt = std::exp(logPt);
        // A class the teacher gives probability 0 adds nothing (torch's xlogy), even where the
        // student's log-probability is -inf.
        if (pt != 0.0) kl += pt * (logPt - (inv * sj - lseSoft));
        sumZ += sj;
      }
      const double ce = smoothedLoss(lseS, toF(s[labels[i]]), sumZ, eps, kd);
      // Terms of weight 0 are left out, so that alpha = 0 gives the plain cross-entropy exactly and
      // alpha = 1 ignores the labels.
      rowLoss[i] = (alpha > 0.0 ? alpha * temp * temp * kl : 0.0) + (alpha < 1.0 ? (1.0 - alpha) * ce : 0.0);
      if (grad) {
        T* g = grad + i * k;
        for (int64_t j = 0; j < k; ++j) {
          const double sj = toF(s[j]);
          const double ps = std::exp(inv * sj - lseSoft);
          const double pt = std::exp(inv * static_cast<double>(toF(t[j])) - lseTeacher);
          const double p = std::exp(sj - lseS);
          const double q = (j == labels[i] ? 1.0 - eps : 0.0) + eps / kd;
          const double d = alpha * temp * (ps - pt) + (1.0 - alpha) * (p - q);
          g[j] = fromF<T>(static_cast<float>(d * gradScale));
        }
      }
    }
  });
  double total = 0.0;
  for (double v : rowLoss) total += v;
  args.loss.ptr<float>()[0] = static_cast<float>(total / static_cast<double>(n));
}

}  // namespace rc::cpu
