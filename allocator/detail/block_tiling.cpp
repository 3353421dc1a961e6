// Blocks tile an address range (a backend segment or a virtual span) in address order; the
// tiers below split them, merge free neighbours, and announce the segment heap's inactive
// split (torch's meaning: a free block sharing its segment).
#include "allocator/detail/policy_state.hpp"

namespace vramledger {

inline Block* CachingAllocator::Impl::add_range(StreamHeaps& heaps, PoolKind pool, DevicePtr base,
                                                std::size_t bytes, bool is_span) {
  auto* range = new AddressRange;
  range->base = base;
  range->size = bytes;
  range->owner = &heaps;
  range->pool = pool;
  range->is_span = is_span;
  if (is_span) {
    FreeBlockIndex& index = heaps.free[pool_index(pool)];
    index.track_mapped_runs(page_bytes_);
    range->run_index = &index.mapped_runs();
  }
  Block* block = heaps.blocks.create();
  block->address = base;
  block->size = bytes;
  block->range = range;
  range->first = block;
  heaps.ranges[pool_index(pool)].push_back(range);
  heaps.free[pool_index(pool)].insert(block);
  return block;
}

// Splits `block` into [address, address + size) (kept in `block`) and the rest (returned).
inline Block* CachingAllocator::Impl::split_front(Block* block, std::size_t size) {
  Block* rest = block->range->owner->blocks.create();
  rest->address = block->address + size;
  rest->size = block->size - size;
  rest->range = block->range;
  // A free remainder is as busy as the block was: work queued before its free may still use it.
  rest->freed_at_fence = block->freed_at_fence;
  rest->prev = block;
  rest->next = block->next;
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = size;
  return rest;
}

// Removes `block` from its range's list (its bytes were merged into a neighbour).
inline void CachingAllocator::Impl::unlink(Block* block) {
  if (block->prev != nullptr) block->prev->next = block->next;
  if (block->next != nullptr) block->next->prev = block->prev;
  if (block->range->first == block) block->range->first = block->next;
  block->range->owner->blocks.destroy(block);
}

// Segment heap: torch's meaning of inactive split — a free block sharing its segment.
inline void CachingAllocator::Impl::refresh_inactive_split(Block* block, SplitDelta& split) {
  if (block->range->is_span) return;
  const bool is_split = block->state == BlockState::kFree &&
                        (block->prev != nullptr || block->next != nullptr);
  set_inactive_split(block, is_split, split);
}

inline void CachingAllocator::Impl::set_inactive_split(Block* block, bool value,
                                                       SplitDelta& split) {
  if (block->counted_inactive_split == value) return;
  block->counted_inactive_split = value;
  note_split_change(value ? 1 : -1,
                    value ? static_cast<std::int64_t>(block->size)
                          : -static_cast<std::int64_t>(block->size),
                    split);
}

}  // namespace vramledger
