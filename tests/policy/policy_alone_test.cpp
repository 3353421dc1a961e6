// The policy without the ledger: this binary links vramledger_policy only (tests/policy/
// meson.build), so it stops linking the day a file of allocator/ calls into accounting/ — the
// build's half of "arrows point down only" (docs/design.md §1; allocator/meson.build checks the
// includes). It also shows the policy works with no observer at all.
#include <gtest/gtest.h>

#include <memory>

#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

class PolicyAloneTest : public ::testing::TestWithParam<bool> {};

TEST_P(PolicyAloneTest, AllocatesFreesAndCountsWithoutAnObserver) {
  SimulatedDevice device;
  AllocatorOptions options;
  options.use_paged_heap = GetParam();
  CachingAllocator allocator(device, /*observer=*/nullptr, options);
  const DevicePtr small = allocator.allocate(1000, 0);
  const DevicePtr large = allocator.allocate(3 * kMiB, 0);
  EXPECT_TRUE(allocator.owns(small));
  EXPECT_EQ(allocator.describe(large).requested, 3 * kMiB);
  BlockCensus census = allocator.census();
  EXPECT_EQ(census.pools[0].allocation + census.pools[1].allocation, 2);
  allocator.deallocate(small);
  allocator.deallocate(large);
  allocator.empty_cache();
  census = allocator.census();
  EXPECT_EQ(census.pools[0].reserved_bytes + census.pools[1].reserved_bytes, 0);
  EXPECT_EQ(device.physical_bytes_in_use(), 0u);
}

// An observer (the ledger) destroyed while an allocator still reports to it: a fatal error that
// names the mistake at once, never a use after free at the allocator's next event.
TEST(ObserverLifetime, DestroyingAnObserverBeforeItsAllocatorIsFatal) {
  struct Counting final : AllocatorObserver {
    void on_event(const AllocatorEvent&) noexcept override { ++events; }
    int events = 0;
  };
  EXPECT_DEATH(
      {
        SimulatedDevice device;
        auto observer = std::make_unique<Counting>();
        CachingAllocator allocator(device, observer.get(), AllocatorOptions{});
        observer.reset();
      },
      "still report to it");
  // Declared in the right order (the observer outlives the allocator): attached, then detached.
  SimulatedDevice device;
  Counting observer;
  {
    CachingAllocator allocator(device, &observer, AllocatorOptions{});
    EXPECT_EQ(observer.attached_allocators(), 1);
    allocator.deallocate(allocator.allocate(1000, 0));
  }
  EXPECT_EQ(observer.attached_allocators(), 0);
  EXPECT_GT(observer.events, 0);
}

INSTANTIATE_TEST_SUITE_P(Heaps, PolicyAloneTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "paged" : "segment"; });

}  // namespace
}  // namespace vramledger
