#include "profile_timeline.h"

#include <nvtx3/nvToolsExt.h>

#include "cuda_check.h"

namespace rc::cuda {

ProfileTimeline::~ProfileTimeline() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (; openRanges_ > 0; --openRanges_) nvtxRangePop();
}

int64_t ProfileTimeline::mark(const ProfileMarkArgs& args) {
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    // Timing events (the default flags): cudaEventElapsedTime reads them with ~0.5 us resolution.
    RC_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
    events_.push_back(e);
  }
  // NVTX ranges are host-side: Nsight Systems draws each on the CPU thread and links it to the
  // kernels it launched, so the range opens before the op's begin mark and closes after its end mark.
  if (!args.push.empty()) {
    nvtxRangePushA(args.push.c_str());
    ++openRanges_;
  }
  RC_CUDA_CHECK(cudaEventRecord(events_[used_], ctx_.stream()));
  if (args.pop && openRanges_ > 0) {
    nvtxRangePop();
    --openRanges_;
  }
  return static_cast<int64_t>(used_++);
}

std::vector<double> ProfileTimeline::read() {
  std::vector<double> times;
  for (; openRanges_ > 0; --openRanges_) nvtxRangePop();
  if (used_ == 0) return times;
  const size_t count = used_;
  used_ = 0;
  // The one wait of the window: every earlier mark on the stream is complete once the last one is.
  RC_CUDA_CHECK(cudaEventSynchronize(events_[count - 1]));
  times.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    float ms = 0.0f;
    RC_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[0], events_[i]));
    times.push_back(static_cast<double>(ms));
  }
  ctx_.checkDeferredErrors();
  return times;
}

}  // namespace rc::cuda
