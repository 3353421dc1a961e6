#include "accounting/fragmentation.hpp"

#include <gtest/gtest.h>

#include "accounting/ledger.hpp"
#include "scenarios.hpp"

namespace vramledger {
namespace {

using namespace vramledger::testing;

TEST(Fragmentation, EmptyLedgerHasNoRatios) {
  Ledger ledger(quiet_ledger_options());
  const FragmentationMetrics metrics = measure_fragmentation(ledger.counters());
  EXPECT_FALSE(metrics.gmlake_ratio.has_value());
  EXPECT_FALSE(metrics.ratio_at_peak_reserved.has_value());
  EXPECT_FALSE(metrics.overhead_ratio.has_value());
  EXPECT_FALSE(metrics.largest_free_block.has_value());
}

TEST(Fragmentation, RatiosFromPeaks) {
  Ledger ledger(quiet_ledger_options());
  // Peak reserved 10 MiB; active peaks at 8 MiB but only 6 MiB is active while reserved is at
  // its peak; requested peaks at 7'000'000.
  const BlockEvent big{.address = 0x1000, .size = 8 * kMiB, .requested = 7'000'000};
  const BlockEvent mid{.address = 0x2000, .size = 6 * kMiB, .requested = 5'000'000};
  ledger.on_event(sized(EventKind::kSegmentCreate, 8 * kMiB));
  ledger.on_event(alloc(big));
  ledger.on_event(free_requested(big));
  ledger.on_event(free_completed(big));
  ledger.on_event(sized(EventKind::kSegmentCreate, 2 * kMiB));
  ledger.on_event(alloc(mid));
  ledger.on_event(sized(EventKind::kInactiveSplitAdd, 4 * kMiB));

  const FragmentationMetrics metrics = measure_fragmentation(ledger.counters());
  EXPECT_EQ(metrics.peak_active_bytes, 8 * kMiB);
  EXPECT_EQ(metrics.peak_reserved_bytes, 10 * kMiB);
  EXPECT_EQ(metrics.peak_requested_bytes, 7'000'000);
  EXPECT_EQ(metrics.active_bytes_at_peak_reserved, 6 * kMiB);
  EXPECT_DOUBLE_EQ(*metrics.gmlake_ratio, 1.0 - 8.0 / 10.0);
  EXPECT_DOUBLE_EQ(*metrics.ratio_at_peak_reserved, 1.0 - 6.0 / 10.0);
  EXPECT_DOUBLE_EQ(*metrics.overhead_ratio, 10.0 * kMiB / 7'000'000.0);
  EXPECT_EQ(metrics.inactive_split_bytes, 4 * kMiB);
  EXPECT_EQ(metrics.inactive_split, 1);
}

TEST(Fragmentation, CensusAddsLargestFreeBlockAndFreeBytes) {
  Ledger ledger(quiet_ledger_options());
  const BlockCensus census = segment_heap_scenario(ledger);
  const FragmentationMetrics metrics = measure_fragmentation(ledger.counters(), census);
  EXPECT_EQ(metrics.largest_free_block, 14 * kMiB);
  EXPECT_EQ(metrics.free_bytes, 16 * kMiB);
  EXPECT_EQ(metrics.inactive_split_bytes, 14 * kMiB);
}

}  // namespace
}  // namespace vramledger
