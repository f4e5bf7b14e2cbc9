// The op interface every backend implements. Heavy ops are plans, created once per
// (op, shapes, dtype, device) and executed every step; they hold descriptors, the chosen
// algorithm and workspace. Light ops are methods taking one argument struct.
//
// Conventions, shared by all backends:
// - activations are NHWC and contiguous; "rows" below means the product of all but the last dim;
// - weights are f32 master copies (conv: [K,R,S,C] = OHWI; linear: [out,in]); a plan given f32
//   weights and a lower-precision compute dtype converts them itself;
// - parameter gradients are f32 and are accumulated into (+=), as in PyTorch; zero them to reset;
// - BN parameters, running statistics and saved statistics are f32 whatever the activation dtype;
// - nothing here synchronises with the host unless its name says so.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "../image/resample.h"
#include "allocator.h"
#include "inference_plan.h"
#include "tcp_store.h"
#include "tensor.h"

namespace rc {

// The output size of a convolution or pooling window along one axis, PyTorch's formula with the
// division floored: 0 or less when the window does not fit the padded input. The one definition of
// it: the plans use it, and so does the TypeScript layer (through the addon) for its messages.
inline int64_t windowOutputSize(int64_t size, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = size + 2 * pad - dilation * (kernel - 1) - 1;
  const int64_t steps = span >= 0 ? span / stride : -((-span + stride - 1) / stride);
  return steps + 1;
}

struct Conv2dParams {
  int64_t n = 0, h = 0, w = 0, c = 0;       // input NHWC
  int64_t k = 0, kernelH = 0, kernelW = 0;  // output channels, kernel height and width
  int64_t strideH = 1, strideW = 1, padH = 0, padW = 0, dilationH = 1, dilationW = 1;
  DType dtype = DType::F32;  // activation and compute type
  bool bias = false;
  int64_t outH() const { return windowOutputSize(h, kernelH, strideH, padH, dilationH); }
  int64_t outW() const { return windowOutputSize(w, kernelW, strideW, padW, dilationW); }
  std::string str() const;
};

class Conv2dPlan {
 public:
  virtual ~Conv2dPlan() = default;
  // y[n,oh,ow,k] = conv(x[n,h,w,c], weight[k,r,s,c]) + bias[k]; bias may be undefined.
  virtual void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y) = 0;
  // dx = conv_transpose(dy, weight); overwrites dx.
  virtual void backwardData(const Tensor& dy, const Tensor& weight, const Tensor& dx) = 0;
  // dx += conv_transpose(dy, weight): a block's input gradient added into its shortcut's in the
  // same pass where the backend can (a residual block's add without a pass of its own).
  virtual void backwardDataAccumulate(const Tensor& dy, const Tensor& weight, const Tensor& dx) = 0;
  // dWeight += dL/dweight, dBias += sum(dy) (dBias may be undefined).
  virtual void backwardWeights(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& dBias) = 0;
  // The implementation chosen, for logs and benchmarks ("jit:avx512_core", "cudnn:IMPLICIT_GEMM").
  virtual std::string implementation() const = 0;
};

struct LinearParams {
  int64_t n = 0, in = 0, out = 0;
  DType dtype = DType::F32;
  bool bias = true;
  std::string str() const;
};

class LinearPlan {
 public:
  virtual ~LinearPlan() = default;
  // y[n,out] = x[n,in] weight[out,in]^T + bias[out]
  virtual void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y) = 0;
  virtual void backwardData(const Tensor& dy, const Tensor& weight, const Tensor& dx) = 0;
  virtual void backwardWeights(const Tensor& x, const Tensor& dy, const Tensor& dWeight, const Tensor& dBias) = 0;
};

enum class PoolKind : int { Max = 0, Avg = 1 };

struct Pool2dParams {
  PoolKind kind = PoolKind::Max;
  int64_t n = 0, h = 0, w = 0, c = 0;
  int64_t kernelH = 1, kernelW = 1, strideH = 1, strideW = 1, padH = 0, padW = 0;
  DType dtype = DType::F32;
  int64_t outH() const { return windowOutputSize(h, kernelH, strideH, padH, 1); }
  int64_t outW() const { return windowOutputSize(w, kernelW, strideW, padW, 1); }
  std::string str() const;
};

class Pool2dPlan {
 public:
  virtual ~Pool2dPlan() = default;
  // Bytes of workspace that forward writes and backward reads (argmax for max pooling); may be 0.
  virtual size_t workspaceBytes() const = 0;
  virtual void forward(const Tensor& x, const Tensor& y, const Tensor& workspace) = 0;
  virtual void backward(const Tensor& dy, const Tensor& dx, const Tensor& workspace) = 0;
};

// Batch normalisation over all rows of x (N*H*W for NHWC), per channel (the last dim), with an
// optional residual added before an optional ReLU: y = relu(bn(x) + residual).
struct BatchNormForwardArgs {
  Tensor x, gamma, beta, residual, y;
  Tensor runningMean, runningVar;  // f32[C]; updated in training (unbiased variance, as PyTorch)
  Tensor saveMean, saveInvStd;     // f32[C]; written in training, read by backward
  bool training = true;
  bool relu = false;
  float momentum = 0.1f;
  float eps = 1e-5f;
};

