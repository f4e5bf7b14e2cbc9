#include "device.h"

#include <cstdlib>

#include "error.h"

namespace rc {

Device parseDevice(const std::string& spec) {
  if (spec == "cpu") return Device{DeviceType::Cpu, 0};
  if (spec == "cuda") return Device{DeviceType::Cuda, 0};
  if (spec.rfind("cuda:", 0) == 0 && spec.size() > 5) {
    const std::string digits = spec.substr(5);
    bool allDigits = digits.size() <= 4;
    for (char c : digits) allDigits = allDigits && c >= '0' && c <= '9';
    if (allDigits) return Device{DeviceType::Cuda, std::atoi(digits.c_str())};
  }
  RC_THROW(code::kDevice, "unknown device '" << spec << "': expected 'cpu', 'cuda' or 'cuda:N'");
}

}  // namespace rc
