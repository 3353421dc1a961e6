// The paged heap (VMM backends): address ranges are large virtual spans per stream and pool;
// physical pages are mapped only under pages some live block touches, and a page no live
// block touches can be unmapped and its memory re-mapped anywhere else. Where the memory
// comes from is the physical pool's business (physical_pool.cpp).
#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

inline Block* CachingAllocator::Impl::allocate_paged(StreamHeaps& heaps, PoolKind pool,
                                                     std::size_t size) {
  FreeBlockIndex& index = heaps.free[pool_index(pool)];
  Block* block = index.find(size);
  const auto needs_pages = [&] {
    return block == nullptr || pages_to_map(*block->range, block->address, size) > 0;
  };
  bool growing = needs_pages();
  // Before growing, blocks of this stream still awaiting other streams become reusable here
  // (adopting none changes nothing).
  if (growing && adopt_pending_frees(heaps, pool) > 0) {
    block = index.find(size);
    growing = needs_pages();
  }
  // Parked blocks of front caches are cached memory: they never make the heap grow (with
  // front_cache_mb:1024 the corpus replayed at up to 1.79 of peak requested before).
  if (growing && return_parked_before_growth_locked(heaps.stream) > 0) {
    block = index.find(size);
    growing = needs_pages();
  }
  DevicePtr address = 0;
  if (block == nullptr) {
    block = add_span(heaps, pool, size);
    address = block->address;
  } else if (growing) {
    retire_mappings(heaps, /*wait=*/false);  // old addresses whose work is done are free again
    const Placement best = placement_when_best_fit_needs_pages(index, pool, size, block);
    block = best.block;
    address = best.address;
  } else {
    address = block->address;
  }
  return take_from_span(index, block, address, size, pending_split_);
}

// [address, address + size) of `block`, free in `index`, becomes the allocation, backed by
// pages first (throws with nothing changed); what is left of the block on either side stays free.
inline Block* CachingAllocator::Impl::take_from_span(FreeBlockIndex& index, Block* block,
                                                     DevicePtr address, std::size_t size,
                                                     SplitDelta& split) {
  back_with_pages(*block, address, size);  // throws with nothing changed
  index.remove(block);
  if (block->address < address) {  // placed inside the free block: its front stays free
    Block* front = block;
    block = split_front(front, address - front->address);
    index.insert(front);
  }
  if (block->size > size) index.insert(split_front(block, size));
  mark_pages(*block, +1, split);
  return block;
}

// Maps every page under [address, address + size), which lies in the free block `block`, and
// takes the block's free mapped pages that the allocation uses out of the free count. Throws
// with nothing changed.
inline void CachingAllocator::Impl::back_with_pages(const Block& block, DevicePtr address,
                                                    std::size_t size) {
  AddressRange& span = *block.range;
  const auto [whole_first, whole_last] = whole_pages(span, block.address, block.end());
  const std::size_t lo = std::max(page_of(span, address), whole_first);
  const std::size_t hi = std::min(page_of(span, address + size - 1) + 1, whole_last);
  const std::size_t reused = hi > lo ? span.count_mapped(lo, hi) : 0;
  map_pages_for(span, address, size);
  span.owner->free_mapped_pages[pool_index(span.pool)] -= reused;
}

inline Block* CachingAllocator::Impl::add_span(StreamHeaps& heaps, PoolKind pool,
                                               std::size_t size) {
  const std::size_t bytes = std::max(span_bytes_[pool_index(pool)], round_up(size, page_bytes_));
  DevicePtr base = 0;
  throw_if_error(backend_.reserve_address_range(bytes, &base),
                 [&] { return "reserving " + format_bytes_exact(bytes) + " of address space"; });
  emit(EventKind::kVirtualReserve, pool, heaps.stream, base, bytes);
  return add_range(heaps, pool, base, bytes, /*is_span=*/true);
}

