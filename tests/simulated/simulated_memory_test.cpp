// Physical accounting, address rules and the VMM checks of the simulated device.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr std::size_t kPage = 2 * kMiB;

SimulatedDeviceOptions small_device() {
  SimulatedDeviceOptions options;
  options.capacity_bytes = 64 * kMiB;
  options.allow_aliased_mappings = false;  // the driver's rules, without the aliasing the policy uses
  return options;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Everything observable about memory, to show that a failed call changed nothing.
struct MemoryPicture {
  std::size_t in_use, mapped, reserved, segments, handles, ranges;
  bool operator==(const MemoryPicture&) const = default;
};
MemoryPicture picture(const SimulatedDevice& device) {
  return {device.physical_bytes_in_use(),      device.mapped_bytes(),
          device.reserved_address_bytes(),     device.live_segment_count(),
          device.live_physical_handle_count(), device.live_address_range_count()};
}

class SimulatedMemoryTest : public ::testing::Test {
 protected:
  DevicePtr segment(std::size_t bytes) {
    DevicePtr ptr = 0;
    Status status = device.allocate_segment(bytes, 0, &ptr);
    EXPECT_TRUE(status.is_ok()) << status.message();
    return ptr;
  }
  PhysicalHandle handle(std::size_t bytes = kPage) {
    PhysicalHandle out = 0;
    Status status = device.create_physical(bytes, &out);
    EXPECT_TRUE(status.is_ok()) << status.message();
    return out;
  }
  DevicePtr range(std::size_t bytes) {
    DevicePtr out = 0;
    Status status = device.reserve_address_range(bytes, &out);
    EXPECT_TRUE(status.is_ok()) << status.message();
    return out;
  }
  void expect_invalid(const Status& status, const std::string& part = "") {
    EXPECT_EQ(status.code(), ErrorCode::kInvalidArgument) << status.message();
    EXPECT_FALSE(status.message().empty());
    if (!part.empty()) {
      EXPECT_TRUE(contains(status.message(), part)) << status.message();
    }
  }

  SimulatedDevice device{small_device()};
};

TEST(SimulatedDeviceInfo, DescribesItself) {
  SimulatedDeviceOptions options;
  options.device = 3;
  SimulatedDevice device(options);
  EXPECT_EQ(device.info().name, "simulated");
  EXPECT_EQ(device.info().device, 3);
  EXPECT_EQ(device.info().total_bytes, 80 * kGiB);
  EXPECT_EQ(device.info().granularity, 2 * kMiB);
  EXPECT_TRUE(device.info().supports_virtual_memory);
  EXPECT_FALSE(device.info().stream_ordered_segments);
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_TRUE(device.memory_info(&free_bytes, &total_bytes).is_ok());
  EXPECT_EQ(free_bytes, 80 * kGiB);
  EXPECT_EQ(total_bytes, 80 * kGiB);
}

TEST(SimulatedDeviceInfo, RejectsImpossibleShapes) {
  SimulatedDeviceOptions zero_granularity;
  zero_granularity.granularity = 0;
  EXPECT_THROW(SimulatedDevice{zero_granularity}, Error);
  SimulatedDeviceOptions odd_granularity;
  odd_granularity.granularity = 3 * kMiB;
  EXPECT_THROW(SimulatedDevice{odd_granularity}, Error);
  SimulatedDeviceOptions zero_rounding;
  zero_rounding.segment_rounding = 0;
  EXPECT_THROW(SimulatedDevice{zero_rounding}, Error);
}

// --- Segments ---

TEST_F(SimulatedMemoryTest, SegmentIsAlignedHighAndAccounted) {
  const DevicePtr ptr = segment(3 * kMiB);
  EXPECT_GE(ptr, DevicePtr{0x7f0000000000});
  EXPECT_EQ(ptr % kPage, 0u);
  EXPECT_EQ(device.physical_bytes_in_use(), 4 * kMiB);  // rounded up to 2 MiB
  EXPECT_EQ(device.live_segment_count(), 1u);
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_TRUE(device.memory_info(&free_bytes, &total_bytes).is_ok());
  EXPECT_EQ(total_bytes, 64 * kMiB);
  EXPECT_EQ(free_bytes, 60 * kMiB);

  EXPECT_TRUE(device.is_range_accessible(ptr, 3 * kMiB));
  EXPECT_TRUE(device.is_range_accessible(ptr + kMiB, kMiB));
  EXPECT_FALSE(device.is_range_accessible(ptr, 3 * kMiB + 1));  // rounding is not usable
  EXPECT_FALSE(device.is_range_accessible(ptr - 1, 1));

  ASSERT_TRUE(device.free_segment(ptr, 3 * kMiB, 0).is_ok());
  EXPECT_EQ(device.physical_bytes_in_use(), 0u);
  EXPECT_EQ(device.live_segment_count(), 0u);
  EXPECT_FALSE(device.is_range_accessible(ptr, 1));
}

TEST_F(SimulatedMemoryTest, RoundingIsChargedAgainstCapacity) {
  std::vector<DevicePtr> tiny;
  for (int i = 0; i < 32; ++i) tiny.push_back(segment(1));
  EXPECT_EQ(device.physical_bytes_in_use(), 64 * kMiB);
  DevicePtr ptr = 0;
  EXPECT_EQ(device.allocate_segment(1, 0, &ptr).code(), ErrorCode::kOutOfMemory);
}

TEST_F(SimulatedMemoryTest, OutOfMemoryNamesTheNumbersAndChangesNothing) {
  segment(60 * kMiB);
  const MemoryPicture before = picture(device);
  DevicePtr ptr = 0;
  const Status status = device.allocate_segment(6 * kMiB, 0, &ptr);
  ASSERT_EQ(status.code(), ErrorCode::kOutOfMemory);
  EXPECT_TRUE(contains(status.message(), std::to_string(6 * kMiB))) << status.message();
  EXPECT_TRUE(contains(status.message(), std::to_string(4 * kMiB))) << status.message();
  EXPECT_TRUE(contains(status.message(), std::to_string(64 * kMiB))) << status.message();
  EXPECT_EQ(picture(device), before);
  EXPECT_EQ(ptr, 0u);
  segment(4 * kMiB);  // exactly the rest still fits
}

TEST_F(SimulatedMemoryTest, SegmentSizeZeroOrEnormousIsRefused) {
  DevicePtr ptr = 0;
  expect_invalid(device.allocate_segment(0, 0, &ptr));
  EXPECT_EQ(device.allocate_segment(std::numeric_limits<std::size_t>::max(), 0, &ptr).code(),
            ErrorCode::kOutOfMemory);
  EXPECT_EQ(picture(device), MemoryPicture{});
}

TEST_F(SimulatedMemoryTest, AddressesNeverOverlapNorRepeat) {
  std::vector<DevicePtr> seen;
  for (int round = 0; round < 5; ++round) {
    const DevicePtr a = segment(kMiB + 7);
    const DevicePtr b = segment(3 * kMiB);
    const DevicePtr r = range(4 * kPage);
    seen.insert(seen.end(), {a, b, r});
    ASSERT_TRUE(device.free_segment(a, kMiB + 7, 0).is_ok());
    ASSERT_TRUE(device.free_segment(b, 3 * kMiB, 0).is_ok());
    ASSERT_TRUE(device.free_address_range(r, 4 * kPage).is_ok());
  }
  // Monotonic: each region starts above the end of the previous one (largest is 8 MiB).
  for (std::size_t i = 1; i < seen.size(); ++i) {
    EXPECT_GT(seen[i], seen[i - 1]);
    EXPECT_GE(seen[i] - seen[i - 1], 2 * kMiB);
  }
  std::vector<DevicePtr> sorted = seen;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());
}

