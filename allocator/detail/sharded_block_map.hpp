// The live-block map split into shards by address, each with its own lock, so that streams
// allocating and freeing at once under their own locks (docs/design.md 4) do not serialize on
// one table. Once locking is on (set_locking, when the per-stream fast path starts) every
// operation locks its shard: the fast path's free looks a block up before it knows which
// stream's lock to take. Before, every user holds the allocator's lock and no shard is locked.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <mutex>

#include "allocator/detail/address_range.hpp"
#include "allocator/detail/block_address_map.hpp"
#include "allocator/spin_mutex.hpp"

namespace vramledger {

class ShardedBlockMap {
 public:
  // Under the allocator's lock, for good: users from then on may hold a stream's lock only.
  void set_locking() { locking_.store(true, std::memory_order_relaxed); }

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
  static constexpr std::size_t kShardBits = 4;
  // 16 shards of 64 slots: the 16 KiB of the one map they replace (more was slower on one
  // thread: its lookups touched more cache lines). Each grows as AddressMap does.
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
  static std::size_t index_of(DevicePtr address) {
    // Addresses are at least 512-byte aligned; the top bits of the product mix the rest.
    return static_cast<std::size_t>(((address >> 9) * 0x9E3779B97F4A7C15ull) >> (64 - kShardBits));
  }
  Shard& shard_of(DevicePtr address) { return shards_[index_of(address)]; }
  const Shard& shard_of(DevicePtr address) const { return shards_[index_of(address)]; }

  std::atomic<bool> locking_{false};
  std::array<Shard, std::size_t{1} << kShardBits> shards_;
};

}  // namespace vramledger