// Maps every page under [address, address + size). Each run of unmapped pages is filled with
// as few physical chunks as the free physical pool and max_chunk_pages_ allow; a first or last
// page the allocation only partly covers gets a chunk of its own, since a neighbour may come
// to share it and would otherwise pin the allocation's whole chunk after it is freed. On
// failure nothing is mapped that was not before; physical memory obtained on the way stays in
// the free physical pool.
inline void CachingAllocator::Impl::map_pages_for(AddressRange& span, DevicePtr address,
                                                  std::size_t size) {
  const std::size_t first = page_of(span, address);
  const std::size_t last = page_of(span, address + size - 1);
  if (span.count_mapped(first, last + 1) == last - first + 1) return;
  // An old address of aliased memory is still mapped until its work is done.
  if (span.any_retiring(first, last + 1)) {
    retire_mappings(*span.owner, /*wait=*/true, &span, first, last + 1);
  }
  const bool first_shared = (address - span.base) % page_bytes_ != 0;
  const bool last_shared = (address + size - span.base) % page_bytes_ != 0;
  std::vector<std::pair<std::size_t, std::size_t>> runs;  // (first page, pages)
  for (std::size_t i = first; i <= last; ++i) {
    if (span.is_mapped(i)) continue;
    const bool starts_run = (i == first + 1 && first_shared) || (i == last && last_shared);
    if (!runs.empty() && runs.back().first + runs.back().second == i && !starts_run) {
      runs.back().second++;
    } else {
      runs.emplace_back(i, 1);
    }
  }
  const std::vector<PhysicalChunk> chunks =
      acquire_physical(*span.owner, span.pool, runs, PageExclusion{&span, first, last});
  std::size_t next = 0;
  std::vector<std::size_t> mapped_heads;
  for (const auto& [run_first, run_pages] : runs) {
    std::size_t page = run_first;
    while (page < run_first + run_pages) {
      const PhysicalChunk chunk = chunks[next];
      const DevicePtr va = span.base + page * page_bytes_;
      Status status = backend_.map_pages(va, chunk.pages * page_bytes_,
                                         std::span<const PhysicalHandle>(&chunk.handle, 1));
      if (!status) {
        // Undo this call's mappings; keep all physical memory for later.
        for (std::size_t k = next; k < chunks.size(); ++k) put_spare(span.pool, chunks[k]);
        std::size_t undone = 0;
        try {
          for (; undone < mapped_heads.size(); ++undone) {
            unmap_chunk(span, mapped_heads[undone], /*was_free=*/false);
          }
        } catch (...) {
          // What stays mapped lies wholly in the free block the allocation would have used.
          for (; undone < mapped_heads.size(); ++undone) {
            span.owner->free_mapped_pages[pool_index(span.pool)] +=
                span.chunk_pages(mapped_heads[undone]);
          }
          throw;
        }
        throw_if_error(status, "mapping " + format_bytes_exact(chunk.pages * page_bytes_) + " at " +
                                   format_hex(va));
      }
      span.set_chunk_mapped(page, chunk);
      mapped_heads.push_back(page);
      emit(EventKind::kMap, span.pool, span.owner->stream, va, chunk.pages * page_bytes_);
      page += chunk.pages;
      ++next;
    }
  }
}

// Unmaps the chunk mapped from page `head` on, which no active block touches; its memory goes
// to the free physical pool. Returns its page count.
inline std::size_t CachingAllocator::Impl::unmap_chunk(AddressRange& span, std::size_t head,
                                                       bool was_free) {
  const DevicePtr va = span.base + head * page_bytes_;
  const std::size_t pages = span.chunk_pages(head);
  throw_if_error(backend_.unmap_pages(va, pages * page_bytes_, 1), [&] {
    return "unmapping the " + format_bytes_exact(pages * page_bytes_) + " at " + format_hex(va);
  });
  put_spare(span.pool, span.clear_chunk_mapped(head));
  if (was_free) span.owner->free_mapped_pages[pool_index(span.pool)] -= pages;
  emit(EventKind::kUnmap, span.pool, span.owner->stream, va, pages * page_bytes_);
  return pages;
}

