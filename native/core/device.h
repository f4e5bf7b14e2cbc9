// A device: the CPU, or one CUDA GPU by ordinal.
#pragma once

#include <string>

namespace rc {

enum class DeviceType : int { Cpu = 0, Cuda = 1 };

struct Device {
  DeviceType type = DeviceType::Cpu;
  int index = 0;

  bool operator==(const Device& other) const { return type == other.type && index == other.index; }
  bool operator!=(const Device& other) const { return !(*this == other); }
  std::string str() const { return type == DeviceType::Cpu ? std::string("cpu") : "cuda:" + std::to_string(index); }
};

// Parses "cpu", "cuda" (= cuda:0) or "cuda:N"; throws ERR_RC_DEVICE otherwise.
Device parseDevice(const std::string& spec);

}  // namespace rc
