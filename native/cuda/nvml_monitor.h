// The driver's utilisation reading of a CUDA device (what nvidia-smi shows), through NVML.
#pragma once

#include <mutex>
#include <string>

#include "../core/backend.h"

namespace rc::cuda {

// Reads one device's utilisation and memory from NVML. The library (libnvidia-ml.so.1, part of the
// NVIDIA driver) is opened with dlopen on the first read, never linked, so the backend loads and
// works without it; where it is missing, or cannot identify the device, every read says so
// (DeviceUtilization::available false, with the reason). The device is found by its PCI bus id,
// which maps a CUDA ordinal to NVML's device whatever CUDA_VISIBLE_DEVICES and the enumeration
// orders are. A read is a few driver queries on the host: no device synchronisation.
class NvmlMonitor {
 public:
  explicit NvmlMonitor(int device) : device_(device) {}
  DeviceUtilization read();

 private:
  // Finds the NVML handle of the device (once); false with `reason_` set when there is none.
  bool resolve();

  int device_;
  std::mutex mutex_;
  bool resolved_ = false;
  void* handle_ = nullptr;  // nvmlDevice_t
  std::string reason_;
};

}  // namespace rc::cuda
