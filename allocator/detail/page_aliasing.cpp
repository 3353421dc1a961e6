// alias_pending_pages (AllocatorOptions): a stream's own free pages whose last use is still
// queued serve a new address by mapping their memory there too; the old address retires
// (is unmapped) once the fence covering its free completes.
#include <optional>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

// alias_pending_pages: a chunk of `owner`'s, wholly inside a free block whose last use is
// still queued (so it cannot be unmapped yet), of at most `max_pages` pages. Its physical
// memory leaves the old address (which turns retiring: still mapped in the driver, unusable)
// for the caller to map at the new one. For `owner`'s own new address (no `requester`, or
// `owner` itself), work queued on the stream before the free runs before anything the new
// address is used for; another `requester` stream is first made to wait on the GPU for the
// fence covering the free. Either way the sharing is safe; the ledger sees an unmap here.
inline std::optional<PhysicalChunk> CachingAllocator::Impl::alias_pending_chunk(
    StreamHeaps& owner, PoolKind pool, std::size_t max_pages, const PageExclusion& exclusion,
    StreamHeaps* requester) {
  retire_mappings(owner, /*wait=*/false);
  const int p = pool_index(pool);
  for (Block* b : free_blocks_with_mapped_pages(owner, p)) {
    if (owner.fence_done(b->freed_at_fence)) continue;
    AddressRange* span = b->range;
    const auto [first, last] = whole_pages(*span, b->address, b->end());
    const std::optional<std::size_t> head =
        span->first_mapped(first, last, [&, last = last](std::size_t page) {
          if (!span->is_chunk_head(page)) return false;
          const std::size_t pages = span->chunk_pages(page);
          return pages <= max_pages && page + pages <= last &&
                 !exclusion.intersects(span, page, pages);
        });
    if (!head) continue;
    issue_fence(owner);  // the fence that will prove the old address idle must exist
    if (requester != nullptr && requester != &owner &&
        !order_after_fence(*requester, owner, b->freed_at_fence)) {
      return std::nullopt;
    }
    const PhysicalChunk chunk = span->clear_chunk_mapped(*head);
    span->set_retiring(*head, chunk.pages, true, b->freed_at_fence);
    owner.retiring.push_back({span, *head, chunk.pages, b->freed_at_fence, chunk.handle, nullptr});
    ++owner.retiring_changes;
    ++retiring_mappings_;
    owner.free_mapped_pages[p] -= chunk.pages;
    emit(EventKind::kUnmap, pool, owner.stream, span->base + *head * page_bytes_,
         chunk.pages * page_bytes_);
    return chunk;
  }
  return std::nullopt;
}

// A chunk of another stream's pending pages for `requester` (see alias_pending_chunk).
inline std::optional<PhysicalChunk> CachingAllocator::Impl::alias_other_streams_pending_chunk(
    StreamHeaps& requester, PoolKind pool, std::size_t max_pages, const PageExclusion& exclusion) {
  for (auto& heaps : streams_) {
    if (heaps.get() == &requester) continue;
    // Under the cold rule, pages freed so recently that the GPU may still use them are cold
    // only on a quiet stream.
    if (cold_rule_applies_ && !stream_is_quiet(*heaps)) continue;
    if (auto chunk = alias_pending_chunk(*heaps, pool, max_pages, exclusion, &requester)) {
      return chunk;
    }
  }
  return std::nullopt;
}

// Makes `waiter` wait, on the GPU, for the fence of `owner` that covers frees made while
// owner.next_fence was `sequence` (issued already). False when the wait cannot be queued.
inline bool CachingAllocator::Impl::order_after_fence(StreamHeaps& waiter, StreamHeaps& owner,
                                                      std::uint64_t sequence) {
  poll_fences(owner);
  if (owner.fence_done(sequence)) return true;
  for (const auto& [event, fence] : owner.outstanding_fences) {
    if (fence >= sequence) return backend_.stream_wait_event(waiter.stream, event).is_ok();
  }
  return false;
}

