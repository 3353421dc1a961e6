// One device's ledger is fed by several CachingAllocators (the default pool and every private
// pool of CUDA graphs and MemPools), each calling its observer under its own lock. The gate
// serialises them, so the ledger sees one ordered event stream per device and its aggregate
// peaks are true peaks across pools. Readers take the same lock to copy counters.
//
// Lock order: allocator lock -> gate lock -> history lock. The gate never calls an allocator.
#pragma once

#include <c10/core/Allocator.h>

#include <mutex>
#include <string>

#include "allocator/allocator_events.hpp"
#include "allocator/spin_mutex.hpp"
#include "torch_plugin/private_pool_stats.hpp"
#include "torch_plugin/torch_history.hpp"

namespace vramledger::torch_plugin {

class EventGate {
 public:
  EventGate(AllocatorObserver& ledger, TorchHistory& history) : ledger_(ledger), history_(history) {}

  void on_event(const AllocatorEvent& event, c10::MempoolId_t pool_id) noexcept {
    std::lock_guard<SpinMutex> lock(mutex_);
    ledger_.on_event(event);
    private_pools_.on_event(event, pool_id);
    history_.on_event(event, pool_id);
  }
  std::string describe() const {
    std::lock_guard<SpinMutex> lock(mutex_);
    return ledger_.describe();
  }
  // Held while reading or resetting the ledger.
  std::unique_lock<SpinMutex> lock() const { return std::unique_lock<SpinMutex>(mutex_); }
  // Read or reset only with lock() held.
  PrivatePoolStats& private_pools_locked() { return private_pools_; }
  const PrivatePoolStats& private_pools_locked() const { return private_pools_; }

 private:
  mutable SpinMutex mutex_;
  AllocatorObserver& ledger_;
  TorchHistory& history_;
  PrivatePoolStats private_pools_;
};

// The observer one pool's CachingAllocator reports to: stamps its events with the pool's id.
class PoolObserver final : public AllocatorObserver {
 public:
  PoolObserver(EventGate& gate, c10::MempoolId_t pool_id) : gate_(gate), pool_id_(pool_id) {}
  void on_event(const AllocatorEvent& event) noexcept override { gate_.on_event(event, pool_id_); }
  std::string describe() const override { return gate_.describe(); }

 private:
  EventGate& gate_;
  c10::MempoolId_t pool_id_;
};

}  // namespace vramledger::torch_plugin
