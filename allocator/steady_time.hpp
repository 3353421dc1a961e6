// Nanoseconds of the steady clock, for timing how long a lock is held (the allocator's lock in
// StreamLocks, every ledger shard in Ledger::lock_shards). Not for per-event timestamps: those
// use accounting/cheap_clock.hpp's cheaper sources.
#pragma once

#include <chrono>
#include <cstdint>

namespace vramledger {

inline std::uint64_t steady_now_ns() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

}  // namespace vramledger
