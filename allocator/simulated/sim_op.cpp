#include "allocator/simulated/sim_op.hpp"

namespace vramledger {

std::string_view to_string(SimOp op) noexcept {
  switch (op) {
    case SimOp::kMemoryInfo: return "memory_info";
    case SimOp::kAllocateSegment: return "allocate_segment";
    case SimOp::kFreeSegment: return "free_segment";
    case SimOp::kCreatePhysical: return "create_physical";
    case SimOp::kReleasePhysical: return "release_physical";
    case SimOp::kReserveAddress: return "reserve_address_range";
    case SimOp::kFreeAddress: return "free_address_range";
    case SimOp::kMapPages: return "map_pages";
    case SimOp::kUnmapPages: return "unmap_pages";
    case SimOp::kCreateEvent: return "create_event";
    case SimOp::kDestroyEvent: return "destroy_event";
    case SimOp::kRecordEvent: return "record_event";
    case SimOp::kQueryEvent: return "query_event";
    case SimOp::kSynchronizeEvent: return "synchronize_event";
    case SimOp::kStreamWaitEvent: return "stream_wait_event";
    case SimOp::kSynchronizeDevice: return "synchronize_device";
    case SimOp::kCopyToHost: return "copy_to_host";
    case SimOp::kCopyToDevice: return "copy_to_device";
    case SimOp::kCount: break;
  }
  return "unknown_op";
}

}  // namespace vramledger
