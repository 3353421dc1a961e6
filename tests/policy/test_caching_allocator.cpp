// Unit tests of the policy layer over the simulated device, for both heap shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

enum class Heap { kSegment, kPaged };

std::string heap_name(const testing::TestParamInfo<Heap>& info) {
  return info.param == Heap::kPaged ? "paged" : "segment";
}

class CachingAllocatorTest : public testing::TestWithParam<Heap> {
 protected:
  explicit CachingAllocatorTest(std::size_t capacity = 8 * kGiB) : device_(device_options(capacity)) {}

  SimulatedDeviceOptions device_options(std::size_t capacity) const {
    SimulatedDeviceOptions options;
    options.capacity_bytes = capacity;
    options.supports_virtual_memory = GetParam() == Heap::kPaged;
    return options;
  }

  bool paged() const { return GetParam() == Heap::kPaged; }

  // The ledger must agree with a recount of the allocator's blocks at every instant.
  void expect_consistent() {
    const BlockCensus census = allocator_->census();
    const LedgerCounters counters = ledger_.counters();
    ASSERT_FALSE(ledger_.inconsistent()) << ledger_.first_inconsistency()->to_string();
    for (PoolKind pool : {PoolKind::kSmall, PoolKind::kLarge}) {
      const auto& c = census.pools[static_cast<int>(pool)];
      const PoolCounters& l = counters.pools[stat_pool_index(pool)];
      EXPECT_EQ(c.allocation, l.allocation.current);
      EXPECT_EQ(c.allocated_bytes, l.allocated_bytes.current);
      EXPECT_EQ(c.active, l.active.current);
      EXPECT_EQ(c.active_bytes, l.active_bytes.current);
      EXPECT_EQ(c.requested_bytes, l.requested_bytes.current);
      EXPECT_EQ(c.reserved_bytes, l.reserved_bytes.current);
      EXPECT_EQ(c.segment, l.segment.current);
      EXPECT_EQ(c.inactive_split, l.inactive_split.current);
      EXPECT_EQ(c.inactive_split_bytes, l.inactive_split_bytes.current);
      EXPECT_EQ(c.mapped_bytes, l.mapped_bytes.current);
      EXPECT_EQ(c.virtual_bytes, l.virtual_bytes.current);
    }
    // The device holds exactly what we say we reserved.
    EXPECT_EQ(device_.physical_bytes_in_use(),
              static_cast<std::size_t>(reserved(counters)));
  }

  static std::int64_t reserved(const LedgerCounters& counters) {
    return counters.pools[stat_pool_index(StatPool::kAggregate)].reserved_bytes.current;
  }
  std::int64_t reserved() const { return reserved(ledger_.counters()); }
  std::int64_t allocated() const {
    return ledger_.counters().pools[stat_pool_index(StatPool::kAggregate)].allocated_bytes.current;
  }

  void SetUp() override {
    allocator_ = std::make_unique<CachingAllocator>(device_, &ledger_, AllocatorOptions{});
  }

  SimulatedDevice device_;
  Ledger ledger_;
  std::unique_ptr<CachingAllocator> allocator_;
};

TEST_P(CachingAllocatorTest, RoundsAndPicksPools) {
  const DevicePtr small = allocator_->allocate(1, 0);
  const DevicePtr large = allocator_->allocate(3 * kMiB + 1, 0);
  const AllocationInfo s = allocator_->describe(small);
  const AllocationInfo l = allocator_->describe(large);
  EXPECT_EQ(s.size, 512u);
  EXPECT_EQ(s.requested, 1u);
  EXPECT_EQ(l.requested, 3 * kMiB + 1);
  EXPECT_EQ(l.size % 512, 0u);
  EXPECT_GE(l.size, 3 * kMiB + 1);
  EXPECT_EQ(small % 512, 0u);
  EXPECT_EQ(large % 512, 0u);
  EXPECT_TRUE(device_.is_range_accessible(small, s.size));
  EXPECT_TRUE(device_.is_range_accessible(large, l.size));
  expect_consistent();
  allocator_->deallocate(small);
  allocator_->deallocate(large);
  expect_consistent();
}

TEST_P(CachingAllocatorTest, ReusesCachedBlocksWithoutDriverCalls) {
  const DevicePtr first = allocator_->allocate(5 * kMiB, 0);
  allocator_->deallocate(first);
  device_.reset_call_counts();
  const DevicePtr second = allocator_->allocate(5 * kMiB, 0);
  EXPECT_EQ(first, second);
  EXPECT_EQ(device_.total_call_count(), 0u);
  allocator_->deallocate(second);
  expect_consistent();
}

TEST_P(CachingAllocatorTest, SplitsAndMergesBlocks) {
  std::vector<DevicePtr> ptrs;
  for (int i = 0; i < 16; ++i) ptrs.push_back(allocator_->allocate(64 * 1024, 0));
  expect_consistent();
  // Free every other block, then the rest: neighbours must merge back into one free block.
  for (std::size_t i = 0; i < ptrs.size(); i += 2) allocator_->deallocate(ptrs[i]);
  expect_consistent();
  for (std::size_t i = 1; i < ptrs.size(); i += 2) allocator_->deallocate(ptrs[i]);
  expect_consistent();
  const BlockCensus census = allocator_->census();
  EXPECT_EQ(census.pools[0].active, 0);
  for (const SegmentInfo& segment : allocator_->segments()) {
    EXPECT_EQ(segment.blocks.size(), 1u) << "free neighbours were not merged";
  }
}

