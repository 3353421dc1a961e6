// The paged heap's active bytes and their exact peak (the cross-stream slack's base), counted
// per stream's heaps so that threads on their own streams share no cache line.
//
// One atomic sum written by every paged allocation and free of every thread was a quarter of
// the mixed ring's time on two threads without the ledger (perf, 2-core VM, session 14): true
// sharing. Instead each StreamHeaps counts its own active bytes, under its lock, and holds a
// *room*: bytes it may still add before the sum could pass the peak. Always
//
//   Σ heaps' active_bytes + Σ heaps' active_room + active_spare_ == active_peak_,
//
// so no sum of active bytes can pass the peak while every allocation is paid from a room: the
// peak rises only under the allocator's lock (which holds every stream's lock, so every room is
// at hand), exactly to the sum the allocation makes. A free adds its bytes to its heaps' room;
// a room past kRoomKept * 2 gives all but kRoomKept to the spare (one shared atomic), from which
// a room short of an allocation takes what it needs plus kRoomKept. On the fast path a room that
// neither holds nor can take the allocation sends it to the allocator's lock (nothing changed).
// Same values at the same moments as one counter: a single-threaded run decides as before.
#include "allocator/detail/policy_state.hpp"

namespace vramledger {

namespace {
// A room keeps up to this much between the spare's visits: a few of the largest allocations a
// stream repeats. Below it, rooms hoard little of the headroom a peak leaves.
constexpr std::size_t kRoomKept = std::size_t{8} << 20;
}  // namespace

// On the paged heap's fast path, under `heaps`' lock: whether its room holds `bytes` now, taking
// from the spare, then from other streams' rooms, if it must. False: the allocator's lock must
// serve the allocation (nothing changed but room moved between rooms, which keeps the sum).
inline bool CachingAllocator::Impl::take_active_room(StreamHeaps& heaps, std::size_t bytes) {
  if (heaps.active_room >= bytes) [[likely]] return true;
  const std::size_t want = bytes - heaps.active_room + kRoomKept;
  const std::size_t need = bytes - heaps.active_room;
  std::size_t spare = active_spare_.bytes.load(std::memory_order_relaxed);
  while (spare >= need) {
    const std::size_t take = std::min(spare, want);
    if (active_spare_.bytes.compare_exchange_weak(spare, spare - take,
                                                  std::memory_order_relaxed)) {
      heaps.active_room += take;
      return true;
    }
  }
  // Rooms other streams keep (each up to 2 * kRoomKept): their locks with try_lock only (this
  // thread holds its stream's lock), as much as is short.
  mutex_.for_each_published([&](StreamHeaps& other) {
    if (&other == &heaps || !other.mutex.try_lock()) return false;
    const std::size_t take = std::min(other.active_room, bytes - heaps.active_room);
    other.active_room -= take;
    other.mutex.unlock();
    heaps.active_room += take;
    return heaps.active_room >= bytes;
  });
  return heaps.active_room >= bytes;
}

// Under the allocator's lock: `heaps`' room holds `bytes`, from the spare, then every other
// heaps' room, and only then by raising the peak — to exactly the sum the allocation makes.
inline void CachingAllocator::Impl::ensure_active_room_locked(StreamHeaps& heaps,
                                                              std::size_t bytes) {
  if (!paged_ || heaps.active_room >= bytes) return;
  heaps.active_room += active_spare_.bytes.exchange(0, std::memory_order_relaxed);
  // Only the shortfall from the others: a room taken whole would send its stream's next
  // allocation here too.
  for (auto& other : streams_) {
    if (heaps.active_room >= bytes) return;
    if (other.get() == &heaps) continue;
    const std::size_t take = std::min(other->active_room, bytes - heaps.active_room);
    heaps.active_room += take;
    other->active_room -= take;
  }
  if (heaps.active_room >= bytes) return;
  active_peak_ += bytes - heaps.active_room;
  heaps.active_room = bytes;
}

// Under `heaps`' lock, its room holding `bytes` (take_active_room, ensure_active_room_locked).
inline void CachingAllocator::Impl::add_active(StreamHeaps& heaps, std::size_t bytes) {
  if (!paged_) return;
  heaps.active_room -= bytes;
  heaps.active_bytes += bytes;
}

// Under the allocator's lock: ensure_active_room_locked, then add_active.
inline void CachingAllocator::Impl::add_active_locked(StreamHeaps& heaps, std::size_t bytes) {
  ensure_active_room_locked(heaps, bytes);
  add_active(heaps, bytes);
}

inline void CachingAllocator::Impl::sub_active(StreamHeaps& heaps, std::size_t bytes) {
  if (!paged_) return;
  heaps.active_bytes -= bytes;
  heaps.active_room += bytes;
  if (heaps.active_room > 2 * kRoomKept) [[unlikely]] {
    active_spare_.bytes.fetch_add(heaps.active_room - kRoomKept, std::memory_order_relaxed);
    heaps.active_room = kRoomKept;
  }
}

// Under the allocator's lock, heaps leaving (release_stream): their room goes to the spare.
inline void CachingAllocator::Impl::give_back_active_room_locked(StreamHeaps& heaps) {
  active_spare_.bytes.fetch_add(heaps.active_room, std::memory_order_relaxed);
  heaps.active_room = 0;
}

// Under the allocator's lock (the census): the sum holds. (The census also checks each heaps'
// active bytes against its blocks as it counts them.)
inline void CachingAllocator::Impl::check_active_bytes_locked() const {
  if (!paged_) return;
  std::size_t total = active_spare_.bytes.load(std::memory_order_relaxed);
  for (const auto& heaps : streams_) total += heaps->active_bytes + heaps->active_room;
  if (total != active_peak_) {
    throw Error(ErrorCode::kInternal,
                "active bytes, rooms and spare sum to " + std::to_string(total) +
                    ", not to the peak of active bytes " + std::to_string(active_peak_));
  }
}

}  // namespace vramledger
