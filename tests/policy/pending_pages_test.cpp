// Pages still in use by queued work (alias_pending_pages, docs/configuration.md): never unmapped
// or handed to work that could run before that work; with aliasing, their memory serves a new
// address at once on the same stream, or after a GPU-side wait for another stream.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// alias_pending_pages: a stream's own pages whose work is still queued serve a new address of
// the same stream without growing; the old address stays mapped, and unused, until that work
// has finished.
TEST(PagedHeapAliasing, PendingOwnPagesServeANewAddressWithoutGrowing) {
  for (const bool alias : {false, true}) {
    SCOPED_TRACE(alias ? "aliasing" : "not aliasing");
    SimulatedDeviceOptions device_options;
    device_options.allow_aliased_mappings = true;
    SimulatedDevice device(device_options);
    Ledger ledger;
    AllocatorOptions options;
    options.alias_pending_pages = alias;
    CachingAllocator allocator(device, &ledger, options);
    auto reserved = [&] {
      return ledger.counters().pools[stat_pool_index(StatPool::kAggregate)].reserved_bytes.current;
    };
    auto consistent = [&] {
      const ConsistencyReport report = check_consistency(ledger, allocator.census());
      EXPECT_TRUE(report.ok()) << report.to_string();
    };
    const StreamHandle stream = device.create_stream();
    const DevicePtr x = allocator.allocate(2 * kMiB, stream);
    const DevicePtr a = allocator.allocate(64 * kMiB, stream);
    const DevicePtr y = allocator.allocate(2 * kMiB, stream);
    ASSERT_TRUE(device.pause_stream(stream));  // the GPU has not yet run the work that uses a
    const EventHandle work_on_a = device.enqueue_user_work(stream);
    allocator.deallocate(a);
    const std::int64_t before = reserved();
    const DevicePtr b = allocator.allocate(66 * kMiB, stream);  // does not fit a's hole
    EXPECT_TRUE(device.is_range_accessible(b, 66 * kMiB));
    EXPECT_TRUE(device.is_range_accessible(a, 64 * kMiB))
        << "work queued before the free may still use a's address";
    EXPECT_EQ(reserved(), before + static_cast<std::int64_t>((alias ? 2 : 66) * kMiB));
    consistent();
    // a's size again: with aliasing, a's old address still waits for the queued work, so the
    // allocator takes another address rather than make the CPU wait for the GPU.
    const DevicePtr c = allocator.allocate(64 * kMiB, stream);
    if (alias) {
      EXPECT_NE(c, a);
      EXPECT_FALSE(device.user_work_done(work_on_a)) << "the CPU waited for the GPU";
    }
    EXPECT_TRUE(device.is_range_accessible(c, 64 * kMiB));
    consistent();
    for (DevicePtr p : {x, y, b, c}) allocator.deallocate(p);
    ASSERT_TRUE(device.resume_stream(stream));
    allocator.empty_cache();
    EXPECT_EQ(reserved(), 0);
    EXPECT_EQ(device.mapped_bytes(), 0u) << "an old address of aliased memory left mapped";
    EXPECT_EQ(device.physical_bytes_in_use(), 0u);
  }
}

// Pages freed on a stream whose work is still queued are never unmapped or handed to another
// stream's work that could run before that work. Without aliasing they stay where they are and
// the other stream grows; with it (the default), the other stream gets the memory at its own
// address after a GPU-side wait for the busy stream's fence, while the old address stays mapped.
class PagedHeapPendingPagesTest : public testing::TestWithParam<bool> {
 protected:
  // No cross-stream slack: these tests are about what serves a request once growing within the
  // slack is not allowed (aliasing another stream's pending pages, or new memory). With the
  // default, at least two pages, these 8-16 MiB heaps would first grow by one 4 MiB chunk.
  static AllocatorOptions options() {
    AllocatorOptions options;
    options.alias_pending_pages = GetParam();
    options.cross_stream_slack_permille = 0;
    return options;
  }
  bool aliasing() const { return GetParam(); }
  std::int64_t reserved() const {
    return ledger_.counters().pools[stat_pool_index(StatPool::kAggregate)].reserved_bytes.current;
  }

