// Fragmentation and overhead figures (design.md section 5; docs/stats.md defines each).
#pragma once

#include <cstdint>
#include <optional>

#include "accounting/ledger_counters.hpp"
#include "allocator/caching_allocator.hpp"

namespace vramledger {

struct FragmentationMetrics {
  std::int64_t peak_active_bytes = 0;
  std::int64_t peak_reserved_bytes = 0;
  std::int64_t peak_requested_bytes = 0;
  std::int64_t active_bytes_at_peak_reserved = 0;
  // 1 - peak active / peak reserved (GMLake's ratio). Absent while nothing was reserved.
  std::optional<double> gmlake_ratio;
  // 1 - active at peak reserved / peak reserved: the waste at the moment it cost the most.
  std::optional<double> ratio_at_peak_reserved;
  // peak reserved / peak requested: our headline. Absent while nothing was requested.
  std::optional<double> overhead_ratio;
  std::int64_t inactive_split_bytes = 0;  // now, aggregate
  std::int64_t inactive_split = 0;
  // Only a census knows these: the largest inactive block fully backed by memory, and all
  // backed inactive bytes, over both pools.
  std::optional<std::int64_t> largest_free_block;
  std::optional<std::int64_t> free_bytes;
};

// From the counters alone (peaks since the last reset_peaks).
FragmentationMetrics measure_fragmentation(const LedgerCounters& counters);
// The same plus what only a walk of the blocks can tell.
FragmentationMetrics measure_fragmentation(const LedgerCounters& counters,
                                           const BlockCensus& census);

}  // namespace vramledger