struct BatchNormBackwardArgs {
  Tensor x, y, dy, gamma, saveMean, saveInvStd;
  // Optional f32[C], the forward's beta. With a ReLU and no residual, a backend may then recompute
  // the ReLU's output from x, gamma, beta and the saved statistics, as the forward computed it,
  // instead of reading y (the CPU does); y must be that forward's output.
  Tensor beta;
  Tensor dx;             // overwritten
  Tensor dGamma, dBeta;  // f32[C], accumulated
  Tensor dResidual;      // overwritten with the gradient reaching the residual, if defined
  bool relu = false;     // y is the ReLU output and masks dy
  // false: the forward normalised with running statistics (saved by the inference forward), which
  // are constants, so dx = dy * gamma * invStd without the batch-mean terms (PyTorch's eval mode).
  bool training = true;
};

// Dual batch norm: the tail of a downsample block, y = relu?(bn_a(a.x) + bn_b(b.x)) with both
// batch norms applied to raw inputs (the main branch's and the shortcut's convolution outputs), in
// one pass over a.x and b.x that writes y alone. Each side has its own parameters, statistics,
// momentum and eps, with BatchNormForwardArgs' meanings; both sides are in `training` mode or
// neither. CUDA only (the default throws ERR_RC_BACKEND_UNAVAILABLE).
struct DualBatchNormSide {
  Tensor x, gamma, beta;
  Tensor runningMean, runningVar;  // f32[C]; updated in training
  Tensor saveMean, saveInvStd;     // f32[C]; written in training (and in inference when defined)
  float momentum = 0.1f;
  float eps = 1e-5f;
};

struct DualBatchNormForwardArgs {
  DualBatchNormSide a, b;
  Tensor y;
  bool training = true;
  bool relu = false;
};

// One side of the dual backward: dGamma/dBeta accumulated, dx overwritten.
struct DualBatchNormGradSide {
  Tensor x, gamma, saveMean, saveInvStd;
  Tensor dx, dGamma, dBeta;
};

// The gradient reaching both batch norms is dy masked by the ReLU (y the forward's output); each
// side's gradients are then batchNormBackward's with that gradient (training: through the batch
// statistics; false: the saved statistics were the running ones, constants).
struct DualBatchNormBackwardArgs {
  DualBatchNormGradSide a, b;
  Tensor y, dy;
  bool relu = false;
  bool training = true;
};

// SyncBatchNorm: batch normalisation whose statistics span the batches of several processes, as
// four ops with collectives between them (the caller runs those):
//   1. syncBatchNormStats: this rank's per-channel count, mean and M2 (the sum of squared
//      deviations from that mean); the ranks all-gather them;
//   2. syncBatchNormForward: merges every rank's (count, mean, M2) in double (Chan et al.'s
//      pairwise update, so neither large means nor millions of rows lose precision, unlike sums of
//      squares in f32), normalises this rank's rows as batchNormForward does and updates the
//      running statistics with the global mean and unbiased variance;
//   3. syncBatchNormBackwardReduce: this rank's per-channel sum(g) and sum(g * xhat) (g = dy masked
//      by the fused ReLU) and its row count, and the local dGamma/dBeta; the ranks all-reduce (sum)
//      the three rows;
//   4. syncBatchNormBackwardElementwise: dx (and dResidual) from the global sums and count.
struct SyncBatchNormStatsArgs {
  Tensor x;      // [..., C] f32/bf16/f16 (NHWC)
  Tensor stats;  // f32[3, C], overwritten: count, mean, M2 per channel
};

struct SyncBatchNormForwardArgs {
  Tensor x, gamma, beta, residual, y;
  Tensor stats;                    // f32[W, 3, C]: every rank's syncBatchNormStats, rank after rank
  Tensor runningMean, runningVar;  // f32[C]; updated with the global statistics
  Tensor saveMean, saveInvStd;     // f32[C]; written (global), read by the backward ops
  bool relu = false;
  float momentum = 0.1f;
  float eps = 1e-5f;
};

struct SyncBatchNormBackwardReduceArgs {
  Tensor x, y, dy, saveMean, saveInvStd;
  Tensor sums;           // f32[3, C], overwritten: sum(g), sum(g * xhat), this rank's row count
  Tensor dGamma, dBeta;  // f32[C], accumulated with this rank's sum(g * xhat) and sum(g)
  bool relu = false;     // y is the ReLU output and masks dy
};

struct SyncBatchNormBackwardElementwiseArgs {
  Tensor x, y, dy, gamma, saveMean, saveInvStd;
  Tensor sums;       // f32[3, C]: syncBatchNormBackwardReduce's sums, summed over the ranks
  Tensor dx;         // overwritten
  Tensor dResidual;  // overwritten with the gradient reaching the residual, if defined
  bool relu = false;
};

