// The CUDA backend: cuDNN/cuBLAS plans and our own kernels behind the common Backend interface,
// every op enqueued on one stream per device; CUDA graph capture and replay; NCCL collectives.
// The addon opens this library on demand through the two C entry points at the end.
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "cuda_check.h"
#include "cuda_ops.h"
#include "fused_conv.h"
#include "fused_conv_wgrad.h"
#include "fused_dgrad.h"
#include "jpeg_decoder.h"
#include "kernels.h"
#include "nvml_monitor.h"
#include "profile_timeline.h"

namespace rc::cuda {

namespace {

// Must equal the addon's (native/napi/registry.cc); 2 added the optimizer and AMP ops, 3 lerp, 4 the checks
// moved into the addon's core (a library of ABI 4 trusts its caller to have checked the arguments), 5 mul,
// the driver's utilisation reading (NVML), the profiler's timing marks and the distillation loss, 6 the
// inference plan and the quantization-aware training ops (fakeQuantize, fakeQuantizeBackward,
// absMaxScale, observeMinMax), 7 the generalised communicator (CommunicatorParams, reduce ops,
// allGather, barrier, waitOnDevice), 8 the SyncBatchNorm ops (syncBatchNormStats, syncBatchNormForward,
// syncBatchNormBackwardReduce, syncBatchNormBackwardElementwise), 9 the values a captured training
// step reads on the device (CrossEntropyArgs::gradScaleFrom, UnscaleArgs::scale, AdamWArgs::stepCount)
// and the optimizers' tablesOnly, and the device JPEG decoder (createJpegDecoder), and fusedSgdStep, 10 the
// fused AdamW and LAMB steps (fusedAdamwStep, fusedLambStep) and FusedStepEnd (scaleFromDevice), and the
// dual batch norm (dualBatchNormForward, dualBatchNormBackward); the conv-bn fused path
// (convBnForward, batchNormFinalize), 11 the conv-bn prologue's backward (convDgradDbn,
// batchNormBackwardApply, convWgradSbr) and convBnSupport.
constexpr int kBackendAbi = 11;

std::string versionString(int packed, int majorDiv, int minorDiv, int minorMod) {
  std::ostringstream out;
  out << packed / majorDiv << "." << (packed / minorDiv) % minorMod;
  return out.str();
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device)
      : ctx_(device), monitor_(device), timeline_(ctx_), convBn_(ctx_), dgradDbn_(ctx_), wgradSbr_(ctx_) {}

  ~CudaBackend() override {
    for (auto& [id, exec] : graphs_) cudaGraphExecDestroy(exec);
  }

  Device device() const override { return ctx_.rcDevice(); }
  Allocator& allocator() override { return ctx_.allocator(); }
  bool supports(DType) const override { return true; }

  BackendInfo info() override {
    DeviceGuard guard(ctx_.device());
    cudaDeviceProp prop{};
    RC_CUDA_CHECK(cudaGetDeviceProperties(&prop, ctx_.device()));
    int driver = 0, runtime = 0, nccl = 0, cublas = 0;
    RC_CUDA_CHECK(cudaDriverGetVersion(&driver));
    RC_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    RC_NCCL_CHECK(ncclGetVersion(&nccl));
    RC_CUBLAS_CHECK(cublasGetVersion(ctx_.cublas(), &cublas), "cublasGetVersion");
    const size_t cudnn = cudnnGetVersion();
    BackendInfo out;
    out.name = "cuda";
    out.device = prop.name;
    out.properties = {
        {"computeCapability", std::to_string(prop.major) + "." + std::to_string(prop.minor)},
        {"memory", formatBytes(prop.totalGlobalMem)},
        {"multiprocessors", std::to_string(prop.multiProcessorCount)},
        {"driver", versionString(driver, 1000, 10, 100)},
        {"runtime", versionString(runtime, 1000, 10, 100)},
        {"cudnn",
         std::to_string(cudnn / 10000) + "." + std::to_string((cudnn / 100) % 100) + "." + std::to_string(cudnn % 100)},
        {"cublas", std::to_string(cublas / 10000) + "." + std::to_string((cublas / 100) % 100) + "." +
                       std::to_string(cublas % 100)},
        {"nccl",
         std::to_string(nccl / 10000) + "." + std::to_string((nccl / 100) % 100) + "." + std::to_string(nccl % 100)},
        {"tf32", ctx_.allowTf32() ? "allowed" : "off"},
        {"deterministic", ctx_.deterministic() ? "on" : "off"},
    };
    return out;
  }

