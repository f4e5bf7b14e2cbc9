#pragma once

#include <memory>

#include "../core/backend.h"

namespace rc::cpu {
std::unique_ptr<Backend> createCpuBackend();
}
