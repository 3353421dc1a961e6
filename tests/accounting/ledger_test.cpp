#include "accounting/ledger.hpp"

#include <gtest/gtest.h>

#include "event_builders.hpp"

namespace vramledger {
namespace {

using testing::alloc;
using testing::BlockEvent;
using testing::free_completed;
using testing::free_requested;
using testing::sized;

LedgerOptions test_options() {
  LedgerOptions options;
  options.trace_capacity = 1024;
  options.abort_on_inconsistency = false;  // several tests plant inconsistencies on purpose
  return options;
}

// Every Stat in both the aggregate and `pool` must match `expected`, the other pool stays empty.
void expect_only_in_pool(const LedgerCounters& counters, PoolKind pool, Stat PoolCounters::*stat,
                         std::int64_t expected, const char* name) {
  SCOPED_TRACE(name);
  const PoolKind other = pool == PoolKind::kSmall ? PoolKind::kLarge : PoolKind::kSmall;
  EXPECT_EQ((counters.aggregate().*stat).current, expected);
  EXPECT_EQ((counters.pool(pool).*stat).current, expected);
  EXPECT_EQ((counters.pool(other).*stat).current, 0);
}

TEST(Ledger, AllocCountsAllocatedActiveAndRequested) {
  Ledger ledger(test_options());
  ledger.on_event(alloc({.size = 1024, .requested = 1000, .pool = PoolKind::kSmall}));
  const LedgerCounters c = ledger.counters();
  expect_only_in_pool(c, PoolKind::kSmall, &PoolCounters::allocation, 1, "allocation");
  expect_only_in_pool(c, PoolKind::kSmall, &PoolCounters::allocated_bytes, 1024, "allocated");
  expect_only_in_pool(c, PoolKind::kSmall, &PoolCounters::active, 1, "active");
  expect_only_in_pool(c, PoolKind::kSmall, &PoolCounters::active_bytes, 1024, "active_bytes");
  expect_only_in_pool(c, PoolKind::kSmall, &PoolCounters::requested_bytes, 1000, "requested");
  expect_only_in_pool(c, PoolKind::kSmall, &PoolCounters::allocated_requested_bytes, 1000,
                      "allocated_requested");
  EXPECT_EQ(c.aggregate().reserved_bytes.current, 0);
  EXPECT_EQ(c.events, 1u);
  EXPECT_FALSE(ledger.inconsistent());
}

TEST(Ledger, FreeRequestedEndsAllocationButNotActivity) {
  Ledger ledger(test_options());
  const BlockEvent block{.size = 2048, .requested = 2000, .pool = PoolKind::kLarge};
  ledger.on_event(alloc(block));
  ledger.on_event(free_requested(block));
  const LedgerCounters c = ledger.counters();
  expect_only_in_pool(c, PoolKind::kLarge, &PoolCounters::allocation, 0, "allocation");
  expect_only_in_pool(c, PoolKind::kLarge, &PoolCounters::allocated_bytes, 0, "allocated");
  expect_only_in_pool(c, PoolKind::kLarge, &PoolCounters::allocated_requested_bytes, 0,
                      "allocated_requested");
  expect_only_in_pool(c, PoolKind::kLarge, &PoolCounters::active, 1, "active");
  expect_only_in_pool(c, PoolKind::kLarge, &PoolCounters::active_bytes, 2048, "active_bytes");
  expect_only_in_pool(c, PoolKind::kLarge, &PoolCounters::requested_bytes, 2000, "requested");
  EXPECT_EQ(c.aggregate().pending_free_bytes(), 2048);
}

TEST(Ledger, FreeCompletedEndsActivity) {
  Ledger ledger(test_options());
  const BlockEvent block{.size = 2048, .requested = 2000, .pool = PoolKind::kLarge};
  ledger.on_event(alloc(block));
  ledger.on_event(free_requested(block));
  ledger.on_event(free_completed(block));
  const LedgerCounters c = ledger.counters();
  for (std::size_t index = 0; index < kStatPoolCount; ++index) {
    for_each_stat(c.pools[index], [&](const char* name, const Stat& stat) {
      EXPECT_EQ(stat.current, 0) << name;
    });
  }
  EXPECT_EQ(c.aggregate().allocated_bytes.peak, 2048);
  EXPECT_EQ(c.aggregate().allocated_bytes.allocated, 2048);
  EXPECT_EQ(c.aggregate().allocated_bytes.freed, 2048);
  EXPECT_EQ(c.aggregate().requested_bytes.freed, 2000);
  EXPECT_FALSE(ledger.inconsistent());
}

TEST(Ledger, SegmentEventsChangeSegmentCountAndReserved) {
  Ledger ledger(test_options());
  ledger.on_event(sized(EventKind::kSegmentCreate, 20 << 20));
  ledger.on_event(sized(EventKind::kSegmentCreate, 2 << 20, PoolKind::kSmall));
  LedgerCounters c = ledger.counters();
  EXPECT_EQ(c.aggregate().segment.current, 2);
  EXPECT_EQ(c.aggregate().reserved_bytes.current, 22 << 20);
  EXPECT_EQ(c.pool(PoolKind::kLarge).reserved_bytes.current, 20 << 20);
  EXPECT_EQ(c.pool(PoolKind::kSmall).segment.current, 1);
  EXPECT_EQ(c.aggregate().physical_bytes.current, 0);
  EXPECT_EQ(c.num_device_alloc, 2);
  ledger.on_event(sized(EventKind::kSegmentRelease, 20 << 20));
  c = ledger.counters();
  EXPECT_EQ(c.aggregate().segment.current, 1);
  EXPECT_EQ(c.aggregate().reserved_bytes.current, 2 << 20);
  EXPECT_EQ(c.aggregate().reserved_bytes.peak, 22 << 20);
  EXPECT_EQ(c.num_device_free, 1);
}

TEST(Ledger, PhysicalEventsChangeReservedButNotSegments) {
  Ledger ledger(test_options());
  ledger.on_event(sized(EventKind::kPhysicalCreate, 8 << 20));
  LedgerCounters c = ledger.counters();
  expect_only_in_pool(c, PoolKind::kLarge, &PoolCounters::reserved_bytes, 8 << 20, "reserved");
  expect_only_in_pool(c, PoolKind::kLarge, &PoolCounters::physical_bytes, 8 << 20, "physical");
  expect_only_in_pool(c, PoolKind::kLarge, &PoolCounters::segment, 0, "segment");
  EXPECT_EQ(c.num_device_alloc, 1);
  ledger.on_event(sized(EventKind::kPhysicalRelease, 2 << 20));
  c = ledger.counters();
  EXPECT_EQ(c.aggregate().reserved_bytes.current, 6 << 20);
  EXPECT_EQ(c.aggregate().physical_bytes.current, 6 << 20);
  EXPECT_EQ(c.num_device_free, 1);
}

TEST(Ledger, MapAndUnmapChangeMappedBytes) {
  Ledger ledger(test_options());
  ledger.on_event(sized(EventKind::kMap, 6 << 20));
  ledger.on_event(sized(EventKind::kUnmap, 2 << 20));
  const LedgerCounters c = ledger.counters();
  expect_only_in_pool(c, PoolKind::kLarge, &PoolCounters::mapped_bytes, 4 << 20, "mapped");
  EXPECT_EQ(c.aggregate().mapped_bytes.peak, 6 << 20);
  EXPECT_EQ(c.aggregate().reserved_bytes.current, 0);
  EXPECT_EQ(c.num_maps, 1);
  EXPECT_EQ(c.num_unmaps, 1);
}

TEST(Ledger, VirtualEventsChangeVirtualBytesOnly) {
  Ledger ledger(test_options());
  ledger.on_event(sized(EventKind::kVirtualReserve, std::size_t{1} << 40));
  LedgerCounters c = ledger.counters();
  expect_only_in_pool(c, PoolKind::kLarge, &PoolCounters::virtual_bytes, std::int64_t{1} << 40,
                      "virtual");
  EXPECT_EQ(c.aggregate().reserved_bytes.current, 0);
  EXPECT_EQ(c.num_device_alloc, 0);
  ledger.on_event(sized(EventKind::kVirtualRelease, std::size_t{1} << 40));
  c = ledger.counters();
  EXPECT_EQ(c.aggregate().virtual_bytes.current, 0);
}

TEST(Ledger, InactiveSplitEventsCountBlocksAndBytes) {
  Ledger ledger(test_options());
  ledger.on_event(sized(EventKind::kInactiveSplitAdd, 4096, PoolKind::kSmall));
  ledger.on_event(sized(EventKind::kInactiveSplitAdd, 1024, PoolKind::kSmall));
  ledger.on_event(sized(EventKind::kInactiveSplitRemove, 4096, PoolKind::kSmall));
  const LedgerCounters c = ledger.counters();
  expect_only_in_pool(c, PoolKind::kSmall, &PoolCounters::inactive_split, 1, "count");
  expect_only_in_pool(c, PoolKind::kSmall, &PoolCounters::inactive_split_bytes, 1024, "bytes");
}

TEST(Ledger, RetryAndOutOfMemoryAreCounted) {
  Ledger ledger(test_options());
  ledger.on_event(sized(EventKind::kAllocRetry, 1 << 30));
  ledger.on_event(sized(EventKind::kAllocRetry, 1 << 30));
  ledger.on_event(sized(EventKind::kOutOfMemory, 1 << 30));
  const LedgerCounters c = ledger.counters();
  EXPECT_EQ(c.num_alloc_retries, 2);
  EXPECT_EQ(c.num_ooms, 1);
  EXPECT_EQ(c.aggregate().allocated_bytes.current, 0);
  EXPECT_EQ(c.events, 3u);
}

TEST(Ledger, AggregatePeakIsNotTheSumOfPoolPeaks) {
  Ledger ledger(test_options());
  const BlockEvent small{.address = 0x10, .size = 100, .requested = 100, .pool = PoolKind::kSmall};
  const BlockEvent large{.address = 0x20, .size = 300, .requested = 300, .pool = PoolKind::kLarge};
  ledger.on_event(alloc(small));
  ledger.on_event(free_requested(small));
  ledger.on_event(free_completed(small));
  ledger.on_event(alloc(large));
  const LedgerCounters c = ledger.counters();
  EXPECT_EQ(c.pool(PoolKind::kSmall).allocated_bytes.peak, 100);
  EXPECT_EQ(c.pool(PoolKind::kLarge).allocated_bytes.peak, 300);
  EXPECT_EQ(c.aggregate().allocated_bytes.peak, 300);
}

TEST(Ledger, ResetPeaksEverywhere) {
  Ledger ledger(test_options());
  const BlockEvent first{.address = 0x10, .size = 1000, .requested = 900, .stream = 7, .tag = 3};
  const BlockEvent second{.address = 0x20, .size = 200, .requested = 150, .stream = 7, .tag = 3};
  ledger.on_event(sized(EventKind::kSegmentCreate, 4096, PoolKind::kSmall));
  ledger.on_event(alloc(first));
  ledger.on_event(alloc(second));
  ledger.on_event(free_requested(first));
  ledger.on_event(free_completed(first));
  ledger.reset_peaks();
  const LedgerCounters c = ledger.counters();
  EXPECT_EQ(c.aggregate().allocated_bytes.peak, 200);
  EXPECT_EQ(c.pool(PoolKind::kSmall).allocated_bytes.peak, 200);
  EXPECT_EQ(c.aggregate().requested_bytes.peak, 150);
  EXPECT_EQ(c.aggregate().reserved_bytes.peak, 4096);
  EXPECT_EQ(c.active_bytes_at_peak_reserved, 200);
  EXPECT_EQ(ledger.tag_usage(3).allocated_bytes.peak, 200);
  ASSERT_EQ(ledger.per_stream().size(), 1u);
  EXPECT_EQ(ledger.per_stream()[0].usage.allocated_bytes.peak, 200);
  // Accumulated totals survive a peak reset.
  EXPECT_EQ(c.aggregate().allocated_bytes.allocated, 1200);
}

TEST(Ledger, ResetAccumulatedEverywhere) {
  Ledger ledger(test_options());
  const BlockEvent block{.size = 1000, .requested = 900, .stream = 7, .tag = 3};
  ledger.on_event(sized(EventKind::kSegmentCreate, 4096, PoolKind::kSmall));
  ledger.on_event(sized(EventKind::kMap, 4096));
  ledger.on_event(sized(EventKind::kAllocRetry, 1));
  ledger.on_event(sized(EventKind::kOutOfMemory, 1));
  ledger.on_event(alloc(block));
  ledger.on_event(free_requested(block));
  ledger.reset_accumulated();
  const LedgerCounters c = ledger.counters();
  for (std::size_t index = 0; index < kStatPoolCount; ++index) {
    for_each_stat(c.pools[index], [&](const char* name, const Stat& stat) {
      EXPECT_EQ(stat.allocated, 0) << name;
      EXPECT_EQ(stat.freed, 0) << name;
    });
  }
  EXPECT_EQ(c.num_alloc_retries, 0);
  EXPECT_EQ(c.num_ooms, 0);
  EXPECT_EQ(c.num_device_alloc, 0);
  EXPECT_EQ(c.num_maps, 0);
  EXPECT_EQ(ledger.tag_usage(3).allocated_bytes.allocated, 0);
  EXPECT_EQ(ledger.per_stream()[0].usage.allocated_bytes.freed, 0);
  // Current values and peaks are untouched.
  EXPECT_EQ(c.aggregate().active_bytes.current, 1000);
  EXPECT_EQ(c.aggregate().allocated_bytes.peak, 1000);
  EXPECT_EQ(c.aggregate().reserved_bytes.current, 4096);
}

TEST(Ledger, TotalsCountFromTheLastAccumulatedReset) {
  Ledger ledger(test_options());
  const BlockEvent first{.address = 0x10, .size = 1000, .requested = 900, .stream = 7, .tag = 3,
                         .pool = PoolKind::kLarge};
  const BlockEvent second{.address = 0x20, .size = 300, .requested = 200, .stream = 7, .tag = 3,
                          .pool = PoolKind::kSmall};
  ledger.on_event(alloc(first));
  ledger.on_event(alloc(second));
  ledger.on_event(free_requested(second));
  ledger.reset_accumulated();
  ledger.on_event(free_requested(first));
  ledger.on_event(free_completed(first));
  ledger.on_event(alloc(second));

  const LedgerCounters c = ledger.counters();
  const Stat expected_large_allocated{.current = 0, .peak = 1000, .allocated = 0, .freed = 1000};
  EXPECT_EQ(c.pool(PoolKind::kLarge).allocated_bytes, expected_large_allocated);
  const Stat expected_small_allocated{.current = 300, .peak = 300, .allocated = 300, .freed = 0};
  EXPECT_EQ(c.pool(PoolKind::kSmall).allocated_bytes, expected_small_allocated);
  const Stat expected_all_allocated{.current = 300, .peak = 1300, .allocated = 300, .freed = 1000};
  EXPECT_EQ(c.aggregate().allocated_bytes, expected_all_allocated);
  // The small block freed before the reset is still pending: active until completed.
  EXPECT_EQ(c.aggregate().active_bytes.current, 600);
  EXPECT_EQ(c.aggregate().active_bytes.freed, 1000);
  EXPECT_EQ(c.aggregate().requested_bytes.freed, 900);
  for (const UsageStats& usage : {ledger.tag_usage(3), ledger.per_stream()[0].usage}) {
    EXPECT_EQ(usage.allocated_bytes, expected_all_allocated);
    EXPECT_EQ(usage.allocation.allocated, 1);
    EXPECT_EQ(usage.allocation.freed, 1);
    EXPECT_EQ(usage.active_bytes.current, 600);
  }
}

TEST(Ledger, PerStreamAndPerTagUsage) {
  Ledger ledger(test_options());
  const BlockEvent a{.address = 0x10, .size = 512, .requested = 400, .stream = 0, .tag = kWeightsTag};
  const BlockEvent b{.address = 0x20, .size = 1024, .requested = 1000, .stream = 0xabc0, .tag = kKvCacheTag};
  const BlockEvent c{.address = 0x30, .size = 2048, .requested = 2048, .stream = 0xabc0, .tag = kWeightsTag};
  ledger.on_event(alloc(a));
  ledger.on_event(alloc(b));
  ledger.on_event(alloc(c));
  ledger.on_event(free_requested(c));  // pending: still active on its stream and tag

  const UsageStats weights = ledger.tag_usage(kWeightsTag);
  EXPECT_EQ(weights.allocation.current, 1);
  EXPECT_EQ(weights.allocated_bytes.current, 512);
  EXPECT_EQ(weights.allocated_bytes.peak, 512 + 2048);
  EXPECT_EQ(weights.requested_bytes.current, 400 + 2048);
  EXPECT_EQ(weights.active_bytes.current, 512 + 2048);
  const UsageStats kv = ledger.tag_usage(kKvCacheTag);
  EXPECT_EQ(kv.allocated_bytes.current, 1024);
  EXPECT_EQ(ledger.tag_usage(kActivationsTag), UsageStats{});

  const std::vector<TagUsage> tags = ledger.per_tag();
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[0].tag, kWeightsTag);
  EXPECT_EQ(tags[1].tag, kKvCacheTag);

