// Sleep and wake of a whole pool (issue 17, docs/sleep.md: CUDA graph private pools) on the
// simulated device: the segment heap over SleepableSegmentBackend, shaped as a graph's capture
// leaves it (outputs kept, intermediates freed). Every segment's memory goes back, addresses
// stay, offloaded outputs come back bitwise; misuse is refused with nothing changed; a wake on
// a full device fails cleanly and works later; a failed unmap leaves the pool asleep with its
// bytes resident; the ledger agrees with the census and the device throughout.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "accounting/memory_breakdown.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "allocator/sleepable_segment_backend.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

AllocatorOptions segment_heap() {
  AllocatorOptions options;
  options.use_paged_heap = false;
  return options;
}

std::string message_of(const std::function<void()>& call, ErrorCode* code = nullptr) {
  try {
    call();
  } catch (const Error& error) {
    if (code != nullptr) *code = error.code();
    return error.what();
  }
  return "no error";
}

class PoolSleep : public testing::Test {
 protected:
  PoolSleep()
      : device_(options()), segments_(device_), pool_(segments_, &ledger_, segment_heap()) {}
  static SimulatedDeviceOptions options() {
    SimulatedDeviceOptions o;
    o.capacity_bytes = 256 * kMiB;
    o.supports_virtual_memory = true;
    return o;
  }
  void expect_consistent(const char* where) {
    const BlockCensus census = pool_.census();
    const ConsistencyReport report = check_consistency(ledger_, census);
    EXPECT_TRUE(report.ok()) << where << ": " << report.to_string();
    const MemoryBreakdown lines = compute_breakdown(ledger_.counters().aggregate());
    EXPECT_TRUE(lines.all_lines_non_negative()) << where;
    EXPECT_EQ(lines.sum(), lines.reserved) << where;
    EXPECT_EQ(static_cast<std::int64_t>(device_.physical_bytes_in_use()) - filler_bytes_,
              census.pools[0].reserved_bytes + census.pools[1].reserved_bytes)
        << where << ": the device holds what the census says";
  }
  void fill(DevicePtr ptr, std::size_t bytes, std::uint8_t seed) {
    std::vector<std::uint8_t> data(bytes);
    for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<std::uint8_t>(seed + i * 7);
    ASSERT_TRUE(device_.write_bytes(ptr, data.data(), bytes).is_ok());
  }
  bool holds(DevicePtr ptr, std::size_t bytes, std::uint8_t seed) {
    std::vector<std::uint8_t> data(bytes);
    if (!device_.read_bytes(ptr, data.data(), bytes).is_ok()) return false;
    for (std::size_t i = 0; i < bytes; ++i) {
      if (data[i] != static_cast<std::uint8_t>(seed + i * 7)) return false;
    }
    return true;
  }
  // What a capture leaves: outputs kept (filled), intermediates freed, small and large pools.
  void capture() {
    for (std::size_t bytes : {std::size_t{4096}, 3 * kMiB, 200 * std::size_t{1024}, 24 * kMiB}) {
      outputs_.push_back(pool_.allocate(bytes, 0));
      sizes_.push_back(bytes);
      fill(outputs_.back(), bytes, static_cast<std::uint8_t>(outputs_.size()));
      pool_.deallocate(pool_.allocate(bytes + 1024, 0));  // an intermediate, free now
    }
  }
  const PoolCounters& all() { counters_ = ledger_.counters(); return counters_.aggregate(); }

  SimulatedDevice device_;
  Ledger ledger_;
  SleepableSegmentBackend segments_;
  CachingAllocator pool_;
  std::vector<DevicePtr> outputs_;
  std::vector<std::size_t> sizes_;
  std::int64_t filler_bytes_ = 0;  // held by another allocator in a test
  LedgerCounters counters_;
};

