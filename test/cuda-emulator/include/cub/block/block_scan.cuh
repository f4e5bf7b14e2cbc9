// Emulated cub::BlockScan: block-wide prefix scans through shared memory and barriers. The
// prefixes are built by a fixed doubling scheme (Hillis-Steele: log2(BLOCK_THREADS) rounds of
// p[i] = op(p[i - d], p[i])), so results never depend on the schedule. Thread i's exclusive
// prefix is p[i - 1] and its inclusive prefix op(p[i - 1], input); the block aggregate is
// p[BLOCK_THREADS - 1]. As with CUB, every thread of the block must call it, and reusing the
// TempStorage needs a __syncthreads() in between: the results are read from other threads' slots
// after the final barrier, so a reuse without one lets those slots be overwritten first.
#pragma once

#include <type_traits>

#include "../../rc_emu/device.h"
#include "../thread/thread_operators.cuh"
#include "block_thread_index.cuh"

namespace cub {

enum BlockScanAlgorithm { BLOCK_SCAN_RAKING, BLOCK_SCAN_RAKING_MEMOIZE, BLOCK_SCAN_WARP_SCANS };

template <typename T, int BLOCK_DIM_X, BlockScanAlgorithm ALGORITHM = BLOCK_SCAN_RAKING, int BLOCK_DIM_Y = 1,
          int BLOCK_DIM_Z = 1>
class BlockScan {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_default_constructible_v<T>,
                "the emulated BlockScan keeps values in raw shared memory");

 public:
  static constexpr int BLOCK_THREADS = BLOCK_DIM_X * BLOCK_DIM_Y * BLOCK_DIM_Z;

  struct TempStorage {
    T prefix[BLOCK_THREADS];
  };

  explicit BlockScan(TempStorage& storage) : storage_(storage), tid_(linearThread()) {}

  void InclusiveSum(T input, T& output) {
    T aggregate;
    Scan(input, cub::Sum(), T{}, nullptr, &output, nullptr, aggregate);
  }
  void InclusiveSum(T input, T& output, T& blockAggregate) {
    Scan(input, cub::Sum(), T{}, nullptr, &output, nullptr, blockAggregate);
  }
  // Thread 0 gets T{} (zero).
  void ExclusiveSum(T input, T& output) {
    T aggregate;
    Scan(input, cub::Sum(), T{}, nullptr, nullptr, &output, aggregate);
  }
  void ExclusiveSum(T input, T& output, T& blockAggregate) {
    Scan(input, cub::Sum(), T{}, nullptr, nullptr, &output, blockAggregate);
  }

  template <typename Op>
  void InclusiveScan(T input, T& output, Op op) {
    T aggregate;
    Scan(input, op, T{}, nullptr, &output, nullptr, aggregate);
  }
  template <typename Op>
  void InclusiveScan(T input, T& output, Op op, T& blockAggregate) {
    Scan(input, op, T{}, nullptr, &output, nullptr, blockAggregate);
  }
  // Thread 0 gets `initial`; thread i > 0 gets op(initial, prefix of threads 0 .. i-1). The
  // aggregate does not include `initial`.
  template <typename Op>
  void ExclusiveScan(T input, T& output, T initial, Op op) {
    T aggregate;
    Scan(input, op, initial, &initial, nullptr, &output, aggregate);
  }
  template <typename Op>
  void ExclusiveScan(T input, T& output, T initial, Op op, T& blockAggregate) {
    Scan(input, op, initial, &initial, nullptr, &output, blockAggregate);
  }

 private:
  // first: thread 0's exclusive result; seed: combined into the others' exclusive results (or null).
  template <typename Op>
  void Scan(T input, Op op, T first, const T* seed, T* inclusive, T* exclusive, T& aggregate) {
    T* p = storage_.prefix;
    p[tid_] = input;
    for (int d = 1; d < BLOCK_THREADS; d *= 2) {
      __syncthreads();
      const T next = tid_ >= d ? op(p[tid_ - d], p[tid_]) : p[tid_];
      __syncthreads();
      p[tid_] = next;
    }
    __syncthreads();
    // Read from the other threads' slots after the final barrier.
    if (tid_ == 0) {
      if (inclusive != nullptr) *inclusive = input;
      if (exclusive != nullptr) *exclusive = first;
    } else {
      const T before = p[tid_ - 1];
      if (inclusive != nullptr) *inclusive = op(before, input);
      if (exclusive != nullptr) *exclusive = seed != nullptr ? op(*seed, before) : before;
    }
    aggregate = p[BLOCK_THREADS - 1];
  }

  static int linearThread() {
    return detail::blockLinearThread<BLOCK_DIM_X, BLOCK_DIM_Y, BLOCK_DIM_Z>("cub::BlockScan");
  }

  TempStorage& storage_;
  int tid_;
};

}  // namespace cub
