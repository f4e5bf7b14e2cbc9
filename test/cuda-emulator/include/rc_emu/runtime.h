// The CUDA emulator's runtime interface, shared by its parts (kernel execution, the cuDNN, cuBLAS
// and NCCL stand-ins) and by the emulated cuda_runtime.h.
//
// The emulator runs the CUDA backend's own sources on the host: kernels execute as one coroutine
// per CUDA thread, device memory is host memory the emulator tracks, and each stream is a queue of
// operations that runs only when the host waits for it (a stream synchronisation, an event wait,
// a copy into pageable memory), so that the host can never rely on work having run without waiting
// for it. Between cudaStreamBeginCapture and cudaStreamEndCapture operations are recorded into the
// graph instead; a graph launch replays them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

// ---- types every emulated header needs ---------------------------------------------------------

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotPermitted = 800,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorUnknown = 999,
};
typedef enum cudaError_t cudaError;

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace rc_emu {

// Queues `op` on `stream` (nullptr: the legacy default stream). It runs when the stream is next
// flushed (the host waits for it), or is recorded into the graph being captured on `stream`.
// `what` names the operation in error messages. Returns cudaSuccess, or the error the call must
// return (the context is broken by an earlier device fault; the operation is not allowed while
// capturing); never throws.
cudaError_t enqueue(cudaStream_t stream, std::function<void()> op, const char* what);

// For a kernel launch (ours or a library's) on `stream`: cudaSuccess, or
// cudaErrorInvalidResourceHandle when the stream belongs to another device than the calling
// thread's current one (a kernel launch fails then; copies do not).
cudaError_t checkLaunchDevice(cudaStream_t stream);

// Whether `stream` is capturing a graph.
bool isCapturing(cudaStream_t stream);

// Sets the error the next cudaGetLastError / cudaPeekAtLastError returns (a bad launch
// configuration). Not sticky.
void setLastError(cudaError_t error);

// Reports a fault found while device work ran (an out-of-range pointer, a barrier not reached by all
// threads, ...): prints it to stderr, and makes the context unusable like a real device fault
// (every later call returns cudaErrorLaunchFailure, whose cudaGetErrorString carries `message`).
void deviceFault(const std::string& message);
// True once deviceFault has been called; kernel execution stops early then.
bool faulted();

// Whether [p, p + bytes) lies inside one live device allocation (cudaMalloc/cudaMallocAsync, or a
// graph's allocation). bytes = 0 checks p alone (p may not be one past the end).
bool isDeviceRange(const void* p, size_t bytes);
// Like isDeviceRange, for memory the host may read or write: pageable host memory or pinned
// (cudaMallocHost/cudaHostAlloc) memory, i.e. anything that is not device memory.
bool isPinnedHost(const void* p, size_t bytes);

// The byte pattern fresh device memory is filled with (0xff: NaN in f32, bf16 and f16), so that
// reading memory nothing wrote shows up in results.
constexpr unsigned char kUninitializedByte = 0xff;

}  // namespace rc_emu
