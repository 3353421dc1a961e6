// What each thread remembers of the lanes it uses (detail/stream_lanes.cpp): per allocator and
// stream, the lane it allocates from and how often it found that lane's lock held. Plain
// thread-local data: the fast path reads it without a lock or a TLS guard.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "allocator/device_backend.hpp"

namespace vramledger {

struct LaneChoice {
  std::uint64_t allocator = 0;  // the allocator's never-reused id; 0: an unused entry
  StreamHandle stream = 0;
  std::uint32_t lane = 0;
  // Rises by kWaitWeight each time the fast path waited for the lane's lock, falls by one each
  // time it did not; at kWaitScoreForLane the thread asks for a lane of its own.
  std::int32_t wait_score = 0;
  bool wants_new_lane = false;

  static constexpr std::int32_t kWaitWeight = 16;
  static constexpr std::int32_t kWaitScoreForLane = 256;
};

// A few entries are enough: a thread allocates on few streams of few allocators at once. Past
// them the oldest entry is forgotten (that thread then starts again on lane 0).
struct ThreadLaneChoices {
  static constexpr std::size_t kEntries = 8;
  std::array<LaneChoice, kEntries> entries{};
  std::size_t used = 0;  // entries filled; the next one replaced is used % kEntries

  LaneChoice* find(std::uint64_t allocator, StreamHandle stream) noexcept {
    const std::size_t n = used < kEntries ? used : kEntries;
    for (std::size_t i = 0; i < n; ++i) {
      if (entries[i].allocator == allocator && entries[i].stream == stream) return &entries[i];
    }
    return nullptr;
  }
  LaneChoice& add(std::uint64_t allocator, StreamHandle stream) noexcept {
    LaneChoice& entry = entries[used++ % kEntries];
    entry = LaneChoice{allocator, stream};
    return entry;
  }
};

inline thread_local ThreadLaneChoices t_lane_choices{};

}  // namespace vramledger
