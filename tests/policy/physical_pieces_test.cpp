// CachingAllocator::physical_pieces (what a CUDA IPC export of a paged block shares, docs/ipc.md)
// on the simulated device: for blocks of many sizes over chunks of several sizes, the pieces
// follow each other, cover the block, are mapped, and name chunks that together hold no more than
// the device gives out; they do not change while the block lives, whatever the cache does; a
// sleeping block has none (kNotSupported), a freed one is refused, a segment's block has none.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

ErrorCode error_of(const CachingAllocator& allocator, DevicePtr ptr) {
  try {
    allocator.physical_pieces(ptr);
  } catch (const Error& error) {
    return error.code();
  }
  return ErrorCode::kOk;
}

void expect_pieces_cover(const SimulatedDevice& device, const std::vector<PhysicalPiece>& pieces,
                         DevicePtr base, std::size_t bytes) {
  ASSERT_FALSE(pieces.empty());
  EXPECT_LE(pieces.front().va, base);
  EXPECT_GE(pieces.back().va + pieces.back().bytes, base + bytes);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_GT(pieces[i].bytes, 0u);
    EXPECT_EQ(pieces[i].bytes % (2 * kMiB), 0u) << "whole pages";
    EXPECT_TRUE(device.is_range_accessible(pieces[i].va, pieces[i].bytes)) << "mapped, whole";
    if (i > 0) {
      EXPECT_EQ(pieces[i - 1].va + pieces[i - 1].bytes, pieces[i].va) << "side by side";
    }
  }
}

TEST(PhysicalPieces, PagedBlocksListTheChunksUnderThem) {
  SimulatedDeviceOptions device_options;
  device_options.capacity_bytes = std::size_t{4} << 30;
  SimulatedDevice device(device_options);
  Ledger ledger;
  AllocatorOptions options;
  options.map_chunk_bytes = 8 * kMiB;  // blocks over several chunks
  CachingAllocator allocator(device, &ledger, options);

  std::mt19937 random(17);
  std::map<DevicePtr, std::size_t> live;
  std::map<DevicePtr, std::vector<PhysicalPiece>> seen;
  int several = 0;  // blocks over more than one chunk: the walk from chunk to chunk is exercised
  for (int step = 0; step < 300; ++step) {
    if (!live.empty() && random() % 3 == 0) {
      auto it = std::next(live.begin(), static_cast<long>(random() % live.size()));
      EXPECT_EQ(allocator.physical_pieces(it->first), seen.at(it->first))
          << "unchanged while the block lives";
      allocator.deallocate(it->first);
      EXPECT_EQ(error_of(allocator, it->first), ErrorCode::kInvalidPointer);
      seen.erase(it->first);
      live.erase(it);
      if (random() % 4 == 0) allocator.empty_cache();
      continue;
    }
    const std::size_t bytes = 64 * 1024 + random() % (40 * kMiB);
    const DevicePtr ptr = allocator.allocate(bytes, 0);
    live[ptr] = bytes;
    seen[ptr] = allocator.physical_pieces(ptr);
    expect_pieces_cover(device, seen[ptr], ptr, bytes);
    if (seen[ptr].size() > 1) ++several;
  }
  EXPECT_GT(several, 20);
  // Distinct chunks under live blocks hold no more than the device handed out.
  std::map<PhysicalHandle, std::size_t> chunks;
  for (const auto& [ptr, pieces] : seen) {
    for (const PhysicalPiece& piece : pieces) {
      const auto [it, added] = chunks.emplace(piece.handle, piece.bytes);
      EXPECT_TRUE(added || it->second == piece.bytes) << "one chunk, one size";
    }
  }
  std::size_t chunk_bytes = 0;
  for (const auto& [handle, bytes] : chunks) chunk_bytes += bytes;
  EXPECT_LE(chunk_bytes, device.physical_bytes_in_use());

  // A sleeping block has no memory behind it.
  const TagId tag = 9;
  const DevicePtr tagged = allocator.allocate(6 * kMiB, 0, tag);
  EXPECT_FALSE(allocator.physical_pieces(tagged).empty());
  const TagId tags[] = {tag};
  allocator.sleep(tags, {});
  EXPECT_EQ(error_of(allocator, tagged), ErrorCode::kNotSupported);
  allocator.wake(tags);
  expect_pieces_cover(device, allocator.physical_pieces(tagged), tagged, 6 * kMiB);
  allocator.deallocate(tagged);
  for (const auto& [ptr, bytes] : live) allocator.deallocate(ptr);
}

TEST(PhysicalPieces, SegmentBlocksHaveNone) {
  SimulatedDeviceOptions device_options;
  device_options.supports_virtual_memory = false;
  SimulatedDevice device(device_options);
  CachingAllocator allocator(device, nullptr);
  const DevicePtr ptr = allocator.allocate(3 * kMiB, 0);
  EXPECT_TRUE(allocator.physical_pieces(ptr).empty()) << "a cudaMalloc segment: kind 'c'";
  allocator.deallocate(ptr);
}

}  // namespace
}  // namespace vramledger
