// One stream's share of a heap (or one lane's, detail/stream_lanes.cpp): its free lists, address
// ranges, fences and Block objects, and the lock that lets the stream's own operations run
// beside other streams' (docs/design.md 4).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "allocator/detail/address_range.hpp"
#include "allocator/detail/background_unmaps.hpp"
#include "allocator/detail/block.hpp"
#include "allocator/detail/free_block_index.hpp"
#include "allocator/detail/object_pool.hpp"
#include "allocator/biased_mutex.hpp"

namespace vramledger {

class ObserverShard;  // allocator_events.hpp

// A count written by one thread at a time (under its stream's lock, or the allocator's, which
// holds that one too) and read by others without it: relaxed loads and stores, no
// read-modify-write (a lone writer needs none), so a reader sees some value the count had.
class SingleWriterCount {
 public:
  operator std::size_t() const noexcept { return value_.load(std::memory_order_relaxed); }
  SingleWriterCount& operator+=(std::size_t n) noexcept {
    value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    return *this;
  }
  SingleWriterCount& operator-=(std::size_t n) noexcept {
    value_.store(value_.load(std::memory_order_relaxed) - n, std::memory_order_relaxed);
    return *this;
  }

 private:
  std::atomic<std::size_t> value_{0};
};

// Split changes (torch's inactive split, the paged heap's page fragments) waiting for the event
// of the operation that caused them, which carries them (AllocatorEvent).
struct SplitDelta {
  std::int32_t count = 0;
  std::int64_t bytes = 0;
  // On the per-stream fast path: the stream's ledger shard, which gets the operation's event
  // instead of the observer's on_event (Impl::emit_with); null elsewhere.
  ObserverShard* shard = nullptr;
  // Under the allocator's lock: the shard of the heaps the event's block belongs to (its
  // AllocatorEvent::home_shard), or null.
  const ObserverShard* home = nullptr;
  bool empty() const { return count == 0 && bytes == 0; }
};

// Cache-line aligned: each stream's thread writes its heaps at every operation (the lock at the
// start, the counters at the end), and two allocated side by side would share a line.
struct alignas(64) StreamHeaps {
  // The stream's lock. The per-stream fast path (detail/stream_fast_path.cpp) takes it alone;
  // every other operation takes it as part of the allocator's lock (StreamLocks). Only
  // published heaps have one in use. Biased to the thread that takes it most (a thread per
  // stream, or per lane: plain stores, no atomic instruction); its try_lock never waits for
  // that owner, so the fast path may try another stream's while holding its own.
  AutoBiasedMutex mutex;
  // Published in the allocator's StreamLocks and not released (release_stream): the fast path
  // may serve it. Written under `mutex`; read without it only as a hint.
  std::atomic<bool> open{false};
  StreamHandle stream = 0;
  // Which of the stream's lanes these heaps are (detail/stream_lanes.cpp): 0, unless threads
  // allocating on the one stream contended for its lock and were given heaps of their own. Set
  // before the heaps are published, never changed.
  std::uint32_t lane = 0;
  // The observer's shard for this stream while published (open_stream_shard), or null: the fast
  // path's events go there, under `mutex` and the shard's own mutex (docs/design.md 5.2).
  // Opened and closed under the allocator's lock.
  ObserverShard* ledger_shard = nullptr;
  // The Blocks tiling this stream's ranges: created and destroyed under `mutex`.
  ObjectPool<Block> blocks;
  FreeBlockIndex free[2];
  std::vector<AddressRange*> ranges[2];
  // Impl::free_blocks_with_mapped_pages, per pool, as it stood when free[p].changes() was
  // idle_blocks_at[p]. Valid while that holds: a free block gains mapped pages only as it is
  // taken (take_from_span maps, then removes it from the index), and one that lost them since
  // is skipped by its users. Under the allocator's lock (which holds every stream's).
  std::vector<Block*> idle_blocks[2];
  std::uint64_t idle_blocks_at[2] = {~std::uint64_t{0}, ~std::uint64_t{0}};
  // Fences prove, without blocking, that work queued on the stream before some free has
  // finished, so the freed pages may be unmapped. A page freed while next_fence == n is idle
  // once fence n has completed.
  std::uint64_t next_fence = 1;
  std::uint64_t completed_fence = 0;
  // Whether fence `fence` of this stream has completed: then the work queued before it is done.
  bool fence_done(std::uint64_t fence) const { return fence <= completed_fence; }
  bool page_freed_since_last_fence = false;
  std::deque<std::pair<EventHandle, std::uint64_t>> outstanding_fences;
  // Old addresses of chunks aliased to a new address of this stream (alias_pending_pages): still
  // mapped until fence `fence` completes, then unmapped.
  struct RetiringMapping {
    AddressRange* span;
    std::size_t head;
    std::size_t pages;
    std::uint64_t fence;
    PhysicalHandle handle;  // now also mapped at the new address
    // Its unmap, handed to the helper thread (detail/background_unmaps.hpp); null until then.
    std::shared_ptr<UnmapJob> job;
  };
  std::vector<RetiringMapping> retiring;
  // Entries added to or removed from `retiring` so far.
  std::uint64_t retiring_changes = 0;
  // What the last look at every entry of `retiring` without waiting (Impl::retire_mappings)
  // found done, or handed on, all it could: the list, this stream's completed fence and the
  // helper's ended runs as they stood after it. While none has moved another look would change
  // nothing, and is skipped (it came before each allocation that needed pages: ~12,000
  // instructions each on ViT's trace at a lag of 1000 operations).
  struct RetireLook {
    std::uint64_t changes = ~std::uint64_t{0};
    std::uint64_t completed_fence = 0;
    std::uint64_t runs_ended = 0;
    bool operator==(const RetireLook&) const = default;
  };
  RetireLook last_retire_look;
  // Mapped pages of this stream's spans lying wholly in free blocks, per pool (retiring ones
  // not counted): kept per stream, written under `mutex`, so that the fast paths of different
  // streams share no counter. Impl::free_mapped_pages sums them: exactly under the allocator's
  // lock; on a stream's fast path, as they stand while other streams change theirs (a policy
  // heuristic's input, Impl::idle_mapped_memory_is_plentiful).
  SingleWriterCount free_mapped_pages[2];
  // The stream's clock: allocations served on it so far (under `mutex`). A page freed at clock
  // c is cold for other streams once the clock passes c + kColdAllocations: the stream went on
  // allocating without needing it (Impl::chunk_is_cold).
  std::uint64_t allocations = 0;
  // Under the allocator's lock, at each look at other streams' idle pages (note_look_at_others):
  // the clock seen at the last look that found it moved, and that look's number. A stream whose
  // clock has not moved for kQuietLooks looks is quiet: all its idle pages are cold.
  std::uint64_t allocations_at_look = 0;
  std::uint64_t look_when_moved = 0;
  // Under the allocator's lock: the clock at the last choice of a lane for a thread of this
  // stream (Impl::new_lane_for); a lane whose clock has not moved since is free to give again.
  std::uint64_t allocations_at_lane_choice = 0;
  // Paged heap (detail/active_bytes.cpp): the bytes of these heaps' active blocks (under
  // `mutex`), and the room they may grow by before the allocator's peak of active bytes would
  // rise. The room is atomic: other streams' fast paths short of room take from it without this
  // stream's lock (a try_lock there failed while its thread was inside, or revoked its bias).
  // `claimed_room`, under `mutex`: room set aside for the allocation being made, between the
  // room check and hand_out (0 between operations, but for a failed one's leftover).
  std::size_t active_bytes = 0;
  std::atomic<std::size_t> active_room{0};
  std::size_t claimed_room = 0;
};

}  // namespace vramledger
