// Batch normalisation over NHWC rows with fused residual add and ReLU. Statistics are summed in
// float over short blocks of rows (vectorised along channels) and in double across blocks.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_ops.h"
#include "isa.h"

namespace rc::cpu {

namespace {

constexpr int64_t kBlockRows = 64;

// ---- row kernels, compiled per ISA ---------------------------------------------------------

// s[c] += x[r,c] - pivot[c]; s2[c] += (x[r,c] - pivot[c])^2
template <typename T>
RC_ALWAYS_INLINE void statsRowsImpl(const T* x, const float* pivot, int64_t rows, int64_t channels, float* s,
                                    float* s2) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * channels;
    for (int64_t c = 0; c < channels; ++c) {
      const float v = toF(row[c]) - pivot[c];
      s[c] += v;
      s2[c] += v * v;
    }
  }
}
RC_ISA_DISPATCH(statsRows, statsRowsImpl,
                (const T* x, const float* pivot, int64_t rows, int64_t channels, float* s, float* s2),
                (x, pivot, rows, channels, s, s2))

// The pre-activation of the forward's ReLU without a residual. The backward recomputes it from x,
// bit for bit (the same expression on the same floats), to mask the gradient without reading y.
template <typename T>
RC_ALWAYS_INLINE float preActivation(T x, float scale, float shift) {
  return toF(x) * scale + shift;
}

inline float bitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// The largest float that T stores as zero (fromF<T> is monotonic): the stored ReLU output of v is
// positive, or NaN, exactly when v is not <= this bound (recomputedReluGrad). 0 for float; for the
// 16-bit types found once by bisection over the positive floats' bits (it keeps the masking loop
// free of the conversion's rounding).
template <typename T>
float storedZeroBound() {
  if constexpr (std::is_same_v<T, float>) {
    return 0.0f;
  } else {
    static const float bound = [] {
      uint32_t zero = 0, positive = 0x7f800000u;  // the bits of +0 and +inf
      while (positive - zero > 1) {
        const uint32_t mid = zero + (positive - zero) / 2;
        (toF(fromF<T>(bitsToFloat(mid))) == 0.0f ? zero : positive) = mid;
      }
      return bitsToFloat(zero);
    }();
    return bound;
  }
}

// y = relu?(x * scale + shift + residual?)
template <typename T>
RC_ALWAYS_INLINE void normalizeRowsImpl(const T* x, const T* res, T* y, const float* scale, const float* shift,
                                        int64_t rows, int64_t channels, bool relu) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * channels;
    T* yr = y + r * channels;
    if (res) {
      const T* rr = res + r * channels;
      if (relu) {
        for (int64_t c = 0; c < channels; ++c) {
          yr[c] = fromF<T>(reluValue(toF(xr[c]) * scale[c] + shift[c] + toF(rr[c])));
        }
      } else {
        for (int64_t c = 0; c < channels; ++c) yr[c] = fromF<T>(toF(xr[c]) * scale[c] + shift[c] + toF(rr[c]));
      }
    } else if (relu) {
      for (int64_t c = 0; c < channels; ++c) yr[c] = fromF<T>(reluValue(preActivation(xr[c], scale[c], shift[c])));
    } else {
      for (int64_t c = 0; c < channels; ++c) yr[c] = fromF<T>(toF(xr[c]) * scale[c] + shift[c]);
    }
  }
}
RC_ISA_DISPATCH(normalizeRows, normalizeRowsImpl,
                (const T* x, const T* res, T* y, const float* scale, const float* shift, int64_t rows, int64_t channels,
                 bool relu),
                (x, res, y, scale, shift, rows, channels, relu))

// reluGrad of the stored ReLU output, from the pre-activation recomputed from x (see
// storedZeroBound): the incoming gradient, or zero where the stored output is.
template <typename T>
RC_ALWAYS_INLINE float recomputedReluGrad(T x, float scale, float shift, float zeroBound, T dy) {
  return preActivation(x, scale, shift) <= zeroBound ? 0.0f : toF(dy);
}

