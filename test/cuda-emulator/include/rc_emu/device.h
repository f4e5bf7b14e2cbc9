// What device code needs to compile and run under the host compiler: the CUDA qualifiers, dim3 and
// the built-in index variables, barriers, warp shuffles and votes, atomics, the math helpers, and
// the kernel launch that the .cu translation (translate.mjs) turns `kernel<<<cfg>>>(args)` into:
//
//   ::rc_emu::launch(kernel, "kernel", grid, block, sharedBytes, stream)(args...)
//
// A launch converts its arguments to the kernel's parameter types at once (by value, as CUDA
// does), checks the configuration and queues the kernel on the stream. When the stream runs it,
// the executor (src/kernel_exec.cc) runs the blocks one after another and, within a block, every
// CUDA thread as a coroutine that runs until it waits at a barrier or a warp operation. Barrier and
// warp-operation misuse (divergent __syncthreads, a thread exiting while others wait for it,
// lanes missing from a shuffle's mask, deadlock) is a device fault, reported through
// rc_emu::deviceFault.
//
// `__shared__` variables are function-local `static thread_local` objects: every emulated thread
// of a block runs on the same host thread and so sees the same object. In translated kernels, the
// first thread of each block to reach a declaration fills the variable with kUninitializedByte
// (poisonStaticShared), as dynamic shared memory (`extern __shared__ T name[]`, translated to
// rc_emu::dynamicShared<T>()) is filled at the start of every block: reading shared memory that no
// thread of the block wrote gives NaN bytes, not the previous block's values.
//
// Schedule: RESNET_CUDA_EMU_SCHEDULE = forward (default: the lowest-numbered runnable thread runs
// next), reverse (the highest), random (seeded by RESNET_CUDA_EMU_SEED). Threads always run until
// they block; after a barrier or warp operation completes, every released thread (the last one to
// arrive included) is runnable again and the schedule picks among them, so a missing barrier shows
// up as results that differ between schedules.
#pragma once

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "runtime.h"

// ---- qualifiers ----------------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __constant__
// Every emulated thread of a block shares one object (see the top of this file).
#define __shared__ static thread_local
#define __managed__

// ---- vector types and the built-in variables ------------------------------------------------------

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

inline constexpr uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return uint3{x, y, z}; }

inline constexpr int warpSize = 32;

namespace rc_emu {
namespace detail {

// The emulated thread running now on this host thread (all zeros outside kernels).
struct CurrentThread {
  uint3 thread;  // threadIdx
  uint3 block;   // blockIdx
  dim3 blockShape;
  dim3 gridShape;
  void* dynamicShared;
  uint64_t blockSerial;  // a number no other block run on this host thread had
};
inline thread_local CurrentThread tCurrent{{0, 0, 0}, {0, 0, 0}, dim3(), dim3(), nullptr, 0};

inline uint3 threadIdxValue() { return tCurrent.thread; }
inline uint3 blockIdxValue() { return tCurrent.block; }
inline dim3 blockDimValue() { return tCurrent.blockShape; }
inline dim3 gridDimValue() { return tCurrent.gridShape; }

}  // namespace detail
}  // namespace rc_emu

// Read-only values, as on the device.
#define threadIdx (::rc_emu::detail::threadIdxValue())
#define blockIdx (::rc_emu::detail::blockIdxValue())
#define blockDim (::rc_emu::detail::blockDimValue())
#define gridDim (::rc_emu::detail::gridDimValue())

// ---- executor interface (src/kernel_exec.cc) ---------------------------------------------------------

