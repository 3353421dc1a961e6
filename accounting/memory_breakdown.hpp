// The additive account: reserved memory broken into lines that sum exactly to reserved
// (docs/stats.md defines every line). A pure function of a pool's counters, so every printer
// (text, JSON, Prometheus, HTML) and the process classification share one definition.
#pragma once

#include <cstdint>

#include "accounting/ledger_counters.hpp"

namespace vramledger {

// Each line is >= 0 when the ledger is consistent; a negative line means an event is missing and
// is reported as such, never clamped. sum() == reserved holds by construction.
struct MemoryBreakdown {
  std::int64_t requested = 0;          // requested bytes of allocated blocks
  std::int64_t rounding = 0;           // allocated - requested
  std::int64_t pending_frees = 0;      // active - allocated: freed, other streams still use them
  std::int64_t cached_usable = 0;      // free bytes in blocks not split from a used range
  std::int64_t fragmentation = 0;      // inactive split bytes: free holes inside used ranges
  std::int64_t unmapped_physical = 0;  // VMM physical pages held but mapped nowhere
  // Sleeping blocks' bytes on pages kept mapped for neighbours (docs/sleep.md); usually 0.
  std::int64_t sleeping_resident = 0;
  std::int64_t reserved = 0;
  // Not a line of reserved: bytes of sleeping blocks (address space; sleeping_resident of them
  // still have memory behind them).
  std::int64_t sleeping = 0;

  std::int64_t sum() const noexcept {
    return requested + rounding + pending_frees + cached_usable + fragmentation +
           unmapped_physical + sleeping_resident;
  }
  bool all_lines_non_negative() const noexcept {
    return requested >= 0 && rounding >= 0 && pending_frees >= 0 && cached_usable >= 0 &&
           fragmentation >= 0 && unmapped_physical >= 0 && sleeping_resident >= 0;
  }
};

MemoryBreakdown compute_breakdown(const PoolCounters& pool);

}  // namespace vramledger