// The ReLU's output the backward masks the gradient with: y as stored, or, without a residual, its
// sign recomputed from x (the pre-activation with the forward's scale and shift, against
// storedZeroBound), which saves reading y. Exactly one of `y` and `scale` is set when the batch
// norm has a ReLU.
template <typename T>
struct ReluOut {
  const T* y = nullptr;
  const float* scale = nullptr;
  const float* shift = nullptr;
  float zeroBound = 0.0f;

  // The same output from row offset `at` on.
  ReluOut rows(int64_t at) const { return {y ? y + at : nullptr, scale, shift, zeroBound}; }
};

// g = dy masked by the ReLU's output (when there is one); sg[c] += g; sgx[c] += g * (x - mean);
// with y and gOut, g is also stored there (dy's own bits where the ReLU passed it, else zero), so
// that the input-gradient pass reads g instead of both y and dy
template <typename T>
RC_ALWAYS_INLINE void gradStatsRowsImpl(const T* x, ReluOut<T> relu, const T* dy, T* gOut, const float* __restrict mean,
                                        int64_t rows, int64_t channels, float* __restrict sg, float* __restrict sgx) {
  const T* y = relu.y;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = r * channels;
    const T* xr = x + at;
    const T* dyr = dy + at;
    if (y && gOut) {
      const T* yr = y + at;
      const auto* dyWords = words(dyr);
      auto* gWords = words(gOut + at);
      for (int64_t c = 0; c < channels; ++c) {
        const float out = toF(yr[c]);
        const float g = reluGrad(out, toF(dyr[c]));
        gWords[c] = reluGradWord(out, dyWords[c]);
        sg[c] += g;
        sgx[c] += g * (toF(xr[c]) - mean[c]);
      }
    } else if (y) {
      const T* yr = y + at;
      for (int64_t c = 0; c < channels; ++c) {
        const float g = reluGrad(toF(yr[c]), toF(dyr[c]));
        sg[c] += g;
        sgx[c] += g * (toF(xr[c]) - mean[c]);
      }
    } else if (relu.scale) {
      const float* __restrict scale = relu.scale;
      const float* __restrict shift = relu.shift;
      const float zero = relu.zeroBound;
      for (int64_t c = 0; c < channels; ++c) {
        const float g = recomputedReluGrad(xr[c], scale[c], shift[c], zero, dyr[c]);
        sg[c] += g;
        sgx[c] += g * (toF(xr[c]) - mean[c]);
      }
    } else {
      for (int64_t c = 0; c < channels; ++c) {
        const float g = toF(dyr[c]);
        sg[c] += g;
        sgx[c] += g * (toF(xr[c]) - mean[c]);
      }
    }
  }
}
RC_ISA_DISPATCH(gradStatsRows, gradStatsRowsImpl,
                (const T* x, ReluOut<T> relu, const T* dy, T* gOut, const float* __restrict mean, int64_t rows,
                 int64_t channels, float* __restrict sg, float* __restrict sgx),
                (x, relu, dy, gOut, mean, rows, channels, sg, sgx))

// dx = a * (g - b - (x - mean) * k) with batch statistics, a * g with constant (running) ones;
// dres = g, written in the same loop as dx (dy's own bits where the ReLU passed it, else zero).
// The per-channel coefficients are restrict (they are the caller's own vectors): without it the
// alias checks between them and the two outputs outnumber what the compiler versions a loop for,
// and the f32 loop that writes dx and dres stays scalar.
template <typename T>
RC_ALWAYS_INLINE float gradInputValue(T x, float g, float mean, float a, float b, float k, bool batchStats) {
  return batchStats ? a * (g - b - (toF(x) - mean) * k) : a * g;
}