TEST_P(CachingAllocatorTest, BlocksNeverOverlapAndAreBacked) {
  std::mt19937_64 rng(7);
  std::vector<std::pair<DevicePtr, std::size_t>> live;
  for (int step = 0; step < 3000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const std::size_t bytes = std::size_t{512} << (rng() % 15);
      const std::size_t size = bytes + (rng() % bytes);
      const DevicePtr p = allocator_->allocate(size, 0);
      ASSERT_TRUE(device_.is_range_accessible(p, size));
      live.emplace_back(p, size);
    } else {
      const std::size_t i = rng() % live.size();
      allocator_->deallocate(live[i].first);
      live[i] = live.back();
      live.pop_back();
    }
  }
  std::sort(live.begin(), live.end());
  for (std::size_t i = 1; i < live.size(); ++i) {
    ASSERT_LE(live[i - 1].first + live[i - 1].second, live[i].first);
  }
  expect_consistent();
  for (auto& [p, size] : live) allocator_->deallocate(p);
  allocator_->empty_cache();
  expect_consistent();
  EXPECT_EQ(reserved(), 0);
  EXPECT_EQ(device_.physical_bytes_in_use(), 0u);
}

// adopt_pending_frees off: a block freed while another stream may still use it is reused only
// once the CPU has seen that stream's event complete (PyTorch's rule).
TEST_P(CachingAllocatorTest, CrossStreamFreeWaitsForTheOtherStream) {
  allocator_.reset();
  AllocatorOptions options;
  options.adopt_pending_frees = false;
  allocator_ = std::make_unique<CachingAllocator>(device_, &ledger_, options);
  const StreamHandle side = device_.create_stream();
  const DevicePtr p = allocator_->allocate(4 * kMiB, 0);
  allocator_->record_stream(p, side);
  ASSERT_TRUE(device_.pause_stream(side));
  allocator_->deallocate(p);
  expect_consistent();
  const PoolCounters agg = ledger_.counters().pools[stat_pool_index(StatPool::kAggregate)];
  EXPECT_EQ(agg.allocated_bytes.current, 0);
  EXPECT_GT(agg.active_bytes.current, 0);
  // While the side stream has not finished, the block must not be handed out again.
  const DevicePtr q = allocator_->allocate(4 * kMiB, 0);
  EXPECT_NE(p, q);
  EXPECT_THROW(allocator_->deallocate(p), Error);  // double free while pending
  ASSERT_TRUE(device_.resume_stream(side));
  allocator_->process_completed_frees();
  expect_consistent();
  EXPECT_EQ(ledger_.counters().pools[0].active_bytes.current,
            static_cast<std::int64_t>(allocator_->describe(q).size));
  const DevicePtr r = allocator_->allocate(4 * kMiB, 0);
  EXPECT_EQ(r, p) << "the block should be reusable once the side stream finished";
  allocator_->deallocate(q);
  allocator_->deallocate(r);
  expect_consistent();
}

// The default (adopt_pending_frees): rather than grow, the block's own stream takes it back at
// once, but only after a GPU-side wait on the other stream, so its new work is ordered after
// every use of the block — whatever the CPU has seen complete.
TEST_P(CachingAllocatorTest, CrossStreamFreeIsReusedOnlyAfterTheOtherStreamsWork) {
  // 24 MiB fills a segment of its own, so only the pending block could serve the next request.
  const StreamHandle side = device_.create_stream();
  const DevicePtr p = allocator_->allocate(24 * kMiB, 0);
  allocator_->record_stream(p, side);
  ASSERT_TRUE(device_.pause_stream(side));
  const EventHandle side_reads_p = device_.enqueue_user_work(side);
  allocator_->deallocate(p);
  EXPECT_THROW(allocator_->deallocate(p), Error);  // double free while pending
  const std::int64_t before = reserved();
  const DevicePtr q = allocator_->allocate(24 * kMiB, 0);
  EXPECT_EQ(q, p) << "the pending block should serve its own stream instead of new memory";
  EXPECT_EQ(reserved(), before);
  expect_consistent();
  const EventHandle main_writes_q = device_.enqueue_user_work(0);
  EXPECT_FALSE(device_.user_work_done(main_writes_q))
      << "new work on the block's stream must wait for the side stream's use";
  ASSERT_TRUE(device_.resume_stream(side));
  EXPECT_TRUE(device_.user_work_done(side_reads_p));
  EXPECT_TRUE(device_.user_work_done(main_writes_q));
  allocator_->deallocate(q);
  expect_consistent();
}

