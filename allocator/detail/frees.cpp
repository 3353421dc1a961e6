// Frees. A block no other stream used is free at once; one recorded on other streams
// (record_stream) stays active until events recorded there at free time complete — or until its
// own stream needs memory and adopts it (adopt_pending_frees): the stream then waits on those
// events on the GPU, so its new work is ordered after every use, and the block is free at once.
#include <algorithm>
#include <unordered_map>
#include <utility>
#include <vector>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

inline void CachingAllocator::Impl::deallocate(DevicePtr ptr) {
  if (stream_path_.load(std::memory_order_acquire) && stream_deallocate(ptr)) return;
  std::lock_guard lock(mutex_);
  Block* block = live_.find(ptr);
  if (block == nullptr) throw_unknown_pointer(ptr, "free");
  if (block->state == BlockState::kSleeping) refuse_asleep(block->tag, ptr, "free");
  if (block->state == BlockState::kPendingFree) {
    throw Error(ErrorCode::kDoubleFree,
                "pointer " + format_hex(ptr) +
                    " was already freed (its memory still waits for other streams)");
  }
  if (block->stream_uses.empty()) {
    // Held by a front cache (another thread's, or this thread's while it sheds): it lets go
    // (detail/front_cache.cpp; a parked one is a double free, refused with nothing changed).
    if (block->front != nullptr) detach_front_block_locked(block, "free");
    live_.erase(ptr);
    complete_free(block, EventKind::kFree);
    return;
  }
  // Record an event on every other stream that used the block; all or nothing.
  std::vector<EventHandle> events;
  events.reserve(block->stream_uses.size());
  for (StreamHandle use : block->stream_uses) {
    EventHandle event = 0;
    try {
      event = take_event();
    } catch (...) {
      spare_events_.insert(spare_events_.end(), events.begin(), events.end());
      throw;
    }
    Status status = backend_.record_event(event, use);
    if (!status) {
      spare_events_.push_back(event);
      spare_events_.insert(spare_events_.end(), events.begin(), events.end());
      throw Error(status.code(),
                  "cannot free " + format_hex(ptr) + ": recording its use on stream " +
                      format_hex(use) + " failed (" + status.message() +
                      "); the block stays allocated. If that stream was destroyed, call "
                      "release_stream() for it first.");
    }
    events.push_back(event);
  }
  block->state = BlockState::kPendingFree;
  block->pending_events = static_cast<int>(events.size());
  for (EventHandle event : events) pending_.push_back({block, event});
  emit_block(EventKind::kFreeRequested, block);
}

inline void CachingAllocator::Impl::deallocate_as_ordered(DevicePtr ptr) {
  {
    std::lock_guard lock(mutex_);
    Block* block = live_.find(ptr);
    if (block == nullptr) throw_unknown_pointer(ptr, "free");
    if (block->state == BlockState::kAllocated) block->stream_uses.clear();
  }
  deallocate(ptr);  // a pending free still reports the double free
}

inline void CachingAllocator::Impl::record_stream(DevicePtr ptr, StreamHandle stream) {
  std::lock_guard lock(mutex_);
  Block* block = live_.find(ptr);
  if (block == nullptr) throw_unknown_pointer(ptr, "record_stream on");
  if (block->state == BlockState::kSleeping) refuse_asleep(block->tag, ptr, "record_stream on");
  if (block->state != BlockState::kAllocated) {
    throw Error(ErrorCode::kDoubleFree,
                "record_stream on " + format_hex(ptr) + ", which was already freed");
  }
  if (stream == block->range->owner->stream) return;
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) ==
      block->stream_uses.end()) {
    block->stream_uses.push_back(stream);
  }
}

