// Call counters and fault injection of the simulated device.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kPage = std::size_t{2} << 20;

bool is_injected(const Status& status) {
  return status.message().rfind("injected failure", 0) == 0;
}

std::vector<SimOp> all_ops() {
  std::vector<SimOp> ops;
  for (std::size_t i = 0; i < kSimOpCount; ++i) ops.push_back(static_cast<SimOp>(i));
  return ops;
}

// Calls `op` once with valid arguments (creating what it needs without counting it).
class OpRunner {
 public:
  explicit OpRunner(SimulatedDevice& device) : device_(device) {}
  Status run(SimOp op) {
    std::size_t free_bytes = 0, total = 0;
    DevicePtr ptr = 0;
    PhysicalHandle handle = 0;
    EventHandle event = 0;
    EventState state = EventState::kComplete;
    switch (op) {
      case SimOp::kMemoryInfo: return device_.memory_info(&free_bytes, &total);
      case SimOp::kAllocateSegment: return device_.allocate_segment(kPage, 0, &ptr);
      case SimOp::kFreeSegment: return device_.free_segment(segment(), kPage, 0);
      case SimOp::kCreatePhysical: return device_.create_physical(kPage, &handle);
      case SimOp::kReleasePhysical: return device_.release_physical(physical());
      case SimOp::kReserveAddress: return device_.reserve_address_range(kPage, &ptr);
      case SimOp::kFreeAddress: return device_.free_address_range(range(), kPage);
      case SimOp::kMapPages: {
        handle = physical();
        return device_.map_pages(range(), kPage, std::span(&handle, 1));
      }
      case SimOp::kUnmapPages: return device_.unmap_pages(mapped_page(), kPage, 1);
      case SimOp::kCreateEvent: return device_.create_event(&event);
      case SimOp::kDestroyEvent: return device_.destroy_event(new_event());
      case SimOp::kRecordEvent: return device_.record_event(new_event(), 0);
      case SimOp::kQueryEvent: return device_.query_event(new_event(), &state);
      case SimOp::kSynchronizeEvent: return device_.synchronize_event(new_event());
      case SimOp::kStreamWaitEvent: return device_.stream_wait_event(0, new_event());
      case SimOp::kSynchronizeDevice: return device_.synchronize_device();
      case SimOp::kCopyToHost: {
        char bytes[16] = {};
        return device_.copy_to_host(bytes, mapped_page(), sizeof bytes);
      }
      case SimOp::kCopyToDevice: {
        const char bytes[16] = {1, 2, 3};
        return device_.copy_to_device(mapped_page(), bytes, sizeof bytes);
      }
      case SimOp::kCount: break;
    }
    return {ErrorCode::kInternal, "no such op"};
  }

  // Set-up calls made by the helpers below, to subtract from the counts.
  std::uint64_t helper_calls(SimOp op) const { return helper_calls_[static_cast<std::size_t>(op)]; }

 private:
  void note(SimOp op, const Status& status) {
    EXPECT_TRUE(status.is_ok()) << status.message();
    ++helper_calls_[static_cast<std::size_t>(op)];
  }
  DevicePtr segment() {
    DevicePtr out = 0;
    note(SimOp::kAllocateSegment, device_.allocate_segment(kPage, 0, &out));
    return out;
  }
  PhysicalHandle physical() {
    PhysicalHandle out = 0;
    note(SimOp::kCreatePhysical, device_.create_physical(kPage, &out));
    return out;
  }
  DevicePtr range() {
    DevicePtr out = 0;
    note(SimOp::kReserveAddress, device_.reserve_address_range(kPage, &out));
    return out;
  }
  EventHandle new_event() {
    EventHandle out = 0;
    note(SimOp::kCreateEvent, device_.create_event(&out));
    return out;
  }
  DevicePtr mapped_page() {
    const DevicePtr base = range();
    const PhysicalHandle handle = physical();
    note(SimOp::kMapPages, device_.map_pages(base, kPage, std::span(&handle, 1)));
    return base;
  }

  SimulatedDevice& device_;
  std::array<std::uint64_t, kSimOpCount> helper_calls_{};
};

TEST(SimOpNames, AreDistinctMethodNames) {
  std::set<std::string> names;
  for (SimOp op : all_ops()) {
    const std::string name(to_string(op));
    EXPECT_NE(name, "unknown_op");
    names.insert(name);
  }
  EXPECT_EQ(names.size(), kSimOpCount);
  EXPECT_EQ(to_string(SimOp::kMapPages), "map_pages");
  EXPECT_EQ(to_string(SimOp::kReserveAddress), "reserve_address_range");
}

