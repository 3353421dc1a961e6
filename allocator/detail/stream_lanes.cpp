// Lanes: heaps of their own, on one stream, for threads that contend for it (docs/design.md 4).
//
// Threads allocating on one stream all take that stream's lock on the fast path, and each
// operation moves the stream's free lists, blocks and ledger shard from core to core. Stream
// order makes any of a stream's free memory safe for any later work of that stream, so nothing
// ties a thread to the stream's one set of heaps: a thread whose fast path keeps finding the
// lock held gets a lane of the stream — heaps of its own, published like a stream's (own lock,
// own ledger shard) — as glibc's malloc gives a thread that finds its arena locked another one.
// Its allocations come from its lane; a block goes back to the lane it came from, whoever frees
// it. Threads that never allocate on one stream at the same moment never get a lane, and a
// single thread never does: placement is unchanged for them (the replay corpus).
//
// To the rest of the heap a lane is a stream: its own spans or segments, free lists, fences and
// clock; idle pages move between lanes as between streams (the slack, the cold rule);
// empty_cache and release_stream treat every lane. Events name the stream, so the ledger's
// per-stream figures are the stream's, over its lanes.
#include "allocator/detail/policy_state.hpp"

namespace vramledger {

// On the fast path, no lock needed: this thread's entry for `stream`, or null (lane 0).
inline LaneChoice* CachingAllocator::Impl::lane_choice_of_thread(StreamHandle stream) const {
  if (t_lane_choices.used == 0) [[likely]] return nullptr;
  return t_lane_choices.find(front_id_, stream);
}

// On the fast path, the lane's lock just taken (`waited`: it was held by another thread). True
// when this thread should have a lane of its own: the caller gives up, changing nothing, and the
// allocator's lock gives it one (heaps_for_thread).
inline bool CachingAllocator::Impl::note_lane_lock(LaneChoice* choice, StreamHandle stream,
                                                   bool waited) {
  if (options_.stream_lanes <= 1) [[unlikely]] return false;  // lanes off
  if (choice == nullptr) {
    if (!waited) [[likely]] return false;
    choice = &t_lane_choices.add(front_id_, stream);
  }
  if (!waited) {
    if (choice->wait_score > 0) --choice->wait_score;
    return false;
  }
  choice->wait_score += LaneChoice::kWaitWeight;
  if (choice->wait_score < LaneChoice::kWaitScoreForLane) return false;
  choice->wait_score = 0;
  choice->wants_new_lane = true;
  return true;
}

// Under the allocator's lock: the heaps this thread allocates from on `stream` — its lane, or a
// new one if it asked.
inline StreamHeaps& CachingAllocator::Impl::heaps_for_thread(StreamHandle stream) {
  LaneChoice* choice = lane_choice_of_thread(stream);
  if (choice == nullptr) return heaps_for(stream, 0);
  if (choice->wants_new_lane) {
    choice->wants_new_lane = false;
    choice->lane = new_lane_for(stream, choice->lane);
  }
  return heaps_for(stream, choice->lane);
}

// Under the allocator's lock, the fast path started (only it asks for lanes): the lane of
// `stream` for a thread that waited too often on lane `current`. Threads come and go (a
// benchmark's, a pool's), and their lanes stay. In order:
//  1. a lane, lane 0 included, that no thread has allocated from since the last such choice
//     (its thread gone or moved on);
//  2. a new one, while the stream has fewer than stream_lanes (AllocatorOptions, at most
//     kMaxLanes) and the fast path's slots last (kept for streams: a stream or lane without a
//     slot is served under the allocator's lock only);
//  3. the least busy lane, only if it served under half of what `current` did since the last
//     choice; else `current`. Moving to a lane as busy as one's own moves the contention along:
//     with 16 threads on one stream and 15 lanes they could be given (lane 0 never was, before
//     session 14), threads passed from lane to lane without end, each move leaving its memory
//     behind (H200 host: 7 driver calls per thousand pairs of the mixed ring, against 0.6 with a
//     stream per thread).
inline std::uint32_t CachingAllocator::Impl::new_lane_for(StreamHandle stream,
                                                          std::uint32_t current) {
  ++lane_choices_;
  const std::uint32_t max_lanes =
      static_cast<std::uint32_t>(std::min<std::size_t>(options_.stream_lanes, kMaxLanes));
  std::uint64_t used = 0;  // bit i: lane i exists
  StreamHeaps* idlest = nullptr;
  std::uint64_t idlest_allocations = UINT64_MAX;
  std::uint64_t current_allocations = 0;
  for (const auto& heaps : streams_) {
    if (heaps->stream != stream || heaps->lane >= kMaxLanes) continue;
    used |= std::uint64_t{1} << heaps->lane;
    const std::uint64_t since = heaps->allocations - heaps->allocations_at_lane_choice;
    heaps->allocations_at_lane_choice = heaps->allocations;
    if (heaps->lane == current) {
      current_allocations = since;
    } else if (since < idlest_allocations) {
      idlest = heaps.get();
      idlest_allocations = since;
    }
  }
  if (idlest != nullptr && idlest_allocations == 0) return idlest->lane;
  if (mutex_.slots_left() > kSlotsKeptForStreams) {
    for (std::uint32_t lane = 1; lane < max_lanes; ++lane) {
      if ((used & (std::uint64_t{1} << lane)) == 0) return lane;
    }
  }
  if (idlest != nullptr && idlest_allocations * 2 < current_allocations) return idlest->lane;
  return current;
}

// Under the allocator's lock, each time an allocation found it held by another thread: once
// that has happened often enough, several threads allocate at once and the per-stream fast path
// starts (if the observer takes concurrent events), even with one stream, so that they can get
// lanes. Before, one stream's allocations never leave the allocator's lock.
inline void CachingAllocator::Impl::note_allocator_lock_waited() {
  if (!stream_path_possible_ || ++allocator_lock_waits_ < kWaitsBeforeStreamPath) return;
  start_stream_path_locked();
}

}  // namespace vramledger
