// Bad input to the policy and the configuration parser: each case must end in a clear error (the
// right ErrorCode and words a user can act on) and leave the allocator exactly as it was.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/config.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "tests/stress/allocator_state.hpp"

namespace vramledger::stress {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

enum class Heap { kSegment, kPaged };

class BadInput : public testing::TestWithParam<Heap> {
 protected:
  BadInput() : device_(device_options()) {
    allocator_ = std::make_unique<CachingAllocator>(device_, &ledger_, AllocatorOptions{});
    // Some state worth protecting: live blocks in both pools, a cached free block, two streams.
    side_ = device_.create_stream();
    small_ = allocator_->allocate(4096, 0);
    large_ = allocator_->allocate(30 * kMiB, 0);
    on_side_ = allocator_->allocate(3 * kMiB, side_);
    const DevicePtr cached = allocator_->allocate(5 * kMiB, 0);
    allocator_->deallocate(cached);
  }

  SimulatedDeviceOptions device_options() const {
    SimulatedDeviceOptions options;
    options.capacity_bytes = 8 * kGiB;
    options.supports_virtual_memory = GetParam() == Heap::kPaged;
    return options;
  }

  AllocatorState state() const { return AllocatorState::take(*allocator_, ledger_, device_); }

  void expect_consistent() const {
    const ConsistencyReport report = check_consistency(ledger_, allocator_->census());
    EXPECT_TRUE(report.ok()) << report.to_string();
  }

  // Runs `action`, which must throw Error with `code` and a message containing `words`, and
  // checks that nothing observable changed.
  void expect_refused(const std::function<void()>& action, ErrorCode code,
                      const std::string& words) {
    const AllocatorState before = state();
    try {
      action();
      ADD_FAILURE() << "accepted; expected " << to_string(code) << " mentioning '" << words << "'";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), code) << error.what();
      EXPECT_NE(std::string(error.what()).find(words), std::string::npos)
          << "message lacks '" << words << "': " << error.what();
    }
    EXPECT_EQ(differences(before, state()), "");
    expect_consistent();
  }

  SimulatedDevice device_;
  Ledger ledger_;
  std::unique_ptr<CachingAllocator> allocator_;
  StreamHandle side_ = 0;
  DevicePtr small_ = 0, large_ = 0, on_side_ = 0;
};

TEST_P(BadInput, ForeignPointers) {
  for (DevicePtr foreign : {DevicePtr{0}, DevicePtr{0x1234000}, ~DevicePtr{0}}) {
    SCOPED_TRACE(foreign);
    expect_refused([&] { allocator_->deallocate(foreign); }, ErrorCode::kInvalidPointer,
                   "not allocated by vramledger");
    expect_refused([&] { allocator_->record_stream(foreign, side_); },
                   ErrorCode::kInvalidPointer, "not allocated by vramledger");
    expect_refused([&] { (void)allocator_->describe(foreign); }, ErrorCode::kInvalidPointer,
                   "not inside a live vramledger allocation");
    EXPECT_FALSE(allocator_->owns(foreign));
  }
}

TEST_P(BadInput, PointerInsideABlock) {
  expect_refused([&] { allocator_->deallocate(large_ + 512); }, ErrorCode::kInvalidPointer,
                 "not its start");
  // describe() accepts interior pointers on purpose (it answers "which block is this in?").
  EXPECT_EQ(allocator_->describe(large_ + 512).base, large_);
}

TEST_P(BadInput, DoubleFree) {
  allocator_->deallocate(small_);
  expect_refused([&] { allocator_->deallocate(small_); }, ErrorCode::kDoubleFree,
                 "already freed");
  expect_refused([&] { allocator_->record_stream(small_, side_); }, ErrorCode::kDoubleFree,
                 "already freed");
}

TEST_P(BadInput, DoubleFreeWhileTheFirstFreeWaitsForAnotherStream) {
  allocator_->record_stream(large_, side_);
  ASSERT_TRUE(device_.pause_stream(side_));
  allocator_->deallocate(large_);  // pending: side_ has not reached the free yet
  expect_refused([&] { allocator_->deallocate(large_); }, ErrorCode::kDoubleFree,
                 "waits for other streams");
  ASSERT_TRUE(device_.resume_stream(side_));
  allocator_->process_completed_frees();
  expect_refused([&] { allocator_->deallocate(large_); }, ErrorCode::kDoubleFree,
                 "already freed");
}

