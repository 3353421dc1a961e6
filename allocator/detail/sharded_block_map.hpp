// The live-block map split into shards by address, each with its own lock, so that streams
// allocating and freeing at once under their own locks (docs/design.md 4) do not serialize on
// one table. Once locking is on (set_locking, when the per-stream fast path starts) every
// operation locks its shard: the fast path's free looks a block up before it knows which
// stream's lock to take. Before, every user holds the allocator's lock and no shard is locked.
//
// Blocks are spread over 256 shards by the region of 2^shift bytes they lie in, regions that
// hold one stream's blocks (the paged heap's spans; the segment heap's segments), so that a
// thread allocating on its own stream keeps using the same few shards: their locks and tables
// stay in its core's cache instead of moving between cores at every operation. Spread by block
// over 16 shards, as the segment heap's were until 2026-12-05, two threads on their own streams
// each took 2.4x the time per pair of one thread alone (VM, 2 cores;
// bench/results/2026-12-05-session-28-cpu.md).
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
  // Before the first block, from the allocator's constructor: regions of 2^region_shift bytes
  // (at least 2^9), each region's blocks in one shard.
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
  // 256 shards of 64 slots (~270 KiB of host memory per allocator): a thread touches only its
  // regions' shards, and the more shards, the fewer regions of two threads share one (64: the
  // segment heap's mixed ring on two threads 112 ns a pair, 256: 95, one thread no slower).
  // Each grows as AddressMap does.
  static constexpr std::size_t kRegionShardBits = 8;
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
    // The top bits of the product mix the region's number.
    constexpr std::uint64_t kMix = 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(((address >> region_shift_) * kMix) >>
                                    (64 - kRegionShardBits));
  }
  Shard& shard_of(DevicePtr address) { return shards_[index_of(address)]; }
  const Shard& shard_of(DevicePtr address) const { return shards_[index_of(address)]; }

  std::atomic<bool> locking_{false};
  unsigned region_shift_ = 21;  // written before any concurrent use
  std::array<Shard, std::size_t{1} << kRegionShardBits> shards_;
};

}  // namespace vramledger
