// BlockCensus::host_waits: the allocator's stops of its calling thread until the GPU has run
// queued work (each one lets the GPU's queue run dry), counted exactly and avoided by placement
// wherever a fit that does not wait exists (bench/results/torch/2026-12-03-host-waits-vit.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// BlockCensus::host_waits counts each time the allocator stopped the calling thread until the GPU
// caught up: none while a stream reuses its own pending frees (stream order), one per wait when
// empty_cache must wait for queued work. Checked against the device's own count of the calls.
TEST(PagedHeapHostWaits, CountEveryWaitOfTheCallingThreadForTheGpu) {
  for (const bool in_background : {false, true}) {
    SCOPED_TRACE(in_background ? "unmap_in_background" : "unmaps in place");
    SimulatedDeviceOptions device_options;
    device_options.allow_aliased_mappings = true;
    SimulatedDevice device(device_options);
    Ledger ledger;
    AllocatorOptions options;
    options.unmap_in_background = in_background;
    CachingAllocator allocator(device, &ledger, options);
    auto device_waits = [&] {
      return static_cast<std::int64_t>(device.call_count(SimOp::kSynchronizeEvent) +
                                        device.call_count(SimOp::kSynchronizeDevice));
    };
    const StreamHandle stream = device.create_stream();
    const DevicePtr small = allocator.allocate(2 * kMiB, stream);
    const DevicePtr p = allocator.allocate(64 * kMiB, stream);
    ASSERT_TRUE(device.pause_stream(stream));
    const EventHandle reads_p = device.enqueue_user_work(stream);
    allocator.deallocate(p);
    // Reuse on the same stream, in place and at a larger size (pages aliased or moved): the
    // GPU still has p's work queued, and nothing waits for it.
    const DevicePtr q = allocator.allocate(64 * kMiB, stream);
    allocator.deallocate(q);
    const DevicePtr r = allocator.allocate(80 * kMiB, stream);
    EXPECT_FALSE(device.user_work_done(reads_p)) << "an allocation waited for the GPU";
    EXPECT_EQ(allocator.census().host_waits, 0);
    EXPECT_EQ(device_waits(), 0);
    allocator.deallocate(r);
    allocator.deallocate(small);
    allocator.empty_cache();  // p's pages cannot go back to the driver before its work ran
    EXPECT_TRUE(device.user_work_done(reads_p));
    EXPECT_GT(allocator.census().host_waits, 0);
    EXPECT_EQ(allocator.census().host_waits, device_waits());
    // The cheap read (vramledger.stats()["policy"]) gives the census's figures, every one.
    const BlockCensus census = allocator.census();
    const PolicyFigures figures = allocator.policy_figures();
    EXPECT_EQ(figures.host_waits, census.host_waits);
    EXPECT_EQ(figures.stream_heaps, census.stream_heaps);
    EXPECT_EQ(figures.lane_choices, census.lane_choices);
    EXPECT_EQ(figures.locked_allocations, census.locked_allocations);
    EXPECT_EQ(figures.unmaps_in_background, census.unmaps_in_background);
    EXPECT_EQ(figures.unmaps_on_demand, census.unmaps_on_demand);
    EXPECT_EQ(figures.unmaps_pending, census.unmaps_pending);
    EXPECT_EQ(figures.peak_active_bytes, census.peak_active_bytes);
    EXPECT_GT(figures.peak_active_bytes, 0);
    EXPECT_GT(figures.stream_heaps, 0);
    ASSERT_TRUE(device.resume_stream(stream));
    EXPECT_EQ(device.mapped_bytes(), 0u);
  }
}

