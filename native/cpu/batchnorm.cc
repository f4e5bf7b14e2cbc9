// Batch normalisation over NHWC rows with fused residual add and ReLU. Statistics are accumulated
// in double per thread, so one pass over x gives mean and variance without cancellation trouble.
#include <omp.h>

#include <cmath>
#include <vector>

#include "cpu_ops.h"

namespace rc::cpu {

namespace {

// Per-channel sums over rows [0, rows) of `body(row, c, sumsA, sumsB)`, reduced over threads.
template <typename Body>
void channelSums(int64_t rows, int64_t channels, std::vector<double>& a, std::vector<double>& b, Body body) {
  const int threads = omp_get_max_threads();
  std::vector<double> partial(static_cast<size_t>(threads) * 2 * channels, 0.0);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    double* pa = partial.data() + static_cast<size_t>(t) * 2 * channels;
    double* pb = pa + channels;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) body(r, pa, pb);
  }
  a.assign(channels, 0.0);
  b.assign(channels, 0.0);
  for (int t = 0; t < threads; ++t) {
    const double* pa = partial.data() + static_cast<size_t>(t) * 2 * channels;
    for (int64_t c = 0; c < channels; ++c) {
      a[c] += pa[c];
      b[c] += pa[channels + c];
    }
  }
}

template <typename T>
void forwardTyped(const BatchNormForwardArgs& args) {
  const int64_t channels = args.x.dim(args.x.rank() - 1);
  const int64_t rows = args.x.numel() / channels;
  const T* x = args.x.ptr<T>();
  T* y = args.y.ptr<T>();
  const T* res = args.residual.defined() ? args.residual.ptr<T>() : nullptr;
  const float* gamma = args.gamma.ptr<float>();
  const float* beta = args.beta.ptr<float>();
  float* runMean = args.runningMean.ptr<float>();
  float* runVar = args.runningVar.ptr<float>();
  std::vector<float> scale(channels), shift(channels);

  if (args.training) {
    std::vector<double> sum, sumSq;
    channelSums(rows, channels, sum, sumSq, [&](int64_t r, double* s, double* s2) {
      const T* row = x + r * channels;
      for (int64_t c = 0; c < channels; ++c) {
        const double v = toF(row[c]);
        s[c] += v;
        s2[c] += v * v;
      }
    });
    float* saveMean = args.saveMean.ptr<float>();
    float* saveInvStd = args.saveInvStd.ptr<float>();
    const double m = static_cast<double>(rows);
    for (int64_t c = 0; c < channels; ++c) {
      const double mean = sum[c] / m;
      const double var = std::max(sumSq[c] / m - mean * mean, 0.0);
      const double invStd = 1.0 / std::sqrt(var + args.eps);
      saveMean[c] = static_cast<float>(mean);
      saveInvStd[c] = static_cast<float>(invStd);
      scale[c] = static_cast<float>(gamma[c] * invStd);
      shift[c] = static_cast<float>(beta[c] - mean * gamma[c] * invStd);
      runMean[c] = static_cast<float>((1.0 - args.momentum) * runMean[c] + args.momentum * mean);
      runVar[c] = static_cast<float>((1.0 - args.momentum) * runVar[c] + args.momentum * var * m / (m - 1.0));
    }
  } else {
    for (int64_t c = 0; c < channels; ++c) {
      const double invStd = 1.0 / std::sqrt(static_cast<double>(runVar[c]) + args.eps);
      scale[c] = static_cast<float>(gamma[c] * invStd);
      shift[c] = static_cast<float>(beta[c] - runMean[c] * gamma[c] * invStd);
    }
  }

  const float* sc = scale.data();
  const float* sh = shift.data();
  const bool relu = args.relu;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * channels;
    const T* rr = res ? res + r * channels : nullptr;
    T* yr = y + r * channels;
    for (int64_t c = 0; c < channels; ++c) {
      float v = toF(xr[c]) * sc[c] + sh[c];
      if (rr) v += toF(rr[c]);
      if (relu) v = v > 0.0f ? v : 0.0f;
      yr[c] = fromF<T>(v);
    }
  }
}

template <typename T>
void backwardTyped(const BatchNormBackwardArgs& args) {
  const int64_t channels = args.x.dim(args.x.rank() - 1);
  const int64_t rows = args.x.numel() / channels;
  const T* x = args.x.ptr<T>();
  const T* y = args.relu ? args.y.ptr<T>() : nullptr;
  const T* dy = args.dy.ptr<T>();
  T* dx = args.dx.ptr<T>();
  T* dres = args.dResidual.defined() ? args.dResidual.ptr<T>() : nullptr;
  const float* gamma = args.gamma.ptr<float>();
  const float* mean = args.saveMean.ptr<float>();
  const float* invStd = args.saveInvStd.ptr<float>();

  std::vector<double> sumG, sumGX;
  channelSums(rows, channels, sumG, sumGX, [&](int64_t r, double* sg, double* sgx) {
    const T* xr = x + r * channels;
    const T* dyr = dy + r * channels;
    const T* yr = y ? y + r * channels : nullptr;
    for (int64_t c = 0; c < channels; ++c) {
      float g = toF(dyr[c]);
      if (yr && !(toF(yr[c]) > 0.0f)) g = 0.0f;
      sg[c] += g;
      sgx[c] += static_cast<double>(g) * (toF(xr[c]) - mean[c]);
    }
  });

  float* dGamma = args.dGamma.ptr<float>();
  float* dBeta = args.dBeta.ptr<float>();
  std::vector<float> a(channels), b(channels), k(channels);
  const double m = static_cast<double>(rows);
  for (int64_t c = 0; c < channels; ++c) {
    const double is = invStd[c];
    dGamma[c] += static_cast<float>(sumGX[c] * is);
    dBeta[c] += static_cast<float>(sumG[c]);
    // dx = gamma*invStd * (g - sumG/M - (x - mean) * invStd^2 * sumGX / M)
    a[c] = static_cast<float>(gamma[c] * is);
    b[c] = static_cast<float>(sumG[c] / m);
    k[c] = static_cast<float>(is * is * sumGX[c] / m);
  }
  const float* pa = a.data();
  const float* pb = b.data();
  const float* pk = k.data();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * channels;
    const T* dyr = dy + r * channels;
    const T* yr = y ? y + r * channels : nullptr;
    T* dxr = dx + r * channels;
    T* drr = dres ? dres + r * channels : nullptr;
    for (int64_t c = 0; c < channels; ++c) {
      float g = toF(dyr[c]);
      if (yr && !(toF(yr[c]) > 0.0f)) g = 0.0f;
      if (drr) drr[c] = fromF<T>(g);
      dxr[c] = fromF<T>(pa[c] * (g - pb[c] - (toF(xr[c]) - mean[c]) * pk[c]));
    }
  }
}

}  // namespace

void batchNormForward(const BatchNormForwardArgs& args) {
  validateBatchNormForward(args);
  dispatchFloat(args.x.dtype(), "batchnorm forward", [&](auto tag) { forwardTyped<decltype(tag)>(args); });
}

void batchNormBackward(const BatchNormBackwardArgs& args) {
  validateBatchNormBackward(args);
  dispatchFloat(args.x.dtype(), "batchnorm backward", [&](auto tag) { backwardTyped<decltype(tag)>(args); });
}

}  // namespace rc::cpu
