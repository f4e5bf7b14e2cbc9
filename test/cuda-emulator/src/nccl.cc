// The emulated NCCL: one rank (see nccl.h).
#include <nccl.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <vector>

struct ncclComm {
  int nranks = 1;
  int rank = 0;
  bool gone = false;         // destroyed or aborted: every later call fails
  int pendingInitPolls = 0;  // non-blocking initialisation: polls that still report ncclInProgress
  ncclResult_t asyncError = ncclSuccess;
  // Shared with the queued operations: an abort cancels the ones that have not run.
  std::shared_ptr<std::atomic<bool>> aborted = std::make_shared<std::atomic<bool>>(false);
};

namespace {

constexpr unsigned int kConfigMagic = 0xcafebeef;

// Never destroyed: the backend may still call in while the process exits.
std::mutex& gMutex = *new std::mutex();
// Every communicator ever created; destroyed ones stay (marked gone) so that their pointers are
// recognised instead of being reused.
std::vector<std::unique_ptr<ncclComm>>& gComms = *new std::vector<std::unique_ptr<ncclComm>>();
char gLastError[1024] = "";

ncclResult_t fail(ncclResult_t result, const std::string& message) {
  std::snprintf(gLastError, sizeof gLastError, "%s", message.c_str());
  return result;
}

// The communicator behind `comm` if it is one that is still usable; otherwise sets the error.
// Call with gMutex held.
ncclComm* usable(ncclComm_t comm, const char* call, ncclResult_t* error) {
  if (comm == nullptr) {
    *error = fail(ncclInvalidArgument, std::string(call) + ": the communicator is null");
    return nullptr;
  }
  for (const auto& c : gComms) {
    if (c.get() != comm) continue;
    if (c->gone) {
      *error = fail(ncclInvalidArgument, std::string(call) + ": the communicator was destroyed or aborted");
      return nullptr;
    }
    return c.get();
  }
  *error = fail(ncclInvalidArgument, std::string(call) + ": not a communicator");
  return nullptr;
}

size_t typeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

bool validType(ncclDataType_t t) { return static_cast<int>(t) >= 0 && static_cast<int>(t) < ncclNumTypes; }

// A collective's common checks and queueing. With one rank every reduction and the broadcast from
// rank 0 leave the input unchanged: the output is the input, copied if it is another buffer.
ncclResult_t collective(const char* call, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclComm_t comm, cudaStream_t stream) {
  std::shared_ptr<std::atomic<bool>> aborted;
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    ncclResult_t error = ncclSuccess;
    ncclComm* c = usable(comm, call, &error);
    if (c == nullptr) return error;
    if (c->pendingInitPolls > 0) {
      return fail(ncclInvalidArgument,
                  std::string(call) + ": the communicator is used before ncclCommGetAsyncError reported ncclSuccess");
    }
    if (c->asyncError != ncclSuccess) return c->asyncError;
    if (!validType(datatype)) {
      return fail(ncclInvalidArgument, std::string(call) + ": data type " + std::to_string(datatype) + " is invalid");
    }
    bytes = count * typeSize(datatype);
    if (bytes > 0) {
      if (sendbuff == nullptr || recvbuff == nullptr) {
        return fail(ncclInvalidArgument, std::string(call) + ": a buffer is null");
      }
      if (!rc_emu::isDeviceRange(sendbuff, bytes)) {
        return fail(ncclInvalidArgument,
                    std::string(call) + ": sendbuff is not " + std::to_string(bytes) + " bytes of device memory");
      }
      if (!rc_emu::isDeviceRange(recvbuff, bytes)) {
        return fail(ncclInvalidArgument,
                    std::string(call) + ": recvbuff is not " + std::to_string(bytes) + " bytes of device memory");
      }
    }
    aborted = c->aborted;
  }
  const std::string what = call;
  const cudaError_t e = rc_emu::enqueue(
      stream,
      [sendbuff, recvbuff, bytes, aborted, what] {
        if (aborted->load() || bytes == 0 || sendbuff == recvbuff) return;
        if (!rc_emu::isDeviceRange(sendbuff, bytes) || !rc_emu::isDeviceRange(recvbuff, bytes)) {
          rc_emu::deviceFault(what + ": a buffer is no longer allocated device memory when the collective runs");
          return;
        }
        std::memmove(recvbuff, sendbuff, bytes);
      },
      call);
  if (e != cudaSuccess) {
    std::lock_guard<std::mutex> lock(gMutex);
    return fail(ncclUnhandledCudaError,
                std::string(call) + ": queueing on the stream failed (CUDA error " + std::to_string(e) + ")");
  }
  return ncclSuccess;
}

}  // namespace

extern "C" ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion: version is null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is null");
  std::random_device random;
  for (char& b : uniqueId->internal) b = static_cast<char>(random() & 0xff);
  return ncclSuccess;
}

extern "C" const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclNumResults: break;
  }
  return "unknown result code";
}

extern "C" const char* ncclGetLastError(ncclComm_t) { return gLastError; }

