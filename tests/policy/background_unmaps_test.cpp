// unmap_in_background (detail/background_unmaps.hpp): a chunk the paged heap moves to a new
// address is mapped there first; its old address is unmapped by a helper thread. These tests
// check that the helper does those unmaps (not the allocating thread), that the heap makes the
// same driver calls and keeps the same layout as when it unmaps in place, and that an unmap the
// helper fails is retried without losing anything.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/forwarding_backend.hpp"
#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = kKiB * 1024;

// Records which thread makes each unmap; fails the first `fail_on_helper` unmaps made off the
// thread that built it.
class ThreadRecordingBackend : public ForwardingBackend {
 public:
  explicit ThreadRecordingBackend(DeviceBackend& inner, int fail_on_helper = 0)
      : ForwardingBackend(inner), fail_on_helper_(fail_on_helper) {}

  Status unmap_pages(DevicePtr va, std::size_t page_bytes, std::size_t count) override {
    if (std::this_thread::get_id() == owner_) {
      unmaps_here_.fetch_add(1);
    } else {
      unmaps_elsewhere_.fetch_add(1);
      if (fail_on_helper_.fetch_sub(1) > 0) return {ErrorCode::kDriverError, "injected"};
    }
    return ForwardingBackend::unmap_pages(va, page_bytes, count);
  }

  std::uint64_t unmaps_here() const { return unmaps_here_.load(); }
  std::uint64_t unmaps_elsewhere() const { return unmaps_elsewhere_.load(); }

 private:
  const std::thread::id owner_ = std::this_thread::get_id();
  std::atomic<int> fail_on_helper_;
  std::atomic<std::uint64_t> unmaps_here_{0};
  std::atomic<std::uint64_t> unmaps_elsewhere_{0};
};

// Training steps of random sequence lengths (as in paged_heap_steady_state_test.cpp), under a
// cap just above what the longest needs: the heap cannot grow its way out, so the best fit's
// missing pages come from idle ones elsewhere (moves).
void varying_steps(CachingAllocator& allocator, int steps, bool let_helper_catch_up = true) {
  std::mt19937 random(7);
  for (int step = 0; step < steps; ++step) {
    // Between steps the helper catches up (an idle moment of a real step), so that the test does
    // not depend on how the machine schedules it; within a step the allocator may need an old
    // address before the helper got to it, and unmaps it itself.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (let_helper_catch_up && allocator.census().unmaps_pending != 0 &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const std::size_t seq = 128 + 64 * std::uniform_int_distribution<std::size_t>(0, 14)(random);
    std::vector<DevicePtr> saved;
    for (int layer = 0; layer < 12; ++layer) {
      const DevicePtr scratch = allocator.allocate(seq * 48 * kKiB, 0);
      saved.push_back(allocator.allocate(seq * 12 * kKiB, 0));
      saved.push_back(allocator.allocate(seq * 48 * kKiB, 0));
      allocator.deallocate(scratch);
    }
    const DevicePtr logits = allocator.allocate(seq * 800 * kKiB, 0);
    while (!saved.empty()) {
      allocator.deallocate(saved.back());
      saved.pop_back();
    }
    allocator.deallocate(logits);
  }
}

struct Outcome {
  BlockCensus census;
  std::uint64_t maps = 0, unmaps = 0, creates = 0;
  std::int64_t peak_reserved = 0;
  std::uint64_t unmaps_here = 0, unmaps_elsewhere = 0;
  std::size_t device_mapped = 0;
  std::int64_t census_mapped = 0;
};

Outcome run(bool in_background, int fail_on_helper = 0) {
  SimulatedDevice device(SimulatedDeviceOptions{});
  ThreadRecordingBackend backend(device, fail_on_helper);
  Ledger ledger;
  AllocatorOptions options;
  options.unmap_in_background = in_background;
  options.cap_bytes = 1536 * kMiB;
  CachingAllocator allocator(backend, &ledger, options);
  varying_steps(allocator, 40);
  allocator.finish_background_unmaps();
  Outcome out;
  out.census = allocator.census();
  out.maps = device.call_count(SimOp::kMapPages);
  out.unmaps = device.call_count(SimOp::kUnmapPages);
  out.creates = device.call_count(SimOp::kCreatePhysical);
  out.peak_reserved =
      ledger.counters().pools[stat_pool_index(StatPool::kAggregate)].reserved_bytes.peak;
  out.unmaps_here = backend.unmaps_here();
  out.unmaps_elsewhere = backend.unmaps_elsewhere();
  out.device_mapped = device.mapped_bytes();
  for (const auto& pool : out.census.pools) out.census_mapped += pool.mapped_bytes;
  const ConsistencyReport report = check_consistency(ledger, out.census);
  EXPECT_TRUE(report.ok()) << report.to_string();
  return out;
}

