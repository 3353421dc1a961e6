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
  // Before growing, blocks of this stream still awaiting other streams become reusable here.
  if ((block == nullptr || pages_to_map(*block->range, block->address, size) > 0) &&
      adopt_pending_frees(heaps, pool) > 0) {
    block = index.find(size);
  }
  DevicePtr address = 0;
  if (block == nullptr) {
    block = add_span(heaps, pool, size);
    address = block->address;
  } else if (pages_to_map(*block->range, block->address, size) > 0) {
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

// What placing `size` bytes at `address` of `candidate` costs: whether the CPU would have to
// wait for the GPU (an old address of aliased memory still in use: map_pages_for waits for its
// fence, draining the GPU's queue), then how many pages must be mapped (driver calls, and
// memory when no page is free anywhere).
inline CachingAllocator::Impl::Placement CachingAllocator::Impl::place_at(Block* candidate,
                                                                         DevicePtr address,
                                                                         std::size_t size) const {
  const AddressRange& span = *candidate->range;
  const std::size_t first = page_of(span, address);
  const std::size_t last = page_of(span, address + size - 1);
  return Placement{candidate, address,
                   {waits_for_gpu(span, first, last + 1), pages_to_map(span, address, size)}};
}

// Whether `heaps` has an old address still mapped for work queued before its free.
inline bool CachingAllocator::Impl::any_retiring_behind_fence(const StreamHeaps& heaps) const {
  for (const StreamHeaps::RetiringMapping& r : heaps.retiring) {
    if (!heaps.fence_done(r.fence)) return true;
  }
  return false;
}

// Whether mapping pages [first, last) of `span` would wait for the GPU: an old address there is
// still mapped for work queued before its free. Old addresses whose work is done cost nothing
// here, whether or not the helper thread has unmapped them yet (so the layout does not depend
// on how fast it runs).
inline bool CachingAllocator::Impl::waits_for_gpu(const AddressRange& span, std::size_t first,
                                                  std::size_t last) const {
  return span.any_retiring_after(first, last, span.owner->completed_fence);
}

// With place_by_mapped_pages, where inside `candidate` (a free block of at least `size` bytes)
// an allocation of kPlacedMinPages pages or more needs the fewest new pages: its front, its
// back, or the start of one of its runs of mapped pages. Otherwise (and for smaller
// allocations) its front. Small allocations stay packed at the front: placed anywhere they
// leave partly used pages behind them, which cost the small generation trace 2-3 points of
// peak reserved on the lag replays, while the mappings they would save are few (a mapping
// costs ~30 us whatever its size, so the large allocations, mapped in up to 8 chunks each,
// are where the driver calls are: docs/configuration.md).
inline CachingAllocator::Impl::Placement CachingAllocator::Impl::best_place_in(
    Block* candidate, std::size_t size) const {
  constexpr std::size_t kPlacedMinPages = 8;
  Placement best = place_at(candidate, candidate->address, size);
  if (!options_.place_by_mapped_pages || size < kPlacedMinPages * page_bytes_) return best;
  auto consider = [&](DevicePtr address) {
    if (address < candidate->address || address + size > candidate->end()) return;
    const Placement place = place_at(candidate, address, size);
    if (place.cost < best.cost) best = place;
  };
  consider(candidate->end() - size);
  const AddressRange& span = *candidate->range;
  const auto [first, last] = whole_pages(span, candidate->address, candidate->end());
  if (first >= last || span.count_mapped(first, last) == 0) return best;
  constexpr int kRuns = 16;  // bounds the work in a block with scattered mapped pages
  int runs = 0;
  std::size_t previous = SIZE_MAX;
  span.for_each_mapped(first, last, [&](std::size_t page) {
    if (runs >= kRuns || best.cost.second == 0) return;
    if (previous == SIZE_MAX || page != previous + 1) {  // a run of mapped pages starts here
      ++runs;
      consider(span.base + page * page_bytes_);
    }
    previous = page;
  });
  return best;
}

// The best fit by size needs new pages: look at a few other fits (and, with
// place_by_mapped_pages, at places inside each) for one that needs no wait and fewer pages.
// The first five fits by size (the best fit among them): the fewer looked at, the closer the
// choice stays to the best fit by size. Eight (until 2026-12-02) saved the most mappings at the
// time of each choice but cost more later: on the corpus's lag replays with 4 MiB chunks, five
// made 13% fewer steady-state driver calls and held every trace but two_stream (bound by the
// cross-stream slack) within 1.0098 at 24 lags, where eight reached 1.0115; six and seven took
// vit_train to 1.013, three and fewer took gpt2_generate past 1.03
// (bench/results/2026-12-02-replay-placement-candidates.md).
inline CachingAllocator::Impl::Placement
CachingAllocator::Impl::placement_needing_fewest_new_pages(const FreeBlockIndex& index,
                                                            std::size_t size,
                                                            Block* best_fit) const {
  constexpr int kCandidates = 5;
  Placement best = best_place_in(best_fit, size);
  const auto consider = [&](Block* candidate) {
    const Placement place = best_place_in(candidate, size);
    if (place.cost < best.cost) best = place;
  };
  index.for_each_fit(size, kCandidates, [&](Block* candidate) {
    if (!best.needs_nothing()) consider(candidate);
  });
  // Each of them would stop the thread until the GPU has run the work still using an old
  // address there: the GPU's queue would run dry. Any fit that does not wait is better, however
  // many pages it must map (the span's unmapped tail always is one).
  if (best.cost.first) index.for_each_fit(size, std::numeric_limits<int>::max(), consider);
  return best;
}

// Where an allocation goes when its best fit by size, `best_fit`, needs pages mapped: the place
// among a few fits needing the fewest, or, if that still needs some while idle mapped memory is
// plentiful, the tightest free run of mapped pages. Reads only `index`, its spans and the
// plentiful rule's figures, so a stream's fast path makes the same choice under its own lock
// (detail/stream_fast_path.cpp).
inline CachingAllocator::Impl::Placement
CachingAllocator::Impl::placement_when_best_fit_needs_pages(const FreeBlockIndex& index,
                                                            PoolKind pool, std::size_t size,
                                                            Block* best_fit) const {
  Placement best = placement_needing_fewest_new_pages(index, size, best_fit);
  if (best.cost.second > 0 && idle_mapped_memory_is_plentiful(pool)) {
    if (const std::optional<Placement> run = tightest_mapped_run(index, size)) best = *run;
  }
  return best;
}

// Whether free mapped pages make up at least kPlentifulIdlePercent of reserved memory. A step
// of a program smaller than its peak (GPT-2 training: a random sequence length per step) leaves
// that much idle; then an allocation that fits in a free run of mapped pages anywhere goes there
// (tightest_mapped_run) instead of moving pages under the best fit by size (an unmap and a map
// per chunk, ~50 us of CPU in the allocating thread on the H200). Below it (the heap at its
// peak), moving idle pages under the best fit keeps the live blocks packed. On the corpus's lag
// replays (0, 30, 100, 1000 operations), the driver calls made while reserved memory was not
// growing fell from 58,382 to 16,815 (gpt2_train: 11,490 to 612), every trace within its
// guard (bench/results/2026-12-02-replay-steady-state-calls.md). Reusing in place whatever the
// idle memory cut them to 12,958 but took gpt2_generate (446 MB: a 2 MiB page is 0.47%) to
// 1.0431; from 2% to 10% it moves by a page either way (3% is the level that kept it within
// 1.02 without aliasing and 1.03 with it at every lag).
//
// Also asked on a stream's fast path (detail/stream_fast_path.cpp), under that stream's lock:
// reserved_bytes_ changes only under the allocator's lock, which holds that one too, and other
// streams' free mapped pages are read as they stand.
inline bool CachingAllocator::Impl::idle_mapped_memory_is_plentiful(PoolKind pool) const {
  constexpr std::size_t kPlentifulIdlePercent = 3;
  return free_mapped_pages(pool_index(pool)) * page_bytes_ * 100 >=
         reserved_bytes_ * kPlentifulIdlePercent;
}

// The tightest run of mapped pages, within one free block of `index`, that holds `size` bytes
// at its start, or nullopt. Its pages are mapped, so the allocation needs no driver call (a
// page still mapped at an old address of aliased memory counts as unmapped in mapped_bits).
inline std::optional<CachingAllocator::Impl::Placement>
CachingAllocator::Impl::tightest_mapped_run(const FreeBlockIndex& index, std::size_t size) const {
  std::optional<Placement> best;
  std::size_t best_bytes = SIZE_MAX;
  // Only blocks of at least `size` bytes can hold such a run: the fits, in the order for_each
  // would reach them (a tie keeps the first), without walking every smaller free block.
  index.for_each_fit(size, std::numeric_limits<int>::max(), [&](Block* block) {
    const AddressRange& span = *block->range;
    if (!span.is_span || best_bytes == size) return;
    const std::size_t last = page_of(span, block->end() - 1) + 1;
    for (std::size_t first = span.next_page(true, page_of(span, block->address), last);
         first < last; first = span.next_page(true, first, last)) {
      const std::size_t end = span.next_page(false, first, last);
      const DevicePtr from = std::max(block->address, span.base + first * page_bytes_);
      const DevicePtr to = std::min(block->end(), span.base + end * page_bytes_);
      if (to - from >= size && to - from < best_bytes) {
        best_bytes = to - from;
        best = Placement{block, from, {false, 0}};
      }
      first = end;
    }
  });
  return best;
}

inline std::size_t CachingAllocator::Impl::pages_to_map(const AddressRange& span, DevicePtr address,
                                                        std::size_t size) const {
  const std::size_t first = page_of(span, address);
  const std::size_t last = page_of(span, address + size - 1);
  return last - first + 1 - span.count_mapped(first, last + 1);
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
  const bool first_shared = address - span.base != page_of(span, address) * page_bytes_;
  const bool last_shared =
      address + size - span.base != page_of(span, address + size) * page_bytes_;
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
