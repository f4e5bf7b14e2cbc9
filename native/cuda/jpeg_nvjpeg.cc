#include "jpeg_nvjpeg.h"

#include <dlfcn.h>

#include <mutex>

#include "../core/error.h"

namespace rc::cuda {
namespace {

constexpr const char* kLibrary = "libnvjpeg.so.13";

// The emulated nvJPEG (test/cuda-emulator) is part of the emulated backend library itself.
#if defined(RC_EMULATED_NVJPEG)
NvjpegApi bind(std::string*) {
  return NvjpegApi{&nvjpegCreateEx,     &nvjpegDestroy, &nvjpegJpegStateCreate,         &nvjpegJpegStateDestroy,
                   &nvjpegGetImageInfo, &nvjpegDecode,  &nvjpegDecodeBatchedInitialize, &nvjpegDecodeBatched};
}
#else
template <typename Fn>
bool lookUp(void* handle, const char* name, Fn* out, std::string* error) {
  *out = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*out == nullptr && error->empty()) error->assign(std::string(kLibrary) + " has no " + name);
  return *out != nullptr;
}

NvjpegApi bind(std::string* error) {
  // The addon preloaded it (RTLD_GLOBAL) if it found it; opening it by soname then returns that
  // copy, and otherwise the dynamic loader's own search gets a last chance.
  void* handle = dlopen(kLibrary, RTLD_NOW | RTLD_GLOBAL);
  NvjpegApi api;
  if (handle == nullptr) {
    const char* why = dlerror();
    *error = std::string(kLibrary) + " was not found (" + (why != nullptr ? why : "not found") + ")";
    return api;
  }
  lookUp(handle, "nvjpegCreateEx", &api.createEx, error);
  lookUp(handle, "nvjpegDestroy", &api.destroy, error);
  lookUp(handle, "nvjpegJpegStateCreate", &api.stateCreate, error);
  lookUp(handle, "nvjpegJpegStateDestroy", &api.stateDestroy, error);
  lookUp(handle, "nvjpegGetImageInfo", &api.getImageInfo, error);
  lookUp(handle, "nvjpegDecode", &api.decode, error);
  lookUp(handle, "nvjpegDecodeBatchedInitialize", &api.batchedInitialize, error);
  lookUp(handle, "nvjpegDecodeBatched", &api.decodeBatched, error);
  return api;
}
#endif

}  // namespace

const NvjpegApi& nvjpeg() {
  static std::once_flag once;
  static NvjpegApi api;
  static std::string error;
  std::call_once(once, [] { api = bind(&error); });
  if (!error.empty()) {
    RC_THROW(code::kBackendUnavailable,
             "decoding JPEGs on the device needs nvJPEG 13: "
                 << error
                 << ". Install it with `pip install nvidia-nvjpeg` (or scripts/setup-cuda-sdk), where the CUDA "
                    "libraries are looked for (RESNET_CUDA_LIBRARY_PATH, LD_LIBRARY_PATH, CUDA_HOME, Python "
                    "environments' nvidia/*/lib), or decode on the CPU");
  }
  return api;
}

std::string nvjpegStatusName(nvjpegStatus_t status) {
  switch (status) {
    case NVJPEG_STATUS_SUCCESS: return "NVJPEG_STATUS_SUCCESS";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "NVJPEG_STATUS_NOT_INITIALIZED";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "NVJPEG_STATUS_INVALID_PARAMETER";
    case NVJPEG_STATUS_BAD_JPEG: return "NVJPEG_STATUS_BAD_JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "NVJPEG_STATUS_JPEG_NOT_SUPPORTED";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "NVJPEG_STATUS_ALLOCATOR_FAILURE";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "NVJPEG_STATUS_EXECUTION_FAILED";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "NVJPEG_STATUS_ARCH_MISMATCH";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "NVJPEG_STATUS_INTERNAL_ERROR";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "NVJPEG_STATUS_INCOMPLETE_BITSTREAM";
    default: break;
  }
  return "nvJPEG status " + std::to_string(static_cast<int>(status));
}

}  // namespace rc::cuda
