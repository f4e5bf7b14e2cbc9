// The linear index of the calling thread in a block of the shape a block primitive was declared
// for; a block of another shape is a device fault (CUB's primitives are sized at compile time).
#pragma once

#include <cstdio>

#include "../../rc_emu/device.h"

namespace cub {
namespace detail {

template <int BLOCK_DIM_X, int BLOCK_DIM_Y, int BLOCK_DIM_Z>
int blockLinearThread(const char* primitive) {
  if (blockDim.x != static_cast<unsigned>(BLOCK_DIM_X) || blockDim.y != static_cast<unsigned>(BLOCK_DIM_Y) ||
      blockDim.z != static_cast<unsigned>(BLOCK_DIM_Z)) {
    char what[160];
    std::snprintf(what, sizeof what, "%s for blocks of %dx%dx%d threads used in a block of %ux%ux%u", primitive,
                  BLOCK_DIM_X, BLOCK_DIM_Y, BLOCK_DIM_Z, blockDim.x, blockDim.y, blockDim.z);
    ::rc_emu::deviceCodeFault(what);
  }
  return static_cast<int>(threadIdx.x + BLOCK_DIM_X * (threadIdx.y + BLOCK_DIM_Y * threadIdx.z));
}

}  // namespace detail
}  // namespace cub
