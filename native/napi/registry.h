// Backends by device: the CPU backend is built in; the CUDA backend is a shared library opened on
// first use, so the addon loads and runs on machines without CUDA.
#pragma once

#include <string>
#include <vector>

#include "../core/backend.h"
#include "cuda_libraries.h"

namespace rc {

Backend& backendFor(const Device& device);

struct BackendStatus {
  std::string name;
  bool built = false;      // this binary includes it
  bool available = false;  // usable now
  std::string reason;      // why not, when not
  int deviceCount = 0;
  BackendInfo info;  // filled when available
};

std::vector<BackendStatus> listBackends();

// The CUDA libraries of this process: searched for and loaded once (the CUDA backend's first use,
// or this call), then the same record.
const CudaLibrarySearch& cudaRuntimeLibraries();

}  // namespace rc