// unmap_in_background: chunk `head` of `span`, idle (wholly in a free block whose last use,
// covered by fence `freed_at_fence`, has finished), leaves its address for the free physical
// pool at once; the old address retires and the helper thread unmaps it there
// (detail/background_unmaps.hpp). The chunk may be mapped elsewhere meanwhile (the driver
// allows a second mapping; no work can touch the old one). Returns its page count.
inline std::size_t CachingAllocator::Impl::unmap_idle_chunk(AddressRange& span, std::size_t head,
                                                            std::uint64_t freed_at_fence) {
  if (!unmap_in_background_) return unmap_chunk(span, head, /*was_free=*/true);
  const DevicePtr va = span.base + head * page_bytes_;
  const std::size_t pages = span.chunk_pages(head);
  StreamHeaps& owner = *span.owner;
  // Old addresses the helper has unmapped are forgotten when pages are next needed
  // (retire_mappings); a stream whose idle pages are only ever trimmed would otherwise collect
  // them without end.
  constexpr std::size_t kForgetUnmappedAt = 64;
  if (owner.retiring.size() >= kForgetUnmappedAt) {
    retire_each(owner, [](const StreamHeaps::RetiringMapping& r) {  // nothing left to unmap
      return r.job != nullptr && BackgroundUnmaps::done(*r.job);
    });
  }
  owner.retiring.reserve(owner.retiring.size() + 1);  // nothing changes below if this throws
  std::shared_ptr<UnmapJob> job = background_unmaps_.submit(va, pages * page_bytes_);
  const PhysicalChunk chunk = span.clear_chunk_mapped(head);
  span.set_retiring(head, pages, true, freed_at_fence);
  owner.retiring.push_back({&span, head, pages, freed_at_fence, chunk.handle, std::move(job)});
  ++owner.retiring_changes;
  ++retiring_mappings_;
  put_spare(span.pool, chunk);
  owner.free_mapped_pages[pool_index(span.pool)] -= pages;
  emit(EventKind::kUnmap, span.pool, owner.stream, va, pages * page_bytes_);
  return pages;
}

// Unmaps free mapped chunks of `pool` of at most `max_chunk` pages, until at least `count`
// pages are unmapped, moving their memory to the free physical pool. A chunk qualifies when
// all its pages lie wholly inside one free block; without `wait`, only when the stream that
// freed it has provably finished with it. `choice` limits the streams looked at
// (their own or the others of `stream`). Returns the pages unmapped.
inline std::size_t CachingAllocator::Impl::unmap_idle_chunks(PoolKind pool, std::size_t count,
                                                             std::size_t max_chunk, bool wait,
                                                             const PageExclusion& exclusion,
                                                             StreamChoice choice,
                                                             const StreamHeaps* stream) {
  const int p = pool_index(pool);
  std::size_t unmapped = 0;
  for (auto& heaps : streams_) {
    if (choice == StreamChoice::kOnly && heaps.get() != stream) continue;
    if (choice == StreamChoice::kOthersCold && heaps.get() == stream) continue;
    if (heaps->free_mapped_pages[p] == 0) continue;
    for (Block* b : free_blocks_with_mapped_pages(*heaps, p)) {
      if (unmapped >= count) return unmapped;
      if (heaps->free_mapped_pages[p] == 0) break;
      AddressRange* span = b->range;
      const auto [first, last] = whole_pages(*span, b->address, b->end());
      // Chunks that may go: wholly in the block, small enough, not excluded, cold if asked.
      // (Unmapping one changes none of this for the others.)
      auto qualifies = [&, last = last](std::size_t page) {
        if (!span->is_chunk_head(page)) return false;
        const std::size_t pages = span->chunk_pages(page);
        return pages <= max_chunk && page + pages <= last &&
               !exclusion.intersects(span, page, pages) &&
               (choice != StreamChoice::kOthersCold || chunk_is_cold(*heaps, *span, page, pages));
      };
      std::optional<std::size_t> head = span->first_mapped(first, last, qualifies);
      if (!head) continue;
      if (!heaps->fence_done(b->freed_at_fence)) {
        issue_fence(*heaps);
        poll_fences(*heaps);
        if (wait) wait_for_fence(*heaps, b->freed_at_fence);
        if (!heaps->fence_done(b->freed_at_fence)) continue;
      }
      for (; head && unmapped < count; head = span->first_mapped(*head + 1, last, qualifies)) {
        unmapped += unmap_idle_chunk(*span, *head, b->freed_at_fence);
      }
    }
  }
  return unmapped;
}

