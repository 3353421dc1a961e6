#include "allocator/allocator_events.hpp"

#include <cstdio>
#include <cstdlib>

namespace vramledger {

AllocatorObserver::~AllocatorObserver() {
  const int attached = attached_allocators_.load();
  if (attached == 0) return;
  // Not an exception: destructors must not throw, and carrying on would corrupt memory the
  // next time one of those allocators reports.
  std::fprintf(stderr,
               "vramledger: fatal: an allocator observer (e.g. the ledger) is being destroyed while "
               "%d CachingAllocator(s) still report to it; destroy the allocators first (or "
               "declare the ledger before them, so it outlives them)\n",
               attached);
  std::abort();
}

const char* to_string(EventKind kind) noexcept {
  switch (kind) {
    case EventKind::kAlloc: return "alloc";
    case EventKind::kFreeRequested: return "free_requested";
    case EventKind::kFreeCompleted: return "free_completed";
    case EventKind::kFree: return "free";
    case EventKind::kSegmentCreate: return "segment_create";
    case EventKind::kSegmentRelease: return "segment_release";
    case EventKind::kPhysicalCreate: return "physical_create";
    case EventKind::kPhysicalRelease: return "physical_release";
    case EventKind::kMap: return "map";
    case EventKind::kUnmap: return "unmap";
    case EventKind::kVirtualReserve: return "virtual_reserve";
    case EventKind::kVirtualRelease: return "virtual_release";
    case EventKind::kInactiveSplitAdd: return "inactive_split_add";
    case EventKind::kInactiveSplitRemove: return "inactive_split_remove";
    case EventKind::kAllocRetry: return "alloc_retry";
    case EventKind::kOutOfMemory: return "out_of_memory";
    case EventKind::kFrontCacheReturn: return "front_cache_return";
    case EventKind::kSleep: return "sleep";
    case EventKind::kWake: return "wake";
    case EventKind::kSleepResident: return "sleep_resident";
    case EventKind::kWakeResident: return "wake_resident";
    case EventKind::kSegmentSleep: return "segment_sleep";
    case EventKind::kSegmentWake: return "segment_wake";
    case EventKind::kCount: break;
  }
  return "unknown";
}

}  // namespace vramledger
