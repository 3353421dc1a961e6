// A private pool's allocations at one instant, as torch.compile's CUDA graph trees checkpoint
// them after recording each graph (getCheckpointState) and put them back before recording a new
// graph on another path (setCheckpointPoolState): the same blocks at the same addresses, every
// other byte of the pool free, so the new graph sees memory exactly as its parent left it.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <cstddef>
#include <vector>

#include "allocator/allocator_events.hpp"
#include "allocator/device_backend.hpp"

namespace vramledger::torch_plugin {

struct PoolCheckpoint final : c10::cuda::CUDACachingAllocator::AllocatorState {
  struct Allocation {
    DevicePtr address = 0;
    std::size_t requested = 0;
    StreamHandle stream = 0;
    TagId tag = kUntagged;
  };
  c10::DeviceIndex device = 0;
  c10::MempoolId_t pool{0, 0};
  std::vector<Allocation> allocations;
};

}  // namespace vramledger::torch_plugin
