// Smoke test for thread safety: many threads drive one simulated device at once. Meant to run
// under ThreadSanitizer as well; the final accounts must balance exactly.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kPage = std::size_t{2} << 20;

TEST(SimulatedThreads, ConcurrentCallsKeepExactAccounts) {
  SimulatedDeviceOptions options;
  options.capacity_bytes = std::size_t{1} << 30;
  SimulatedDevice device(options);
  const StreamHandle shared = device.create_stream();
  device.inject_failure_rate(SimOp::kQueryEvent, 0.1, 99);

  constexpr int kThreads = 6;
  constexpr int kIterations = 300;
  std::atomic<int> failures{0};
  std::atomic<bool> done{false};

  auto worker = [&](int id) {
    const StreamHandle own = device.create_stream();
    EventHandle event = 0;
    if (!device.create_event(&event).is_ok()) ++failures;
    for (int i = 0; i < kIterations; ++i) {
      DevicePtr segment = 0, range = 0;
      PhysicalHandle pages[2] = {0, 0};
      bool ok =
          device.allocate_segment(kPage + static_cast<std::size_t>(id), own, &segment).is_ok();
      ok = ok && device.reserve_address_range(4 * kPage, &range).is_ok();
      ok = ok && device.create_physical(kPage, &pages[0]).is_ok();
      ok = ok && device.create_physical(kPage, &pages[1]).is_ok();
      ok = ok && device.map_pages(range + kPage, kPage, pages).is_ok();
      ok = ok && device.is_range_accessible(range + kPage, 2 * kPage);
      ok = ok && device.is_range_accessible(segment, kPage);
      ok = ok && device.record_event(event, i % 2 == 0 ? shared : own).is_ok();
      ok = ok && device.stream_wait_event(own, event).is_ok();
      EventState state = EventState::kComplete;
      (void)device.query_event(event, &state);  // may fail by injection
      ok = ok && device.unmap_pages(range + kPage, kPage, 2).is_ok();
      ok = ok && device.release_physical(pages[0]).is_ok();
      ok = ok && device.release_physical(pages[1]).is_ok();
      ok = ok && device.free_address_range(range, 4 * kPage).is_ok();
      ok = ok && device.free_segment(segment, kPage + static_cast<std::size_t>(id), own).is_ok();
      if (!ok) ++failures;
    }
    if (!device.synchronize_event(event).is_ok()) ++failures;
    if (!device.destroy_event(event).is_ok()) ++failures;
    if (!device.destroy_stream(own).is_ok()) ++failures;
  };

  // Pauses and resumes the shared stream while the workers run, so waits really block.
  auto toggler = [&] {
    while (!done.load()) {
      if (!device.pause_stream(shared).is_ok()) ++failures;
      std::this_thread::yield();
      if (!device.resume_stream(shared).is_ok()) ++failures;
      std::size_t free_bytes = 0, total = 0;
      if (!device.memory_info(&free_bytes, &total).is_ok()) ++failures;
      if (free_bytes > total) ++failures;
    }
  };

  std::thread control(toggler);
  std::vector<std::thread> workers;
  for (int id = 0; id < kThreads; ++id) workers.emplace_back(worker, id);
  for (std::thread& thread : workers) thread.join();
  done = true;
  control.join();

  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(device.resume_stream(shared).is_ok());
  EXPECT_TRUE(device.synchronize_device().is_ok());
  EXPECT_EQ(device.physical_bytes_in_use(), 0u);
  EXPECT_EQ(device.mapped_bytes(), 0u);
  EXPECT_EQ(device.reserved_address_bytes(), 0u);
  EXPECT_EQ(device.live_segment_count(), 0u);
  EXPECT_EQ(device.live_physical_handle_count(), 0u);
  EXPECT_EQ(device.live_address_range_count(), 0u);
  EXPECT_EQ(device.live_event_count(), 0u);
  EXPECT_EQ(device.live_stream_count(), 2u);  // 0 and the shared one
  const std::uint64_t total_iterations = kThreads * kIterations;
  EXPECT_EQ(device.call_count(SimOp::kAllocateSegment), total_iterations);
  EXPECT_EQ(device.call_count(SimOp::kMapPages), total_iterations);
  EXPECT_EQ(device.call_count(SimOp::kCreatePhysical), 2 * total_iterations);
  EXPECT_EQ(device.call_count(SimOp::kQueryEvent), total_iterations);
  EXPECT_GT(device.injected_failure_count(SimOp::kQueryEvent), 0u);
  EXPECT_LT(device.injected_failure_count(SimOp::kQueryEvent), total_iterations);
}

}  // namespace
}  // namespace vramledger
