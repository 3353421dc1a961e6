// map_in_background (detail/background_maps.hpp): the pages an allocation needs are mapped by a
// helper thread while the allocation's stream waits for them on the GPU (a host counter). These
// tests check that the allocating thread makes no map, that work queued on the stream after the
// allocation cannot run before the map (the simulated device holds it behind the wait), that the
// books and the device agree once the helper is done, that a map the helper fails is retried and
// one that keeps failing poisons the allocator without leaving the stream waiting for ever, and
// that a capture or a backend without host counters maps in place.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
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

// Counts maps by thread; can hold the helper's maps until released, fail the first few of them,
// or say that streams cannot wait for host counters.
class MapWatchingBackend : public ForwardingBackend {
 public:
  explicit MapWatchingBackend(DeviceBackend& inner) : ForwardingBackend(inner) {
    info_ = inner.info();
  }
  const BackendInfo& info() const override { return info_; }

  Status map_pages(DevicePtr va, std::size_t page_bytes,
                   std::span<const PhysicalHandle> handles) override {
    if (std::this_thread::get_id() == owner_) {
      maps_here_.fetch_add(1);
    } else {
      maps_elsewhere_.fetch_add(1);
      std::unique_lock lock(mutex_);
      released_.wait(lock, [&] { return !holding_; });
      if (fail_on_helper_ > 0) {
        --fail_on_helper_;
        return {ErrorCode::kDriverError, "injected map failure"};
      }
    }
    return ForwardingBackend::map_pages(va, page_bytes, handles);
  }

  void hold() {
    std::lock_guard lock(mutex_);
    holding_ = true;
  }
  void release() {
    {
      std::lock_guard lock(mutex_);
      holding_ = false;
    }
    released_.notify_all();
  }
  void fail_next_helper_maps(int count) {
    std::lock_guard lock(mutex_);
    fail_on_helper_ = count;
  }
  void without_host_counters() { info_.waits_on_host_counters = false; }

  std::uint64_t maps_here() const { return maps_here_.load(); }
  std::uint64_t maps_elsewhere() const { return maps_elsewhere_.load(); }

 private:
  BackendInfo info_;
  const std::thread::id owner_ = std::this_thread::get_id();
  std::mutex mutex_;
  std::condition_variable released_;
  bool holding_ = false;
  int fail_on_helper_ = 0;
  std::atomic<std::uint64_t> maps_here_{0};
  std::atomic<std::uint64_t> maps_elsewhere_{0};
};

AllocatorOptions deferred_maps() {
  AllocatorOptions options;
  options.map_in_background = true;
  options.cap_bytes = 1536 * kMiB;
  return options;
}

// Training steps of random sequence lengths under a cap just above what the longest needs
// (moves), as in background_unmaps_test.cpp. Each allocation is followed by "kernels" on the
// stream (user work); each must wait until its pages are mapped.
struct StepsOutcome {
  std::uint64_t allocations = 0;
  std::uint64_t ran_unmapped = 0;  // user work that found its block's pages unmapped when it ran
};