struct CrossEntropyArgs {
  Tensor logits;   // [N, K] f32/bf16/f16
  Tensor labels;   // i32[N]
  Tensor loss;     // f32[1]: mean over the batch
  Tensor dLogits;  // same shape/dtype as logits, overwritten; may be undefined
  float labelSmoothing = 0.0f;
  float gradScale = 1.0f;  // dLogits = gradScale * dLoss/dLogits (loss scaling, accumulation)
  // f32[1] on the op's device, optional: when given, its value (read by the kernel when it runs)
  // replaces gradScale, so that a captured CUDA graph scales by a GradScaler's current scale.
  Tensor gradScaleFrom;
};

// Knowledge distillation (Hinton et al. 2015, arXiv:1503.02531): per row, with ps = softmax(s/T),
// pt = softmax(t/T) and CE the smoothed cross-entropy above,
//   loss_i = alpha * T^2 * KL(pt || ps) + (1 - alpha) * CE(s, label),
// and the loss is the mean over the N rows (torch's KLDivLoss reduction='batchmean'). A class of
// pt = 0 adds nothing to the KL sum (torch's xlogy). The gradient with respect to s:
//   dLogits = gradScale / N * (alpha * T * (ps - pt) + (1 - alpha) * (softmax(s) - q)).
// The teacher's logits t are constants (they get no gradient).
struct DistillationArgs {
  Tensor logits;             // student [N, K] f32/bf16/f16
  Tensor teacherLogits;      // teacher, same shape and dtype
  Tensor labels;             // i32[N]
  Tensor loss;               // f32[1]
  Tensor dLogits;            // same shape/dtype as logits, overwritten; may be undefined
  float temperature = 1.0f;  // > 0
  float alpha = 0.5f;        // in [0, 1]
  float labelSmoothing = 0.0f;
  float gradScale = 1.0f;
};

struct SgdGroup {
  float lr = 0.1f, momentum = 0.0f, dampening = 0.0f, weightDecay = 0.0f;
  bool nesterov = false;
};

struct ArenaSegment {
  int64_t offset = 0, count = 0;
  int32_t group = 0;
};

// One multi-tensor SGD step over segments of the flat f32 parameter arena, with PyTorch's
// semantics. If `foundInf` (f32[1]) is defined and non-zero the step is skipped; grads are
// multiplied by `gradScaleInv` first (GradScaler unscale).
struct SgdArgs {
  Tensor params, grads, momentumBuffer;
  std::vector<SgdGroup> groups;
  std::vector<ArenaSegment> segments;
  bool firstStep = false;  // momentum buffers start as the first gradient
  Tensor foundInf;
  float gradScaleInv = 1.0f;
  // Send the group and segment tables to the device and launch nothing: a captured step reads
  // them when it is replayed, so the learning rate of each replay is the one sent last.
  bool tablesOnly = false;
};

struct ScalerUpdateArgs;

// What the fused optimizer ops (the "optim" fused path) do besides the update. Gradients are
// multiplied by the op's `gradScaleInv` as they are read (the GradScaler's unscale, without
// writing the unscaled gradients back). With `checkFinite`, `foundInf` (required) is set to 1
// when a gradient in the segments is inf or NaN, before any parameter moves, and the step is then
// skipped; foundInf is never cleared here. With `scaleFromDevice` (needs `scale` and
// `checkFinite`), the factor is instead (float)(1.0 / *scale) with the scale as it is when the op
// starts (UnscaleArgs::scale: a captured step). With `zeroGrads`, every gradient in the segments
// is 0 afterwards, the skipped step included. When `scale` (f32[1]) and `growthTracker` (i32[1])
// are defined, the GradScaler's scale update (ScalerUpdateArgs) follows, reading foundInf.
struct FusedStepEnd {
  bool checkFinite = false, zeroGrads = false, scaleFromDevice = false;
  Tensor scale, growthTracker;
  float growthFactor = 2.0f, backoffFactor = 0.5f;
  int64_t growthInterval = 2000;

  // The scaler update these settings describe with the op's found-inf flag (meaningful when
  // `scale` is defined).
  ScalerUpdateArgs scalerUpdate(const Tensor& foundInf) const;
};

// The optimizer end of a step in one op: an SGD step as SgdArgs with FusedStepEnd's work. The
// result equals unscaleAndCheck, sgdStep (gradScaleInv 1), scalerUpdate and zeroing in that
// order, which is what backends without a fused kernel run. tablesOnly sends the tables sgdStep
// sends (the same ones: the fused step reads them too).
struct FusedSgdArgs : SgdArgs, FusedStepEnd {};

// Per-group hyperparameters of AdamW and LAMB (the op receives them as f32).
struct AdamGroup {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weightDecay = 0.0f;
  // LAMB only. false: a group without weight decay takes the plain Adam step (trust ratio 1), as in
  // NVIDIA's FusedLAMB and timm's Lamb; true: the trust ratio applies whatever the weight decay
  // (timm's always_adapt). Ignored by AdamW.
  bool alwaysAdapt = false;
};

