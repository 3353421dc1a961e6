// The per-stream fast path (docs/design.md 4): an allocation that a free block of its own
// stream serves without growing the heap, and the free of a block no other stream used, run
// under that stream's lock alone, so threads on their own streams do not wait for each other.
// Everything else — growth, pages to map, cross-stream frees, errors, sleep, queries — takes
// the allocator's lock (StreamLocks: the global lock and every stream's), as before.
//
// The fast path makes exactly the decisions the locked path would in the same state: it runs
// only where the locked path would do no more than take the stream's best fit (and split it),
// or free and merge, and it gives up, changing nothing, as soon as that is not so. So placement,
// and every figure of a single-threaded run, are unchanged.
#include <mutex>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

// Under the allocator's lock, when a second stream comes: every stream's heaps published (each
// locked now, as the rest of the allocator's lock), the live map's shards locked from now on,
// then the fast path open. Only if the observer takes events from several threads at once;
// otherwise never again. Until now every event came under the allocator's lock, so the observer
// changes mode between two events.
inline void CachingAllocator::Impl::start_stream_path_locked() {
  stream_path_possible_ = false;
  if (observer_ != nullptr && !observer_->accept_concurrent_events()) return;
  for (auto& heaps : streams_) publish_stream_locked(*heaps);
  live_.set_locking();
  stream_path_.store(true, std::memory_order_release);
}

// Under the allocator's lock: `heaps` gets a slot (stream_locks.hpp) and, if the observer has
// them, a ledger shard for its fast path's events.
inline void CachingAllocator::Impl::publish_stream_locked(StreamHeaps& heaps) {
  if (!mutex_.publish(heaps) || observer_ == nullptr) return;
  heaps.ledger_shard = observer_->open_stream_shard();
}

// Under the allocator's lock: the shard folded and closed (no fast path can be in it: its stream
// lock is held), then the slot given up.
inline void CachingAllocator::Impl::withdraw_stream_locked(StreamHeaps& heaps) {
  if (heaps.ledger_shard != nullptr) {
    observer_->close_shard(heaps.ledger_shard);
    heaps.ledger_shard = nullptr;
  }
  mutex_.withdraw(heaps);
}

// At teardown (no other thread uses the allocator any more).
inline void CachingAllocator::Impl::close_stream_shards() noexcept {
  for (auto& heaps : streams_) {
    if (heaps->ledger_shard == nullptr) continue;
    observer_->close_shard(heaps->ledger_shard);
    heaps->ledger_shard = nullptr;
  }
}

// Under the event's stream lock, on the fast path: its shard counts the event under the shard's
// own mutex; past its credit (or with its staged records full) the observer's slow path counts
// it with the stream's lock still held. Releasing it first, as a front cache does, would let the
// stream's next operation (on another thread) reach the ledger before this one: a split made
// here and taken there would be counted taken before made, and a peak could be missed. The slow
// path takes the ledger's mutex, then every shard's: a stream lock is never taken under either
// (docs/design.md 4).
inline void CachingAllocator::Impl::report_to_stream_shard(ObserverShard& shard,
                                                           const AllocatorEvent& event) {
  // Biased to the thread that reports here most, as the stream's lock is (the same thread).
  BiasedMutex& mutex = shard.mutex();
  mutex.lock_auto();
  const bool counted = shard.try_apply(event);
  mutex.unlock_auto();
  if (!counted) [[unlikely]] {
    ++t_stream_shard_slow_paths;
    shard.apply_slow(event);
  }
}

// Under a stream's lock: nothing the allocator's lock must do first or refuse. These fields
// change only under the allocator's lock, which holds every published stream's lock.
inline bool CachingAllocator::Impl::stream_path_open_locked() const {
  return pending_.empty() && sleeping_tags_.empty() && !pool_asleep_ && pending_split_.empty();
}

