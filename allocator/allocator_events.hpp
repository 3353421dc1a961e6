// Everything the policy does that changes an account is announced as one AllocatorEvent to an
// AllocatorObserver. The ledger (accounting/) is such an observer: its counters and its trace are
// pure functions of this event stream, so they can be replayed and recomputed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

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
  kCount
};

const char* to_string(EventKind kind) noexcept;

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
};

class AllocatorObserver {
 public:
  AllocatorObserver() = default;
  AllocatorObserver(const AllocatorObserver&) = delete;
  AllocatorObserver& operator=(const AllocatorObserver&) = delete;
  // Destroying an observer that an allocator still reports to would turn that allocator's next
  // event into a use after free: it is a fatal error with a message instead.
  virtual ~AllocatorObserver();
  // Called with the allocator's lock held, in the order the changes happened. Must not throw
  // and must not call back into the allocator.
  virtual void on_event(const AllocatorEvent& event) noexcept = 0;
  // A human-readable account attached to out-of-memory errors.
  virtual std::string describe() const { return {}; }

  // Called by CachingAllocator as it starts and stops reporting to this observer.
  void attach_allocator() noexcept { attached_allocators_.fetch_add(1); }
  void detach_allocator() noexcept { attached_allocators_.fetch_sub(1); }
  int attached_allocators() const noexcept { return attached_allocators_.load(); }

 private:
  std::atomic<int> attached_allocators_{0};
};

}  // namespace vramledger