template <typename T>
RC_ALWAYS_INLINE void gradInputRowsImpl(const T* x, ReluOut<T> relu, const T* dy, T* dx, T* dres,
                                        const float* __restrict mean, const float* __restrict a,
                                        const float* __restrict b, const float* __restrict k, int64_t rows,
                                        int64_t channels, bool batchStats) {
  const T* y = relu.y;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = r * channels;
    const T* xr = x + at;
    const T* dyr = dy + at;
    T* dxr = dx + at;
    if (y && dres) {
      const T* yr = y + at;
      const auto* dyWords = words(dyr);
      auto* dresWords = words(dres + at);
      for (int64_t c = 0; c < channels; ++c) {
        const float out = toF(yr[c]);
        dxr[c] = fromF<T>(gradInputValue(xr[c], reluGrad(out, toF(dyr[c])), mean[c], a[c], b[c], k[c], batchStats));
        dresWords[c] = reluGradWord(out, dyWords[c]);
      }
    } else if (y) {
      const T* yr = y + at;
      for (int64_t c = 0; c < channels; ++c) {
        const float g = reluGrad(toF(yr[c]), toF(dyr[c]));
        dxr[c] = fromF<T>(gradInputValue(xr[c], g, mean[c], a[c], b[c], k[c], batchStats));
      }
    } else if (relu.scale) {
      const float* __restrict scale = relu.scale;
      const float* __restrict shift = relu.shift;
      const float zero = relu.zeroBound;
      for (int64_t c = 0; c < channels; ++c) {
        const float g = recomputedReluGrad(xr[c], scale[c], shift[c], zero, dyr[c]);
        dxr[c] = fromF<T>(gradInputValue(xr[c], g, mean[c], a[c], b[c], k[c], batchStats));
      }
    } else if (dres) {
      const auto* dyWords = words(dyr);
      auto* dresWords = words(dres + at);
      for (int64_t c = 0; c < channels; ++c) {
        dxr[c] = fromF<T>(gradInputValue(xr[c], toF(dyr[c]), mean[c], a[c], b[c], k[c], batchStats));
        dresWords[c] = dyWords[c];
      }
    } else {
      for (int64_t c = 0; c < channels; ++c) {
        dxr[c] = fromF<T>(gradInputValue(xr[c], toF(dyr[c]), mean[c], a[c], b[c], k[c], batchStats));
      }
    }
  }
}
RC_ISA_DISPATCH(gradInputRows, gradInputRowsImpl,
                (const T* x, ReluOut<T> relu, const T* dy, T* dx, T* dres, const float* __restrict mean,
                 const float* __restrict a, const float* __restrict b, const float* __restrict k, int64_t rows,
                 int64_t channels, bool batchStats),
                (x, relu, dy, dx, dres, mean, a, b, k, rows, channels, batchStats))

// ---- drivers ---------------------------------------------------------------------------------

