// The finalize of the conv-bn fused path (see fused_conv.h): batch normalisation's training
// statistics from the sum and sum of squares a convolution's epilogue wrote. The variance is
// E[y^2] - E[y]^2, formed in double precision from the f32 sums (the sums themselves are f32, as
// cuDNN's GEN_STATS writes them) and clamped at 0; the running variance takes the unbiased
// variance, as batchNormForward does.
#include "device_utils.cuh"
#include "fused_conv.h"

namespace rc::cuda {

namespace {

__global__ void conv_bn_finalize_kernel(const float* __restrict__ sum, const float* __restrict__ sqSum,
                                        const float* __restrict__ gamma, const float* __restrict__ beta,
                                        float* __restrict__ runningMean, float* __restrict__ runningVar,
                                        float* __restrict__ saveMean, float* __restrict__ saveInvStd,
                                        float* __restrict__ scale, float* __restrict__ shift,
                                        float* __restrict__ variance, int64_t channels, int64_t count, float momentum,
                                        float eps) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  const double n = static_cast<double>(count);
  const double mean = static_cast<double>(sum[c]) / n;
  double var = static_cast<double>(sqSum[c]) / n - mean * mean;
  if (var < 0.0) var = 0.0;
  const float invStd = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  const float meanF = static_cast<float>(mean);
  saveMean[c] = meanF;
  saveInvStd[c] = invStd;
  if (variance != nullptr) variance[c] = static_cast<float>(var);
  const float s = gamma[c] * invStd;
  scale[c] = s;
  shift[c] = beta[c] - meanF * s;
  if (runningMean != nullptr) {
    runningMean[c] = (1.0f - momentum) * runningMean[c] + momentum * meanF;
    runningVar[c] = (1.0f - momentum) * runningVar[c] + momentum * static_cast<float>(var * n / (n - 1.0));
  }
}

}  // namespace

void batchNormFinalize(const float* sum, const float* sqSum, const float* gamma, const float* beta, float* runningMean,
                       float* runningVar, float* saveMean, float* saveInvStd, float* scale, float* shift,
                       float* variance, int64_t channels, int64_t count, float momentum, float eps,
                       cudaStream_t stream) {
  conv_bn_finalize_kernel<<<gridFor(channels), kThreads, 0, stream>>>(sum, sqSum, gamma, beta, runningMean, runningVar,
                                                                      saveMean, saveInvStd, scale, shift, variance,
                                                                      channels, count, momentum, eps);
  checkLaunch("conv_bn_finalize_kernel");
}

}  // namespace rc::cuda
