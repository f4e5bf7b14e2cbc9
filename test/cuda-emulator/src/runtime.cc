// The emulated CUDA runtime: device memory, streams, events and graphs (see rc_emu/runtime.h).
//
// What it checks, beyond running the work:
// - Device memory is host memory with guard bytes on both sides (checked when it is freed), filled
//   with kUninitializedByte when allocated and again when freed; freed blocks stay out of reuse for
//   a while, so that a kernel given a freed pointer is caught (its pointer arguments are checked
//   against the live allocations when it runs).
// - Streams run their work only when the host waits (stream or event synchronisation, a copy into
//   pageable memory, a query, which reports "not ready" once), so results read without waiting are
//   stale, and a pinned buffer reused before its copy ran is caught by the results.
// - Stream capture follows the documented rules: no synchronising call while a capture is active
//   (in this thread for ThreadLocal mode, anywhere for Global), no pageable copies into the graph,
//   a captured free must free a graph allocation, and any violation invalidates the capture. Graph
//   allocations keep their address, are undefined at every launch, and AutoFreeOnLaunch frees the
//   previous launch's allocations.
// Limits: one address space for all devices; a device's memory is RESNET_CUDA_EMU_MEMORY bytes
// (suffixes K, M, G; default 16G), RESNET_CUDA_EMU_DEVICES devices (default 1). Setting
// RESNET_CUDA_EMU_LAG=none runs work as soon as it is queued.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

// Built with AddressSanitizer, the guards are also poisoned, so that a read outside an allocation
// (which the guard bytes cannot show) is reported where it happens.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define RC_EMU_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define RC_EMU_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define RC_EMU_POISON(p, n) ((void)(p), (void)(n))
#define RC_EMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace rc_emu {
namespace {

constexpr size_t kGuardBytes = 256;
constexpr unsigned char kGuardByte = 0xa5;
constexpr size_t kQuarantineBytes = size_t{256} << 20;

std::recursive_mutex& mutex() {
  static std::recursive_mutex& m = *new std::recursive_mutex();  // never destroyed, like the state
  return m;
}
using Lock = std::lock_guard<std::recursive_mutex>;

size_t parseBytes(const char* text, size_t fallback) {
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  double scale = 1;
  if (end != nullptr && (*end == 'k' || *end == 'K')) scale = 1024.0;
  if (end != nullptr && (*end == 'm' || *end == 'M')) scale = 1024.0 * 1024.0;
  if (end != nullptr && (*end == 'g' || *end == 'G')) scale = 1024.0 * 1024.0 * 1024.0;
  return value > 0 ? static_cast<size_t>(value * scale) : fallback;
}

size_t memoryLimit() {
  static const size_t limit = parseBytes(std::getenv("RESNET_CUDA_EMU_MEMORY"), size_t{16} << 30);
  return limit;
}

int deviceCount() {
  static const int count = [] {
    const char* text = std::getenv("RESNET_CUDA_EMU_DEVICES");
    const int n = text ? std::atoi(text) : 1;
    return n >= 0 ? n : 1;
  }();
  return count;
}

bool lagging() {
  static const bool lag = [] {
    const char* text = std::getenv("RESNET_CUDA_EMU_LAG");
    return !(text != nullptr && std::strcmp(text, "none") == 0);
  }();
  return lag;
}

// The calling thread's current device (cudaSetDevice), and the device whose stream's work is
// running now (-1: none), whose memory that work may use.
thread_local int tDevice = 0;
int gRunningDevice = -1;

// ---- errors -----------------------------------------------------------------------------------

thread_local cudaError_t tLastError = cudaSuccess;
bool gFaulted = false;
// Never destroyed: the backend may still call in while the process exits.
std::string& gFaultMessage = *new std::string();

cudaError_t fail(cudaError_t error) {
  if (error != cudaSuccess) tLastError = error;
  return error;
}

void complain(const std::string& what) { std::fprintf(stderr, "CUDA emulator: %s\n", what.c_str()); }

// ---- memory -----------------------------------------------------------------------------------

struct GraphMemory;

struct Allocation {
  size_t bytes = 0;
  size_t padded = 0;  // bytes rounded up; the rest up to padded is guard too
  unsigned char* block = nullptr;
  bool pinned = false;
  bool freePending = false;            // cudaFreeAsync queued
  std::shared_ptr<GraphMemory> graph;  // a graph allocation
  bool live = true;                    // graph allocations: allocated by a launch and not freed since
  bool freedInGraph = false;           // graph allocations: the graph frees it itself
  bool fromPool = false;
  int device = -1;  // the device it belongs to (-1: pinned host memory, reachable from all)
};

std::map<uintptr_t, Allocation>& gAllocations = *new std::map<uintptr_t, Allocation>();  // by address
std::deque<std::pair<unsigned char*, size_t>>& gQuarantine = *new std::deque<std::pair<unsigned char*, size_t>>();
size_t gQuarantined = 0;
size_t gDeviceBytes = 0;   // live device allocations
size_t gPoolCached = 0;    // freed pool memory kept by the pool (its release threshold)
size_t gPoolReserved = 0;  // pool memory held: live pool allocations + cached
uint64_t gReleaseThreshold = 0;

Allocation* findContaining(const void* p, size_t bytes) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto it = gAllocations.upper_bound(address);
  if (it == gAllocations.begin()) return nullptr;
  --it;
  const uintptr_t begin = it->first;
  const size_t size = it->second.bytes;
  if (address < begin) return nullptr;
  if (bytes == 0 ? address >= begin + std::max<size_t>(size, 1) : address + bytes > begin + size) return nullptr;
  return &it->second;
}