TEST_F(SimulatedMemoryTest, RegionsNeverTouchSoOverrunsAreCaught) {
  const DevicePtr a = segment(kPage);
  const DevicePtr b = segment(kPage);
  EXPECT_GT(b, a + kPage);  // a spare granule in between
  EXPECT_FALSE(device.is_range_accessible(a, kPage + 1));
  EXPECT_FALSE(device.is_range_accessible(a + kPage, 1));
}

TEST_F(SimulatedMemoryTest, FreeSegmentChecksPointerAndSize) {
  const DevicePtr ptr = segment(3 * kMiB);
  const MemoryPicture before = picture(device);
  expect_invalid(device.free_segment(ptr + kMiB, 2 * kMiB, 0), "inside");
  expect_invalid(device.free_segment(ptr, 4 * kMiB, 0), std::to_string(3 * kMiB));
  expect_invalid(device.free_segment(0x1234, 3 * kMiB, 0), "no live segment");
  EXPECT_EQ(picture(device), before);
  ASSERT_TRUE(device.free_segment(ptr, 3 * kMiB, 0).is_ok());
  expect_invalid(device.free_segment(ptr, 3 * kMiB, 0), "already freed");  // double free
}

TEST_F(SimulatedMemoryTest, SegmentsNeedALiveStreamButFreeIgnoresIt) {
  DevicePtr ptr = 0;
  EXPECT_EQ(device.allocate_segment(kPage, 0xdead, &ptr).code(), ErrorCode::kInvalidStream);
  const StreamHandle stream = device.create_stream();
  ASSERT_TRUE(device.allocate_segment(kPage, stream, &ptr).is_ok());
  ASSERT_TRUE(device.destroy_stream(stream).is_ok());
  DevicePtr other = 0;
  EXPECT_EQ(device.allocate_segment(kPage, stream, &other).code(), ErrorCode::kInvalidStream);
  // cudaFree is not stream-ordered: freeing after the stream is gone works.
  EXPECT_TRUE(device.free_segment(ptr, kPage, stream).is_ok());
  EXPECT_EQ(picture(device), MemoryPicture{});
}