// One multi-tensor AdamW step (torch.optim.AdamW, amsgrad off) over segments of the flat f32
// parameter arena. Per element, with g = grad * gradScaleInv:
//   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// expAvg and expAvgSq start as zeros; `step` is t, 1 on the first step (the caller keeps the
// count, so that a skipped step can be taken again with the same t, as PyTorch never counts it).
// Skipped entirely when `foundInf` (f32[1]) is defined and non-zero, without a host sync on CUDA.
struct AdamWArgs {
  Tensor params, grads, expAvg, expAvgSq;
  std::vector<AdamGroup> groups;
  std::vector<ArenaSegment> segments;
  int64_t step = 1;
  Tensor foundInf;
  float gradScaleInv = 1.0f;
  // i32[1] on the op's device, optional: the steps taken, counted on the device. The op adds one
  // unless foundInf is set and uses the result as t instead of `step` (a captured CUDA graph,
  // whose skipped steps the host does not see).
  Tensor stepCount;
  // As SgdArgs::tablesOnly.
  bool tablesOnly = false;
};

// One LAMB step (You et al. 2019, as NVIDIA's FusedLAMB and timm's Lamb, bias correction on, no
// built-in gradient clipping): m and v as AdamW, then per element u = mhat / (sqrt(vhat) + eps)
// + wd*p, and per segment (one parameter tensor) r = ||p|| / ||u||, 1 when either norm is 0 or
// the group does not adapt (see AdamGroup::alwaysAdapt); p -= lr * r * u. The norms are
// reduced in a fixed order, so results are deterministic on every backend.
struct LambArgs : AdamWArgs {};

// AdamW's and LAMB's step with FusedStepEnd's work in one op (the "optim" fused path), equal to
// unscaleAndCheck, adamwStep or lambStep (gradScaleInv 1), scalerUpdate and zeroing in that order,
// which is what backends without a fused kernel run. A skipped step leaves `stepCount` as it was.
// tablesOnly sends the tables adamwStep or lambStep sends (the same ones).
struct FusedAdamWArgs : AdamWArgs, FusedStepEnd {};
struct FusedLambArgs : FusedAdamWArgs {};

// Global L2 norm sqrt(sum g^2) of `grads` (the segments listed, else all of it) into `out`
// (f32[1] on the device, deterministic). If `foundInf` (f32[1]) is defined it is set to 1 when an
// element is inf or NaN, and left as it was otherwise. Segment groups are ignored.
struct GradNormArgs {
  Tensor grads, out, foundInf;
  std::vector<ArenaSegment> segments;
};

// PyTorch's _amp_foreach_non_finite_check_and_unscale_: grads *= invScale in place (the segments
// listed, else all of `grads`), and foundInf (f32[1], required) is set to 1 when an element was
// inf or NaN. foundInf is never cleared here: zeroing it once per step is the caller's job.
struct UnscaleArgs {
  Tensor grads, foundInf;
  std::vector<ArenaSegment> segments;
  float invScale = 1.0f;
  // f32[1] on the op's device, optional: the scale, read when the op runs; invScale is then
  // (float)(1.0 / scale), as the host computes it (a captured CUDA graph).
  Tensor scale;
};

// torch.nn.utils.clip_grad_norm_'s scaling, with the total norm read on the device (no host
// sync): grads *= min(1, maxNorm / (norm + 1e-6)), computed in f32 (a NaN norm gives NaN grads,
// as in PyTorch). `norm` is f32[1], usually gradNorm's `out`.
struct ClipGradNormArgs {
  Tensor grads, norm;
  std::vector<ArenaSegment> segments;
  float maxNorm = 1.0f;
};

// PyTorch's _amp_update_scale_ on the device: if *foundInf != 0, scale *= backoffFactor and
// growthTracker = 0; else growthTracker += 1, and when it reaches growthInterval, scale *=
// growthFactor (unless that overflows f32) and growthTracker = 0. scale and foundInf are f32[1],
// growthTracker i32[1].
struct ScalerUpdateArgs {
  Tensor scale, growthTracker, foundInf;
  float growthFactor = 2.0f, backoffFactor = 0.5f;
  int64_t growthInterval = 2000;
};

inline ScalerUpdateArgs FusedStepEnd::scalerUpdate(const Tensor& foundInf) const {
  ScalerUpdateArgs u;
  u.scale = scale;
  u.growthTracker = growthTracker;
  u.foundInf = foundInf;
  u.growthFactor = growthFactor;
  u.backoffFactor = backoffFactor;
  u.growthInterval = growthInterval;
  return u;
}

// torch.lerp_ with a scalar weight, the step of weight averaging (_foreach_lerp_ in AveragedModel
// and EMA): a[i] += weight * (b[i] - a[i]) over f32 tensors of equal numel on one device, computed
// as PyTorch does (a + w * (b - a) for w < 0.5, else b - (b - a) * (1 - w)), so weight 1 copies b
// exactly. weight must be finite and in [0, 1].
struct LerpArgs {
  Tensor a, b;
  float weight = 1.0f;
};

// Fake quantization for quantization-aware training, zero point 0 (PyTorch's
// torch.fake_quantize_per_tensor_affine / _per_channel_affine with axis 0): y = clamp(rint(x / s),
// qmin, qmax) * s, rint rounding half to even (ONNX QuantizeLinear's rounding). `scale` is f32 on the
// device: f32[1] (per tensor) or f32[x.dim(0)] (per channel along dim 0, the output channel of an
// OHWI or [out, in] weight). x and y: the same shape and floating dtype; y may be x.
struct FakeQuantizeArgs {
  Tensor x, scale, y;
  int64_t qmin = -128, qmax = 127;
};

