// Giving memory back: empty_cache, release_stream, the trims of free mapped pages and free
// physical memory, and the best-effort teardown.
#include <vector>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

inline void CachingAllocator::Impl::empty_cache() {
  std::lock_guard lock(mutex_);
  process_completed_frees_locked();
  release_cached_locked();
}

inline void CachingAllocator::Impl::release_stream(StreamHandle stream) {
  std::lock_guard lock(mutex_);
  flush_front_caches_locked(&stream);
  throw_if_error(wait_for_device(), "release_stream: synchronizing the device");
  // Uses on the released stream are complete now; forget them.
  live_.for_each([&](Block* block) {
    auto& uses = block->stream_uses;
    uses.erase(std::remove(uses.begin(), uses.end(), stream), uses.end());
  });
  process_completed_frees_locked();
  // Every lane of the stream (detail/stream_lanes.cpp); the free physical memory they leave is
  // released once, after all of them.
  bool released = false;
  for (std::size_t i = 0; i < streams_.size();) {
    StreamHeaps& heaps = *streams_[i];
    if (heaps.stream != stream) {
      ++i;
      continue;
    }
    released = true;
    mark_all_frees_idle(heaps);
    for (int p = 0; p < 2; ++p) release_idle_ranges(heaps, p, /*free_spans=*/true);
    if (!heaps.ranges[0].empty() || !heaps.ranges[1].empty()) {
      ++i;
      continue;
    }
    if (last_stream_ == &heaps) last_stream_ = nullptr;
    give_back_active_room_locked(heaps);  // no active block left in it
    if (heaps.open.load(std::memory_order_relaxed)) {
      // A fast path may be about to lock it: it stays, closed (stream_locks.hpp).
      withdraw_stream_locked(heaps);
      withdrawn_streams_.push_back(std::move(streams_[i]));
    }
    streams_.erase(streams_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  if (released) trim_free_physical(0);
}

inline void CachingAllocator::Impl::release_cached_locked() {
  flush_front_caches_locked(nullptr);  // parked blocks are cached memory too
  if (paged_) {
    // One fence per stream covers every page freed so far; wait for all of them.
    for (auto& heaps : streams_) {
      if (heaps->page_freed_since_last_fence || !heaps->outstanding_fences.empty()) {
        issue_fence(*heaps);
        wait_for_fence(*heaps, heaps->next_fence - 1);
      }
      retire_mappings(*heaps, /*wait=*/true);
    }
  }
  for (auto& heaps : streams_) {
    for (int p = 0; p < 2; ++p) release_idle_ranges(*heaps, p);
  }
  if (paged_) {
    for (PoolKind pool : {PoolKind::kSmall, PoolKind::kLarge}) {
      unmap_idle_chunks(pool, SIZE_MAX, SIZE_MAX, /*wait=*/true, PageExclusion{});
    }
  }
  trim_free_physical(0);
}

// Segment heap: returns fully free segments. Paged heap: unmaps the pages of spans with no
// active block, and with free_spans also gives their address space back.
inline void CachingAllocator::Impl::release_idle_ranges(StreamHeaps& heaps, int p,
                                                        bool free_spans) {
  auto& ranges = heaps.ranges[p];
  for (std::size_t i = 0; i < ranges.size();) {
    AddressRange* range = ranges[i];
    // A sleeping pool's segment keeps its address until the wake (detail/pool_sleep.cpp).
    if (range->active_blocks != 0 || range->memory_released) {
      ++i;
      continue;
    }
    if (range->is_span) {
      std::vector<std::size_t> heads;
      range->for_each_mapped(0, range->mapped_bits.size() * 64, [&](std::size_t page) {
        if (range->is_chunk_head(page)) heads.push_back(page);
      });
      for (std::size_t head : heads) unmap_chunk(*range, head, /*was_free=*/true);
      if (!free_spans) {
        ++i;
        continue;
      }
      retire_mappings(heaps, /*wait=*/true, range);
      throw_if_error(backend_.free_address_range(range->base, range->size),
                     [&] { return "freeing the address span at " + format_hex(range->base); });
      heaps.free[p].remove(range->first);
      heaps.blocks.destroy(range->first);
      emit(EventKind::kVirtualRelease, range->pool, heaps.stream, range->base, range->size);
      delete range;
      ranges[i] = ranges.back();
      ranges.pop_back();
      continue;
    }
    Block* block = range->first;
    throw_if_error(backend_.free_segment(range->base, range->size, heaps.stream), [&] {
      return "returning the " + format_bytes_exact(range->size) + " segment at " +
             format_hex(range->base);
    });
    heaps.free[p].remove(block);
    set_inactive_split(block, false);
    heaps.blocks.destroy(block);
    reserved_bytes_ -= range->size;
    emit(EventKind::kSegmentRelease, range->pool, heaps.stream, range->base, range->size);
    delete range;
    ranges[i] = ranges.back();
    ranges.pop_back();
  }
}

inline void CachingAllocator::Impl::trim_free_mapped(PoolKind pool) {
  const int p = pool_index(pool);
  const std::size_t keep = options_.max_free_mapped_bytes / page_bytes_;
  const std::size_t free_mapped = free_mapped_pages(p);
  if (free_mapped <= keep) return;
  unmap_idle_chunks(pool, free_mapped - keep, SIZE_MAX, /*wait=*/false,
                    PageExclusion{});
  trim_free_physical(options_.max_free_physical_bytes);
}

// Releases free physical chunks beyond `keep_bytes` to the driver, largest first.
inline void CachingAllocator::Impl::trim_free_physical(std::size_t keep_bytes) {
  if (!paged_) return;
  for (PoolKind pool : {PoolKind::kSmall, PoolKind::kLarge}) {
    while (free_physical_pages_[pool_index(pool)] * page_bytes_ > keep_bytes) {
      release_chunk(pool, *take_spare(pool, SIZE_MAX));
    }
  }
}

// Best effort at destruction: the device may already be gone, so errors are ignored. Ranges
// that still hold live blocks are left alone: their memory belongs to whoever holds them.
inline void CachingAllocator::Impl::release_everything_at_exit() noexcept {
  (void)wait_for_device();
  for (auto& heaps : streams_) {
    for (const auto& r : heaps->retiring) {
      if (r.job != nullptr) {
        (void)background_unmaps_.finish(*r.job);
      } else {
        (void)backend_.unmap_pages(r.span->base + r.head * page_bytes_, r.pages * page_bytes_, 1);
      }
    }
    heaps->retiring.clear();
    ++heaps->retiring_changes;
    retiring_mappings_ = 0;
  }
  for (auto& heaps : streams_) {
    for (int p = 0; p < 2; ++p) {
      for (AddressRange* range : heaps->ranges[p]) {
        if (range->active_blocks == 0) {
          if (range->is_span) {
            bool all_unmapped = true;
            range->for_each_mapped(0, range->mapped_bits.size() * 64, [&](std::size_t page) {
              if (!range->is_chunk_head(page)) return;
              const std::size_t bytes = range->chunk_pages(page) * page_bytes_;
              if (backend_.unmap_pages(range->base + page * page_bytes_, bytes, 1)) {
                (void)backend_.release_physical(range->page_mapping[page].handle);
              } else {
                all_unmapped = false;
              }
            });
            if (all_unmapped) (void)backend_.free_address_range(range->base, range->size);
          } else {
            (void)backend_.free_segment(range->base, range->size, heaps->stream);
          }
        }
        for (Block* b = range->first; b != nullptr;) {
          Block* next = b->next;
          heaps->blocks.destroy(b);
          b = next;
        }
        delete range;
      }
    }
    for (auto& [event, sequence] : heaps->outstanding_fences) {
      (void)backend_.destroy_event(event);
    }
  }
  for (const PendingEvent& entry : pending_) (void)backend_.destroy_event(entry.event);
  for (EventHandle event : spare_events_) (void)backend_.destroy_event(event);
  for (auto& spare : free_physical_) {
    for (auto& [pages, handles] : spare) {
      for (PhysicalHandle handle : handles) (void)backend_.release_physical(handle);
    }
  }
}

}  // namespace vramledger
