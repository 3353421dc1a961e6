// The policy's unit of bookkeeping. Blocks tile an address range (a backend segment or a virtual
// span) in address order; free neighbours are merged at once.
#pragma once

#include <array>
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

  // Paged heap, free blocks: the block's runs of mapped pages (clipped to the block), as
  // tightest_mapped_run last found them; valid while the block's extent and its span's
  // AddressRange::mapped_version are the ones recorded (detail/page_placement.cpp).
  struct MappedRuns {
    static constexpr std::uint64_t kNever = ~std::uint64_t{0};
    // Runs kept: on T5's trace 88% of the fits whose longest run could hold the allocation had
    // at most four runs (two: 61%), the rest are scanned again.
    static constexpr std::size_t kKept = 4;
    struct Run {
      DevicePtr from = 0;
      std::size_t bytes = 0;
      bool operator==(const Run&) const = default;
    };
    std::uint64_t version = kNever;  // the span's mapped_version when found
    DevicePtr address = 0;           // the block's extent when found
    std::size_t size = 0;
    std::size_t longest = 0;         // bytes of the longest run
    std::uint32_t count = 0;         // runs, counted up to kKept + 1
    std::array<Run, kKept> runs{};   // the first min(count, kKept), in address order; then empty
    bool operator==(const MappedRuns&) const = default;
  };
  MappedRuns mapped_runs;

  DevicePtr end() const { return address + size; }
  bool is_active() const { return state != BlockState::kFree; }
};

}  // namespace vramledger
