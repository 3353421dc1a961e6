// The segment heap (backends without virtual memory): address ranges are backend segments,
// split on allocation and merged on free, released whole when entirely free — PyTorch's
// model. Best fit by size from the stream's FreeBlockIndex.
#include "allocator/detail/policy_state.hpp"

namespace vramledger {

inline Block* CachingAllocator::Impl::allocate_from_segments(StreamHeaps& heaps, PoolKind pool,
                                                             std::size_t size) {
  FreeBlockIndex& index = heaps.free[pool_index(pool)];
  Block* block = index.find(size);
  if (block == nullptr && adopt_pending_frees(heaps, pool) > 0) block = index.find(size);
  if (block == nullptr && return_parked_before_growth_locked(heaps.stream) > 0) {
    block = index.find(size);  // parked blocks never make the heap grow (front_cache.cpp)
  }
  if (block == nullptr) block = add_segment(heaps, pool, size);
  take_from_segment(index, pool, block, size, pending_split_);
  return block;
}

// `block`, free in `index`, becomes the allocation's: its rest stays free when large enough.
inline void CachingAllocator::Impl::take_from_segment(FreeBlockIndex& index, PoolKind pool,
                                                      Block* block, std::size_t size,
                                                      SplitDelta& split) {
  index.remove(block);
  set_inactive_split(block, false, split);
  const std::size_t remainder = block->size - size;
  const std::size_t min_remainder =
      pool == PoolKind::kSmall ? options_.round_bytes : options_.small_size_limit + 1;
  if (remainder >= min_remainder && !options_.no_split) {
    Block* rest = split_front(block, size);
    index.insert(rest);
    refresh_inactive_split(rest, split);
  }
}

inline std::size_t CachingAllocator::Impl::segment_size_for(PoolKind pool, std::size_t size) const {
  if (options_.no_split) return round_up(size, options_.round_large_segment_bytes);
  if (pool == PoolKind::kSmall) return std::max(options_.small_segment_bytes, size);
  if (size < options_.large_segment_bytes / 2) return options_.large_segment_bytes;
  return round_up(size, options_.round_large_segment_bytes);
}

inline Block* CachingAllocator::Impl::add_segment(StreamHeaps& heaps, PoolKind pool,
                                                  std::size_t size) {
  const std::size_t bytes = segment_size_for(pool, size);
  ensure_within_cap(bytes);
  DevicePtr base = 0;
  throw_if_error(backend_.allocate_segment(bytes, heaps.stream, &base),
                 [&] { return "allocating a " + format_bytes_exact(bytes) + " segment"; });
  reserved_bytes_ += bytes;
  emit(EventKind::kSegmentCreate, pool, heaps.stream, base, bytes);
  return add_range(heaps, pool, base, bytes, /*is_span=*/false);
}

inline void CachingAllocator::Impl::ensure_within_cap(std::size_t more) const {
  if (cap_ != 0 && reserved_bytes_ + more > cap_) {
    throw OutOfMemoryError("the cap of " + format_bytes_exact(cap_) +
                           " would be exceeded: " + format_bytes_exact(reserved_bytes_) +
                           " reserved, " + format_bytes_exact(more) + " more needed");
  }
}

}  // namespace vramledger
