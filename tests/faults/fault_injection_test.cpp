// The fault-injecting adaptor (allocator/fault_injecting_backend.hpp) over the simulated device:
// its own contract (a failed call changed nothing on the device, early and late), then the fault
// workload of the GPU test (tests/gpu/fault_injection_gpu.cpp) at 10% failure over the segment
// and the paged heap, with the simulated device's physical accounting standing in for NVML.
//
// VRAMLEDGER_FAULT_OPS sets the operations per heap (default 100,000; scripts/run_tests.sh's
// sanitizer build runs fewer), VRAMLEDGER_FAULT_SEED the seed.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/fault_injecting_backend.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "tests/faults/fault_workload.hpp"
#include "tests/stress/stress_env.hpp"

namespace vramledger::fault_test {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::uint32_t only(FaultPoint point) { return 1u << static_cast<unsigned>(point); }

TEST(FaultInjectingBackend, RateZeroPassesEveryCall) {
  SimulatedDevice device;
  FaultInjectingBackend faulty(device, {.rate = 0.0, .seed = 1});
  for (int i = 0; i < 100; ++i) {
    PhysicalHandle handle = 0;
    ASSERT_TRUE(faulty.create_physical(2 * kMiB, &handle).is_ok());
    ASSERT_TRUE(faulty.release_physical(handle).is_ok());
  }
  EXPECT_EQ(faulty.injected_total(), 0u);
  EXPECT_EQ(faulty.counts(FaultPoint::kCreatePhysical).calls, 100u);
}

TEST(FaultInjectingBackend, EveryFailureChangesNothingOnTheDevice) {
  SimulatedDevice device;
  FaultInjectingBackend faulty(device, {.rate = 1.0, .seed = 7});
  for (int i = 0; i < 200; ++i) {
    DevicePtr segment = 0;
    const Status s = faulty.allocate_segment(4 * kMiB, 0, &segment);
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.message().rfind("injected fault (allocate_segment, ", 0), 0u) << s.message();
    PhysicalHandle handle = 0;
    ASSERT_FALSE(faulty.create_physical(2 * kMiB, &handle).is_ok());
  }
  EXPECT_EQ(device.physical_bytes_in_use(), 0u) << "a late failure kept memory";
  EXPECT_EQ(device.live_segment_count(), 0u);
  EXPECT_EQ(device.live_physical_handle_count(), 0u);
  const auto seg = faulty.counts(FaultPoint::kAllocateSegment);
  EXPECT_GT(seg.early, 50u);
  EXPECT_GT(seg.late, 50u) << "late failures (done, then undone) are half of them";
  EXPECT_EQ(seg.early + seg.late, 200u);

  // A mapping failed late was made and unmapped: the range is unmapped again.
  faulty.set_rate(0.0);
  DevicePtr va = 0;
  ASSERT_TRUE(faulty.reserve_address_range(8 * kMiB, &va).is_ok());
  PhysicalHandle pages[2] = {};
  ASSERT_TRUE(faulty.create_physical(2 * kMiB, &pages[0]).is_ok());
  ASSERT_TRUE(faulty.create_physical(2 * kMiB, &pages[1]).is_ok());
  faulty.set_rate(1.0);
  for (int i = 0; i < 20; ++i) {
    const Status s = faulty.map_pages(va, 2 * kMiB, pages);
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(device.mapped_bytes(), 0u) << s.message();
  }
  EXPECT_GT(faulty.counts(FaultPoint::kMapPages).late, 0u);
  faulty.set_rate(0.0);
  ASSERT_TRUE(faulty.map_pages(va, 2 * kMiB, pages).is_ok());
  EXPECT_EQ(device.mapped_bytes(), 4 * kMiB);
}

TEST(FaultInjectingBackend, OnlyTheChosenPointsFailAndTheSeedRepeats) {
  auto run = [](std::uint64_t seed) {
    SimulatedDevice device;
    FaultInjectingBackend faulty(device,
                                 {.rate = 0.5, .seed = seed, .points = only(FaultPoint::kCreateEvent)});
    std::string pattern;
    for (int i = 0; i < 64; ++i) {
      EventHandle event = 0;
      const bool ok = faulty.create_event(&event).is_ok();
      pattern += ok ? '.' : 'x';
      if (ok) {
        EXPECT_TRUE(faulty.record_event(event, 0).is_ok()) << "record_event is not chosen";
        EXPECT_TRUE(faulty.destroy_event(event).is_ok());
      }
    }
    return pattern;
  };
  EXPECT_EQ(run(3), run(3));
  EXPECT_NE(run(3), run(4));
  EXPECT_NE(run(3).find('x'), std::string::npos);
}

TEST(FaultInjectingBackend, RateOutsideZeroToOneIsRefused) {
  SimulatedDevice device;
  EXPECT_THROW(FaultInjectingBackend(device, {.rate = 1.5}), Error);
  FaultInjectingBackend faulty(device, {.rate = 0.1});
  EXPECT_THROW(faulty.set_rate(-0.1), Error);
}

// The GPU test's workload over the simulated device.
class FaultWorkload : public testing::TestWithParam<bool> {};  // param: virtual memory (paged)

TEST_P(FaultWorkload, TenPercentFailuresLoseNoByte) {
  SimulatedDeviceOptions device_options;
  device_options.supports_virtual_memory = GetParam();
  SimulatedDevice device(device_options);
  FaultInjectingBackend faulty(
      device, {.rate = 0.10, .seed = stress::env_u64("VRAMLEDGER_FAULT_SEED", 16)});
  Ledger ledger;
  CachingAllocator allocator(faulty, &ledger);

  FaultWorkloadOptions options;
  options.operations = stress::env_u64("VRAMLEDGER_FAULT_OPS", 100'000);
  options.streams = {0, device.create_stream(), device.create_stream()};
  options.device_held = [&device](std::int64_t* held) {
    *held = static_cast<std::int64_t>(device.physical_bytes_in_use());
    return Status::ok();
  };
  const FaultWorkloadResult result = run_fault_workload(allocator, ledger, faulty, options);
  const std::string figures = summarize(result, faulty);
  std::printf("[ info ] %s heap: %s\n", GetParam() ? "paged" : "segment", figures.c_str());
  ASSERT_EQ(result.problem, "") << figures;
  EXPECT_EQ(result.operations, options.operations);
  EXPECT_GT(result.allocations_through_faults, 0u) << "no retry succeeded: " << figures;
  EXPECT_GT(result.out_of_memory + result.driver_errors, 0u) << "no fault surfaced: " << figures;
  EXPECT_GT(faulty.injected_total(), options.operations / 1000) << figures;
  EXPECT_EQ(device.physical_bytes_in_use(), 0u);
  RecordProperty("figures", figures);
}

INSTANTIATE_TEST_SUITE_P(Heaps, FaultWorkload, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Paged" : "Segment");
                         });

}  // namespace
}  // namespace vramledger::fault_test