extern "C" ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId, int rank,
                                               ncclConfig_t* config) {
  const char* call = "ncclCommInitRankConfig";
  std::lock_guard<std::mutex> lock(gMutex);
  if (comm == nullptr) return fail(ncclInvalidArgument, std::string(call) + ": comm is null");
  *comm = nullptr;
  if (nranks < 1)
    return fail(ncclInvalidArgument, std::string(call) + ": invalid rank count " + std::to_string(nranks));
  if (rank < 0 || rank >= nranks) {
    return fail(ncclInvalidArgument, std::string(call) + ": rank " + std::to_string(rank) + " is outside [0, " +
                                         std::to_string(nranks) + ")");
  }
  bool blocking = true;
  if (config != nullptr) {
    if (config->magic != kConfigMagic || config->size < sizeof(ncclConfig_t) ||
        config->version < static_cast<unsigned>(NCCL_VERSION(2, 14, 0))) {
      return fail(ncclInvalidArgument,
                  std::string(call) + ": the config was not initialised with NCCL_CONFIG_INITIALIZER");
    }
    if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1) {
      return fail(ncclInvalidArgument,
                  std::string(call) + ": config.blocking must be 0 or 1, got " + std::to_string(config->blocking));
    }
    blocking = config->blocking != 0;
  }
  if (nranks > 1) {
    return fail(ncclInvalidUsage, std::string(call) +
                                      ": the CUDA emulator runs a single rank and cannot form a "
                                      "communicator of " +
                                      std::to_string(nranks) + " ranks");
  }
  auto created = std::unique_ptr<ncclComm>(new (std::nothrow) ncclComm());
  if (created == nullptr) return fail(ncclSystemError, std::string(call) + ": out of host memory");
  created->nranks = nranks;
  created->rank = rank;
  created->pendingInitPolls = blocking ? 0 : 1;
  *comm = created.get();
  gComms.push_back(std::move(created));
  return blocking ? ncclSuccess : ncclInProgress;
}

extern "C" ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

extern "C" ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  std::lock_guard<std::mutex> lock(gMutex);
  ncclResult_t error = ncclSuccess;
  ncclComm* c = usable(comm, "ncclCommGetAsyncError", &error);
  if (c == nullptr) return error;
  if (asyncError == nullptr) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is null");
  if (c->pendingInitPolls > 0) {
    --c->pendingInitPolls;
    *asyncError = ncclInProgress;
  } else {
    *asyncError = c->asyncError;
  }
  return ncclSuccess;
}

extern "C" ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  std::lock_guard<std::mutex> lock(gMutex);
  ncclResult_t error = ncclSuccess;
  ncclComm* c = usable(comm, "ncclCommCount", &error);
  if (c == nullptr) return error;
  if (count == nullptr) return fail(ncclInvalidArgument, "ncclCommCount: count is null");
  *count = c->nranks;
  return ncclSuccess;
}

extern "C" ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  std::lock_guard<std::mutex> lock(gMutex);
  ncclResult_t error = ncclSuccess;
  ncclComm* c = usable(comm, "ncclCommUserRank", &error);
  if (c == nullptr) return error;
  if (rank == nullptr) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is null");
  *rank = c->rank;
  return ncclSuccess;
}

// Destroying lets queued operations finish; aborting cancels those that have not run.
extern "C" ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::lock_guard<std::mutex> lock(gMutex);
  ncclResult_t error = ncclSuccess;
  ncclComm* c = usable(comm, "ncclCommDestroy", &error);
  if (c == nullptr) return error;
  c->gone = true;
  return ncclSuccess;
}

extern "C" ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::lock_guard<std::mutex> lock(gMutex);
  ncclResult_t error = ncclSuccess;
  ncclComm* c = usable(comm, "ncclCommAbort", &error);
  if (c == nullptr) return error;
  c->aborted->store(true);
  c->gone = true;
  return ncclSuccess;
}

extern "C" ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (static_cast<int>(op) < 0 || static_cast<int>(op) >= ncclNumOps) {
    // Checked after the communicator, as NCCL does.
    std::lock_guard<std::mutex> lock(gMutex);
    ncclResult_t error = ncclSuccess;
    if (usable(comm, "ncclAllReduce", &error) == nullptr) return error;
    return fail(ncclInvalidArgument, "ncclAllReduce: reduction operation " + std::to_string(op) + " is invalid");
  }
  return collective("ncclAllReduce", sendbuff, recvbuff, count, datatype, comm, stream);
}

extern "C" ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      int root, ncclComm_t comm, cudaStream_t stream) {
  {
    std::lock_guard<std::mutex> lock(gMutex);
    ncclResult_t error = ncclSuccess;
    ncclComm* c = usable(comm, "ncclBroadcast", &error);
    if (c == nullptr) return error;
    if (root < 0 || root >= c->nranks) {
      return fail(ncclInvalidArgument,
                  "ncclBroadcast: root " + std::to_string(root) + " is outside [0, " + std::to_string(c->nranks) + ")");
    }
  }
  return collective("ncclBroadcast", sendbuff, recvbuff, count, datatype, comm, stream);
}

// With one rank the gathered output is the input: sendcount elements.
extern "C" ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                      ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllGather", sendbuff, recvbuff, sendcount, datatype, comm, stream);
}