TEST(SimulatedCounters, EveryOperationCountsOncePerCall) {
  SimulatedDevice device;
  OpRunner runner(device);
  for (SimOp op : all_ops()) {
    const Status status = runner.run(op);
    EXPECT_TRUE(status.is_ok()) << to_string(op) << ": " << status.message();
  }
  for (SimOp op : all_ops()) {
    EXPECT_EQ(device.call_count(op), 1 + runner.helper_calls(op)) << to_string(op);
  }
  std::uint64_t sum = 0;
  for (SimOp op : all_ops()) sum += device.call_count(op);
  EXPECT_EQ(device.total_call_count(), sum);
}

TEST(SimulatedCounters, FailedCallsCountToo) {
  SimulatedDevice device;
  EXPECT_FALSE(device.release_physical(42).is_ok());
  EXPECT_FALSE(device.free_segment(42, 1, 0).is_ok());
  EXPECT_EQ(device.call_count(SimOp::kReleasePhysical), 1u);
  EXPECT_EQ(device.call_count(SimOp::kFreeSegment), 1u);
}

TEST(SimulatedCounters, StreamControlsAndQueriesAreNotCounted) {
  SimulatedDevice device;
  const StreamHandle s = device.create_stream();
  EXPECT_TRUE(device.pause_stream(s).is_ok());
  EXPECT_TRUE(device.resume_stream(s).is_ok());
  EXPECT_TRUE(device.destroy_stream(s).is_ok());
  (void)device.physical_bytes_in_use();
  (void)device.is_range_accessible(0, 1);
  EXPECT_EQ(device.total_call_count(), 0u);
}

TEST(SimulatedCounters, ResetZeroesCountsButKeepsArmedFaults) {
  SimulatedDevice device;
  std::size_t free_bytes = 0, total = 0;
  device.inject_failure_at(SimOp::kMemoryInfo, 2);
  ASSERT_TRUE(device.memory_info(&free_bytes, &total).is_ok());
  device.reset_call_counts();
  EXPECT_EQ(device.call_count(SimOp::kMemoryInfo), 0u);
  EXPECT_FALSE(device.memory_info(&free_bytes, &total).is_ok());  // still the 2nd call from arming
  EXPECT_EQ(device.injected_failure_count(SimOp::kMemoryInfo), 1u);
  device.reset_call_counts();
  EXPECT_EQ(device.injected_failure_count(SimOp::kMemoryInfo), 0u);
}

TEST(SimulatedCounters, CountIsNotAnOperation) {
  SimulatedDevice device;
  EXPECT_THROW((void)device.call_count(SimOp::kCount), Error);
  EXPECT_THROW(device.inject_failure_at(SimOp::kCount, 1), Error);
  EXPECT_THROW(device.inject_failure_rate(SimOp::kCount, 0.5, 1), Error);
  EXPECT_THROW((void)device.injected_failure_count(SimOp::kCount), Error);
}

TEST(SimulatedFaults, EveryOperationCanBeFailedOnce) {
  for (SimOp op : all_ops()) {
    SimulatedDevice device;
    OpRunner runner(device);
    device.inject_failure_at(op, 1);
    const Status failed = runner.run(op);
    EXPECT_EQ(failed.code(), ErrorCode::kDriverError) << to_string(op);
    EXPECT_TRUE(is_injected(failed)) << failed.message();
    EXPECT_NE(failed.message().find(to_string(op)), std::string::npos) << failed.message();
    EXPECT_EQ(device.injected_failure_count(op), 1u);
    const Status again = runner.run(op);
    EXPECT_TRUE(again.is_ok()) << to_string(op) << ": " << again.message();
    EXPECT_EQ(device.injected_failure_count(op), 1u);
  }
}

TEST(SimulatedFaults, NthCallFromNowWithChosenCode) {
  SimulatedDevice device;
  DevicePtr ptr = 0;
  ASSERT_TRUE(device.allocate_segment(kPage, 0, &ptr).is_ok());  // calls before arming don't count
  device.inject_failure_at(SimOp::kAllocateSegment, 3, ErrorCode::kOutOfMemory);
  EXPECT_TRUE(device.allocate_segment(kPage, 0, &ptr).is_ok());
  EXPECT_TRUE(device.allocate_segment(kPage, 0, &ptr).is_ok());
  const std::size_t in_use = device.physical_bytes_in_use();
  const Status third = device.allocate_segment(kPage, 0, &ptr);
  EXPECT_EQ(third.code(), ErrorCode::kOutOfMemory);
  EXPECT_TRUE(is_injected(third));
  EXPECT_EQ(device.physical_bytes_in_use(), in_use);
  EXPECT_EQ(device.live_segment_count(), 3u);
  EXPECT_TRUE(device.allocate_segment(kPage, 0, &ptr).is_ok());
}