// Several fences of a stream outstanding: one wait, for the newest that is needed, covers the
// older ones (the stream runs its work in order), so empty_cache stops the thread once.
TEST(PagedHeapHostWaits, OneWaitCoversTheOlderFencesOfAStream) {
  SimulatedDeviceOptions device_options;
  device_options.allow_aliased_mappings = true;
  SimulatedDevice device(device_options);
  Ledger ledger;
  CachingAllocator allocator(device, &ledger, AllocatorOptions{});
  const StreamHandle stream = device.create_stream();
  std::vector<DevicePtr> kept;
  ASSERT_TRUE(device.pause_stream(stream));
  for (std::size_t i = 0; i < 4; ++i) {
    const DevicePtr p = allocator.allocate((64 + 2 * i) * kMiB, stream);
    kept.push_back(allocator.allocate(2 * kMiB, stream));  // keeps p's hole from the free tail
    device.enqueue_user_work(stream);
    allocator.deallocate(p);
    // Fits no hole: takes p's memory, still in use, at a new address (a fence for p's free).
    kept.push_back(allocator.allocate((66 + 2 * i) * kMiB, stream));
  }
  const std::uint64_t fences = device.call_count(SimOp::kRecordEvent);
  ASSERT_GE(fences, 2u) << "the scenario no longer leaves several fences outstanding";
  for (DevicePtr p : kept) allocator.deallocate(p);
  EXPECT_EQ(allocator.census().host_waits, 0);
  allocator.empty_cache();
  EXPECT_EQ(device.call_count(SimOp::kSynchronizeEvent), 1u);
  EXPECT_EQ(allocator.census().host_waits, 1);
  ASSERT_TRUE(device.resume_stream(stream));
  allocator.empty_cache();
  EXPECT_EQ(device.mapped_bytes(), 0u);
}

// When every close fit by size lies over old addresses whose queued work still runs (aliased
// pages of freed blocks), the allocation goes to a fit that needs no wait, even one needing more
// pages: a wait would stop the CPU until the GPU drained its queue (on the H200, ViT training's
// peak steps ran 10-15 ms slower for it).
TEST(PagedHeapHostWaits, APlacementDoesNotWaitWhileAFitThatDoesNotExists) {
  SimulatedDeviceOptions device_options;
  device_options.allow_aliased_mappings = true;
  SimulatedDevice device(device_options);
  Ledger ledger;
  CachingAllocator allocator(device, &ledger, AllocatorOptions{});
  const StreamHandle stream = device.create_stream();
  std::vector<DevicePtr> holes, spacers;
  for (int i = 0; i < 6; ++i) {
    holes.push_back(allocator.allocate(64 * kMiB, stream));
    spacers.push_back(allocator.allocate(2 * kMiB, stream));
  }
  ASSERT_TRUE(device.pause_stream(stream));
  const EventHandle reads_holes = device.enqueue_user_work(stream);
  for (DevicePtr p : holes) allocator.deallocate(p);
  // Each larger request fits no hole: it goes past them and takes a hole's memory, still in use
  // by the queued work, at its new address too (alias_pending_pages); the holes' old addresses
  // stay mapped until that work is done.
  std::vector<DevicePtr> larger;
  for (int i = 0; i < 6; ++i) larger.push_back(allocator.allocate(66 * kMiB, stream));
  ASSERT_EQ(allocator.census().host_waits, 0);
  // A hole's size again: the six holes are the closest fits, and each would wait.
  const DevicePtr again = allocator.allocate(64 * kMiB, stream);
  EXPECT_EQ(allocator.census().host_waits, 0) << "the allocation waited for the GPU";
  EXPECT_FALSE(device.user_work_done(reads_holes));
  EXPECT_EQ(std::count(holes.begin(), holes.end(), again), 0);
  EXPECT_TRUE(device.is_range_accessible(again, 64 * kMiB));
  const ConsistencyReport report = check_consistency(ledger, allocator.census());
  EXPECT_TRUE(report.ok()) << report.to_string();
  ASSERT_TRUE(device.resume_stream(stream));
  allocator.deallocate(again);
  for (DevicePtr p : larger) allocator.deallocate(p);
  for (DevicePtr p : spacers) allocator.deallocate(p);
  allocator.empty_cache();
  EXPECT_EQ(device.mapped_bytes(), 0u);
}

}  // namespace
}  // namespace vramledger