TEST_P(BadInput, ZeroBytes) {
  expect_refused([&] { allocator_->allocate(0, 0); }, ErrorCode::kInvalidArgument, "0 bytes");
}

TEST_P(BadInput, OverflowingSizes) {
  for (std::size_t bytes : {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX - 511, SIZE_MAX / 2 + 1}) {
    SCOPED_TRACE(bytes);
    expect_refused([&] { allocator_->allocate(bytes, 0); }, ErrorCode::kInvalidArgument,
                   "largest supported size");
  }
}

TEST_P(BadInput, LargerThanTheDevice) {
  // Out of memory releases the cache before it gives up (torch does the same), so only the live
  // blocks must be untouched here; the refusal itself is counted.
  const AllocatorState before = state();
  try {
    allocator_->allocate(9 * kGiB, side_);
    ADD_FAILURE() << "a request larger than the device succeeded";
  } catch (const OutOfMemoryError& error) {
    EXPECT_EQ(error.code(), ErrorCode::kOutOfMemory);
    const std::string text = error.what();
    EXPECT_NE(text.find("tried to allocate"), std::string::npos) << text;
    EXPECT_NE(text.find("9.00 GiB"), std::string::npos) << text;
  }
  const AllocatorState after = state();
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(after.census.pools[p].allocation, before.census.pools[p].allocation);
    EXPECT_EQ(after.census.pools[p].allocated_bytes, before.census.pools[p].allocated_bytes);
    EXPECT_EQ(after.census.pools[p].requested_bytes, before.census.pools[p].requested_bytes);
    EXPECT_EQ(after.census.pools[p].active_bytes, before.census.pools[p].active_bytes);
  }
  EXPECT_EQ(after.counters.num_ooms, before.counters.num_ooms + 1);
  expect_consistent();
  for (DevicePtr live : {small_, large_, on_side_}) {
    EXPECT_TRUE(allocator_->owns(live));
    EXPECT_TRUE(device_.is_range_accessible(live, allocator_->describe(live).size));
  }
}

TEST_P(BadInput, FreeOfABlockWhoseStreamWasDestroyed) {
  // Freeing needs no event on the block's own stream, so this is not an error: the block goes
  // back to that stream's cache, and release_stream returns the cache to the device.
  ASSERT_TRUE(device_.destroy_stream(side_));
  allocator_->deallocate(on_side_);
  expect_consistent();
  EXPECT_FALSE(allocator_->owns(on_side_));
  auto reserved = [&] {
    const BlockCensus census = allocator_->census();
    return census.pools[0].reserved_bytes + census.pools[1].reserved_bytes;
  };
  const std::int64_t reserved_before = reserved();
  allocator_->release_stream(side_);
  expect_consistent();
  EXPECT_LT(reserved(), reserved_before);
}

TEST_P(BadInput, AllocationOnADestroyedStream) {
  // The allocator cannot tell a destroyed stream from a live one: a request its cache (or the
  // paged heap's address space) can serve succeeds, one that needs a new segment is refused by
  // the device with kInvalidStream. Either way the books stay exact and release_stream gives
  // everything back.
  ASSERT_TRUE(device_.destroy_stream(side_));
  allocator_->deallocate(on_side_);
  const AllocatorState before = state();
  try {
    const DevicePtr p = allocator_->allocate(2 * kMiB, side_);
    allocator_->deallocate(p);
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidStream) << error.what();
    EXPECT_NE(std::string(error.what()).find("destroyed"), std::string::npos) << error.what();
    EXPECT_EQ(differences(before, state()), "");
  }
  expect_consistent();
  allocator_->release_stream(side_);
  expect_consistent();
  allocator_->deallocate(small_);
  allocator_->deallocate(large_);
  allocator_->empty_cache();
  EXPECT_EQ(device_.physical_bytes_in_use(), 0u);
}