// Several blocks awaiting two streams each, adopted in one pass: a stream wait that cannot be
// queued leaves its block pending (all of a block's events, or none); the others are adopted.
TEST_P(CachingAllocatorTest, AdoptionTakesEveryBlockWhoseWaitsQueueAndLeavesTheRest) {
  const StreamHandle side_a = device_.create_stream();
  const StreamHandle side_b = device_.create_stream();
  ASSERT_TRUE(device_.pause_stream(side_a));
  ASSERT_TRUE(device_.pause_stream(side_b));
  std::vector<DevicePtr> blocks;
  for (int k = 0; k < 3; ++k) {
    const DevicePtr p = allocator_->allocate(24 * kMiB, 0);
    allocator_->record_stream(p, side_a);
    allocator_->record_stream(p, side_b);
    blocks.push_back(p);
  }
  device_.enqueue_user_work(side_a);
  device_.enqueue_user_work(side_b);
  for (DevicePtr p : blocks) allocator_->deallocate(p);  // six pending events
  // Waits in the order of the events: the fourth (the second block's second event) fails.
  device_.inject_failure_at(SimOp::kStreamWaitEvent, 4);
  const std::uint64_t waits_before = device_.call_count(SimOp::kStreamWaitEvent);
  const std::int64_t before = reserved();
  const DevicePtr q = allocator_->allocate(24 * kMiB, 0);
  EXPECT_TRUE(q == blocks[0] || q == blocks[2]) << "an adopted block serves the request";
  EXPECT_EQ(reserved(), before);
  EXPECT_EQ(device_.call_count(SimOp::kStreamWaitEvent) - waits_before, 6u);
  expect_consistent();
  // The other adopted block serves the next request without another wait; the one after that
  // adopts the second block, whose two waits now queue.
  const DevicePtr q2 = allocator_->allocate(24 * kMiB, 0);
  EXPECT_TRUE((q2 == blocks[0] || q2 == blocks[2]) && q2 != q);
  EXPECT_EQ(device_.call_count(SimOp::kStreamWaitEvent) - waits_before, 6u);
  const DevicePtr q3 = allocator_->allocate(24 * kMiB, 0);
  EXPECT_EQ(q3, blocks[1]) << "the block whose wait failed stayed pending until now";
  EXPECT_EQ(device_.call_count(SimOp::kStreamWaitEvent) - waits_before, 8u);
  EXPECT_EQ(reserved(), before);
  expect_consistent();
  ASSERT_TRUE(device_.resume_stream(side_a));
  ASSERT_TRUE(device_.resume_stream(side_b));
  for (DevicePtr p : {q, q2, q3}) allocator_->deallocate(p);
  allocator_->empty_cache();
  expect_consistent();
}

TEST_P(CachingAllocatorTest, StreamsDoNotShareFreeBlocks) {
  const StreamHandle other = device_.create_stream();
  const DevicePtr p = allocator_->allocate(1 * kMiB, 0);
  allocator_->deallocate(p);
  const DevicePtr q = allocator_->allocate(1 * kMiB, other);
  EXPECT_NE(p, q);
  EXPECT_EQ(allocator_->describe(q).stream, other);
  allocator_->deallocate(q);
  expect_consistent();
}

TEST_P(CachingAllocatorTest, RejectsBadInputWithStateIntact) {
  const DevicePtr p = allocator_->allocate(10 * kMiB, 0);
  const LedgerCounters before = ledger_.counters();
  auto expect_code = [&](auto&& action, ErrorCode code, const std::string& words) {
    try {
      action();
      ADD_FAILURE() << "no error";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), code) << error.what();
      EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
    }
    EXPECT_EQ(ledger_.counters(), before);
    expect_consistent();
  };
  expect_code([&] { allocator_->allocate(0, 0); }, ErrorCode::kInvalidArgument, "0 bytes");
  expect_code([&] { allocator_->allocate(SIZE_MAX, 0); }, ErrorCode::kInvalidArgument,
              "largest supported");
  expect_code([&] { allocator_->deallocate(0x1234000); }, ErrorCode::kInvalidPointer,
              "not allocated by vramledger");
  expect_code([&] { allocator_->deallocate(p + 512); }, ErrorCode::kInvalidPointer,
              "not its start");
  allocator_->deallocate(p);
  const LedgerCounters after_free = ledger_.counters();
  try {
    allocator_->deallocate(p);
    ADD_FAILURE() << "double free accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kDoubleFree) << error.what();
  }
  EXPECT_EQ(ledger_.counters(), after_free);
  expect_consistent();
}

TEST_P(CachingAllocatorTest, RequestLargerThanTheDeviceIsOutOfMemory) {
  const DevicePtr keep = allocator_->allocate(1 * kMiB, 0);
  try {
    allocator_->allocate(64 * kGiB, 0);
    ADD_FAILURE() << "allocation larger than the device succeeded";
  } catch (const OutOfMemoryError& error) {
    EXPECT_NE(std::string(error.what()).find("tried to allocate"), std::string::npos);
  }
  expect_consistent();
  EXPECT_EQ(ledger_.counters().num_ooms, 1);
  allocator_->deallocate(keep);
}

TEST_P(CachingAllocatorTest, CapIsHardAndRecoverable) {
  allocator_->set_cap(64 * kMiB);
  std::vector<DevicePtr> ptrs;
  try {
    for (int i = 0; i < 100; ++i) ptrs.push_back(allocator_->allocate(8 * kMiB, 0));
    ADD_FAILURE() << "cap not enforced";
  } catch (const OutOfMemoryError& error) {
    EXPECT_NE(std::string(error.what()).find("cap"), std::string::npos) << error.what();
  }
  EXPECT_LE(reserved(), 64 * static_cast<std::int64_t>(kMiB));
  EXPECT_GE(ptrs.size(), 6u);
  expect_consistent();
  for (DevicePtr p : ptrs) allocator_->deallocate(p);
  // After freeing, the same memory serves new requests under the cap.
  const DevicePtr p = allocator_->allocate(40 * kMiB, 0);
  EXPECT_LE(reserved(), 64 * static_cast<std::int64_t>(kMiB));
  allocator_->deallocate(p);
  expect_consistent();
}

