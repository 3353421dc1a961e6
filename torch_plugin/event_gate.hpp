// One device's ledger is fed by several CachingAllocators (the default pool and every private
// pool of CUDA graphs and MemPools), each calling its observer under its own lock. The gate
// serialises them, so the ledger sees one ordered event stream per device and its aggregate
// peaks are true peaks across pools. Readers take the same lock to copy counters.
//
// The default pool also gets what the ledger gives an allocator used from several threads
// (docs/design.md 4, 5): events from several stream locks at once (the gate still serialises
// them) and the ledger's shards, through which its per-stream fast path and front caches count
// without the gate. A shard's event bypasses the history, so while torch records history (or a
// trace tracker listens) every shard event takes the slow path, which goes through the gate.
// Private pools keep one lock and no shards: their events feed PrivatePoolStats too.
//
// Lock order: allocator lock (a stream's lock is part of it) -> gate lock -> history lock, and
// gate lock -> the ledger's own locks. The gate never calls an allocator.
#pragma once

#include <c10/core/Allocator.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "allocator/allocator_events.hpp"
#include "allocator/biased_mutex.hpp"
#include "torch_plugin/private_pool_stats.hpp"
#include "torch_plugin/torch_history.hpp"

namespace vramledger::torch_plugin {

class EventGate {
 public:
  EventGate(AllocatorObserver& ledger, TorchHistory& history) : ledger_(ledger), history_(history) {}

  void on_event(const AllocatorEvent& event, c10::MempoolId_t pool_id) noexcept {
    std::lock_guard<AutoBiasedMutex> lock(mutex_);
    ledger_.on_event(event);
    private_pools_.on_event(event, pool_id);
    history_.on_event(event, pool_id);
  }
  std::string describe() const {
    std::lock_guard<AutoBiasedMutex> lock(mutex_);
    return ledger_.describe();
  }
  // Held while reading or resetting the ledger.
  std::unique_lock<AutoBiasedMutex> lock() const {
    return std::unique_lock<AutoBiasedMutex>(mutex_);
  }

  // The default pool's side (see the top of this file).
  bool history_active() const noexcept { return history_.active(); }
  bool accept_concurrent_events() noexcept {
    std::lock_guard<AutoBiasedMutex> lock(mutex_);
    return ledger_.accept_concurrent_events();
  }
  // A ledger shard wrapped so that its slow path goes through the gate; null when the ledger
  // gives none.
  ObserverShard* open_shard(bool for_stream);
  void close_shard(ObserverShard* shard) noexcept;
  // A shard's event past its credit, or while history is recorded: the ledger's slow path and
  // the history, in the gate's order.
  void on_shard_event(ObserverShard& ledger_shard, const AllocatorEvent& event) noexcept {
    std::lock_guard<AutoBiasedMutex> lock(mutex_);
    ledger_shard.apply_slow(event);
    history_.on_event(event, {0, 0});
  }
  // Read or reset only with lock() held.
  PrivatePoolStats& private_pools_locked() { return private_pools_; }
  const PrivatePoolStats& private_pools_locked() const { return private_pools_; }

 private:
  mutable AutoBiasedMutex mutex_;  // biased to the thread that takes it most (biased_mutex.hpp)
  AllocatorObserver& ledger_;
  TorchHistory& history_;
  PrivatePoolStats private_pools_;
  std::vector<std::unique_ptr<ObserverShard>> shards_;  // GateShards, under mutex_
};

// The default pool's view of one ledger shard: the same mutex (the ledger folds under it), the
// ledger's fast path while no history is recorded, the gate otherwise.
class GateShard final : public ObserverShard {
 public:
  GateShard(EventGate& gate, ObserverShard& ledger_shard) noexcept
      : ObserverShard(ledger_shard.mutex()), gate_(gate), ledger_shard_(ledger_shard) {}

  bool try_apply(const AllocatorEvent& event) noexcept override {
    if (gate_.history_active()) [[unlikely]] return false;
    return ledger_shard_.try_apply(event);
  }
  void apply_slow(const AllocatorEvent& event) noexcept override {
    gate_.on_shard_event(ledger_shard_, event);
  }
  void publish() noexcept override { ledger_shard_.publish(); }
  ObserverShard& ledger_shard() const noexcept { return ledger_shard_; }

 private:
  EventGate& gate_;
  ObserverShard& ledger_shard_;
};

inline ObserverShard* EventGate::open_shard(bool for_stream) {
  std::lock_guard<AutoBiasedMutex> lock(mutex_);
  ObserverShard* ledger_shard =
      for_stream ? ledger_.open_stream_shard() : ledger_.open_shard();
  if (ledger_shard == nullptr) return nullptr;
  return shards_.emplace_back(std::make_unique<GateShard>(*this, *ledger_shard)).get();
}

inline void EventGate::close_shard(ObserverShard* shard) noexcept {
  std::lock_guard<AutoBiasedMutex> lock(mutex_);
  const auto found = std::find_if(shards_.begin(), shards_.end(),
                                  [&](const auto& owned) { return owned.get() == shard; });
  if (found == shards_.end()) return;
  ledger_.close_shard(&static_cast<GateShard*>(shard)->ledger_shard());
  shards_.erase(found);
}

// The observer one pool's CachingAllocator reports to: stamps its events with the pool's id.
// The default pool's ({0, 0}) also takes events from several threads and hands out shards.
class PoolObserver final : public AllocatorObserver {
 public:
  PoolObserver(EventGate& gate, c10::MempoolId_t pool_id)
      : gate_(gate), pool_id_(pool_id), default_pool_(pool_id == c10::MempoolId_t{0, 0}) {}
  void on_event(const AllocatorEvent& event) noexcept override {
    if (event.home_shard == nullptr) [[likely]] return gate_.on_event(event, pool_id_);
    // The allocator names the shard it was given; the ledger recognises only its own.
    AllocatorEvent forwarded = event;
    forwarded.home_shard = &static_cast<const GateShard*>(event.home_shard)->ledger_shard();
    gate_.on_event(forwarded, pool_id_);
  }
  std::string describe() const override { return gate_.describe(); }
  bool has_shards() const noexcept override { return default_pool_; }
  bool accept_concurrent_events() noexcept override {
    return default_pool_ && gate_.accept_concurrent_events();
  }
  ObserverShard* open_shard() override { return default_pool_ ? gate_.open_shard(false) : nullptr; }
  ObserverShard* open_stream_shard() override {
    return default_pool_ ? gate_.open_shard(true) : nullptr;
  }
  void close_shard(ObserverShard* shard) noexcept override { gate_.close_shard(shard); }

 private:
  EventGate& gate_;
  c10::MempoolId_t pool_id_;
  bool default_pool_;
};

}  // namespace vramledger::torch_plugin