// Per-channel sums over all rows: `block(firstRow, rowCount, a, b)` adds one block of rows into
// float accumulators a[C], b[C]; blocks are summed in double per thread, then across threads.
template <typename Block>
void channelSums(int64_t rows, int64_t channels, std::vector<double>& a, std::vector<double>& b, Block block) {
  const int threads = omp_get_max_threads();
  std::vector<double> partial(static_cast<size_t>(threads) * 2 * channels, 0.0);
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
#pragma omp parallel num_threads(threads)
  {
    double* pa = partial.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * channels;
    double* pb = pa + channels;
    std::vector<float> fa(channels), fb(channels);
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      std::fill(fa.begin(), fa.end(), 0.0f);
      std::fill(fb.begin(), fb.end(), 0.0f);
      const int64_t first = blk * kBlockRows;
      block(first, std::min(kBlockRows, rows - first), fa.data(), fb.data());
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

// Runs body(firstRow, rowCount) over blocks of rows in parallel.
template <typename Body>
void forRowBlocks(int64_t rows, Body body) {
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t first = blk * kBlockRows;
    body(first, std::min(kBlockRows, rows - first));
  }
}

// The forward's per-channel map y = x * scale + shift (before residual and ReLU), from the float
// statistics it saves. The backward that recomputes the ReLU's output computes the same floats from
// the same saved values. shift uses the rounded scale, so that y = scale * (x - mean) + beta.
void channelAffine(const float* gamma, const float* beta, const float* mean, const float* invStd, int64_t channels,
                   float* scale, float* shift) {
  for (int64_t c = 0; c < channels; ++c) {
    scale[c] = static_cast<float>(static_cast<double>(gamma[c]) * invStd[c]);
    shift[c] = static_cast<float>(beta[c] - static_cast<double>(mean[c]) * scale[c]);
  }
}

template <typename T>
void forwardTyped(const BatchNormForwardArgs& args) {
  const int64_t channels = args.x.dim(args.x.rank() - 1);
  const int64_t rows = args.x.numel() / channels;
  const T* x = args.x.ptr<T>();
  T* y = args.y.ptr<T>();
  const T* res = args.residual.defined() ? args.residual.ptr<T>() : nullptr;
  float* runMean = args.runningMean.ptr<float>();
  float* runVar = args.runningVar.ptr<float>();
  // The statistics y is normalised with, as floats: saved when the caller asks (always in training).
  std::vector<float> meanF(channels), invStdF(channels);
  float* mean = args.saveMean.defined() ? args.saveMean.ptr<float>() : meanF.data();
  float* invStd = args.saveInvStd.defined() ? args.saveInvStd.ptr<float>() : invStdF.data();

  if (args.training) {
    // Sums of (x - pivot) with the first row as pivot: exact algebra for mean and variance, without
    // the cancellation of plain sums of squares when |mean| >> std.
    std::vector<float> pivot(channels);
    for (int64_t c = 0; c < channels; ++c) pivot[c] = toF(x[c]);
    const float* pv = pivot.data();
    std::vector<double> sum, sumSq;
    channelSums(rows, channels, sum, sumSq, [&](int64_t first, int64_t count, float* s, float* s2) {
      statsRows<T>(x + first * channels, pv, count, channels, s, s2);
    });
    const double m = static_cast<double>(rows);
    for (int64_t c = 0; c < channels; ++c) {
      const double shifted = sum[c] / m;
      const double batchMean = shifted + pv[c];
      const double var = std::max(sumSq[c] / m - shifted * shifted, 0.0);
      mean[c] = static_cast<float>(batchMean);
      invStd[c] = static_cast<float>(1.0 / std::sqrt(var + args.eps));
      runMean[c] = static_cast<float>((1.0 - args.momentum) * runMean[c] + args.momentum * batchMean);
      runVar[c] = static_cast<float>((1.0 - args.momentum) * runVar[c] + args.momentum * var * m / (m - 1.0));
    }
  } else {
    // The running statistics are the constants, saved when asked for a backward in evaluation mode.
    for (int64_t c = 0; c < channels; ++c) {
      mean[c] = runMean[c];
      invStd[c] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(runVar[c]) + args.eps));
    }
  }
  std::vector<float> scale(channels), shift(channels);
  channelAffine(args.gamma.ptr<float>(), args.beta.ptr<float>(), mean, invStd, channels, scale.data(), shift.data());
  const float* sc = scale.data();
  const float* sh = shift.data();
  forRowBlocks(rows, [&](int64_t first, int64_t count) {
    const int64_t at = first * channels;
    normalizeRows<T>(x + at, res ? res + at : nullptr, y + at, sc, sh, count, channels, args.relu);
  });
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
  // Without a residual and with beta given, the ReLU's output is recomputed from x with the
  // forward's scale and shift instead of read from y: one tensor fewer in each pass.
  std::vector<float> scale, shift;
  ReluOut<T> out{y};
  if (args.relu && !dres && args.beta.defined()) {
    scale.resize(channels);
    shift.resize(channels);
    channelAffine(gamma, args.beta.ptr<float>(), mean, invStd, channels, scale.data(), shift.data());
    out = {nullptr, scale.data(), shift.data(), storedZeroBound<T>()};
  }

  std::vector<double> sumG, sumGX;
  channelSums(rows, channels, sumG, sumGX, [&](int64_t first, int64_t count, float* sg, float* sgx) {
    const int64_t at = first * channels;
    gradStatsRows<T>(x + at, out.rows(at), dy + at, y && dres ? dres + at : nullptr, mean, count, channels, sg, sgx);
  });

  float* dGamma = args.dGamma.ptr<float>();
  float* dBeta = args.dBeta.ptr<float>();
  std::vector<float> a(channels), b(channels), k(channels);
  const double m = static_cast<double>(rows);
  for (int64_t c = 0; c < channels; ++c) {
    const double is = invStd[c];
    dGamma[c] += static_cast<float>(sumGX[c] * is);
    dBeta[c] += static_cast<float>(sumG[c]);
    // dx = gamma*invStd * (g - sumG/M - (x - mean) * invStd^2 * sumGX / M); in evaluation mode the
    // statistics are constants and only gamma*invStd * g remains.
    a[c] = static_cast<float>(gamma[c] * is);
    b[c] = static_cast<float>(sumG[c] / m);
    k[c] = static_cast<float>(is * is * sumGX[c] / m);
  }
  // With a ReLU and a residual, dres already holds g (written by the statistics pass): the input
  // gradient reads it as an unmasked incoming gradient, one tensor instead of y and dy.
  const T* g = y && dres ? dres : dy;
  const ReluOut<T> mask = y && dres ? ReluOut<T>{} : out;
  T* gCopy = y ? nullptr : dres;
  forRowBlocks(rows, [&](int64_t first, int64_t count) {
    const int64_t at = first * channels;
    gradInputRows<T>(x + at, mask.rows(at), g + at, dx + at, gCopy ? gCopy + at : nullptr, mean, a.data(), b.data(),
                     k.data(), count, channels, args.training);
  });
}

