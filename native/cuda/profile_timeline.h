// The profiler's marks on a device's timeline: CUDA events recorded on the backend's stream
// without waiting, read back once per profiled window, with NVTX ranges named after the ops.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda_context.h"

namespace rc::cuda {

class ProfileTimeline {
 public:
  explicit ProfileTimeline(CudaContext& ctx) : ctx_(ctx) {}
  ~ProfileTimeline();
  ProfileTimeline(const ProfileTimeline&) = delete;
  ProfileTimeline& operator=(const ProfileTimeline&) = delete;

  // Records the next mark of the window on the stream (see Backend::profileMark); returns its index.
  int64_t mark(const ProfileMarkArgs& args);
  // Waits for the window's last mark, returns every mark's time in ms after the first, and starts
  // a new window. The events stay allocated for the next one.
  std::vector<double> read();

 private:
  CudaContext& ctx_;
  // The pool: events_[0, used_) are this window's marks; the rest wait for reuse.
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
  // NVTX ranges opened by marks and not yet closed, so that a window abandoned mid-op (an op that
  // threw) leaves no range open.
  int openRanges_ = 0;
};

}  // namespace rc::cuda
