// The ledger's shards alone (accounting/ledger_shard.hpp), fed by hand as front caches would: the
// fast path needs a stream share and credit, the slow path grants it, peaks of sums over shards
// stay exact, queries fold, reset_peaks and close_shard take credit back.
#include <gtest/gtest.h>

#include <thread>

#include "accounting/ledger.hpp"
#include "accounting/trace_record.hpp"
#include "allocator/biased_mutex.hpp"
#include "tests/accounting/event_builders.hpp"

namespace vramledger {
namespace {

using testing::BlockEvent;

constexpr std::size_t kKiB = 1024;

AllocatorEvent front_event(EventKind kind, DevicePtr address, std::size_t size,
                           StreamHandle stream = 7) {
  BlockEvent block;
  block.address = address;
  block.size = size;
  block.requested = size;
  block.stream = stream;
  return testing::block_event(kind, block);
}

// try_apply under the shard's mutex, else the slow path, as the front cache does.
void report(ObserverShard& shard, const AllocatorEvent& event) {
  shard.mutex().lock();
  const bool applied = shard.try_apply(event);
  shard.mutex().unlock();
  if (!applied) shard.apply_slow(event);
}

bool fast(ObserverShard& shard, const AllocatorEvent& event) {
  shard.mutex().lock();
  const bool applied = shard.try_apply(event);
  shard.mutex().unlock();
  return applied;
}

LedgerOptions quiet() {
  LedgerOptions options;
  options.abort_on_inconsistency = false;
  return options;
}

// The ledger's trace, replayed into a fresh ledger, gives every counter and peak again.
void expect_trace_replays_to_the_same_counters(Ledger& ledger) {
  LedgerOptions options = quiet();
  options.trace_capacity = 0;
  Ledger replay(options);
  for (const TraceRecord& record : ledger.trace()) replay.on_event(to_event(record));
  EXPECT_EQ(replay.counters(), ledger.counters());
}

TEST(LedgerShard, FirstRaiseTakesTheSlowPathThenFreesBecomeCredit) {
  Ledger ledger(quiet());
  ObserverShard* shard = ledger.open_shard();
  ASSERT_NE(shard, nullptr);
  const AllocatorEvent a = front_event(EventKind::kAlloc, 0x1000, 4 * kKiB);
  EXPECT_FALSE(fast(*shard, a));  // no stream share, no credit: nothing changes
  EXPECT_EQ(ledger.counters().aggregate().allocation.current, 0);
  shard->apply_slow(a);
  EXPECT_EQ(ledger.counters().aggregate().allocated_bytes.peak, static_cast<std::int64_t>(4 * kKiB));
  EXPECT_TRUE(fast(*shard, front_event(EventKind::kFree, 0x1000, 4 * kKiB)));
  EXPECT_TRUE(fast(*shard, a));  // the free's credit covers the same size again
  EXPECT_FALSE(fast(*shard, front_event(EventKind::kAlloc, 0x2000, 4 * kKiB)));  // a new peak
  const LedgerCounters counters = ledger.counters();
  EXPECT_EQ(counters.aggregate().allocation.current, 1);
  EXPECT_EQ(counters.aggregate().allocation.peak, 1);
  EXPECT_EQ(counters.aggregate().allocated_bytes.allocated, static_cast<std::int64_t>(8 * kKiB));
  EXPECT_EQ(counters.events, 3u);  // the refused raise was never counted
  ledger.close_shard(shard);
}

// Two shards whose sum reaches a new peak only together: the peak is the sum at that instant,
// not either shard's own high-water mark, and never more.
TEST(LedgerShard, PeakOfTheSumOverShardsIsExact) {
  Ledger ledger(quiet());
  ObserverShard* one = ledger.open_shard();
  ObserverShard* two = ledger.open_shard();
  // Warm both: each allocates and frees 8 KiB on its own (the sum peaks at 8 KiB once).
  report(*one, front_event(EventKind::kAlloc, 0x10000, 8 * kKiB, 1));
  report(*one, front_event(EventKind::kFree, 0x10000, 8 * kKiB, 1));
  report(*two, front_event(EventKind::kAlloc, 0x20000, 8 * kKiB, 2));
  report(*two, front_event(EventKind::kFree, 0x20000, 8 * kKiB, 2));
  EXPECT_EQ(ledger.counters().aggregate().allocated_bytes.peak, static_cast<std::int64_t>(8 * kKiB));
  // Both hold credit for 8 KiB; together they reach 16 KiB.
  report(*one, front_event(EventKind::kAlloc, 0x10000, 8 * kKiB, 1));
  report(*two, front_event(EventKind::kAlloc, 0x20000, 8 * kKiB, 2));
  LedgerCounters counters = ledger.counters();
  EXPECT_EQ(counters.aggregate().allocated_bytes.current, static_cast<std::int64_t>(16 * kKiB));
  EXPECT_EQ(counters.aggregate().allocated_bytes.peak, static_cast<std::int64_t>(16 * kKiB));
  EXPECT_EQ(counters.pool(PoolKind::kSmall).allocation.peak, 2);
  for (const StreamUsage& entry : ledger.per_stream()) {
    EXPECT_EQ(entry.usage.allocated_bytes.peak, static_cast<std::int64_t>(8 * kKiB));
  }
  // Alternating frees and allocations stay below it.
  for (int i = 0; i < 100; ++i) {
    report(*one, front_event(EventKind::kFree, 0x10000, 8 * kKiB, 1));
    report(*two, front_event(EventKind::kFree, 0x20000, 8 * kKiB, 2));
    report(*two, front_event(EventKind::kAlloc, 0x20000, 8 * kKiB, 2));
    report(*one, front_event(EventKind::kAlloc, 0x10000, 8 * kKiB, 1));
  }
  counters = ledger.counters();
  EXPECT_EQ(counters.aggregate().allocated_bytes.peak, static_cast<std::int64_t>(16 * kKiB));
  // The ledger's own event on top: exactly 16 KiB + its size.
  ledger.on_event(front_event(EventKind::kAlloc, 0x30000, 2 * kKiB, 3));
  EXPECT_EQ(ledger.counters().aggregate().allocated_bytes.peak, static_cast<std::int64_t>(18 * kKiB));
  ledger.close_shard(one);
  ledger.close_shard(two);
  EXPECT_EQ(ledger.counters().aggregate().allocated_bytes.current, static_cast<std::int64_t>(18 * kKiB));
}

TEST(LedgerShard, ResetPeaksTakesCreditBackSoTheNextPeakIsExact) {
  Ledger ledger(quiet());
  ObserverShard* shard = ledger.open_shard();
  report(*shard, front_event(EventKind::kAlloc, 0x1000, 64 * kKiB));
  report(*shard, front_event(EventKind::kFree, 0x1000, 64 * kKiB));  // 64 KiB of credit
  ledger.reset_peaks();
  EXPECT_EQ(ledger.counters().aggregate().allocated_bytes.peak, 0);
  // Without the reset taking the credit back this would pass the new peak unseen.
  EXPECT_FALSE(fast(*shard, front_event(EventKind::kAlloc, 0x1000, 4 * kKiB)));
  report(*shard, front_event(EventKind::kAlloc, 0x1000, 4 * kKiB));
  EXPECT_EQ(ledger.counters().aggregate().allocated_bytes.peak, static_cast<std::int64_t>(4 * kKiB));
  ledger.close_shard(shard);
}

TEST(LedgerShard, TraceHoldsEveryEventOnceFolded) {
  Ledger ledger(quiet());
  ObserverShard* shard = ledger.open_shard();
  for (int i = 0; i < 1000; ++i) {  // more than a shard stages
    report(*shard, front_event(EventKind::kAlloc, 0x1000, 512));
    report(*shard, front_event(EventKind::kFree, 0x1000, 512));
  }
  EXPECT_EQ(ledger.trace().size(), 2000u);
  EXPECT_EQ(ledger.counters().events, 2000u);
  std::size_t allocs = 0;
  for (const TraceRecord& record : ledger.trace()) allocs += record.kind == EventKind::kAlloc;
  EXPECT_EQ(allocs, 1000u);
  ledger.close_shard(shard);
  EXPECT_FALSE(ledger.inconsistent());
}

// A stream shard's event as the per-stream fast path sends it: with its split changes.
AllocatorEvent split_event(EventKind kind, DevicePtr address, std::size_t size,
                           StreamHandle stream, std::int32_t split, std::int64_t split_bytes) {
  AllocatorEvent event = front_event(kind, address, size, stream);
  event.inactive_split_delta = split;
  event.inactive_split_bytes_delta = split_bytes;
  return event;
}

// Split changes on two streams' shards: raises need credit, decreases become credit, and the
// peak of the sum over both shards is the sum at the instant it was reached.
TEST(LedgerShard, StreamShardsCountSplitChangesWithExactPeaks) {
  Ledger ledger(quiet());
  ObserverShard* one = ledger.open_stream_shard();
  ObserverShard* two = ledger.open_stream_shard();
  const auto alloc_on = [](StreamHandle stream, DevicePtr address) {
    return split_event(EventKind::kAlloc, address, 4 * kKiB, stream, 1, 8 * kKiB);
  };
  const auto free_on = [](StreamHandle stream, DevicePtr address) {
    return split_event(EventKind::kFree, address, 4 * kKiB, stream, -1, -8 * kKiB);
  };
  report(*one, alloc_on(1, 0x10000));  // no share yet: the slow path, which grants credit
  EXPECT_TRUE(fast(*one, free_on(1, 0x10000)));  // a decrease becomes credit
  EXPECT_TRUE(fast(*one, alloc_on(1, 0x10000)));  // covered by that credit
  report(*two, alloc_on(2, 0x20000));  // together: a new peak, counted exactly
  LedgerCounters counters = ledger.counters();
  EXPECT_EQ(counters.aggregate().inactive_split.current, 2);
  EXPECT_EQ(counters.aggregate().inactive_split.peak, 2);
  EXPECT_EQ(counters.aggregate().inactive_split_bytes.peak, static_cast<std::int64_t>(16 * kKiB));
  EXPECT_EQ(counters.pool(PoolKind::kSmall).inactive_split.peak, 2);
  for (int i = 0; i < 100; ++i) {  // alternating frees and allocations stay below it
    report(*one, free_on(1, 0x10000));
    report(*two, free_on(2, 0x20000));
    report(*two, alloc_on(2, 0x20000));
    report(*one, alloc_on(1, 0x10000));
  }
  EXPECT_EQ(ledger.shard_tally().slow, 2u);  // the two first events; 402 on the fast path
  EXPECT_EQ(ledger.shard_tally().fast_with_splits, 402u);
  // A raise of the split by the ledger's own event (the allocator's lock) on top: exactly one
  // more, and the shards' staged records reach the trace before it.
  ledger.on_event(front_event(EventKind::kInactiveSplitAdd, 0x30000, 2 * kKiB, 3));
  counters = ledger.counters();
  EXPECT_EQ(counters.aggregate().inactive_split.peak, 3);
  EXPECT_EQ(counters.aggregate().inactive_split_bytes.peak, static_cast<std::int64_t>(18 * kKiB));
  EXPECT_EQ(ledger.trace().size(), 405u);
  EXPECT_EQ(ledger.trace()[404].address, 0x30000u);
  ledger.close_shard(one);
  ledger.close_shard(two);
  EXPECT_EQ(ledger.counters().aggregate().inactive_split.current, 3);
  EXPECT_FALSE(ledger.inconsistent());
}

// A split made on a stream's fast path and undone by the ledger's own event (the allocator's
// lock: a block of that stream taken by the locked path) reach the trace in that order.
TEST(LedgerShard, OwnEventsFollowTheStreamShardsRecords) {
  Ledger ledger(quiet());
  ObserverShard* shard = ledger.open_stream_shard();
  report(*shard, split_event(EventKind::kAlloc, 0x1000, 4 * kKiB, 1, 0, 0));
  report(*shard, split_event(EventKind::kFree, 0x1000, 4 * kKiB, 1, 1, 4 * kKiB));
  ASSERT_TRUE(fast(*shard, split_event(EventKind::kAlloc, 0x1000, 4 * kKiB, 1, -1, -4 * kKiB)));
  ASSERT_TRUE(fast(*shard, split_event(EventKind::kFree, 0x1000, 4 * kKiB, 1, 1, 4 * kKiB)));
  // Staged in the shard; the allocator's own allocation of the block follows it.
  ledger.on_event(split_event(EventKind::kAlloc, 0x1000, 4 * kKiB, 1, -1, -4 * kKiB));
  LedgerOptions options = quiet();
  options.trace_capacity = 0;
  Ledger replay(options);
  for (const TraceRecord& record : ledger.trace()) replay.on_event(to_event(record));
  EXPECT_FALSE(replay.inconsistent());
  EXPECT_FALSE(ledger.inconsistent());
  EXPECT_EQ(replay.counters(), ledger.counters());
  EXPECT_EQ(ledger.counters().aggregate().inactive_split.peak, 1);
  EXPECT_EQ(ledger.counters().aggregate().inactive_split.current, 0);
  ledger.close_shard(shard);
}

// Credit one stream's frees made, swept into the spare at another stream's slow path, pays the
// first stream's later raises below the peaks without the slow path; the peaks stay exact. (With
// fair shares fixed at each slow path, the second raise below took the slow path.)
TEST(LedgerShard, SpareCreditPaysRaisesBelowThePeakOnAnyStream) {
  Ledger ledger(quiet());
  ObserverShard* one = ledger.open_stream_shard();
  ObserverShard* two = ledger.open_stream_shard();
  constexpr std::size_t kBlock = 64 * kKiB;
  const auto on = [](EventKind kind, StreamHandle stream, DevicePtr address, std::size_t size) {
    return split_event(kind, address, size, stream, 0, 0);
  };
  for (DevicePtr b : {0x100000, 0x200000, 0x300000}) {
    report(*two, on(EventKind::kAlloc, 2, b, kBlock));  // each a new peak: the slow path
  }
  for (DevicePtr b : {0x100000, 0x200000, 0x300000}) {
    EXPECT_TRUE(fast(*two, on(EventKind::kFree, 2, b, kBlock)));
  }
  report(*one, on(EventKind::kAlloc, 1, 0x900000, 4 * kKiB));  // a new share: the slow path
  EXPECT_EQ(ledger.shard_tally().slow, 4u);
  EXPECT_TRUE(fast(*two, on(EventKind::kAlloc, 2, 0x100000, kBlock)));
  EXPECT_TRUE(fast(*two, on(EventKind::kAlloc, 2, 0x200000, kBlock)));
  EXPECT_EQ(ledger.shard_tally().slow, 4u);
  // Past the aggregate's peak (192 KiB): refused on the fast path, exact on the slow one.
  EXPECT_FALSE(fast(*two, on(EventKind::kAlloc, 2, 0x300000, kBlock)));
  report(*two, on(EventKind::kAlloc, 2, 0x300000, kBlock));
  const LedgerCounters counters = ledger.counters();
  EXPECT_EQ(counters.aggregate().allocated_bytes.current,
            static_cast<std::int64_t>(3 * kBlock + 4 * kKiB));
  EXPECT_EQ(counters.aggregate().allocated_bytes.peak,
            static_cast<std::int64_t>(3 * kBlock + 4 * kKiB));
  expect_trace_replays_to_the_same_counters(ledger);
  ledger.close_shard(one);
  ledger.close_shard(two);
  EXPECT_FALSE(ledger.inconsistent());
}

// Two lanes' tests: events of one stream, and three blocks that set the peaks on lane a.
constexpr std::size_t kBlock = 64 * kKiB;
constexpr StreamHandle kStream = 5;

AllocatorEvent on(EventKind kind, DevicePtr address, std::size_t size) {
  return split_event(kind, address, size, kStream, 0, 0);
}

void allocate_three_blocks(ObserverShard& lane) {
  for (DevicePtr b : {0x100000, 0x200000, 0x300000}) {
    report(lane, on(EventKind::kAlloc, b, kBlock));  // each a new peak: the slow path
  }
}

// Two stream shards of one stream (two lanes: threads contending on the stream got heaps of
// their own, allocator/detail/stream_lanes.cpp). The room below the stream's peaks goes to the
// stream's own spare at each slow path, so either lane's raises below the peak stay on its fast
// path; before, the slow path gave it all to the asking lane, and the other's next raise went
// slow in turn. Past the peak, the slow path, exact.
TEST(LedgerShard, LanesOfOneStreamShareItsRoomBelowThePeak) {
  Ledger ledger(quiet());
  ObserverShard* lane_a = ledger.open_stream_shard();
  ObserverShard* lane_b = ledger.open_stream_shard();
  allocate_three_blocks(*lane_a);
  for (DevicePtr b : {0x100000, 0x200000, 0x300000}) {
    EXPECT_TRUE(fast(*lane_a, on(EventKind::kFree, b, kBlock)));
  }
  report(*lane_b, on(EventKind::kAlloc, 0x900000, 4 * kKiB));  // a new share: the slow path
  EXPECT_EQ(ledger.shard_tally().slow, 4u);
  EXPECT_TRUE(fast(*lane_a, on(EventKind::kAlloc, 0x100000, kBlock)))
      << "lane a's raise below the stream's peak went to the slow path";
  EXPECT_TRUE(fast(*lane_b, on(EventKind::kAlloc, 0x200000, kBlock)));
  EXPECT_EQ(ledger.shard_tally().slow, 4u);
  // 4 KiB + 192 KiB would pass the stream's peak (192 KiB): refused here, exact on the slow path.
  EXPECT_FALSE(fast(*lane_a, on(EventKind::kAlloc, 0x300000, kBlock)));
  report(*lane_a, on(EventKind::kAlloc, 0x300000, kBlock));
  const auto peak = static_cast<std::int64_t>(3 * kBlock + 4 * kKiB);
  const LedgerCounters counters = ledger.counters();
  EXPECT_EQ(counters.aggregate().allocated_bytes.current, peak);
  EXPECT_EQ(counters.aggregate().allocated_bytes.peak, peak);
  bool seen = false;
  for (const StreamUsage& entry : ledger.per_stream()) {
    if (entry.stream != kStream) continue;
    seen = true;
    EXPECT_EQ(entry.usage.allocated_bytes.current, peak);
    EXPECT_EQ(entry.usage.allocated_bytes.peak, peak);
    EXPECT_EQ(entry.usage.allocation.peak, 4);
  }
  EXPECT_TRUE(seen);
  expect_trace_replays_to_the_same_counters(ledger);
  ledger.close_shard(lane_a);
  ledger.close_shard(lane_b);
  EXPECT_FALSE(ledger.inconsistent());
}

// Credit one lane's frees made, still in that lane's shard (the spares empty), pays the other
// lane's raise below the peak: gathered shard by shard (its records handed to the trace first),
// not through the exact path. A shard biased to another thread is passed over (taking it would
// revoke the bias), and the raise then takes the exact path, as before.
TEST(LedgerShard, ShortOfCreditAShardGathersOthersBeforeTheExactPath) {
  for (const bool biased_elsewhere : {false, true}) {
    SCOPED_TRACE(biased_elsewhere ? "lane a biased to another thread" : "no bias");
    if (biased_elsewhere && !BiasedMutex::biasing_available()) {
      GTEST_SKIP() << "this process cannot bias mutexes (no membarrier)";
    }
    Ledger ledger(quiet());
    ObserverShard* lane_a = ledger.open_stream_shard();
    ObserverShard* lane_b = ledger.open_stream_shard();
    allocate_three_blocks(*lane_a);  // no room left below the peaks
    report(*lane_b, on(EventKind::kAlloc, 0x900000, 4 * kKiB));  // a new peak and share
    for (DevicePtr b : {0x100000, 0x200000, 0x300000}) {
      EXPECT_TRUE(fast(*lane_a, on(EventKind::kFree, b, kBlock)));  // credit, in lane a only
    }
    const Ledger::ShardTally before = ledger.shard_tally();  // (a read revokes every bias)
    if (biased_elsewhere) {
      // Another thread takes lane a's mutex often enough to become its owner (and exits).
      std::thread([lane_a] {
        for (std::uint32_t i = 0; i <= BiasedMutex::kAutoBiasAfter; ++i) {
          lane_a->mutex().lock_auto();
          lane_a->mutex().unlock_auto();
        }
      }).join();
    }
    EXPECT_FALSE(fast(*lane_b, on(EventKind::kAlloc, 0x200000, kBlock)));  // its credit: none
    report(*lane_b, on(EventKind::kAlloc, 0x200000, kBlock));
    const Ledger::ShardTally after = ledger.shard_tally();
    EXPECT_EQ(after.gathered - before.gathered, biased_elsewhere ? 0u : 1u);
    EXPECT_EQ(after.slow - before.slow, biased_elsewhere ? 1u : 0u);
    const LedgerCounters counters = ledger.counters();
    EXPECT_EQ(counters.aggregate().allocated_bytes.current,
              static_cast<std::int64_t>(kBlock + 4 * kKiB));
    EXPECT_EQ(counters.aggregate().allocated_bytes.peak,
              static_cast<std::int64_t>(3 * kBlock + 4 * kKiB));
    // Lane a's frees reached the trace before lane b's raise they paid for.
    expect_trace_replays_to_the_same_counters(ledger);
    ledger.close_shard(lane_a);
    ledger.close_shard(lane_b);
    EXPECT_FALSE(ledger.inconsistent());
  }
}

// A front cache's shard never counts split changes itself (its events carry none; one that did
// would take the slow path).
TEST(LedgerShard, FrontShardsLeaveSplitChangesToTheSlowPath) {
  Ledger ledger(quiet());
  ObserverShard* shard = ledger.open_shard();
  report(*shard, front_event(EventKind::kAlloc, 0x1000, 4 * kKiB));
  report(*shard, front_event(EventKind::kFree, 0x1000, 4 * kKiB));
  EXPECT_FALSE(fast(*shard, split_event(EventKind::kAlloc, 0x1000, 4 * kKiB, 7, -1, -4 * kKiB)));
  EXPECT_TRUE(fast(*shard, front_event(EventKind::kAlloc, 0x1000, 4 * kKiB)));
  ledger.close_shard(shard);
}

// A shard whose staged records fill up hands them to the trace on its own (no fold: its counts
// stay in the shard, Ledger::hand_over_records_locked). Whatever reads the ledger then sees
// every event once: the event count, the shards' tally, the trace, and the counters its replay
// gives. Run with a trace of the default size and with one smaller than a batch.
TEST(LedgerShard, RecordsHandedOverAreCountedOnceEverywhere) {
  for (const std::size_t capacity : {EventTrace::kDefaultCapacity, std::size_t{100}}) {
    SCOPED_TRACE(capacity);
    LedgerOptions options = quiet();
    options.trace_capacity = capacity;
    Ledger ledger(options);
    ObserverShard* shard = ledger.open_shard();
    constexpr std::uint64_t kPairs = 1000;  // about 15 hand-overs of 128 records
    for (std::uint64_t i = 0; i < kPairs; ++i) {
      report(*shard, front_event(EventKind::kAlloc, 0x100000 + i * 0x1000, 4 * kKiB));
      report(*shard, front_event(EventKind::kFree, 0x100000 + i * 0x1000, 4 * kKiB));
    }
    const Ledger::ShardTally tally = ledger.shard_tally();
    EXPECT_EQ(ledger.counters().events, 2 * kPairs);
    EXPECT_EQ(tally.fast + tally.slow, 2 * kPairs);
    EXPECT_EQ(ledger.trace().appended(), 2 * kPairs);
    EXPECT_EQ(ledger.counters().aggregate().allocation.allocated, static_cast<std::int64_t>(kPairs));
    if (capacity >= 2 * kPairs) expect_trace_replays_to_the_same_counters(ledger);
    ledger.close_shard(shard);
    EXPECT_EQ(ledger.counters().events, 2 * kPairs);
  }
}

}  // namespace
}  // namespace vramledger
