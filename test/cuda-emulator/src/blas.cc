// The emulated cuBLAS (see cublas_v2.h for what it validates and how it computes).
#include <cublas_v2.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "parallel.h"
#include "rc_emu/numeric.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
  void* workspace = nullptr;  // a user workspace (cublasSetWorkspace), or null: the default pool
  size_t workspaceBytes = 0;
  bool userWorkspace = false;
};

namespace {

constexpr size_t kWorkspaceAlignment = 256;

// ---- types ------------------------------------------------------------------------------------

bool isKnownDataType(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F:
    case CUDA_R_64F:
    case CUDA_R_16F:
    case CUDA_R_8I:
    case CUDA_R_32I:
    case CUDA_R_8U:
    case CUDA_R_16BF: return true;
  }
  return false;
}

bool isKnownComputeType(cublasComputeType_t t) {
  switch (t) {
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC:
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32:
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
    case CUBLAS_COMPUTE_32I:
    case CUBLAS_COMPUTE_32I_PEDANTIC: return true;
  }
  return false;
}

bool isKnownAlgorithm(cublasGemmAlgo_t algo) {
  const int a = static_cast<int>(algo);
  return a == CUBLAS_GEMM_DEFAULT || (a >= CUBLAS_GEMM_ALGO0 && a <= CUBLAS_GEMM_ALGO23) ||
         a == CUBLAS_GEMM_DEFAULT_TENSOR_OP || (a >= CUBLAS_GEMM_ALGO0_TENSOR_OP && a <= CUBLAS_GEMM_ALGO15_TENSOR_OP);
}

size_t elementSize(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_64F: return 8;
    case CUDA_R_32F:
    case CUDA_R_32I: return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    default: return 1;
  }
}

// How the inputs are rounded before they are multiplied.
enum class InputRounding { None, Tf32, Half, Bf16 };

// The documented type combinations of cublasGemmEx, by compute type. `emulated` is false for the
// ones the emulator does not implement.
bool supportedCombination(cublasComputeType_t compute, cudaDataType_t a, cudaDataType_t b, cudaDataType_t c,
                          bool* emulated) {
  *emulated = true;
  if (a != b) return false;
  switch (compute) {
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC: return a == CUDA_R_16F && c == CUDA_R_16F;
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      return (a == CUDA_R_16BF && (c == CUDA_R_16BF || c == CUDA_R_32F)) ||
             (a == CUDA_R_16F && (c == CUDA_R_16F || c == CUDA_R_32F)) || (a == CUDA_R_8I && c == CUDA_R_32F) ||
             (a == CUDA_R_32F && c == CUDA_R_32F);
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32: return a == CUDA_R_32F && c == CUDA_R_32F;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC: return a == CUDA_R_64F && c == CUDA_R_64F;
    case CUBLAS_COMPUTE_32I:
    case CUBLAS_COMPUTE_32I_PEDANTIC: *emulated = false; return a == CUDA_R_8I && c == CUDA_R_32I;
  }
  return false;
}

// The scaling type of alpha and beta follows the compute type.
double readScale(cublasComputeType_t compute, const void* p) {
  switch (compute) {
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC: return rc_emu::halfBitsToFloat(*static_cast<const uint16_t*>(p));
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC: return *static_cast<const double*>(p);
    default: return *static_cast<const float*>(p);
  }
}

float roundToTf32(float v) {
  if (!std::isfinite(v)) return v;
  return rc_emu::bitsToFloat((rc_emu::floatBits(v) + 0x1000u) & ~0x1fffu);
}

double loadElement(cudaDataType_t t, const void* base, int64_t i, InputRounding rounding) {
  switch (t) {
    case CUDA_R_64F: return static_cast<const double*>(base)[i];
    case CUDA_R_16F: return rc_emu::halfBitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case CUDA_R_16BF: return rc_emu::bf16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case CUDA_R_8I: return static_cast<const int8_t*>(base)[i];
    case CUDA_R_32F: {
      const float v = static_cast<const float*>(base)[i];
      switch (rounding) {
        case InputRounding::Tf32: return roundToTf32(v);
        case InputRounding::Half: return rc_emu::halfBitsToFloat(rc_emu::floatToHalfBits(v));
        case InputRounding::Bf16: return rc_emu::bf16BitsToFloat(rc_emu::floatToBf16Bits(v));
        case InputRounding::None: return v;
      }
      return v;
    }
    default: return 0.0;
  }
}

