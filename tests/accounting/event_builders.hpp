// Short constructors for the events a policy would send, so tests read like the event stream.
#pragma once

#include "allocator/allocator_events.hpp"

namespace vramledger::testing {

struct BlockEvent {
  DevicePtr address = 0x1000;
  std::size_t size = 512;
  std::size_t requested = 500;
  StreamHandle stream = 0;
  TagId tag = kUntagged;
  PoolKind pool = PoolKind::kSmall;
};

inline AllocatorEvent block_event(EventKind kind, const BlockEvent& block) {
  AllocatorEvent event{kind};
  event.pool = block.pool;
  event.tag = block.tag;
  event.stream = block.stream;
  event.address = block.address;
  event.size = block.size;
  event.requested = block.requested;
  return event;
}
inline AllocatorEvent alloc(const BlockEvent& block) { return block_event(EventKind::kAlloc, block); }
inline AllocatorEvent free_requested(const BlockEvent& block) {
  return block_event(EventKind::kFreeRequested, block);
}
inline AllocatorEvent free_completed(const BlockEvent& block) {
  return block_event(EventKind::kFreeCompleted, block);
}

inline AllocatorEvent sized(EventKind kind, std::size_t size, PoolKind pool = PoolKind::kLarge,
                            DevicePtr address = 0x100000) {
  AllocatorEvent event{kind};
  event.pool = pool;
  event.size = size;
  event.address = address;
  return event;
}

}  // namespace vramledger::testing
