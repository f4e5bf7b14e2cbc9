// The NCCL communicator: non-blocking initialisation and collectives on a CUDA stream of its own,
// so that every wait can time out and collectives overlap the compute stream's work. Each
// collective first waits (on the device) for an event recorded on the compute stream, so it sees
// the work enqueued before it; waitOnDevice makes the compute stream wait for an event recorded on
// the NCCL stream. Neither blocks the host, and both are events between streams, which a CUDA graph
// captures as a fork and a join. A timeout or an asynchronous error aborts the communicator, which
// makes the other ranks' collectives fail instead of hanging.
#include <chrono>
#include <cstdio>
#include <thread>

#include "cuda_check.h"
#include "cuda_ops.h"

namespace rc::cuda {

namespace {

// NCCL's description of the last error on this thread, as " (...)", or nothing when it has none.
std::string lastErrorDetail() {
  const char* detail = ncclGetLastError(nullptr);
  return detail != nullptr && detail[0] != '\0' ? std::string(" (") + detail + ")" : std::string();
}

ncclDataType_t toNccl(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  RC_THROW(code::kInvalidArgument, "NCCL has no type for " << dtypeName(t));
}

std::string toHex(const char* bytes, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(CudaContext& ctx, const CommunicatorParams& params)
      : ctx_(ctx), rank_(params.rank), size_(params.worldSize), timeoutSeconds_(params.timeoutSeconds) {
    const std::string& uniqueId = params.uniqueId;
    RC_CHECK_ARG(size_ >= 1 && rank_ >= 0 && rank_ < size_,
                 "NCCL: rank " << rank_ << " is outside a world of " << size_);
    RC_CHECK_ARG(uniqueId.size() == 2 * NCCL_UNIQUE_ID_BYTES,
                 "NCCL: the unique id must be " << 2 * NCCL_UNIQUE_ID_BYTES << " hex digits, got " << uniqueId.size());
    ncclUniqueId id;
    for (size_t i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) {
      unsigned value = 0;
      RC_CHECK_ARG(std::sscanf(uniqueId.c_str() + 2 * i, "%2x", &value) == 1, "NCCL: the unique id is not hex");
      id.internal[i] = static_cast<char>(value);
    }
    DeviceGuard guard(ctx.device());
    // The destructor does not run when the constructor throws: release what exists on the way out.
    try {
      RC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      RC_CUDA_CHECK(cudaEventCreateWithFlags(&computeReady_, cudaEventDisableTiming));
      RC_CUDA_CHECK(cudaEventCreateWithFlags(&collectivesDone_, cudaEventDisableTiming));
      RC_CUDA_CHECK(cudaMalloc(&barrierWord_, sizeof(int32_t)));
      RC_CUDA_CHECK(cudaMemsetAsync(barrierWord_, 0, sizeof(int32_t), stream_));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      enqueued(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "joining the communicator");
      waitReady(timeoutSeconds_, "joining the communicator");
    } catch (...) {
      release();
      throw;
    }
  }

  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      if (broken_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
      comm_ = nullptr;
    }
    release();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allReduce(const Tensor& t, ReduceOp op) override {
    usable(t, "allReduce");
    DeviceGuard guard(ctx_.device());
    afterCompute();
    const ncclRedOp_t nop = op == ReduceOp::Max ? ncclMax : op == ReduceOp::Avg ? ncclAvg : ncclSum;
    enqueued(ncclAllReduce(t.data(), t.data(), static_cast<size_t>(t.numel()), toNccl(t.dtype()), nop, comm_, stream_),
             "enqueueing an all-reduce");
    waitReady(kEnqueueTimeoutSeconds, "enqueueing an all-reduce");
  }

  void broadcast(const Tensor& t, int root) override {
    usable(t, "broadcast");
    RC_CHECK_ARG(root >= 0 && root < size_, "NCCL broadcast: root " << root << " is outside a world of " << size_);
    DeviceGuard guard(ctx_.device());
    afterCompute();
    enqueued(ncclBroadcast(t.data(), t.data(), static_cast<size_t>(t.numel()), toNccl(t.dtype()), root, comm_, stream_),
             "enqueueing a broadcast");
    waitReady(kEnqueueTimeoutSeconds, "enqueueing a broadcast");
  }

  void allGather(const Tensor& in, const Tensor& out) override {
    usable(in, "allGather");
    usable(out, "allGather");
    RC_CHECK_ARG(in.dtype() == out.dtype(),
                 "NCCL allGather: the output is " << dtypeName(out.dtype()) << ", the input " << dtypeName(in.dtype()));
    RC_CHECK_ARG(out.numel() == in.numel() * size_, "NCCL allGather: the output must have "
                                                        << in.numel() * size_ << " elements (" << size_ << " ranks x "
                                                        << in.numel() << "), got " << out.numel());
    DeviceGuard guard(ctx_.device());
    afterCompute();
    enqueued(ncclAllGather(in.data(), out.data(), static_cast<size_t>(in.numel()), toNccl(in.dtype()), comm_, stream_),
             "enqueueing an all-gather");
    waitReady(kEnqueueTimeoutSeconds, "enqueueing an all-gather");
  }

  // An all-reduce of one word, then a host wait: every rank has enqueued it when this returns.
  void barrier() override {
    RC_CHECK_ARG(!broken_, "NCCL barrier: the communicator was aborted after an earlier error");
    DeviceGuard guard(ctx_.device());
    afterCompute();
    enqueued(ncclAllReduce(barrierWord_, barrierWord_, 1, ncclInt32, ncclSum, comm_, stream_), "enqueueing a barrier");
    waitReady(kEnqueueTimeoutSeconds, "enqueueing a barrier");
    synchronize(timeoutSeconds_);
  }

  void waitOnDevice() override {
    RC_CHECK_ARG(!broken_, "NCCL wait: the communicator was aborted after an earlier error");
    DeviceGuard guard(ctx_.device());
    RC_CUDA_CHECK(cudaEventRecord(collectivesDone_, stream_));
    RC_CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream(), collectivesDone_, 0));
  }

