// The CPU backend: oneDNN plans and our own OpenMP kernels behind the common Backend interface.
#include <omp.h>

#include <cstring>
#include <fstream>

#include "backend_cpu.h"
#include "compute_type.h"
#include "cpu_ops.h"
#include "gloo_communicator.h"

namespace rc::cpu {

namespace {

std::string cpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

class CpuBackend final : public Backend {
 private:
  [[noreturn]] static void unsupported(const char* what) {
    RC_THROW(code::kInvalidArgument, what << " needs a CUDA device; the CPU backend runs ops as they are called");
  }

 public:
  Device device() const override { return Device{DeviceType::Cpu, 0}; }
  Allocator& allocator() override { return ctx_.allocator(); }
  bool supports(DType) const override { return true; }

  BackendInfo info() override {
    const dnnl_version_t* v = dnnl::version();
    BackendInfo out;
    out.name = "cpu";
    out.device = cpuModelName();
    out.properties = {
        {"onednn", std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch)},
        {"isa", isaName()},
        {"bf16", bf16Compute(ctx_.engine()).native ? "native" : "computed in f32"},
        {"bf16Reason", bf16Compute(ctx_.engine()).reason},
        {"int8", hasInt8DotProducts() ? "vnni" : "no vnni"},
        {"threads", std::to_string(omp_get_max_threads())},
    };
    return out;
  }

  std::unique_ptr<Conv2dPlan> createConv2d(const Conv2dParams& p) override { return createConv2dPlan(ctx_, p); }
  std::unique_ptr<LinearPlan> createLinear(const LinearParams& p) override { return createLinearPlan(ctx_, p); }
  std::unique_ptr<Pool2dPlan> createPool2d(const Pool2dParams& p) override { return createPool2dPlan(ctx_, p); }
  std::unique_ptr<InferencePlan> createInferencePlan(const InferencePlanParams& p) override {
    return p.int8 ? buildInt8InferencePlan(ctx_, p) : buildInferencePlan(ctx_, p);
  }

  void batchNormForward(const BatchNormForwardArgs& a) override { cpu::batchNormForward(a); }
  void batchNormBackward(const BatchNormBackwardArgs& a) override { cpu::batchNormBackward(a); }
  void syncBatchNormStats(const SyncBatchNormStatsArgs& a) override { cpu::syncBatchNormStats(a); }
  void syncBatchNormForward(const SyncBatchNormForwardArgs& a) override { cpu::syncBatchNormForward(a); }
  void syncBatchNormBackwardReduce(const SyncBatchNormBackwardReduceArgs& a) override {
    cpu::syncBatchNormBackwardReduce(a);
  }
  void syncBatchNormBackwardElementwise(const SyncBatchNormBackwardElementwiseArgs& a) override {
    cpu::syncBatchNormBackwardElementwise(a);
  }
  void relu(const Tensor& x, const Tensor& y) override { cpu::relu(x, y); }
  void reluBackward(const Tensor& y, const Tensor& dy, const Tensor& dx) override { cpu::reluBackward(y, dy, dx); }
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override { cpu::add(a, b, out); }
  void mul(const Tensor& a, const Tensor& b, const Tensor& out) override { cpu::mul(a, b, out); }
  void cast(const Tensor& src, const Tensor& dst) override { cpu::cast(src, dst); }
  void fill(const Tensor& t, double value) override { cpu::fill(t, value); }
  void crossEntropy(const CrossEntropyArgs& a) override { cpu::crossEntropy(a); }
  void distillationLoss(const DistillationArgs& a) override { cpu::distillationLoss(a); }
  void sgdStep(const SgdArgs& a) override { cpu::sgdStep(a); }
  void convertInput(const ConvertInputArgs& a) override { cpu::convertInput(a); }
  void adamwStep(const AdamWArgs& a) override { cpu::adamwStep(a); }
  void lambStep(const LambArgs& a) override { cpu::lambStep(a); }
  void gradNorm(const GradNormArgs& a) override { cpu::gradNorm(a); }
  void unscaleAndCheck(const UnscaleArgs& a) override { cpu::unscaleAndCheck(a); }
  void clipGradNorm(const ClipGradNormArgs& a) override { cpu::clipGradNorm(a); }
  void scalerUpdate(const ScalerUpdateArgs& a) override { cpu::scalerUpdate(a); }
  void lerp(const LerpArgs& a) override { cpu::lerp(a); }
  void fakeQuantize(const FakeQuantizeArgs& a) override { cpu::fakeQuantize(a); }
  void fakeQuantizeBackward(const FakeQuantizeBackwardArgs& a) override { cpu::fakeQuantizeBackward(a); }
  void absMaxScale(const AbsMaxScaleArgs& a) override { cpu::absMaxScale(a); }
  void observeMinMax(const ObserveMinMaxArgs& a) override { cpu::observeMinMax(a); }

  void beginCapture() override { unsupported("graph capture"); }
  int64_t endCapture() override { unsupported("graph capture"); }
  void replay(int64_t) override { unsupported("graph replay"); }
  void destroyGraph(int64_t) override { unsupported("graph replay"); }
  std::string createUniqueId() override { unsupported("NCCL collectives"); }
  std::unique_ptr<Communicator> createCommunicator(const CommunicatorParams& params) override {
    if (params.backend != "gloo") {
      RC_THROW(code::kBackendUnavailable,
               "the CPU backend runs Gloo process groups, not '" << params.backend << "' (NCCL needs a CUDA device)");
    }
    return createGlooCommunicator(params);
  }
  int64_t profileMark(const ProfileMarkArgs&) override { unsupported("device timing marks"); }
  std::vector<double> profileRead() override { unsupported("device timing marks"); }

  void copyFromHost(const void* src, size_t bytes, const Tensor& dst) override { std::memcpy(dst.data(), src, bytes); }

  void copyToHost(const Tensor& src, void* dst, size_t bytes) override { std::memcpy(dst, src.data(), bytes); }

  void copy(const Tensor& src, const Tensor& dst) override {
    if (src.data() != dst.data()) std::memmove(dst.data(), src.data(), src.nbytes());
  }

  void synchronize() override {}

  DeviceUtilization utilization() override {
    DeviceUtilization out;
    out.reason = "the CPU has no GPU utilisation reading (NVML reports NVIDIA GPUs only)";
    return out;
  }

 private:
  CpuContext ctx_;
};

}  // namespace

std::unique_ptr<Backend> createCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace rc::cpu
