// Unit test of the emulator's kernel executor (src/kernel_exec.cc), the device header and the cub
// stand-ins, against a minimal runtime defined here. Build and run from the repository root:
//
//   g++ -std=c++17 -O1 -Wall -Wextra -I test/cuda-emulator/include test/cuda-emulator/test/executor_test.cc
//   test/cuda-emulator/src/kernel_exec.cc -o executor_test
//   ./executor_test          (add --bench to time 4096x256-thread launches)
//
// It passes under every schedule (RESNET_CUDA_EMU_SCHEDULE=forward|reverse|random), and built with
// -fsanitize=address,undefined too: the executor annotates its stack switches for ASan, so no
// ASAN_OPTIONS are needed (detect_stack_use_after_return=0 and =1 both pass); in ASan builds the
// thread stacks default to 256 KiB instead of 64 (RESNET_CUDA_EMU_STACK_KB sets the size).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cub/block/block_reduce.cuh"
#include "cub/block/block_scan.cuh"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "rc_emu/device.h"
#include "rc_emu/runtime.h"

// ---- the runtime, as far as the executor needs it ----------------------------------------------------

namespace {

struct TestRuntime {
  bool faulted = false;
  int faultCount = 0;
  std::string faultMessage;
  cudaError_t lastError = cudaSuccess;
  bool defer = false;  // queue launches until flush() instead of running them at once
  std::deque<std::function<void()>> queue;
  std::vector<std::pair<const char*, size_t>> deviceRanges;
};

TestRuntime& rt() {
  static TestRuntime r;
  return r;
}

void flush() {
  while (!rt().queue.empty()) {
    auto op = std::move(rt().queue.front());
    rt().queue.pop_front();
    op();
  }
}

void resetFault() {
  rt().faulted = false;
  rt().faultCount = 0;
  rt().faultMessage.clear();
  rt().lastError = cudaSuccess;
}

}  // namespace

namespace rc_emu {

cudaError_t enqueue(cudaStream_t, std::function<void()> op, const char*) {
  if (rt().faulted) return cudaErrorLaunchFailure;
  if (rt().defer) {
    rt().queue.push_back(std::move(op));
  } else {
    op();
  }
  return cudaSuccess;
}

cudaError_t checkLaunchDevice(cudaStream_t) { return cudaSuccess; }
bool isCapturing(cudaStream_t) { return false; }

void setLastError(cudaError_t error) { rt().lastError = error; }

void deviceFault(const std::string& message) {
  if (!rt().faulted) rt().faultMessage = message;
  rt().faulted = true;
  ++rt().faultCount;
}

bool faulted() { return rt().faulted; }

bool isDeviceRange(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (const auto& [base, size] : rt().deviceRanges) {
    if (c >= base && c < base + size && (bytes == 0 || static_cast<size_t>(base + size - c) >= bytes)) return true;
  }
  return false;
}

bool isPinnedHost(const void* p, size_t bytes) { return !isDeviceRange(p, bytes); }

}  // namespace rc_emu