StepsOutcome varying_steps(CachingAllocator& allocator, SimulatedDevice& device, int steps) {
  std::mt19937 random(7);
  StepsOutcome out;
  struct Use {
    EventHandle token;
    DevicePtr ptr;
    std::size_t bytes;
  };
  std::vector<Use> uses;
  auto use = [&](DevicePtr ptr, std::size_t bytes) {
    ++out.allocations;
    uses.push_back({device.enqueue_user_work(0), ptr, bytes});
  };
  // A use that has run (its work item completed) must have found its pages mapped; it is
  // checked while its block is still live.
  auto check_uses = [&] {
    for (const Use& u : uses) {
      if (device.user_work_done(u.token) && !device.is_range_accessible(u.ptr, u.bytes)) {
        ++out.ran_unmapped;
      }
    }
    uses.clear();
  };
  for (int step = 0; step < steps; ++step) {
    // Between steps the helper catches up (an idle moment of a real step), so that the test does
    // not depend on how the machine schedules it.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (allocator.census().maps_pending != 0 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const std::size_t seq = 128 + 64 * std::uniform_int_distribution<std::size_t>(0, 14)(random);
    std::vector<DevicePtr> saved;
    for (int layer = 0; layer < 12; ++layer) {
      const DevicePtr scratch = allocator.allocate(seq * 48 * kKiB, 0);
      use(scratch, seq * 48 * kKiB);
      saved.push_back(allocator.allocate(seq * 12 * kKiB, 0));
      use(saved.back(), seq * 12 * kKiB);
      saved.push_back(allocator.allocate(seq * 48 * kKiB, 0));
      use(saved.back(), seq * 48 * kKiB);
      check_uses();
      allocator.deallocate(scratch);
    }
    const DevicePtr logits = allocator.allocate(seq * 800 * kKiB, 0);
    use(logits, seq * 800 * kKiB);
    check_uses();
    while (!saved.empty()) {
      allocator.deallocate(saved.back());
      saved.pop_back();
    }
    allocator.deallocate(logits);
  }
  return out;
}

std::int64_t census_mapped(const BlockCensus& census) {
  std::int64_t mapped = 0;
  for (const auto& pool : census.pools) mapped += pool.mapped_bytes;
  return mapped;
}

TEST(BackgroundMaps, TheHelperMapsAndTheBooksAgreeOnceItIsDone) {
  SimulatedDevice device(SimulatedDeviceOptions{});
  MapWatchingBackend backend(device);
  Ledger ledger;
  CachingAllocator allocator(backend, &ledger, deferred_maps());
  const StepsOutcome steps = varying_steps(allocator, device, 30);
  allocator.finish_background_unmaps();  // and the maps
  const BlockCensus census = allocator.census();
  ASSERT_GT(device.call_count(SimOp::kMapPages), 0u);
  // The allocating thread maps only what it had to finish itself (finish_background_unmaps).
  EXPECT_GT(backend.maps_elsewhere(), 0u);
  EXPECT_GT(census.maps_in_background, 0);
  if (census.maps_on_demand == 0) {
    EXPECT_EQ(backend.maps_here(), 0u);
  }
  EXPECT_EQ(census.maps_pending, 0);
  EXPECT_EQ(steps.ran_unmapped, 0u);
  EXPECT_EQ(static_cast<std::int64_t>(device.mapped_bytes()), census_mapped(census));
  const ConsistencyReport report = check_consistency(ledger, census);
  EXPECT_TRUE(report.ok()) << report.to_string();
}

TEST(BackgroundMaps, WorkOnTheStreamWaitsForTheMap) {
  SimulatedDevice device(SimulatedDeviceOptions{});
  MapWatchingBackend backend(device);
  CachingAllocator allocator(backend, nullptr, deferred_maps());
  backend.hold();  // the helper's maps wait here until released
  const DevicePtr ptr = allocator.allocate(64 * kMiB, 0);  // returns before its pages are mapped
  EXPECT_FALSE(device.is_range_accessible(ptr, 64 * kMiB));
  const EventHandle kernel = device.enqueue_user_work(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(device.user_work_done(kernel)) << "work ran before the pages were mapped";
  EXPECT_EQ(allocator.census().maps_pending, 1);
  backend.release();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!device.user_work_done(kernel) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(device.is_range_accessible(ptr, 64 * kMiB));
  EXPECT_EQ(allocator.census().maps_pending, 0);
  allocator.deallocate(ptr);
  allocator.empty_cache();
  EXPECT_EQ(device.mapped_bytes(), 0u);
}

TEST(BackgroundMaps, EmptyCacheFinishesPendingMapsFirst) {
  SimulatedDevice device(SimulatedDeviceOptions{});
  MapWatchingBackend backend(device);
  Ledger ledger;
  CachingAllocator allocator(backend, &ledger, deferred_maps());
  backend.hold();
  const DevicePtr ptr = allocator.allocate(32 * kMiB, 0);
  allocator.deallocate(ptr);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    backend.release();
  });
  allocator.empty_cache();  // waits for the helper's map, then unmaps and releases
  releaser.join();
  EXPECT_EQ(device.mapped_bytes(), 0u);
  EXPECT_EQ(device.physical_bytes_in_use(), 0u);
  const ConsistencyReport report = check_consistency(ledger, allocator.census());
  EXPECT_TRUE(report.ok()) << report.to_string();
}