void storeElement(cudaDataType_t t, void* base, int64_t i, double v) {
  switch (t) {
    case CUDA_R_64F: static_cast<double*>(base)[i] = v; break;
    case CUDA_R_32F: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case CUDA_R_16F: static_cast<uint16_t*>(base)[i] = rc_emu::floatToHalfBits(static_cast<float>(v)); break;
    case CUDA_R_16BF: static_cast<uint16_t*>(base)[i] = rc_emu::floatToBf16Bits(static_cast<float>(v)); break;
    default: break;
  }
}

// Bytes a column-major matrix of rows x cols with leading dimension ld spans (0 when empty).
size_t matrixBytes(int rows, int cols, int ld, cudaDataType_t t) {
  if (rows == 0 || cols == 0) return 0;
  return (static_cast<size_t>(cols - 1) * static_cast<size_t>(ld) + static_cast<size_t>(rows)) * elementSize(t);
}

struct Gemm {
  cublasOperation_t transa, transb;
  int m, n, k;
  double alpha, beta;
  const void* A;
  cudaDataType_t Atype;
  int lda;
  const void* B;
  cudaDataType_t Btype;
  int ldb;
  void* C;
  cudaDataType_t Ctype;
  int ldc;
  InputRounding rounding;
  size_t aBytes, bBytes, cBytes;
};

// C = alpha op(A) op(B) + beta C with double accumulation; C is not read when beta == 0.
void runGemm(const Gemm& g) {
  // op(A) as rows of k (row i = op(A)[i, :]) and op(B) as columns of k (column j = op(B)[:, j]).
  std::vector<double> a, b;
  if (g.k > 0 && g.alpha != 0.0) {
    a.resize(static_cast<size_t>(g.m) * g.k);
    b.resize(static_cast<size_t>(g.n) * g.k);
    for (int i = 0; i < g.m; ++i) {
      for (int l = 0; l < g.k; ++l) {
        const int64_t idx =
            g.transa == CUBLAS_OP_N ? i + static_cast<int64_t>(l) * g.lda : l + static_cast<int64_t>(i) * g.lda;
        a[static_cast<size_t>(i) * g.k + l] = loadElement(g.Atype, g.A, idx, g.rounding);
      }
    }
    for (int j = 0; j < g.n; ++j) {
      for (int l = 0; l < g.k; ++l) {
        const int64_t idx =
            g.transb == CUBLAS_OP_N ? l + static_cast<int64_t>(j) * g.ldb : j + static_cast<int64_t>(l) * g.ldb;
        b[static_cast<size_t>(j) * g.k + l] = loadElement(g.Btype, g.B, idx, g.rounding);
      }
    }
  }
  rc_emu::parallelFor(g.n, static_cast<double>(g.m) * g.k, [&](int64_t j) {
    for (int i = 0; i < g.m; ++i) {
      double sum = 0.0;
      if (!a.empty()) {
        const double* ar = a.data() + static_cast<size_t>(i) * g.k;
        const double* bc = b.data() + static_cast<size_t>(j) * g.k;
        for (int l = 0; l < g.k; ++l) sum += ar[l] * bc[l];
      }
      const int64_t idx = i + j * g.ldc;
      double v = g.alpha * sum;
      if (g.beta != 0.0) v += g.beta * loadElement(g.Ctype, g.C, idx, InputRounding::None);
      storeElement(g.Ctype, g.C, idx, v);
    }
  });
}

}  // namespace

// ---- handles, versions, errors ----------------------------------------------------------------

extern "C" cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new (std::nothrow) cublasContext();
  return *handle == nullptr ? CUBLAS_STATUS_ALLOC_FAILED : CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetVersion(cublasHandle_t, int* version) {
  if (version == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *version = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

extern "C" const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized (no valid handle)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "a resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "the function needs a feature absent from the device architecture";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the requested functionality is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "the requested functionality needs a license";
  }
  return "unknown cuBLAS status";
}

// ---- handle settings --------------------------------------------------------------------------

