// The trace's batches written outside the ledger's lock (EventTrace::reserve, docs/design.md 5.2):
// threads fold their shards at once, each copying its batch into slots reserved in the trace's
// order. Suite 'concurrent', so CI also runs it under ThreadSanitizer: a slot written by two
// threads, or read before its fill, is a race there and a wrong record here.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <thread>
#include <vector>

#include "accounting/ledger.hpp"
#include "accounting/trace_record.hpp"
#include "tests/stress/ledger_replay_check.hpp"
#include "tests/stress/stress_env.hpp"

namespace vramledger::stress {
namespace {

constexpr int kThreads = 8;

// Each thread's blocks: its number in the high bits, the pair's number below.
DevicePtr address_of(int thread, std::uint64_t pair) {
  return (static_cast<DevicePtr>(thread + 1) << 40) | (pair << 8);
}

AllocatorEvent block_event(EventKind kind, int thread, std::uint64_t pair) {
  AllocatorEvent event{kind};
  event.pool = PoolKind::kSmall;
  event.stream = static_cast<StreamHandle>(100 + thread);
  event.address = address_of(thread, pair);
  event.size = 512;
  event.requested = 500;
  return event;
}

// Allocate + free pairs through one front shard per thread, as a front cache reports them; a
// reader thread meanwhile reads every record the trace holds (Ledger::with_trace), as a report
// made during a run does: under TSan a record read while a thread hands its batch over is a race.
void run_pairs(Ledger& ledger, std::uint64_t pairs, bool with_reader) {
  // Shards opened first: a reader that finds none assumes one thread feeds the ledger and reads
  // without its lock (Ledger::ReadGuard).
  std::vector<ObserverShard*> shards;
  for (int t = 0; t < kThreads; ++t) shards.push_back(ledger.open_shard());
  std::atomic<bool> done{false};
  std::thread reader([&ledger, &done, with_reader] {
    while (with_reader && !done.load()) {
      ledger.with_trace([](const EventTrace& trace) {
        std::uint64_t sum = 0;
        for (const TraceRecord& record : trace) sum += record.address;
        EXPECT_LE(trace.size(), trace.capacity()) << sum;
      });
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // the writers run meanwhile
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([shard = shards[t], pairs, t] {
      for (std::uint64_t pair = 0; pair < pairs; ++pair) {
        for (EventKind kind : {EventKind::kAlloc, EventKind::kFree}) {
          const AllocatorEvent event = block_event(kind, t, pair);
          shard->mutex().lock();
          const bool applied = shard->try_apply(event);
          shard->mutex().unlock();
          if (!applied) shard->apply_slow(event);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  done.store(true);
  reader.join();
  for (ObserverShard* shard : shards) ledger.close_shard(shard);
}

LedgerOptions options_with_trace(std::size_t capacity) {
  LedgerOptions options;
  options.trace_capacity = capacity;
  options.abort_on_inconsistency = false;
  return options;
}

// A ring of a few batches wraps all the time, so writes keep reaching slots whose fill may not
// have run (the wait in EventTrace): every record held must still be the one its place in the
// order says. The ring holds the newest records of the whole stream, so each thread's held
// records are the last of its own, consecutive, alloc before free.
TEST(TraceFillsConcurrent, ASmallRingHoldsExactlyTheNewestRecords) {
  const std::uint64_t pairs = env_u64("VRAMLEDGER_TRACE_FILL_PAIRS", 20'000);
  Ledger ledger(options_with_trace(3 * 128 + 17));
  run_pairs(ledger, pairs, /*with_reader=*/true);
  const EventTrace& trace = ledger.trace();
  ASSERT_EQ(trace.appended(), kThreads * pairs * 2);
  ASSERT_EQ(trace.size(), trace.capacity());
  std::map<int, std::vector<std::uint64_t>> order_by_thread;  // 2 * pair + (free ? 1 : 0)
  for (const TraceRecord& record : trace) {
    const int thread = static_cast<int>(record.address >> 40) - 1;
    ASSERT_GE(thread, 0);
    ASSERT_LT(thread, kThreads);
    const std::uint64_t pair = (record.address & ((DevicePtr{1} << 40) - 1)) >> 8;
    ASSERT_EQ(record.stream, static_cast<std::uint64_t>(100 + thread));
    order_by_thread[thread].push_back(2 * pair + (record.kind == EventKind::kFree ? 1 : 0));
  }
  for (const auto& [thread, order] : order_by_thread) {
    SCOPED_TRACE(thread);
    for (std::size_t i = 0; i < order.size(); ++i) {
      ASSERT_EQ(order[i], 2 * pairs - order.size() + i) << "record " << i << " of the thread's";
    }
  }
  EXPECT_EQ(ledger.counters().aggregate().allocation.current, 0);
}

// A ring large enough for every record: the trace replays to the same counters and peaks.
TEST(TraceFillsConcurrent, ALargeRingReplaysToTheSameCounters) {
  const std::uint64_t pairs = env_u64("VRAMLEDGER_TRACE_FILL_PAIRS", 20'000);
  Ledger ledger(options_with_trace(kThreads * pairs * 2));
  run_pairs(ledger, pairs, /*with_reader=*/false);
  ASSERT_EQ(ledger.trace().dropped(), 0u);
  expect_replay_agrees(ledger);
  const LedgerCounters counters = ledger.counters();
  EXPECT_EQ(counters.aggregate().allocation.allocated, static_cast<std::int64_t>(kThreads * pairs));
  EXPECT_GE(counters.aggregate().allocation.peak, 1);
  EXPECT_LE(counters.aggregate().allocation.peak, kThreads);
}

}  // namespace
}  // namespace vramledger::stress