TEST(SimulatedDeviceRounding, SegmentRoundingIsConfigurable) {
  SimulatedDeviceOptions options;
  options.capacity_bytes = 10 * kMiB;
  options.segment_rounding = 1;
  SimulatedDevice device(options);
  DevicePtr ptr = 0;
  ASSERT_TRUE(device.allocate_segment(12345, 0, &ptr).is_ok());
  EXPECT_EQ(device.physical_bytes_in_use(), 12345u);
  EXPECT_EQ(ptr % (2 * kMiB), 0u);  // addresses still aligned to the granularity
}

// --- Physical handles ---

TEST_F(SimulatedMemoryTest, PhysicalHandlesNeedWholeGranules) {
  PhysicalHandle out = 0;
  expect_invalid(device.create_physical(0, &out), "multiple");
  expect_invalid(device.create_physical(kMiB, &out), "multiple");
  expect_invalid(device.create_physical(kPage + 1, &out), "multiple");
  EXPECT_EQ(picture(device), MemoryPicture{});
  const PhysicalHandle a = handle(kPage);
  const PhysicalHandle b = handle(3 * kPage);
  EXPECT_NE(a, b);
  EXPECT_EQ(device.physical_bytes_in_use(), 4 * kPage);
  EXPECT_EQ(device.live_physical_handle_count(), 2u);
  EXPECT_EQ(device.mapped_bytes(), 0u);
  ASSERT_TRUE(device.release_physical(a).is_ok());
  ASSERT_TRUE(device.release_physical(b).is_ok());
  EXPECT_EQ(picture(device), MemoryPicture{});
  expect_invalid(device.release_physical(a), "unknown");
  expect_invalid(device.release_physical(12345), "unknown");
}

TEST_F(SimulatedMemoryTest, SegmentsAndHandlesShareTheCapacity) {
  segment(40 * kMiB);
  handle(20 * kMiB);
  const MemoryPicture before = picture(device);
  PhysicalHandle out = 0;
  const Status status = device.create_physical(6 * kMiB, &out);
  EXPECT_EQ(status.code(), ErrorCode::kOutOfMemory);
  EXPECT_TRUE(contains(status.message(), std::to_string(4 * kMiB))) << status.message();
  EXPECT_EQ(picture(device), before);
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_TRUE(device.memory_info(&free_bytes, &total_bytes).is_ok());
  EXPECT_EQ(free_bytes, 4 * kMiB);
  handle(4 * kMiB);
  EXPECT_EQ(device.physical_bytes_in_use(), 64 * kMiB);
}

// --- Address ranges ---

TEST_F(SimulatedMemoryTest, AddressRangesCostNoPhysicalMemory) {
  const DevicePtr base = range(1024 * kGiB);  // far more than the capacity
  EXPECT_EQ(base % kPage, 0u);
  EXPECT_EQ(device.reserved_address_bytes(), 1024 * kGiB);
  EXPECT_EQ(device.physical_bytes_in_use(), 0u);
  EXPECT_EQ(device.live_address_range_count(), 1u);
  EXPECT_FALSE(device.is_range_accessible(base, 1));  // reserved is not mapped
  ASSERT_TRUE(device.free_address_range(base, 1024 * kGiB).is_ok());
  EXPECT_EQ(picture(device), MemoryPicture{});
}

TEST_F(SimulatedMemoryTest, AddressRangeSizesMustBeWholeGranules) {
  DevicePtr out = 0;
  expect_invalid(device.reserve_address_range(0, &out), "multiple");
  expect_invalid(device.reserve_address_range(kPage + 4096, &out), "multiple");
  EXPECT_EQ(picture(device), MemoryPicture{});
}