extern "C" cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t streamId) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = streamId;
  // Documented: setting the stream resets the workspace to the default pool.
  handle->workspace = nullptr;
  handle->workspaceBytes = 0;
  handle->userWorkspace = false;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* streamId) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (streamId == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *streamId = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const int base = static_cast<int>(mode) & ~static_cast<int>(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_TENSOR_OP_MATH && base != CUBLAS_PEDANTIC_MATH &&
      base != CUBLAS_TF32_TENSOR_OP_MATH) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlignment != 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (workspaceSizeInBytes > 0 && (workspace == nullptr || !rc_emu::isDeviceRange(workspace, workspaceSizeInBytes))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  handle->workspace = workspace;
  handle->workspaceBytes = workspaceSizeInBytes;
  handle->userWorkspace = true;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- GEMM -------------------------------------------------------------------------------------

extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                       int n, int k, const void* alpha, const void* A, cudaDataType_t Atype, int lda,
                                       const void* B, cudaDataType_t Btype, int ldb, const void* beta, void* C,
                                       cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                                       cublasGemmAlgo_t algo) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto validOp = [](cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; };
  if (!validOp(transa) || !validOp(transb)) return CUBLAS_STATUS_INVALID_VALUE;
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  // A is stored m x k for OP_N and k x m otherwise; B k x n for OP_N and n x k otherwise.
  const int aRows = transa == CUBLAS_OP_N ? m : k, aCols = transa == CUBLAS_OP_N ? k : m;
  const int bRows = transb == CUBLAS_OP_N ? k : n, bCols = transb == CUBLAS_OP_N ? n : k;
  if (lda < std::max(1, aRows) || ldb < std::max(1, bRows) || ldc < std::max(1, m)) return CUBLAS_STATUS_INVALID_VALUE;
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (!isKnownDataType(Atype) || !isKnownDataType(Btype) || !isKnownDataType(Ctype) ||
      !isKnownComputeType(computeType) || !isKnownAlgorithm(algo)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  bool emulated = true;
  if (!supportedCombination(computeType, Atype, Btype, Ctype, &emulated)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!emulated) return CUBLAS_STATUS_NOT_SUPPORTED;   // integer computation is not emulated
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;  // nothing to compute or write

  Gemm g{};
  g.transa = transa;
  g.transb = transb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = readScale(computeType, alpha);
  g.beta = readScale(computeType, beta);
  g.A = A;
  g.Atype = Atype;
  g.lda = lda;
  g.B = B;
  g.Btype = Btype;
  g.ldb = ldb;
  g.C = C;
  g.Ctype = Ctype;
  g.ldc = ldc;
  g.rounding = InputRounding::None;
  const int baseMath =
      static_cast<int>(handle->math) & ~static_cast<int>(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  if (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 ||
      (computeType == CUBLAS_COMPUTE_32F && Atype == CUDA_R_32F && baseMath == CUBLAS_TF32_TENSOR_OP_MATH)) {
    g.rounding = InputRounding::Tf32;
  } else if (computeType == CUBLAS_COMPUTE_32F_FAST_16F) {
    g.rounding = InputRounding::Half;
  } else if (computeType == CUBLAS_COMPUTE_32F_FAST_16BF) {
    g.rounding = InputRounding::Bf16;
  }
  // A and B are read when there is a product to form.
  const bool readsAB = k > 0 && g.alpha != 0.0;
  g.aBytes = readsAB ? matrixBytes(aRows, aCols, lda, Atype) : 0;
  g.bBytes = readsAB ? matrixBytes(bRows, bCols, ldb, Btype) : 0;
  g.cBytes = matrixBytes(m, n, ldc, Ctype);
  if ((g.aBytes > 0 && (A == nullptr || !rc_emu::isDeviceRange(A, g.aBytes))) ||
      (g.bBytes > 0 && (B == nullptr || !rc_emu::isDeviceRange(B, g.bBytes))) || C == nullptr ||
      !rc_emu::isDeviceRange(C, g.cBytes)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (rc_emu::checkLaunchDevice(handle->stream) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  const cudaError_t e = rc_emu::enqueue(
      handle->stream,
      [g] {
        if ((g.aBytes > 0 && !rc_emu::isDeviceRange(g.A, g.aBytes)) ||
            (g.bBytes > 0 && !rc_emu::isDeviceRange(g.B, g.bBytes)) || !rc_emu::isDeviceRange(g.C, g.cBytes)) {
          rc_emu::deviceFault("cublasGemmEx: A, B or C is no longer allocated device memory when it runs");
          return;
        }
        try {
          runGemm(g);
        } catch (const std::bad_alloc&) {
          rc_emu::deviceFault("cublasGemmEx: the emulator ran out of host memory");
        }
      },
      "cublasGemmEx");
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