  const std::vector<StreamUsage> streams = ledger.per_stream();
  ASSERT_EQ(streams.size(), 2u);
  for (const StreamUsage& entry : streams) {
    EXPECT_FALSE(entry.is_overflow);
    if (entry.stream == 0) {
      EXPECT_EQ(entry.usage.allocated_bytes.current, 512);
      EXPECT_EQ(entry.usage.requested_bytes.current, 400);
    } else {
      EXPECT_EQ(entry.stream, 0xabc0u);
      EXPECT_EQ(entry.usage.allocation.current, 1);
      EXPECT_EQ(entry.usage.allocated_bytes.current, 1024);
      EXPECT_EQ(entry.usage.active_bytes.current, 1024 + 2048);
    }
  }
}

TEST(Ledger, StreamsBeyondTheTableShareTheOverflowEntry) {
  Ledger ledger(test_options());
  const std::size_t streams = StreamUsageTable::kCapacity + 10;
  for (std::size_t i = 0; i < streams; ++i) {
    ledger.on_event(alloc({.address = 0x1000 * (i + 1), .size = 512, .requested = 512,
                           .stream = 0x7f0000 + 0x100 * i}));
  }
  const std::vector<StreamUsage> entries = ledger.per_stream();
  ASSERT_EQ(entries.size(), StreamUsageTable::kCapacity + 1);
  EXPECT_TRUE(entries.back().is_overflow);
  EXPECT_EQ(entries.back().usage.allocation.current, 10);
  // Freeing on an overflowed stream balances the same overflow entry.
  for (std::size_t i = 0; i < streams; ++i) {
    const BlockEvent block{.address = 0x1000 * (i + 1), .size = 512, .requested = 512,
                           .stream = 0x7f0000 + 0x100 * i};
    ledger.on_event(free_requested(block));
    ledger.on_event(free_completed(block));
  }
  EXPECT_FALSE(ledger.inconsistent());
  for (const StreamUsage& entry : ledger.per_stream()) EXPECT_EQ(entry.usage.allocation.current, 0);
}

TEST(Ledger, TagIdsBeyondTheRegistryShareTheOverflowEntry) {
  Ledger ledger(test_options());
  ledger.on_event(alloc({.size = 512, .requested = 512, .tag = 5000}));
  const std::vector<TagUsage> tags = ledger.per_tag();
  ASSERT_EQ(tags.size(), 1u);
  EXPECT_TRUE(tags[0].is_overflow);
  EXPECT_EQ(ledger.tag_usage(5000).allocated_bytes.current, 512);
}

// Queries and resets visit only the tag entries ever changed: each way of changing one (an
// allocation, or only a free naming a tag never allocated) must make it visible to them.
TEST(Ledger, PerTagAndResetsReachEveryTagAnEventChanged) {
  Ledger ledger(test_options());
  ledger.on_event(alloc({.size = 512, .requested = 500, .tag = 7}));
  ledger.on_event(free_requested({.size = 512, .requested = 500, .tag = 7}));
  ledger.on_event(free_completed({.size = 512, .requested = 500, .tag = 7}));
  ledger.on_event(alloc({.size = 256, .requested = 256, .tag = 900}));
  // A free naming a tag never allocated (a wrong tag, flagged): its entry goes negative.
  ledger.on_event(free_completed({.size = 64, .requested = 64, .tag = 1000}));
  std::vector<TagUsage> tags = ledger.per_tag();
  ASSERT_EQ(tags.size(), 3u);
  EXPECT_EQ(tags[0].tag, 7);
  EXPECT_EQ(tags[0].usage.allocated_bytes.freed, 512);
  EXPECT_EQ(tags[1].tag, 900);
  EXPECT_EQ(tags[2].tag, 1000);
  EXPECT_EQ(tags[2].usage.active_bytes.current, -64);

  ledger.reset_accumulated();
  ledger.reset_peaks();
  EXPECT_EQ(ledger.tag_usage(900).allocated_bytes.allocated, 0);
  EXPECT_EQ(ledger.tag_usage(900).allocated_bytes.peak, 256);
  EXPECT_EQ(ledger.tag_usage(7).allocated_bytes.peak, 0);  // its block was freed: peak = current
  tags = ledger.per_tag();
  ASSERT_EQ(tags.size(), 2u);  // tag 7 is all zero again
  EXPECT_EQ(tags[0].tag, 900);
  EXPECT_EQ(tags[1].tag, 1000);
}

TEST(Ledger, ActiveAtPeakReservedFollowsTheAllocationThatNeededTheSegment) {
  Ledger ledger(test_options());
  const BlockEvent first{.address = 0x10, .size = 1000, .requested = 1000, .pool = PoolKind::kLarge};
  const BlockEvent second{.address = 0x20, .size = 3000, .requested = 3000, .pool = PoolKind::kLarge};
  ledger.on_event(sized(EventKind::kSegmentCreate, 4096));
  ledger.on_event(alloc(first));
  ledger.on_event(alloc(second));
  EXPECT_EQ(ledger.counters().active_bytes_at_peak_reserved, 4000);
  ledger.on_event(free_requested(second));
  ledger.on_event(free_completed(second));
  ledger.on_event(sized(EventKind::kSegmentRelease, 4096));
  ledger.on_event(sized(EventKind::kSegmentCreate, 2048));  // below the peak: no change
  ledger.on_event(alloc(second));
  EXPECT_EQ(ledger.counters().active_bytes_at_peak_reserved, 4000);
  ledger.on_event(sized(EventKind::kSegmentCreate, 8192));  // a new peak with 4000 active
  EXPECT_EQ(ledger.counters().active_bytes_at_peak_reserved, 4000);
  ledger.on_event(alloc({.address = 0x30, .size = 500, .requested = 500}));
  EXPECT_EQ(ledger.counters().active_bytes_at_peak_reserved, 4500);
}

TEST(Ledger, NegativeCounterIsDetectedAndSticky) {
  Ledger ledger(test_options());
  const BlockEvent block{.size = 512, .requested = 512, .pool = PoolKind::kLarge};
  ledger.on_event(sized(EventKind::kSegmentCreate, 4096));
  ledger.on_event(free_requested(block));  // never allocated: a missing kAlloc
  ASSERT_TRUE(ledger.inconsistent());
  const LedgerInconsistency& found = *ledger.first_inconsistency();
  EXPECT_EQ(found.event_index, 1u);
  EXPECT_EQ(found.event.kind, EventKind::kFreeRequested);
  EXPECT_STREQ(found.scope, "all");
  EXPECT_STREQ(found.counter, "allocation");
  EXPECT_EQ(found.value, -1);
  EXPECT_NE(found.to_string().find("all.allocation went negative"), std::string::npos);
  // Never clamped, and the first offender stays recorded.
  EXPECT_EQ(ledger.counters().aggregate().allocated_bytes.current, -512);
  ledger.on_event(sized(EventKind::kSegmentRelease, 8192));
  EXPECT_EQ(ledger.first_inconsistency()->event_index, 1u);
  EXPECT_EQ(ledger.counters().aggregate().reserved_bytes.current, -4096);
}

TEST(Ledger, NegativeStreamOrTagCounterIsDetected) {
  Ledger ledger(test_options());
  // The free names another tag than the allocation: pool totals balance, the tag's do not.
  ledger.on_event(alloc({.size = 512, .requested = 512, .tag = kWeightsTag}));
  ledger.on_event(free_requested({.size = 512, .requested = 512, .tag = kKvCacheTag}));
  ASSERT_TRUE(ledger.inconsistent());
  EXPECT_STREQ(ledger.first_inconsistency()->scope, "tag");
  EXPECT_STREQ(ledger.first_inconsistency()->counter, "allocation");
}

TEST(Ledger, MalformedEventsAreFlagged) {
  {
    Ledger ledger(test_options());
    AllocatorEvent event{static_cast<EventKind>(200)};
    ledger.on_event(event);
    ASSERT_TRUE(ledger.inconsistent());
    EXPECT_STREQ(ledger.first_inconsistency()->scope, "event");
    EXPECT_STREQ(ledger.first_inconsistency()->counter, "kind");
    EXPECT_EQ(ledger.first_inconsistency()->value, 200);
  }
  {
    Ledger ledger(test_options());
    AllocatorEvent event = alloc({});
    event.pool = static_cast<PoolKind>(9);
    ledger.on_event(event);
    ASSERT_TRUE(ledger.inconsistent());
    EXPECT_STREQ(ledger.first_inconsistency()->counter, "pool");
    EXPECT_EQ(ledger.counters().aggregate().allocation.current, 0);
  }
  {
    Ledger ledger(test_options());
    ledger.on_event(alloc({.size = 512, .requested = 513}));
    ASSERT_TRUE(ledger.inconsistent());
    EXPECT_STREQ(ledger.first_inconsistency()->counter, "requested");
  }
}

TEST(LedgerDeathTest, AbortsAtTheFirstInconsistencyWhenAsked) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  LedgerOptions options = test_options();
  options.abort_on_inconsistency = true;
  EXPECT_DEATH(
      {
        Ledger ledger(options);
        ledger.on_event(free_completed({}));
      },
      "ledger inconsistent at event #0 \\(free_completed");
}

