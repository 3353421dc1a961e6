// Converts a pool's segments (CachingAllocator::segments) into torch's snapshot SegmentInfo, the
// format torch.cuda.memory_snapshot() and the memory viewer read.
//
// A backend segment maps one to one. A paged-heap span is a large reserved address range of which
// only some pages have memory behind them; torch has no such thing, so each maximal run of blocks
// that hold memory (allocated, pending a free, or mapped) is shown as one expandable segment, and
// unmapped stretches are left out, as torch leaves out the unmapped tail of its expandable
// segments.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <vector>

#include "allocator/caching_allocator.hpp"
#include "torch_plugin/torch_history.hpp"

namespace vramledger::torch_plugin {

void append_snapshot_segments(const std::vector<SegmentInfo>& segments, c10::DeviceIndex device,
                              c10::MempoolId_t pool_id, const TorchHistory& history,
                              std::vector<c10::CachingDeviceAllocator::SegmentInfo>& out);

}  // namespace vramledger::torch_plugin
