// The memory of each private pool of a device — CUDA graph pools (torch.cuda.graph,
// torch.compile(mode="reduce-overhead")) and torch.cuda.MemPool — as an engine reads it after a
// capture (issue 17, part 3; docs/graphs.md). Figures are the pool's own census (a recount of
// its blocks, exact), not an estimate:
//
//   reserved_bytes        device memory the pool holds (its segments)
//   live_bytes            allocated blocks: tensors the graph's outputs and kept intermediates
//   requested_bytes       what those allocations asked for (live_bytes minus rounding)
//   cached_bytes          free blocks in the pool: a replay writes its temporaries there, so
//                         they stay with the pool while the graph lives
//   largest_free_bytes    the largest free block
//   fragmentation_bytes   cached bytes outside the largest free block of their size class
//                         (small, large): free, yet a request larger than that block would
//                         need a new segment
//
//   sleepable, asleep     a CUDA graph pool that sleeps under the name "graphs" (docs/sleep.md);
//   sleeping_bytes        whether it sleeps now; its live blocks' bytes while it does
//
// reserved_bytes == live_bytes + cached_bytes for a segment-heap pool (every private pool); all
// three are 0 while it sleeps.
#pragma once

#include <string>

namespace vramledger::torch_plugin {

class DeviceAllocators;

// A JSON array, one object per private pool (live and retired): "id" [first, second],
// "use_count" (graphs and MemPool objects holding it; 0 once torch released it), "segments",
// "blocks" (live allocations), and the figures above.
std::string graph_pools_json(DeviceAllocators& device);

}  // namespace vramledger::torch_plugin