namespace rc_emu {

enum class Schedule { kForward, kReverse, kRandom };

// The schedule kernels run with: from the environment unless set here (tests compare schedules).
Schedule schedule();
uint64_t scheduleSeed();
void setSchedule(Schedule schedule, uint64_t seed);

// Reports a fault found by device code (a failed device-side check, __trap, misuse of a cub
// collective), naming the kernel, block and thread, and stops the kernel: when called from an
// emulated thread it does not return (so the caller should hold no heap memory: format the
// message into a local buffer). Outside a kernel it reports the fault and returns.
void deviceCodeFault(const char* what);

namespace detail {

struct KernelLaunch {
  const char* name;
  dim3 grid, block;
  size_t sharedBytes;
};

// Runs every block of the launch, calling body(context) as each CUDA thread.
void runKernel(const KernelLaunch& launch, void (*body)(const void*), const void* context);

// Checks a pointer argument when the kernel is about to run: null or device memory; otherwise a
// device fault "kernel <name>: argument <index> (<pointer>) is not device memory" (index from 0).
bool checkKernelPointer(const char* kernel, size_t index, const void* pointer);

// Where a barrier or warp operation is called from: threads must meet at the same one.
struct Site {
  const char* file;
  int line;
};

void syncThreads(Site site);

enum class WarpOp { kSync, kShflIdx, kShflUp, kShflDown, kShflXor, kVote };

// One lane's part in a warp operation over `mask`: publishes `bits` (and, for shuffles, `lane`, the
// source lane / delta / xor mask, and `width`), waits for the lanes of the mask, and returns the
// value of the source lane (shuffles), or the ballot of the lanes' `bits != 0` (votes).
uint64_t warpOp(WarpOp op, unsigned mask, uint64_t bits, int lane, int width, Site site);

template <typename T>
uint64_t toBits(T v) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>,
                "shuffled values are at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  return bits;
}

template <typename T>
T fromBits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

}  // namespace detail
}  // namespace rc_emu

// ---- barriers and warp operations ----------------------------------------------------------------

// The call site (file, line) identifies the barrier: all threads of the block must wait at
// the same one.
inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::rc_emu::detail::syncThreads({file, line});
}

inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::rc_emu::detail::warpOp(::rc_emu::detail::WarpOp::kSync, mask, 0, 0, 32, {file, line});
}

// The shuffles of CUDA's overload set (lanes of the mask only; width a power of two up to 32).
#define RC_EMU_SHUFFLE_ONE(T, NAME, OP, SOURCE_TYPE, SOURCE)                                                   \
  inline T NAME(unsigned mask, T var, SOURCE_TYPE SOURCE, int width = 32, const char* file = __builtin_FILE(), \
                int line = __builtin_LINE()) {                                                                 \
    using namespace ::rc_emu::detail;                                                                          \
    return fromBits<T>(warpOp(WarpOp::OP, mask, toBits(var), static_cast<int>(SOURCE), width, {file, line}));  \
  }
#define RC_EMU_SHUFFLE(T)                                             \
  RC_EMU_SHUFFLE_ONE(T, __shfl_sync, kShflIdx, int, srcLane)          \
  RC_EMU_SHUFFLE_ONE(T, __shfl_up_sync, kShflUp, unsigned, delta)     \
  RC_EMU_SHUFFLE_ONE(T, __shfl_down_sync, kShflDown, unsigned, delta) \
  RC_EMU_SHUFFLE_ONE(T, __shfl_xor_sync, kShflXor, int, laneMask)

RC_EMU_SHUFFLE(int)
RC_EMU_SHUFFLE(unsigned int)
RC_EMU_SHUFFLE(long)
RC_EMU_SHUFFLE(unsigned long)
RC_EMU_SHUFFLE(long long)
RC_EMU_SHUFFLE(unsigned long long)
RC_EMU_SHUFFLE(float)
RC_EMU_SHUFFLE(double)
#undef RC_EMU_SHUFFLE
#undef RC_EMU_SHUFFLE_ONE

inline unsigned __ballot_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return static_cast<unsigned>(
      ::rc_emu::detail::warpOp(::rc_emu::detail::WarpOp::kVote, mask, predicate != 0 ? 1u : 0u, 0, 32, {file, line}));
}
inline int __any_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return __ballot_sync(mask, predicate, file, line) != 0;
}
inline int __all_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return __ballot_sync(mask, predicate, file, line) == mask;
}

// Stops the kernel with a device fault (the device's trap instruction).
inline void __trap() { ::rc_emu::deviceCodeFault("__trap() called"); }

// Global memory is ordinary host memory; fences order nothing among cooperatively run threads.
inline void __threadfence() {}
inline void __threadfence_block() {}

// ---- loads, atomics, math --------------------------------------------------------------------------

template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

