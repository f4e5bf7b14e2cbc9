// Status checks for the CUDA runtime, cuDNN, cuBLAS and NCCL: every call's status is checked and
// a failure becomes rc::Error naming the library, the status and the call (file:line added).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include "../core/error.h"

#define RC_CUDA_CHECK(expr)                                                                            \
  do {                                                                                                 \
    const cudaError_t rcStatus_ = (expr);                                                              \
    if (rcStatus_ != cudaSuccess) {                                                                    \
      (void)cudaGetLastError(); /* not to be reported again by the next launch check */                \
      RC_THROW(::rc::code::kCuda, "CUDA error " << cudaGetErrorName(rcStatus_) << " ("                 \
                                                << cudaGetErrorString(rcStatus_) << ") in " << #expr); \
    }                                                                                                  \
  } while (0)

#define RC_CUDNN_CHECK(expr, context)                                                                      \
  do {                                                                                                     \
    const cudnnStatus_t rcStatus_ = (expr);                                                                \
    if (rcStatus_ != CUDNN_STATUS_SUCCESS) {                                                               \
      RC_THROW(::rc::code::kCudnn,                                                                         \
               "cuDNN error " << cudnnGetErrorString(rcStatus_) << " in " << #expr << " for " << context); \
    }                                                                                                      \
  } while (0)

#define RC_CUBLAS_CHECK(expr, context)                                                                                 \
  do {                                                                                                                 \
    const cublasStatus_t rcStatus_ = (expr);                                                                           \
    if (rcStatus_ != CUBLAS_STATUS_SUCCESS) {                                                                          \
      RC_THROW(::rc::code::kCublas, "cuBLAS error " << cublasGetStatusName(rcStatus_) << " ("                          \
                                                    << cublasGetStatusString(rcStatus_) << ") in " << #expr << " for " \
                                                    << context);                                                       \
    }                                                                                                                  \
  } while (0)

#define RC_NCCL_CHECK(expr)                                                                           \
  do {                                                                                                \
    const ncclResult_t rcStatus_ = (expr);                                                            \
    if (rcStatus_ != ncclSuccess && rcStatus_ != ncclInProgress) {                                    \
      RC_THROW(::rc::code::kNccl, "NCCL error " << ncclGetErrorString(rcStatus_) << " in " << #expr); \
    }                                                                                                 \
  } while (0)