// The block, or 0 when the allocator's lock must serve the request (nothing changed then).
inline DevicePtr CachingAllocator::Impl::stream_allocate(std::size_t bytes, std::size_t size,
                                                         PoolKind pool, StreamHandle stream,
                                                         TagId tag, ThreadCache* adopt_into) {
  LaneChoice* lane = lane_choice_of_thread(stream);  // detail/stream_lanes.cpp
  StreamHeaps* heaps = mutex_.find(stream, lane == nullptr ? 0 : lane->lane);
  if (heaps == nullptr) return 0;
  bool waited = !heaps->mutex.try_lock();
  if (waited) {
    heaps->mutex.lock();
    // Held by the allocator's lock (growth, pages to map): no other thread of this lane.
    waited = !mutex_.global_held();
  }
  std::lock_guard lock(heaps->mutex, std::adopt_lock);
  // A thread that keeps waiting here for others of its lane gets a lane of its own, under the
  // allocator's lock (detail/stream_lanes.cpp).
  if (note_lane_lock(lane, stream, waited)) return 0;
  if (!heaps->open.load(std::memory_order_relaxed) || !stream_path_open_locked()) return 0;
  FreeBlockIndex& index = heaps->free[pool_index(pool)];
  Block* block = index.find(size);
  if (block == nullptr) return 0;  // growth, or blocks pending on other streams to adopt
  SplitDelta split;
  if (paged_) {
    // Pages to map come from the physical pool, other streams' idle pages, the cap: all shared.
    // When the best fit needs some, the locked path (allocate_paged) first adopts pending frees
    // (none: pending_ is empty here) and retires the stream's old aliased addresses, then places
    // the allocation by placement_when_best_fit_needs_pages. With nothing to retire that choice
    // reads only this stream's index and spans, so where it needs no page it is the place the
    // locked path would take. (Before it included the tightest mapped run here, 1.6% of the
    // mixed ring's allocations on 8 threads took the allocator's lock for it.)
    DevicePtr address = block->address;
    if (pages_to_map(*block->range, address, size) > 0) {
      // Old addresses whose work is done (moved chunks the helper thread unmaps, aliased ones
      // past their fence) change no placement: the locked path would only forget or hand them
      // to the helper. One still behind its fence might, once the locked path polls it.
      // (Bailing on any retiring entry sent 1-1.7 allocations per thousand pairs to the lock
      // with unmap_in_background, against 0.06-0.16 without: MixedThreads, 8 threads, VM.)
      if (any_retiring_behind_fence(*heaps)) return 0;
      const Placement best = placement_when_best_fit_needs_pages(index, pool, size, block);
      if (!best.needs_nothing()) return 0;
      block = best.block;
      address = best.address;
    }
    // Once the place is known (a miss leaves the rooms alone): short of room that no stream
    // and no spare holds, the peak of active bytes would rise, so the allocator's lock serves
    // it (detail/active_bytes.cpp).
    if (!take_active_room(*heaps, size)) return 0;
    block = take_from_span(index, block, address, size, split);
  } else {
    take_from_segment(index, pool, block, size, split);
  }
  split.shard = heaps->ledger_shard;
  const DevicePtr address = hand_out(block, bytes, stream, tag, split);
  if (adopt_into != nullptr && block->size <= front_max_block_) {
    adopt_front_block(*adopt_into, block, bytes, stream);
    // Its allocation waits in this stream's shard, what follows (its free, its next allocations)
    // in the cache's: the trace must have the allocation first, as the locked path's would.
    if (heaps->ledger_shard != nullptr) heaps->ledger_shard->publish();
  }
  return address;
}

// Under `heaps`' lock: whether `block` (live, at the address being freed) may be freed here.
inline bool CachingAllocator::Impl::stream_free_allowed_locked(const StreamHeaps& heaps,
                                                               const Block* block) const {
  return heaps.open.load(std::memory_order_relaxed) && stream_path_open_locked() &&
         block->range->owner == &heaps && block->state == BlockState::kAllocated &&
         block->stream_uses.empty() && block->front == nullptr &&
         // A trim of free mapped pages unmaps other streams' pages too.
         (!block->range->is_span || options_.max_free_mapped_bytes == SIZE_MAX);
}

// Whether the free was done here; false: nothing changed, the allocator's lock frees it (or
// reports the error).
inline bool CachingAllocator::Impl::stream_deallocate(DevicePtr ptr) {
  // The block's stream is known only from the live map. Usually its lock is free and is taken
  // with try_lock while the map's shard is held (one lookup); else it is waited for after the
  // shard's lock is released (the lock order: stream, then shard) and the block looked up
  // again. Only open heaps are locked: those are never destroyed before the allocator.
  StreamHeaps* heaps = nullptr;
  Block* block = nullptr;
  bool locked = false;
  live_.with_shard_of(ptr, [&](BlockAddressMap& map) {
    Block* found = map.find(ptr);
    if (found == nullptr || !found->range->owner->open.load(std::memory_order_relaxed)) return;
    heaps = found->range->owner;
    if (!heaps->mutex.try_lock()) return;
    locked = true;
    if (stream_free_allowed_locked(*heaps, found)) {
      map.erase(ptr);
      block = found;
    }
  });
  if (heaps == nullptr) return false;
  if (!locked) {
    heaps->mutex.lock();
    live_.with_shard_of(ptr, [&](BlockAddressMap& map) {
      Block* found = map.find(ptr);
      if (found != nullptr && stream_free_allowed_locked(*heaps, found)) {
        map.erase(ptr);
        block = found;
      }
    });
  }
  std::lock_guard lock(heaps->mutex, std::adopt_lock);
  if (block == nullptr) return false;
  SplitDelta split;
  split.shard = heaps->ledger_shard;
  complete_free(block, EventKind::kFree, split);
  return true;
}

}  // namespace vramledger
