// What the queries see of front caches (docs/design.md, 5.1): a parked block is free memory and
// not a live allocation; a held one carries the request of its latest allocation, which only its
// cache knows. Under the allocator's lock, then the cache's.
#include <algorithm>
#include <mutex>
#include <vector>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

inline bool CachingAllocator::Impl::front_owns(DevicePtr ptr, bool* owned) const {
  if (!front_enabled_) return false;
  std::lock_guard lock(mutex_);
  const Block* block = live_.find(ptr);
  if (block == nullptr || block->front == nullptr) return false;
  std::lock_guard cache_lock(block->front->mutex());
  const FrontBlock* front = block->front->blocks.find(ptr);
  if (front == nullptr) return false;
  *owned = !front->parked;
  return true;
}

inline bool CachingAllocator::Impl::front_describe(DevicePtr ptr, AllocationInfo* info) const {
  if (!front_enabled_) return false;
  std::lock_guard lock(mutex_);
  const Block* block = live_.find(ptr);
  if (block == nullptr) block = block_containing(ptr);
  if (block == nullptr || block->front == nullptr) return false;
  std::lock_guard cache_lock(block->front->mutex());
  const FrontBlock* front = block->front->blocks.find(block->address);
  if (front == nullptr) return false;
  if (front->parked) {
    throw Error(ErrorCode::kInvalidPointer,
                "pointer " + format_hex(ptr) + " is not inside a live vramledger allocation");
  }
  info->base = block->address;
  info->size = block->size;
  info->requested = front->requested;
  info->stream = front->stream;
  info->tag = kUntagged;
  info->segment_base = block->range->base;
  info->segment_size = block->range->size;
  return true;
}

// The heaps count front-managed blocks as allocated; the user (and the ledger) sees parked ones
// as free memory and held ones with the request of their latest allocation.
inline void CachingAllocator::Impl::front_census_locked(BlockCensus& census) const {
  if (!front_enabled_) return;
  std::lock_guard registry(front_mutex_);
  for (const auto& cache : front_caches_) {
    std::lock_guard cache_lock(cache->mutex());
    cache->blocks.for_each([&](const FrontBlock* front) {
      BlockCensus::PerPool& out = census.pools[pool_index(front->pool)];
      const auto size = static_cast<std::int64_t>(front->size);
      const auto heap_requested = static_cast<std::int64_t>(front->block->requested);
      if (front->parked) {
        out.allocation--;
        out.allocated_bytes -= size;
        out.active--;
        out.active_bytes -= size;
        out.requested_bytes -= heap_requested;
        out.free_bytes += size;  // an allocated block is backed whole
        out.largest_free_block = std::max(out.largest_free_block, size);
      } else {
        out.requested_bytes += static_cast<std::int64_t>(front->requested) - heap_requested;
      }
    });
  }
}

inline void CachingAllocator::Impl::front_segments_locked(
    std::vector<SegmentInfo>& segments) const {
  if (!front_enabled_) return;
  for (SegmentInfo& segment : segments) {
    for (BlockInfo& info : segment.blocks) {
      if (!info.allocated) continue;
      const Block* block = live_.find(info.address);
      if (block == nullptr || block->front == nullptr) continue;
      std::lock_guard cache_lock(block->front->mutex());
      const FrontBlock* front = block->front->blocks.find(info.address);
      if (front == nullptr) continue;
      if (front->parked) {
        info.allocated = false;
        info.active = false;
        info.requested = 0;
      } else {
        info.requested = front->requested;
      }
    }
  }
}

}  // namespace vramledger
