// The CPU's measured multiply-add peak: what `npm run bench` compares a training step's GFLOP/s
// with. Every OpenMP thread runs independent chains of fused multiply-adds in registers (no memory
// traffic) on the widest vectors the CPU has, as the convolution kernels do.
#pragma once

#include <string>

namespace rc::cpu {

struct FmaPeak {
  double gflops = 0.0;  // all threads together, 2 FLOP per multiply-add
  int threads = 0;      // the OpenMP threads that ran
  std::string isa;      // "avx512", "avx2" or "sse" (multiply and add, no FMA)
};

// The best rate over repeated trials of about 10 ms each, for about `milliseconds` in all.
FmaPeak measureFmaPeak(double milliseconds);

}  // namespace rc::cpu
