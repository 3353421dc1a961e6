#include "accounting/event_trace.hpp"

#include <gtest/gtest.h>

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