// The straight-through gradient of FakeQuantizeArgs: dx = dy where qmin <= rint(x / s) <= qmax, else
// 0 (PyTorch's fake_quantize backward mask). dx may be dy.
struct FakeQuantizeBackwardArgs {
  Tensor x, scale, dy, dx;
  int64_t qmin = -128, qmax = 127;
};

// Symmetric scales from the absolute maximum: scale[k] = max(max_i |x[k, i]| / qmax, eps) per channel
// along dim 0 (scale f32[x.dim(0)]), or over all of x (scale f32[1]); eps is f32's machine epsilon,
// PyTorch's floor for observer scales.
struct AbsMaxScaleArgs {
  Tensor x, scale;
  float qmax = 127.0f;
};

// PyTorch's MovingAverageMinMaxObserver, on the device: minMax (f32[2], running min and max) starts
// as (+inf, -inf) and takes the first batch's min and max; afterwards min += c * (batchMin - min)
// and likewise max. Then scale (f32[1]) = max(max(-min, max, 0) / qmax, eps), the symmetric scale
// (qmax 127 for s8, 255 for u8, whose inputs are non-negative).
struct ObserveMinMaxArgs {
  Tensor x, minMax, scale;
  float averagingConstant = 0.01f;
  float qmax = 127.0f;
};

// dst[n,h,w,c] = (src[n,h,w,c] / 255 - mean[c]) / std[c], with sample i mirrored left-right when
// flip[i] != 0 (flip may be undefined). src is u8; dst f32, bf16 or f16.
struct ConvertInputArgs {
  Tensor src, dst, flip;
  std::vector<float> mean, std;
};

// A collective-communication group over devices of one kind (NCCL on CUDA). Collectives are
// enqueued on the backend's stream in program order; errors and timeouts surface from
// `synchronize`, which aborts the group so that no rank is left waiting for a dead peer.
// How Communicator::allReduce combines the ranks' values. Avg is the sum divided by the number of
// ranks (truncated toward zero for integer types).
enum class ReduceOp { Sum, Avg, Max };

// What a communicator joins: NCCL ranks meet through the unique id that rank 0 created and published
// (Backend::createUniqueId); Gloo ranks exchange their addresses through the job's TCP store, under
// `storePrefix` so that several groups can share one store.
struct CommunicatorParams {
  std::string backend;      // "nccl" or "gloo"
  std::string uniqueId;     // nccl: the hex id from createUniqueId
  TcpStoreAddress store;    // gloo: the store served by rank 0
  std::string storePrefix;  // gloo: the group's key namespace in the store
  int rank = 0, worldSize = 1;
  double timeoutSeconds = 1800;  // joining, every collective and every wait
};

// One collective as a communicator's own thread ran it, on CLOCK_MONOTONIC in milliseconds (the
// clock of Node's process.hrtime).
struct CollectiveRecord {
  std::string op;  // allReduce, broadcast, allGather, barrier
  uint64_t bytes = 0;
  double enqueuedMs = 0, startMs = 0, endMs = 0;
};

// A group of ranks running collectives. Collectives are enqueued after the device work enqueued
// before them and run asynchronously (NCCL on a stream of its own, Gloo on a thread of its own):
// the caller must not touch a tensor given to one until waitOnDevice (device work) or synchronize
// (the host). Errors of an asynchronous collective are thrown by the next call; after an error the
// communicator is broken and every later call throws.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place reduction of `t` over all ranks.
  virtual void allReduce(const Tensor& t, ReduceOp op) = 0;
  // In-place copy of rank `root`'s `t` to every rank.
  virtual void broadcast(const Tensor& t, int root) = 0;
  // Every rank's `in` into `out` (size() times as many elements, same dtype), rank after rank.
  virtual void allGather(const Tensor& in, const Tensor& out) = 0;
  // Returns when every rank has reached it (and this rank's earlier collectives are done).
  virtual void barrier() = 0;
  // Makes device work enqueued from now on wait for the collectives enqueued so far; on the CPU,
  // whose ops run on the host, a host wait with the communicator's timeout.
  virtual void waitOnDevice() = 0;
  // Waits for the queued collectives; throws (and breaks the group) on error or after `timeoutSeconds`.
  virtual void synchronize(double timeoutSeconds) = 0;
  // The collectives finished since the last call (the latest 1024 at most), oldest first; empty
  // where collectives run on a device (NCCL).
  virtual std::vector<CollectiveRecord> takeRecords() { return {}; }
};

// A profiler's mark on the device's timeline (see Backend::profileMark).
struct ProfileMarkArgs {
  std::string push;  // non-empty: open an NVTX range of this name before the mark (an op begins)
  bool pop = false;  // close the innermost NVTX range after the mark (an op ends)
};

