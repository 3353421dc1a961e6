// Event streams with their known census, shared by the consistency, fragmentation and report
// tests: the numbers here are worked out by hand in the comments.
#pragma once

#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "event_builders.hpp"

namespace vramledger::testing {

constexpr std::int64_t kMiB = 1 << 20;

inline LedgerOptions quiet_ledger_options() {
  LedgerOptions options;
  options.trace_capacity = 256;
  options.abort_on_inconsistency = false;
  return options;
}

inline BlockCensus::PerPool& pool_of(BlockCensus& census, PoolKind pool) {
  return census.pools[static_cast<std::size_t>(pool)];
}

// Segment heap. Large pool: one 20 MiB segment holding A (4 MiB, 4'000'000 requested, live) and
// B (2 MiB, 2'000'000 requested, freed but pending on another stream); the 14 MiB after them is
// an inactive split. Small pool: one 2 MiB segment whose only block was allocated and freed, so
// it is whole and free again.
inline BlockCensus segment_heap_scenario(Ledger& ledger) {
  const BlockEvent a{.address = 0x10000000, .size = 4 * kMiB, .requested = 4'000'000,
                     .stream = 1, .tag = kWeightsTag, .pool = PoolKind::kLarge};
  const BlockEvent b{.address = 0x10400000, .size = 2 * kMiB, .requested = 2'000'000,
                     .stream = 1, .tag = kActivationsTag, .pool = PoolKind::kLarge};
  const BlockEvent c{.address = 0x20000000, .size = 512, .requested = 100, .stream = 2,
                     .pool = PoolKind::kSmall};
  ledger.on_event(sized(EventKind::kSegmentCreate, 20 * kMiB, PoolKind::kLarge, a.address));
  ledger.on_event(alloc(a));
  ledger.on_event(sized(EventKind::kInactiveSplitAdd, 16 * kMiB, PoolKind::kLarge, b.address));
  ledger.on_event(sized(EventKind::kInactiveSplitRemove, 16 * kMiB, PoolKind::kLarge, b.address));
  ledger.on_event(alloc(b));
  ledger.on_event(sized(EventKind::kInactiveSplitAdd, 14 * kMiB, PoolKind::kLarge, b.address + 2 * kMiB));
  ledger.on_event(free_requested(b));

  ledger.on_event(sized(EventKind::kSegmentCreate, 2 * kMiB, PoolKind::kSmall, c.address));
  ledger.on_event(alloc(c));
  ledger.on_event(sized(EventKind::kInactiveSplitAdd, 2 * kMiB - 512, PoolKind::kSmall, c.address + 512));
  ledger.on_event(free_requested(c));
  ledger.on_event(free_completed(c));
  ledger.on_event(sized(EventKind::kInactiveSplitRemove, 2 * kMiB - 512, PoolKind::kSmall, c.address + 512));

  BlockCensus census;
  BlockCensus::PerPool& large = pool_of(census, PoolKind::kLarge);
  large.allocation = 1;
  large.allocated_bytes = 4 * kMiB;
  large.requested_bytes = 6'000'000;
  large.active = 2;
  large.active_bytes = 6 * kMiB;
  large.inactive_split = 1;
  large.inactive_split_bytes = 14 * kMiB;
  large.segment = 1;
  large.reserved_bytes = 20 * kMiB;
  large.free_bytes = 14 * kMiB;
  large.largest_free_block = 14 * kMiB;
  BlockCensus::PerPool& small = pool_of(census, PoolKind::kSmall);
  small.segment = 1;
  small.reserved_bytes = 2 * kMiB;
  small.free_bytes = 2 * kMiB;
  small.largest_free_block = 2 * kMiB;
  return census;
}

// Paged heap, large pool: a 1 GiB virtual span, 8 MiB of physical pages of which 4 MiB are mapped
// under one live 3 MiB block (3'000'000 requested); 1 MiB of mapped free block after it.
inline BlockCensus paged_heap_scenario(Ledger& ledger) {
  const BlockEvent block{.address = 0x7f0000000000, .size = 3 * kMiB, .requested = 3'000'000,
                         .stream = 0, .tag = kKvCacheTag, .pool = PoolKind::kLarge};
  ledger.on_event(sized(EventKind::kVirtualReserve, 1024 * kMiB, PoolKind::kLarge, block.address));
  ledger.on_event(sized(EventKind::kPhysicalCreate, 8 * kMiB));
  ledger.on_event(sized(EventKind::kMap, 4 * kMiB, PoolKind::kLarge, block.address));
  ledger.on_event(alloc(block));

  BlockCensus census;
  BlockCensus::PerPool& large = pool_of(census, PoolKind::kLarge);
  large.allocation = 1;
  large.allocated_bytes = 3 * kMiB;
  large.requested_bytes = 3'000'000;
  large.active = 1;
  large.active_bytes = 3 * kMiB;
  large.reserved_bytes = 8 * kMiB;
  large.mapped_bytes = 4 * kMiB;
  large.virtual_bytes = 1024 * kMiB;
  large.free_bytes = 1 * kMiB;
  large.largest_free_block = 1 * kMiB;
  census.free_physical_pages = 2;
  return census;
}

}  // namespace vramledger::testing