TEST_F(PoolSleep, EverySegmentGivesItsMemoryBackAndOffloadedOutputsComeBackBitwise) {
  capture();
  expect_consistent("captured");
  const BlockCensus before = pool_.census();
  const std::int64_t reserved = all().reserved_bytes.current;
  const std::int64_t allocated = all().allocated_bytes.current;
  const std::int64_t segments = all().segment.current;
  ASSERT_GT(all().inactive_split_bytes.current, 0) << "the intermediates split their segments";
  ASSERT_EQ(static_cast<std::int64_t>(device_.physical_bytes_in_use()), reserved);

  const SleepResult slept = pool_.sleep_pool(/*offload=*/true);
  EXPECT_TRUE(pool_.pool_asleep());
  EXPECT_EQ(slept.blocks, outputs_.size());
  EXPECT_EQ(static_cast<std::int64_t>(slept.bytes), allocated);
  EXPECT_EQ(static_cast<std::int64_t>(slept.offloaded_bytes), allocated);
  EXPECT_EQ(static_cast<std::int64_t>(slept.released_bytes), reserved);
  EXPECT_EQ(slept.resident_bytes, 0u);
  EXPECT_EQ(device_.physical_bytes_in_use(), 0u) << "free blocks' memory went back too";
  EXPECT_EQ(segments_.released_count(), segments_.segment_count());
  for (DevicePtr ptr : outputs_) EXPECT_FALSE(device_.is_range_accessible(ptr, 1));
  EXPECT_EQ(all().reserved_bytes.current, 0);
  EXPECT_EQ(all().segment.current, segments) << "a sleeping segment keeps its address";
  EXPECT_EQ(all().sleeping_bytes.current, allocated);
  EXPECT_EQ(all().allocated_bytes.current, 0);
  EXPECT_EQ(all().inactive_split_bytes.current, 0) << "no memory, no fragmentation";
  expect_consistent("asleep");

  const SleepResult woken = pool_.wake_pool();
  EXPECT_FALSE(pool_.pool_asleep());
  EXPECT_EQ(woken.blocks, outputs_.size());
  EXPECT_EQ(static_cast<std::int64_t>(woken.mapped_bytes), reserved);
  EXPECT_EQ(static_cast<std::int64_t>(woken.offloaded_bytes), allocated);
  for (std::size_t i = 0; i < outputs_.size(); ++i) {
    EXPECT_TRUE(holds(outputs_[i], sizes_[i], static_cast<std::uint8_t>(i + 1))) << i;
  }
  expect_consistent("awake");
  const BlockCensus after = pool_.census();
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(after.pools[p].reserved_bytes, before.pools[p].reserved_bytes);
    EXPECT_EQ(after.pools[p].allocated_bytes, before.pools[p].allocated_bytes);
    EXPECT_EQ(after.pools[p].inactive_split_bytes, before.pools[p].inactive_split_bytes);
    EXPECT_EQ(after.pools[p].free_bytes, before.pools[p].free_bytes);
  }
  // The pool works as before: blocks freed, reused, given back whole.
  for (DevicePtr ptr : outputs_) pool_.deallocate(ptr);
  pool_.empty_cache();
  EXPECT_EQ(device_.physical_bytes_in_use(), 0u);
  EXPECT_EQ(segments_.segment_count(), 0u);
  EXPECT_EQ(device_.reserved_address_bytes(), 0u);
  expect_consistent("emptied");
}

TEST_F(PoolSleep, WithoutOffloadTheAddressesComeBackUsable) {
  capture();
  const SleepResult slept = pool_.sleep_pool(/*offload=*/false);
  EXPECT_EQ(slept.offloaded_bytes, 0u);
  EXPECT_EQ(pool_.kept_sleep_host_bytes(), 0u);
  expect_consistent("asleep");
  const SleepResult woken = pool_.wake_pool();
  EXPECT_EQ(woken.offloaded_bytes, 0u);
  for (std::size_t i = 0; i < outputs_.size(); ++i) {
    EXPECT_TRUE(device_.is_range_accessible(outputs_[i], sizes_[i]));
    fill(outputs_[i], sizes_[i], 5);  // a replay rewrites them
  }
  expect_consistent("awake");
}

TEST_F(PoolSleep, MisuseIsRefusedWithNothingChanged) {
  capture();
  const StreamHandle side = device_.create_stream();
  device_.set_capture_underway(true);
  EXPECT_NE(message_of([&] { pool_.sleep_pool(); }).find("capture is underway"),
            std::string::npos);
  device_.set_capture_underway(false);
  EXPECT_FALSE(pool_.pool_asleep());
  ErrorCode code = ErrorCode::kOk;
  EXPECT_NE(message_of([&] { pool_.wake_pool(); }, &code).find("not asleep"), std::string::npos);
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);

  // A block freed while another stream still uses it: the sleep waits for the device, so the
  // free completes first and the block does not sleep.
  const DevicePtr shared = pool_.allocate(8192, 0);
  pool_.record_stream(shared, side);
  ASSERT_TRUE(device_.pause_stream(side).is_ok());
  pool_.deallocate(shared);
  EXPECT_EQ(all().active.current, all().allocation.current + 1) << "pending";
  expect_consistent("pending free");

  const SleepResult slept = pool_.sleep_pool();
  EXPECT_EQ(slept.blocks, outputs_.size());
  EXPECT_FALSE(pool_.owns(shared));
  EXPECT_EQ(all().active.current, 0);
  EXPECT_NE(message_of([&] { pool_.sleep_pool(); }).find("asleep already"), std::string::npos);
  EXPECT_NE(message_of([&] { pool_.allocate(4096, 0); }).find("asleep"), std::string::npos);
  EXPECT_NE(message_of([&] { pool_.deallocate(outputs_[0]); }).find("asleep"), std::string::npos);
  EXPECT_NE(message_of([&] { pool_.record_stream(outputs_[1], side); }).find("asleep"),
            std::string::npos);
  EXPECT_TRUE(pool_.is_asleep(outputs_[0]));
  pool_.empty_cache();  // keeps every sleeping segment's address
  EXPECT_EQ(segments_.released_count(), segments_.segment_count());
  expect_consistent("asleep");
  pool_.wake_pool();
  EXPECT_NE(message_of([&] { pool_.wake_pool(); }).find("woken already"), std::string::npos);
  expect_consistent("awake");
}