// The free blocks of `heaps`' spans in pool `p` that hold whole mapped pages, in the order a walk
// of every block would meet them (spans in heaps.ranges order, then by address), which is the
// order unmap_idle_chunks and alias_pending_chunk choose by; a block listed may have lost its
// mapped pages since. Found through the free index, and kept until the index changes: walking
// every block visited the live ones too, thousands at a program's peak, once for each chunk
// a mapping needed (on ViT's trace at a lag of 1000 operations those walks were 28% of the
// replay's instructions, ~860,000 per acquire_physical).
inline std::vector<Block*> CachingAllocator::Impl::free_blocks_with_mapped_pages(
    StreamHeaps& heaps, int p) const {
  const FreeBlockIndex& index = heaps.free[p];
  if (heaps.idle_blocks_at[p] == index.changes()) return heaps.idle_blocks[p];
  struct Found {
    std::size_t span_rank;
    DevicePtr address;
    Block* block;
  };
  std::vector<Found> found;
  const std::vector<AddressRange*>& ranges = heaps.ranges[p];
  index.for_each_fit(page_bytes_, std::numeric_limits<int>::max(), [&](Block* b) {
    const AddressRange& span = *b->range;
    if (!span.is_span) return;
    const auto [first, last] = whole_pages(span, b->address, b->end());
    if (first >= last || span.count_mapped(first, last) == 0) return;
    const auto rank = static_cast<std::size_t>(
        std::find(ranges.begin(), ranges.end(), b->range) - ranges.begin());
    found.push_back({rank, b->address, b});
  });
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.span_rank != b.span_rank ? a.span_rank < b.span_rank : a.address < b.address;
  });
  std::vector<Block*>& blocks = heaps.idle_blocks[p];
  blocks.clear();
  for (const Found& f : found) blocks.push_back(f.block);
  heaps.idle_blocks_at[p] = index.changes();
  return blocks;
}

// Adds (+1) or removes (-1) the block's bytes on its first and last page and announces the
// change of those pages' free bytes (the paged heap's inactive split: free bytes on pages that
// active blocks hold, which no page-sized request can use).
inline void CachingAllocator::Impl::mark_pages(const Block& block, int direction,
                                               SplitDelta& split) {
  AddressRange& span = *block.range;
  const std::size_t first = page_of(span, block.address);
  const std::size_t last = page_of(span, block.end() - 1);
  mark_edge_page(span, block, first, direction, split);
  if (last != first) mark_edge_page(span, block, last, direction, split);
}

inline void CachingAllocator::Impl::mark_edge_page(AddressRange& span, const Block& block,
                                                   std::size_t index, int direction,
                                                   SplitDelta& split) {
  PageUse& page = span.page_use[index];
  const DevicePtr page_start = span.base + index * page_bytes_;
  const std::size_t overlap =
      std::min(block.end(), page_start + page_bytes_) - std::max(block.address, page_start);
  const std::size_t old_fragment = page.users > 0 ? page_bytes_ - page.active_bytes : 0;
  if (direction > 0) {
    page.users++;
    page.active_bytes += overlap;
  } else {
    page.users--;
    page.active_bytes -= overlap;
  }
  const std::size_t new_fragment = page.users > 0 ? page_bytes_ - page.active_bytes : 0;
  if (old_fragment == new_fragment) return;
  note_split_change((new_fragment > 0 ? 1 : 0) - (old_fragment > 0 ? 1 : 0),
                    static_cast<std::int64_t>(new_fragment) -
                        static_cast<std::int64_t>(old_fragment),
                    split);
}

}  // namespace vramledger