TEST(BackgroundMaps, AMapTheHelperFailsTwiceIsRetriedAndLosesNothing) {
  SimulatedDevice device(SimulatedDeviceOptions{});
  MapWatchingBackend backend(device);
  Ledger ledger;
  CachingAllocator allocator(backend, &ledger, deferred_maps());
  backend.fail_next_helper_maps(2);
  const DevicePtr ptr = allocator.allocate(16 * kMiB, 0);
  allocator.finish_background_unmaps();
  EXPECT_TRUE(device.is_range_accessible(ptr, 16 * kMiB));
  allocator.deallocate(ptr);
  EXPECT_NO_THROW(allocator.deallocate(allocator.allocate(16 * kMiB, 0)));
  allocator.finish_background_unmaps();
  const BlockCensus census = allocator.census();
  EXPECT_EQ(static_cast<std::int64_t>(device.mapped_bytes()), census_mapped(census));
  EXPECT_TRUE(check_consistency(ledger, census).ok());
}

TEST(BackgroundMaps, AMapThatKeepsFailingPoisonsTheAllocatorButReleasesTheStream) {
  SimulatedDevice device(SimulatedDeviceOptions{});
  MapWatchingBackend backend(device);
  CachingAllocator allocator(backend, nullptr, deferred_maps());
  backend.fail_next_helper_maps(1000);
  const DevicePtr ptr = allocator.allocate(16 * kMiB, 0);
  const EventHandle kernel = device.enqueue_user_work(0);
  // The helper's three tries (not a run of finish_background_unmaps here, whose maps succeed).
  const auto helper_done = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (allocator.census().maps_pending != 0 && std::chrono::steady_clock::now() < helper_done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GE(backend.maps_elsewhere(), 3u);
  try {
    allocator.finish_background_unmaps();
    ADD_FAILURE() << "finishing did not report the failed map";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("map_in_background"), std::string::npos)
        << error.what();
  }
  // The stream does not wait for ever: its work runs (and would meet unmapped memory).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!device.user_work_done(kernel) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(device.is_range_accessible(ptr, 16 * kMiB));
  try {
    (void)allocator.allocate(kMiB, 0);
    ADD_FAILURE() << "a poisoned allocator allocated";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("failed 3 times"), std::string::npos) << error.what();
  }
  backend.fail_next_helper_maps(0);
}

TEST(BackgroundMaps, ACaptureOrABackendWithoutHostCountersMapsInPlace) {
  {
    SimulatedDevice device(SimulatedDeviceOptions{});
    MapWatchingBackend backend(device);
    CachingAllocator allocator(backend, nullptr, deferred_maps());
    device.set_capture_underway(true);
    const DevicePtr ptr = allocator.allocate(16 * kMiB, 0);
    EXPECT_TRUE(device.is_range_accessible(ptr, 16 * kMiB));
    EXPECT_GT(backend.maps_here(), 0u);
    EXPECT_EQ(backend.maps_elsewhere(), 0u);
    device.set_capture_underway(false);
    allocator.deallocate(ptr);
  }
  {
    SimulatedDevice device(SimulatedDeviceOptions{});
    MapWatchingBackend backend(device);
    backend.without_host_counters();
    CachingAllocator allocator(backend, nullptr, deferred_maps());
    const DevicePtr ptr = allocator.allocate(16 * kMiB, 0);
    EXPECT_TRUE(device.is_range_accessible(ptr, 16 * kMiB));
    EXPECT_EQ(backend.maps_elsewhere(), 0u);
    EXPECT_EQ(allocator.census().maps_in_background, 0);
    allocator.deallocate(ptr);
  }
}

}  // namespace
}  // namespace vramledger
