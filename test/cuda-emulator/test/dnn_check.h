// The checks of the emulated cuDNN's C++ unit tests: check.h's, a failure also printing cuDNN's
// last error message.
#pragma once

#include <cudnn.h>

#include <string>

#include "check.h"

namespace rc_emu_test::dnn {

// cuDNN's last error message (cudnnGetLastErrorString).
inline std::string lastError() {
  char last[512];
  cudnnGetLastErrorString(last, sizeof last);
  return last;
}

// Counts a check; a failure prints "FAILED: <what> (last cuDNN error: <message>)".
inline void check(bool ok, const std::string& what) {
  rc_emu_test::check(ok, what, [] { return "last cuDNN error: " + lastError(); });
}

}  // namespace rc_emu_test::dnn
