#include "allocator/allocator_events.hpp"

namespace vramledger {

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
    case EventKind::kCount: break;
  }
  return "unknown";
}

}  // namespace vramledger