  SimulatedDevice device_{SimulatedDeviceOptions{}};
  Ledger ledger_;
  CachingAllocator allocator_{device_, &ledger_, options()};
};

TEST_P(PagedHeapPendingPagesTest, PagesOfAPausedStreamAreNotStolenWhileInUse) {
  const StreamHandle busy = device_.create_stream();
  const StreamHandle other = device_.create_stream();
  const DevicePtr p = allocator_.allocate(8 * kMiB, busy);
  ASSERT_TRUE(device_.pause_stream(busy));
  const EventHandle busy_reads_p = device_.enqueue_user_work(busy);
  allocator_.deallocate(p);  // work queued on `busy` may still use these pages
  const std::int64_t before = reserved();
  const DevicePtr q = allocator_.allocate(8 * kMiB, other);
  EXPECT_TRUE(device_.is_range_accessible(p, 8 * kMiB))
      << "pages still in use by a running stream must stay mapped";
  const EventHandle other_writes_q = device_.enqueue_user_work(other);
  if (aliasing()) {
    EXPECT_EQ(reserved(), before) << "the busy stream's memory should be aliased, not grown";
    EXPECT_FALSE(device_.user_work_done(other_writes_q))
        << "work on the aliased memory must wait for the busy stream";
  } else {
    EXPECT_EQ(reserved(), before + 8 * static_cast<std::int64_t>(kMiB))
        << "pages still in use by a running stream must not be re-mapped";
  }
  ASSERT_TRUE(device_.resume_stream(busy));
  EXPECT_TRUE(device_.user_work_done(busy_reads_p));
  EXPECT_TRUE(device_.user_work_done(other_writes_q));
  const DevicePtr r = allocator_.allocate(8 * kMiB, other);
  EXPECT_EQ(reserved(), before + 8 * static_cast<std::int64_t>(kMiB));
  allocator_.deallocate(q);
  allocator_.deallocate(r);
}

// The part of a freed block that a later allocation does not take is as busy as the whole was:
// splitting must not make it look idle (found on the H200: a Llama training step read pages
// that had been re-mapped elsewhere).
TEST_P(PagedHeapPendingPagesTest, WhatIsSplitOffAFreedBlockStaysBusyUntilItsStreamIsDone) {
  const StreamHandle busy = device_.create_stream();
  const StreamHandle other = device_.create_stream();
  const DevicePtr p = allocator_.allocate(16 * kMiB, busy);
  ASSERT_TRUE(device_.pause_stream(busy));
  allocator_.deallocate(p);
  const DevicePtr front = allocator_.allocate(2 * kMiB, busy);  // splits the freed block
  EXPECT_EQ(front, p);
  const std::int64_t before = reserved();
  const DevicePtr q = allocator_.allocate(8 * kMiB, other);
  EXPECT_TRUE(device_.is_range_accessible(p, 16 * kMiB))
      << "pages of the split-off remainder were unmapped while its stream may still use them";
  const EventHandle other_writes_q = device_.enqueue_user_work(other);
  if (aliasing()) {
    EXPECT_EQ(reserved(), before);
    EXPECT_FALSE(device_.user_work_done(other_writes_q));
  } else {
    EXPECT_EQ(reserved(), before + 8 * static_cast<std::int64_t>(kMiB))
        << "pages of the split-off remainder were taken while its stream may still use them";
  }
  ASSERT_TRUE(device_.resume_stream(busy));
  EXPECT_TRUE(device_.user_work_done(other_writes_q));
  allocator_.deallocate(front);
  allocator_.deallocate(q);
}

INSTANTIATE_TEST_SUITE_P(Aliasing, PagedHeapPendingPagesTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("aliasing") : std::string("no_aliasing");
                         });

}  // namespace
}  // namespace vramledger
