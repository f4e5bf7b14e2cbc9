// The emulated cuDNN's last-error message, shared by its translation units (dnn.cc keeps it;
// cudnnGetLastErrorString reads it).
#pragma once

#include <string>

namespace rc_emu {

// Records `message` as the calling thread's last cuDNN error.
void setDnnLastError(const std::string& message);

}  // namespace rc_emu
