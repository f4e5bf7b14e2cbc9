// The per-group coefficients of an AdamW or LAMB step, shared by the CPU backend and the CUDA
// kernels so that both compute the same f32 values: each is computed in double from the f32
// hyperparameters and rounded once, as PyTorch turns its Python-float step sizes into f32 scalars.
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define RC_HOST_DEVICE __host__ __device__
#else
#define RC_HOST_DEVICE
#endif

namespace rc {

struct AdamCoeffs {
  float beta1, beta2, oneMinusBeta1, oneMinusBeta2, eps, lr, weightDecay;
  float decay;     // AdamW: 1 - lr * wd
  float stepSize;  // AdamW: lr / (1 - beta1^t)
  float bc1;       // LAMB: 1 - beta1^t
  float bc2Sqrt;   // sqrt(1 - beta2^t)
  int32_t adapt;   // LAMB: whether the trust ratio applies
};

// base^e for e >= 0 by repeated squaring: a few double products (error ~1e-15, far below f32),
// and light on registers on the device, unlike the general pow.
RC_HOST_DEVICE inline double powInt(double base, int64_t e) {
  double result = 1.0;
  for (; e > 0; e >>= 1) {
    if (e & 1) result *= base;
    base *= base;
  }
  return result;
}

// The coefficients of step t >= 1 for a group with fields lr, beta1, beta2, eps, weightDecay and
// alwaysAdapt (the CPU's AdamGroup and the kernels' AdamGroupParams, which differ in layout only).
template <typename Group>
RC_HOST_DEVICE inline AdamCoeffs adamCoeffs(const Group& g, int64_t step) {
  const double bc1 = 1.0 - powInt(static_cast<double>(g.beta1), step);
  const double bc2 = 1.0 - powInt(static_cast<double>(g.beta2), step);
  AdamCoeffs c;
  c.beta1 = g.beta1;
  c.beta2 = g.beta2;
  c.oneMinusBeta1 = static_cast<float>(1.0 - static_cast<double>(g.beta1));
  c.oneMinusBeta2 = static_cast<float>(1.0 - static_cast<double>(g.beta2));
  c.eps = g.eps;
  c.lr = g.lr;
  c.weightDecay = g.weightDecay;
  c.decay = static_cast<float>(1.0 - static_cast<double>(g.lr) * static_cast<double>(g.weightDecay));
  c.stepSize = static_cast<float>(static_cast<double>(g.lr) / bc1);
  c.bc1 = static_cast<float>(bc1);
  c.bc2Sqrt = static_cast<float>(sqrt(bc2));
  c.adapt = (g.weightDecay != 0.0f || g.alwaysAdapt) ? 1 : 0;
  return c;
}

}  // namespace rc
