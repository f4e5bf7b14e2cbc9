#include "registry.h"

#include <dlfcn.h>
#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "../core/checked_backend.h"
#include "../core/error.h"
#include "../cpu/backend_cpu.h"

namespace rc {

namespace {

constexpr const char* kCudaLibrary = "libresnet_cuda_backend.so";
// Bumped whenever the Backend interface changes, so a stale library is refused, not misused.
constexpr int kBackendAbi = 9;

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

// The shared libraries libresnet_cuda_backend.so needs (by these sonames) besides the driver. It
// carries no RUNPATH, so they are loaded here first, RTLD_GLOBAL, from wherever they are found:
// the dynamic loader then resolves the backend's NEEDED entries to these already-loaded objects.
// Loaded in this order because libcublas.so.13 needs libcublasLt.so.13, and cuDNN dlopens
// libcublasLt.so.13 (and libnvrtc.so.13) by soname, which its RUNPATH does not find in the CUDA 13
// wheels' layout (nvidia/cu13/lib). cuDNN finds its own sub-libraries (libcudnn_ops.so.9, ...)
// through its RUNPATH $ORIGIN, i.e. next to libcudnn.so.9 wherever that was loaded from.
struct RuntimeLibrary {
  const char* soname;
  const char* what;
  const char* howToGet;
  bool required;
};
constexpr RuntimeLibrary kRuntimeLibraries[] = {
    {"libcublasLt.so.13", "cuBLASLt 13", "pip install nvidia-cublas", true},
    {"libcublas.so.13", "cuBLAS 13", "pip install nvidia-cublas", true},
    {"libcudnn.so.9", "cuDNN 9", "pip install nvidia-cudnn-cu13", true},
    {"libnccl.so.2", "NCCL 2", "pip install nvidia-nccl-cu13", true},
    // Optional: only cuDNN's runtime-compiled engines use it; without it cuDNN uses the others.
    {"libnvrtc.so.13", "NVRTC 13", "pip install nvidia-cuda-nvrtc", false},
};

std::string envOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? std::string(value) : fallback;
}

void appendGlob(const std::string& pattern, std::vector<std::string>* out) {
  glob_t g{};
  if (glob(pattern.c_str(), GLOB_ONLYDIR | GLOB_NOSORT, nullptr, &g) == 0) {
    std::vector<std::string> found(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    std::sort(found.begin(), found.end());
    out->insert(out->end(), found.begin(), found.end());
  }
  globfree(&g);
}

// Folders to look in after the dynamic loader's own search, most specific first. Python
// environments are found by their usual locations, without running Python: the nvidia-* wheels
// (also PyTorch's) install their libraries under site-packages/nvidia/<name>/lib.
std::vector<std::string> cudaLibrarySearchPath() {
  std::vector<std::string> dirs;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    const std::string root = envOr(var, "");
    if (!root.empty()) {
      dirs.push_back(root + "/lib64");
      dirs.push_back(root + "/lib");
    }
  }
  const std::string home = envOr("HOME", "");
  std::vector<std::string> sitePackages;
  const std::string venv = envOr("VIRTUAL_ENV", "");
  if (!venv.empty()) appendGlob(venv + "/lib/python3*/site-packages", &sitePackages);
  const std::string conda = envOr("CONDA_PREFIX", "");
  if (!conda.empty()) {
    dirs.push_back(conda + "/lib");
    appendGlob(conda + "/lib/python3*/site-packages", &sitePackages);
  }
  appendGlob("/opt/*/.venv/lib/python3*/site-packages", &sitePackages);
  if (!home.empty()) appendGlob(home + "/.local/lib/python3*/site-packages", &sitePackages);
  appendGlob("/usr/local/lib/python3*/site-packages", &sitePackages);
  appendGlob("/usr/local/lib/python3*/dist-packages", &sitePackages);
  appendGlob("/usr/lib/python3/dist-packages", &sitePackages);
  for (const auto& sp : sitePackages) appendGlob(sp + "/nvidia/*/lib", &dirs);
  // The SDK of scripts/setup-cuda-sdk, which a machine with a GPU may use at run time too.
  const std::string cache = envOr(
      "RESNET_CUDA_CACHE", envOr("XDG_CACHE_HOME", home.empty() ? std::string() : home + "/.cache") + "/resnet-cuda");
  appendGlob(cache + "/cuda-sdk-*/lib", &dirs);
  return dirs;
}

// Loads the libraries of kRuntimeLibraries; on failure returns false with `error` naming each
// missing library and how to get it. RESNET_CUDA_LIBRARY_PATH (colon-separated folders) comes first,
// then the dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache), then cudaLibrarySearchPath().
bool preloadCudaLibraries(std::string* error) {
  std::vector<std::string> first;
  const std::string userPath = envOr("RESNET_CUDA_LIBRARY_PATH", "");
  for (size_t start = 0; start <= userPath.size();) {
    const size_t end = std::min(userPath.find(':', start), userPath.size());
    if (end > start) first.push_back(userPath.substr(start, end - start));
    start = end + 1;
  }
  std::vector<std::string> later;
  bool searched = false;
  std::string missing;
  for (const RuntimeLibrary& lib : kRuntimeLibraries) {
    std::string firstFailure;
    auto tryPath = [&](const std::string& path) {
      if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr) return true;
      const char* message = dlerror();
      const std::string why = message != nullptr ? message : "";
      // A library that is there but does not load (a missing dependency, a wrong architecture) is
      // worth reporting; "<path>: cannot open shared object file" only means it is not there.
      if (firstFailure.empty() && why.rfind(path + ": cannot open shared object file", 0) != 0) firstFailure = why;
      return false;
    };
    bool loaded = false;
    for (const auto& dir : first) {
      if ((loaded = tryPath(dir + "/" + lib.soname))) break;
    }
    if (!loaded) loaded = tryPath(lib.soname);
    if (!loaded) {
      if (!searched) {
        later = cudaLibrarySearchPath();
        searched = true;
      }
      std::set<std::string> seen;
      for (const auto& dir : later) {
        if (!seen.insert(dir).second) continue;
        const std::string path = dir + "/" + lib.soname;
        if (access(path.c_str(), F_OK) == 0 && (loaded = tryPath(path))) break;
      }
    }
    if (loaded || !lib.required) continue;
    missing += missing.empty() ? "" : "; ";
    missing += std::string(lib.what) + " (" + lib.soname + ") " +
               (firstFailure.empty() ? std::string("was not found") : "does not load: " + firstFailure) +
               ": install it with `" + lib.howToGet + "`";
  }
  if (missing.empty()) return true;
  *error = "the CUDA backend is built, but CUDA libraries it needs are missing: " + missing +
           ". They are looked for in RESNET_CUDA_LIBRARY_PATH, the dynamic loader's path (LD_LIBRARY_PATH), "
           "$CUDA_HOME/lib64, the nvidia/*/lib folders of Python environments ($VIRTUAL_ENV, $CONDA_PREFIX, "
           "/opt/*/.venv, ~/.local, /usr/local/lib/python3*) and the SDK of scripts/setup-cuda-sdk; or set "
           "CUDA_HOME to a CUDA 13 toolkit that has cuDNN 9 and NCCL";
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
                     " was not built: no CUDA toolkit with cuDNN, cuBLAS and NCCL was found at build time; "
                     "run scripts/setup-cuda-sdk and rebuild, or install a prebuilt binary with CUDA)";
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
                     ". Install the NVIDIA driver and the CUDA 13 libraries it names (cuDNN 9: pip install "
                     "nvidia-cudnn-cu13; cuBLAS: pip install nvidia-cublas; NCCL: pip install nvidia-nccl-cu13) "
                     "and make them visible through RESNET_CUDA_LIBRARY_PATH, LD_LIBRARY_PATH or CUDA_HOME";
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
