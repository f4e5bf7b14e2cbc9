// The allocator interface and a caching host allocator. Device memory is kept in per-size free
// lists so that a training step, after its first iteration, allocates nothing from the system.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "device.h"

namespace rc {

struct MemoryStats {
  size_t allocatedBytes = 0;      // held by live tensors
  size_t reservedBytes = 0;       // held from the system (allocated + cached)
  size_t peakAllocatedBytes = 0;  // high-water mark of allocatedBytes
  size_t allocationCount = 0;     // allocations served
  size_t systemAllocationCount = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* ptr) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void resetPeak() = 0;
  virtual void emptyCache() = 0;
};

// A best-fit caching allocator over an underlying system allocator. Blocks are rounded to 512
// bytes; a cached block is reused for a request when it wastes at most a quarter of its size.
class CachingAllocator : public Allocator {
 public:
  // `systemAlloc` returns nullptr on failure; `freeMemory` reports what the system has left.
  CachingAllocator(Device device, void* (*systemAlloc)(size_t), void (*systemFree)(void*), size_t (*freeMemory)());
  ~CachingAllocator() override;

  void* allocate(size_t bytes) override;
  void release(void* ptr) override;
  MemoryStats stats() const override;
  void resetPeak() override;
  void emptyCache() override;

 private:
  void emptyCacheLocked();

  Device device_;
  void* (*systemAlloc_)(size_t);
  void (*systemFree_)(void*);
  size_t (*freeMemory_)();
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> cached_;          // size -> block
  std::unordered_map<void*, size_t> liveSizes_;  // block -> size
  MemoryStats stats_;
};

std::string formatBytes(size_t bytes);

}  // namespace rc
