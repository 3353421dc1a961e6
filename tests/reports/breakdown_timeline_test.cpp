// The timeline re-feeds the trace into a fresh ledger: its samples are the breakdown the real
// ledger had at those instants, and bucketing keeps the peak.
#include "accounting/reports/breakdown_timeline.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "tests/accounting/scenarios.hpp"

namespace vramledger {
namespace {

using namespace vramledger::testing;

void expect_same(const MemoryBreakdown& a, const MemoryBreakdown& b) {
  EXPECT_EQ(a.requested, b.requested);
  EXPECT_EQ(a.rounding, b.rounding);
  EXPECT_EQ(a.pending_frees, b.pending_frees);
  EXPECT_EQ(a.cached_usable, b.cached_usable);
  EXPECT_EQ(a.fragmentation, b.fragmentation);
  EXPECT_EQ(a.unmapped_physical, b.unmapped_physical);
  EXPECT_EQ(a.reserved, b.reserved);
}

TEST(BreakdownTimeline, OneSamplePerRecordMatchesTheLedgerAfterEachEvent) {
  Ledger ledger(quiet_ledger_options());
  segment_heap_scenario(ledger);
  const BreakdownTimeline timeline = build_breakdown_timeline(ledger.trace(), 1000);
  ASSERT_EQ(timeline.samples.size(), ledger.trace().size());
  EXPECT_FALSE(timeline.incomplete);
  EXPECT_FALSE(timeline.inconsistent);
  for (std::size_t i = 0; i < timeline.samples.size(); ++i) {
    EXPECT_EQ(timeline.samples[i].sequence, i);
    EXPECT_EQ(timeline.samples[i].breakdown.sum(), timeline.samples[i].breakdown.reserved);
  }
  expect_same(timeline.samples.back().breakdown, compute_breakdown(ledger.counters().aggregate()));
  EXPECT_EQ(timeline.at_peak_reserved.reserved, ledger.counters().aggregate().reserved_bytes.peak);
  // After the first event only the 20 MiB segment exists, all of it cached.
  EXPECT_EQ(timeline.samples.front().breakdown.cached_usable, 20 * kMiB);
}

TEST(BreakdownTimeline, BucketsKeepTheirHighestReservedInstant) {
  Ledger ledger(quiet_ledger_options());
  // Reserved climbs to 8 MiB and drops back, one event at a time.
  for (int i = 1; i <= 8; ++i) ledger.on_event(sized(EventKind::kSegmentCreate, kMiB));
  for (int i = 1; i <= 8; ++i) ledger.on_event(sized(EventKind::kSegmentRelease, kMiB));
  const BreakdownTimeline timeline = build_breakdown_timeline(ledger.trace(), 3);
  ASSERT_EQ(timeline.samples.size(), 3u);
  std::int64_t highest = 0;
  for (const TimelineSample& sample : timeline.samples) {
    highest = std::max(highest, sample.breakdown.reserved);
  }
  EXPECT_EQ(highest, 8 * kMiB);
  EXPECT_EQ(timeline.peak_reserved_sequence, 7u);
}

TEST(BreakdownTimeline, AWrappedRingIsReportedAsIncomplete) {
  LedgerOptions options = quiet_ledger_options();
  options.trace_capacity = 4;
  Ledger ledger(options);
  for (int i = 0; i < 6; ++i) ledger.on_event(sized(EventKind::kSegmentCreate, kMiB));
  const BreakdownTimeline timeline = build_breakdown_timeline(ledger.trace(), 100);
  EXPECT_TRUE(timeline.incomplete);
  EXPECT_EQ(timeline.first_sequence, 2u);
  ASSERT_EQ(timeline.samples.size(), 4u);
  EXPECT_EQ(timeline.samples.front().sequence, 2u);
}

TEST(BreakdownTimeline, EmptyTraceGivesNoSamples) {
  Ledger ledger(quiet_ledger_options());
  EXPECT_TRUE(build_breakdown_timeline(ledger.trace(), 100).samples.empty());
}

}  // namespace
}  // namespace vramledger
