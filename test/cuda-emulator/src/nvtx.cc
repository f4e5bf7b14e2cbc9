// The emulator's NVTX ranges (see include/nvtx3/nvToolsExt.h).
#include <nvtx3/nvToolsExt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

bool tracing() {
  static const bool trace = [] {
    const char* text = std::getenv("RESNET_CUDA_EMU_NVTX");
    return text != nullptr && std::strcmp(text, "trace") == 0;
  }();
  return trace;
}

thread_local std::vector<std::string> tRanges;

}  // namespace

int nvtxRangePushA(const char* message) {
  tRanges.emplace_back(message != nullptr ? message : "");
  if (tracing()) std::fprintf(stderr, "CUDA emulator: nvtx push %s\n", tRanges.back().c_str());
  return static_cast<int>(tRanges.size()) - 1;
}

int nvtxRangePop(void) {
  if (tRanges.empty()) {
    std::fprintf(stderr, "CUDA emulator: nvtxRangePop without an open range\n");
    return -1;
  }
  if (tracing()) std::fprintf(stderr, "CUDA emulator: nvtx pop %s\n", tRanges.back().c_str());
  tRanges.pop_back();
  return static_cast<int>(tRanges.size());
}
