#include "registry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "../core/checked_backend.h"
#include "../core/error.h"
#include "../cpu/backend_cpu.h"
#include "cuda_libraries.h"

namespace rc {

namespace {

constexpr const char* kCudaLibrary = "libresnet_cuda_backend.so";
// Bumped whenever the Backend interface changes, so a stale library is refused, not misused.
constexpr int kBackendAbi = 11;
// How long python3 may take to list its site-packages when the CUDA libraries are looked for.
constexpr int kPythonTimeoutMs = 5000;

using CreateFn = Backend* (*)(int deviceIndex, int abiVersion);
using CountFn = int (*)(char* error, size_t errorSize);

struct CudaLibrary {
  bool tried = false;
  void* handle = nullptr;
  std::string error;
  CreateFn create = nullptr;
  CountFn count = nullptr;
};

std::mutex gMutex;
std::unique_ptr<Backend> gCpu;
std::map<int, std::unique_ptr<Backend>> gCuda;
CudaLibrary gCudaLib;

std::string addonDirectory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&addonDirectory), &info) == 0 || info.dli_fname == nullptr) return ".";
  std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool cudaLibraryBuilt() {
  const char* replacement = std::getenv("RESNET_CUDA_BACKEND_LIBRARY");
  if (replacement != nullptr && replacement[0] != '\0') return true;
  const std::string path = addonDirectory() + "/" + kCudaLibrary;
  return access(path.c_str(), R_OK) == 0;
}

std::string envOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? std::string(value) : fallback;
}

// libresnet_cuda_backend.so carries no RUNPATH: the libraries it needs besides the driver (cuDNN,
// cuBLAS, NCCL) are loaded first, RTLD_GLOBAL, from where cuda_libraries.h finds them, and the
// dynamic loader then resolves the backend's NEEDED entries to these already-loaded objects.
bool preloadCudaLibraries(std::string* error) {
  const CudaLibrarySearch& search = cudaRuntimeLibraries();
  if (search.complete()) return true;
  std::string places;
  for (const auto& place : search.places) places += (places.empty() ? "" : ", ") + place.label;
  *error = "the CUDA backend is built, but CUDA libraries it needs are missing: " + search.missing() +
           ". Looked in, in this order: " + places +
           ". Install them with `npx resnet-cuda install-cuda`, or set RESNET_CUDA_LIBRARY_PATH to the folders "
           "that hold them; `npx resnet-cuda doctor` shows what was found where";
  return false;
}

// Binds the entry points of an opened backend library.
void bindCudaLibrary(const std::string& path) {
  gCudaLib.create = reinterpret_cast<CreateFn>(dlsym(gCudaLib.handle, "rc_cuda_create_backend"));
  gCudaLib.count = reinterpret_cast<CountFn>(dlsym(gCudaLib.handle, "rc_cuda_device_count"));
  if (gCudaLib.create == nullptr || gCudaLib.count == nullptr) {
    gCudaLib.error = path + " does not export the backend entry points; rebuild it";
  }
}