Allocation* findExact(const void* p) {
  auto it = gAllocations.find(reinterpret_cast<uintptr_t>(p));
  return it == gAllocations.end() ? nullptr : &it->second;
}

void* allocateBlock(size_t bytes, bool pinned, Allocation** out) {
  const size_t padded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  auto* block = static_cast<unsigned char*>(std::aligned_alloc(256, padded + 2 * kGuardBytes));
  if (block == nullptr) return nullptr;
  std::memset(block, kGuardByte, kGuardBytes);
  std::memset(block + kGuardBytes, kUninitializedByte, bytes);
  std::memset(block + kGuardBytes + bytes, kGuardByte, padded - bytes + kGuardBytes);
  RC_EMU_POISON(block, kGuardBytes);
  RC_EMU_POISON(block + kGuardBytes + bytes, padded - bytes + kGuardBytes);
  unsigned char* user = block + kGuardBytes;
  Allocation& a = gAllocations[reinterpret_cast<uintptr_t>(user)];
  a = Allocation{};
  a.bytes = bytes;
  a.padded = padded;
  a.block = block;
  a.pinned = pinned;
  a.device = pinned ? -1 : tDevice;
  if (!pinned) gDeviceBytes += bytes;
  if (out) *out = &a;
  return user;
}

// Checks the guards, poisons and unregisters the block, and keeps it out of reuse for a while.
void releaseBlock(void* user) {
  auto it = gAllocations.find(reinterpret_cast<uintptr_t>(user));
  if (it == gAllocations.end()) return;
  Allocation a = it->second;
  gAllocations.erase(it);
  if (!a.pinned) gDeviceBytes -= a.bytes;
  RC_EMU_UNPOISON(a.block, 2 * kGuardBytes + a.padded);
  for (size_t i = 0; i < kGuardBytes; ++i) {
    if (a.block[i] != kGuardByte) {
      deviceFault("device memory at " + std::to_string(reinterpret_cast<uintptr_t>(user)) + " (" +
                  std::to_string(a.bytes) + " bytes) was written before its start");
      break;
    }
  }
  for (size_t i = kGuardBytes + a.bytes; i < 2 * kGuardBytes + a.padded; ++i) {
    if (a.block[i] != kGuardByte) {
      deviceFault("device memory at " + std::to_string(reinterpret_cast<uintptr_t>(user)) + " (" +
                  std::to_string(a.bytes) + " bytes) was written past its end, at byte " +
                  std::to_string(i - kGuardBytes));
      break;
    }
  }
  std::memset(a.block + kGuardBytes, kUninitializedByte, a.bytes);
  RC_EMU_POISON(a.block, 2 * kGuardBytes + a.padded);  // freed: any access is a use after free
  gQuarantine.emplace_back(a.block, a.padded);
  gQuarantined += a.padded;
  while (gQuarantined > kQuarantineBytes && !gQuarantine.empty()) {
    gQuarantined -= gQuarantine.front().second;
    RC_EMU_UNPOISON(gQuarantine.front().first, 2 * kGuardBytes + gQuarantine.front().second);
    std::free(gQuarantine.front().first);
    gQuarantine.pop_front();
  }
}

// ---- graphs -----------------------------------------------------------------------------------

struct GraphMemory {
  std::vector<void*> allocations;
};

struct Node {
  std::function<void()> run;
  std::string what;
};

struct Graph {
  std::vector<Node> nodes;
  bool open = false;  // being captured: a stream that waits on one of its events joins it (a fork)
  std::shared_ptr<GraphMemory> memory = std::make_shared<GraphMemory>();
  bool instantiated = false;  // graphs with memory nodes may have one instantiation at a time
};

struct Exec {
  std::vector<Node> nodes;
  std::shared_ptr<GraphMemory> memory;
  Graph* graph = nullptr;
  bool autoFree = false;
};

std::set<Graph*>& gGraphs = *new std::set<Graph*>();
std::set<Exec*>& gExecs = *new std::set<Exec*>();

// When the last graph or executable graph holding `memory` goes, its allocations that are not
// live go with it; live ones (allocated by the last launch, not freed) stay until freed.
void dropGraphMemory(std::shared_ptr<GraphMemory>& memory) {
  if (memory.use_count() == 1) {
    for (void* p : memory->allocations) {
      Allocation* a = findExact(p);
      if (a == nullptr) continue;
      if (a->live && !a->freedInGraph) {
        a->graph.reset();  // an ordinary allocation from now on
      } else {
        releaseBlock(p);
      }
    }
  }
  memory.reset();
}

// ---- streams ----------------------------------------------------------------------------------

struct Stream {
  std::deque<Node> queue;
  uint64_t submitted = 0;
  uint64_t completed = 0;
  unsigned flags = 0;
  int device = -1;  // the device it was created on (-1: the legacy stream, any device)
  // capture
  Graph* capture = nullptr;
  bool captureInvalid = false;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id captureThread;
  // A stream forked into another stream's capture (it waited on an event recorded there): its work
  // is captured too, in call order, and the capturing stream must wait on an event recorded after
  // its last work (a join) before the capture ends.
  bool forked = false;
  uint64_t forkedWork = 0;  // nodes captured from it
  uint64_t joinedWork = 0;  // of those, the ones a join covers
};