TEST_F(SimulatedMemoryTest, AddressSpaceExhaustionIsOutOfMemory) {
  DevicePtr out = 0;
  const std::size_t huge = std::numeric_limits<std::size_t>::max() / kPage * kPage;
  EXPECT_EQ(device.reserve_address_range(huge, &out).code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(picture(device), MemoryPicture{});
  range(kPage);  // the cursor was not moved into the void
}

TEST_F(SimulatedMemoryTest, OnlyWholeUnmappedRangesCanBeFreed) {
  const DevicePtr base = range(4 * kPage);
  expect_invalid(device.free_address_range(base, 2 * kPage), "whole");
  expect_invalid(device.free_address_range(base + kPage, 3 * kPage), "inside");
  expect_invalid(device.free_address_range(0x42, kPage), "no reserved range");

  const PhysicalHandle page = handle();
  ASSERT_TRUE(device.map_pages(base + kPage, kPage, std::span(&page, 1)).is_ok());
  const MemoryPicture before = picture(device);
  expect_invalid(device.free_address_range(base, 4 * kPage), "still mapped");
  EXPECT_EQ(picture(device), before);

  ASSERT_TRUE(device.unmap_pages(base + kPage, kPage, 1).is_ok());
  ASSERT_TRUE(device.free_address_range(base, 4 * kPage).is_ok());
  expect_invalid(device.free_address_range(base, 4 * kPage), "already freed");
  ASSERT_TRUE(device.release_physical(page).is_ok());
  EXPECT_EQ(picture(device), MemoryPicture{});
}

// --- Mapping ---

TEST_F(SimulatedMemoryTest, MappedPagesBecomeAccessible) {
  const DevicePtr base = range(8 * kPage);
  const std::vector<PhysicalHandle> pages = {handle(), handle(), handle()};
  ASSERT_TRUE(device.map_pages(base + 2 * kPage, kPage, pages).is_ok());
  EXPECT_EQ(device.mapped_bytes(), 3 * kPage);
  EXPECT_EQ(device.physical_bytes_in_use(), 3 * kPage);
  EXPECT_TRUE(device.is_range_accessible(base + 2 * kPage, 3 * kPage));
  EXPECT_TRUE(device.is_range_accessible(base + 3 * kPage - 5, 10));  // across a page boundary
  EXPECT_FALSE(device.is_range_accessible(base + 2 * kPage - 1, 2));
  EXPECT_FALSE(device.is_range_accessible(base + 5 * kPage, 1));
  EXPECT_FALSE(device.is_range_accessible(base + 2 * kPage, 3 * kPage + 1));
  EXPECT_TRUE(device.is_range_accessible(base, 0));
}

TEST_F(SimulatedMemoryTest, RunsOfSeparateCallsJoinUp) {
  const DevicePtr base = range(4 * kPage);
  const PhysicalHandle a = handle(), b = handle();
  ASSERT_TRUE(device.map_pages(base, kPage, std::span(&a, 1)).is_ok());
  ASSERT_TRUE(device.map_pages(base + kPage, kPage, std::span(&b, 1)).is_ok());
  EXPECT_TRUE(device.is_range_accessible(base, 2 * kPage));
  // Unmapping may span pages that separate calls mapped.
  ASSERT_TRUE(device.unmap_pages(base, kPage, 2).is_ok());
  EXPECT_EQ(device.mapped_bytes(), 0u);
}

TEST_F(SimulatedMemoryTest, LargerPagesAreWholeGranules) {
  const DevicePtr base = range(8 * kPage);
  const std::vector<PhysicalHandle> pages = {handle(2 * kPage), handle(2 * kPage)};
  ASSERT_TRUE(device.map_pages(base, 2 * kPage, pages).is_ok());
  EXPECT_EQ(device.mapped_bytes(), 4 * kPage);
  expect_invalid(device.unmap_pages(base, kPage, 1), "mapped with");
  ASSERT_TRUE(device.unmap_pages(base, 2 * kPage, 2).is_ok());
}

TEST_F(SimulatedMemoryTest, MapPagesRejectsMalformedRequests) {
  const DevicePtr base = range(4 * kPage);
  const PhysicalHandle page = handle();
  const PhysicalHandle big = handle(2 * kPage);
  const MemoryPicture before = picture(device);
  const std::span one(&page, 1);
  expect_invalid(device.map_pages(base, kPage, std::span<const PhysicalHandle>{}), "no handles");
  expect_invalid(device.map_pages(base, kMiB, one), "granularity");
  expect_invalid(device.map_pages(base, 0, one), "granularity");
  expect_invalid(device.map_pages(base + 4096, kPage, one), "aligned");
  expect_invalid(device.map_pages(base - 2 * kPage, kPage, one), "reserved address range");
  expect_invalid(device.map_pages(base + 4 * kPage, kPage, one), "reserved address range");
  expect_invalid(device.map_pages(0x7e0000000000, kPage, one), "reserved address range");
  expect_invalid(device.map_pages(base, kPage, std::span(&big, 1)), "page size");
  const PhysicalHandle unknown = 777;
  expect_invalid(device.map_pages(base, kPage, std::span(&unknown, 1)), "unknown");
  const std::vector<PhysicalHandle> twice = {page, page};
  expect_invalid(device.map_pages(base, kPage, twice), "twice");
  EXPECT_EQ(picture(device), before);
}

TEST_F(SimulatedMemoryTest, MapPagesRefusesMappedPagesAndMappedHandles) {
  const DevicePtr base = range(4 * kPage);
  const DevicePtr other = range(4 * kPage);
  const PhysicalHandle a = handle(), b = handle(), c = handle();
  ASSERT_TRUE(device.map_pages(base + kPage, kPage, std::span(&a, 1)).is_ok());
  const MemoryPicture before = picture(device);
  expect_invalid(device.map_pages(base + kPage, kPage, std::span(&b, 1)), "already mapped");
  // Overlap from below: a run of two ending on the mapped page.
  const std::vector<PhysicalHandle> run = {b, c};
  expect_invalid(device.map_pages(base, kPage, run), "already mapped");
  // The same handle cannot be mapped a second time elsewhere.
  expect_invalid(device.map_pages(other, kPage, std::span(&a, 1)), "already mapped at");
  const std::vector<PhysicalHandle> late = {b, a};
  expect_invalid(device.map_pages(other, kPage, late), "handles[1]");
  EXPECT_EQ(picture(device), before);
}

TEST_F(SimulatedMemoryTest, MapPagesIsAllOrNothing) {
  const DevicePtr base = range(4 * kPage);
  const PhysicalHandle a = handle(), b = handle(), wrong = handle(2 * kPage);
  const MemoryPicture before = picture(device);
  const std::vector<PhysicalHandle> run = {a, b, wrong};
  expect_invalid(device.map_pages(base, kPage, run), "handles[2]");
  EXPECT_EQ(picture(device), before);
  EXPECT_FALSE(device.is_range_accessible(base, 1));
  // a and b were not left mapped: they map fine now, and can be released after unmapping.
  const std::vector<PhysicalHandle> good = {a, b};
  ASSERT_TRUE(device.map_pages(base + 2 * kPage, kPage, good).is_ok());
  ASSERT_TRUE(device.unmap_pages(base + 2 * kPage, kPage, 2).is_ok());
  ASSERT_TRUE(device.release_physical(a).is_ok());
}

TEST_F(SimulatedMemoryTest, UnmapPagesOnlyOfMappedPagesAndAllOrNothing) {
  const DevicePtr base = range(8 * kPage);
  const std::vector<PhysicalHandle> pages = {handle(), handle()};
  ASSERT_TRUE(device.map_pages(base, kPage, pages).is_ok());
  const MemoryPicture before = picture(device);
  expect_invalid(device.unmap_pages(base, kPage, 3), "page 2 of 3");  // third page unmapped
  expect_invalid(device.unmap_pages(base + 4 * kPage, kPage, 1), "no page is mapped");
  expect_invalid(device.unmap_pages(base + kMiB, kPage, 1), "no page is mapped");
  expect_invalid(device.unmap_pages(base, kPage, 0), "0 pages");
  expect_invalid(device.unmap_pages(base, 0, 1), "0 bytes");
  expect_invalid(device.unmap_pages(base, 2 * kPage, 1), "mapped with");
  expect_invalid(device.unmap_pages(base, kPage, std::numeric_limits<std::size_t>::max()),
                 "overflow");
  EXPECT_EQ(picture(device), before);
  EXPECT_TRUE(device.is_range_accessible(base, 2 * kPage));

  ASSERT_TRUE(device.unmap_pages(base + kPage, kPage, 1).is_ok());
  EXPECT_TRUE(device.is_range_accessible(base, kPage));
  EXPECT_FALSE(device.is_range_accessible(base + kPage, 1));
  expect_invalid(device.unmap_pages(base + kPage, kPage, 1), "no page is mapped");
  EXPECT_EQ(device.mapped_bytes(), kPage);
}

TEST_F(SimulatedMemoryTest, ReleasingAMappedHandleIsRefused) {
  const DevicePtr base = range(2 * kPage);
  const PhysicalHandle page = handle();
  ASSERT_TRUE(device.map_pages(base, kPage, std::span(&page, 1)).is_ok());
  const MemoryPicture before = picture(device);
  expect_invalid(device.release_physical(page), "still mapped");
  EXPECT_EQ(picture(device), before);
  ASSERT_TRUE(device.unmap_pages(base, kPage, 1).is_ok());
  ASSERT_TRUE(device.release_physical(page).is_ok());
}

TEST_F(SimulatedMemoryTest, PagesCanBeStitchedUnderAnotherRange) {
  const DevicePtr first = range(4 * kPage);
  const DevicePtr second = range(4 * kPage);
  const std::vector<PhysicalHandle> pages = {handle(), handle()};
  ASSERT_TRUE(device.map_pages(first, kPage, pages).is_ok());
  ASSERT_TRUE(device.unmap_pages(first, kPage, 2).is_ok());
  // Reversed order and a different offset: physical pages are interchangeable.
  const std::vector<PhysicalHandle> reversed = {pages[1], pages[0]};
  ASSERT_TRUE(device.map_pages(second + kPage, kPage, reversed).is_ok());
  EXPECT_TRUE(device.is_range_accessible(second + kPage, 2 * kPage));
  EXPECT_FALSE(device.is_range_accessible(first, 1));
  EXPECT_EQ(device.mapped_bytes(), 2 * kPage);
  EXPECT_EQ(device.physical_bytes_in_use(), 2 * kPage);
}

TEST_F(SimulatedMemoryTest, MappingsInNeighbouringRangesDoNotJoin) {
  const DevicePtr first = range(kPage);
  const DevicePtr second = range(kPage);
  const PhysicalHandle a = handle(), b = handle();
  ASSERT_TRUE(device.map_pages(first, kPage, std::span(&a, 1)).is_ok());
  ASSERT_TRUE(device.map_pages(second, kPage, std::span(&b, 1)).is_ok());
  EXPECT_FALSE(device.is_range_accessible(first, second - first + 1));
  // A run may not cross from one range into the next either.
  ASSERT_TRUE(device.unmap_pages(first, kPage, 1).is_ok());
  const std::vector<PhysicalHandle> across = {a, handle()};
  expect_invalid(device.map_pages(first, kPage, across), "reserved address range");
}

TEST_F(SimulatedMemoryTest, RangeAccessOverflowIsNotAccessible) {
  EXPECT_FALSE(device.is_range_accessible(std::numeric_limits<DevicePtr>::max() - 10, 100));
  EXPECT_FALSE(device.is_range_accessible(0, 1));
}

TEST(SimulatedDeviceWithoutVmm, VirtualMemoryCallsAreNotSupported) {
  SimulatedDeviceOptions options;
  options.supports_virtual_memory = false;
  options.segment_rounding = 512;
  SimulatedDevice device(options);
  EXPECT_FALSE(device.info().supports_virtual_memory);
  EXPECT_EQ(device.info().granularity, 512u);
  PhysicalHandle handle = 0;
  DevicePtr ptr = 0;
  EXPECT_EQ(device.create_physical(2 * kMiB, &handle).code(), ErrorCode::kNotSupported);
  EXPECT_EQ(device.release_physical(1).code(), ErrorCode::kNotSupported);
  EXPECT_EQ(device.reserve_address_range(2 * kMiB, &ptr).code(), ErrorCode::kNotSupported);
  EXPECT_EQ(device.free_address_range(ptr, 2 * kMiB).code(), ErrorCode::kNotSupported);
  EXPECT_EQ(device.map_pages(ptr, 2 * kMiB, std::span(&handle, 1)).code(),
            ErrorCode::kNotSupported);
  EXPECT_EQ(device.unmap_pages(ptr, 2 * kMiB, 1).code(), ErrorCode::kNotSupported);
  EXPECT_EQ(device.call_count(SimOp::kMapPages), 1u);  // still counted: the driver was asked
  ASSERT_TRUE(device.allocate_segment(1000, 0, &ptr).is_ok());
  EXPECT_EQ(device.physical_bytes_in_use(), 1024u);
}

}  // namespace
}  // namespace vramledger