TEST(SimulatedFaults, SeveralArmedCallsAndIndependentOps) {
  SimulatedDevice device;
  std::size_t free_bytes = 0, total = 0;
  device.inject_failure_at(SimOp::kMemoryInfo, 1);
  device.inject_failure_at(SimOp::kMemoryInfo, 3, ErrorCode::kInvalidArgument);
  device.inject_failure_at(SimOp::kMemoryInfo, 3);   // same call: it fails once
  EXPECT_TRUE(device.synchronize_device().is_ok());  // another op is unaffected
  EXPECT_EQ(device.memory_info(&free_bytes, &total).code(), ErrorCode::kDriverError);
  EXPECT_TRUE(device.memory_info(&free_bytes, &total).is_ok());
  EXPECT_EQ(device.memory_info(&free_bytes, &total).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(device.memory_info(&free_bytes, &total).is_ok());
  EXPECT_EQ(device.injected_failure_count(SimOp::kMemoryInfo), 2u);
  EXPECT_EQ(device.injected_failure_count(SimOp::kSynchronizeDevice), 0u);
}

TEST(SimulatedFaults, InjectedMapChangesNothing) {
  SimulatedDevice device;
  DevicePtr base = 0;
  ASSERT_TRUE(device.reserve_address_range(4 * kPage, &base).is_ok());
  std::vector<PhysicalHandle> pages(2);
  for (auto& page : pages) ASSERT_TRUE(device.create_physical(kPage, &page).is_ok());
  device.inject_failure_at(SimOp::kMapPages, 1);
  EXPECT_TRUE(is_injected(device.map_pages(base, kPage, pages)));
  EXPECT_EQ(device.mapped_bytes(), 0u);
  EXPECT_FALSE(device.is_range_accessible(base, 1));
  ASSERT_TRUE(device.map_pages(base, kPage, pages).is_ok());
  device.inject_failure_at(SimOp::kUnmapPages, 1);
  EXPECT_TRUE(is_injected(device.unmap_pages(base, kPage, 2)));
  EXPECT_EQ(device.mapped_bytes(), 2 * kPage);
  EXPECT_TRUE(device.is_range_accessible(base, 2 * kPage));
}

TEST(SimulatedFaults, InjectedFreesAndReleasesChangeNothing) {
  SimulatedDevice device;
  DevicePtr segment = 0, range = 0;
  PhysicalHandle page = 0;
  EventHandle event = 0;
  ASSERT_TRUE(device.allocate_segment(kPage, 0, &segment).is_ok());
  ASSERT_TRUE(device.reserve_address_range(kPage, &range).is_ok());
  ASSERT_TRUE(device.create_physical(kPage, &page).is_ok());
  ASSERT_TRUE(device.create_event(&event).is_ok());
  for (SimOp op :
       {SimOp::kFreeSegment, SimOp::kFreeAddress, SimOp::kReleasePhysical, SimOp::kDestroyEvent}) {
    device.inject_failure_at(op, 1);
  }
  EXPECT_TRUE(is_injected(device.free_segment(segment, kPage, 0)));
  EXPECT_TRUE(is_injected(device.free_address_range(range, kPage)));
  EXPECT_TRUE(is_injected(device.release_physical(page)));
  EXPECT_TRUE(is_injected(device.destroy_event(event)));
  EXPECT_EQ(device.live_segment_count(), 1u);
  EXPECT_EQ(device.live_address_range_count(), 1u);
  EXPECT_EQ(device.live_physical_handle_count(), 1u);
  EXPECT_EQ(device.live_event_count(), 1u);
  EXPECT_TRUE(device.is_range_accessible(segment, kPage));
}

TEST(SimulatedFaults, InjectedEventCallsLeaveStreamsAlone) {
  SimulatedDevice device;
  const StreamHandle s = device.create_stream();
  ASSERT_TRUE(device.pause_stream(s).is_ok());
  EventHandle e = 0, other = 0;
  ASSERT_TRUE(device.create_event(&e).is_ok());
  ASSERT_TRUE(device.create_event(&other).is_ok());
  ASSERT_TRUE(device.record_event(e, s).is_ok());

  device.inject_failure_at(SimOp::kRecordEvent, 1);
  EXPECT_TRUE(is_injected(device.record_event(e, 0)));  // e keeps its old, pending target
  device.inject_failure_at(SimOp::kSynchronizeEvent, 1);
  EXPECT_TRUE(is_injected(device.synchronize_event(e)));
  device.inject_failure_at(SimOp::kSynchronizeDevice, 1);
  EXPECT_TRUE(is_injected(device.synchronize_device()));
  device.inject_failure_at(SimOp::kStreamWaitEvent, 1);
  EXPECT_TRUE(is_injected(device.stream_wait_event(0, e)));
  ASSERT_TRUE(device.record_event(other, 0).is_ok());  // stream 0 did not start waiting

  EventState state = EventState::kComplete;
  ASSERT_TRUE(device.query_event(e, &state).is_ok());
  EXPECT_EQ(state, EventState::kPending);
  ASSERT_TRUE(device.query_event(other, &state).is_ok());
  EXPECT_EQ(state, EventState::kComplete);
  device.inject_failure_at(SimOp::kQueryEvent, 1);
  EXPECT_TRUE(is_injected(device.query_event(e, &state)));
}

TEST(SimulatedFaults, RateExtremes) {
  SimulatedDevice device;
  std::size_t free_bytes = 0, total = 0;
  device.inject_failure_rate(SimOp::kMemoryInfo, 0.0, 1);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(device.memory_info(&free_bytes, &total).is_ok());
  device.inject_failure_rate(SimOp::kMemoryInfo, 1.0, 1, ErrorCode::kOutOfMemory);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(device.memory_info(&free_bytes, &total).code(), ErrorCode::kOutOfMemory);
  }
  EXPECT_EQ(device.injected_failure_count(SimOp::kMemoryInfo), 1000u);
}

