// The paged heap's active bytes and their exact peak (the cross-stream slack's base), counted
// per stream's heaps so that threads on their own streams share no cache line.
//
// One atomic sum written by every paged allocation and free of every thread was a quarter of
// the mixed ring's time on two threads without the ledger (perf, 2-core VM, session 14): true
// sharing. Instead each StreamHeaps counts its own active bytes, under its lock, and holds a
// *room*: bytes it may still add before the sum could pass the peak. Always
//
//   Σ heaps' (active_bytes + active_room + claimed_room) + active_spare_ == active_peak_,
//
// so no sum of active bytes can pass the peak while every allocation is paid from a room: the
// peak rises only under the allocator's lock (which holds every stream's lock, so no fast path
// is moving room), exactly to the sum the allocation makes. A free adds its bytes to its heaps'
// room; a room past kRoomKept * 2 gives all but kRoomKept to the spare (one shared atomic). An
// allocation first claims its bytes (claimed_room); a room short of them takes from the spare,
// then from other streams' rooms. Those are atomic and taken without their streams' locks: with
// try_lock, a 16-thread ring found the others' locks held (their threads inside) or biased to
// their threads (a process-wide barrier to take), and sent its shortfalls to the allocator's
// lock, which stops every stream, though the room existed. On the fast path a shortfall that
// the spare and every room together cannot cover goes to the allocator's lock (the claimed part
// stays claimed, for it). Same values at the same moments as one counter: a single-threaded run
// decides as before.
#include "allocator/detail/policy_state.hpp"

