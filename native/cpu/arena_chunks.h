// Segments of a flat arena cut into chunks of at most kArenaChunk elements, each inside one
// segment: the optimizer kernels spread the chunks of all segments over OpenMP threads in one
// parallel loop (no parallel region per segment, of which ResNet-50 has 161, most of them small).
#pragma once

#include <algorithm>
#include <vector>

#include "../core/backend.h"

namespace rc::cpu {

constexpr int64_t kArenaChunk = 1 << 14;

struct ArenaChunk {
  int64_t begin, end;
  size_t segment;  // index into the segment list the chunks were cut from
};

inline std::vector<ArenaChunk> arenaChunks(const std::vector<ArenaSegment>& segments) {
  std::vector<ArenaChunk> chunks;
  for (size_t s = 0; s < segments.size(); ++s) {
    const int64_t end = segments[s].offset + segments[s].count;
    for (int64_t at = segments[s].offset; at < end; at += kArenaChunk) {
      chunks.push_back({at, std::min(end, at + kArenaChunk), s});
    }
  }
  return chunks;
}

}  // namespace rc::cpu