TEST_F(PoolSleep, PlainSegmentsAndThePagedHeapRefuseAndChangeNothing) {
  SimulatedDevice device(options());
  Ledger ledger;
  CachingAllocator plain(device, &ledger, segment_heap());  // cudaMalloc-like segments
  const DevicePtr kept = plain.allocate(3 * kMiB, 0);
  ErrorCode code = ErrorCode::kOk;
  EXPECT_NE(message_of([&] { plain.sleep_pool(true); }, &code).find("nothing was changed"),
            std::string::npos);
  EXPECT_EQ(code, ErrorCode::kNotSupported);
  EXPECT_FALSE(plain.pool_asleep());
  EXPECT_EQ(plain.kept_sleep_host_bytes(), 3 * kMiB) << "the offload buffer is kept for later";
  EXPECT_TRUE(check_consistency(ledger, plain.census()).ok());
  plain.deallocate(kept);

  CachingAllocator paged(device, &ledger);
  code = ErrorCode::kOk;
  EXPECT_NE(message_of([&] { paged.sleep_pool(); }, &code).find("by tag"), std::string::npos);
  EXPECT_EQ(code, ErrorCode::kNotSupported);
}

TEST_F(PoolSleep, AWakeOnAFullDeviceFailsCleanlyAndWorksLater) {
  capture();
  const std::int64_t reserved = all().reserved_bytes.current;
  pool_.sleep_pool(/*offload=*/true);
  // Another user takes the device meanwhile.
  Ledger other_ledger;
  CachingAllocator other(device_, &other_ledger, segment_heap());
  const DevicePtr filler = other.allocate(256 * kMiB - 8 * kMiB, 0);
  filler_bytes_ = static_cast<std::int64_t>(device_.physical_bytes_in_use());
  expect_consistent("filled");
  std::string message;
  try {
    pool_.wake_pool();
  } catch (const OutOfMemoryError& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("Nothing is lost"), std::string::npos) << message;
  EXPECT_TRUE(pool_.pool_asleep());
  EXPECT_EQ(all().reserved_bytes.current, 0);
  EXPECT_EQ(static_cast<std::int64_t>(device_.physical_bytes_in_use()), filler_bytes_)
      << "what the failed wake mapped went back";
  expect_consistent("wake failed");

  other.deallocate(filler);
  other.empty_cache();
  filler_bytes_ = 0;
  pool_.wake_pool();
  EXPECT_EQ(all().reserved_bytes.current, reserved);
  for (std::size_t i = 0; i < outputs_.size(); ++i) {
    EXPECT_TRUE(holds(outputs_[i], sizes_[i], static_cast<std::uint8_t>(i + 1))) << i;
  }
  expect_consistent("woken later");
}

TEST_F(PoolSleep, AFailedUnmapLeavesThePoolAsleepWithItsBytesResident) {
  capture();
  const std::size_t segments = segments_.segment_count();
  ASSERT_GE(segments, 3u);
  device_.inject_failure_at(SimOp::kUnmapPages, 2);
  std::string message;
  try {
    pool_.sleep_pool(/*offload=*/false);
  } catch (const Error& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("nothing is lost"), std::string::npos) << message;
  EXPECT_TRUE(pool_.pool_asleep());
  EXPECT_EQ(segments_.released_count(), 1u);
  EXPECT_GT(all().sleeping_resident_bytes.current, 0) << "blocks on segments still mapped";
  expect_consistent("partly asleep");
  pool_.wake_pool();
  EXPECT_EQ(segments_.released_count(), 0u);
  EXPECT_EQ(all().sleeping_resident_bytes.current, 0);
  expect_consistent("awake");

  // The first release failing changes nothing at all.
  device_.inject_failure_at(SimOp::kUnmapPages, 1);
  ErrorCode code = ErrorCode::kOk;
  EXPECT_NE(message_of([&] { pool_.sleep_pool(true); }, &code).find("nothing was changed"),
            std::string::npos);
  EXPECT_FALSE(pool_.pool_asleep());
  expect_consistent("refused");
}

}  // namespace
}  // namespace vramledger