Stream& gLegacyStream = *new Stream();
std::set<Stream*>& gStreams = *new std::set<Stream*>();

struct Event {
  int device = 0;  // the device current when it was created
  unsigned flags = 0;
  Stream* stream = nullptr;
  uint64_t sequence = 0;
  Graph* capturedIn = nullptr;
  Stream* capturedOn = nullptr;  // recorded during a capture: on which stream, after how much of its work
  uint64_t capturedWork = 0;
  // Timing (events without cudaEventDisableTiming): the emulated device's clock is the host's
  // steady clock when the stream's work reaches the record, so times follow the order the work
  // ran in. `generation` (unique over all records) tells this record's timestamp from one of an
  // earlier record, or of a destroyed event at the same address, still queued.
  bool recorded = false;
  bool timed = false;
  uint64_t generation = 0;
  std::chrono::steady_clock::time_point time;
};
std::set<Event*>& gEvents = *new std::set<Event*>();
uint64_t gEventRecords = 0;

Stream* toStream(cudaStream_t s) {
  if (s == nullptr) return &gLegacyStream;
  auto* stream = reinterpret_cast<Stream*>(s);
  return gStreams.count(stream) ? stream : nullptr;
}

void runNode(Node& node) {
  if (gFaulted) return;
  node.run();
}

// Runs `stream`'s queued work until `sequence` operations have completed (all of it by default).
void flush(Stream* stream, uint64_t sequence = UINT64_MAX) {
  const int outer = gRunningDevice;
  while (stream->completed < sequence && !stream->queue.empty()) {
    Node node = std::move(stream->queue.front());
    stream->queue.pop_front();
    gRunningDevice = stream->device;
    runNode(node);
    gRunningDevice = outer;
    stream->completed++;
  }
}

void flushAll() {
  flush(&gLegacyStream);
  for (Stream* s : std::vector<Stream*>(gStreams.begin(), gStreams.end())) flush(s);
}

// The capture a synchronising call made now by this thread would break, if any.
Stream* activeCaptureForThisThread() {
  const auto self = std::this_thread::get_id();
  for (Stream* s : gStreams) {
    if (s->capture == nullptr) continue;
    if (s->mode == cudaStreamCaptureModeGlobal) return s;
    if (s->mode == cudaStreamCaptureModeThreadLocal && s->captureThread == self) return s;
  }
  if (gLegacyStream.capture != nullptr) return &gLegacyStream;
  return nullptr;
}

cudaError_t invalidate(Stream* s, const std::string& why) {
  if (!s->captureInvalid) complain("stream capture invalidated: " + why);
  s->captureInvalid = true;
  return fail(cudaErrorStreamCaptureUnsupported);
}

// For calls that may synchronise or allocate outside stream order: refused while a capture that
// they would affect is active (the capture is invalidated, as the runtime does).
cudaError_t checkUnsafeDuringCapture(const char* call) {
  if (Stream* s = activeCaptureForThisThread()) return invalidate(s, std::string(call) + " while capturing");
  return cudaSuccess;
}

}  // namespace

// ---- the interface of rc_emu/runtime.h ---------------------------------------------------------

cudaError_t enqueue(cudaStream_t s, std::function<void()> op, const char* what) {
  Lock lock(mutex());
  if (gFaulted) return cudaErrorLaunchFailure;
  Stream* stream = toStream(s);
  if (stream == nullptr) return cudaErrorInvalidResourceHandle;
  if (stream->capture != nullptr) {
    if (stream->captureInvalid) return cudaErrorStreamCaptureInvalidated;
    stream->capture->nodes.push_back(Node{std::move(op), what});
    if (stream->forked) stream->forkedWork++;
    return cudaSuccess;
  }
  stream->queue.push_back(Node{std::move(op), what});
  stream->submitted++;
  if (!lagging()) flush(stream);
  return cudaSuccess;
}

cudaError_t checkLaunchDevice(cudaStream_t s) {
  Lock lock(mutex());
  Stream* stream = toStream(s);
  if (stream == nullptr) return cudaErrorInvalidResourceHandle;
  if (stream->device >= 0 && stream->device != tDevice) {
    complain("a kernel launched on a stream of device " + std::to_string(stream->device) + " while device " +
             std::to_string(tDevice) + " is current");
    return cudaErrorInvalidResourceHandle;
  }
  return cudaSuccess;
}

bool isCapturing(cudaStream_t s) {
  Lock lock(mutex());
  Stream* stream = toStream(s);
  return stream != nullptr && stream->capture != nullptr;
}

void setLastError(cudaError_t error) { tLastError = error; }

void deviceFault(const std::string& message) {
  Lock lock(mutex());
  complain("device fault: " + message);
  if (!gFaulted) gFaultMessage = message;
  gFaulted = true;
}

bool faulted() { return gFaulted; }

bool isDeviceRange(const void* p, size_t bytes) {
  Lock lock(mutex());
  const Allocation* a = findContaining(p, bytes);
  if (a == nullptr || a->pinned || !a->live) return false;
  // Work on one device cannot reach another's memory (no peer access is enabled).
  if (gRunningDevice >= 0 && a->device != gRunningDevice) {
    complain("work on device " + std::to_string(gRunningDevice) + " uses memory of device " +
             std::to_string(a->device));
    return false;
  }
  return true;
}

