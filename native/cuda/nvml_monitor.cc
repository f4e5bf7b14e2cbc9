// NVML opened at run time. The declarations below are those of the NVML API reference
// (https://docs.nvidia.com/deploy/nvml-api/, "Initialization and Cleanup", "Device Queries"): the
// header is not needed at build time, and the pinned SDK does not ship it.
#include "nvml_monitor.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

namespace rc::cuda {

namespace {

using NvmlReturn = int;  // nvmlReturn_t
constexpr NvmlReturn kNvmlSuccess = 0;
struct NvmlDeviceSt;
using NvmlDevice = NvmlDeviceSt*;  // nvmlDevice_t
struct NvmlUtilization {           // nvmlUtilization_t
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {  // nvmlMemory_t
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

// The NVML entry points used, or why NVML cannot be used in this process.
struct Nvml {
  std::string error;
  const char* (*errorString)(NvmlReturn) = nullptr;
  NvmlReturn (*handleByPciBusId)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*utilizationRates)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*memoryInfo)(NvmlDevice, NvmlMemory*) = nullptr;

  std::string describe(NvmlReturn status) const {
    const char* text = errorString != nullptr ? errorString(status) : nullptr;
    return text != nullptr ? std::string(text) + " (" + std::to_string(status) + ")"
                           : "NVML error " + std::to_string(status);
  }
};

template <typename Fn>
bool bind(void* library, const char* name, Fn* out, std::string* error) {
  *out = reinterpret_cast<Fn>(dlsym(library, name));
  if (*out == nullptr && error->empty()) error->assign(std::string("libnvidia-ml.so.1 has no ") + name);
  return *out != nullptr;
}

// Opens and initialises NVML once per process. The library stays open and initialised for the
// life of the process (nvmlShutdown is not needed before exit).
Nvml openNvml() {
  Nvml out;
  void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    out.error = std::string("NVML (libnvidia-ml.so.1, installed with the NVIDIA driver) could not be loaded: ") +
                (why != nullptr ? why : "not found");
    return out;
  }
  NvmlReturn (*init)() = nullptr;
  bind(library, "nvmlInit_v2", &init, &out.error);
  bind(library, "nvmlErrorString", &out.errorString, &out.error);
  bind(library, "nvmlDeviceGetHandleByPciBusId_v2", &out.handleByPciBusId, &out.error);
  bind(library, "nvmlDeviceGetUtilizationRates", &out.utilizationRates, &out.error);
  bind(library, "nvmlDeviceGetMemoryInfo", &out.memoryInfo, &out.error);
  if (!out.error.empty()) return out;
  const NvmlReturn status = init();
  if (status != kNvmlSuccess) out.error = "nvmlInit_v2 failed: " + out.describe(status);
  return out;
}

const Nvml& nvml() {
  static const Nvml instance = openNvml();
  return instance;
}

}  // namespace

bool NvmlMonitor::resolve() {
  if (resolved_) return handle_ != nullptr;
  resolved_ = true;
  // "domain:bus:device.function", the form nvmlDeviceGetHandleByPciBusId_v2 takes.
  char busId[64] = {0};
  const cudaError_t found = cudaDeviceGetPCIBusId(busId, sizeof(busId), device_);
  if (found != cudaSuccess) {
    (void)cudaGetLastError();
    reason_ = std::string("the CUDA runtime gives no PCI bus id for cuda:") + std::to_string(device_) + " (" +
              cudaGetErrorName(found) + "), so NVML cannot identify it";
    return false;
  }
  const Nvml& lib = nvml();
  if (!lib.error.empty()) {
    reason_ = lib.error;
    return false;
  }
  NvmlDevice handle = nullptr;
  const NvmlReturn status = lib.handleByPciBusId(busId, &handle);
  if (status != kNvmlSuccess) {
    reason_ = std::string("NVML does not know the device at PCI bus id ") + busId + ": " + lib.describe(status);
    return false;
  }
  handle_ = handle;
  return true;
}

DeviceUtilization NvmlMonitor::read() {
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceUtilization out;
  if (!resolve()) {
    out.reason = reason_;
    return out;
  }
  const Nvml& lib = nvml();
  auto* handle = static_cast<NvmlDevice>(handle_);
  NvmlUtilization rates{};
  NvmlMemory memory{};
  NvmlReturn status = lib.utilizationRates(handle, &rates);
  if (status == kNvmlSuccess) status = lib.memoryInfo(handle, &memory);
  if (status != kNvmlSuccess) {
    out.reason = "NVML could not read the device's utilisation: " + lib.describe(status);
    return out;
  }
  out.available = true;
  out.gpuPercent = rates.gpu;
  out.memoryPercent = rates.memory;
  out.memoryUsedBytes = memory.used;
  out.memoryTotalBytes = memory.total;
  return out;
}

}  // namespace rc::cuda