  std::unique_ptr<Conv2dPlan> createConv2d(const Conv2dParams& p) override { return createConv2dPlan(ctx_, p); }
  std::unique_ptr<LinearPlan> createLinear(const LinearParams& p) override { return createLinearPlan(ctx_, p); }
  std::unique_ptr<Pool2dPlan> createPool2d(const Pool2dParams& p) override { return createPool2dPlan(ctx_, p); }
  std::unique_ptr<JpegDecoder> createJpegDecoder() override { return createCudaJpegDecoder(ctx_); }
  std::unique_ptr<InferencePlan> createInferencePlan(const InferencePlanParams& p) override {
    return buildInferencePlan(ctx_, p);
  }

  void batchNormForward(const BatchNormForwardArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t c = a.x.dim(a.x.rank() - 1), rows = a.x.numel() / c;
    const void* residual = a.residual.defined() ? a.residual.data() : nullptr;
    if (a.training) {
      cuda::batchNormForwardTraining(a.x.dtype(), a.x.data(), residual, a.y.data(), a.gamma.ptr<float>(),
                                     a.beta.ptr<float>(), a.runningMean.ptr<float>(), a.runningVar.ptr<float>(),
                                     a.saveMean.ptr<float>(), a.saveInvStd.ptr<float>(), rows, c, a.momentum, a.eps,
                                     a.relu, partial(rows, c), ctx_.stream());
    } else {
      cuda::batchNormForwardInference(a.x.dtype(), a.x.data(), residual, a.y.data(), a.gamma.ptr<float>(),
                                      a.beta.ptr<float>(), a.runningMean.ptr<float>(), a.runningVar.ptr<float>(),
                                      a.saveMean.defined() ? a.saveMean.ptr<float>() : nullptr,
                                      a.saveInvStd.defined() ? a.saveInvStd.ptr<float>() : nullptr, rows, c, a.eps,
                                      a.relu, ctx_.stream());
    }
  }

  void batchNormBackward(const BatchNormBackwardArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t c = a.x.dim(a.x.rank() - 1), rows = a.x.numel() / c;
    cuda::batchNormBackward(a.x.dtype(), a.x.data(), a.relu ? a.y.data() : nullptr, a.dy.data(), a.dx.data(),
                            a.dResidual.defined() ? a.dResidual.data() : nullptr, a.gamma.ptr<float>(),
                            a.saveMean.ptr<float>(), a.saveInvStd.ptr<float>(), a.dGamma.ptr<float>(),
                            a.dBeta.ptr<float>(), rows, c, a.relu, a.training, partial(rows, c), ctx_.stream());
  }

  void syncBatchNormStats(const SyncBatchNormStatsArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t c = a.x.dim(a.x.rank() - 1), rows = a.x.numel() / c;
    cuda::syncBatchNormStats(a.x.dtype(), a.x.data(), a.stats.ptr<float>(), rows, c, partial(rows, c), ctx_.stream());
  }

  void syncBatchNormForward(const SyncBatchNormForwardArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t c = a.x.dim(a.x.rank() - 1), rows = a.x.numel() / c;
    cuda::syncBatchNormForward(a.x.dtype(), a.x.data(), a.residual.defined() ? a.residual.data() : nullptr, a.y.data(),
                               a.gamma.ptr<float>(), a.beta.ptr<float>(), a.stats.ptr<float>(), a.stats.dim(0),
                               a.runningMean.ptr<float>(), a.runningVar.ptr<float>(), a.saveMean.ptr<float>(),
                               a.saveInvStd.ptr<float>(), rows, c, a.momentum, a.eps, a.relu, ctx_.stream());
  }

  void syncBatchNormBackwardReduce(const SyncBatchNormBackwardReduceArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t c = a.x.dim(a.x.rank() - 1), rows = a.x.numel() / c;
    cuda::syncBatchNormBackwardReduce(a.x.dtype(), a.x.data(), a.relu ? a.y.data() : nullptr, a.dy.data(),
                                      a.saveMean.ptr<float>(), a.saveInvStd.ptr<float>(), a.sums.ptr<float>(),
                                      a.dGamma.ptr<float>(), a.dBeta.ptr<float>(), rows, c, a.relu, partial(rows, c),
                                      ctx_.stream());
  }