TEST_P(BadInput, FreeWithAUseOnADestroyedStream) {
  allocator_->record_stream(large_, side_);
  ASSERT_TRUE(device_.destroy_stream(side_));
  expect_refused([&] { allocator_->deallocate(large_); }, ErrorCode::kInvalidStream,
                 "release_stream");
  EXPECT_TRUE(allocator_->owns(large_));
  allocator_->release_stream(side_);
  allocator_->deallocate(large_);
  EXPECT_FALSE(allocator_->owns(large_));
  expect_consistent();
}

TEST_P(BadInput, EverythingIsReturnedAfterTheRefusals) {
  allocator_->deallocate(small_);
  expect_refused([&] { allocator_->deallocate(small_); }, ErrorCode::kDoubleFree, "freed");
  allocator_->deallocate(large_);
  allocator_->deallocate(on_side_);
  allocator_->empty_cache();
  expect_consistent();
  EXPECT_EQ(device_.physical_bytes_in_use(), 0u);
  allocator_.reset();
  EXPECT_EQ(device_.physical_bytes_in_use(), 0u);
  EXPECT_EQ(device_.reserved_address_bytes(), 0u);
  EXPECT_EQ(device_.live_event_count(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Heaps, BadInput, testing::Values(Heap::kSegment, Heap::kPaged),
                         [](const testing::TestParamInfo<Heap>& info) {
                           return info.param == Heap::kPaged ? "paged" : "segment";
                         });

// --- Configuration strings -----------------------------------------------------------------

struct MalformedConfig {
  const char* text;
  const char* words;  // the message must name what is wrong
};

class MalformedConfiguration : public testing::TestWithParam<MalformedConfig> {};

TEST_P(MalformedConfiguration, IsRefusedNamingTheProblem) {
  try {
    (void)parse_config(GetParam().text);
    ADD_FAILURE() << "accepted '" << GetParam().text << "'";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    EXPECT_NE(std::string(error.what()).find(GetParam().words), std::string::npos)
        << "message for '" << GetParam().text << "' lacks '" << GetParam().words
        << "': " << error.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Strings, MalformedConfiguration,
    testing::Values(MalformedConfig{"no_such_key:1", "no_such_key"},
                    MalformedConfig{"round_bytes", "round_bytes"},
                    MalformedConfig{"round_bytes:", "round_bytes"},
                    MalformedConfig{":512", "512"},
                    MalformedConfig{"round_bytes:abc", "abc"},
                    MalformedConfig{"round_bytes:-512", "-512"},
                    MalformedConfig{"round_bytes:3", "power of two"},
                    MalformedConfig{"round_bytes:0", "round_bytes"},
                    MalformedConfig{"round_bytes:512,round_bytes:1024", "round_bytes"},
                    MalformedConfig{"cap_mb:10,cap_gb:1", "cap_"},
                    MalformedConfig{"cap_gb:99999999999999999999999", "99999999999999999999999"},
                    // Fits in 64 bits as a number, overflows once multiplied by the unit.
                    MalformedConfig{"cap_mb:18446744073709551615", "cap_mb"},
                    MalformedConfig{"span_gb:17179869184", "span_gb"},
                    MalformedConfig{"backend:tpu", "tpu"},
                    MalformedConfig{"paged_heap:maybe", "maybe"},
                    MalformedConfig{"small_segment_mb:0", "small_segment_mb"},
                    MalformedConfig{"round_bytes:5 12", "5 12"},
                    MalformedConfig{"round_bytes=512", "round_bytes=512"},
                    MalformedConfig{"round_bytes:512;cap_mb:1", "512;cap_mb:1"},
                    MalformedConfig{"round_bytes:1.5", "1.5"},
                    MalformedConfig{"round_bytes:0x200", "0x200"}));

TEST(WellFormedConfiguration, BlankMeansDefaultsAndWhitespaceIsIgnored) {
  const Config blank = parse_config("  ");
  EXPECT_EQ(blank.backend, "auto");
  const Config spaced = parse_config(" round_bytes : 1024 , cap_mb:64 ");
  EXPECT_EQ(spaced.options.round_bytes, 1024u);
  EXPECT_EQ(spaced.options.cap_bytes, 64 * kMiB);
}

}  // namespace
}  // namespace vramledger::stress