TEST(Ledger, TraceRecordsEveryEvent) {
  Ledger ledger(test_options());
  ledger.on_event(sized(EventKind::kSegmentCreate, 4096));
  ledger.on_event(alloc({.address = 0x42, .size = 512, .requested = 100, .stream = 3, .tag = 2}));
  ASSERT_EQ(ledger.trace().size(), 2u);
  const TraceRecord& record = ledger.trace()[1];
  EXPECT_EQ(record.kind, EventKind::kAlloc);
  EXPECT_EQ(record.address, 0x42u);
  EXPECT_EQ(record.size, 512u);
  EXPECT_EQ(record.requested, 100u);
  EXPECT_EQ(record.stream, 3u);
  EXPECT_EQ(record.tag, 2);
  EXPECT_EQ(record.pool, PoolKind::kSmall);
  EXPECT_LE(ledger.trace()[0].time_ticks, record.time_ticks);
}

TEST(Ledger, FreeCompletedInTheSameCallSharesTheFreeTimestamp) {
  Ledger ledger(test_options());
  const BlockEvent block{.address = 0x40, .size = 512, .requested = 512};
  ledger.on_event(alloc(block));
  ledger.on_event(free_requested(block));
  ledger.on_event(free_completed(block));
  ASSERT_EQ(ledger.trace().size(), 3u);
  EXPECT_EQ(ledger.trace()[2].time_ticks, ledger.trace()[1].time_ticks);
}

