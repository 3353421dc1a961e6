// Everything the policy does that changes an account is announced as one AllocatorEvent to an
// AllocatorObserver. The ledger (accounting/) is such an observer: its counters and its trace are
// pure functions of this event stream, so they can be replayed and recomputed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "allocator/biased_mutex.hpp"
#include "allocator/device_backend.hpp"

namespace vramledger {

using TagId = std::uint16_t;  // 0 is "untagged"; names live in the ledger's tag registry
inline constexpr TagId kUntagged = 0;

enum class PoolKind : std::uint8_t { kSmall = 0, kLarge = 1 };

enum class EventKind : std::uint8_t {
  kAlloc,              // block handed out: address, size (allocated), requested
  kFreeRequested,      // user freed it; stays active while other streams may still use it
  kFreeCompleted,      // no stream uses it any more: inactive and reusable
  kSegmentCreate,      // non-VMM: backend segment obtained (reserved += size)
  kSegmentRelease,     // non-VMM: backend segment returned (reserved -= size)
  kPhysicalCreate,     // VMM: physical pages created (reserved += size)
  kPhysicalRelease,    // VMM: physical pages released (reserved -= size)
  kMap,                // VMM: size bytes of pages mapped at address
  kUnmap,              // VMM: size bytes of pages unmapped at address
  kVirtualReserve,     // VMM: address range reserved
  kVirtualRelease,     // VMM: address range freed
  kInactiveSplitAdd,   // a free block of size bytes now counts as inactive split
  kInactiveSplitRemove,
  kAllocRetry,         // a request failed once; cached memory was released and it retried
  kOutOfMemory,        // a request failed for good (size = requested bytes)
  kFree,               // kFreeRequested and kFreeCompleted at once (no other stream used it)
  // A block a front cache held (already counted free when the user freed it) goes back to its
  // heap: changes no counter but the inactive split its merges carry (docs/design.md, 5).
  kFrontCacheReturn,
  // Sleep and wake by tag (docs/sleep.md): an allocated block goes to sleep (its counts leave
  // allocated/active for sleeping, size = block bytes) or wakes (back, as an allocation); its
  // bytes that stay on pages kept mapped for neighbours are announced as resident (size bytes).
  kSleep,
  kWake,
  kSleepResident,
  kWakeResident,
  // A whole segment of a sleeping pool (CachingAllocator::sleep_pool: CUDA graph pools) gives
  // its memory back and keeps its address (reserved -= size; still a segment), or gets memory
  // again at that address (reserved += size).
  kSegmentSleep,
  kSegmentWake,
  kCount
};

const char* to_string(EventKind kind) noexcept;

class ObserverShard;

struct AllocatorEvent {
  EventKind kind;
  PoolKind pool = PoolKind::kLarge;
  TagId tag = kUntagged;
  StreamHandle stream = 0;
  DevicePtr address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  // Changes of inactive split (count and bytes) caused by this event, e.g. the remainder of a
  // split block, or neighbours merged on a free. Carried on the event that caused them so the
  // fast path sends one event per call; kInactiveSplitAdd/Remove remain for changes on their own.
  std::int32_t inactive_split_delta = 0;
  std::int64_t inactive_split_bytes_delta = 0;
  // An allocation or free sent under the allocator's lock about a block of a stream (or lane of
  // one) that has a stream shard (AllocatorObserver::open_stream_shard): that shard, where the
  // observer may count it. Null otherwise. A hint: the observer checks that it is one of its own.
  const ObserverShard* home_shard = nullptr;
};

// The part of an observer that one thread's front cache, or one stream's fast path, reports to
// without the allocator's lock (docs/design.md, 5). The front cache holds mutex() around its own
// state and every call of try_apply (the stream's fast path holds its stream's lock, then
// mutex() around try_apply); the observer takes the mutexes of all its shards, in its own order,
// when it needs one exact view (reads, peaks it cannot prove unchanged). Lock order: allocator
// lock (a stream's lock is part of it) -> the observer's own lock -> shard mutexes; a shard's
// mutex is never held while taking another lock.
class ObserverShard {
 public:
  ObserverShard() = default;
  ObserverShard(const ObserverShard&) = delete;
  ObserverShard& operator=(const ObserverShard&) = delete;
  virtual ~ObserverShard() = default;

