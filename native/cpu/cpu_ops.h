// CPU op entry points: plans on oneDNN, element-wise and reduction kernels of our own (OpenMP).
#pragma once

#include "cpu_context.h"

namespace rc::cpu {

std::unique_ptr<Conv2dPlan> createConv2dPlan(CpuContext& ctx, const Conv2dParams& params);
std::unique_ptr<LinearPlan> createLinearPlan(CpuContext& ctx, const LinearParams& params);
std::unique_ptr<Pool2dPlan> createPool2dPlan(CpuContext& ctx, const Pool2dParams& params);
std::unique_ptr<InferencePlan> buildInferencePlan(CpuContext& ctx, const InferencePlanParams& params);
// The INT8 plan (params.int8): quantized nodes on oneDNN int8 primitives, the others in f32.
std::unique_ptr<InferencePlan> buildInt8InferencePlan(CpuContext& ctx, const InferencePlanParams& params);

void batchNormForward(const BatchNormForwardArgs& args);
void batchNormBackward(const BatchNormBackwardArgs& args);
void syncBatchNormStats(const SyncBatchNormStatsArgs& args);
void syncBatchNormForward(const SyncBatchNormForwardArgs& args);
void syncBatchNormBackwardReduce(const SyncBatchNormBackwardReduceArgs& args);
void syncBatchNormBackwardElementwise(const SyncBatchNormBackwardElementwiseArgs& args);
void relu(const Tensor& x, const Tensor& y);
void reluBackward(const Tensor& y, const Tensor& dy, const Tensor& dx);
// out = a + b; out may alias a or b.
void add(const Tensor& a, const Tensor& b, const Tensor& out);
// out = a * b; out may alias a or b.
void mul(const Tensor& a, const Tensor& b, const Tensor& out);
void cast(const Tensor& src, const Tensor& dst);
void fill(const Tensor& t, double value);
void crossEntropy(const CrossEntropyArgs& args);
void distillationLoss(const DistillationArgs& args);
void sgdStep(const SgdArgs& args);
void convertInput(const ConvertInputArgs& args);
void adamwStep(const AdamWArgs& args);
void lambStep(const LambArgs& args);
void gradNorm(const GradNormArgs& args);
void unscaleAndCheck(const UnscaleArgs& args);
void clipGradNorm(const ClipGradNormArgs& args);
void scalerUpdate(const ScalerUpdateArgs& args);
void lerp(const LerpArgs& args);
// Quantization-aware training (fake_quant.cc).
void fakeQuantize(const FakeQuantizeArgs& args);
void fakeQuantizeBackward(const FakeQuantizeBackwardArgs& args);
void absMaxScale(const AbsMaxScaleArgs& args);
void observeMinMax(const ObserveMinMaxArgs& args);

}  // namespace rc::cpu
