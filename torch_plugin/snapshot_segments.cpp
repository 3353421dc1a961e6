#include "torch_plugin/snapshot_segments.hpp"

namespace vramledger::torch_plugin {

namespace {

using TorchSegment = c10::CachingDeviceAllocator::SegmentInfo;
using TorchBlock = c10::CachingDeviceAllocator::BlockInfo;

TorchSegment start_segment(const SegmentInfo& segment, DevicePtr address,
                           c10::DeviceIndex device, c10::MempoolId_t pool_id) {
  TorchSegment out;
  out.device = device;
  out.address = address;
  out.stream = reinterpret_cast<void*>(segment.stream);
  out.is_large = segment.pool == PoolKind::kLarge;
  out.is_expandable = segment.is_virtual_span;
  out.owner_private_pool_id = pool_id;
  return out;
}

void add_block(const BlockInfo& block, const TorchHistory& history, TorchSegment& segment) {
  TorchBlock out;
  out.size = block.size;
  out.requested_size = block.requested;
  out.allocated = block.allocated;
  out.active = block.active;
  if (block.allocated) out.context_when_allocated = history.context_of(block.address);
  segment.total_size += block.size;
  if (block.allocated) {
    segment.allocated_size += block.size;
    segment.requested_size += block.requested;
  }
  if (block.active) segment.active_size += block.size;
  segment.blocks.push_back(std::move(out));
}

}  // namespace

void append_snapshot_segments(const std::vector<SegmentInfo>& segments, c10::DeviceIndex device,
                              c10::MempoolId_t pool_id, const TorchHistory& history,
                              std::vector<TorchSegment>& out) {
  for (const SegmentInfo& segment : segments) {
    if (!segment.is_virtual_span) {
      TorchSegment converted = start_segment(segment, segment.address, device, pool_id);
      for (const BlockInfo& block : segment.blocks) add_block(block, history, converted);
      out.push_back(std::move(converted));
      continue;
    }
    bool open = false;
    TorchSegment run;
    for (const BlockInfo& block : segment.blocks) {
      const bool holds_memory = block.active || block.mapped_bytes > 0;
      if (!holds_memory) {
        if (open) out.push_back(std::move(run));
        open = false;
        continue;
      }
      if (!open) {
        run = start_segment(segment, block.address, device, pool_id);
        open = true;
      }
      add_block(block, history, run);
    }
    if (open) out.push_back(std::move(run));
  }
}

}  // namespace vramledger::torch_plugin