inline EventHandle CachingAllocator::Impl::take_event() {
  if (!spare_events_.empty()) {
    EventHandle event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  EventHandle event = 0;
  throw_if_error(backend_.create_event(&event), "creating an event");
  return event;
}

// `kind` is kFree for a free that completes at once, else kFreeCompleted.
inline void CachingAllocator::Impl::complete_free(Block* block, EventKind kind,
                                                  SplitDelta& split) {
  AddressRange& range = *block->range;
  StreamHeaps& owner = *range.owner;
  if (range.is_span) mark_pages(*block, -1, split);
  AllocatorEvent event{kind};  // sent once the merges below have added their split changes
  event.pool = range.pool;
  event.stream = owner.stream;
  event.address = block->address;
  event.size = block->size;
  event.requested = block->requested;
  event.tag = block->tag;
  const DevicePtr freed_start = block->address;
  const DevicePtr freed_end = block->end();
  sub_active(owner, block->size);
  block->state = BlockState::kFree;
  block->requested = 0;
  block->tag = kUntagged;
  block->stream_uses.clear();
  block->pending_events = 0;
  range.active_blocks--;

  FreeBlockIndex& index = owner.free[pool_index(range.pool)];
  if (Block* prev = block->prev; prev != nullptr && prev->state == BlockState::kFree) {
    index.remove(prev);
    set_inactive_split(prev, false, split);
    prev->size += block->size;
    unlink(block);
    block = prev;
  }
  if (Block* next = block->next; next != nullptr && next->state == BlockState::kFree) {
    index.remove(next);
    set_inactive_split(next, false, split);
    block->size += next->size;
    unlink(next);
  }
  index.insert(block);
  refresh_inactive_split(block, split);
  split.home = owner.ledger_shard;
  emit_with(split, event.kind, event.pool, event.stream, event.address, event.size,
            event.requested, event.tag);
  if (!range.is_span) return;

  // Pages the freed bytes touched that now lie wholly in free space.
  const auto [whole_first, whole_last] = whole_pages(range, block->address, block->end());
  const std::size_t lo = std::max(page_of(range, freed_start), whole_first);
  const std::size_t hi = std::min(page_of(range, freed_end - 1) + 1, whole_last);
  if (hi > lo) {
    owner.free_mapped_pages[pool_index(range.pool)] += range.count_mapped(lo, hi);
    // Only chunk_is_cold reads the stamps, and only when the option is on.
    if (options_.cross_stream_cold_allocations != 0) {
      const std::size_t stamped = std::min(hi, range.page_idle_since.size());
      for (std::size_t page = lo; page < stamped; ++page) {
        range.page_idle_since[page] = owner.allocations;
      }
    }
  }
  // Work queued on the stream so far may still touch these bytes.
  block->freed_at_fence = owner.next_fence;
  owner.page_freed_since_last_fence = true;
  if (options_.max_free_mapped_bytes != SIZE_MAX) trim_free_mapped(range.pool);
}

inline void CachingAllocator::Impl::process_completed_frees() {
  std::lock_guard lock(mutex_);
  process_completed_frees_locked();
}

inline void CachingAllocator::Impl::process_completed_frees_locked() {
  for (std::size_t i = 0; i < pending_.size();) {
    PendingEvent entry = pending_[i];
    EventState state = EventState::kPending;
    throw_if_error(backend_.query_event(entry.event, &state),
                   "querying a cross-stream free event");
    if (state != EventState::kComplete) {
      ++i;
      continue;
    }
    spare_events_.push_back(entry.event);
    pending_[i] = pending_.back();
    pending_.pop_back();
    if (--entry.block->pending_events == 0) {
      live_.erase(entry.block->address);
      complete_free(entry.block, EventKind::kFreeCompleted);
    }
  }
}

// Stream-ordered reuse of cross-stream frees (AllocatorOptions::adopt_pending_frees): every
// block of `owner`'s `pool` still awaiting other streams becomes free on `owner` after `owner` is
// made to wait, on the GPU, for the events recorded at its free. Work queued on `owner` from now
// on runs after every use of the block, so reusing it is as safe as reusing a block freed on the
// stream itself; whether it happens no longer depends on how far the GPU has got. A block whose
// wait cannot be queued (a capturing or broken stream) stays pending. Returns the blocks adopted.
inline std::size_t CachingAllocator::Impl::adopt_pending_frees(StreamHeaps& owner, PoolKind pool) {
  if (!options_.adopt_pending_frees || pending_.empty()) return 0;
  // One pass over the pending events (a rescan per adopted block made this quadratic): the
  // owner's blocks in the order of their first event, each with whether all its waits queued.
  std::vector<std::pair<Block*, bool>> blocks;
  std::unordered_map<const Block*, std::size_t> index_of;
  for (const PendingEvent& entry : pending_) {
    Block* block = entry.block;
    if (block->range->owner != &owner || block->range->pool != pool) continue;
    const auto [it, first] = index_of.try_emplace(block, blocks.size());
    if (first) blocks.emplace_back(block, true);
    // All of the block's events, or none: after a wait that fails the block stays pending as it
    // was (the waits already queued only delay the stream).
    bool& queued = blocks[it->second].second;
    if (queued && !backend_.stream_wait_event(owner.stream, entry.event)) queued = false;
  }
  if (blocks.empty()) return 0;
  // The waits captured the adopted blocks' events' work: the handles may be recorded again.
  std::size_t kept = 0;
  for (const PendingEvent& entry : pending_) {
    const auto it = index_of.find(entry.block);
    if (it != index_of.end() && blocks[it->second].second) {
      spare_events_.push_back(entry.event);
    } else {
      pending_[kept++] = entry;
    }
  }
  pending_.resize(kept);
  std::size_t adopted = 0;
  for (const auto& [block, queued] : blocks) {
    if (!queued) continue;
    live_.erase(block->address);
    complete_free(block, EventKind::kFreeCompleted);
    ++adopted;
  }
  return adopted;
}

}  // namespace vramledger
