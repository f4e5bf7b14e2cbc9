// Batch normalisation over NHWC rows with fused residual add and ReLU. Statistics are summed in
// float over short blocks of rows and in double across blocks: one pass, vectorisable, accurate.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_ops.h"

namespace rc::cpu {

namespace {

// Per-channel sums over all rows, reduced over threads. `body(firstRow, rowCount, a, b)` adds a
// block of rows into float accumulators a[C], b[C]; blocks are short so float stays accurate, and
// blocks are summed in double.
constexpr int64_t kBlockRows = 64;

template <typename Body>
void channelSums(int64_t rows, int64_t channels, std::vector<double>& a, std::vector<double>& b, Body body) {
  const int threads = omp_get_max_threads();
  std::vector<double> partial(static_cast<size_t>(threads) * 2 * channels, 0.0);
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    double* pa = partial.data() + static_cast<size_t>(t) * 2 * channels;
    double* pb = pa + channels;
    std::vector<float> fa(channels), fb(channels);
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      std::fill(fa.begin(), fa.end(), 0.0f);
      std::fill(fb.begin(), fb.end(), 0.0f);
      const int64_t first = blk * kBlockRows;
      body(first, std::min(kBlockRows, rows - first), fa.data(), fb.data());
      for (int64_t c = 0; c < channels; ++c) {
        pa[c] += fa[c];
        pb[c] += fb[c];
      }
    }
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
    // Sums of (x - shift) with shift = the first row: exact mean/variance algebra, without the
    // cancellation that plain sums of squares suffer when |mean| >> std.
    std::vector<float> pivot(channels);
    for (int64_t c = 0; c < channels; ++c) pivot[c] = toF(x[c]);
    const float* pv = pivot.data();
    std::vector<double> sum, sumSq;
    channelSums(rows, channels, sum, sumSq, [&](int64_t first, int64_t count, float* s, float* s2) {
      for (int64_t r = first; r < first + count; ++r) {
        const T* row = x + r * channels;
        for (int64_t c = 0; c < channels; ++c) {
          const float v = toF(row[c]) - pv[c];
          s[c] += v;
          s2[c] += v * v;
        }
      }
    });
    float* saveMean = args.saveMean.ptr<float>();
    float* saveInvStd = args.saveInvStd.ptr<float>();
    const double m = static_cast<double>(rows);
    for (int64_t c = 0; c < channels; ++c) {
      const double shifted = sum[c] / m;
      const double mean = shifted + pv[c];
      const double var = std::max(sumSq[c] / m - shifted * shifted, 0.0);
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
    if (rr) {
      for (int64_t c = 0; c < channels; ++c) {
        const float v = toF(xr[c]) * sc[c] + sh[c] + toF(rr[c]);
        yr[c] = fromF<T>(relu ? std::max(v, 0.0f) : v);
      }
    } else {
      for (int64_t c = 0; c < channels; ++c) {
        const float v = toF(xr[c]) * sc[c] + sh[c];
        yr[c] = fromF<T>(relu ? std::max(v, 0.0f) : v);
      }
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
  channelSums(rows, channels, sumG, sumGX, [&](int64_t first, int64_t count, float* sg, float* sgx) {
    for (int64_t r = first; r < first + count; ++r) {
      const T* xr = x + r * channels;
      const T* dyr = dy + r * channels;
      const T* yr = y ? y + r * channels : nullptr;
      for (int64_t c = 0; c < channels; ++c) {
        float g = toF(dyr[c]);
        if (yr) g = toF(yr[c]) > 0.0f ? g : 0.0f;
        sg[c] += g;
        sgx[c] += g * (toF(xr[c]) - mean[c]);
      }
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
      if (yr) g = toF(yr[c]) > 0.0f ? g : 0.0f;
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
