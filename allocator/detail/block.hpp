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
struct MappedRun;
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

  // The free-block index's insert sequence when the block entered it (FreeBlockIndex::insert):
  // within a bin, newer blocks come first.
  std::uint64_t free_seq = 0;
  // Paged heap, free span blocks: MappedRunIndex's bookkeeping (detail/mapped_run_index.hpp) —
  // the block's runs of mapped pages once scanned, and its place in the index's queue of blocks
  // to scan or list of blocks scanned.
  MappedRun* mapped_runs = nullptr;
  Block* run_list_prev = nullptr;
  Block* run_list_next = nullptr;
  std::uint8_t run_list = 0;

  DevicePtr end() const { return address + size; }
  bool is_active() const { return state != BlockState::kFree; }
};

}  // namespace vramledger
