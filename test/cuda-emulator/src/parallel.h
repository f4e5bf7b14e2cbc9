// Work sharing for the emulated libraries' computations.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace rc_emu {

// Runs body(i) for i in [0, count) on a few threads when there is enough work. Each index must
// write its own outputs, so the results do not depend on the number of threads. The body must not
// call into the emulated runtime (its operations run under the runtime's lock).
template <typename Body>
void parallelFor(int64_t count, double workPerIndex, const Body& body) {
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const double total = workPerIndex * static_cast<double>(count);
  int64_t threads = std::min<int64_t>({static_cast<int64_t>(hardware), count, static_cast<int64_t>(total / 2e6) + 1});
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i) body(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) body(i);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(worker);
    } catch (const std::exception&) {
      break;  // fewer threads: the calling thread takes the rest
    }
  }
  worker();
  for (std::thread& t : pool) t.join();
}

}  // namespace rc_emu