  BiasedMutex& mutex() noexcept { return *mutex_; }
  // With mutex() held: applies a kAlloc or kFree of a front-cache block, or of a stream's fast
  // path (AllocatorObserver::open_stream_shard). Returns false, changing nothing, when it cannot
  // be applied without the observer's slow path.
  virtual bool try_apply(const AllocatorEvent& event) noexcept = 0;
  // Without mutex() held: applies the event through the observer's slow path (always succeeds).
  virtual void apply_slow(const AllocatorEvent& event) noexcept = 0;
  // Without mutex() held: what the shard counted reaches the observer now, before events the
  // allocator sends itself about the same blocks (a free from another thread).
  virtual void publish() noexcept = 0;

 protected:
  // A shard that forwards to another (an observer wrapping its own observer's shards, as the
  // torch plugin's event gate does) locks the other's mutex: the one its observer folds under.
  explicit ObserverShard(BiasedMutex& shared) noexcept : mutex_(&shared) {}

 private:
  BiasedMutex own_mutex_;
  BiasedMutex* mutex_ = &own_mutex_;
};

class AllocatorObserver {
 public:
  AllocatorObserver() = default;
  AllocatorObserver(const AllocatorObserver&) = delete;
  AllocatorObserver& operator=(const AllocatorObserver&) = delete;
  // Destroying an observer that an allocator still reports to would turn that allocator's next
  // event into a use after free: it is a fatal error with a message instead.
  virtual ~AllocatorObserver();
  // Called with the allocator's lock held (or, after accept_concurrent_events returned true, a
  // stream's lock), in the order the changes happened. Must not throw and must not call back
  // into the allocator.
  virtual void on_event(const AllocatorEvent& event) noexcept = 0;
  // A human-readable account attached to out-of-memory errors.
  virtual std::string describe() const { return {}; }
  // A shard for one thread's front cache, or null when the observer takes events only under the
  // allocator's lock (the front cache is then off). Called under the allocator's lock; the
  // shard stays valid until close_shard, which folds what it counted into the observer.
  virtual bool has_shards() const noexcept { return false; }
  // Asked once by an allocator, under its lock, when it gets a second stream: whether on_event
  // may from now on be called by several threads at once (the allocator's per-stream locks,
  // docs/design.md 4). An observer that
  // answers true makes each call atomic itself (a lock of its own, taken after the allocator's
  // locks); the calls about one stream, and about one block, still come in the order of the
  // changes. Answering false keeps every event under the allocator's one lock.
  virtual bool accept_concurrent_events() noexcept { return false; }
  virtual ObserverShard* open_shard() { return nullptr; }
  // A shard for one published stream of the per-stream fast path (docs/design.md 4, 5.2), or
  // null (its events then go to on_event). Called under the allocator's lock, after
  // accept_concurrent_events returned true. The shard's try_apply is called under the stream's
  // lock and the shard's mutex; apply_slow under the stream's lock alone (the observer takes
  // its own lock and every shard's mutex then: none of them is ever held while waiting for a
  // stream's lock). Events the allocator sends under its own lock go to on_event as before.
  virtual ObserverShard* open_stream_shard() { return nullptr; }
  virtual void close_shard(ObserverShard* /*shard*/) noexcept {}

  // Called by CachingAllocator as it starts and stops reporting to this observer.
  void attach_allocator() noexcept { attached_allocators_.fetch_add(1); }
  void detach_allocator() noexcept { attached_allocators_.fetch_sub(1); }
  int attached_allocators() const noexcept { return attached_allocators_.load(); }

 private:
  std::atomic<int> attached_allocators_{0};
};

}  // namespace vramledger