  void syncBatchNormBackwardElementwise(const SyncBatchNormBackwardElementwiseArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t c = a.x.dim(a.x.rank() - 1), rows = a.x.numel() / c;
    cuda::syncBatchNormBackwardElementwise(a.x.dtype(), a.x.data(), a.relu ? a.y.data() : nullptr, a.dy.data(),
                                           a.dx.data(), a.dResidual.defined() ? a.dResidual.data() : nullptr,
                                           a.gamma.ptr<float>(), a.saveMean.ptr<float>(), a.saveInvStd.ptr<float>(),
                                           a.sums.ptr<float>(), rows, c, a.relu,
                                           static_cast<float*>(ctx_.scratch(2 * c * sizeof(float))), ctx_.stream());
  }

  void dualBatchNormForward(const DualBatchNormForwardArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t c = a.a.x.dim(a.a.x.rank() - 1), rows = a.a.x.numel() / c;
    auto side = [](const DualBatchNormSide& s) {
      return DualBnForwardSide{s.x.data(),
                               s.gamma.ptr<float>(),
                               s.beta.ptr<float>(),
                               s.runningMean.ptr<float>(),
                               s.runningVar.ptr<float>(),
                               s.saveMean.defined() ? s.saveMean.ptr<float>() : nullptr,
                               s.saveInvStd.defined() ? s.saveInvStd.ptr<float>() : nullptr,
                               s.momentum,
                               s.eps};
    };
    cuda::dualBatchNormForward(a.a.x.dtype(), side(a.a), side(a.b), a.y.data(), rows, c, a.training, a.relu,
                               dualPartial(rows, c), ctx_.stream());
  }

  void dualBatchNormBackward(const DualBatchNormBackwardArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t c = a.a.x.dim(a.a.x.rank() - 1), rows = a.a.x.numel() / c;
    auto side = [](const DualBatchNormGradSide& s) {
      return DualBnBackwardSide{s.x.data(),
                                s.dx.data(),
                                s.gamma.ptr<float>(),
                                s.saveMean.ptr<float>(),
                                s.saveInvStd.ptr<float>(),
                                s.dGamma.ptr<float>(),
                                s.dBeta.ptr<float>()};
    };
    cuda::dualBatchNormBackward(a.a.x.dtype(), side(a.a), side(a.b), a.relu ? a.y.data() : nullptr, a.dy.data(), rows,
                                c, a.relu, a.training, dualPartial(rows, c), ctx_.stream());
  }

  void relu(const Tensor& x, const Tensor& y) override {
    DeviceGuard guard(ctx_.device());
    cuda::relu(x.dtype(), x.data(), y.data(), x.numel(), ctx_.stream());
  }

  void reluBackward(const Tensor& y, const Tensor& dy, const Tensor& dx) override {
    DeviceGuard guard(ctx_.device());
    cuda::reluBackward(y.dtype(), y.data(), dy.data(), dx.data(), y.numel(), ctx_.stream());
  }

  void add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    DeviceGuard guard(ctx_.device());
    cuda::add(a.dtype(), a.data(), b.data(), out.data(), a.numel(), ctx_.stream());
  }

  void mul(const Tensor& a, const Tensor& b, const Tensor& out) override {
    DeviceGuard guard(ctx_.device());
    cuda::mul(a.dtype(), a.data(), b.data(), out.data(), a.numel(), ctx_.stream());
  }

