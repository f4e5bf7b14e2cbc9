// Every op's argument checks, written once for all backends: the registry hands out each backend
// wrapped in a checked one, which refuses wrong shapes, dtypes, devices, sizes beyond the
// libraries' 32-bit limits and values a dtype cannot hold before the backend sees them. A
// backend's own code trusts its arguments and checks only what is its own (its supported compute
// types, graph capture, its kernels' limits).
#pragma once

#include <memory>

#include "backend.h"

namespace rc {

std::unique_ptr<Backend> checkedBackend(std::unique_ptr<Backend> backend);

}  // namespace rc
