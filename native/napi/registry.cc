#include "registry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <mutex>

#include "../core/error.h"
#include "../cpu/backend_cpu.h"

namespace rc {

namespace {

constexpr const char* kCudaLibrary = "libresnet_cuda_backend.so";
// Bumped whenever the Backend interface changes, so a stale library is refused, not misused.
constexpr int kBackendAbi = 1;

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
  const std::string path = addonDirectory() + "/" + kCudaLibrary;
  return access(path.c_str(), R_OK) == 0;
}

CudaLibrary& openCudaLibrary() {
  if (gCudaLib.tried) return gCudaLib;
  gCudaLib.tried = true;
  const std::string path = addonDirectory() + "/" + kCudaLibrary;
  if (!cudaLibraryBuilt()) {
    gCudaLib.error = std::string("this build has no CUDA backend (") + kCudaLibrary +
                     " was not built: no CUDA toolkit with cuDNN, cuBLAS and NCCL was found at build time; "
                     "run scripts/setup-cuda-sdk and rebuild, or install a prebuilt binary with CUDA)";
    return gCudaLib;
  }
  gCudaLib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (gCudaLib.handle == nullptr) {
    const char* why = dlerror();
    gCudaLib.error = std::string("the CUDA backend could not be loaded: ") + (why ? why : "unknown error") +
                     ". Install the NVIDIA driver and the CUDA 13 libraries it names (cuDNN 9, cuBLAS, NCCL; "
                     "the nvidia-* Python wheels of PyTorch also work) and make them visible through "
                     "LD_LIBRARY_PATH or CUDA_HOME";
    return gCudaLib;
  }
  gCudaLib.create = reinterpret_cast<CreateFn>(dlsym(gCudaLib.handle, "rc_cuda_create_backend"));
  gCudaLib.count = reinterpret_cast<CountFn>(dlsym(gCudaLib.handle, "rc_cuda_device_count"));
  if (gCudaLib.create == nullptr || gCudaLib.count == nullptr) {
    gCudaLib.error = std::string(kCudaLibrary) + " does not export the backend entry points; rebuild it";
  }
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

Backend& backendFor(const Device& device) {
  std::lock_guard<std::mutex> lock(gMutex);
  if (device.type == DeviceType::Cpu) {
    if (!gCpu) gCpu = cpu::createCpuBackend();
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
  return *gCuda.emplace(device.index, std::move(backend)).first->second;
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