std::vector<bool> failure_pattern(double fraction, std::uint64_t seed, int calls) {
  SimulatedDevice device;
  device.inject_failure_rate(SimOp::kQueryEvent, fraction, seed);
  EventHandle e = 0;
  EXPECT_TRUE(device.create_event(&e).is_ok());
  std::vector<bool> failed;
  EventState state = EventState::kComplete;
  for (int i = 0; i < calls; ++i) failed.push_back(!device.query_event(e, &state).is_ok());
  return failed;
}

TEST(SimulatedFaults, RateIsReproducibleAndRoughlyRight) {
  const int calls = 20000;
  const std::vector<bool> first = failure_pattern(0.25, 7, calls);
  EXPECT_EQ(first, failure_pattern(0.25, 7, calls));
  EXPECT_NE(first, failure_pattern(0.25, 8, calls));
  const auto failures = static_cast<double>(std::count(first.begin(), first.end(), true));
  // Binomial: mean 5000, sd ~61; allow 6 sd.
  EXPECT_NEAR(failures, 0.25 * calls, 6 * std::sqrt(calls * 0.25 * 0.75));
}

TEST(SimulatedFaults, RateOfOneOpLeavesOthersAndClearStops) {
  SimulatedDevice device;
  device.inject_failure_rate(SimOp::kCreateEvent, 1.0, 3);
  device.inject_failure_at(SimOp::kMemoryInfo, 1);
  EventHandle e = 0;
  EXPECT_FALSE(device.create_event(&e).is_ok());
  EXPECT_TRUE(device.synchronize_device().is_ok());
  device.clear_faults();
  EXPECT_TRUE(device.create_event(&e).is_ok());
  std::size_t free_bytes = 0, total = 0;
  EXPECT_TRUE(device.memory_info(&free_bytes, &total).is_ok());       // one-shot disarmed too
  EXPECT_EQ(device.injected_failure_count(SimOp::kCreateEvent), 1u);  // counts kept
}

TEST(SimulatedFaults, ArmingRejectsNonsense) {
  SimulatedDevice device;
  EXPECT_THROW(device.inject_failure_at(SimOp::kMapPages, 0), Error);
  EXPECT_THROW(device.inject_failure_at(SimOp::kMapPages, 1, ErrorCode::kOk), Error);
  EXPECT_THROW(device.inject_failure_rate(SimOp::kMapPages, -0.1, 1), Error);
  EXPECT_THROW(device.inject_failure_rate(SimOp::kMapPages, 1.5, 1), Error);
  EXPECT_THROW(device.inject_failure_rate(SimOp::kMapPages, std::nan(""), 1), Error);
  EXPECT_THROW(device.inject_failure_rate(SimOp::kMapPages, 0.5, 1, ErrorCode::kOk), Error);
}

}  // namespace
}  // namespace vramledger
