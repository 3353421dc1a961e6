// An address range the policy carves blocks from: either a backend segment (memory fixed behind
// every byte) or a virtual span of the paged heap (pages mapped on demand).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "allocator/allocator_events.hpp"
#include "allocator/block.hpp"

namespace vramledger {

struct AddressRange;

// One page of a virtual span.
struct PageSlot {
  PhysicalHandle handle = 0;
  bool mapped = false;
  std::uint32_t users = 0;         // active blocks touching the page
  std::size_t active_bytes = 0;    // bytes of active blocks on the page
  std::uint64_t freed_at_fence = 0;  // owner stream's fence sequence when users fell to 0
  // Links in the per-pool list of free mapped pages, oldest first.
  PageSlot* lru_prev = nullptr;
  PageSlot* lru_next = nullptr;
  AddressRange* span = nullptr;
  std::size_t index = 0;  // position in span->pages
  bool in_lru = false;
};

struct AddressRange {
  DevicePtr base = 0;
  std::size_t size = 0;
  StreamHeaps* owner = nullptr;
  PoolKind pool = PoolKind::kLarge;
  bool is_span = false;
  Block* first = nullptr;
  std::size_t active_blocks = 0;
  // Virtual spans only. Pages past pages.size() have never been touched: unmapped, unused.
  std::deque<PageSlot> pages;  // deque: growing keeps PageSlot addresses stable
  std::size_t mapped_pages = 0;

  DevicePtr end() const { return base + size; }
};

}  // namespace vramledger
