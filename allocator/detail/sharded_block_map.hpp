// The live-block map split into shards by address, each with its own lock, so that streams
// allocating and freeing at once under their own locks (docs/design.md 4) do not serialize on
// one table. Once locking is on (set_locking, when the per-stream fast path starts) every
// operation locks its shard: the fast path's free looks a block up before it knows which
// stream's lock to take. Before, every user holds the allocator's lock and no shard is locked.
//
// Blocks are spread over 16 shards by their address, or, where each stream's blocks lie in
// address ranges of their own (the paged heap's spans: shard_by_region), over 64 shards by the
// region of 2^shift bytes they lie in, so that a thread allocating on its own stream keeps
// using the same one or two shards: their locks and tables stay in its core's cache instead of
// moving between cores at every operation.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "allocator/detail/address_range.hpp"
#include "allocator/detail/block_address_map.hpp"
#include "allocator/spin_mutex.hpp"

namespace vramledger {

class ShardedBlockMap {
 public:
  // Under the allocator's lock, for good: users from then on may hold a stream's lock only.
  void set_locking() { locking_.store(true, std::memory_order_relaxed); }
  // Before the first block, from the allocator's constructor: shards by regions of
  // 2^region_shift bytes (at least 2^9), each region's blocks in one shard.
  void shard_by_region(unsigned region_shift) { region_shift_ = std::max(region_shift, 9u); }

  Block* find(DevicePtr address) const {
    const Shard& shard = shard_of(address);
    ShardLock lock(*this, shard);
    return shard.map.find(address);
  }
  void insert(DevicePtr address, Block* block) {
    Shard& shard = shard_of(address);
    ShardLock lock(*this, shard);
    shard.map.insert(address, block);
  }
  Block* erase(DevicePtr address) {
    Shard& shard = shard_of(address);
    ShardLock lock(*this, shard);
    return shard.map.erase(address);
  }
  // Calls visit(map) with the shard holding `address` locked. `visit` may take other locks
  // with try_lock only (the lock order puts the shards after the streams' locks).
  template <typename Visitor>
  void with_shard_of(DevicePtr address, Visitor&& visit) {
    Shard& shard = shard_of(address);
    ShardLock lock(*this, shard);
    visit(shard.map);
  }
  std::size_t size() const {
    std::size_t total = 0;
    for (const Shard& shard : shards_) {
      ShardLock lock(*this, shard);
      total += shard.map.size();
    }
    return total;
  }
  // `visit` must not use the map.
  template <typename Visitor>
  void for_each(Visitor&& visit) const {
    for (const Shard& shard : shards_) {
      ShardLock lock(*this, shard);
      shard.map.for_each(visit);
    }
  }

 private:
  // By block: 16 shards of 64 slots, the 16 KiB of the one map they replace (more was slower
  // on one thread: its lookups touched more cache lines). By region: 64, since one thread
  // touches only its regions' shards and fewer regions share a shard. Each grows as
  // AddressMap does.
  static constexpr std::size_t kBlockShardBits = 4;
  static constexpr std::size_t kRegionShardBits = 6;
  static constexpr std::size_t kShardCapacity = 64;
  struct alignas(64) Shard {
    mutable SpinMutex mutex;
    BlockAddressMap map{kShardCapacity};
  };
  // The shard's lock, once locking is on.
  class ShardLock {
   public:
    ShardLock(const ShardedBlockMap& map, const Shard& shard)
        : mutex_(map.locking_.load(std::memory_order_relaxed) ? &shard.mutex : nullptr) {
      if (mutex_ != nullptr) mutex_->lock();
    }
    ~ShardLock() {
      if (mutex_ != nullptr) mutex_->unlock();
    }
    ShardLock(const ShardLock&) = delete;
    ShardLock& operator=(const ShardLock&) = delete;

   private:
    SpinMutex* mutex_;
  };
  std::size_t index_of(DevicePtr address) const {
    // Addresses are at least 512-byte aligned; the top bits of the product mix the rest.
    constexpr std::uint64_t kMix = 0x9E3779B97F4A7C15ull;
    if (region_shift_ == 0) {
      return static_cast<std::size_t>(((address >> 9) * kMix) >> (64 - kBlockShardBits));
    }
    return static_cast<std::size_t>(((address >> region_shift_) * kMix) >>
                                    (64 - kRegionShardBits));
  }
  Shard& shard_of(DevicePtr address) { return shards_[index_of(address)]; }
  const Shard& shard_of(DevicePtr address) const { return shards_[index_of(address)]; }

  std::atomic<bool> locking_{false};
  unsigned region_shift_ = 0;  // 0: by block; written before any concurrent use
  std::array<Shard, std::size_t{1} << kRegionShardBits> shards_;
};

}  // namespace vramledger