TEST_P(CachingAllocatorTest, OutOfMemoryReleasesCacheAndRetries) {
  // Fill the device with cached blocks of one stream, then ask on another stream.
  const StreamHandle other = device_.create_stream();
  std::vector<DevicePtr> ptrs;
  for (int i = 0; i < 7; ++i) ptrs.push_back(allocator_->allocate(1 * kGiB, 0));
  for (DevicePtr p : ptrs) allocator_->deallocate(p);
  const DevicePtr big = allocator_->allocate(6 * kGiB, other);
  EXPECT_GE(ledger_.counters().num_alloc_retries, paged() ? 0 : 1);
  EXPECT_LE(reserved(), static_cast<std::int64_t>(8 * kGiB));
  allocator_->deallocate(big);
  expect_consistent();
}

TEST_P(CachingAllocatorTest, InjectedDriverFailuresLoseNothing) {
  const SimOp op = paged() ? SimOp::kMapPages : SimOp::kAllocateSegment;
  device_.inject_failure_at(op, 1);
  try {
    allocator_->allocate(30 * kMiB, 0);
    ADD_FAILURE() << "injected failure not reported";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kDriverError) << error.what();
    EXPECT_NE(std::string(error.what()).find("inject"), std::string::npos) << error.what();
  }
  expect_consistent();
  EXPECT_EQ(allocated(), 0);
  const DevicePtr p = allocator_->allocate(30 * kMiB, 0);
  EXPECT_TRUE(device_.is_range_accessible(p, 30 * kMiB));
  allocator_->deallocate(p);
  allocator_->empty_cache();
  expect_consistent();
  EXPECT_EQ(device_.physical_bytes_in_use(), 0u);
}

TEST_P(CachingAllocatorTest, InjectedOutOfMemoryIsRetried) {
  const SimOp op = paged() ? SimOp::kCreatePhysical : SimOp::kAllocateSegment;
  device_.inject_failure_at(op, 1, ErrorCode::kOutOfMemory);
  // Paged heap: 30 MiB = 15 pages are created as chunks of 1 page (an eighth of the run, rounded
  // down), so one refusal leaves nothing smaller to try and the allocation is retried.
  const DevicePtr p = allocator_->allocate(30 * kMiB, 0);
  EXPECT_EQ(ledger_.counters().num_alloc_retries, 1);
  allocator_->deallocate(p);
  expect_consistent();
}

TEST_P(CachingAllocatorTest, PagedHeapFallsBackToSmallerChunksWhenTheDeviceIsShort) {
  if (!paged()) GTEST_SKIP() << "chunks belong to the paged heap";
  // 64 MiB = 32 pages in chunks of 4; the first 4-page chunk is refused, 2 pages are not.
  device_.inject_failure_at(SimOp::kCreatePhysical, 1, ErrorCode::kOutOfMemory);
  const DevicePtr p = allocator_->allocate(64 * kMiB, 0);
  EXPECT_TRUE(device_.is_range_accessible(p, 64 * kMiB));
  EXPECT_EQ(ledger_.counters().num_alloc_retries, 0) << "a smaller chunk should have done";
  EXPECT_EQ(device_.physical_bytes_in_use(), 64 * kMiB);
  allocator_->deallocate(p);
  expect_consistent();
}

TEST_P(CachingAllocatorTest, PagedHeapMapsARunInFewChunks) {
  if (!paged()) GTEST_SKIP() << "chunks belong to the paged heap";
  // 64 MiB = 32 pages: chunks of an eighth of the run (4 pages) capped at map_chunk_mb's default
  // of 4 MiB (2 pages), so 16 creates and 16 maps, not 32.
  const DevicePtr p = allocator_->allocate(64 * kMiB, 0);
  EXPECT_EQ(device_.call_count(SimOp::kCreatePhysical), 16u);
  EXPECT_EQ(device_.call_count(SimOp::kMapPages), 16u);
  allocator_->deallocate(p);
  allocator_->empty_cache();
  EXPECT_EQ(device_.call_count(SimOp::kUnmapPages), 16u);
  EXPECT_EQ(device_.physical_bytes_in_use(), 0u);
  expect_consistent();
}

TEST_P(CachingAllocatorTest, PagedHeapMapsPageByPageWhenChunksAreOnePage) {
  if (!paged()) GTEST_SKIP() << "chunks belong to the paged heap";
  AllocatorOptions options;
  options.map_chunk_bytes = 2 * kMiB;
  CachingAllocator allocator(device_, nullptr, options);
  const DevicePtr p = allocator.allocate(64 * kMiB, 0);
  EXPECT_EQ(device_.call_count(SimOp::kCreatePhysical), 32u);
  EXPECT_TRUE(device_.is_range_accessible(p, 64 * kMiB));
  allocator.deallocate(p);
}

TEST_P(CachingAllocatorTest, AllocateAtRestoresABlockWhereItWas) {
  const DevicePtr a = allocator_->allocate(3 * kMiB, 0);
  const DevicePtr b = allocator_->allocate(5 * kMiB + 100, 0);
  const DevicePtr c = allocator_->allocate(3 * kMiB, 0);
  allocator_->deallocate(b);
  allocator_->empty_cache();  // the paged heap unmaps b's pages: allocate_at must map them again
  EXPECT_EQ(allocator_->allocate_at(b, 5 * kMiB + 100, 0), b);
  EXPECT_TRUE(device_.is_range_accessible(b, 5 * kMiB + 100));
  EXPECT_EQ(allocator_->describe(b).requested, 5 * kMiB + 100);
  expect_consistent();
  for (DevicePtr p : {a, b, c}) allocator_->deallocate(p);
  expect_consistent();
}