// ---- SyncBatchNorm -------------------------------------------------------------------------------

// The channel count and the number of rows of an NHWC tensor.
struct RowsOf {
  int64_t channels, rows;
  explicit RowsOf(const Tensor& x) : channels(x.dim(x.rank() - 1)), rows(x.numel() / channels) {}
};

template <typename T>
void syncStatsTyped(const SyncBatchNormStatsArgs& args) {
  const RowsOf d(args.x);
  const T* x = args.x.ptr<T>();
  // Shifted by the first row, as the training forward: mean and M2 without the cancellation of
  // plain sums of squares when |mean| >> std.
  std::vector<float> pivot(d.channels);
  for (int64_t c = 0; c < d.channels; ++c) pivot[c] = toF(x[c]);
  const float* pv = pivot.data();
  std::vector<double> sum, sumSq;
  channelSums(d.rows, d.channels, sum, sumSq, [&](int64_t first, int64_t count, float* s, float* s2) {
    statsRows<T>(x + first * d.channels, pv, count, d.channels, s, s2);
  });
  float* count = args.stats.ptr<float>();
  float* mean = count + d.channels;
  float* m2 = mean + d.channels;
  const double m = static_cast<double>(d.rows);
  for (int64_t c = 0; c < d.channels; ++c) {
    const double shifted = sum[c] / m;
    count[c] = static_cast<float>(m);
    mean[c] = static_cast<float>(shifted + pv[c]);
    m2[c] = static_cast<float>(std::max(sumSq[c] - sum[c] * shifted, 0.0));
  }
}

// Every rank's (count, mean, M2) of channel c merged in double: the global count, mean and M2
// (M2 = sum of the ranks' M2 + sum of count * (rank mean - global mean)^2, exact algebra).
struct Moments {
  double count = 0.0, mean = 0.0, m2 = 0.0;
};

