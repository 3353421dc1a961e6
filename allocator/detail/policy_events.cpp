// The events every policy operation sends its observer (the ledger): one per operation, built
// here, carrying the inactive split changes the operation made (AllocatorEvent). Under the
// allocator's lock an event goes to the observer; on a stream's fast path to that stream's
// ledger shard (detail/stream_fast_path.cpp), so threads on their own streams share no lock.
#include "allocator/detail/policy_state.hpp"

namespace vramledger {

inline void CachingAllocator::Impl::emit(EventKind kind, PoolKind pool, StreamHandle stream,
                                         DevicePtr address, std::size_t size,
                                         std::size_t requested, TagId tag) {
  emit_with(pending_split_, kind, pool, stream, address, size, requested, tag);
}

inline void CachingAllocator::Impl::emit_with(SplitDelta& split, EventKind kind, PoolKind pool,
                                              StreamHandle stream, DevicePtr address,
                                              std::size_t size, std::size_t requested,
                                              TagId tag) {
  // A front cache's parked block going back to its heap was counted free when the user freed it.
  if (kind == EventKind::kFree && returning_front_block_) kind = EventKind::kFrontCacheReturn;
  if (observer_ == nullptr) {
    split = SplitDelta{};
    return;
  }
  AllocatorEvent event;
  event.kind = kind;
  event.pool = pool;
  event.tag = tag;
  event.stream = stream;
  event.address = address;
  event.size = size;
  event.requested = requested;
  event.inactive_split_delta = split.count;
  event.inactive_split_bytes_delta = split.bytes;
  event.home_shard = split.home;
  ObserverShard* shard = split.shard;
  split = SplitDelta{};
  if (shard != nullptr) {
    report_to_stream_shard(*shard, event);
  } else {
    observer_->on_event(event);
  }
}

// Inactive split changes wait for the event of the operation that caused them and travel on it
// (see AllocatorEvent), so the fast path sends one event per call.
inline void CachingAllocator::Impl::note_split_change(int count, std::int64_t bytes,
                                                      SplitDelta& split) {
  split.count += count;
  split.bytes += bytes;
}

inline void CachingAllocator::Impl::emit_block(EventKind kind, const Block* block) {
  emit(kind, block->range->pool, block->range->owner->stream, block->address, block->size,
       block->requested, block->tag);
}

}  // namespace vramledger
