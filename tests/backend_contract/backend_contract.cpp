// The DeviceBackend contract (backend_contract.hpp): these tests run for every backend a binary
// instantiates them with.
#include "tests/backend_contract/backend_contract.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

namespace vramledger::contract {

constexpr std::size_t kMiB = std::size_t{1} << 20;

#define VRAMLEDGER_EXPECT_OK(expr)                                   \
  do {                                                               \
    const ::vramledger::Status status_ = (expr);                     \
    ASSERT_TRUE(status_.is_ok()) << #expr ": " << status_.message(); \
  } while (false)

void BackendContractTest::SetUp() {
  std::string why_skipped;
  fixture_ = GetParam().make(&why_skipped);
  if (fixture_ == nullptr) GTEST_SKIP() << GetParam().name << ": " << why_skipped;
}

std::string backend_name(const ::testing::TestParamInfo<BackendUnderTest>& info) {
  return info.param.name;
}

TEST_P(BackendContractTest, DescribesItself) {
  const BackendInfo& info = backend().info();
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.total_bytes, 0u);
  ASSERT_GT(info.granularity, 0u);
  EXPECT_EQ(info.granularity & (info.granularity - 1), 0u) << "granularity is a power of two";
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  VRAMLEDGER_EXPECT_OK(backend().memory_info(&free_bytes, &total_bytes));
  EXPECT_EQ(total_bytes, info.total_bytes);
  EXPECT_LE(free_bytes, total_bytes);
}

TEST_P(BackendContractTest, SegmentsAreDistinctAlignedAndGoBack) {
  const std::array<std::size_t, 6> sizes = {1, 512, 4097, kMiB, 2 * kMiB + 8, 64 * kMiB};
  std::vector<std::pair<DevicePtr, std::size_t>> segments;
  for (std::size_t size : sizes) {
    DevicePtr ptr = 0;
    VRAMLEDGER_EXPECT_OK(backend().allocate_segment(size, stream(), &ptr));
    EXPECT_NE(ptr, 0u);
    EXPECT_EQ(ptr % 256, 0u) << "segments are at least 256-byte aligned";
    segments.emplace_back(ptr, size);
  }
  auto sorted = segments;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    EXPECT_LE(sorted[i - 1].first + sorted[i - 1].second, sorted[i].first) << "overlap";
  }
  for (const auto& [ptr, size] : segments) {
    VRAMLEDGER_EXPECT_OK(backend().free_segment(ptr, size, stream()));
  }
  VRAMLEDGER_EXPECT_OK(backend().synchronize_device());
}

TEST_P(BackendContractTest, LackOfMemoryIsAStatusThatDoesNotStick) {
  const std::size_t granularity = backend().info().granularity;
  const std::size_t too_much =
      (2 * backend().info().total_bytes + granularity - 1) / granularity * granularity;
  DevicePtr ptr = 0;
  const Status refused = backend().allocate_segment(too_much, stream(), &ptr);
  EXPECT_EQ(refused.code(), ErrorCode::kOutOfMemory) << refused.message();
  EXPECT_FALSE(refused.message().empty()) << "a failure says what failed";
  // Nothing changed and nothing sticks: memory is still there for a request that fits.
  VRAMLEDGER_EXPECT_OK(backend().allocate_segment(kMiB, stream(), &ptr));
  VRAMLEDGER_EXPECT_OK(backend().free_segment(ptr, kMiB, stream()));
}

TEST_P(BackendContractTest, EventsAreRecordedWaitedForAndDestroyed) {
  EventHandle event = 0;
  VRAMLEDGER_EXPECT_OK(backend().create_event(&event));
  VRAMLEDGER_EXPECT_OK(backend().record_event(event, stream()));
  VRAMLEDGER_EXPECT_OK(backend().stream_wait_event(stream(), event));
  VRAMLEDGER_EXPECT_OK(backend().synchronize_event(event));
  EventState state = EventState::kPending;
  VRAMLEDGER_EXPECT_OK(backend().query_event(event, &state));
  EXPECT_EQ(state, EventState::kComplete) << "complete once synchronized";
  // Recording again re-arms the same event.
  VRAMLEDGER_EXPECT_OK(backend().record_event(event, stream()));
  VRAMLEDGER_EXPECT_OK(backend().synchronize_device());
  VRAMLEDGER_EXPECT_OK(backend().query_event(event, &state));
  EXPECT_EQ(state, EventState::kComplete) << "complete once the device is synchronized";
  VRAMLEDGER_EXPECT_OK(backend().destroy_event(event));
}

TEST_P(BackendContractTest, VirtualMemoryWorksAsASetOrNotAtAll) {
  const std::size_t page = backend().info().granularity;
  PhysicalHandle handle = 0;
  DevicePtr base = 0;
  if (!backend().info().supports_virtual_memory) {
    EXPECT_EQ(backend().create_physical(page, &handle).code(), ErrorCode::kNotSupported);
    EXPECT_EQ(backend().reserve_address_range(4 * page, &base).code(), ErrorCode::kNotSupported);
    return;
  }
  VRAMLEDGER_EXPECT_OK(backend().create_physical(page, &handle));
  VRAMLEDGER_EXPECT_OK(backend().reserve_address_range(4 * page, &base));
  EXPECT_EQ(base % page, 0u) << "address ranges are aligned to the granularity";
  const std::array<PhysicalHandle, 1> handles = {handle};
  VRAMLEDGER_EXPECT_OK(backend().map_pages(base + page, page, handles));
  VRAMLEDGER_EXPECT_OK(backend().synchronize_device());
  VRAMLEDGER_EXPECT_OK(backend().unmap_pages(base + page, page, 1));
  VRAMLEDGER_EXPECT_OK(backend().release_physical(handle));
  VRAMLEDGER_EXPECT_OK(backend().free_address_range(base, 4 * page));
}

// Sleep and wake (docs/sleep.md) copy through the backend: bytes written to a segment from host
// memory come back unchanged, or both directions say kNotSupported.
TEST_P(BackendContractTest, HostCopiesRoundTripOrAreNotSupported) {
  const std::size_t bytes = 64 * 1024;
  DevicePtr segment = 0;
  VRAMLEDGER_EXPECT_OK(backend().allocate_segment(backend().info().granularity, stream(), &segment));
  VRAMLEDGER_EXPECT_OK(backend().synchronize_device());
  void* out = nullptr;
  void* in = nullptr;
  VRAMLEDGER_EXPECT_OK(backend().allocate_host(bytes, &out));
  VRAMLEDGER_EXPECT_OK(backend().allocate_host(bytes, &in));
  auto* pattern = static_cast<unsigned char*>(out);
  for (std::size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<unsigned char>(i * 31 + 7);
  std::memset(in, 0, bytes);
  const Status to_device = backend().copy_to_device(segment, out, bytes);
  if (to_device.code() == ErrorCode::kNotSupported) {
    EXPECT_EQ(backend().copy_to_host(in, segment, bytes).code(), ErrorCode::kNotSupported);
  } else {
    VRAMLEDGER_EXPECT_OK(to_device);
    VRAMLEDGER_EXPECT_OK(backend().copy_to_host(in, segment, bytes));
    VRAMLEDGER_EXPECT_OK(backend().synchronize_device());
    EXPECT_EQ(std::memcmp(in, out, bytes), 0) << "the bytes came back changed";
  }
  VRAMLEDGER_EXPECT_OK(backend().free_host(out));
  VRAMLEDGER_EXPECT_OK(backend().free_host(in));
  VRAMLEDGER_EXPECT_OK(backend().free_segment(segment, backend().info().granularity, stream()));
}

}  // namespace vramledger::contract