TEST_P(CachingAllocatorTest, AllocateAtCarvesTheMiddleOfAFreeBlock) {
  const DevicePtr big = allocator_->allocate(40 * kMiB, 0);
  allocator_->deallocate(big);
  const DevicePtr middle = big + 8 * kMiB + 512;
  EXPECT_EQ(allocator_->allocate_at(middle, 4 * kMiB, 0), middle);
  EXPECT_TRUE(device_.is_range_accessible(middle, 4 * kMiB));
  expect_consistent();
  // The bytes before and after stay free and usable.
  const DevicePtr before = allocator_->allocate_at(big, 8 * kMiB, 0);
  EXPECT_EQ(before, big);
  expect_consistent();
  allocator_->deallocate(before);
  allocator_->deallocate(middle);
  expect_consistent();
}

TEST_P(CachingAllocatorTest, AllocateAtRefusesBytesThatAreNotFree) {
  const DevicePtr a = allocator_->allocate(4 * kMiB, 0);
  auto expect_refused = [&](DevicePtr address, std::size_t bytes, StreamHandle stream,
                            const char* why) {
    try {
      allocator_->allocate_at(address, bytes, stream);
      ADD_FAILURE() << "allocate_at(" << address << ") was not refused";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
      EXPECT_NE(std::string(error.what()).find(why), std::string::npos) << error.what();
    }
  };
  expect_refused(a, 4 * kMiB, 0, "allocated");
  expect_refused(a + 1 * kMiB, 1 * kMiB + 1, 0, "allocated");
  expect_refused(a, 4 * kMiB, device_.create_stream(), "no range");
  expect_refused(0x1000, 4 * kMiB, 0, "no range");
  expect_consistent();
  allocator_->deallocate(a);
  expect_consistent();
}

TEST_P(CachingAllocatorTest, EmptyCacheReturnsEverything) {
  std::vector<DevicePtr> ptrs;
  for (int i = 0; i < 20; ++i) ptrs.push_back(allocator_->allocate((i + 1) * kMiB, 0));
  const DevicePtr kept = allocator_->allocate(300, 0);
  for (DevicePtr p : ptrs) allocator_->deallocate(p);
  allocator_->empty_cache();
  expect_consistent();
  EXPECT_EQ(reserved(), paged() ? static_cast<std::int64_t>(2 * kMiB)
                                : static_cast<std::int64_t>(2 * kMiB));
  allocator_->deallocate(kept);
  allocator_->empty_cache();
  EXPECT_EQ(reserved(), 0);
  EXPECT_EQ(device_.physical_bytes_in_use(), 0u);
}

TEST_P(CachingAllocatorTest, DestructionReturnsAllMemory) {
  const DevicePtr p = allocator_->allocate(7 * kMiB, 0);
  allocator_->deallocate(p);
  allocator_.reset();
  EXPECT_EQ(device_.physical_bytes_in_use(), 0u);
  EXPECT_EQ(device_.reserved_address_bytes(), 0u);
  EXPECT_EQ(device_.live_event_count(), 0u);
}

TEST_P(CachingAllocatorTest, FreeAfterItsStreamWasDestroyed) {
  const StreamHandle side = device_.create_stream();
  const DevicePtr p = allocator_->allocate(3 * kMiB, side);
  ASSERT_TRUE(device_.destroy_stream(side));
  allocator_->deallocate(p);  // no event is needed: the free itself is fine
  expect_consistent();
  allocator_->release_stream(side);
  expect_consistent();
  EXPECT_EQ(reserved(), 0);
}

TEST_P(CachingAllocatorTest, FreeWithUseOnDestroyedStreamIsRefusedUntilReleased) {
  const StreamHandle side = device_.create_stream();
  const DevicePtr p = allocator_->allocate(3 * kMiB, 0);
  allocator_->record_stream(p, side);
  ASSERT_TRUE(device_.destroy_stream(side));
  const LedgerCounters before = ledger_.counters();
  try {
    allocator_->deallocate(p);
    ADD_FAILURE() << "free with a use on a destroyed stream accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidStream) << error.what();
    EXPECT_NE(std::string(error.what()).find("release_stream"), std::string::npos);
  }
  EXPECT_EQ(ledger_.counters(), before);
  expect_consistent();
  allocator_->release_stream(side);
  allocator_->deallocate(p);
  expect_consistent();
}

INSTANTIATE_TEST_SUITE_P(Heaps, CachingAllocatorTest, testing::Values(Heap::kSegment, Heap::kPaged),
                         heap_name);

// --- Paged heap specifics ---------------------------------------------------------------

class PagedHeapTest : public testing::Test {
 protected:
  SimulatedDevice device_{SimulatedDeviceOptions{}};
  Ledger ledger_;
  CachingAllocator allocator_{device_, &ledger_, AllocatorOptions{}};

  std::int64_t reserved() const {
    return ledger_.counters().pools[stat_pool_index(StatPool::kAggregate)].reserved_bytes.current;
  }
};

TEST_F(PagedHeapTest, FreedPagesServeOtherStreamsWithoutNewMemory) {
  const StreamHandle other = device_.create_stream();
  const DevicePtr p = allocator_.allocate(64 * kMiB, 0);
  allocator_.deallocate(p);
  const std::int64_t before = reserved();
  const DevicePtr q = allocator_.allocate(64 * kMiB, other);
  EXPECT_EQ(reserved(), before) << "pages should move to the other stream's span";
  EXPECT_TRUE(device_.is_range_accessible(q, 64 * kMiB));
  allocator_.deallocate(q);
}

