#include "accounting/event_trace.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace vramledger {
namespace {

AllocatorEvent numbered_event(std::uint64_t number) {
  AllocatorEvent event{EventKind::kAlloc};
  event.address = number;
  event.size = number * 2;
  return event;
}

std::vector<std::uint64_t> addresses(const EventTrace& trace) {
  std::vector<std::uint64_t> result;
  for (const TraceRecord& record : trace) result.push_back(record.address);
  return result;
}

TEST(EventTrace, KeepsEverythingBelowCapacity) {
  EventTrace trace(4);
  for (std::uint64_t i = 0; i < 3; ++i) trace.append(numbered_event(i), 100 + i);
  EXPECT_EQ(trace.size(), 3u);
  EXPECT_EQ(trace.dropped(), 0u);
  EXPECT_EQ(trace.first_sequence(), 0u);
  EXPECT_EQ(addresses(trace), (std::vector<std::uint64_t>{0, 1, 2}));
  EXPECT_EQ(trace[2].time_ticks, 102u);
  EXPECT_EQ(trace[2].size, 4u);
}

TEST(EventTrace, WrapsAndCountsDrops) {
  EventTrace trace(4);
  for (std::uint64_t i = 0; i < 11; ++i) trace.append(numbered_event(i), i);
  EXPECT_EQ(trace.capacity(), 4u);
  EXPECT_EQ(trace.size(), 4u);
  EXPECT_EQ(trace.appended(), 11u);
  EXPECT_EQ(trace.dropped(), 7u);
  EXPECT_EQ(trace.first_sequence(), 7u);
  EXPECT_EQ(addresses(trace), (std::vector<std::uint64_t>{7, 8, 9, 10}));
  EXPECT_EQ(trace.to_vector().size(), 4u);
  EXPECT_EQ(trace.to_vector().front().address, 7u);
}

TEST(EventTrace, WrapsExactlyAtCapacity) {
  EventTrace trace(4);
  for (std::uint64_t i = 0; i < 4; ++i) trace.append(numbered_event(i), i);
  EXPECT_EQ(trace.dropped(), 0u);
  EXPECT_EQ(addresses(trace), (std::vector<std::uint64_t>{0, 1, 2, 3}));
  trace.append(numbered_event(4), 4);
  EXPECT_EQ(trace.dropped(), 1u);
  EXPECT_EQ(addresses(trace), (std::vector<std::uint64_t>{1, 2, 3, 4}));
}

// A ledger shard's staged records arrive in blocks (EventTrace::append_records): the ring must
// end up as if each had been appended alone, whatever the block sizes and wherever they wrap.
TEST(EventTrace, BlocksOfRecordsMatchAppendingOneByOne) {
  for (const std::size_t capacity : std::vector<std::size_t>{0, 1, 4, 7}) {
    EventTrace one_by_one(capacity);
    EventTrace in_blocks(capacity);
    std::uint64_t next = 0;
    for (const std::size_t block : {0, 1, 3, 5, 9, 2, 4, 16, 1}) {
      std::vector<TraceRecord> records;
      for (std::size_t i = 0; i < block; ++i, ++next) {
        one_by_one.append(numbered_event(next), 1000 + next);
        records.push_back(make_trace_record(numbered_event(next), 1000 + next));
      }
      in_blocks.append_records(records.data(), records.size());
      ASSERT_EQ(in_blocks.appended(), one_by_one.appended()) << "capacity " << capacity;
      ASSERT_EQ(in_blocks.to_vector(), one_by_one.to_vector())
          << "capacity " << capacity << ", after a block of " << block;
    }
  }
}

std::vector<TraceRecord> numbered_records(std::uint64_t first, std::size_t count) {
  std::vector<TraceRecord> records;
  for (std::uint64_t i = first; i < first + count; ++i) {
    records.push_back(make_trace_record(numbered_event(i), 1000 + i));
  }
  return records;
}

// A shard's batch takes its place in the order when reserved and is written later, outside the
// ledger's lock (EventTrace::reserve): several reservations in flight, filled in any order, with
// appends between them, must leave the ring as if every record had been appended alone, wherever
// the ring wraps.
TEST(EventTrace, ReservedBatchesFilledLaterMatchAppendingOneByOne) {
  for (const std::size_t capacity : std::vector<std::size_t>{5, 8, 13}) {
    for (std::size_t offset = 0; offset < capacity; ++offset) {
      EventTrace one_by_one(capacity);
      EventTrace reserved(capacity);
      std::uint64_t next = 0;
      const auto append_both = [&](std::size_t count) {
        for (std::size_t i = 0; i < count; ++i, ++next) {
          one_by_one.append(numbered_event(next), 1000 + next);
          reserved.append(numbered_event(next), 1000 + next);
        }
      };
      append_both(offset);  // where the ring's next slot starts
      // Two batches in flight and an append after them: together no more than the capacity,
      // so nothing written while they are in flight reaches their slots.
      const std::size_t first_batch = (capacity + 1) / 2;
      const std::size_t second_batch = capacity - first_batch - 1;
      const std::vector<TraceRecord> first = numbered_records(next, first_batch);
      ASSERT_TRUE(reserved.can_reserve(first_batch));
      EventTrace::Reservation first_slots = reserved.reserve(first_batch);
      for (const TraceRecord& record : first) one_by_one.append(to_event(record), record.time_ticks);
      next += first_batch;
      const std::vector<TraceRecord> second = numbered_records(next, second_batch);
      EventTrace::Reservation second_slots = reserved.reserve(second_batch);
      for (const TraceRecord& record : second) one_by_one.append(to_event(record), record.time_ticks);
      next += second_batch;
      append_both(1);
      EventTrace::fill(second_slots, second.data());
      EventTrace::fill(first_slots, first.data());
      EXPECT_TRUE(first_slots.empty());
      ASSERT_EQ(reserved.appended(), one_by_one.appended());
      ASSERT_EQ(reserved.to_vector(), one_by_one.to_vector())
          << "capacity " << capacity << ", offset " << offset;
      append_both(capacity + 3);  // and the ring goes on past them as before
      ASSERT_EQ(reserved.to_vector(), one_by_one.to_vector())
          << "capacity " << capacity << ", offset " << offset;
    }
  }
}

TEST(EventTrace, OnlyBatchesThatFitTheRingAreReserved) {
  EventTrace trace(4);
  EXPECT_FALSE(trace.can_reserve(0));
  EXPECT_TRUE(trace.can_reserve(4));
  EXPECT_FALSE(trace.can_reserve(5));
  EXPECT_FALSE(EventTrace(0).can_reserve(1));
}

// A thread preempted between its reservation and its fill must not have its slots overwritten
// by records that came after: a write reaching them waits until the fill is done.
TEST(EventTrace, AWriteReachingAnUnfilledReservationWaitsForIt) {
  EventTrace trace(4);
  const std::vector<TraceRecord> batch = numbered_records(0, 2);
  EventTrace::Reservation slots = trace.reserve(2);  // sequences 0 and 1
  trace.append(numbered_event(2), 1002);  // slots free of it: no wait
  trace.append(numbered_event(3), 1003);
  std::atomic<bool> appended{false};
  std::thread later([&] {
    trace.append(numbered_event(4), 1004);  // overwrites sequence 0's slot
    appended.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(appended.load()) << "the append overwrote a slot whose fill had not run";
  EventTrace::fill(slots, batch.data());
  later.join();
  EXPECT_TRUE(appended.load());
  EXPECT_EQ(addresses(trace), (std::vector<std::uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(trace.dropped(), 1u);
}

TEST(EventTrace, ZeroCapacityDropsEverything) {
  EventTrace trace(0);
  for (std::uint64_t i = 0; i < 5; ++i) trace.append(numbered_event(i), i);
  EXPECT_EQ(trace.size(), 0u);
  EXPECT_EQ(trace.dropped(), 5u);
  EXPECT_EQ(trace.begin(), trace.end());
}

TEST(EventTrace, ClearForgetsRecordsAndDrops) {
  EventTrace trace(2);
  for (std::uint64_t i = 0; i < 5; ++i) trace.append(numbered_event(i), i);
  trace.clear();
  EXPECT_EQ(trace.size(), 0u);
  EXPECT_EQ(trace.dropped(), 0u);
  trace.append(numbered_event(9), 9);
  EXPECT_EQ(addresses(trace), (std::vector<std::uint64_t>{9}));
}

TEST(EventTrace, DefaultCapacityIsAMillionRecords) {
  EventTrace trace;
  EXPECT_EQ(trace.capacity(), std::size_t{1} << 20);
}

TEST(EventTrace, ImpossibleCapacityIsRefused) {
  EXPECT_THROW(EventTrace(~std::size_t{0}), Error);
}

}  // namespace
}  // namespace vramledger