CudaLibrary& openCudaLibrary() {
  if (gCudaLib.tried) return gCudaLib;
  gCudaLib.tried = true;
  // Another build of the backend interface in place of the CUDA one: the emulated CUDA backend
  // (libresnet_cuda_emulator.so), which needs neither a GPU nor the CUDA libraries.
  const std::string replacement = envOr("RESNET_CUDA_BACKEND_LIBRARY", "");
  if (!replacement.empty()) {
    gCudaLib.handle = dlopen(replacement.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (gCudaLib.handle == nullptr) {
      const char* why = dlerror();
      gCudaLib.error =
          "RESNET_CUDA_BACKEND_LIBRARY=" + replacement + " could not be loaded: " + (why ? why : "unknown error");
      return gCudaLib;
    }
    bindCudaLibrary(replacement);
    return gCudaLib;
  }
  const std::string path = addonDirectory() + "/" + kCudaLibrary;
  if (!cudaLibraryBuilt()) {
    gCudaLib.error = std::string("this build has no CUDA backend (") + kCudaLibrary +
                     " was not built: no CUDA toolkit with cuDNN, cuBLAS and NCCL was found at build time). "
                     "Install a prebuilt package that includes it, or build from source on a machine with a CUDA 13 "
                     "toolkit, cuDNN 9 and NCCL (CUDA_HOME set to the toolkit)";
    return gCudaLib;
  }
  // The CUDA runtime opens the driver itself; checking first gives the plain reason on machines
  // without a GPU instead of a CUDA error code later. The handle stays open: cudart reuses it.
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL) == nullptr) {
    const char* why = dlerror();
    gCudaLib.error = std::string("the CUDA backend is built, but no NVIDIA driver (libcuda.so.1) found: ") +
                     (why ? why : "not found") +
                     ". Install the NVIDIA driver (R580 or newer for CUDA 13) on a machine with an NVIDIA GPU; "
                     "in a container, run it with the GPU exposed (--gpus all)";
    return gCudaLib;
  }
  if (!preloadCudaLibraries(&gCudaLib.error)) return gCudaLib;
  gCudaLib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (gCudaLib.handle == nullptr) {
    const char* why = dlerror();
    gCudaLib.error = std::string("the CUDA backend could not be loaded: ") + (why ? why : "unknown error") +
                     ". Install the CUDA 13 libraries it names with `npx resnet-cuda install-cuda`, or set "
                     "RESNET_CUDA_LIBRARY_PATH to the folders that hold them; `npx resnet-cuda doctor` shows what was "
                     "found where";
    return gCudaLib;
  }
  bindCudaLibrary(kCudaLibrary);
  return gCudaLib;
}

int cudaDeviceCount(std::string* reason) {
  CudaLibrary& lib = openCudaLibrary();
  if (lib.create == nullptr) {
    *reason = lib.error;
    return 0;
  }
  char error[512] = {0};
  const int n = lib.count(error, sizeof(error));
  if (n <= 0) *reason = error[0] ? error : "no CUDA device is visible";
  return n < 0 ? 0 : n;
}

}  // namespace

const CudaLibrarySearch& cudaRuntimeLibraries() {
  static std::mutex mutex;
  static std::unique_ptr<CudaLibrarySearch> search;
  std::lock_guard<std::mutex> lock(mutex);
  if (!search) {
    search = std::make_unique<CudaLibrarySearch>(findCudaLibraries(processEnv, true, kPythonTimeoutMs));
  }
  return *search;
}

Backend& backendFor(const Device& device) {
  std::lock_guard<std::mutex> lock(gMutex);
  if (device.type == DeviceType::Cpu) {
    if (!gCpu) gCpu = checkedBackend(cpu::createCpuBackend());
    return *gCpu;
  }
  auto it = gCuda.find(device.index);
  if (it != gCuda.end()) return *it->second;
  std::string reason;
  const int count = cudaDeviceCount(&reason);
  if (count == 0) RC_THROW(code::kBackendUnavailable, "device '" << device.str() << "' is not available: " << reason);
  if (device.index >= count) {
    RC_THROW(code::kDevice, "device '" << device.str() << "' does not exist: " << count << " CUDA device"
                                       << (count == 1 ? " is" : "s are") << " visible");
  }
  std::unique_ptr<Backend> backend(gCudaLib.create(device.index, kBackendAbi));
  if (!backend) RC_THROW(code::kBackendUnavailable, "the CUDA backend refused device " << device.str());
  return *gCuda.emplace(device.index, checkedBackend(std::move(backend))).first->second;
}

std::vector<BackendStatus> listBackends() {
  std::vector<BackendStatus> out;
  BackendStatus cpuStatus;
  cpuStatus.name = "cpu";
  cpuStatus.built = true;
  cpuStatus.available = true;
  cpuStatus.deviceCount = 1;
  cpuStatus.info = backendFor(Device{DeviceType::Cpu, 0}).info();
  out.push_back(cpuStatus);

  BackendStatus cudaStatus;
  cudaStatus.name = "cuda";
  {
    std::lock_guard<std::mutex> lock(gMutex);
    cudaStatus.built = cudaLibraryBuilt();
    cudaStatus.deviceCount = cudaDeviceCount(&cudaStatus.reason);
  }
  cudaStatus.available = cudaStatus.deviceCount > 0;
  if (cudaStatus.available) cudaStatus.info = backendFor(Device{DeviceType::Cuda, 0}).info();
  out.push_back(cudaStatus);
  return out;
}

}  // namespace rc
