// Which memory pool owns each pointer torch holds.
//
// torch frees memory by address alone (the DataPtr deleter and raw_delete get a void*), while
// vramledger keeps one CachingAllocator per device and per private pool (CUDA graphs, MemPool), so
// the plugin must find the owner of an address before it can free it. The table is split into
// shards, each with its own lock, so threads freeing different blocks rarely contend; a shard's
// lock biases itself to the thread that takes it most (allocator/biased_mutex.hpp), so a
// single-threaded program's insert and take cost no atomic instruction.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>  // std::lock_guard
#include <optional>

#include <c10/util/flat_hash_map.h>

#include "allocator/biased_mutex.hpp"

namespace vramledger::torch_plugin {

class MemoryPool;

struct LiveAllocation {
  MemoryPool* pool = nullptr;  // null: made while caching was disabled (cudaMalloc directly)
  int device = 0;
  std::size_t requested = 0;
  std::uintptr_t stream = 0;           // the stream it was allocated on (cudaStream_t)
  bool used_on_other_streams = false;  // record_stream was called on it
};

class PointerRegistry {
 public:
  void insert(void* ptr, const LiveAllocation& allocation);
  // Removes and returns the entry, or nothing for an address we never handed out.
  std::optional<LiveAllocation> take(void* ptr);
  std::optional<LiveAllocation> find(void* ptr) const;
  // Marks the block as used on another stream; false when the address is unknown.
  bool mark_used_on_other_streams(void* ptr);

 private:
  static constexpr std::size_t kShards = 32;
  struct Shard {
    mutable AutoBiasedMutex mutex;
    // Open addressing (torch's own flat map): an insert and an erase allocate nothing, which
    // std::unordered_map's nodes did on every allocate + free pair.
    ska::flat_hash_map<void*, LiveAllocation> entries;
  };
  Shard& shard_of(void* ptr) const;

  mutable std::array<Shard, kShards> shards_;
};

}  // namespace vramledger::torch_plugin