// The peak of active bytes that the cross-stream slack grows from is counted per stream's heaps
// with rooms (allocator/detail/active_bytes.cpp): whichever stream allocates, frees, or frees
// across streams, it is the exact peak of the sum — the ledger's peak of active bytes — and the
// census's checks of the rooms hold at every step. Random operations on four streams (the
// per-stream fast path runs: several streams, the ledger takes concurrent events).
TEST_F(PagedHeapTest, PeakOfActiveBytesIsExactWhateverStreamMovesIt) {
  std::vector<StreamHandle> streams = {0};
  for (int i = 0; i < 3; ++i) streams.push_back(device_.create_stream());
  std::mt19937_64 rng(0xac71e);
  std::uniform_real_distribution<double> exponent(9.0, 25.0);  // 512 B .. 32 MiB
  std::vector<DevicePtr> live;
  for (int step = 0; step < 4000; ++step) {
    const StreamHandle stream = streams[rng() % streams.size()];
    const bool grow = live.empty() || rng() % 100 < (step % 1000 < 500 ? 60 : 40);
    if (grow) {
      live.push_back(
          allocator_.allocate(static_cast<std::size_t>(std::exp2(exponent(rng))), stream));
    } else {
      const std::size_t i = rng() % live.size();
      if (rng() % 8 == 0) allocator_.record_stream(live[i], streams[rng() % streams.size()]);
      allocator_.deallocate(live[i]);
      live[i] = live.back();
      live.pop_back();
    }
    if (step % 50 == 0) {
      allocator_.process_completed_frees();
      const BlockCensus census = allocator_.census();  // throws if a room is off
      ASSERT_EQ(census.peak_active_bytes,
                ledger_.counters().aggregate().active_bytes.peak)
          << "step " << step;
    }
  }
  for (DevicePtr ptr : live) allocator_.deallocate(ptr);
  allocator_.process_completed_frees();
  EXPECT_EQ(allocator_.census().peak_active_bytes,
            ledger_.counters().aggregate().active_bytes.peak);
}

std::size_t mapped_bytes_of(const CachingAllocator& allocator, StreamHandle stream) {
  std::size_t mapped = 0;
  for (const SegmentInfo& segment : allocator.segments()) {
    if (segment.stream == stream) mapped += segment.mapped_bytes;
  }
  return mapped;
}

// Idle pages of the requesting stream go first: taking another stream's costs an unmap there
// and a map here, and streams that pass work to each other would trade pages at every step.
TEST_F(PagedHeapTest, OwnIdlePagesAreTakenBeforeAnotherStreams) {
  const DevicePtr keep = allocator_.allocate(2 * kMiB, 0);  // stream 0 is scanned first
  const StreamHandle side = device_.create_stream();
  const DevicePtr a1 = allocator_.allocate(64 * kMiB, side);
  const DevicePtr a2 = allocator_.allocate(64 * kMiB, side);
  const DevicePtr b1 = allocator_.allocate(64 * kMiB, 0);
  allocator_.deallocate(b1);  // 64 MiB idle on stream 0
  allocator_.deallocate(a1);  // a 64 MiB idle hole on the side stream
  const std::size_t stream0_mapped = mapped_bytes_of(allocator_, 0);
  const DevicePtr a3 = allocator_.allocate(66 * kMiB, side);  // not in the hole: 33 pages to map
  EXPECT_TRUE(device_.is_range_accessible(a3, 66 * kMiB));
  EXPECT_EQ(mapped_bytes_of(allocator_, 0), stream0_mapped)
      << "the side stream's own idle pages should have been taken, not stream 0's";
  for (DevicePtr p : {keep, a2, a3}) allocator_.deallocate(p);
}

// cross_stream_slack_permille: grow within the slack rather than take another stream's pages.
TEST(PagedHeapCrossStreamSlack, GrowsWithinTheSlackInsteadOfTakingAnotherStreamsPages) {
  for (const std::size_t slack : {std::size_t{0}, std::size_t{1000}}) {
    SCOPED_TRACE("slack " + std::to_string(slack) + " per mille");
    SimulatedDevice device{SimulatedDeviceOptions{}};
    Ledger ledger;
    AllocatorOptions options;
    options.cross_stream_slack_permille = slack;
    CachingAllocator allocator(device, &ledger, options);
    allocator.deallocate(allocator.allocate(64 * kMiB, 0));  // 64 MiB idle on stream 0
    const StreamHandle side = device.create_stream();
    const DevicePtr p = allocator.allocate(64 * kMiB, side);
    const auto reserved =
        ledger.counters().pools[stat_pool_index(StatPool::kAggregate)].reserved_bytes.current;
    if (slack == 0) {
      EXPECT_EQ(reserved, 64 * static_cast<std::int64_t>(kMiB)) << "stream 0's pages moved";
      EXPECT_EQ(mapped_bytes_of(allocator, 0), 0u);
    } else {
      // Peak active 64 MiB, slack 100%: 128 MiB may be held, so the side stream grows.
      EXPECT_EQ(reserved, 128 * static_cast<std::int64_t>(kMiB));
      EXPECT_EQ(mapped_bytes_of(allocator, 0), 64 * kMiB);
    }
    const BlockCensus census = allocator.census();
    EXPECT_TRUE(check_consistency(ledger, census).ok());
    allocator.deallocate(p);
  }
}