  void synchronize(double timeoutSeconds) override {
    RC_CHECK_ARG(!broken_, "NCCL synchronize: the communicator was aborted after an earlier error");
    DeviceGuard guard(ctx_.device());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSeconds);
    for (;;) {
      const cudaError_t done = cudaStreamQuery(stream_);
      if (done == cudaSuccess) return;
      if (done != cudaErrorNotReady) RC_CUDA_CHECK(done);
      checkAsyncError("waiting for collectives");
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        RC_THROW(code::kNccl, "NCCL collectives on rank " << rank_ << " did not finish within " << timeoutSeconds
                                                          << " s; another rank has probably stopped. The communicator "
                                                             "was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

 private:
  static constexpr double kEnqueueTimeoutSeconds = 300.0;

  // The next collective waits for the work enqueued so far on the compute stream.
  void afterCompute() {
    RC_CUDA_CHECK(cudaEventRecord(computeReady_, ctx_.stream()));
    RC_CUDA_CHECK(cudaStreamWaitEvent(stream_, computeReady_, 0));
  }

  void release() {
    if (barrierWord_ != nullptr) cudaFree(barrierWord_);
    if (collectivesDone_ != nullptr) cudaEventDestroy(collectivesDone_);
    if (computeReady_ != nullptr) cudaEventDestroy(computeReady_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);  // queued work still completes
    barrierWord_ = nullptr;
    collectivesDone_ = computeReady_ = nullptr;
    stream_ = nullptr;
  }

  // A call that fails at once leaves the other ranks waiting for this one: abort, so that they
  // see the error instead of a hang.
  void enqueued(ncclResult_t status, const char* what) {
    if (status == ncclSuccess || status == ncclInProgress) return;
    abort();
    RC_THROW(code::kNccl, "NCCL failed " << what << " on rank " << rank_ << ": " << ncclGetErrorString(status)
                                         << lastErrorDetail() << "; the communicator was aborted");
  }

  void usable(const Tensor& t, const char* op) const {
    RC_CHECK_ARG(!broken_, "NCCL " << op << ": the communicator was aborted after an earlier error");
    checkDefined(t, "NCCL", op);
    RC_CHECK_ARG(t.device() == ctx_.rcDevice(),
                 "NCCL " << op << ": " << t.describe() << " is not on cuda:" << ctx_.device());
  }

  void checkAsyncError(const char* what) {
    ncclResult_t state = ncclSuccess;
    RC_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclSuccess && state != ncclInProgress) {
      abort();
      RC_THROW(code::kNccl, "NCCL failed while " << what << " on rank " << rank_ << ": " << ncclGetErrorString(state)
                                                 << lastErrorDetail());
    }
  }

  // Non-blocking communicators return before their host-side work is done; wait for it.
  void waitReady(double timeoutSeconds, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSeconds);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      RC_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) checkAsyncError(what);
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        RC_THROW(code::kNccl, "NCCL timed out after " << timeoutSeconds << " s " << what << " on rank " << rank_
                                                      << " of " << size_ << "; are all ranks running?");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  void abort() {
    if (!broken_ && comm_ != nullptr) ncclCommAbort(comm_);
    broken_ = true;
    comm_ = nullptr;
  }

  CudaContext& ctx_;
  int rank_, size_;
  double timeoutSeconds_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t computeReady_ = nullptr, collectivesDone_ = nullptr;
  void* barrierWord_ = nullptr;
  bool broken_ = false;
};

}  // namespace

std::string createNcclUniqueId() {
  ncclUniqueId id;
  RC_NCCL_CHECK(ncclGetUniqueId(&id));
  return toHex(id.internal, NCCL_UNIQUE_ID_BYTES);
}

std::unique_ptr<Communicator> createNcclCommunicator(CudaContext& ctx, const CommunicatorParams& params) {
  return std::make_unique<NcclCommunicator>(ctx, params);
}

}  // namespace rc::cuda