bool isPinnedHost(const void* p, size_t bytes) {
  Lock lock(mutex());
  const Allocation* a = findContaining(p, bytes);
  return a != nullptr && a->pinned;
}

}  // namespace rc_emu

using namespace rc_emu;  // NOLINT: the C API below is the emulator's own

namespace {

// What a copy's host side is: device memory, pinned host memory, or pageable host memory.
enum class Side { Device, Pinned, Pageable, Invalid };

Side sideOf(const void* p, size_t bytes) {
  if (const Allocation* a = findContaining(p, bytes)) {
    if (a->pinned) return Side::Pinned;
    return a->live ? Side::Device : Side::Invalid;
  }
  // The start inside an allocation but the end outside it: out of range, not host memory.
  if (findContaining(p, 0) != nullptr) return Side::Invalid;
  return Side::Pageable;
}

const char* kindName(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost: return "host to host";
    case cudaMemcpyHostToDevice: return "host to device";
    case cudaMemcpyDeviceToHost: return "device to host";
    case cudaMemcpyDeviceToDevice: return "device to device";
    default: return "default";
  }
}

// Validates a copy's direction against its pointers; returns the effective kind.
bool resolveCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaMemcpyKind* out, Side* dstSide,
                 Side* srcSide) {
  *dstSide = sideOf(dst, bytes);
  *srcSide = sideOf(src, bytes);
  if (*dstSide == Side::Invalid || *srcSide == Side::Invalid) {
    complain(std::string("cudaMemcpy (") + kindName(kind) + ", " + std::to_string(bytes) +
             " bytes): a pointer is outside its allocation or freed");
    return false;
  }
  const bool dstDevice = *dstSide == Side::Device, srcDevice = *srcSide == Side::Device;
  cudaMemcpyKind actual = srcDevice ? (dstDevice ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                                    : (dstDevice ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  if (kind != cudaMemcpyDefault && kind != actual) {
    complain(std::string("cudaMemcpy: kind ") + kindName(kind) + " but the pointers are " + kindName(actual));
    return false;
  }
  *out = actual;
  return true;
}

// A queued copy re-checks its device ranges when it runs (stream order: memory freed in between is
// a fault).
std::function<void()> copyOp(void* dst, const void* src, size_t bytes, bool dstDevice, bool srcDevice) {
  return [=] {
    // Copies may cross devices (through the host when there is no peer access).
    const int running = gRunningDevice;
    gRunningDevice = -1;
    const bool valid = (!dstDevice || isDeviceRange(dst, bytes)) && (!srcDevice || isDeviceRange(src, bytes));
    gRunningDevice = running;
    if (!valid) {
      deviceFault("cudaMemcpyAsync of " + std::to_string(bytes) + " bytes ran on memory that is no longer allocated");
      return;
    }
    std::memmove(dst, src, bytes);
  };
}

struct MemPool {
  int device = 0;
};
MemPool gPools[64];

}  // namespace

extern "C" {

// ---- errors and versions ----------------------------------------------------------------------

cudaError_t cudaGetLastError(void) {
  Lock lock(mutex());
  if (gFaulted) return cudaErrorLaunchFailure;
  const cudaError_t e = tLastError;
  tLastError = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  Lock lock(mutex());
  return gFaulted ? cudaErrorLaunchFailure : tLastError;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotPermitted: return "cudaErrorNotPermitted";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: {
      static thread_local std::string text;
      Lock lock(mutex());
      text = "unspecified launch failure (emulated device fault: " + gFaultMessage + ")";
      return text.c_str();
    }
    case cudaErrorNotPermitted: return "operation not permitted";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    default: return "unknown error";
  }
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

// ---- devices ----------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = deviceCount();
  return *count == 0 ? fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  if (deviceCount() == 0) return fail(cudaErrorNoDevice);
  *device = tDevice;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= deviceCount() || device >= 64) return fail(cudaErrorInvalidDevice);
  tDevice = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= deviceCount()) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "CUDA emulator (host CPU)");
  prop->totalGlobalMem = memoryLimit();
  prop->sharedMemPerBlock = 48 * 1024;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 4;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  Lock lock(mutex());
  if (cudaError_t e = checkUnsafeDuringCapture("cudaDeviceSynchronize")) return e;
  flushAll();
  return gFaulted ? cudaErrorLaunchFailure : cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* freeBytes, size_t* totalBytes) {
  Lock lock(mutex());
  if (freeBytes == nullptr || totalBytes == nullptr) return fail(cudaErrorInvalidValue);
  const size_t held = gDeviceBytes + gPoolCached;
  *totalBytes = memoryLimit();
  *freeBytes = held < memoryLimit() ? memoryLimit() - held : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device) {
  if (pciBusId == nullptr || len <= 0) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= deviceCount()) return fail(cudaErrorInvalidDevice);
  return fail(cudaErrorNotSupported);
}

// ---- memory -----------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  Lock lock(mutex());
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  if (gFaulted) return cudaErrorLaunchFailure;
  if (cudaError_t e = checkUnsafeDuringCapture("cudaMalloc")) return e;
  if (gDeviceBytes + gPoolCached + bytes > memoryLimit()) return fail(cudaErrorMemoryAllocation);
  *ptr = allocateBlock(bytes, false, nullptr);
  return *ptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void* ptr) {
  Lock lock(mutex());
  if (ptr == nullptr) return cudaSuccess;
  if (cudaError_t e = checkUnsafeDuringCapture("cudaFree")) return e;
  Allocation* a = findExact(ptr);
  if (a == nullptr || a->pinned || a->freePending || a->graph) return fail(cudaErrorInvalidValue);
  flushAll();
  const bool pool = a->fromPool;
  const size_t bytes = a->bytes;
  releaseBlock(ptr);
  if (pool) gPoolReserved -= bytes;
  return gFaulted ? cudaErrorLaunchFailure : cudaSuccess;
}

cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t s) {
  Lock lock(mutex());
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  if (gFaulted) return cudaErrorLaunchFailure;
  Stream* stream = toStream(s);
  if (stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (gDeviceBytes + bytes > memoryLimit()) return fail(cudaErrorMemoryAllocation);
  Allocation* a = nullptr;
  *ptr = allocateBlock(bytes, false, &a);
  if (*ptr == nullptr) return fail(cudaErrorMemoryAllocation);
  if (stream->device >= 0) a->device = stream->device;  // from the pool of the stream's device
  if (stream->capture != nullptr) {
    // An allocation node: the address is fixed now, the memory exists from each launch on.
    if (stream->captureInvalid) {
      releaseBlock(*ptr);
      *ptr = nullptr;
      return fail(cudaErrorStreamCaptureInvalidated);
    }
    a->graph = stream->capture->memory;
    a->live = false;
    stream->capture->memory->allocations.push_back(*ptr);
    void* p = *ptr;
    stream->capture->nodes.push_back(Node{[p] {
                                            Allocation* alloc = findExact(p);
                                            if (alloc == nullptr) return;
                                            alloc->live = true;
                                            std::memset(p, kUninitializedByte, alloc->bytes);
                                          },
                                          "graph allocation"});
    return cudaSuccess;
  }
  a->fromPool = true;
  // Memory cached by the pool is reused first; the rest is new reservation.
  const size_t reused = std::min(gPoolCached, bytes);
  gPoolCached -= reused;
  gPoolReserved += bytes - reused;
  return cudaSuccess;
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t s) {
  Lock lock(mutex());
  if (gFaulted) return cudaErrorLaunchFailure;
  Stream* stream = toStream(s);
  if (stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (ptr == nullptr) return cudaSuccess;
  Allocation* a = findExact(ptr);
  if (a == nullptr || a->pinned || a->freePending) {
    complain("cudaFreeAsync of a pointer that is not a live device allocation");
    return fail(cudaErrorInvalidValue);
  }
  if (stream->capture != nullptr) {
    // A free node: documented to require the address of an allocation of this graph.
    if (a->graph != stream->capture->memory || a->freedInGraph) {
      invalidate(stream, "cudaFreeAsync during capture of memory the graph did not allocate");
      return fail(cudaErrorInvalidValue);
    }
    a->freedInGraph = true;
    stream->capture->nodes.push_back(Node{[ptr] {
                                            Allocation* alloc = findExact(ptr);
                                            if (alloc == nullptr) return;
                                            alloc->live = false;
                                            std::memset(ptr, kUninitializedByte, alloc->bytes);
                                          },
                                          "graph free"});
    return cudaSuccess;
  }
  if (a->graph) {
    // Freeing a graph allocation after a launch: documented only for allocations the graph does
    // not free itself.
    if (a->freedInGraph) {
      complain("cudaFreeAsync of a graph allocation that its graph frees");
      return fail(cudaErrorInvalidValue);
    }
    enqueue(
        s,
        [ptr] {
          Allocation* alloc = findExact(ptr);
          if (alloc == nullptr) return;
          alloc->live = false;
          std::memset(ptr, kUninitializedByte, alloc->bytes);
        },
        "free of a graph allocation");
    return cudaSuccess;
  }
  if (!a->fromPool) return fail(cudaErrorInvalidValue);
  a->freePending = true;
  return enqueue(
      s,
      [ptr] {
        Allocation* alloc = findExact(ptr);
        if (alloc == nullptr) return;
        const size_t bytes = alloc->bytes;
        releaseBlock(ptr);
        // The pool keeps freed memory up to its release threshold.
        if (gReleaseThreshold >= gPoolReserved) {
          gPoolCached += bytes;
        } else {
          gPoolReserved -= bytes;
        }
      },
      "cudaFreeAsync");
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  Lock lock(mutex());
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  if (cudaError_t e = checkUnsafeDuringCapture("cudaMallocHost")) return e;
  *ptr = allocateBlock(bytes, true, nullptr);
  return *ptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  if (flags != cudaHostAllocDefault) return fail(cudaErrorInvalidValue);
  return cudaMallocHost(ptr, bytes);
}

cudaError_t cudaFreeHost(void* ptr) {
  Lock lock(mutex());
  if (ptr == nullptr) return cudaSuccess;
  if (cudaError_t e = checkUnsafeDuringCapture("cudaFreeHost")) return e;
  Allocation* a = findExact(ptr);
  if (a == nullptr || !a->pinned) return fail(cudaErrorInvalidValue);
  flushAll();  // work still queued may read it
  releaseBlock(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  Lock lock(mutex());
  if (gFaulted) return cudaErrorLaunchFailure;
  Stream* stream = toStream(s);
  if (stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  cudaMemcpyKind actual;
  Side dstSide, srcSide;
  if (!resolveCopy(dst, src, bytes, kind, &actual, &dstSide, &srcSide)) return fail(cudaErrorInvalidValue);
  const bool pageable = dstSide == Side::Pageable || srcSide == Side::Pageable;
  if (stream->capture != nullptr) {
    if (pageable) return invalidate(stream, "cudaMemcpyAsync with pageable host memory while capturing");
    return enqueue(s, copyOp(dst, src, bytes, dstSide == Side::Device, srcSide == Side::Device), "cudaMemcpyAsync");
  }
  if (srcSide == Side::Pageable && actual == cudaMemcpyHostToDevice) {
    // Returns once the source has been staged: the host may reuse it at once.
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + bytes);
    return enqueue(
        s,
        [dst, bytes, staged] {
          if (!isDeviceRange(dst, bytes)) {
            deviceFault("cudaMemcpyAsync of " + std::to_string(bytes) + " bytes to freed device memory");
            return;
          }
          std::memcpy(dst, staged->data(), bytes);
        },
        "cudaMemcpyAsync");
  }
  if (dstSide == Side::Pageable) {
    // Into pageable memory the call returns only once the copy is done.
    flush(stream);
    if (gFaulted) return cudaErrorLaunchFailure;
    if (srcSide == Side::Device && !isDeviceRange(src, bytes)) return fail(cudaErrorInvalidValue);
    std::memmove(dst, src, bytes);
    return cudaSuccess;
  }
  return enqueue(s, copyOp(dst, src, bytes, dstSide == Side::Device, srcSide == Side::Device), "cudaMemcpyAsync");
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  Lock lock(mutex());
  if (cudaError_t e = checkUnsafeDuringCapture("cudaMemcpy")) return e;
  flushAll();
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  if (e != cudaSuccess) return e;
  flush(&gLegacyStream);
  return gFaulted ? cudaErrorLaunchFailure : cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t s) {
  Lock lock(mutex());
  if (gFaulted) return cudaErrorLaunchFailure;
  if (toStream(s) == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  const Allocation* a = findContaining(ptr, bytes);
  if (a == nullptr || a->pinned) {
    complain("cudaMemsetAsync of " + std::to_string(bytes) + " bytes outside device memory");
    return fail(cudaErrorInvalidValue);
  }
  return enqueue(
      s,
      [ptr, value, bytes] {
        if (!isDeviceRange(ptr, bytes)) {
          deviceFault("cudaMemsetAsync of " + std::to_string(bytes) + " bytes on freed device memory");
          return;
        }
        std::memset(ptr, value, bytes);
      },
      "cudaMemsetAsync");
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  Lock lock(mutex());
  if (cudaError_t e = checkUnsafeDuringCapture("cudaMemset")) return e;
  const cudaError_t e = cudaMemsetAsync(ptr, value, bytes, nullptr);
  if (e != cudaSuccess) return e;
  flushAll();
  return gFaulted ? cudaErrorLaunchFailure : cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (pool == nullptr) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= deviceCount() || device >= 64) return fail(cudaErrorInvalidDevice);
  gPools[device].device = device;
  *pool = reinterpret_cast<cudaMemPool_t>(&gPools[device]);
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  Lock lock(mutex());
  if (pool == nullptr || value == nullptr) return fail(cudaErrorInvalidValue);
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold: gReleaseThreshold = *static_cast<uint64_t*>(value); return cudaSuccess;
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies: return cudaSuccess;
    default: return fail(cudaErrorInvalidValue);  // the others are read-only or reset-only
  }
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  Lock lock(mutex());
  if (pool == nullptr || value == nullptr) return fail(cudaErrorInvalidValue);
  auto* out = static_cast<uint64_t*>(value);
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold: *out = gReleaseThreshold; return cudaSuccess;
    case cudaMemPoolAttrReservedMemCurrent:
    case cudaMemPoolAttrReservedMemHigh: *out = gPoolReserved; return cudaSuccess;
    case cudaMemPoolAttrUsedMemCurrent:
    case cudaMemPoolAttrUsedMemHigh: *out = gPoolReserved - gPoolCached; return cudaSuccess;
    default: *static_cast<int*>(value) = 1; return cudaSuccess;
  }
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t minBytesToKeep) {
  Lock lock(mutex());
  if (pool == nullptr) return fail(cudaErrorInvalidValue);
  if (gPoolCached > minBytesToKeep) {
    gPoolReserved -= gPoolCached - minBytesToKeep;
    gPoolCached = minBytesToKeep;
  }
  return cudaSuccess;
}

// ---- streams and events -----------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  Lock lock(mutex());
  if (s == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return fail(cudaErrorInvalidValue);
  auto* stream = new Stream();
  stream->flags = flags;
  stream->device = tDevice;
  gStreams.insert(stream);
  *s = reinterpret_cast<cudaStream_t>(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Lock lock(mutex());
  Stream* stream = toStream(s);
  if (stream == nullptr || stream == &gLegacyStream) return fail(cudaErrorInvalidResourceHandle);
  if (stream->capture != nullptr) return invalidate(stream, "cudaStreamDestroy of a capturing stream");
  flush(stream);  // queued work still completes
  gStreams.erase(stream);
  for (Event* e : gEvents) {
    if (e->stream == stream) e->stream = nullptr;  // already complete
  }
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Lock lock(mutex());
  Stream* stream = toStream(s);
  if (stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (stream->capture != nullptr) return invalidate(stream, "cudaStreamSynchronize of the capturing stream");
  if (cudaError_t e = checkUnsafeDuringCapture("cudaStreamSynchronize")) return e;
  flush(stream);
  return gFaulted ? cudaErrorLaunchFailure : cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  Lock lock(mutex());
  Stream* stream = toStream(s);
  if (stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (stream->capture != nullptr) return invalidate(stream, "cudaStreamQuery of the capturing stream");
  if (gFaulted) return cudaErrorLaunchFailure;
  if (stream->queue.empty()) return cudaSuccess;
  flush(stream);  // the device makes progress; this query still sees it busy
  return cudaErrorNotReady;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  Lock lock(mutex());
  if (event == nullptr || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0) {
    return fail(cudaErrorInvalidValue);
  }
  auto* e = new Event();
  e->device = tDevice;
  e->flags = flags;
  gEvents.insert(e);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

namespace {
Event* toEvent(cudaEvent_t event) {
  auto* e = reinterpret_cast<Event*>(event);
  return gEvents.count(e) ? e : nullptr;
}
}  // namespace

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Lock lock(mutex());
  Event* e = toEvent(event);
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  gEvents.erase(e);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t s) {
  Lock lock(mutex());
  Event* e = toEvent(event);
  Stream* stream = toStream(s);
  if (e == nullptr || stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (stream->device >= 0 && stream->device != e->device) {
    complain("cudaEventRecord of an event of device " + std::to_string(e->device) + " on a stream of device " +
             std::to_string(stream->device));
    return fail(cudaErrorInvalidResourceHandle);
  }
  const uint64_t generation = e->generation = ++gEventRecords;
  e->timed = false;
  if (stream->capture != nullptr) {
    e->capturedIn = stream->capture;
    e->capturedOn = stream;
    e->capturedWork = stream->forkedWork;
    e->stream = nullptr;
    e->recorded = false;
    return cudaSuccess;
  }
  e->capturedIn = nullptr;
  e->capturedOn = nullptr;
  e->recorded = true;
  if ((e->flags & cudaEventDisableTiming) == 0) {
    const cudaError_t queued = enqueue(
        s,
        [e, generation] {
          if (gEvents.count(e) == 0 || e->generation != generation) return;
          e->time = std::chrono::steady_clock::now();
          e->timed = true;
        },
        "cudaEventRecord");
    if (queued != cudaSuccess) return fail(queued);
  }
  e->stream = stream;
  e->sequence = stream->submitted;
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Lock lock(mutex());
  if (ms == nullptr) return fail(cudaErrorInvalidValue);
  Event* a = toEvent(start);
  Event* b = toEvent(end);
  if (a == nullptr || b == nullptr) return fail(cudaErrorInvalidResourceHandle);
  // As documented: events without timing, or never recorded (outside a capture), have no time.
  if (((a->flags | b->flags) & cudaEventDisableTiming) != 0) return fail(cudaErrorInvalidResourceHandle);
  if (!a->recorded || !b->recorded) return fail(cudaErrorInvalidResourceHandle);
  if (gFaulted) return cudaErrorLaunchFailure;
  // Recorded, but the stream has not reached the record yet: the host did not wait for it.
  if (!a->timed || !b->timed) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(b->time - a->time).count();
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Lock lock(mutex());
  Event* e = toEvent(event);
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (e->capturedIn != nullptr) {
    for (Stream* s : gStreams) {
      if (s->capture == e->capturedIn) return invalidate(s, "cudaEventSynchronize of an event recorded in the capture");
    }
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (e->stream != nullptr) flush(e->stream, e->sequence);
  return gFaulted ? cudaErrorLaunchFailure : cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  Lock lock(mutex());
  Event* e = toEvent(event);
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (e->capturedIn != nullptr) return fail(cudaErrorStreamCaptureUnsupported);
  if (gFaulted) return cudaErrorLaunchFailure;
  if (e->stream == nullptr || e->stream->completed >= e->sequence) return cudaSuccess;
  flush(e->stream, e->sequence);
  return cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t event, unsigned int flags) {
  Lock lock(mutex());
  Event* e = toEvent(event);
  Stream* stream = toStream(s);
  if (e == nullptr || stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (flags != 0) return fail(cudaErrorInvalidValue);
  if (stream->capture != nullptr) {
    if (e->capturedIn != stream->capture) {
      return invalidate(stream, "cudaStreamWaitEvent on an event from outside the capture");
    }
    // Same capture: already ordered (nodes run in call order). An event of a forked stream joins it.
    Stream* from = e->capturedOn;
    if (from != nullptr && from != stream && gStreams.count(from) && from->capture == stream->capture && from->forked) {
      from->joinedWork = std::max(from->joinedWork, e->capturedWork);
    }
    return cudaSuccess;
  }
  if (e->capturedIn != nullptr && e->capturedIn->open && e->capturedOn != nullptr && gStreams.count(e->capturedOn)) {
    // A fork: this stream joins the capture of the stream the event was recorded on.
    stream->capture = e->capturedIn;
    stream->captureInvalid = false;
    stream->mode = e->capturedOn->mode;
    stream->captureThread = e->capturedOn->captureThread;
    stream->forked = true;
    stream->forkedWork = stream->joinedWork = 0;
    return cudaSuccess;
  }
  if (e->stream == nullptr || e->stream == stream) return cudaSuccess;
  Stream* other = e->stream;
  const uint64_t sequence = e->sequence;
  return enqueue(
      s, [other, sequence] { flush(other, sequence); }, "cudaStreamWaitEvent");
}

// ---- graphs -----------------------------------------------------------------------------------

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  Lock lock(mutex());
  Stream* stream = toStream(s);
  if (stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (stream == &gLegacyStream) return fail(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot capture
  if (stream->capture != nullptr) return fail(cudaErrorIllegalState);
  if (gFaulted) return cudaErrorLaunchFailure;
  auto* graph = new Graph();
  gGraphs.insert(graph);
  stream->capture = graph;
  graph->open = true;
  stream->captureInvalid = false;
  stream->mode = mode;
  stream->captureThread = std::this_thread::get_id();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  Lock lock(mutex());
  Stream* stream = toStream(s);
  if (stream == nullptr || graph == nullptr) return fail(cudaErrorInvalidValue);
  if (stream->capture == nullptr) return fail(cudaErrorIllegalState);
  if (stream->mode != cudaStreamCaptureModeRelaxed && stream->captureThread != std::this_thread::get_id()) {
    return fail(cudaErrorStreamCaptureUnmatched);
  }
  if (stream->forked) return fail(cudaErrorStreamCaptureUnmatched);  // only the origin ends a capture
  Graph* captured = stream->capture;
  stream->capture = nullptr;
  captured->open = false;
  // The forked streams leave the capture; one with work no join covers makes it fail.
  bool unjoined = false;
  for (Stream* other : gStreams) {
    if (other->capture != captured) continue;
    if (other->joinedWork != other->forkedWork) unjoined = true;
    if (other->captureInvalid) stream->captureInvalid = true;
    other->capture = nullptr;
    other->captureInvalid = false;
    other->forked = false;
  }
  if (unjoined && !stream->captureInvalid) {
    complain("stream capture ended with work on a forked stream that the capturing stream did not wait for");
    gGraphs.erase(captured);
    dropGraphMemory(captured->memory);
    delete captured;
    *graph = nullptr;
    return fail(cudaErrorStreamCaptureUnjoined);
  }
  if (stream->captureInvalid) {
    stream->captureInvalid = false;
    gGraphs.erase(captured);
    dropGraphMemory(captured->memory);
    delete captured;
    *graph = nullptr;
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  *graph = reinterpret_cast<cudaGraph_t>(captured);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  Lock lock(mutex());
  Stream* stream = toStream(s);
  if (stream == nullptr || status == nullptr) return fail(cudaErrorInvalidValue);
  *status = stream->capture == nullptr ? cudaStreamCaptureStatusNone
            : stream->captureInvalid   ? cudaStreamCaptureStatusInvalidated
                                       : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long flags) {
  Lock lock(mutex());
  auto* graph = reinterpret_cast<Graph*>(g);
  if (exec == nullptr || !gGraphs.count(graph)) return fail(cudaErrorInvalidValue);
  if ((flags & ~cudaGraphInstantiateFlagAutoFreeOnLaunch) != 0) return fail(cudaErrorInvalidValue);
  if (!graph->memory->allocations.empty() && graph->instantiated) {
    complain("a graph with allocations may have one instantiation at a time");
    return fail(cudaErrorInvalidValue);
  }
  auto* e = new Exec();
  e->nodes = graph->nodes;
  e->memory = graph->memory;
  e->graph = graph;
  e->autoFree = (flags & cudaGraphInstantiateFlagAutoFreeOnLaunch) != 0;
  graph->instantiated = true;
  gExecs.insert(e);
  *exec = reinterpret_cast<cudaGraphExec_t>(e);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  Lock lock(mutex());
  auto* e = reinterpret_cast<Exec*>(exec);
  Stream* stream = toStream(s);
  if (!gExecs.count(e) || stream == nullptr) return fail(cudaErrorInvalidValue);
  if (gFaulted) return cudaErrorLaunchFailure;
  if (stream->capture != nullptr) return invalidate(stream, "graph launch into a capturing stream (not emulated)");
  if (!e->autoFree) {
    for (void* p : e->memory->allocations) {
      const Allocation* a = findExact(p);
      if (a != nullptr && a->live && !a->freedInGraph) {
        complain("graph relaunched while an allocation of its previous launch is not freed");
        return fail(cudaErrorInvalidValue);
      }
    }
  }
  auto memory = e->memory;
  auto nodes = std::make_shared<std::vector<Node>>(e->nodes);
  return enqueue(
      s,
      [memory, nodes] {
        for (void* p : memory->allocations) {  // AutoFreeOnLaunch
          Allocation* a = findExact(p);
          if (a != nullptr && a->live) {
            a->live = false;
            std::memset(p, kUninitializedByte, a->bytes);
          }
        }
        for (Node& node : *nodes) runNode(node);
      },
      "cudaGraphLaunch");
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  Lock lock(mutex());
  auto* e = reinterpret_cast<Exec*>(exec);
  if (!gExecs.count(e)) return fail(cudaErrorInvalidValue);
  flushAll();  // a launch still queued keeps running with it
  gExecs.erase(e);
  if (gGraphs.count(e->graph)) e->graph->instantiated = false;
  dropGraphMemory(e->memory);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  Lock lock(mutex());
  auto* graph = reinterpret_cast<Graph*>(g);
  if (!gGraphs.count(graph)) return fail(cudaErrorInvalidValue);
  gGraphs.erase(graph);
  for (Exec* e : gExecs) {
    if (e->graph == graph) e->graph = nullptr;
  }
  dropGraphMemory(graph->memory);
  delete graph;
  return cudaSuccess;
}

}  // extern "C"