// cross_stream_cold_allocations: another stream's idle pages are taken only once that stream
// has served that many allocations without needing them, or has gone quiet; until then the
// requesting stream grows. Off (0), they are taken at once (slack 0 here: no growth first).
TEST(PagedHeapCrossStreamCold, AnotherStreamsIdlePagesAreTakenOnlyOnceCold) {
  for (const std::size_t cold : {std::size_t{0}, std::size_t{64}}) {
    SCOPED_TRACE("cross_stream_cold_allocations " + std::to_string(cold));
    SimulatedDevice device{SimulatedDeviceOptions{}};
    Ledger ledger;
    AllocatorOptions options;
    options.cross_stream_slack_permille = 0;
    options.cross_stream_cold_allocations = cold;
    options.cross_stream_cold_streams = 2;  // the rule with two streams (default: from three)
    CachingAllocator allocator(device, &ledger, options);
    const auto reserved = [&] {
      return ledger.counters().pools[stat_pool_index(StatPool::kAggregate)].reserved_bytes.current;
    };
    constexpr auto kMiB64 = static_cast<std::int64_t>(kMiB);
    const StreamHandle side = device.create_stream();
    allocator.deallocate(allocator.allocate(8 * kMiB, side));  // 8 MiB idle on the side stream
    const DevicePtr first = allocator.allocate(8 * kMiB, 0);
    if (cold == 0) {
      EXPECT_EQ(reserved(), 8 * kMiB64) << "the side stream's idle pages should have moved";
      EXPECT_EQ(mapped_bytes_of(allocator, side), 0u);
    } else {
      EXPECT_EQ(reserved(), 16 * kMiB64) << "pages idle for 1 of 64 allocations were taken";
      EXPECT_EQ(mapped_bytes_of(allocator, side), 8 * kMiB);
      // 64 more allocations on the side stream (small pool: its large idle pages stay idle).
      std::vector<DevicePtr> small;
      for (int i = 0; i < 64; ++i) small.push_back(allocator.allocate(512, side));
      const DevicePtr second = allocator.allocate(8 * kMiB, 0);
      EXPECT_EQ(reserved(), 16 * kMiB64 + 2 * kMiB64) << "cold pages should have moved, not grown";
      EXPECT_EQ(mapped_bytes_of(allocator, side), 2 * kMiB) << "the small pool's page stays";
      for (const DevicePtr p : small) allocator.deallocate(p);
      allocator.deallocate(second);
    }
    EXPECT_TRUE(check_consistency(ledger, allocator.census()).ok());
    allocator.deallocate(first);
  }
}

// A stream that allocates nothing more is quiet after 8 looks at other streams' pages: its idle
// pages, however recently freed, are taken then.
TEST(PagedHeapCrossStreamCold, AQuietStreamsIdlePagesAreTaken) {
  SimulatedDevice device{SimulatedDeviceOptions{}};
  Ledger ledger;
  AllocatorOptions options;
  options.cross_stream_slack_permille = 0;
  options.cross_stream_cold_allocations = 1024;
  options.cross_stream_cold_streams = 2;
  CachingAllocator allocator(device, &ledger, options);
  const StreamHandle side = device.create_stream();
  allocator.deallocate(allocator.allocate(8 * kMiB, side));
  std::vector<DevicePtr> live;
  // Each needs pages beyond stream 0's own and looks at the side stream's: hot for 8 looks.
  for (int look = 1; look <= 8; ++look) {
    live.push_back(allocator.allocate(2 * kMiB, 0));
    EXPECT_EQ(mapped_bytes_of(allocator, side), 8 * kMiB) << "look " << look;
  }
  live.push_back(allocator.allocate(8 * kMiB, 0));
  EXPECT_EQ(mapped_bytes_of(allocator, side), 0u) << "the quiet stream's pages should have moved";
  EXPECT_TRUE(check_consistency(ledger, allocator.census()).ok());
  for (const DevicePtr p : live) allocator.deallocate(p);
}

// By default the cold rule (1024 allocations) applies only while three streams or more allocate:
// two streams take each other's idle pages at once beyond the slack, as before the rule; once a
// third stream allocates between the looks, recently freed pages stay with their stream.
TEST(PagedHeapCrossStreamCold, TheDefaultRuleAppliesFromThreeAllocatingStreams) {
  for (const int streams : {2, 3}) {
    SCOPED_TRACE(std::to_string(streams) + " streams allocating");
    SimulatedDevice device{SimulatedDeviceOptions{}};
    Ledger ledger;
    AllocatorOptions options;
    ASSERT_EQ(options.cross_stream_cold_allocations, 1024u);
    ASSERT_EQ(options.cross_stream_cold_streams, 3u);
    options.cross_stream_slack_permille = 0;
    CachingAllocator allocator(device, &ledger, options);
    const StreamHandle side = device.create_stream();
    const StreamHandle third = device.create_stream();
    std::vector<DevicePtr> third_live;
    if (streams == 3) third_live.push_back(allocator.allocate(512, third));
    allocator.deallocate(allocator.allocate(8 * kMiB, side));  // 8 MiB idle on the side stream
    const DevicePtr p = allocator.allocate(8 * kMiB, 0);
    if (streams == 2) {
      EXPECT_EQ(mapped_bytes_of(allocator, side), 0u) << "two streams: pages taken at once";
    } else {
      EXPECT_EQ(mapped_bytes_of(allocator, side), 8 * kMiB)
          << "three streams allocating: the side stream's hot pages should have stayed";
    }
    const ConsistencyReport report = check_consistency(ledger, allocator.census());
    EXPECT_TRUE(report.ok()) << report.to_string();
    allocator.deallocate(p);
    for (const DevicePtr q : third_live) allocator.deallocate(q);
  }
}