Moments mergeRanks(const float* stats, int64_t ranks, int64_t channels, int64_t c) {
  Moments out;
  double sum = 0.0;
  for (int64_t r = 0; r < ranks; ++r) {
    const float* s = stats + r * 3 * channels;
    if (s[c] <= 0.0f) continue;
    out.count += s[c];
    sum += static_cast<double>(s[c]) * s[channels + c];
  }
  if (out.count <= 0.0) return out;
  out.mean = sum / out.count;
  for (int64_t r = 0; r < ranks; ++r) {
    const float* s = stats + r * 3 * channels;
    if (s[c] <= 0.0f) continue;
    const double delta = s[channels + c] - out.mean;
    out.m2 += s[2 * channels + c] + s[c] * delta * delta;
  }
  return out;
}

template <typename T>
void syncForwardTyped(const SyncBatchNormForwardArgs& args) {
  const RowsOf d(args.x);
  const int64_t ranks = args.stats.dim(0);
  const float* stats = args.stats.ptr<float>();
  const float* gamma = args.gamma.ptr<float>();
  const float* beta = args.beta.ptr<float>();
  float* runMean = args.runningMean.ptr<float>();
  float* runVar = args.runningVar.ptr<float>();
  float* saveMean = args.saveMean.ptr<float>();
  float* saveInvStd = args.saveInvStd.ptr<float>();
  std::vector<Moments> moments(d.channels);
  for (int64_t c = 0; c < d.channels; ++c) {
    moments[c] = mergeRanks(stats, ranks, d.channels, c);
    RC_CHECK_ARG(moments[c].count > 1.0,
                 "sync batchnorm forward: training needs more than one value per channel "
                 "over all ranks, got a count of "
                     << moments[c].count << " for channel " << c);
  }
  std::vector<float> scale(d.channels), shift(d.channels);
  for (int64_t c = 0; c < d.channels; ++c) {
    const Moments& g = moments[c];
    const double var = g.m2 / g.count;
    const double invStd = 1.0 / std::sqrt(var + args.eps);
    saveMean[c] = static_cast<float>(g.mean);
    saveInvStd[c] = static_cast<float>(invStd);
    scale[c] = static_cast<float>(gamma[c] * invStd);
    shift[c] = static_cast<float>(beta[c] - g.mean * gamma[c] * invStd);
    runMean[c] = static_cast<float>((1.0 - args.momentum) * runMean[c] + args.momentum * g.mean);
    runVar[c] = static_cast<float>((1.0 - args.momentum) * runVar[c] + args.momentum * g.m2 / (g.count - 1.0));
  }
  const T* x = args.x.ptr<T>();
  const T* res = args.residual.defined() ? args.residual.ptr<T>() : nullptr;
  T* y = args.y.ptr<T>();
  forRowBlocks(d.rows, [&](int64_t first, int64_t count) {
    const int64_t at = first * d.channels;
    normalizeRows<T>(x + at, res ? res + at : nullptr, y + at, scale.data(), shift.data(), count, d.channels,
                     args.relu);
  });
}

template <typename T>
void syncBackwardReduceTyped(const SyncBatchNormBackwardReduceArgs& args) {
  const RowsOf d(args.x);
  const T* x = args.x.ptr<T>();
  const T* y = args.relu ? args.y.ptr<T>() : nullptr;
  const T* dy = args.dy.ptr<T>();
  const float* mean = args.saveMean.ptr<float>();
  const float* invStd = args.saveInvStd.ptr<float>();
  std::vector<double> sumG, sumGX;
  channelSums(d.rows, d.channels, sumG, sumGX, [&](int64_t first, int64_t count, float* sg, float* sgx) {
    const int64_t at = first * d.channels;
    gradStatsRows<T>(x + at, ReluOut<T>{y}.rows(at), dy + at, nullptr, mean, count, d.channels, sg, sgx);
  });
  float* sums = args.sums.ptr<float>();
  float* dGamma = args.dGamma.ptr<float>();
  float* dBeta = args.dBeta.ptr<float>();
  for (int64_t c = 0; c < d.channels; ++c) {
    const double gxhat = sumGX[c] * invStd[c];
    sums[c] = static_cast<float>(sumG[c]);
    sums[d.channels + c] = static_cast<float>(gxhat);
    sums[2 * d.channels + c] = static_cast<float>(d.rows);
    dGamma[c] += static_cast<float>(gxhat);
    dBeta[c] += static_cast<float>(sumG[c]);
  }
}

