// Emulated cub::BlockReduce: a block-wide reduction through shared memory and barriers, with a
// fixed summation tree so that results never depend on the schedule. With P the smallest power of
// two >= BLOCK_THREADS, level s = P/2, P/4, ..., 1 sets v[i] = op(v[i], v[i + s]) for i < s (and
// i + s < the valid count); thread 0's result is v[0] after the last level. As with CUB, only
// thread 0's result is the block's (others get partial values), every thread of the block must
// call it, and reusing the TempStorage needs a __syncthreads() in between: the last level is read
// after the final barrier, so a reuse without one lets other threads overwrite it first.
#pragma once

#include <type_traits>

#include "../../rc_emu/device.h"
#include "../thread/thread_operators.cuh"
#include "block_thread_index.cuh"

namespace cub {

enum BlockReduceAlgorithm { BLOCK_REDUCE_RAKING_COMMUTATIVE_ONLY, BLOCK_REDUCE_RAKING, BLOCK_REDUCE_WARP_REDUCTIONS };

template <typename T, int BLOCK_DIM_X, BlockReduceAlgorithm ALGORITHM = BLOCK_REDUCE_WARP_REDUCTIONS,
          int BLOCK_DIM_Y = 1, int BLOCK_DIM_Z = 1>
class BlockReduce {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_default_constructible_v<T>,
                "the emulated BlockReduce keeps values in raw shared memory");

 public:
  static constexpr int BLOCK_THREADS = BLOCK_DIM_X * BLOCK_DIM_Y * BLOCK_DIM_Z;

  struct TempStorage {
    T values[BLOCK_THREADS];
  };

  explicit BlockReduce(TempStorage& storage) : storage_(storage), tid_(linearThread()) {}

  T Sum(T input) { return Reduce(input, cub::Sum(), BLOCK_THREADS); }
  T Sum(T input, int numValid) { return Reduce(input, cub::Sum(), numValid); }

  template <typename Op>
  T Reduce(T input, Op op) {
    return Reduce(input, op, BLOCK_THREADS);
  }

  // Threads from numValid on contribute nothing (they must still call).
  template <typename Op>
  T Reduce(T input, Op op, int numValid) {
    T* v = storage_.values;
    v[tid_] = input;
    int span = 1;
    while (span < BLOCK_THREADS) span *= 2;
    for (int stride = span / 2; stride > 1; stride /= 2) {
      __syncthreads();
      if (tid_ < stride && tid_ + stride < numValid) v[tid_] = op(v[tid_], v[tid_ + stride]);
    }
    __syncthreads();
    // The last level: read after the final barrier, so other threads may move on meanwhile.
    if (tid_ == 0 && numValid > 1) return op(v[0], v[1]);
    return v[tid_];
  }

 private:
  static int linearThread() {
    return detail::blockLinearThread<BLOCK_DIM_X, BLOCK_DIM_Y, BLOCK_DIM_Z>("cub::BlockReduce");
  }

  TempStorage& storage_;
  int tid_;
};

}  // namespace cub
