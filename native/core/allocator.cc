#include "allocator.h"

#include <cstdint>
#include <sstream>

#include "error.h"

namespace rc {

namespace {
constexpr size_t kRound = 512;
size_t roundSize(size_t bytes) { return bytes == 0 ? kRound : (bytes + kRound - 1) / kRound * kRound; }
}  // namespace

std::string formatBytes(size_t bytes) {
  std::ostringstream out;
  out.precision(3);
  if (bytes >= (size_t{1} << 30)) {
    out << static_cast<double>(bytes) / (1 << 30) << " GiB";
  } else if (bytes >= (size_t{1} << 20)) {
    out << static_cast<double>(bytes) / (1 << 20) << " MiB";
  } else {
    out << bytes << " bytes";
  }
  return out.str();
}

CachingAllocator::CachingAllocator(Device device, void* (*systemAlloc)(size_t), void (*systemFree)(void*),
                                   size_t (*freeMemory)())
    : device_(device), systemAlloc_(systemAlloc), systemFree_(systemFree), freeMemory_(freeMemory) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  emptyCacheLocked();
  // Live blocks are owned by tensors that outlive the allocator only at process exit; leave them.
}

void* CachingAllocator::allocate(size_t bytes) {
  if (bytes > SIZE_MAX / 2) {
    RC_THROW(code::kOutOfMemory, "out of memory on " << device_.str() << ": tried to allocate " << formatBytes(bytes)
                                                     << ", more than the address space holds");
  }
  const size_t size = roundSize(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  void* block = nullptr;
  size_t blockSize = size;
  auto it = cached_.lower_bound(size);
  if (it != cached_.end() && it->first - size <= it->first / 4) {
    block = it->second;
    blockSize = it->first;
    cached_.erase(it);
  } else {
    block = systemAlloc_(size);
    if (block == nullptr && !cached_.empty()) {
      emptyCacheLocked();
      block = systemAlloc_(size);
    }
    if (block == nullptr) {
      RC_THROW(code::kOutOfMemory, "out of memory on " << device_.str() << ": tried to allocate " << formatBytes(size)
                                                       << "; " << formatBytes(stats_.allocatedBytes)
                                                       << " is held by tensors and " << formatBytes(freeMemory_())
                                                       << " is free. Try a smaller batch size, gradient accumulation, "
                                                          "or mixed precision (amp: 'bf16' or 'fp16')");
    }
    stats_.reservedBytes += size;
    stats_.systemAllocationCount++;
  }
  liveSizes_[block] = blockSize;
  stats_.allocatedBytes += blockSize;
  stats_.allocationCount++;
  if (stats_.allocatedBytes > stats_.peakAllocatedBytes) stats_.peakAllocatedBytes = stats_.allocatedBytes;
  return block;
}

void CachingAllocator::release(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = liveSizes_.find(ptr);
  if (it == liveSizes_.end()) return;
  stats_.allocatedBytes -= it->second;
  cached_.emplace(it->second, ptr);
  liveSizes_.erase(it);
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::resetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peakAllocatedBytes = stats_.allocatedBytes;
}

void CachingAllocator::emptyCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  emptyCacheLocked();
}

void CachingAllocator::emptyCacheLocked() {
  for (auto& entry : cached_) {
    systemFree_(entry.second);
    stats_.reservedBytes -= entry.first;
  }
  cached_.clear();
}

}  // namespace rc