namespace vramledger {

namespace {
// A room keeps up to this much between the spare's visits: a few of the largest allocations a
// stream repeats. Below it, rooms hoard little of the headroom a peak leaves.
constexpr std::size_t kRoomKept = std::size_t{8} << 20;

// Up to `want` bytes from `room`, never below zero (other threads take from it too).
std::size_t take_from_room(std::atomic<std::size_t>& room, std::size_t want) {
  std::size_t have = room.load(std::memory_order_relaxed);
  while (have != 0) {
    const std::size_t take = std::min(have, want);
    if (room.compare_exchange_weak(have, have - take, std::memory_order_relaxed)) return take;
  }
  return 0;
}
}  // namespace

// On the paged heap's fast path, under `heaps`' lock: whether `bytes` are claimed for the
// allocation, from its room, the spare (with kRoomKept more for the room), then other streams'
// rooms. False: the allocator's lock must serve it; what was claimed stays claimed.
inline bool CachingAllocator::Impl::take_active_room(StreamHeaps& heaps, std::size_t bytes) {
  if (heaps.claimed_room >= bytes) return true;
  heaps.claimed_room += take_from_room(heaps.active_room, bytes - heaps.claimed_room);
  if (heaps.claimed_room >= bytes) [[likely]] return true;
  const std::size_t need = bytes - heaps.claimed_room;
  std::size_t spare = active_spare_.bytes.load(std::memory_order_relaxed);
  while (spare >= need) {
    const std::size_t take = std::min(spare, need + kRoomKept);
    if (active_spare_.bytes.compare_exchange_weak(spare, spare - take,
                                                  std::memory_order_relaxed)) {
      heaps.claimed_room += need;
      heaps.active_room.fetch_add(take - need, std::memory_order_relaxed);
      return true;
    }
  }
  // Rooms other streams keep (each up to 2 * kRoomKept), as much as is short.
  mutex_.for_each_published([&](StreamHeaps& other) {
    if (&other != &heaps) {
      heaps.claimed_room += take_from_room(other.active_room, bytes - heaps.claimed_room);
    }
    return heaps.claimed_room >= bytes;
  });
  if (heaps.claimed_room >= bytes) return true;
  room_shortfalls_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

// Under the allocator's lock (no fast path moves room meanwhile): `bytes` are claimed in
// `heaps`, from its room, the spare, then every other heaps' room, and only then by raising the
// peak — to exactly the sum the allocation makes.
inline void CachingAllocator::Impl::ensure_active_room_locked(StreamHeaps& heaps,
                                                              std::size_t bytes) {
  if (!paged_ || heaps.claimed_room >= bytes) return;
  heaps.claimed_room += heaps.active_room.exchange(0, std::memory_order_relaxed);
  heaps.claimed_room += active_spare_.bytes.exchange(0, std::memory_order_relaxed);
  // The surplus stays in this room: only the shortfall is taken from the others (a room taken
  // whole would send its stream's next allocation here too).
  auto keep_surplus = [&] {
    heaps.active_room.store(heaps.claimed_room - bytes, std::memory_order_relaxed);
    heaps.claimed_room = bytes;
  };
  for (auto& other : streams_) {
    if (heaps.claimed_room >= bytes) return keep_surplus();
    if (other.get() == &heaps) continue;
    const std::size_t room = other->active_room.load(std::memory_order_relaxed);
    const std::size_t take = std::min(room, bytes - heaps.claimed_room);
    other->active_room.store(room - take, std::memory_order_relaxed);
    heaps.claimed_room += take;
  }
  if (heaps.claimed_room >= bytes) return keep_surplus();
  active_peak_ += bytes - heaps.claimed_room;
  heaps.claimed_room = bytes;
  ++peak_rises_;
}

// Under `heaps`' lock, `bytes` claimed (take_active_room, ensure_active_room_locked).
inline void CachingAllocator::Impl::add_active(StreamHeaps& heaps, std::size_t bytes) {
  if (!paged_) return;
  heaps.claimed_room -= bytes;
  heaps.active_bytes += bytes;
}

// Under the allocator's lock: ensure_active_room_locked, then add_active.
inline void CachingAllocator::Impl::add_active_locked(StreamHeaps& heaps, std::size_t bytes) {
  ensure_active_room_locked(heaps, bytes);
  add_active(heaps, bytes);
}

// Under `heaps`' lock. Atomic on the room only while other streams' fast paths may take from it.
inline void CachingAllocator::Impl::sub_active(StreamHeaps& heaps, std::size_t bytes) {
  if (!paged_) return;
  heaps.active_bytes -= bytes;
  std::atomic<std::size_t>& room = heaps.active_room;
  std::size_t now;
  if (stream_path_.load(std::memory_order_relaxed)) {
    now = room.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  } else {
    now = room.load(std::memory_order_relaxed) + bytes;
    room.store(now, std::memory_order_relaxed);
  }
  if (now <= 2 * kRoomKept) [[likely]] return;
  // Others may have taken some meanwhile: give what is past kRoomKept, as it stands.
  while (now > kRoomKept) {
    if (room.compare_exchange_weak(now, kRoomKept, std::memory_order_relaxed)) {
      active_spare_.bytes.fetch_add(now - kRoomKept, std::memory_order_relaxed);
      return;
    }
  }
}

// Under the allocator's lock, heaps leaving (release_stream): their room goes to the spare.
inline void CachingAllocator::Impl::give_back_active_room_locked(StreamHeaps& heaps) {
  const std::size_t room =
      heaps.active_room.exchange(0, std::memory_order_relaxed) + heaps.claimed_room;
  heaps.claimed_room = 0;
  active_spare_.bytes.fetch_add(room, std::memory_order_relaxed);
}

// Under the allocator's lock (the census): the sum holds. (The census also checks each heaps'
// active bytes against its blocks as it counts them.)
inline void CachingAllocator::Impl::check_active_bytes_locked() const {
  if (!paged_) return;
  std::size_t total = active_spare_.bytes.load(std::memory_order_relaxed);
  for (const auto& heaps : streams_) {
    total += heaps->active_bytes + heaps->active_room.load(std::memory_order_relaxed) +
             heaps->claimed_room;
  }
  if (total != active_peak_) {
    throw Error(ErrorCode::kInternal,
                "active bytes, rooms and spare sum to " + std::to_string(total) +
                    ", not to the peak of active bytes " + std::to_string(active_peak_));
  }
}

}  // namespace vramledger
