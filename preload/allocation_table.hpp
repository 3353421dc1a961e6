// Fixed-capacity record of every live intercepted allocation: key -> (bytes, category).
//
// Open addressing with linear probing and backward-shift deletion (no tombstones, so the table
// never degrades), behind one spinlock: hooks wrap calls that cost microseconds, so a short
// critical section is cheaper than a lock-free design is worth. Static storage: nothing is
// allocated, so a hook can never recurse into malloc or a CUDA call, and the table stays valid
// while the process exits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "preload/categories.hpp"

namespace vramledger::preload {

// Device pointers and cuMemCreate handles are different key spaces that could hold equal values.
enum class KeyKind : std::uint8_t { kDevicePointer = 1, kPhysicalHandle = 2 };

struct AllocationRecord {
  std::uint64_t bytes = 0;
  Category category = VRAMLEDGER_PRELOAD_UNKNOWN;
  bool routed = false;  // served by the routed cache (routing.hpp), not by the driver
};

class AllocationTable {
 public:
  static constexpr std::size_t kCapacity = std::size_t{1} << 18;  // 262144 live allocations

  // False when the table is full (the caller counts an overflow) or the key is already live
  // (the previous record is replaced: a driver handing out a live address again means we missed
  // its free).
  bool insert(KeyKind kind, std::uint64_t key, AllocationRecord record);
  // Removes and returns the record; false when the key was never recorded.
  bool erase(KeyKind kind, std::uint64_t key, AllocationRecord* out);
  std::size_t live() const;
};

AllocationTable& allocation_table();

}  // namespace vramledger::preload