TEST(BackgroundUnmaps, OldAddressesOfMovedChunksAreUnmappedByTheHelper) {
  const Outcome out = run(/*in_background=*/true);
  std::printf("[ info ] %llu maps, %llu unmaps: %llu by the helper, %llu on demand\n",
              static_cast<unsigned long long>(out.maps),
              static_cast<unsigned long long>(out.unmaps),
              static_cast<unsigned long long>(out.census.unmaps_in_background),
              static_cast<unsigned long long>(out.census.unmaps_on_demand));
  ASSERT_GT(out.unmaps, 0u) << "the workload moved no page: the test shows nothing";
  EXPECT_GT(out.census.unmaps_in_background, 0);
  // The census counts exactly the unmaps made off the allocating thread.
  EXPECT_EQ(static_cast<std::uint64_t>(out.census.unmaps_in_background), out.unmaps_elsewhere);
  EXPECT_EQ(out.unmaps_here + out.unmaps_elsewhere, out.unmaps);
  EXPECT_LE(static_cast<std::uint64_t>(out.census.unmaps_on_demand), out.unmaps_here);
  // Once finished, the device maps exactly what the heap counts as mapped.
  EXPECT_EQ(static_cast<std::int64_t>(out.device_mapped), out.census_mapped);
  EXPECT_EQ(out.census.unmaps_pending, 0);
}

TEST(BackgroundUnmaps, SameDriverCallsAndPeakAsUnmappingInPlace) {
  const Outcome background = run(/*in_background=*/true);
  const Outcome in_place = run(/*in_background=*/false);
  EXPECT_EQ(background.maps, in_place.maps);
  EXPECT_EQ(background.unmaps, in_place.unmaps);
  EXPECT_EQ(background.creates, in_place.creates);
  EXPECT_EQ(background.peak_reserved, in_place.peak_reserved);
  EXPECT_EQ(in_place.census.unmaps_in_background, 0);
  EXPECT_EQ(in_place.unmaps_elsewhere, 0u);
}

TEST(BackgroundUnmaps, AnUnmapTheHelperFailsIsRetriedAndLosesNothing) {
  const Outcome out = run(/*in_background=*/true, /*fail_on_helper=*/3);
  ASSERT_GE(out.unmaps_elsewhere, 3u) << "the helper made fewer than 3 unmaps";
  // The 3 failures were retried on the allocating thread (by then nobody else could run them).
  EXPECT_GE(out.census.unmaps_on_demand, 3);
  EXPECT_EQ(static_cast<std::int64_t>(out.device_mapped), out.census_mapped);
}

// A process forked after the helper started has no helper (and may have inherited its queue's
// mutex held): its allocator finishes its old addresses itself.
TEST(BackgroundUnmaps, AForkedChildUnmapsOnItsOwn) {
  SimulatedDevice device(SimulatedDeviceOptions{});
  Ledger ledger;
  AllocatorOptions options;
  options.cap_bytes = 1536 * kMiB;
  CachingAllocator allocator(device, &ledger, options);
  varying_steps(allocator, 10);
  ASSERT_GT(allocator.census().unmaps_in_background, 0) << "the helper never started";
  // Forked while the helper waits for work (the simulated device's own mutex must not be held
  // by the helper at the fork; a CUDA context is unusable in a child anyway).
  while (allocator.census().unmaps_pending != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const pid_t child = fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    const std::int64_t by_helper = allocator.census().unmaps_in_background;
    const std::int64_t on_demand = allocator.census().unmaps_on_demand;
    varying_steps(allocator, 20, /*let_helper_catch_up=*/false);  // there is no helper here
    allocator.finish_background_unmaps();
    const BlockCensus census = allocator.census();
    std::int64_t mapped = 0;
    for (const auto& pool : census.pools) mapped += pool.mapped_bytes;
    const bool ok = census.unmaps_in_background == by_helper &&
                    census.unmaps_on_demand > on_demand && census.unmaps_pending == 0 &&
                    static_cast<std::int64_t>(device.mapped_bytes()) == mapped &&
                    check_consistency(ledger, census).ok();
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child did not exit (status " << status << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's books or mappings were off";
}

TEST(BackgroundUnmaps, OffWithoutSecondMappings) {
  // A backend that cannot map memory twice (here: the simulated device told so) keeps unmapping
  // in place whatever the option says.
  SimulatedDeviceOptions device_options;
  device_options.allow_aliased_mappings = false;
  SimulatedDevice device(device_options);
  ThreadRecordingBackend backend(device);
  AllocatorOptions options;
  options.alias_pending_pages = false;
  options.cap_bytes = 1536 * kMiB;
  CachingAllocator allocator(backend, nullptr, options);
  varying_steps(allocator, 20);
  EXPECT_GT(device.call_count(SimOp::kUnmapPages), 0u);
  EXPECT_EQ(backend.unmaps_elsewhere(), 0u);
  EXPECT_EQ(allocator.census().unmaps_in_background, 0);
}

}  // namespace
}  // namespace vramledger
