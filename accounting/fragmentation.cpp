#include "accounting/fragmentation.hpp"

#include <algorithm>

namespace vramledger {
namespace {

std::optional<double> ratio(std::int64_t numerator, std::int64_t denominator) {
  if (denominator <= 0) return std::nullopt;
  return static_cast<double>(numerator) / static_cast<double>(denominator);
}

std::optional<double> one_minus(std::optional<double> value) {
  if (!value) return std::nullopt;
  return 1.0 - *value;
}

}  // namespace

FragmentationMetrics measure_fragmentation(const LedgerCounters& counters) {
  const PoolCounters& all = counters.aggregate();
  FragmentationMetrics metrics;
  metrics.peak_active_bytes = all.active_bytes.peak;
  metrics.peak_reserved_bytes = all.reserved_bytes.peak;
  metrics.peak_requested_bytes = all.requested_bytes.peak;
  metrics.active_bytes_at_peak_reserved = counters.active_bytes_at_peak_reserved;
  metrics.gmlake_ratio = one_minus(ratio(metrics.peak_active_bytes, metrics.peak_reserved_bytes));
  metrics.ratio_at_peak_reserved =
      one_minus(ratio(metrics.active_bytes_at_peak_reserved, metrics.peak_reserved_bytes));
  metrics.overhead_ratio = ratio(metrics.peak_reserved_bytes, metrics.peak_requested_bytes);
  metrics.inactive_split_bytes = all.inactive_split_bytes.current;
  metrics.inactive_split = all.inactive_split.current;
  return metrics;
}

FragmentationMetrics measure_fragmentation(const LedgerCounters& counters,
                                           const BlockCensus& census) {
  FragmentationMetrics metrics = measure_fragmentation(counters);
  std::int64_t largest = 0;
  std::int64_t free_bytes = 0;
  for (const BlockCensus::PerPool& pool : census.pools) {
    largest = std::max(largest, pool.largest_free_block);
    free_bytes += pool.free_bytes;
  }
  metrics.largest_free_block = largest;
  metrics.free_bytes = free_bytes;
  return metrics;
}

}  // namespace vramledger