template <typename T>
void syncBackwardElementwiseTyped(const SyncBatchNormBackwardElementwiseArgs& args) {
  const RowsOf d(args.x);
  const float* gamma = args.gamma.ptr<float>();
  const float* invStd = args.saveInvStd.ptr<float>();
  const float* sums = args.sums.ptr<float>();
  std::vector<float> a(d.channels), b(d.channels), k(d.channels);
  for (int64_t c = 0; c < d.channels; ++c) {
    const double m = sums[2 * d.channels + c];
    RC_CHECK_ARG(m > 0.0, "sync batchnorm backward: the summed row count of channel " << c << " is " << m
                                                                                      << ", expected positive");
    // dx = gamma*invStd * (g - sum(g)/M - (x - mean) * invStd * sum(g*xhat)/M), M the global count.
    a[c] = static_cast<float>(static_cast<double>(gamma[c]) * invStd[c]);
    b[c] = static_cast<float>(sums[c] / m);
    k[c] = static_cast<float>(static_cast<double>(invStd[c]) * sums[d.channels + c] / m);
  }
  const T* x = args.x.ptr<T>();
  const T* y = args.relu ? args.y.ptr<T>() : nullptr;
  const T* dy = args.dy.ptr<T>();
  T* dx = args.dx.ptr<T>();
  T* dres = args.dResidual.defined() ? args.dResidual.ptr<T>() : nullptr;
  const float* mean = args.saveMean.ptr<float>();
  forRowBlocks(d.rows, [&](int64_t first, int64_t count) {
    const int64_t at = first * d.channels;
    gradInputRows<T>(x + at, ReluOut<T>{y}.rows(at), dy + at, dx + at, dres ? dres + at : nullptr, mean, a.data(),
                     b.data(), k.data(), count, d.channels, true);
  });
}

}  // namespace

void batchNormForward(const BatchNormForwardArgs& args) {
  dispatchFloat(args.x.dtype(), "batchnorm forward", [&](auto tag) { forwardTyped<decltype(tag)>(args); });
}

void batchNormBackward(const BatchNormBackwardArgs& args) {
  dispatchFloat(args.x.dtype(), "batchnorm backward", [&](auto tag) { backwardTyped<decltype(tag)>(args); });
}

void syncBatchNormStats(const SyncBatchNormStatsArgs& args) {
  dispatchFloat(args.x.dtype(), "sync batchnorm stats", [&](auto tag) { syncStatsTyped<decltype(tag)>(args); });
}

void syncBatchNormForward(const SyncBatchNormForwardArgs& args) {
  dispatchFloat(args.x.dtype(), "sync batchnorm forward", [&](auto tag) { syncForwardTyped<decltype(tag)>(args); });
}

void syncBatchNormBackwardReduce(const SyncBatchNormBackwardReduceArgs& args) {
  dispatchFloat(args.x.dtype(), "sync batchnorm backward reduce",
                [&](auto tag) { syncBackwardReduceTyped<decltype(tag)>(args); });
}

void syncBatchNormBackwardElementwise(const SyncBatchNormBackwardElementwiseArgs& args) {
  dispatchFloat(args.x.dtype(), "sync batchnorm backward elementwise",
                [&](auto tag) { syncBackwardElementwiseTyped<decltype(tag)>(args); });
}

}  // namespace rc::cpu