struct BackendInfo {
  std::string name;                                             // "cpu", "cuda"
  std::string device;                                           // "Intel(R) Xeon(R) ...", "NVIDIA H200"
  std::vector<std::pair<std::string, std::string>> properties;  // versions, ISA, capabilities
};

// The `conv-bn` fused path (CUDA, through cuDNN's graph API): a convolution that applies batch
// normalisation's affine map and a ReLU to its input as it loads it (the prologue, when scale and
// shift are defined) and writes the per-channel sum and sum of squares of its output (the
// epilogue, when sum and sqSum are defined):
//   y[n,p,q,k] = conv(prologue ? relu(x * scale[c] + shift[c]) : x, weight)   (no bias)
//   sum[k] = sum over n,p,q of y, sqSum[k] = sum over n,p,q of y^2           (f32)
// x and y NHWC in bf16 or f16; weight the f32 master [K,R,S,C] (or already in x's dtype).
struct ConvBnForwardArgs {
  Tensor x, weight, y;
  Tensor scale, shift;  // f32[C]
  Tensor sum, sqSum;    // f32[K], overwritten
  int64_t strideH = 1, strideW = 1, padH = 0, padW = 0, dilationH = 1, dilationW = 1;
};

// What batchNormForward in training computes besides y, from a convolution's statistics
// (ConvBnForwardArgs::sum, sqSum over `count` rows): saveMean, saveInvStd, the running statistics'
// update (when runningMean and runningVar are defined), and the affine map the next convolution's
// prologue applies: scale = gamma * invStd, shift = beta - mean * scale.
struct BatchNormFinalizeArgs {
  Tensor sum, sqSum, gamma, beta;             // f32[C]
  Tensor runningMean, runningVar;             // f32[C], updated
  Tensor saveMean, saveInvStd, scale, shift;  // f32[C], overwritten
  Tensor variance;                            // f32[C], the biased batch variance, when defined
  int64_t count = 0;
  float momentum = 0.1f;
  float eps = 1e-5f;
};

// The backward of the `conv-bn` prologue (CUDA, one cuDNN graph: dgrad, dReLU, the batch norm's
// backward weights). The forward was y = conv(relu(x * scale + shift), weight) with x the previous
// convolution's raw output and scale = gamma * invStd, shift = beta - mean * scale (a batch norm in
// training, then a ReLU); from dy it computes
//   dA = conv_backward_data(dy, weight)                                   (not written)
//   dz = dA where x * scale + shift > 0, else 0     (the gradient at the batch norm's output; the
//        graph recomputes x * scale + shift as (x - mean) * invStd * gamma + beta)
//   dGamma += sum(dz * (x - mean) * invStd), dBeta += sum(dz)            (sums over the N*H*W rows)
// and the per-channel coefficients of the batch norm's input gradient, which
// batchNormBackwardApply applies: dx = eqDz * dz + eqX * x + eqBias, with M = N*H*W,
//   eqDz = gamma * invStd, eqX = -gamma * invStd^3 * sum(dz * (x - mean)) / M,
//   eqBias = -eqX * mean - eqDz * sum(dz) / M.
// dy [N,P,Q,K], x and dz [N,H,W,C] NHWC in one dtype, bf16 or f16, 16-byte aligned, C and K
// multiples of 8; weight the f32 master [K,R,S,C] (or already in x's dtype); the rest f32[C].
struct ConvDgradDbnArgs {
  Tensor dy, weight, x;
  Tensor scale, shift, gamma, saveMean, saveInvStd;  // f32[C]
  Tensor dz;                                         // overwritten
  Tensor dGamma, dBeta;                              // f32[C], accumulated
  Tensor eqDz, eqX, eqBias;                          // f32[C], overwritten
  int64_t strideH = 1, strideW = 1, padH = 0, padW = 0, dilationH = 1, dilationW = 1;
};

// The batch norm's input gradient from convDgradDbn's coefficients (ConvDgradDbnArgs), per channel
// of NHWC tensors: dx = eqDz * dz + eqX * x + eqBias. dz, x and dx share shape and dtype; dx may be
// dz (in place).
struct BatchNormBackwardApplyArgs {
  Tensor dz, x, eqDz, eqX, eqBias;
  Tensor dx;  // overwritten
};

// The filter gradient of the `conv-bn` prologue's convolution (CUDA, one cuDNN graph): with the
// forward y = conv(relu(x * scale + shift), weight),
//   dWeight += conv_backward_filter(relu(x * scale + shift), dy)
// the normalised activation recomputed in f32 as the convolution loads x, never written. x [N,H,W,C]
// and dy [N,P,Q,K] NHWC in one dtype, bf16 or f16, 16-byte aligned, C and K multiples of 8;
// scale, shift f32[C]; dWeight the f32 master gradient [K,R,S,C], accumulated.
struct ConvWgradSbrArgs {
  Tensor x, dy, scale, shift;
  Tensor dWeight;
  int64_t strideH = 1, strideW = 1, padH = 0, padW = 0, dilationH = 1, dilationW = 1;
};