// Unmaps the old addresses of aliased or moved chunks once the work queued before their free
// has finished (with `wait`, waiting for it); only those in pages [first, last) of `span` when
// one is given. Without `wait` and with unmap_in_background, an old address whose work is done
// goes to the helper thread instead, and is forgotten here once the helper has unmapped it.
inline void CachingAllocator::Impl::retire_mappings(StreamHeaps& heaps, bool wait,
                                                    const AddressRange* span, std::size_t first,
                                                    std::size_t last) {
  if (heaps.retiring.empty()) return;
  poll_fences(heaps);
  const bool whole_look = !wait && span == nullptr;
  const auto now = [&] {
    return StreamHeaps::RetireLook{heaps.retiring_changes, heaps.completed_fence,
                                   background_unmaps_.runs_ended()};
  };
  if (whole_look && heaps.last_retire_look == now()) return;
  for (std::size_t i = 0; i < heaps.retiring.size();) {
    StreamHeaps::RetiringMapping& r = heaps.retiring[i];
    const bool wanted =
        span == nullptr || (r.span == span && r.head < last && r.head + r.pages > first);
    if (!wanted || (!wait && !heaps.fence_done(r.fence))) {
      ++i;
      continue;
    }
    if (!wait && unmap_in_background_) {
      hand_to_helper(r);
      if (!BackgroundUnmaps::done(*r.job)) {
        ++i;
        continue;
      }
    }
    retire(heaps, i);
  }
  if (whole_look) heaps.last_retire_look = now();
}

// Unmaps retiring mapping `index` of `heaps`, waiting for its fence first if need be.
inline void CachingAllocator::Impl::retire(StreamHeaps& heaps, std::size_t index) {
  const StreamHeaps::RetiringMapping r = heaps.retiring[index];
  if (!heaps.fence_done(r.fence)) {
    wait_for_fence(heaps, r.fence);
    if (!heaps.fence_done(r.fence)) {
      throw_if_error(wait_for_device(), "waiting for aliased pages");
      mark_all_frees_idle(heaps);
    }
  }
  const DevicePtr va = r.span->base + r.head * page_bytes_;
  // Handed to the helper: done by now, or run here (or waited for) before the address is reused.
  throw_if_error(r.job != nullptr ? background_unmaps_.finish(*r.job)
                                  : backend_.unmap_pages(va, r.pages * page_bytes_, 1),
                 [&] { return "unmapping the old address " + format_hex(va) + " of moved memory"; });
  r.span->set_retiring(r.head, r.pages, false);
  heaps.retiring[index] = heaps.retiring.back();
  heaps.retiring.pop_back();
  ++heaps.retiring_changes;
  --retiring_mappings_;
}

// Retiring mapping `r`, whose work is done, is unmapped by the helper thread from now on.
inline void CachingAllocator::Impl::hand_to_helper(StreamHeaps::RetiringMapping& r) {
  if (r.job == nullptr) {
    r.job = background_unmaps_.submit(r.span->base + r.head * page_bytes_, r.pages * page_bytes_);
  }
}

inline void CachingAllocator::Impl::finish_background_unmaps() {
  std::lock_guard lock(mutex_);
  for (auto& heaps : streams_) {
    retire_each(*heaps, [](const StreamHeaps::RetiringMapping& r) { return r.job != nullptr; });
  }
}

// Physical memory leaving its stream (the free physical pool, the driver) must no longer be
// mapped at an old address whose work may still run.
// Memory aliased more than once (a new address freed and aliased again before the old one
// retired) is still mapped at every one of those addresses: each must retire, the latest fence
// last (found by the randomized stress test's hazard check: retiring only the first let another
// stream take memory that work queued before the second free still used).
// With `only_if_unsafe` (the memory is about to be mapped elsewhere, not released), old
// addresses whose work has finished may stay mapped: their unmap goes to the helper thread
// (unmap_in_background) or happens here.
inline void CachingAllocator::Impl::retire_handle(PhysicalHandle handle, bool only_if_unsafe) {
  for (auto& heaps : streams_) {
    for (std::size_t i = 0; i < heaps->retiring.size();) {
      StreamHeaps::RetiringMapping& r = heaps->retiring[i];
      if (r.handle != handle) {
        ++i;
        continue;
      }
      if (only_if_unsafe && unmap_in_background_ && heaps->fence_done(r.fence)) {
        hand_to_helper(r);
        ++i;
        continue;
      }
      retire(*heaps, i);  // moves the last entry to i
    }
  }
}

}  // namespace vramledger
