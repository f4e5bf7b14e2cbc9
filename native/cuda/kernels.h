// Host launchers of the CUDA kernels of our own (one op per .cu file, kernels first, launchers
// last). Every launcher enqueues on `stream`, never synchronises, never allocates, and checks the
// launch with cudaGetLastError (throwing rc::Error with code ERR_RC_CUDA). Element types are given
// as rc::DType; activations may be f32, bf16 or f16; statistics, parameters and their gradients
// are f32. All tensors are contiguous; "rows" is the product of all dims but the last (C).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../core/dtype.h"

namespace rc::cuda {

// ---- batchnorm.cu ------------------------------------------------------------------------------
// Training forward: per-channel mean and biased variance over `rows` rows of x[rows, C]; writes
// saveMean, saveInvStd = 1/sqrt(var + eps); updates runningMean/runningVar with `momentum` (running
// variance unbiased: var * rows / (rows - 1)); then y = relu?(x * gamma * invStd + (beta - mean *
// gamma * invStd) + residual?). `partial` is scratch of batchNormScratchFloats(rows, C) floats.
size_t batchNormScratchFloats(int64_t rows, int64_t channels);
void batchNormForwardTraining(DType dtype, const void* x, const void* residual, void* y, const float* gamma,
                              const float* beta, float* runningMean, float* runningVar, float* saveMean,
                              float* saveInvStd, int64_t rows, int64_t channels, float momentum, float eps, bool relu,
                              float* partial, cudaStream_t stream);
// Inference forward with the running statistics; when saveMean/saveInvStd are non-null they receive
// runningMean and 1/sqrt(runningVar + eps), the constants of a backward in evaluation mode.
void batchNormForwardInference(DType dtype, const void* x, const void* residual, void* y, const float* gamma,
                               const float* beta, const float* runningMean, const float* runningVar, float* saveMean,
                               float* saveInvStd, int64_t rows, int64_t channels, float eps, bool relu,
                               cudaStream_t stream);
// Backward: g = relu ? (y <= 0 ? 0 : dy) : dy; dResidual = g (if non-null); dGamma += sum(g * xhat);
// dBeta += sum(g); dx = gamma * invStd * (g - mean_rows(g) - xhat * mean_rows(g * xhat)) with batch
// statistics, gamma * invStd * g without (batchStats false: the saved statistics were constants).
void batchNormBackward(DType dtype, const void* x, const void* y, const void* dy, void* dx, void* dResidual,
                       const float* gamma, const float* saveMean, const float* saveInvStd, float* dGamma, float* dBeta,
                       int64_t rows, int64_t channels, bool relu, bool batchStats, float* partial, cudaStream_t stream);

// Dual batch norm (a downsample block's tail, see DualBatchNormForwardArgs in core/backend.h):
// y = relu?(bn_a(a.x) + bn_b(b.x)), each side with its own parameters and statistics. Training: the
// batch statistics of both inputs in one reduction (saved, and tracked as batchNormForwardTraining
// does), then one pass reading both inputs and writing y; inference: the running statistics (saved
// when saveMean/saveInvStd are non-null). `partial` is dualBatchNormScratchFloats(rows, C) floats.
struct DualBnForwardSide {
  const void* x;
  const float* gamma;
  const float* beta;
  float* runningMean;
  float* runningVar;
  float* saveMean;
  float* saveInvStd;
  float momentum;
  float eps;
};
size_t dualBatchNormScratchFloats(int64_t rows, int64_t channels);
void dualBatchNormForward(DType dtype, const DualBnForwardSide& a, const DualBnForwardSide& b, void* y, int64_t rows,
                          int64_t channels, bool training, bool relu, float* partial, cudaStream_t stream);
// Its backward: g = dy masked by the ReLU (once for both sides); each side's dGamma += sum(g * xhat),
// dBeta += sum(g) and dx as batchNormBackward computes it, the reductions of both sides in one pass
// over the inputs and both dx in another.
struct DualBnBackwardSide {
  const void* x;
  void* dx;
  const float* gamma;
  const float* saveMean;
  const float* saveInvStd;
  float* dGamma;
  float* dBeta;
};
void dualBatchNormBackward(DType dtype, const DualBnBackwardSide& a, const DualBnBackwardSide& b, const void* y,
                           const void* dy, int64_t rows, int64_t channels, bool relu, bool batchStats, float* partial,
                           cudaStream_t stream);

// SyncBatchNorm (see the Sync* argument structs in core/backend.h). Stats: this rank's count,
// mean and M2 per channel into stats[3, C]; `partial` is batchNormScratchFloats(rows, C) floats.
void syncBatchNormStats(DType dtype, const void* x, float* stats, int64_t rows, int64_t channels, float* partial,
                        cudaStream_t stream);
// Forward: merges stats[ranks, 3, C] in double into the global mean and inverse std (saved) and the
// running statistics (unbiased variance), then normalises as the training forward does.
void syncBatchNormForward(DType dtype, const void* x, const void* residual, void* y, const float* gamma,
                          const float* beta, const float* stats, int64_t ranks, float* runningMean, float* runningVar,
                          float* saveMean, float* saveInvStd, int64_t rows, int64_t channels, float momentum, float eps,
                          bool relu, cudaStream_t stream);
// Backward reduce: sums[3, C] = [sum(g), sum(g * xhat), rows]; dGamma += sum(g * xhat); dBeta += sum(g).
// `partial` is batchNormScratchFloats(rows, C) floats.
void syncBatchNormBackwardReduce(DType dtype, const void* x, const void* y, const void* dy, const float* saveMean,
                                 const float* saveInvStd, float* sums, float* dGamma, float* dBeta, int64_t rows,
                                 int64_t channels, bool relu, float* partial, cudaStream_t stream);
// Backward elementwise: dx (and dResidual) from sums[3, C] summed over the ranks; `coef` is scratch
// of 2 * C floats.
void syncBatchNormBackwardElementwise(DType dtype, const void* x, const void* y, const void* dy, void* dx,
                                      void* dResidual, const float* gamma, const float* saveMean,
                                      const float* saveInvStd, const float* sums, int64_t rows, int64_t channels,
                                      bool relu, float* coef, cudaStream_t stream);

// ---- fake_quant.cu -----------------------------------------------------------------------------
// Fake quantization with zero point 0 (see FakeQuantizeArgs in core/backend.h): n elements of
// dtype, `group` consecutive ones sharing scale[i / group] (group = n for a per-tensor scale).
void fakeQuantize(DType dtype, const void* x, const float* scale, void* y, int64_t n, int64_t group, int64_t qmin,
                  int64_t qmax, cudaStream_t stream);
// dx = dy where qmin <= rint(x / scale) <= qmax, else 0.
void fakeQuantizeBackward(DType dtype, const void* x, const float* scale, const void* dy, void* dx, int64_t n,
                          int64_t group, int64_t qmin, int64_t qmax, cudaStream_t stream);
// scale[g] = max(max |x[g * group .. (g + 1) * group)| / qmax, FLT_EPSILON) for g < groups.
void absMaxScale(DType dtype, const void* x, float* scale, int64_t groups, int64_t group, float qmax,
                 cudaStream_t stream);
// The moving-average min/max observer (see ObserveMinMaxArgs); scratch is observeScratchBytes().
size_t observeScratchBytes();
void observeMinMax(DType dtype, const void* x, int64_t n, float* minMax, float* scale, float averagingConstant,
                   float qmax, float* scratch, cudaStream_t stream);

// ---- elementwise.cu ----------------------------------------------------------------------------
void relu(DType dtype, const void* x, void* y, int64_t n, cudaStream_t stream);
void reluBackward(DType dtype, const void* y, const void* dy, void* dx, int64_t n, cudaStream_t stream);
void add(DType dtype, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream);
// out = a * b; out may alias a or b.
void mul(DType dtype, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream);
// Converts between f32, bf16 and f16 (round to nearest even); same dtype copies.
void cast(DType srcType, const void* src, DType dstType, void* dst, int64_t n, cudaStream_t stream);
// Fills n elements of any dtype (f32, bf16, f16, i32, i64, u8) with value.
void fill(DType dtype, void* data, int64_t n, double value, cudaStream_t stream);
// y[r, c] += bias[c] for y[rows, C] of dtype (bias f32).
void addBias(DType dtype, void* y, const float* bias, int64_t rows, int64_t channels, cudaStream_t stream);
// dBias[c] += sum_r dy[r, c] (f32 accumulation); partial is batchNormScratchFloats(rows, C) floats.
void accumulateBiasGrad(DType dtype, const void* dy, float* dBias, int64_t rows, int64_t channels, float* partial,
                        cudaStream_t stream);
// a[i] += weight * (b[i] - a[i]) in PyTorch's two forms (weight 1 copies b exactly), f32.
void lerp(float* a, const float* b, int64_t n, float weight, cudaStream_t stream);
// dst[i] += src[i], src of dtype, dst f32 (accumulating low-precision weight gradients).
void accumulateF32(DType srcType, const void* src, float* dst, int64_t n, cudaStream_t stream);
// dst[n,h,w,c] = (src[n,h,w,c] / 255 - mean[c]) / std[c], sample i mirrored when flip[i] != 0
// (flip may be null). meanStd is a device array of 2*C floats: C means then C stds. C <= 16.
void convertInput(const uint8_t* src, DType dstType, void* dst, const uint8_t* flip, const float* meanStd, int64_t n,
                  int64_t h, int64_t w, int64_t c, cudaStream_t stream);

// ---- pool.cu -----------------------------------------------------------------------------------
// NHWC pooling in floor mode. Max pooling writes the argmax (int32 index of the input element
// within its sample's H*W plane, per channel) to `argmax` (n*oh*ow*c int32) and backward scatters
// through it: each input element sums, in f32 and in a fixed order, the dy of the outputs whose
// window covers it and chose it (no atomics). Average pooling counts padding (PyTorch's
// count_include_pad).
void maxPoolForward(DType dtype, const void* x, void* y, int32_t* argmax, int64_t n, int64_t h, int64_t w, int64_t c,
                    int64_t oh, int64_t ow, int kh, int kw, int sh, int sw, int ph, int pw, cudaStream_t stream);
void maxPoolBackward(DType dtype, const void* dy, void* dx, const int32_t* argmax, int64_t n, int64_t h, int64_t w,
                     int64_t c, int64_t oh, int64_t ow, int kh, int kw, int sh, int sw, int ph, int pw,
                     cudaStream_t stream);
void avgPoolForward(DType dtype, const void* x, void* y, int64_t n, int64_t h, int64_t w, int64_t c, int64_t oh,
                    int64_t ow, int kh, int kw, int sh, int sw, int ph, int pw, cudaStream_t stream);
void avgPoolBackward(DType dtype, const void* dy, void* dx, int64_t n, int64_t h, int64_t w, int64_t c, int64_t oh,
                     int64_t ow, int kh, int kw, int sh, int sw, int ph, int pw, cudaStream_t stream);

// ---- loss.cu -----------------------------------------------------------------------------------
// Mean softmax cross-entropy with label smoothing over logits[n, k]; loss is one f32 on the device;
// dLogits (may be null) = gradScale * (softmax - q) / n, q = (1-s) onehot + s/k, with gradScale
// read from gradScaleFrom (device f32, may be null) when given. A label outside [0, k) sets
// *invalidLabel = 1 (device int32, may be null) and contributes nothing.
void crossEntropy(DType dtype, const void* logits, const int32_t* labels, float* loss, void* dLogits, int64_t n,
                  int64_t k, float labelSmoothing, float gradScale, const float* gradScaleFrom, int32_t* invalidLabel,
                  float* partial, cudaStream_t stream);

// Knowledge distillation's loss and gradient (semantics in core/backend.h, DistillationArgs), with
// the same grid, label flag and partial buffer as crossEntropy.
struct DistillationParams {
  float temperature, alpha, labelSmoothing, gradScale;
};
void distillationLoss(DType dtype, const void* logits, const void* teacherLogits, const int32_t* labels, float* loss,
                      void* dLogits, int64_t n, int64_t k, DistillationParams params, int32_t* invalidLabel,
                      float* partial, cudaStream_t stream);

// ---- sgd.cu ------------------------------------------------------------------------------------
struct SgdGroupParams {
  float lr, momentum, dampening, weightDecay;
  int32_t nesterov;
};
// One multi-tensor SGD step (torch.optim.SGD semantics) over `segmentCount` device-resident
// (offset, count, group) int64 triples; `groups` is a device array. Skipped entirely (on the
// device, no host sync) when foundInf is non-null and *foundInf != 0. grads are scaled by
// gradScaleInv first. momentumBuffer may be null when no group uses momentum.
void sgdStep(float* params, const float* grads, float* momentumBuffer, const int64_t* segments, int64_t segmentCount,
             int64_t totalElements, const SgdGroupParams* groups, bool firstStep, const float* foundInf,
             float gradScaleInv, cudaStream_t stream);

// ---- optim.cu ----------------------------------------------------------------------------------
// AdamW, LAMB, the gradient norm, GradScaler's unscale-and-check and scale update, and gradient
// clipping, over arena segments (semantics in core/backend.h). The segment table is a device
// array of `segmentCount` int64 quadruples (offset, count, group, firstChunk) of non-empty
// segments, where firstChunk is the number of kOptimChunk-element chunks in the segments before
// it and `chunkCount` is their total (optimChunkCount). Blocks take whole chunks; a reduction
// leaves one partial per chunk, and a second kernel adds the partials in chunk order, so results
// are deterministic (no float atomics) and independent of the device. Steps are skipped on the
// device when foundInf is non-null and *foundInf != 0.
constexpr int64_t kOptimChunk = 4096;
// The chunks of a segment of `count` elements.
constexpr int64_t optimChunkCount(int64_t count) { return (count + kOptimChunk - 1) / kOptimChunk; }
// Groups the AdamW and LAMB kernels accept (their per-step coefficients live in shared memory).
constexpr int64_t kMaxOptimGroups = 512;

struct AdamGroupParams {
  float lr, beta1, beta2, eps, weightDecay;
  int32_t alwaysAdapt;
};
// `step` is t >= 1; the bias corrections 1 - beta^t are computed in double on the device. With
// `stepCount` (device i32, may be null) the step first adds one to it, unless *foundInf is set, and
// t is read from it instead (a captured step).
void adamwStep(float* params, const float* grads, float* expAvg, float* expAvgSq, const int64_t* segments,
               int64_t segmentCount, int64_t chunkCount, const AdamGroupParams* groups, int64_t groupCount,
               int64_t step, int32_t* stepCount, const float* foundInf, float gradScaleInv, cudaStream_t stream);
// Bytes of scratch lambStep needs: per-chunk partial norms and per-segment trust ratios.
size_t lambScratchBytes(int64_t segmentCount, int64_t chunkCount);
void lambStep(float* params, const float* grads, float* expAvg, float* expAvgSq, const int64_t* segments,
              int64_t segmentCount, int64_t chunkCount, const AdamGroupParams* groups, int64_t groupCount, int64_t step,
              int32_t* stepCount, const float* foundInf, float gradScaleInv, void* scratch, cudaStream_t stream);
// LAMB's per-segment trust ratios (lambStep's second pass) from the per-chunk partial sums of p^2 and
// u^2 at partial[2 * chunk + {0, 1}]; nothing when *foundInf is set.
void lambTrustRatios(const int64_t* segments, int64_t segmentCount, const AdamGroupParams* groups,
                     const float* foundInf, const double* partial, float* ratio, cudaStream_t stream);
// Bytes of scratch gradNorm needs: one partial sum per chunk.
size_t gradNormScratchBytes(int64_t chunkCount);
// *out = sqrt(sum g^2) over the segments; *foundInf = 1 (if non-null) when an element is inf/NaN.
void gradNorm(const float* grads, const int64_t* segments, int64_t segmentCount, int64_t chunkCount, float* out,
              float* foundInf, void* scratch, cudaStream_t stream);
// grads *= invScale over the segments, invScale = (float)(1.0 / *scale) when `scale` (device f32,
// may be null) is given; *foundInf = 1 when an element was inf/NaN (never cleared).
void unscaleAndCheck(float* grads, const int64_t* segments, int64_t segmentCount, int64_t chunkCount, float invScale,
                     const float* scale, float* foundInf, cudaStream_t stream);
// grads *= min(1, maxNorm / (*norm + 1e-6)) over the segments, the norm read on the device.
void clipGradNorm(float* grads, const int64_t* segments, int64_t segmentCount, int64_t chunkCount, const float* norm,
                  float maxNorm, cudaStream_t stream);
// PyTorch's _amp_update_scale_ in one thread.
void scalerUpdate(float* scale, int32_t* growthTracker, const float* foundInf, float growthFactor, float backoffFactor,
                  int32_t growthInterval, cudaStream_t stream);

// ---- fused_optim.cu ----------------------------------------------------------------------------
// The GradScaler's scale-update settings (ScalerUpdateArgs in core/backend.h).
struct FusedScalerParams {
  float growthFactor, backoffFactor;
  int32_t growthInterval;
};
// FusedStepEnd (core/backend.h) as the fused kernels take it. foundInf may be null (no scaler:
// then checkFinite and scaleFromDevice are false); scale null: no scale update.
struct FusedEnd {
  float* foundInf;
  bool checkFinite, zeroGrads;
  float invScale;        // the unscale factor, unless scaleFromDevice
  bool scaleFromDevice;  // invScale = (float)(1.0 / *scale) as the step starts
  float* scale;
  int32_t* growthTracker;
  FusedScalerParams scaler;
};
// Bytes of scratch the fused steps need: the values their first pass reads on the device, and for
// LAMB the partial norms and trust ratios.
size_t fusedStepScratchBytes(int64_t segmentCount, int64_t chunkCount, bool lamb);
// The fused steps over optim.cu's segment table (offset, count, group, firstChunk; groups index
// `groups`). A first, read-only pass runs when there is something to read on the device before any
// parameter moves: the check (raising *foundInf on an inf/NaN gradient), the scale
// (scaleFromDevice) or the step count. Then the update reads each gradient once as grad *
// invScale (skipped when *foundInf is set), zeroes it when zeroGrads, and the scale update and the
// step count's advance happen in the last pass. No host sync, no allocation.
// SGD (FusedSgdArgs): two launches at most.
void fusedSgdStep(float* params, float* grads, float* momentumBuffer, const int64_t* segments, int64_t segmentCount,
                  int64_t chunkCount, const SgdGroupParams* groups, bool firstStep, const FusedEnd& end, void* scratch,
                  cudaStream_t stream);
// AdamW (two launches at most) and LAMB (moments and norms, trust ratios, update: four at most)
// (FusedAdamWArgs). With `stepCount` (device i32, may be null) t is one more than its value as the
// step starts, and it advances by one unless the step is skipped; otherwise t is `step`.
void fusedAdamStep(bool lamb, float* params, float* grads, float* expAvg, float* expAvgSq, const int64_t* segments,
                   int64_t segmentCount, int64_t chunkCount, const AdamGroupParams* groups, int64_t groupCount,
                   int64_t step, int32_t* stepCount, const FusedEnd& end, void* scratch, cudaStream_t stream);

}  // namespace rc::cuda