// One convolution shape of the `conv-bn` fused path, for convBnSupport: x [n, h, w, c] NHWC in
// dtype (bf16 or f16), k output channels, an r x s window; with `prologue`, the convolution also
// takes the scale-bias-ReLU prologue (and its backward).
struct ConvBnSupportArgs {
  int64_t n = 0, h = 0, w = 0, c = 0, k = 0, r = 1, s = 1;
  int64_t strideH = 1, strideW = 1, padH = 0, padW = 0, dilationH = 1, dilationW = 1;
  DType dtype = DType::BF16;
  bool prologue = false;
};

// convBnSupport's answer: whether cuDNN has an engine for every graph the shape needs and, when
// not, cuDNN's refusal (each engine's reason).
struct ConvBnSupport {
  bool ok = true;
  std::string reason;
};

// A device's utilisation and memory as the NVIDIA driver reports them (what nvidia-smi shows),
// read through NVML: `gpuPercent` is the share of the driver's last sample period (between 1/6 s
// and 1 s depending on the product) during which at least one kernel was running, `memoryPercent`
// the share during which device memory was read or written, and the memory figures count every
// process on the device. `available` is false, with the reason, where there is no such reading
// (the CPU, a driver without NVML, a device NVML cannot identify).
struct DeviceUtilization {
  bool available = false;
  std::string reason;
  unsigned gpuPercent = 0, memoryPercent = 0;
  uint64_t memoryUsedBytes = 0, memoryTotalBytes = 0;
};

// One image of a device JPEG decode (JpegDecoder::decode): the encoded bytes (host memory, read
// during the call only) and the crop, resize and window of the CPU decoder (rc::image::ResampleSpec,
// whose box is in pixels of the whole image), mirrored left to right when `mirror`.
struct JpegDecodeJob {
  const uint8_t* bytes = nullptr;
  size_t size = 0;
  // The image's size as the caller read it from the header (checked against the decoder's).
  int height = 0;
  int width = 0;
  image::ResampleSpec spec;
  bool mirror = false;
};

// JPEG decoding on the device (nvJPEG on CUDA), followed by the CPU decoder's resampling
// (rc::image::planResample's weights, the same integer arithmetic) in the backend's kernels. Work
// runs on the decoder's own stream, so that a batch is decoded while the backend's stream runs the
// previous step; `join` orders the backend's stream after the last decode.
class JpegDecoder {
 public:
  virtual ~JpegDecoder() = default;
  // Decodes jobs.size() JPEGs into dst, u8 [n, H, W, 3] on the backend's device, where H x W is
  // every job's window size; grey JPEGs are replicated to RGB. The writes into dst wait for the work
  // enqueued on the backend's stream before this call (which may still read dst's previous batch).
  // Throws rc::Error ERR_RC_CORRUPT_FILE naming the image's index when a JPEG does not decode.
  virtual void decode(const std::vector<JpegDecodeJob>& jobs, const Tensor& dst) = 0;
  // Makes the backend's stream wait for the last decode, without waiting on the host.
  virtual void join() = 0;
  // Waits on the host for the last decode, at most `timeoutSeconds` (then throws ERR_RC_DEVICE).
  virtual void synchronize(double timeoutSeconds) = 0;
  // The decoder's engine, for logs and benchmarks ("nvjpeg:hardware", "nvjpeg:hybrid").
  virtual std::string implementation() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual Allocator& allocator() = 0;
  virtual BackendInfo info() = 0;
  virtual bool supports(DType dtype) const = 0;

  Tensor empty(const Shape& shape, DType dtype);

  virtual std::unique_ptr<Conv2dPlan> createConv2d(const Conv2dParams& params) = 0;
  virtual std::unique_ptr<LinearPlan> createLinear(const LinearParams& params) = 0;
  virtual std::unique_ptr<Pool2dPlan> createPool2d(const Pool2dParams& params) = 0;
  // A whole network for inference (see inference_plan.h); the weights are laid out once, here.
  virtual std::unique_ptr<InferencePlan> createInferencePlan(const InferencePlanParams& params) = 0;

