// One torch memory pool on one device: the default pool (id {0,0}) or a private pool that a
// CUDA graph capture or a torch.cuda.MemPool created. Each is its own CachingAllocator, so a
// private pool's blocks are never handed to anyone else, and all of a device's pools report to
// the device's one ledger through the EventGate.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "allocator/caching_allocator.hpp"
#include "torch_plugin/event_gate.hpp"
#include "torch_plugin/capped_backend.hpp"
#include "torch_plugin/private_pool_backend.hpp"

namespace vramledger::torch_plugin {

class MemoryPool {
 public:
  // The default pool, straight on the device backend.
  MemoryPool(DeviceBackend& backend, EventGate& gate, const AllocatorOptions& options);
  // A private pool: segments from `segments` (or from `foreign`), services from `services`.
  // `sleepable`: `segments` is a SleepableSegmentBackend (a CUDA graph pool that can sleep).
  MemoryPool(c10::MempoolId_t id, DeviceBackend& segments, DeviceBackend& services,
             std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> foreign,
             EventGate& gate, const AllocatorOptions& options,
             DeviceReservation& budget, bool sleepable = false);
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  c10::MempoolId_t id() const { return id_; }
  bool is_private() const { return id_.first != 0 || id_.second != 0; }
  // A CUDA graph pool whose segments can sleep (sleep(tags=["graphs"]), docs/sleep.md).
  bool sleepable() const { return sleepable_; }
  CachingAllocator& policy() { return *policy_; }
  const CachingAllocator& policy() const { return *policy_; }

  // Private pools: torch's use count (graphs and MemPool objects holding the pool). At zero the
  // pool may give its memory back. Guarded by the owning DeviceAllocators' pools lock.
  int use_count = 1;
  bool use_on_oom = false;
  void set_in_use(bool in_use);

  // Blocks handed out and not yet freed, plus allocations in flight: the pool object must live
  // while this is non-zero.
  std::atomic<std::int64_t> live_blocks{0};

  // True when nothing is held any more: the pool can be destroyed without leaking.
  bool holds_nothing() const;

 private:
  c10::MempoolId_t id_{0, 0};
  bool sleepable_ = false;
  std::unique_ptr<PrivatePoolBackend> private_backend_;  // null for the default pool
  std::unique_ptr<CappedBackend> capped_backend_;        // the device's cap over private_backend_
  PoolObserver observer_;
  std::unique_ptr<CachingAllocator> policy_;
};

}  // namespace vramledger::torch_plugin
