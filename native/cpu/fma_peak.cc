#include "fma_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>

#include "../core/error.h"
#include "isa.h"

namespace rc::cpu {

namespace {

// Independent accumulator chains per thread: enough to cover the FMA latency (4 cycles) times the
// two FMA ports of current cores, in registers (AVX-512 has 32, AVX2 16).
constexpr int kChains = 12;

// Each kernel: `iterations` rounds of kChains multiply-adds on its vectors (16, 8 or 4 floats, as
// Kernel::lanes says); returns a value that depends on every chain, so that no round can be left
// out. The SSE one multiplies and adds (x86-64 without FMA).
RC_TARGET_AVX512 float fmaRoundsAvx512(long iterations) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long n = 0; n < iterations; ++n) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  for (int i = 1; i < kChains; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc[0]);
  return lanes[0];
}

RC_TARGET_AVX2 float fmaRoundsAvx2(long iterations) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long n = 0; n < iterations; ++n) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  for (int i = 1; i < kChains; ++i) acc[0] = _mm256_add_ps(acc[0], acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  return lanes[0];
}

float mulAddRoundsSse(long iterations) {
  __m128 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm_set1_ps(0.001f * static_cast<float>(i));
  const __m128 a = _mm_set1_ps(0.999999f), b = _mm_set1_ps(1e-7f);
  for (long n = 0; n < iterations; ++n) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm_add_ps(_mm_mul_ps(acc[i], a), b);
  }
  for (int i = 1; i < kChains; ++i) acc[0] = _mm_add_ps(acc[0], acc[i]);
  return _mm_cvtss_f32(acc[0]);
}

struct Kernel {
  float (*rounds)(long);
  int lanes;
  const char* isa;
};

Kernel kernelFor(IsaLevel level) {
  switch (level) {
    case IsaLevel::Avx512: return {fmaRoundsAvx512, 16, "avx512"};
    case IsaLevel::Avx2: return {fmaRoundsAvx2, 8, "avx2"};
    default: return {mulAddRoundsSse, 4, "sse"};
  }
}

}  // namespace

FmaPeak measureFmaPeak(double milliseconds) {
  RC_CHECK_ARG(milliseconds >= 1.0 && milliseconds <= 60000.0,
               "fma peak: milliseconds must be between 1 and 60000, got " << milliseconds);
  const Kernel kernel = kernelFor(isaLevel());
  const int threads = omp_get_max_threads();
  // A trial's length in rounds, doubled from a small count until a trial takes about 10 ms.
  long iterations = 1 << 12;
  double best = 0.0, spent = 0.0;
  volatile float sink = 0.0f;
  while (spent < milliseconds) {
    double seconds = 0.0;
#pragma omp parallel num_threads(threads)
    {
#pragma omp barrier
      const double start = omp_get_wtime();
      const float value = kernel.rounds(iterations);
#pragma omp barrier
#pragma omp master
      {
        seconds = omp_get_wtime() - start;
        sink = value;
      }
    }
    spent += 1e3 * seconds;
    const double flops = 2.0 * kChains * kernel.lanes * static_cast<double>(iterations) * threads;
    best = std::max(best, flops / seconds / 1e9);
    if (seconds < 0.01) iterations *= 2;
  }
  static_cast<void>(sink);
  return {best, threads, kernel.isa};
}

}  // namespace rc::cpu