namespace rc_emu {
namespace detail {

template <typename T>
T atomicUpdate(T* address, T (*update)(T, T), T operand) {
  T old = __atomic_load_n(address, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(address, &old, update(old, operand), true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}

// Floating-point atomics: a compare-and-swap loop on the bits.
template <typename F, typename U>
F atomicFloatUpdate(F* address, F (*update)(F, F), F operand) {
  static_assert(sizeof(F) == sizeof(U), "bits of the same width");
  U* bits = reinterpret_cast<U*>(address);
  U old = __atomic_load_n(bits, __ATOMIC_RELAXED);
  for (;;) {
    const F value = update(fromBits<F>(old), operand);
    U next;
    std::memcpy(&next, &value, sizeof next);
    if (__atomic_compare_exchange_n(bits, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      return fromBits<F>(old);
    }
  }
}

}  // namespace detail
}  // namespace rc_emu

#define RC_EMU_INTEGER_ATOMICS(T)                                                                            \
  inline T atomicAdd(T* address, T value) { return __atomic_fetch_add(address, value, __ATOMIC_RELAXED); }   \
  inline T atomicSub(T* address, T value) { return __atomic_fetch_sub(address, value, __ATOMIC_RELAXED); }   \
  inline T atomicExch(T* address, T value) { return __atomic_exchange_n(address, value, __ATOMIC_RELAXED); } \
  inline T atomicOr(T* address, T value) { return __atomic_fetch_or(address, value, __ATOMIC_RELAXED); }     \
  inline T atomicAnd(T* address, T value) { return __atomic_fetch_and(address, value, __ATOMIC_RELAXED); }   \
  inline T atomicXor(T* address, T value) { return __atomic_fetch_xor(address, value, __ATOMIC_RELAXED); }   \
  inline T atomicMax(T* address, T value) {                                                                  \
    return ::rc_emu::detail::atomicUpdate<T>(                                                                \
        address, [](T a, T b) { return a < b ? b : a; }, value);                                             \
  }                                                                                                          \
  inline T atomicMin(T* address, T value) {                                                                  \
    return ::rc_emu::detail::atomicUpdate<T>(                                                                \
        address, [](T a, T b) { return b < a ? b : a; }, value);                                             \
  }                                                                                                          \
  inline T atomicCAS(T* address, T compare, T value) {                                                       \
    __atomic_compare_exchange_n(address, &compare, value, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);        \
    return compare;                                                                                          \
  }

RC_EMU_INTEGER_ATOMICS(int)
RC_EMU_INTEGER_ATOMICS(unsigned int)
RC_EMU_INTEGER_ATOMICS(unsigned long long)
RC_EMU_INTEGER_ATOMICS(long long)
#undef RC_EMU_INTEGER_ATOMICS

inline float atomicAdd(float* address, float value) {
  return ::rc_emu::detail::atomicFloatUpdate<float, uint32_t>(
      address, [](float a, float b) { return a + b; }, value);
}
inline double atomicAdd(double* address, double value) {
  return ::rc_emu::detail::atomicFloatUpdate<double, uint64_t>(
      address, [](double a, double b) { return a + b; }, value);
}
inline float atomicExch(float* address, float value) {
  return ::rc_emu::detail::atomicFloatUpdate<float, uint32_t>(
      address, [](float, float b) { return b; }, value);
}
// The device's float max/min ignore NaN operands, like fmaxf/fminf.
inline float atomicMax(float* address, float value) {
  return ::rc_emu::detail::atomicFloatUpdate<float, uint32_t>(
      address, [](float a, float b) { return fmaxf(a, b); }, value);
}
inline float atomicMin(float* address, float value) {
  return ::rc_emu::detail::atomicFloatUpdate<float, uint32_t>(
      address, [](float a, float b) { return fminf(a, b); }, value);
}

// Device code calls min/max unqualified with two operands of one type (int64_t, int, ...);
// floating-point operands follow fminf/fmaxf (a NaN operand loses), as on the device.
template <typename T>
constexpr T min(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
constexpr T max(T a, T b) {
  return a < b ? b : a;
}
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN -> 0

// ---- dynamic shared memory -------------------------------------------------------------------------

namespace rc_emu {

// The current block's dynamic shared memory (`extern __shared__ T name[]`): the launch's
// sharedBytes, 16-byte aligned, filled with kUninitializedByte when the block starts.
// A static __shared__ variable is filled with kUninitializedByte by the first thread of each block
// that reaches its declaration (shared memory is undefined at a block's start; without this, a
// block would see what the previous block left). The translated kernels call it after each such
// declaration, with a per-variable `lastBlock`.
inline void poisonStaticShared(void* p, size_t bytes, uint64_t& lastBlock) {
  if (lastBlock == detail::tCurrent.blockSerial) return;
  lastBlock = detail::tCurrent.blockSerial;
  std::memset(p, kUninitializedByte, bytes);
}

template <typename T>
T* dynamicShared() {
  return static_cast<T*>(detail::tCurrent.dynamicShared);
}

// ---- launch ------------------------------------------------------------------------------------------

// Limits checked at launch, as on the device: otherwise cudaErrorInvalidConfiguration.
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDimZ = 64;
constexpr unsigned kMaxGridDimX = 0x7fffffffu;
constexpr unsigned kMaxGridDimYZ = 65535;
constexpr size_t kMaxDynamicSharedBytes = 48 * 1024;

inline bool validLaunchConfiguration(dim3 grid, dim3 block, size_t sharedBytes) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0) return false;
  if (block.x > kMaxThreadsPerBlock || block.y > kMaxThreadsPerBlock || block.z > kMaxBlockDimZ) return false;
  if (static_cast<uint64_t>(block.x) * block.y * block.z > kMaxThreadsPerBlock) return false;
  if (grid.x > kMaxGridDimX || grid.y > kMaxGridDimYZ || grid.z > kMaxGridDimYZ) return false;
  return sharedBytes <= kMaxDynamicSharedBytes;
}

namespace detail {

// Kernel parameters take their argument as a function parameter does (implicit conversion).
template <typename To>
To convertArgument(To value) {
  return value;
}

template <typename T>
bool checkArgument(const char*, size_t, const T&) {
  return true;
}
template <typename T>
bool checkArgument(const char* kernel, size_t index, T* pointer) {
  if constexpr (std::is_function_v<T>) {
    return true;
  } else {
    return checkKernelPointer(kernel, index, const_cast<const void*>(static_cast<const volatile void*>(pointer)));
  }
}

template <typename Tuple, size_t... I>
bool checkArguments(const char* kernel, const Tuple& params, std::index_sequence<I...>) {
  bool ok = true;
  ((ok = ok && checkArgument(kernel, I, std::get<I>(params))), ...);
  return ok;
}

template <typename... P>
struct KernelCall {
  void (*kernel)(P...);
  const std::tuple<P...>* params;

  // Each emulated thread gets its own copy of the parameters.
  static void run(const void* context) {
    const auto* call = static_cast<const KernelCall*>(context);
    std::apply(call->kernel, *call->params);
  }
};

}  // namespace detail

template <typename... P>
class Launcher {
 public:
  Launcher(void (*kernel)(P...), const char* name, dim3 grid, dim3 block, size_t sharedBytes, cudaStream_t stream)
      : kernel_(kernel), name_(name), grid_(grid), block_(block), sharedBytes_(sharedBytes), stream_(stream) {}

  template <typename... Args>
  void operator()(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(P), "a kernel launch passes one argument per kernel parameter");
    static_assert((!std::is_reference_v<P> && ...), "kernel parameters are passed by value");
    std::tuple<P...> params{detail::convertArgument<P>(std::forward<Args>(args))...};
    if (!validLaunchConfiguration(grid_, block_, sharedBytes_)) {
      setLastError(cudaErrorInvalidConfiguration);
      return;
    }
    const detail::KernelLaunch launch{name_, grid_, block_, sharedBytes_};
    auto task = [kernel = kernel_, launch, params = std::move(params)]() {
      if (faulted()) return;
      if (!detail::checkArguments(launch.name, params, std::index_sequence_for<P...>{})) return;
      const detail::KernelCall<P...> call{kernel, &params};
      detail::runKernel(launch, &detail::KernelCall<P...>::run, &call);
    };
    cudaError_t status = checkLaunchDevice(stream_);
    if (status == cudaSuccess) status = enqueue(stream_, std::move(task), name_);
    if (status != cudaSuccess) setLastError(status);
  }

 private:
  void (*kernel_)(P...);
  const char* name_;
  dim3 grid_, block_;
  size_t sharedBytes_;
  cudaStream_t stream_;
};

// `kernel<<<grid, block, sharedBytes, stream>>>(args...)` is `launch(kernel, "kernel", grid, block,
// sharedBytes, stream)(args...)`.
template <typename... P>
Launcher<P...> launch(void (*kernel)(P...), const char* name, dim3 grid, dim3 block, size_t sharedBytes = 0,
                      cudaStream_t stream = nullptr) {
  return Launcher<P...>(kernel, name, grid, block, sharedBytes, stream);
}

}  // namespace rc_emu
