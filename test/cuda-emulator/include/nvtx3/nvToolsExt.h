// NVTX 3's range calls as the emulator provides them (the real header is header-only and hands the
// calls to a profiler's injection library, doing nothing without one). Here each thread keeps its
// stack of open ranges, a pop without a push is reported on stderr, and RESNET_CUDA_EMU_NVTX=trace
// prints every push and pop, so tests can check which ranges a profiled step opens.
#pragma once

extern "C" {

// Opens a range named `message` on this thread; returns its zero-based nesting level.
int nvtxRangePushA(const char* message);
// Closes this thread's innermost range; returns its level, or -1 when none is open.
int nvtxRangePop(void);

}  // extern "C"