// place_by_mapped_pages: an allocation of 8 pages or more that would need new pages at the front
// of a free block goes where the block's mapped pages are instead, and maps nothing; a smaller
// one stays at the front (it would leave partly used pages behind it). A live 1 GiB block keeps
// idle mapped memory under 3% of reserved, where the heap moves pages rather than reuse them in
// place (paged_heap_steady_state_test.cpp tests the other side).
TEST(PagedHeapPlacement, AllocationGoesWhereTheMappedPagesAre) {
  for (const bool place : {false, true}) {
    for (const std::size_t size : {16 * kMiB, 8 * kMiB}) {
      SCOPED_TRACE(std::string(place ? "placing by mapped pages" : "front of the best fit") +
                   ", " + std::to_string(size / kMiB) + " MiB");
      SimulatedDevice device(SimulatedDeviceOptions{});
      Ledger ledger;
      AllocatorOptions options;
      options.place_by_mapped_pages = place;
      CachingAllocator allocator(device, &ledger, options);
      const DevicePtr live = allocator.allocate(1024 * kMiB, 0);
      const DevicePtr base = allocator.allocate(2 * kMiB, 0);  // the page after it, mapped
      allocator.deallocate(base);
      const DevicePtr mapped_run = base + 32 * kMiB;
      allocator.deallocate(allocator.allocate_at(mapped_run, size, 0));
      const std::uint64_t maps = device.call_count(SimOp::kMapPages);
      const DevicePtr p = allocator.allocate(size, 0);
      if (place && size >= 16 * kMiB) {
        EXPECT_EQ(p, mapped_run);
        EXPECT_EQ(device.call_count(SimOp::kMapPages), maps) << "no page should need mapping";
      } else {
        EXPECT_EQ(p, base);
        EXPECT_GT(device.call_count(SimOp::kMapPages), maps);
      }
      EXPECT_TRUE(device.is_range_accessible(p, size));
      const ConsistencyReport report = check_consistency(ledger, allocator.census());
      EXPECT_TRUE(report.ok()) << report.to_string();
      allocator.deallocate(p);
      allocator.deallocate(live);
    }
  }
}

// With the device full, a need for one page is met from idle memory held in larger chunks: the
// chunk is unmapped, given back to the driver, and a chunk of the right size created.
TEST(PagedHeapUnderPressure, IdleChunksTooLargeForTheNeedAreExchangedForSmallerOnes) {
  SimulatedDeviceOptions options;
  options.capacity_bytes = 64 * kMiB;
  SimulatedDevice device(options);
  Ledger ledger;
  AllocatorOptions chunky;
  chunky.map_chunk_bytes = 16 * kMiB;  // chunks of up to 8 pages (the default is 2)
  CachingAllocator allocator(device, &ledger, chunky);
  const DevicePtr big = allocator.allocate(64 * kMiB, 0);  // the whole device, 8 chunks of 4 pages
  EXPECT_EQ(device.call_count(SimOp::kCreatePhysical), 8u);
  allocator.deallocate(big);  // idle, still mapped in stream 0's span
  const StreamHandle other = device.create_stream();
  const DevicePtr small = allocator.allocate(2 * kMiB, other);
  EXPECT_TRUE(device.is_range_accessible(small, 2 * kMiB));
  EXPECT_EQ(ledger.counters().num_alloc_retries, 0) << "no cache flush should have been needed";
  EXPECT_EQ(device.call_count(SimOp::kReleasePhysical), 1u) << "one 4-page chunk exchanged";
  EXPECT_LE(device.physical_bytes_in_use(), 64 * kMiB);
  const BlockCensus census = allocator.census();
  EXPECT_TRUE(check_consistency(ledger, census).ok()) << check_consistency(ledger, census).to_string();
  allocator.deallocate(small);
}

TEST_F(PagedHeapTest, HolesInAddressSpaceCostNoPhysicalMemory) {
  // Classic fragmentation: interleaved sizes freed in a pattern that leaves holes too small for
  // the next request. Pages under the holes must be re-used.
  std::vector<DevicePtr> a;
  std::vector<DevicePtr> b;
  for (int i = 0; i < 32; ++i) {
    a.push_back(allocator_.allocate(6 * kMiB, 0));
    b.push_back(allocator_.allocate(4 * kMiB, 0));
  }
  for (DevicePtr p : a) allocator_.deallocate(p);
  const std::int64_t live = 32 * 4 * static_cast<std::int64_t>(kMiB);
  std::vector<DevicePtr> c;
  for (int i = 0; i < 16; ++i) c.push_back(allocator_.allocate(12 * kMiB, 0));
  const std::int64_t now_live = live + 16 * 12 * static_cast<std::int64_t>(kMiB);
  EXPECT_LE(reserved(), now_live + 2 * static_cast<std::int64_t>(kMiB) * 2)
      << "reserved " << reserved() << " for " << now_live << " live";
  for (DevicePtr p : b) allocator_.deallocate(p);
  for (DevicePtr p : c) allocator_.deallocate(p);
}

}  // namespace
}  // namespace vramledger