  void cast(const Tensor& src, const Tensor& dst) override {
    DeviceGuard guard(ctx_.device());
    if (src.dtype() == dst.dtype()) {
      RC_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, ctx_.stream()));
      return;
    }
    cuda::cast(src.dtype(), src.data(), dst.dtype(), dst.data(), src.numel(), ctx_.stream());
  }

  void fill(const Tensor& t, double value) override {
    DeviceGuard guard(ctx_.device());
    if (value == 0.0) {
      RC_CUDA_CHECK(cudaMemsetAsync(t.data(), 0, t.nbytes(), ctx_.stream()));
      return;
    }
    cuda::fill(t.dtype(), t.data(), t.numel(), value, ctx_.stream());
  }

  void crossEntropy(const CrossEntropyArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t n = a.logits.dim(0), k = a.logits.dim(1);
    cuda::crossEntropy(a.logits.dtype(), a.logits.data(), a.labels.ptr<int32_t>(), a.loss.ptr<float>(),
                       a.dLogits.defined() ? a.dLogits.data() : nullptr, n, k, a.labelSmoothing, a.gradScale,
                       a.gradScaleFrom.defined() ? a.gradScaleFrom.ptr<float>() : nullptr, ctx_.invalidLabelFlag(),
                       partial(n, 1), ctx_.stream());
  }

  void distillationLoss(const DistillationArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t n = a.logits.dim(0), k = a.logits.dim(1);
    cuda::distillationLoss(a.logits.dtype(), a.logits.data(), a.teacherLogits.data(), a.labels.ptr<int32_t>(),
                           a.loss.ptr<float>(), a.dLogits.defined() ? a.dLogits.data() : nullptr, n, k,
                           {a.temperature, a.alpha, a.labelSmoothing, a.gradScale}, ctx_.invalidLabelFlag(),
                           partial(n, 1), ctx_.stream());
  }

  void sgdStep(const SgdArgs& a) override {
    if (a.segments.empty()) return;
    // The kernel takes firstStep as a value: a graph would start the momentum afresh at every replay.
    RC_CHECK_ARG(a.tablesOnly || !a.firstStep || !ctx_.capturing(),
                 "sgd step: the first step (which starts the momentum buffers) cannot be captured in a CUDA graph; "
                 "run one step before capturing");
    DeviceGuard guard(ctx_.device());
    std::vector<ArenaSegment> sorted = a.segments;
    std::sort(sorted.begin(), sorted.end(),
              [](const ArenaSegment& x, const ArenaSegment& y) { return x.offset < y.offset; });
    std::vector<int64_t> segments;
    int64_t total = 0;
    for (const ArenaSegment& s : sorted) {
      segments.insert(segments.end(), {s.offset, s.count, static_cast<int64_t>(s.group)});
      total += s.count;
    }
    std::vector<SgdGroupParams> groups;
    for (const SgdGroup& g : a.groups)
      groups.push_back({g.lr, g.momentum, g.dampening, g.weightDecay, g.nesterov ? 1 : 0});
    const auto* deviceSegments =
        static_cast<const int64_t*>(ctx_.upload("sgd segments", segments.data(), segments.size() * sizeof(int64_t)));
    const auto* deviceGroups = static_cast<const SgdGroupParams*>(
        ctx_.upload("sgd groups", groups.data(), groups.size() * sizeof(SgdGroupParams)));
    if (a.tablesOnly) return;
    cuda::sgdStep(a.params.ptr<float>(), a.grads.ptr<float>(),
                  a.momentumBuffer.defined() ? a.momentumBuffer.ptr<float>() : nullptr, deviceSegments,
                  static_cast<int64_t>(sorted.size()), total, deviceGroups, a.firstStep,
                  a.foundInf.defined() ? a.foundInf.ptr<float>() : nullptr, a.gradScaleInv, ctx_.stream());
  }

  void fusedSgdStep(const FusedSgdArgs& a) override {
    RC_CHECK_ARG(a.tablesOnly || !a.firstStep || !ctx_.capturing(),
                 "fused sgd step: the first step (which starts the momentum buffers) cannot be captured in a CUDA "
                 "graph; run one step before capturing");
    DeviceGuard guard(ctx_.device());
    const OptimTable table = optimTable("fused sgd segments", a.segments, a.params.numel(), false);
    std::vector<SgdGroupParams> groups;
    for (const SgdGroup& g : a.groups)
      groups.push_back({g.lr, g.momentum, g.dampening, g.weightDecay, g.nesterov ? 1 : 0});
    // Under sgdStep's key: the tables sgdStep's tablesOnly sends are the ones a captured fused step reads.
    const auto* deviceGroups = groups.empty()
                                   ? nullptr
                                   : static_cast<const SgdGroupParams*>(ctx_.upload(
                                         "sgd groups", groups.data(), groups.size() * sizeof(SgdGroupParams)));
    if (a.tablesOnly) return;
    cuda::fusedSgdStep(a.params.ptr<float>(), a.grads.ptr<float>(),
                       a.momentumBuffer.defined() ? a.momentumBuffer.ptr<float>() : nullptr, table.device,
                       table.segments, table.chunks, deviceGroups, a.firstStep, fusedEnd(a, a.foundInf, a.gradScaleInv),
                       ctx_.scratch(fusedStepScratchBytes(table.segments, table.chunks, false)), ctx_.stream());
  }

  void convBnForward(const ConvBnForwardArgs& a) override { convBn_.forward(a); }

  void batchNormFinalize(const BatchNormFinalizeArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const bool running = a.runningMean.defined();
    cuda::batchNormFinalize(a.sum.ptr<float>(), a.sqSum.ptr<float>(), a.gamma.ptr<float>(), a.beta.ptr<float>(),
                            running ? a.runningMean.ptr<float>() : nullptr,
                            running ? a.runningVar.ptr<float>() : nullptr, a.saveMean.ptr<float>(),
                            a.saveInvStd.ptr<float>(), a.scale.ptr<float>(), a.shift.ptr<float>(),
                            a.variance.defined() ? a.variance.ptr<float>() : nullptr, a.sum.numel(), a.count,
                            a.momentum, a.eps, ctx_.stream());
  }

  void convDgradDbn(const ConvDgradDbnArgs& a) override { dgradDbn_.run(a); }

  void convWgradSbr(const ConvWgradSbrArgs& a) override { wgradSbr_.run(a); }

  // The graphs in the order a training step first uses them; the first refusal is the answer.
  ConvBnSupport convBnSupport(const ConvBnSupportArgs& a) override {
    std::string reason = convBn_.refusal(a, a.prologue);
    if (reason.empty() && a.prologue) reason = dgradDbn_.refusal(a);
    if (reason.empty() && a.prologue) reason = wgradSbr_.refusal(a);
    return ConvBnSupport{reason.empty(), reason};
  }

  void batchNormBackwardApply(const BatchNormBackwardApplyArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t c = a.dz.dim(a.dz.rank() - 1), rows = a.dz.numel() / c;
    cuda::batchNormBackwardApply(a.dz.dtype(), a.dz.data(), a.x.data(), a.eqDz.ptr<float>(), a.eqX.ptr<float>(),
                                 a.eqBias.ptr<float>(), a.dx.data(), rows, c, ctx_.stream());
  }

  void convertInput(const ConvertInputArgs& a) override {
    RC_CHECK_ARG(a.src.dim(3) <= 16, "convert input: at most 16 channels on CUDA, got " << a.src.dim(3));
    DeviceGuard guard(ctx_.device());
    std::vector<float> meanStd(a.mean);
    meanStd.insert(meanStd.end(), a.std.begin(), a.std.end());
    const auto* table =
        static_cast<const float*>(ctx_.upload("input normalisation", meanStd.data(), meanStd.size() * sizeof(float)));
    cuda::convertInput(a.src.ptr<uint8_t>(), a.dst.dtype(), a.dst.data(),
                       a.flip.defined() ? a.flip.ptr<uint8_t>() : nullptr, table, a.src.dim(0), a.src.dim(1),
                       a.src.dim(2), a.src.dim(3), ctx_.stream());
  }

  void adamwStep(const AdamWArgs& a) override { adamStep(a, false, nullptr); }

  void lambStep(const LambArgs& a) override { adamStep(a, true, nullptr); }

  void fusedAdamwStep(const FusedAdamWArgs& a) override { adamStep(a, false, &a); }

  void fusedLambStep(const FusedLambArgs& a) override { adamStep(a, true, &a); }

  void gradNorm(const GradNormArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const OptimTable table = optimTable("grad norm segments", a.segments, a.grads.numel());
    cuda::gradNorm(a.grads.ptr<float>(), table.device, table.segments, table.chunks, a.out.ptr<float>(),
                   a.foundInf.defined() ? a.foundInf.ptr<float>() : nullptr,
                   ctx_.scratch(gradNormScratchBytes(table.chunks)), ctx_.stream());
  }

  void unscaleAndCheck(const UnscaleArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const OptimTable table = optimTable("unscale segments", a.segments, a.grads.numel());
    cuda::unscaleAndCheck(a.grads.ptr<float>(), table.device, table.segments, table.chunks, a.invScale,
                          a.scale.defined() ? a.scale.ptr<float>() : nullptr, a.foundInf.ptr<float>(), ctx_.stream());
  }

  void clipGradNorm(const ClipGradNormArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const OptimTable table = optimTable("clip segments", a.segments, a.grads.numel());
    cuda::clipGradNorm(a.grads.ptr<float>(), table.device, table.segments, table.chunks, a.norm.ptr<float>(), a.maxNorm,
                       ctx_.stream());
  }

  void scalerUpdate(const ScalerUpdateArgs& a) override {
    DeviceGuard guard(ctx_.device());
    cuda::scalerUpdate(a.scale.ptr<float>(), a.growthTracker.ptr<int32_t>(), a.foundInf.ptr<float>(), a.growthFactor,
                       a.backoffFactor, static_cast<int32_t>(a.growthInterval), ctx_.stream());
  }

  void lerp(const LerpArgs& a) override {
    DeviceGuard guard(ctx_.device());
    cuda::lerp(a.a.ptr<float>(), a.b.ptr<float>(), a.a.numel(), a.weight, ctx_.stream());
  }

  void fakeQuantize(const FakeQuantizeArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t n = a.x.numel();
    cuda::fakeQuantize(a.x.dtype(), a.x.data(), a.scale.ptr<float>(), a.y.data(), n, n / a.scale.numel(), a.qmin,
                       a.qmax, ctx_.stream());
  }

  void fakeQuantizeBackward(const FakeQuantizeBackwardArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t n = a.x.numel();
    cuda::fakeQuantizeBackward(a.x.dtype(), a.x.data(), a.scale.ptr<float>(), a.dy.data(), a.dx.data(), n,
                               n / a.scale.numel(), a.qmin, a.qmax, ctx_.stream());
  }

  void absMaxScale(const AbsMaxScaleArgs& a) override {
    DeviceGuard guard(ctx_.device());
    const int64_t groups = a.scale.numel();
    cuda::absMaxScale(a.x.dtype(), a.x.data(), a.scale.ptr<float>(), groups, a.x.numel() / groups, a.qmax,
                      ctx_.stream());
  }

  void observeMinMax(const ObserveMinMaxArgs& a) override {
    DeviceGuard guard(ctx_.device());
    cuda::observeMinMax(a.x.dtype(), a.x.data(), a.x.numel(), a.minMax.ptr<float>(), a.scale.ptr<float>(),
                        a.averagingConstant, a.qmax, static_cast<float*>(ctx_.scratch(observeScratchBytes())),
                        ctx_.stream());
  }

  void beginCapture() override {
    DeviceGuard guard(ctx_.device());
    RC_CHECK_ARG(!ctx_.capturing(), "a CUDA graph capture is already in progress on cuda:" << ctx_.device());
    RC_CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream(), cudaStreamCaptureModeThreadLocal));
    ctx_.beginCapture();
  }

  int64_t endCapture() override {
    DeviceGuard guard(ctx_.device());
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(ctx_.stream(), &graph);
    cudaGraphExec_t exec = nullptr;
    // Memory the graph allocated and did not free (a tensor created during capture and still
    // alive) is freed and allocated again, at the same address, by each launch; without this flag
    // the second launch would fail.
    const cudaError_t status =
        ended == cudaSuccess ? cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch) : ended;
    if (graph) cudaGraphDestroy(graph);
    ctx_.endCapture(status == cudaSuccess);
    if (status != cudaSuccess) (void)cudaGetLastError();
    RC_CUDA_CHECK(status);
    const int64_t id = nextGraph_++;
    graphs_[id] = exec;
    return id;
  }

  void replay(int64_t id) override {
    DeviceGuard guard(ctx_.device());
    auto it = graphs_.find(id);
    RC_CHECK_ARG(it != graphs_.end(), "CUDA graph " << id << " does not exist (destroyed, or from another device)");
    RC_CUDA_CHECK(cudaGraphLaunch(it->second, ctx_.stream()));
  }

  void destroyGraph(int64_t id) override {
    auto it = graphs_.find(id);
    if (it == graphs_.end()) return;
    DeviceGuard guard(ctx_.device());
    RC_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
    RC_CUDA_CHECK(cudaGraphExecDestroy(it->second));
    graphs_.erase(it);
    ctx_.graphDestroyed();
  }

  std::string createUniqueId() override { return createNcclUniqueId(); }

  std::unique_ptr<Communicator> createCommunicator(const CommunicatorParams& params) override {
    if (params.backend != "nccl") {
      RC_THROW(code::kBackendUnavailable,
               "the CUDA backend runs NCCL process groups, not '" << params.backend << "' (Gloo runs on the CPU)");
    }
    return createNcclCommunicator(ctx_, params);
  }

  int64_t profileMark(const ProfileMarkArgs& args) override {
    // A mark captured into a graph would be recorded again by every replay, and its time read by no one.
    RC_CHECK_ARG(!ctx_.capturing(), "the profiler cannot time ops during a CUDA graph capture on cuda:"
                                        << ctx_.device() << "; stop it before capturing and profile eager steps");
    DeviceGuard guard(ctx_.device());
    return timeline_.mark(args);
  }

  std::vector<double> profileRead() override {
    notCapturing("reading the profiler marks");
    DeviceGuard guard(ctx_.device());
    return timeline_.read();
  }

  // Host copies wait for the device: the host buffer belongs to the caller once this returns.
  void copyFromHost(const void* src, size_t bytes, const Tensor& dst) override {
    notCapturing("copy from host");
    DeviceGuard guard(ctx_.device());
    RC_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, bytes, cudaMemcpyHostToDevice, ctx_.stream()));
    RC_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  }

  void copyToHost(const Tensor& src, void* dst, size_t bytes) override {
    notCapturing("copy to host");
    DeviceGuard guard(ctx_.device());
    RC_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), bytes, cudaMemcpyDeviceToHost, ctx_.stream()));
    ctx_.checkDeferredErrors();
  }

  void copy(const Tensor& src, const Tensor& dst) override {
    DeviceGuard guard(ctx_.device());
    if (src.data() != dst.data()) {
      RC_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, ctx_.stream()));
    }
  }

  void synchronize() override {
    notCapturing("synchronize");
    DeviceGuard guard(ctx_.device());
    ctx_.checkDeferredErrors();
  }

  DeviceUtilization utilization() override { return monitor_.read(); }

 private:
  void notCapturing(const char* op) const {
    RC_CHECK_ARG(!ctx_.capturing(), op << " waits for the device and cannot be part of a CUDA graph capture");
  }

  // The segment table of the optimizer kernels (kernels.h): the non-empty segments sorted by
  // offset, or the whole arena of `numel` elements when none are listed (wholeWhenEmpty).
  struct OptimTable {
    const int64_t* device = nullptr;
    int64_t segments = 0, chunks = 0;
  };

  OptimTable optimTable(const char* key, const std::vector<ArenaSegment>& given, int64_t numel,
                        bool wholeWhenEmpty = true) {
    std::vector<ArenaSegment> sorted;
    if (given.empty() && wholeWhenEmpty) sorted.push_back(ArenaSegment{0, numel, 0});
    for (const ArenaSegment& s : given)
      if (s.count > 0) sorted.push_back(s);
    std::sort(sorted.begin(), sorted.end(),
              [](const ArenaSegment& x, const ArenaSegment& y) { return x.offset < y.offset; });
    std::vector<int64_t> rows;
    OptimTable table;
    for (const ArenaSegment& s : sorted) {
      rows.insert(rows.end(), {s.offset, s.count, static_cast<int64_t>(s.group), table.chunks});
      table.chunks += optimChunkCount(s.count);
      ++table.segments;
    }
    // Each op uploads under its own key, so that the table is sent again only when it changes.
    if (!rows.empty())
      table.device = static_cast<const int64_t*>(ctx_.upload(key, rows.data(), rows.size() * sizeof(int64_t)));
    return table;
  }

  // FusedStepEnd as the fused kernels take it.
  static cuda::FusedEnd fusedEnd(const FusedStepEnd& e, const Tensor& foundInf, float gradScaleInv) {
    return {foundInf.defined() ? foundInf.ptr<float>() : nullptr,
            e.checkFinite,
            e.zeroGrads,
            gradScaleInv,
            e.scaleFromDevice,
            e.scale.defined() ? e.scale.ptr<float>() : nullptr,
            e.growthTracker.defined() ? e.growthTracker.ptr<int32_t>() : nullptr,
            {e.growthFactor, e.backoffFactor, static_cast<int32_t>(e.growthInterval)}};
  }

  // AdamW's or LAMB's step, fused (FusedStepEnd's work too) when `fused` is given.
  void adamStep(const AdamWArgs& a, bool lamb, const FusedStepEnd* fused) {
    const char* op = fused ? (lamb ? "fused lamb step" : "fused adamw step") : (lamb ? "lamb step" : "adamw step");
    // The bias correction takes the step count as a value, which a graph would replay unchanged,
    // unless the count is kept on the device.
    RC_CHECK_ARG(a.tablesOnly || a.stepCount.defined() || !ctx_.capturing(),
                 op << " cannot be captured in a CUDA graph with its step count as a value (the bias correction "
                       "would use the captured step's at every replay); pass stepCount, a device counter");
    // A fused step with nothing to update still has its scale update and zeroing (of nothing) to do.
    if (a.segments.empty() && (fused == nullptr || a.tablesOnly)) return;
    DeviceGuard guard(ctx_.device());
    // The fused and unfused steps share their tables (their keys), so that either's tablesOnly
    // refreshes what a captured step of the other reads.
    const OptimTable table = optimTable(lamb ? "lamb segments" : "adamw segments", a.segments, a.params.numel(), false);
    if (table.segments == 0 && fused == nullptr) return;
    std::vector<AdamGroupParams> groups;
    for (const AdamGroup& g : a.groups)
      groups.push_back({g.lr, g.beta1, g.beta2, g.eps, g.weightDecay, g.alwaysAdapt ? 1 : 0});
    const auto* deviceGroups =
        groups.empty()
            ? nullptr
            : static_cast<const AdamGroupParams*>(ctx_.upload(lamb ? "lamb groups" : "adamw groups", groups.data(),
                                                              groups.size() * sizeof(AdamGroupParams)));
    if (a.tablesOnly) return;
    int32_t* stepCount = a.stepCount.defined() ? a.stepCount.ptr<int32_t>() : nullptr;
    const auto groupCount = static_cast<int64_t>(groups.size());
    if (fused) {
      cuda::fusedAdamStep(lamb, a.params.ptr<float>(), a.grads.ptr<float>(), a.expAvg.ptr<float>(),
                          a.expAvgSq.ptr<float>(), table.device, table.segments, table.chunks, deviceGroups, groupCount,
                          a.step, stepCount, fusedEnd(*fused, a.foundInf, a.gradScaleInv),
                          ctx_.scratch(fusedStepScratchBytes(table.segments, table.chunks, lamb)), ctx_.stream());
      return;
    }
    const float* foundInf = a.foundInf.defined() ? a.foundInf.ptr<float>() : nullptr;
    if (lamb) {
      cuda::lambStep(a.params.ptr<float>(), a.grads.ptr<float>(), a.expAvg.ptr<float>(), a.expAvgSq.ptr<float>(),
                     table.device, table.segments, table.chunks, deviceGroups, groupCount, a.step, stepCount, foundInf,
                     a.gradScaleInv, ctx_.scratch(lambScratchBytes(table.segments, table.chunks)), ctx_.stream());
    } else {
      cuda::adamwStep(a.params.ptr<float>(), a.grads.ptr<float>(), a.expAvg.ptr<float>(), a.expAvgSq.ptr<float>(),
                      table.device, table.segments, table.chunks, deviceGroups, groupCount, a.step, stepCount, foundInf,
                      a.gradScaleInv, ctx_.stream());
    }
  }

  float* partial(int64_t rows, int64_t channels) {
    return static_cast<float*>(ctx_.scratch(batchNormScratchFloats(rows, channels) * sizeof(float)));
  }

  float* dualPartial(int64_t rows, int64_t channels) {
    return static_cast<float*>(ctx_.scratch(dualBatchNormScratchFloats(rows, channels) * sizeof(float)));
  }

  CudaContext ctx_;
  NvmlMonitor monitor_;
  ProfileTimeline timeline_;
  ConvBnFusion convBn_;
  DgradDbnFusion dgradDbn_;
  WgradSbrFusion wgradSbr_;
  std::map<int64_t, cudaGraphExec_t> graphs_;
  int64_t nextGraph_ = 1;
};

}  // namespace

}  // namespace rc::cuda

// Creates the backend for one device; returns null for an addon built against another interface.
extern "C" __attribute__((visibility("default"))) rc::Backend* rc_cuda_create_backend(int deviceIndex, int abiVersion) {
  if (abiVersion != rc::cuda::kBackendAbi) return nullptr;
  return new rc::cuda::CudaBackend(deviceIndex);
}

// The number of visible CUDA devices; on failure 0, with the reason in `error`.
extern "C" __attribute__((visibility("default"))) int rc_cuda_device_count(char* error, size_t errorSize) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (error != nullptr && errorSize > 0) {
      std::snprintf(error, errorSize, "the CUDA runtime found no usable device: %s (%s)", cudaGetErrorName(status),
                    cudaGetErrorString(status));
    }
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}
