// The policy's unit of bookkeeping. Blocks tile an address range (a backend segment or a virtual
// span) in address order; free neighbours are merged at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/allocator_events.hpp"
#include "allocator/device_backend.hpp"

namespace vramledger {

struct AddressRange;
struct StreamHeaps;
class ThreadCache;

enum class BlockState : std::uint8_t {
  kFree,         // in a free index, reusable by its stream
  kAllocated,    // handed out
  kPendingFree,  // freed by the user, waiting for events on other streams
  kSleeping,     // allocated, its tag asleep: pages released, address kept (detail/sleep.cpp)
};

struct Block {
  DevicePtr address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  AddressRange* range = nullptr;
  Block* prev = nullptr;  // address-order neighbours inside the range
  Block* next = nullptr;
  Block* free_prev = nullptr;  // links inside a FreeBlockIndex bin
  Block* free_next = nullptr;
  std::uint32_t free_bin = 0;
  BlockState state = BlockState::kFree;
  bool counted_inactive_split = false;  // segment heap: announced as inactive split
  std::uint64_t freed_at_fence = 0;     // paged heap: owner stream's fence sequence when freed
  TagId tag = kUntagged;
  int pending_events = 0;
  std::vector<StreamHandle> stream_uses;  // other streams recorded with record_stream
  ThreadCache* front = nullptr;  // the front cache managing this allocated block, if any

  DevicePtr end() const { return address + size; }
  bool is_active() const { return state != BlockState::kFree; }
};

}  // namespace vramledger
