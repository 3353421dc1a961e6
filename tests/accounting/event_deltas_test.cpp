// The compact forms of the event stream: kFree (request and completion in one event) and
// inactive split changes carried on the event that caused them.
#include <gtest/gtest.h>

#include "accounting/ledger.hpp"
#include "event_builders.hpp"

namespace vramledger {
namespace {

using testing::BlockEvent;

TEST(EventDeltas, FreeEqualsRequestPlusCompletion) {
  const BlockEvent block{.size = 4096, .requested = 4000, .stream = 7, .tag = 3};
  Ledger split_ledger;
  split_ledger.on_event(testing::alloc(block));
  split_ledger.on_event(testing::free_requested(block));
  split_ledger.on_event(testing::free_completed(block));
  Ledger combined_ledger;
  combined_ledger.on_event(testing::alloc(block));
  combined_ledger.on_event(testing::block_event(EventKind::kFree, block));
  LedgerCounters split = split_ledger.counters();
  LedgerCounters combined = combined_ledger.counters();
  split.events = combined.events = 0;  // two events against three
  EXPECT_EQ(split.pools, combined.pools);
  EXPECT_EQ(combined_ledger.tag_usage(3).active_bytes.current, 0);
  EXPECT_EQ(combined_ledger.tag_usage(3).allocated_bytes.peak, 4096);
  EXPECT_FALSE(combined_ledger.inconsistent());
}

TEST(EventDeltas, SplitChangesTravelOnAnyEvent) {
  Ledger ledger;
  const BlockEvent block{.size = 1 << 20, .requested = 1 << 20, .pool = PoolKind::kLarge};
  AllocatorEvent event = testing::alloc(block);
  event.inactive_split_delta = 1;
  event.inactive_split_bytes_delta = 3 << 20;
  ledger.on_event(event);
  const PoolCounters large = ledger.counters().pools[stat_pool_index(PoolKind::kLarge)];
  EXPECT_EQ(large.inactive_split.current, 1);
  EXPECT_EQ(large.inactive_split_bytes.current, 3 << 20);
  EXPECT_EQ(ledger.counters().pools[stat_pool_index(StatPool::kAggregate)]
                .inactive_split_bytes.current, 3 << 20);

  AllocatorEvent free = testing::block_event(EventKind::kFree, block);
  free.inactive_split_delta = -1;
  free.inactive_split_bytes_delta = -(3 << 20);
  ledger.on_event(free);
  EXPECT_EQ(ledger.counters().pools[stat_pool_index(PoolKind::kLarge)].inactive_split_bytes.current,
            0);
  EXPECT_EQ(ledger.counters().pools[stat_pool_index(PoolKind::kLarge)].inactive_split_bytes.peak,
            3 << 20);
  EXPECT_FALSE(ledger.inconsistent());
}

TEST(EventDeltas, NegativeSplitFromADeltaIsReported) {
  LedgerOptions options;
  options.abort_on_inconsistency = false;
  Ledger ledger(options);
  AllocatorEvent event = testing::sized(EventKind::kMap, 2 << 20);
  event.inactive_split_bytes_delta = -512;
  ledger.on_event(event);
  EXPECT_TRUE(ledger.inconsistent());
}

}  // namespace
}  // namespace vramledger
