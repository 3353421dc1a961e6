// A snapshot of everything observable about an allocator and its simulated device, so a test can
// show that a refused operation changed nothing at all.
#pragma once

#include <cstddef>
#include <string>

#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"

namespace vramledger::stress {

struct AllocatorState {
  BlockCensus census;
  LedgerCounters counters;
  std::size_t device_physical_bytes = 0;
  std::size_t device_mapped_bytes = 0;
  std::size_t device_segments = 0;

  static AllocatorState take(CachingAllocator& allocator, const Ledger& ledger,
                             const SimulatedDevice& device);
};

// Field-by-field differences ("large.reserved_bytes: 20971520 -> 0"), empty when equal.
std::string differences(const AllocatorState& before, const AllocatorState& after);

}  // namespace vramledger::stress