namespace {

// Host memory registered as device memory for the test's lifetime of the buffer.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n, T fill = T{}) : data_(n, fill) {
    rt().deviceRanges.emplace_back(reinterpret_cast<const char*>(data_.data()), n * sizeof(T));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    auto& ranges = rt().deviceRanges;
    for (size_t i = 0; i < ranges.size(); ++i) {
      if (ranges[i].first == reinterpret_cast<const char*>(data_.data())) {
        ranges.erase(ranges.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
  }
  T* get() { return data_.data(); }
  T& operator[](size_t i) { return data_[i]; }
  std::vector<T>& host() { return data_; }

 private:
  std::vector<T> data_;
};

int passed = 0, failedChecks = 0;

void check(const std::string& name, bool ok, const std::string& detail = "") {
  if (ok) {
    ++passed;
    std::printf("PASS %s\n", name.c_str());
  } else {
    ++failedChecks;
    std::printf("FAIL %s%s%s\n", name.c_str(), detail.empty() ? "" : ": ", detail.c_str());
  }
  std::fflush(stdout);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Checks that the last launch faulted with a message containing every part, then clears the fault.
void expectFault(const std::string& name, std::initializer_list<const char*> parts) {
  bool ok = rt().faulted && rt().faultCount == 1;
  for (const char* p : parts) ok = ok && contains(rt().faultMessage, p);
  check(name, ok, rt().faulted ? "message: " + rt().faultMessage : "no fault");
  resetFault();
}

void expectNoFault(const std::string& name) {
  check(name, !rt().faulted && rt().lastError == cudaSuccess, rt().faultMessage);
  resetFault();
}

const char* scheduleName(rc_emu::Schedule s) {
  switch (s) {
    case rc_emu::Schedule::kForward: return "forward";
    case rc_emu::Schedule::kReverse: return "reverse";
    case rc_emu::Schedule::kRandom: return "random";
  }
  return "?";
}

// Runs f under each schedule (random with a few seeds), restoring the environment's schedule.
template <typename F>
void forEachSchedule(F&& f) {
  const rc_emu::Schedule saved = rc_emu::schedule();
  const uint64_t savedSeed = rc_emu::scheduleSeed();
  const std::pair<rc_emu::Schedule, uint64_t> runs[] = {{rc_emu::Schedule::kForward, 1},
                                                        {rc_emu::Schedule::kReverse, 1},
                                                        {rc_emu::Schedule::kRandom, 1},
                                                        {rc_emu::Schedule::kRandom, 2},
                                                        {rc_emu::Schedule::kRandom, 12345}};
  for (const auto& [s, seed] : runs) {
    rc_emu::setSchedule(s, seed);
    f(std::string(scheduleName(s)) + (s == rc_emu::Schedule::kRandom ? "/" + std::to_string(seed) : ""));
  }
  rc_emu::setSchedule(saved, savedSeed);
}

// ---- kernels ---------------------------------------------------------------------------------------------

constexpr int kBlock = 256;

// Sum of each block's values by a shared-memory tree (stride halving), like the project's kernels.
__global__ void block_sum_kernel(const float* in, float* out) {
  __shared__ float s[kBlock];
  const int tid = static_cast<int>(threadIdx.x);
  s[tid] = in[blockIdx.x * kBlock + tid];
  __syncthreads();
  for (int half = kBlock / 2; half > 0; half /= 2) {
    if (tid < half) s[tid] += s[tid + half];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = s[0];
}

float hostBlockSum(const float* v) {
  float s[kBlock];
  std::copy(v, v + kBlock, s);
  for (int half = kBlock / 2; half > 0; half /= 2) {
    for (int i = 0; i < half; ++i) s[i] += s[i + half];
  }
  return s[0];
}

// Each thread reads its neighbours' values: correct only with the barrier.
__global__ void neighbour_kernel(const int* in, int* out, bool barrier) {
  __shared__ int s[kBlock];
  const int tid = static_cast<int>(threadIdx.x);
  s[tid] = in[blockIdx.x * kBlock + tid];
  if (barrier) __syncthreads();
  out[blockIdx.x * kBlock + tid] = s[(tid + 1) % kBlock] - s[(tid + kBlock - 1) % kBlock];
}

struct ShuffleCase {
  int kind;  // 0 idx, 1 up, 2 down, 3 xor
  int param;
  int width;
};

__global__ void shuffle_kernel(const ShuffleCase* cases, int caseCount, int* out) {
  const int tid = static_cast<int>(threadIdx.x);
  const int v = tid * 10 + 7;
  for (int c = 0; c < caseCount; ++c) {
    const ShuffleCase sc = cases[c];
    int r = 0;
    switch (sc.kind) {
      case 0: r = __shfl_sync(0xffffffffu, v, sc.param, sc.width); break;
      case 1: r = __shfl_up_sync(0xffffffffu, v, static_cast<unsigned>(sc.param), sc.width); break;
      case 2: r = __shfl_down_sync(0xffffffffu, v, static_cast<unsigned>(sc.param), sc.width); break;
      default: r = __shfl_xor_sync(0xffffffffu, v, sc.param, sc.width); break;
    }
    out[c * static_cast<int>(blockDim.x) + tid] = r;
  }
}

// The documented shuffle results (CUDA programming guide), computed independently of the executor.
int expectedShuffle(const ShuffleCase& c, int lane, int warpBase) {
  const int w = c.width;
  const int segment = lane / w * w;
  int src = lane;
  switch (c.kind) {
    case 0: src = segment + (c.param & (w - 1)); break;
    case 1: src = lane % w >= c.param ? lane - c.param : lane; break;
    case 2: src = lane % w + c.param < w ? lane + c.param : lane; break;
    default: {
      const int target = lane ^ c.param;
      src = target < segment + w ? target : lane;  // later segments are out of reach
      break;
    }
  }
  return (warpBase + src) * 10 + 7;
}

// Warp sums of several types with full-mask shuffles (the project's finalize kernels' pattern),
// plus a ballot and a partial-mask shuffle within the lower half-warp.
__global__ void warp_types_kernel(const double* in, double* sums, int64_t* isums, float* fsums, unsigned* ballots,
                                  int* half) {
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  double d = in[tid];
  int64_t i = static_cast<int64_t>(in[tid] * 1000.0);
  float f = static_cast<float>(in[tid]);
  for (int offset = 16; offset > 0; offset /= 2) {
    d += __shfl_down_sync(0xffffffffu, d, offset);
    i += __shfl_down_sync(0xffffffffu, i, offset);
    f += __shfl_xor_sync(0xffffffffu, f, offset);
  }
  if (lane == 0) {
    sums[tid / 32] = d;
    isums[tid / 32] = i;
  }
  fsums[tid] = f;
  ballots[tid] = __ballot_sync(0xffffffffu, (tid % 3) == 0);
  if (lane < 16) half[tid] = __shfl_down_sync(0x0000ffffu, tid, 1, 16);
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void exit_before_barrier_kernel(int* out) {
  if (threadIdx.x == 3) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void shuffle_exited_lane_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (lane == 5) return;
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, lane, 1);
}

__global__ void partial_warp_kernel(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

__global__ void different_shuffles_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  int r;
  if (lane < 16) {
    r = __shfl_xor_sync(0xffffffffu, lane, 1);
  } else {
    r = __shfl_xor_sync(0xffffffffu, lane, 2);
  }
  out[threadIdx.x] = r;
}

// Lane 0 waits at the block barrier while the other lanes wait for it at __syncwarp.
__global__ void deadlock_kernel(int* out) {
  if (threadIdx.x == 0) {
    __syncthreads();
  } else {
    __syncwarp();
  }
  out[threadIdx.x] = 1;
}

__global__ void mask_without_self_kernel(int* out) { out[threadIdx.x] = __shfl_sync(0x1u, 1, 0); }

__global__ void trap_kernel(int* reached, int* after) {
  atomicAdd(reached, 1);
  if (blockIdx.x == 0 && threadIdx.x == 7) __trap();
  __syncthreads();
  atomicAdd(after, 1);
}

__global__ void throw_kernel(int* out) {
  if (threadIdx.x == 2) throw std::runtime_error("bad thing");
  out[threadIdx.x] = 1;
}

// Dynamic shared memory: 0xff at every block start, 16-byte aligned, shared by the block's threads.
__global__ void dynamic_shared_kernel(int* out, int words) {
  int* s = ::rc_emu::dynamicShared<int>();
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    bool fresh = true;
    for (int i = 0; i < words; ++i) fresh = fresh && s[i] == -1;
    out[blockIdx.x * 3] = fresh ? 1 : 0;
    out[blockIdx.x * 3 + 1] = reinterpret_cast<uintptr_t>(s) % 16 == 0 ? 1 : 0;
  }
  __syncthreads();
  for (int i = tid; i < words; i += static_cast<int>(blockDim.x)) s[i] = i;
  __syncthreads();
  if (tid == 0) {
    int sum = 0;
    for (int i = 0; i < words; ++i) sum += s[i];
    out[blockIdx.x * 3 + 2] = sum;
  }
}

__global__ void shared_overrun_kernel(int words) {
  int* s = ::rc_emu::dynamicShared<int>();
  if (threadIdx.x == 0) s[words] = 42;
}

__global__ void pointer_kernel(int* a, const float* b, int* c) {
  if (threadIdx.x == 0) {
    a[0] = 1;
    if (c != nullptr) c[0] = b == nullptr ? 2 : 3;
  }
}

__global__ void noop_kernel(int* out) { out[0] += 1; }

struct Params {
  int64_t base;
  float scale;
};

// The parameters are each thread's own copies, converted at launch.
__global__ void params_kernel(Params p, int64_t n, float x, int64_t* out, float* fout) {
  p.base += threadIdx.x;
  out[threadIdx.x] = p.base + n;
  if (threadIdx.x == 0) fout[0] = x * p.scale;
}

// Index mapping of 3-D blocks and grids.
__global__ void index_kernel(int* out) {
  const int t = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int b = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  const int threads = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  // The ballot tells the warp's lanes apart: lanes are consecutive linear thread indices.
  const unsigned ballot = __ballot_sync(0xffffffffu, t % 32 == 5);
  out[b * threads + t] = static_cast<int>(threadIdx.x) + 10 * static_cast<int>(threadIdx.y) +
                         100 * static_cast<int>(threadIdx.z) + 1000 * b + (ballot == (1u << 5) ? 1000000 : 0);
}

__global__ void grid_kernel(int* out) {
  if (threadIdx.x == 0) {
    const int b = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    out[b] = static_cast<int>(blockIdx.x) + 100 * static_cast<int>(blockIdx.y) + 10000 * static_cast<int>(blockIdx.z);
  }
}

using BlockReduceD = cub::BlockReduce<double, kBlock>;
using BlockScanL = cub::BlockScan<int64_t, kBlock>;

__global__ void cub_reduce_kernel(const double* in, double* out, int numValid) {
  __shared__ BlockReduceD::TempStorage storage;
  const int tid = static_cast<int>(threadIdx.x);
  const double v = in[blockIdx.x * kBlock + tid];
  const double sum = BlockReduceD(storage).Sum(v);
  __syncthreads();
  const double mx = BlockReduceD(storage).Reduce(v, cub::Max());
  __syncthreads();
  const double partial = BlockReduceD(storage).Sum(v, numValid);
  if (tid == 0) {
    out[blockIdx.x * 3] = sum;
    out[blockIdx.x * 3 + 1] = mx;
    out[blockIdx.x * 3 + 2] = partial;
  }
}

double hostTreeReduce(const double* v, int count, int numValid) {
  std::vector<double> s(v, v + count);
  int span = 1;
  while (span < count) span *= 2;
  for (int stride = span / 2; stride > 1; stride /= 2) {
    for (int i = 0; i < stride; ++i) {
      if (i + stride < numValid) s[static_cast<size_t>(i)] += s[static_cast<size_t>(i + stride)];
    }
  }
  return numValid > 1 ? s[0] + s[1] : s[0];
}

__global__ void cub_scan_kernel(const int64_t* in, int64_t* inclusive, int64_t* exclusive, int64_t* aggregate,
                                int64_t* maxScan) {
  __shared__ BlockScanL::TempStorage storage;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t v = in[blockIdx.x * kBlock + tid];
  int64_t inc, exc, agg, mx;
  BlockScanL(storage).InclusiveSum(v, inc);
  __syncthreads();
  BlockScanL(storage).ExclusiveSum(v, exc, agg);
  __syncthreads();
  BlockScanL(storage).InclusiveScan(v, mx, cub::Max());
  inclusive[blockIdx.x * kBlock + tid] = inc;
  exclusive[blockIdx.x * kBlock + tid] = exc;
  maxScan[blockIdx.x * kBlock + tid] = mx;
  if (tid == 0) aggregate[blockIdx.x] = agg;
}

// Reuses the TempStorage with or without the barrier CUB requires in between.
__global__ void cub_reduce_reuse_kernel(const double* in, double* out, bool barrier) {
  __shared__ BlockReduceD::TempStorage storage;
  const int tid = static_cast<int>(threadIdx.x);
  const double a = BlockReduceD(storage).Sum(in[tid]);
  if (barrier) __syncthreads();
  const double b = BlockReduceD(storage).Sum(in[kBlock + tid]);
  if (tid == 0) {
    out[0] = a;
    out[1] = b;
  }
}

__global__ void cub_scan_reuse_kernel(const int64_t* in, int64_t* out, bool barrier) {
  __shared__ BlockScanL::TempStorage storage;
  const int tid = static_cast<int>(threadIdx.x);
  int64_t a, b;
  BlockScanL(storage).InclusiveSum(in[tid], a);
  if (barrier) __syncthreads();
  BlockScanL(storage).InclusiveSum(in[kBlock + tid], b);
  out[tid] = a;
  out[kBlock + tid] = b;
}

__global__ void cub_wrong_block_kernel(double* out) {
  __shared__ BlockReduceD::TempStorage storage;
  out[threadIdx.x] = BlockReduceD(storage).Sum(1.0);
}

// Each level hands its frame to the next, so the frames stay live (no loop can replace them).
__attribute__((noinline)) int recurse(int depth, volatile char* previous) {
  volatile char frame[1024];
  frame[0] = static_cast<char>(previous[0] + 1);
  return depth > 0 ? recurse(depth - 1, frame) + frame[0] - frame[0] + 1 : 0;
}

__global__ void deep_kernel(int* out, int depth) {
  volatile char start[1] = {0};
  if (threadIdx.x == 0) out[0] = recurse(depth, start);
}

// Benchmarks: a flat kernel, and one with ten barriers per thread.
__global__ void bench_flat_kernel(const float* in, float* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * 2.0f + 1.0f;
}

__global__ void bench_barrier_kernel(const float* in, float* out) {
  __shared__ float s[kBlock];
  const int tid = static_cast<int>(threadIdx.x);
  float v = in[blockIdx.x * kBlock + tid];
  for (int round = 0; round < 5; ++round) {
    s[tid] = v;
    __syncthreads();
    v += s[(tid + 1 + round) % kBlock];
    __syncthreads();
  }
  out[blockIdx.x * kBlock + tid] = v;
}

// Warp sums by shuffles (five per thread), as the project's finalize kernels do.
__global__ void bench_shuffle_kernel(const float* in, float* out) {
  float v = in[blockIdx.x * kBlock + threadIdx.x];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) out[blockIdx.x * kBlock + threadIdx.x] = v;
}

// ---- tests -----------------------------------------------------------------------------------------------

void testBarriers() {
  const int blocks = 7;
  DeviceBuffer<float> in(blocks * kBlock), out(blocks);
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& v : in.host()) v = dist(gen);
  std::vector<float> first;
  forEachSchedule([&](const std::string& schedule) {
    std::fill(out.host().begin(), out.host().end(), 0.0f);
    rc_emu::launch(block_sum_kernel, "block_sum_kernel", blocks, kBlock)(in.get(), out.get());
    bool ok = true;
    for (int b = 0; b < blocks; ++b) ok = ok && out[b] == hostBlockSum(in.get() + b * kBlock);
    check("barrier block reduction matches the host tree (" + schedule + ")", ok && !rt().faulted, rt().faultMessage);
    if (first.empty()) first = out.host();
    check("barrier block reduction is identical across schedules (" + schedule + ")", out.host() == first);
    resetFault();
  });
}

void testMissingBarrier() {
  const int blocks = 3;
  DeviceBuffer<int> in(blocks * kBlock), out(blocks * kBlock);
  for (int i = 0; i < blocks * kBlock; ++i) in[static_cast<size_t>(i)] = (i * 7919) % 1000;
  std::vector<int> correct(static_cast<size_t>(blocks * kBlock));
  for (int b = 0; b < blocks; ++b) {
    for (int t = 0; t < kBlock; ++t) {
      correct[static_cast<size_t>(b * kBlock + t)] = in[static_cast<size_t>(b * kBlock + (t + 1) % kBlock)] -
                                                     in[static_cast<size_t>(b * kBlock + (t + kBlock - 1) % kBlock)];
    }
  }
  std::vector<std::vector<int>> withBarrier, without;
  forEachSchedule([&](const std::string&) {
    rc_emu::launch(neighbour_kernel, "neighbour_kernel", blocks, kBlock)(in.get(), out.get(), true);
    withBarrier.push_back(out.host());
    rc_emu::launch(neighbour_kernel, "neighbour_kernel", blocks, kBlock)(in.get(), out.get(), false);
    without.push_back(out.host());
  });
  bool allCorrect = true;
  for (const auto& r : withBarrier) allCorrect = allCorrect && r == correct;
  check("kernel with its barrier: same correct result under every schedule", allCorrect);
  bool differs = false, wrong = false;
  for (size_t i = 1; i < without.size(); ++i) differs = differs || without[i] != without[0];
  for (const auto& r : without) wrong = wrong || r != correct;
  check("kernel missing a barrier: results differ between schedules", differs);
  check("kernel missing a barrier: wrong under some schedule", wrong);
  expectNoFault("a missing barrier is not a fault");
}

void testShuffles() {
  std::vector<ShuffleCase> cases;
  for (int width : {32, 16, 8, 4, 2, 1}) {
    for (int param : {0, 1, 2, 3, 5, 7, 16, 31}) {
      for (int kind = 0; kind < 4; ++kind) cases.push_back({kind, param, width});
    }
  }
  cases.push_back({0, -1, 32});
  cases.push_back({0, 40, 8});
  const int threads = 64;
  DeviceBuffer<ShuffleCase> dcases(cases.size());
  std::copy(cases.begin(), cases.end(), dcases.host().begin());
  DeviceBuffer<int> out(cases.size() * threads);
  forEachSchedule([&](const std::string& schedule) {
    rc_emu::launch(shuffle_kernel, "shuffle_kernel", 1, threads)(dcases.get(), static_cast<int>(cases.size()),
                                                                 out.get());
    int bad = 0;
    std::string first;
    for (size_t c = 0; c < cases.size(); ++c) {
      for (int t = 0; t < threads; ++t) {
        const int expected = expectedShuffle(cases[c], t % 32, t / 32 * 32);
        if (out[c * threads + static_cast<size_t>(t)] != expected) {
          if (bad++ == 0) {
            first = "kind " + std::to_string(cases[c].kind) + " param " + std::to_string(cases[c].param) + " width " +
                    std::to_string(cases[c].width) + " thread " + std::to_string(t) + ": got " +
                    std::to_string(out[c * threads + static_cast<size_t>(t)]) + ", expected " +
                    std::to_string(expected);
          }
        }
      }
    }
    check("shuffles idx/up/down/xor with widths match CUDA's definition (" + schedule + ")", bad == 0 && !rt().faulted,
          first + rt().faultMessage);
    resetFault();
  });

  const int warps = 3;
  DeviceBuffer<double> in(warps * 32), sums(warps);
  DeviceBuffer<int64_t> isums(warps);
  DeviceBuffer<float> fsums(warps * 32);
  DeviceBuffer<unsigned> ballots(warps * 32);
  DeviceBuffer<int> half(warps * 32, -1);
  for (int i = 0; i < warps * 32; ++i) in[static_cast<size_t>(i)] = 0.25 * i + 1.0;
  rc_emu::launch(warp_types_kernel, "warp_types_kernel", 1, warps * 32)(in.get(), sums.get(), isums.get(), fsums.get(),
                                                                        ballots.get(), half.get());
  bool ok = true;
  for (int w = 0; w < warps; ++w) {
    double d = 0;
    int64_t is = 0;
    for (int l = 0; l < 32; ++l) {
      d += in[static_cast<size_t>(w * 32 + l)];
      is += static_cast<int64_t>(in[static_cast<size_t>(w * 32 + l)] * 1000.0);
    }
    ok = ok && sums[static_cast<size_t>(w)] == d && isums[static_cast<size_t>(w)] == is;
    unsigned ballot = 0;
    for (int l = 0; l < 32; ++l) ballot |= ((w * 32 + l) % 3 == 0 ? 1u : 0u) << l;
    for (int l = 0; l < 32; ++l) {
      const size_t t = static_cast<size_t>(w * 32 + l);
      ok = ok && std::fabs(fsums[t] - static_cast<float>(d)) < 1e-3f && ballots[t] == ballot;
      if (l < 16) ok = ok && half[t] == (l == 15 ? w * 32 + 15 : w * 32 + l + 1);
      if (l >= 16) ok = ok && half[t] == -1;
    }
  }
  check("warp sums of double/int64/float, ballot and a half-warp mask", ok && !rt().faulted, rt().faultMessage);
  resetFault();
}

void testFaults() {
  DeviceBuffer<int> out(1024);
  forEachSchedule([&](const std::string& schedule) {
    rc_emu::launch(divergent_barrier_kernel, "divergent_barrier_kernel", 2, 64)(out.get());
    expectFault("fault: threads at different __syncthreads (" + schedule + ")",
                {"kernel divergent_barrier_kernel", "block (0, 0, 0)", "__syncthreads", "executor_test.cc"});

    rc_emu::launch(exit_before_barrier_kernel, "exit_before_barrier_kernel", 1, 64)(out.get());
    expectFault("fault: a thread exits while others wait at __syncthreads (" + schedule + ")",
                {"kernel exit_before_barrier_kernel", "thread (", "exited", "__syncthreads"});

    rc_emu::launch(shuffle_exited_lane_kernel, "shuffle_exited_lane_kernel", 1, 64)(out.get());
    expectFault("fault: shuffle with an exited lane (" + schedule + ")",
                {"kernel shuffle_exited_lane_kernel", "__shfl_down_sync", "exited"});

    rc_emu::launch(partial_warp_kernel, "partial_warp_kernel", 1, 48)(out.get());
    expectFault("fault: full-mask shuffle in a partial warp (" + schedule + ")",
                {"kernel partial_warp_kernel", "__shfl_xor_sync", "do not exist"});

    rc_emu::launch(different_shuffles_kernel, "different_shuffles_kernel", 1, 32)(out.get());
    expectFault("fault: lanes at different shuffles (" + schedule + ")",
                {"kernel different_shuffles_kernel", "__shfl_xor_sync", "the same one"});

    rc_emu::launch(deadlock_kernel, "deadlock_kernel", 1, 32)(out.get());
    expectFault("fault: deadlock between __syncthreads and __syncwarp (" + schedule + ")",
                {"kernel deadlock_kernel", "deadlock", "__syncwarp", "__syncthreads"});
  });

  rc_emu::launch(mask_without_self_kernel, "mask_without_self_kernel", 1, 32)(out.get());
  expectFault("fault: a lane calls a shuffle whose mask leaves it out", {"leaves out its own lane"});

  rc_emu::launch(throw_kernel, "throw_kernel", 1, 32)(out.get());
  expectFault("fault: device code throws", {"kernel throw_kernel", "thread (2, 0, 0)", "bad thing"});

  DeviceBuffer<int> reached(1), after(1);
  rc_emu::launch(trap_kernel, "trap_kernel", 4, 32)(reached.get(), after.get());
  check("__trap stops the kernel: no thread passes the barrier, no later block runs",
        rt().faulted && after[0] == 0 && reached[0] <= 32 && contains(rt().faultMessage, "__trap"),
        "reached " + std::to_string(reached[0]) + ", after " + std::to_string(after[0]) + ", " + rt().faultMessage);
  // A faulted context runs nothing more.
  rt().faulted = true;
  DeviceBuffer<int> counter(1);
  const rc_emu::detail::KernelLaunch launch{"noop_kernel", dim3(1), dim3(1), 0};
  int* counterPtr = counter.get();
  const auto body = [](const void* p) { noop_kernel(*static_cast<int* const*>(p)); };
  rc_emu::detail::runKernel(launch, body, &counterPtr);
  check("nothing runs once the context has faulted", counter[0] == 0);
  resetFault();
}

void testDynamicShared() {
  const int blocks = 4, words = 250;
  DeviceBuffer<int> out(blocks * 3);
  forEachSchedule([&](const std::string& schedule) {
    std::fill(out.host().begin(), out.host().end(), 0);
    rc_emu::launch(dynamic_shared_kernel, "dynamic_shared_kernel", blocks, 64, words * sizeof(int))(out.get(), words);
    bool ok = true;
    for (int b = 0; b < blocks; ++b) {
      ok = ok && out[static_cast<size_t>(b * 3)] == 1 && out[static_cast<size_t>(b * 3 + 1)] == 1 &&
           out[static_cast<size_t>(b * 3 + 2)] == words * (words - 1) / 2;
    }
    check("dynamic shared memory: fresh (0xff) per block, aligned, shared (" + schedule + ")", ok && !rt().faulted,
          rt().faultMessage);
    resetFault();
  });
  rc_emu::launch(shared_overrun_kernel, "shared_overrun_kernel", 1, 32, 64)(16);
  expectFault("fault: writing past the dynamic shared memory",
              {"kernel shared_overrun_kernel", "past the end", "64 bytes"});
}

void testPointerArguments() {
  DeviceBuffer<int> a(4), c(4);
  DeviceBuffer<float> b(4);
  rc_emu::launch(pointer_kernel, "pointer_kernel", 1, 32)(a.get(), b.get(), c.get());
  check("device pointers pass the argument check", a[0] == 1 && c[0] == 3 && !rt().faulted, rt().faultMessage);
  resetFault();
  a[0] = 0;
  rc_emu::launch(pointer_kernel, "pointer_kernel", 1, 32)(a.get(), nullptr, nullptr);
  check("null pointers pass the argument check", a[0] == 1 && !rt().faulted, rt().faultMessage);
  resetFault();

  a[0] = 0;
  std::vector<float> host(4);
  char text[32];
  std::snprintf(text, sizeof text, "(%p)", static_cast<void*>(host.data()));
  rc_emu::launch(pointer_kernel, "pointer_kernel", 1, 32)(a.get(), host.data(), c.get());
  const bool didNotRun = a[0] == 0;
  expectFault("fault: a host pointer argument", {"kernel pointer_kernel: argument 1 ", text, "is not device memory"});
  check("the kernel with a host pointer argument did not run", didNotRun);

  // One past the end of an allocation is not device memory either.
  rc_emu::launch(pointer_kernel, "pointer_kernel", 1, 32)(a.get() + 4, nullptr, nullptr);
  expectFault("fault: a pointer one past the end of an allocation", {"argument 0"});
}

void testConfiguration() {
  DeviceBuffer<int> out(1);
  struct Bad {
    const char* what;
    dim3 grid, block;
    size_t shared;
  };
  const Bad bad[] = {
      {"1025 threads", dim3(1), dim3(1025), 0},
      {"32x33 threads", dim3(1), dim3(32, 33), 0},
      {"block.z 65", dim3(1), dim3(1, 1, 65), 0},
      {"block.x 0", dim3(1), dim3(0), 0},
      {"grid.x 0", dim3(0), dim3(32), 0},
      {"grid.x 2^31", dim3(0x80000000u), dim3(32), 0},
      {"grid.y 65536", dim3(1, 65536), dim3(32), 0},
      {"grid.z 65536", dim3(1, 1, 65536), dim3(32), 0},
      {"49153 bytes of dynamic shared memory", dim3(1), dim3(32), 48 * 1024 + 1},
  };
  for (const Bad& b : bad) {
    out[0] = 0;
    resetFault();
    rc_emu::launch(noop_kernel, "noop_kernel", b.grid, b.block, b.shared)(out.get());
    check(std::string("bad configuration (") + b.what + ") sets cudaErrorInvalidConfiguration and runs nothing",
          rt().lastError == cudaErrorInvalidConfiguration && out[0] == 0 && !rt().faulted);
  }
  resetFault();
  out[0] = 0;
  rc_emu::launch(noop_kernel, "noop_kernel", dim3(1), dim3(1024), 48 * 1024)(out.get());
  check("1024 threads with 48 KiB of dynamic shared memory is a valid configuration",
        rt().lastError == cudaSuccess && out[0] == 1024 && !rt().faulted);
  resetFault();
}

void testParameters() {
  DeviceBuffer<int64_t> out(64);
  DeviceBuffer<float> fout(1);
  Params p{100, 0.5f};
  rt().defer = true;
  int n = 5;
  double x = 3.0;
  rc_emu::launch(params_kernel, "params_kernel", 1, 64)(p, n, x, out.get(), fout.get());
  p.base = -1;  // changes after the launch do not reach the kernel
  n = 7;
  x = 0;
  const bool notYet = out[0] == 0;
  flush();
  rt().defer = false;
  bool ok = notYet;
  for (int t = 0; t < 64; ++t) ok = ok && out[static_cast<size_t>(t)] == 100 + t + 5;
  check("arguments are converted and copied at launch; each thread has its own parameters",
        ok && fout[0] == 1.5f && !rt().faulted, rt().faultMessage);
  resetFault();
}

void testIndices() {
  const dim3 block(8, 4, 2), grid(3, 2, 2);
  const int threads = 64, blocks = 12;
  DeviceBuffer<int> out(threads * blocks, -1);
  rc_emu::launch(index_kernel, "index_kernel", grid, block)(out.get());
  bool ok = true;
  for (int b = 0; b < blocks; ++b) {
    for (int z = 0; z < 2; ++z) {
      for (int y = 0; y < 4; ++y) {
        for (int xx = 0; xx < 8; ++xx) {
          const int t = xx + 8 * (y + 4 * z);
          ok = ok && out[static_cast<size_t>(b * threads + t)] == xx + 10 * y + 100 * z + 1000 * b + 1000000;
        }
      }
    }
  }
  check("threadIdx/blockIdx/blockDim/gridDim of 3-D launches; warps of consecutive linear threads", ok && !rt().faulted,
        rt().faultMessage);
  resetFault();
  DeviceBuffer<int> g(4 * 3 * 2, -1);
  rc_emu::launch(grid_kernel, "grid_kernel", dim3(4, 3, 2), dim3(32))(g.get());
  ok = true;
  for (int z = 0; z < 2; ++z) {
    for (int y = 0; y < 3; ++y) {
      for (int xx = 0; xx < 4; ++xx)
        ok = ok && g[static_cast<size_t>(xx + 4 * (y + 3 * z))] == xx + 100 * y + 10000 * z;
    }
  }
  check("every block of a 3-D grid runs once", ok && !rt().faulted, rt().faultMessage);
  resetFault();
}

void testCub() {
  const int blocks = 5;
  DeviceBuffer<double> in(blocks * kBlock), out(blocks * 3);
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> dist(-100.0, 100.0);
  for (auto& v : in.host()) v = dist(gen);
  DeviceBuffer<int64_t> lin(blocks * kBlock), inc(blocks * kBlock), exc(blocks * kBlock), agg(blocks),
      mx(blocks * kBlock);
  std::uniform_int_distribution<int64_t> idist(-1000000, 1000000);
  for (auto& v : lin.host()) v = idist(gen);
  const int numValid = 77;
  forEachSchedule([&](const std::string& schedule) {
    rc_emu::launch(cub_reduce_kernel, "cub_reduce_kernel", blocks, kBlock)(in.get(), out.get(), numValid);
    bool ok = true;
    for (int b = 0; b < blocks; ++b) {
      const double* v = in.get() + b * kBlock;
      double plain = 0;
      for (int i = 0; i < kBlock; ++i) plain += v[i];
      ok = ok && out[static_cast<size_t>(b * 3)] == hostTreeReduce(v, kBlock, kBlock) &&
           std::fabs(out[static_cast<size_t>(b * 3)] - plain) < 1e-9 * kBlock * 100 &&
           out[static_cast<size_t>(b * 3 + 1)] == *std::max_element(v, v + kBlock) &&
           out[static_cast<size_t>(b * 3 + 2)] == hostTreeReduce(v, kBlock, numValid);
    }
    check("cub::BlockReduce Sum/Reduce(Max)/Sum(valid) match the host (" + schedule + ")", ok && !rt().faulted,
          rt().faultMessage);
    resetFault();

    rc_emu::launch(cub_scan_kernel, "cub_scan_kernel", blocks, kBlock)(lin.get(), inc.get(), exc.get(), agg.get(),
                                                                       mx.get());
    ok = true;
    for (int b = 0; b < blocks; ++b) {
      int64_t run = 0, best = INT64_MIN;
      for (int i = 0; i < kBlock; ++i) {
        const size_t k = static_cast<size_t>(b * kBlock + i);
        ok = ok && exc[k] == run;
        run += lin[k];
        best = std::max(best, lin[k]);
        ok = ok && inc[k] == run && mx[k] == best;
      }
      ok = ok && agg[static_cast<size_t>(b)] == run;
    }
    check("cub::BlockScan InclusiveSum/ExclusiveSum(aggregate)/InclusiveScan(Max) match the host (" + schedule + ")",
          ok && !rt().faulted, rt().faultMessage);
    resetFault();
  });

  // Reuse of the TempStorage: fine with the barrier, garbled under some schedule without it.
  DeviceBuffer<double> rin(2 * kBlock), rout(2);
  for (auto& v : rin.host()) v = dist(gen);
  const double ra = hostTreeReduce(rin.get(), kBlock, kBlock), rb = hostTreeReduce(rin.get() + kBlock, kBlock, kBlock);
  DeviceBuffer<int64_t> sin(2 * kBlock), sout(2 * kBlock);
  for (auto& v : sin.host()) v = idist(gen);
  std::vector<int64_t> scanExpected(2 * kBlock);
  for (int h = 0; h < 2; ++h) {
    int64_t run = 0;
    for (int i = 0; i < kBlock; ++i)
      scanExpected[static_cast<size_t>(h * kBlock + i)] = run += sin[static_cast<size_t>(h * kBlock + i)];
  }
  bool withOk = true, reduceGarbled = false, scanGarbled = false;
  forEachSchedule([&](const std::string&) {
    rc_emu::launch(cub_reduce_reuse_kernel, "cub_reduce_reuse_kernel", 1, kBlock)(rin.get(), rout.get(), true);
    withOk = withOk && rout[0] == ra && rout[1] == rb;
    rc_emu::launch(cub_reduce_reuse_kernel, "cub_reduce_reuse_kernel", 1, kBlock)(rin.get(), rout.get(), false);
    reduceGarbled = reduceGarbled || rout[0] != ra || rout[1] != rb;
    rc_emu::launch(cub_scan_reuse_kernel, "cub_scan_reuse_kernel", 1, kBlock)(sin.get(), sout.get(), true);
    withOk = withOk && sout.host() == scanExpected;
    rc_emu::launch(cub_scan_reuse_kernel, "cub_scan_reuse_kernel", 1, kBlock)(sin.get(), sout.get(), false);
    scanGarbled = scanGarbled || sout.host() != scanExpected;
  });
  check("cub TempStorage reuse with a barrier in between is correct under every schedule", withOk && !rt().faulted);
  check("cub::BlockReduce TempStorage reuse without a barrier goes wrong under some schedule", reduceGarbled);
  check("cub::BlockScan TempStorage reuse without a barrier goes wrong under some schedule", scanGarbled);
  resetFault();

  DeviceBuffer<double> w(128);
  rc_emu::launch(cub_wrong_block_kernel, "cub_wrong_block_kernel", 1, 128)(w.get());
  expectFault("fault: cub::BlockReduce<_, 256> in a block of 128 threads", {"cub::BlockReduce", "128x1x1"});
}

void testStackGuard() {
  // Deep recursion runs into the guard page below the thread's stack: the (forked) process dies.
  std::fflush(stdout);
  const pid_t child = fork();
  if (child == 0) {
    std::freopen("/dev/null", "w", stderr);  // the crash report is expected
    DeviceBuffer<int> out(1);
    rc_emu::launch(deep_kernel, "deep_kernel", 1, 32)(out.get(), 1 << 20);
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  check("a thread overflowing its stack hits the guard page", !(WIFEXITED(status) && WEXITSTATUS(status) == 0));

  DeviceBuffer<int> out(1);
  rc_emu::launch(deep_kernel, "deep_kernel", 1, 32)(out.get(), 16);
  check("moderate recursion fits the stack", out[0] == 16 && !rt().faulted, rt().faultMessage);
  resetFault();
}

void testHalfTypes() {
  const __half h = __float2half_rn(1.0f / 3.0f);
  const __nv_bfloat16 b = __float2bfloat16_rn(1.0f / 3.0f);
  check("__half and __nv_bfloat16 conversions round to nearest even",
        __half_as_ushort(h) == 0x3555 && __bfloat16_as_ushort(b) == 0x3eab &&
            __half2float(__float2half(65504.0f)) == 65504.0f && std::isinf(__half2float(__float2half(65520.0f))) &&
            __bfloat162float(__float2bfloat16(1.0f)) == 1.0f);
}

double seconds(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void bench() {
  const int blocks = 4096;
  const int64_t n = int64_t{blocks} * kBlock;
  DeviceBuffer<float> in(static_cast<size_t>(n), 1.0f), out(static_cast<size_t>(n));
  const rc_emu::Schedule saved = rc_emu::schedule();
  const uint64_t savedSeed = rc_emu::scheduleSeed();
  for (rc_emu::Schedule s : {rc_emu::Schedule::kForward, rc_emu::Schedule::kReverse, rc_emu::Schedule::kRandom}) {
    rc_emu::setSchedule(s, 1);
    const double flat = seconds(
        [&] { rc_emu::launch(bench_flat_kernel, "bench_flat_kernel", blocks, kBlock)(in.get(), out.get(), n); });
    const double barriers = seconds(
        [&] { rc_emu::launch(bench_barrier_kernel, "bench_barrier_kernel", blocks, kBlock)(in.get(), out.get()); });
    const double shuffles = seconds(
        [&] { rc_emu::launch(bench_shuffle_kernel, "bench_shuffle_kernel", blocks, kBlock)(in.get(), out.get()); });
    std::printf(
        "bench %-7s 4096x256 threads: no barrier %.3f s, 10 __syncthreads %.3f s, 5 __shfl_down_sync %.3f s"
        " (%.1f / %.1f / %.1f ns per thread)\n",
        scheduleName(s), flat, barriers, shuffles, flat * 1e9 / static_cast<double>(n),
        barriers * 1e9 / static_cast<double>(n), shuffles * 1e9 / static_cast<double>(n));
  }
  rc_emu::setSchedule(saved, savedSeed);
  check("benchmarks ran without a fault", !rt().faulted, rt().faultMessage);
  resetFault();
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("schedule: %s (seed %llu)\n", scheduleName(rc_emu::schedule()),
              static_cast<unsigned long long>(rc_emu::scheduleSeed()));
  testBarriers();
  testMissingBarrier();
  testShuffles();
  testFaults();
  testDynamicShared();
  testPointerArguments();
  testConfiguration();
  testParameters();
  testIndices();
  testCub();
  testStackGuard();
  testHalfTypes();
  if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) bench();
  std::printf("executor: %d passed, %d failed\n", passed, failedChecks);
  return failedChecks == 0 ? 0 : 1;
}
