// NCCL as the emulator provides it: communicators, their non-blocking initialisation, errors, and
// the all-reduce, broadcast and all-gather collectives, with the types, enumerators and numeric
// values of the NCCL 2.21 header.
//
// The emulator's behaviour (src/nccl.cc):
// - One rank only: ncclCommInitRankConfig succeeds for nranks == 1, rank 0, and returns
//   ncclInvalidUsage for more ranks (ncclGetLastError says why). With config.blocking == 0 it
//   returns ncclInProgress, and ncclCommGetAsyncError reports ncclInProgress once before
//   ncclSuccess; a collective issued before that returns ncclInvalidArgument, as in NCCL.
// - Collectives validate their arguments when called (ncclInvalidArgument for a null or destroyed
//   communicator, a bad data type, reduction or root, and pointers that are not device memory
//   covering count elements: the checks NCCL makes with NCCL_CHECK_POINTERS=1), then are queued
//   on the stream (rc_emu::enqueue); with one rank the result is the input, copied when the output
//   is another buffer (the all-gather's output holds the one rank's input). Operations still
//   queued when the communicator is aborted do nothing.
// - A communicator that has been destroyed or aborted is remembered: calls on it return
//   ncclInvalidArgument instead of using freed memory.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>

// The emulator reports itself as NCCL 2.21; patch level 99 marks the emulator.
#define NCCL_MAJOR 2
#define NCCL_MINOR 21
#define NCCL_PATCH 99
#define NCCL_SUFFIX "emulated"
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

struct ncclComm;
typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8,
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1

// Communicator configuration; initialise it with NCCL_CONFIG_INITIALIZER.
typedef struct ncclConfig_v21700 {
  // set by the initializer, not to be changed
  size_t size;
  unsigned int magic;
  unsigned int version;
  // user settings
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                                \
  {                                                                                                            \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_CONFIG_UNDEF_INT, \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR,            \
        NCCL_CONFIG_UNDEF_INT                                                                                  \
  }

typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff,
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclNumTypes = 10,
} ncclDataType_t;

extern "C" {

ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
const char* ncclGetErrorString(ncclResult_t result);
// The last error's explanation ("" if none); never null.
const char* ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);

}  // extern "C"
