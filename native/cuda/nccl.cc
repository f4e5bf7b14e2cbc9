// The NCCL communicator: non-blocking initialisation and collectives on the backend's stream, so
// that every wait can time out; a timeout or an asynchronous error aborts the communicator, which
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
  NcclCommunicator(CudaContext& ctx, const std::string& uniqueId, int rank, int worldSize, double timeoutSeconds)
      : ctx_(ctx), rank_(rank), size_(worldSize) {
    RC_CHECK_ARG(worldSize >= 1 && rank >= 0 && rank < worldSize,
                 "NCCL: rank " << rank << " is outside a world of " << worldSize);
    RC_CHECK_ARG(uniqueId.size() == 2 * NCCL_UNIQUE_ID_BYTES,
                 "NCCL: the unique id must be " << 2 * NCCL_UNIQUE_ID_BYTES << " hex digits, got " << uniqueId.size());
    ncclUniqueId id;
    for (size_t i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) {
      unsigned value = 0;
      RC_CHECK_ARG(std::sscanf(uniqueId.c_str() + 2 * i, "%2x", &value) == 1, "NCCL: the unique id is not hex");
      id.internal[i] = static_cast<char>(value);
    }
    DeviceGuard guard(ctx.device());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    // The destructor does not run when the constructor throws: a failed start aborts what exists.
    enqueued(ncclCommInitRankConfig(&comm_, worldSize, id, rank, &config), "joining the communicator");
    waitReady(timeoutSeconds, "joining the communicator");
  }

  ~NcclCommunicator() override {
    if (comm_ == nullptr) return;
    if (broken_) {
      ncclCommAbort(comm_);
    } else {
      ncclCommDestroy(comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allReduce(const Tensor& t, bool average) override {
    usable(t, "allReduce");
    DeviceGuard guard(ctx_.device());
    enqueued(ncclAllReduce(t.data(), t.data(), static_cast<size_t>(t.numel()), toNccl(t.dtype()),
                           average ? ncclAvg : ncclSum, comm_, ctx_.stream()),
             "enqueueing an all-reduce");
    waitReady(kEnqueueTimeoutSeconds, "enqueueing an all-reduce");
  }

  void broadcast(const Tensor& t, int root) override {
    usable(t, "broadcast");
    RC_CHECK_ARG(root >= 0 && root < size_, "NCCL broadcast: root " << root << " is outside a world of " << size_);
    DeviceGuard guard(ctx_.device());
    enqueued(ncclBroadcast(t.data(), t.data(), static_cast<size_t>(t.numel()), toNccl(t.dtype()), root, comm_,
                           ctx_.stream()),
             "enqueueing a broadcast");
    waitReady(kEnqueueTimeoutSeconds, "enqueueing a broadcast");
  }

  void synchronize(double timeoutSeconds) override {
    RC_CHECK_ARG(!broken_, "NCCL synchronize: the communicator was aborted after an earlier error");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSeconds);
    for (;;) {
      const cudaError_t done = cudaStreamQuery(ctx_.stream());
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
  ncclComm_t comm_ = nullptr;
  bool broken_ = false;
};

}  // namespace

std::string createNcclUniqueId() {
  ncclUniqueId id;
  RC_NCCL_CHECK(ncclGetUniqueId(&id));
  return toHex(id.internal, NCCL_UNIQUE_ID_BYTES);
}

std::unique_ptr<Communicator> createNcclCommunicator(CudaContext& ctx, const std::string& uniqueId, int rank,
                                                     int worldSize, double timeoutSeconds) {
  return std::make_unique<NcclCommunicator>(ctx, uniqueId, rank, worldSize, timeoutSeconds);
}

}  // namespace rc::cuda