TEST(Ledger, ClockSourcesGiveOrderedTimesOrNone) {
  for (const ClockSource clock : {ClockSource::kCycleCounter, ClockSource::kCoarseMonotonic}) {
    LedgerOptions options = test_options();
    options.clock = clock;
    Ledger ledger(options);
    for (int i = 0; i < 100; ++i) ledger.on_event(sized(EventKind::kAllocRetry, 1));
    EXPECT_GT(ledger.trace()[0].time_ticks, 0u);
    for (std::size_t i = 1; i < ledger.trace().size(); ++i) {
      EXPECT_LE(ledger.trace()[i - 1].time_ticks, ledger.trace()[i].time_ticks);
    }
    EXPECT_GT(ticks_per_second(clock), 0u);
  }
  LedgerOptions options = test_options();
  options.clock = ClockSource::kNone;
  Ledger ledger(options);
  ledger.on_event(sized(EventKind::kAllocRetry, 1));
  EXPECT_EQ(ledger.trace()[0].time_ticks, 0u);
  EXPECT_EQ(ticks_per_second(ClockSource::kNone), 0u);
}

TEST(Ledger, ReplayingTheTraceReproducesTheCounters) {
  Ledger ledger(test_options());
  ledger.on_event(sized(EventKind::kSegmentCreate, 1 << 20, PoolKind::kSmall));
  ledger.on_event(sized(EventKind::kPhysicalCreate, 4 << 20));
  ledger.on_event(sized(EventKind::kMap, 4 << 20));
  for (int i = 0; i < 50; ++i) {
    const BlockEvent block{.address = 0x1000u * static_cast<unsigned>(i), .size = 512u * static_cast<unsigned>(i + 1),
                           .requested = 500u * static_cast<unsigned>(i + 1), .stream = static_cast<StreamHandle>(i % 3),
                           .tag = static_cast<TagId>(i % 4), .pool = i % 2 ? PoolKind::kSmall : PoolKind::kLarge};
    ledger.on_event(alloc(block));
    if (i % 3 != 0) ledger.on_event(free_requested(block));
    if (i % 3 == 1) ledger.on_event(free_completed(block));
  }
  ledger.on_event(sized(EventKind::kInactiveSplitAdd, 4096, PoolKind::kSmall));

  Ledger replayed(test_options());
  for (const TraceRecord& record : ledger.trace()) replayed.on_event(to_event(record));
  EXPECT_EQ(replayed.counters(), ledger.counters());
  EXPECT_EQ(replayed.per_tag().size(), ledger.per_tag().size());
  for (TagId tag = 0; tag < 4; ++tag) EXPECT_EQ(replayed.tag_usage(tag), ledger.tag_usage(tag));
}

}  // namespace
}  // namespace vramledger