  virtual void batchNormForward(const BatchNormForwardArgs& args) = 0;
  virtual void batchNormBackward(const BatchNormBackwardArgs& args) = 0;
  virtual void syncBatchNormStats(const SyncBatchNormStatsArgs& args) = 0;
  virtual void syncBatchNormForward(const SyncBatchNormForwardArgs& args) = 0;
  virtual void syncBatchNormBackwardReduce(const SyncBatchNormBackwardReduceArgs& args) = 0;
  virtual void syncBatchNormBackwardElementwise(const SyncBatchNormBackwardElementwiseArgs& args) = 0;
  // The dual batch norm of a downsample block (DualBatchNormForwardArgs); the default throws.
  virtual void dualBatchNormForward(const DualBatchNormForwardArgs& args);
  virtual void dualBatchNormBackward(const DualBatchNormBackwardArgs& args);
  virtual void relu(const Tensor& x, const Tensor& y) = 0;
  virtual void reluBackward(const Tensor& y, const Tensor& dy, const Tensor& dx) = 0;
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out = a * b element-wise; out may be a (in place), as the pruning masks use it.
  virtual void mul(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  virtual void cast(const Tensor& src, const Tensor& dst) = 0;
  virtual void fill(const Tensor& t, double value) = 0;
  virtual void crossEntropy(const CrossEntropyArgs& args) = 0;
  virtual void distillationLoss(const DistillationArgs& args) = 0;
  virtual void sgdStep(const SgdArgs& args) = 0;
  // The fused optimizer end of a step (FusedSgdArgs, FusedAdamWArgs, FusedLambArgs); the defaults
  // run the unfused ops in order.
  virtual void fusedSgdStep(const FusedSgdArgs& args);
  virtual void fusedAdamwStep(const FusedAdamWArgs& args);
  virtual void fusedLambStep(const FusedLambArgs& args);
  // The `conv-bn` fused path (ConvBnForwardArgs, BatchNormFinalizeArgs). The defaults throw
  // ERR_RC_BACKEND_UNAVAILABLE: only the CUDA backend has cuDNN's graph API.
  virtual void convBnForward(const ConvBnForwardArgs& args);
  virtual void batchNormFinalize(const BatchNormFinalizeArgs& args);
  // The conv-bn prologue's backward (ConvDgradDbnArgs, BatchNormBackwardApplyArgs); the defaults
  // throw ERR_RC_BACKEND_UNAVAILABLE as above.
  virtual void convDgradDbn(const ConvDgradDbnArgs& args);
  virtual void batchNormBackwardApply(const BatchNormBackwardApplyArgs& args);
  virtual void convWgradSbr(const ConvWgradSbrArgs& args);
  // Whether the `conv-bn` ops accept one shape (ConvBnSupportArgs), known before the shape runs:
  // builds the execution plans the shape needs (the forward with the statistics epilogue; with
  // `prologue`, the forward with the prologue too, convDgradDbn's and convWgradSbr's) and keeps
  // them, or the refusal, so that nothing is built twice. A refusal is the answer, not an error.
  // The default throws ERR_RC_BACKEND_UNAVAILABLE as above.
  virtual ConvBnSupport convBnSupport(const ConvBnSupportArgs& args);
  virtual void convertInput(const ConvertInputArgs& args) = 0;
  // Optimizers and mixed-precision support over the parameter arena (see the argument structs).
  virtual void adamwStep(const AdamWArgs& args) = 0;
  virtual void lambStep(const LambArgs& args) = 0;
  virtual void gradNorm(const GradNormArgs& args) = 0;
  virtual void unscaleAndCheck(const UnscaleArgs& args) = 0;
  virtual void clipGradNorm(const ClipGradNormArgs& args) = 0;
  virtual void scalerUpdate(const ScalerUpdateArgs& args) = 0;
  virtual void lerp(const LerpArgs& args) = 0;
  // Quantization-aware training (see the argument structs).
  virtual void fakeQuantize(const FakeQuantizeArgs& args) = 0;
  virtual void fakeQuantizeBackward(const FakeQuantizeBackwardArgs& args) = 0;
  virtual void absMaxScale(const AbsMaxScaleArgs& args) = 0;
  virtual void observeMinMax(const ObserveMinMaxArgs& args) = 0;

  // CUDA graphs: everything enqueued between beginCapture and endCapture is recorded, not run;
  // replay runs it again with the same buffers. Backends without graphs throw.
  virtual void beginCapture() = 0;
  virtual int64_t endCapture() = 0;
  virtual void replay(int64_t graph) = 0;
  virtual void destroyGraph(int64_t graph) = 0;

  // Collectives: NCCL's rank 0 creates the unique id and publishes it; every rank then joins.
  // Backends that cannot run params.backend throw code::kBackendUnavailable.
  virtual std::string createUniqueId() = 0;
  virtual std::unique_ptr<Communicator> createCommunicator(const CommunicatorParams& params) = 0;

  // Per-op timing for the profiler, on the device's own clock and without host synchronisation:
  // profileMark records a mark (a CUDA event) on the stream after the work enqueued so far, and
  // opens or closes an NVTX range named after the op so that Nsight Systems shows it; it returns
  // the mark's index in the current window. profileRead waits once for the window's last mark and
  // returns each mark's time in milliseconds after the first one, then starts a new window (the
  // events are kept and reused). Neither may run during graph capture. Backends whose ops run
  // synchronously on the host (the CPU) have no device timeline and throw: time them on the host.
  virtual int64_t profileMark(const ProfileMarkArgs& args) = 0;
  virtual std::vector<double> profileRead() = 0;

  // A JPEG decoder on this device (see JpegDecoder). The default throws
  // ERR_RC_BACKEND_UNAVAILABLE: only the CUDA backend decodes on its device.
  virtual std::unique_ptr<JpegDecoder> createJpegDecoder();

  virtual void copyFromHost(const void* src, size_t bytes, const Tensor& dst) = 0;
  virtual void copyToHost(const Tensor& src, void* dst, size_t bytes) = 0;
  // Same-device copy of equal shapes and dtypes.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  virtual void synchronize() = 0;
  // The driver's utilisation reading of this device (host-side, no device synchronisation); never
  // throws for a missing library or an unsupported device (see DeviceUtilization).
  virtual DeviceUtilization utilization() = 0;
};

}  // namespace rc
