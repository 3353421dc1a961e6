// Everything vramledger holds for one CUDA device: the backend, the ledger, torch's history, the
// default pool and the private pools, and which pool an allocation on a given stream goes to
// while CUDA graphs are being captured.
//
// Private pools follow PyTorch's use-count rules: createOrIncrefPool / beginAllocateToPool add a
// user, releasePool removes one; a pool whose count reached zero is retired, and is destroyed
// (its memory returned) once its last block is freed.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "accounting/classification/device_ledger_view.hpp"
#include "accounting/ledger.hpp"
#include "allocator/config.hpp"
#include "allocator/device_backend.hpp"
#include "allocator/sleepable_segment_backend.hpp"
#include "torch_plugin/event_gate.hpp"
#include "torch_plugin/memory_pool.hpp"
#include "torch_plugin/torch_history.hpp"

namespace vramledger::torch_plugin {

using StreamFilter = std::function<bool(cudaStream_t)>;

// True while torch routes allocations to a private pool on any device, i.e. while a CUDA graph
// may be capturing: device calls must then run in relaxed capture mode, and memory a capture may
// reference must not be returned.
bool any_capture_underway();

// VRAMLEDGER_TORCH_ALLOW_SIMULATED=1 lets backend:simulated serve the plugin: fake addresses and
// no CUDA calls, for the plugin's own tests on machines without a GPU.
bool simulated_backend_allowed();

// "(first, second)": how messages name a torch memory pool id.
std::string pool_name(c10::MempoolId_t id);

class DeviceAllocators {
 public:
  // Creates the backend named by config.backend ("auto" picks vmm where the device supports it,
  // else cuda_malloc). Throws Error when the device or backend cannot be used.
  DeviceAllocators(c10::DeviceIndex device, const Config& config);
  ~DeviceAllocators();
  DeviceAllocators(const DeviceAllocators&) = delete;
  DeviceAllocators& operator=(const DeviceAllocators&) = delete;

  c10::DeviceIndex device() const { return device_; }
  DeviceBackend& backend() { return *backend_; }
  const BackendInfo& backend_info() const { return backend_->info(); }
  // Whether the default pool places blocks in the paged (VMM) heap.
  bool default_pool_is_paged() const { return paged_; }
  // Whether the default pool's memory is plain cudaMalloc memory, which peer access (enabled by
  // cudaDeviceEnablePeerAccess) covers; VMM pages and cudaMallocAsync pools it does not.
  bool memory_is_peer_accessible() const {
    return !paged_ && backend_->info().name != "malloc_async";
  }
  // No CUDA behind it (tests): no capture-mode switching either.
  bool is_simulated() const { return simulated_; }
  TorchHistory& history() { return history_; }
  MemoryPool& default_pool() { return *default_pool_; }
  const MemoryPool& default_pool() const { return *default_pool_; }

  // The pool an allocation on `stream` belongs to, with its live_blocks already raised (the
  // caller lowers it again if the allocation fails).
  MemoryPool& acquire_pool_for(cudaStream_t stream);
  // Pools that volunteer memory when the default pool is out of it (MemPool(use_on_oom=True)),
  // each acquired as above.
  std::vector<MemoryPool*> acquire_oom_fallback_pools();
  // Called after a block of `pool` was freed (or an acquisition was abandoned).
  void release_block_of(MemoryPool& pool);

  // torch's pool API.
  void create_or_incref_pool(c10::MempoolId_t id,
                             std::shared_ptr<c10_alloc::CUDAAllocator> foreign);
  void begin_allocate_to_pool(c10::MempoolId_t id, StreamFilter filter);
  void end_allocate_to_pool(c10::MempoolId_t id);
  void release_pool(c10::MempoolId_t id);
  int pool_use_count(c10::MempoolId_t id);
  void set_use_on_oom(c10::MempoolId_t id, bool use_on_oom);
  // MemPool(no_split=True): the pool's blocks are never split. Torch may say it before or after
  // creating the pool.
  void set_no_split(c10::MempoolId_t id);
  bool captures_underway() const { return route_count_.load(std::memory_order_acquire) > 0; }
  bool has_retired_pools() const;

  // Sleep and wake of every CUDA graph pool (the name "graphs" in sleep/wake, docs/sleep.md):
  // pools torch created for a capture (beginAllocateToPool), whose segments can sleep where
  // the device has virtual memory; MemPool objects' pools keep cudaMalloc segments (CUDA IPC,
  // NCCL registration) and do not sleep. sleep: kNotSupported without virtual memory,
  // kInvalidArgument when asleep already; a pool that refuses wakes the ones slept before it.
  // wake: kInvalidArgument when not asleep; short of memory, the default pool's cache is
  // released and the pool tried once more (OutOfMemoryError then, nothing lost). Pools created
  // while the graphs sleep are awake. The caller refuses during captures.
  SleepResult sleep_graph_pools(bool offload);
  SleepResult wake_graph_pools();
  bool graphs_asleep() const;
  bool graph_pools_can_sleep() const {
    return config_.options.sleepable_graph_pools && backend_->info().supports_virtual_memory;
  }

  // {0,0}: the default pool and every retired pool; otherwise that pool, if torch released it
  // (a pool still in use keeps its memory, as in PyTorch). Does nothing while a capture is
  // underway.
  void empty_cache(c10::MempoolId_t id);

  // Memory fraction: a cap on the reserved bytes of all pools together (0 = none), as torch's
  // allowed_memory_maximum.
  void set_cap(std::size_t cap_bytes);
  std::size_t cap() const;

  // Calls visit(pool) for the default pool and the private pools (live and retired) whose id
  // matches (all of them for {0,0}), while no pool can be destroyed.
  void for_each_pool(c10::MempoolId_t id, const std::function<void(MemoryPool&)>& visit,
                     bool all_pools);

  // Ledger reads and resets, under the gate lock.
  LedgerCounters counters() const;
  // How the default pool's shard events were counted (Ledger::shard_tally): its per-stream fast
  // path and front caches count through the ledger's shards (event_gate.hpp).
  Ledger::ShardTally shard_tally() const;
  // A request refused before it reached a pool's policy (larger than the device): counted as an
  // out-of-memory event in the ledger (num_ooms), as torch counts it.
  void record_refused_request(std::size_t bytes, cudaStream_t stream);
  // torch.cuda.caching_allocator_enable(False): memory straight from cudaMalloc, returned with
  // cudaFree, outside the cache and torch's statistics (as torch does), counted apart
  // (uncached_bytes) so the process report still places every byte.
  DevicePtr allocate_uncached(std::size_t bytes, cudaStream_t stream);
  void free_uncached(DevicePtr ptr, std::size_t bytes, cudaStream_t stream);
  std::int64_t uncached_bytes() const { return uncached_bytes_.load(); }
  // Reserved bytes per private pool (torch 2.13's reserved_bytes_by_private_pools).
  std::vector<std::pair<c10::MempoolId_t, PrivatePoolStats::PerKind>> private_pool_reserved() const;
  // The ledger as the process classification reads it (aggregate counters and the sticky
  // inconsistency flag, copied together).
  DeviceLedgerView ledger_view() const;
  std::vector<TagUsage> per_tag() const;
  void reset_peaks();
  void reset_accumulated();
  std::string describe() const;
  // The ledger's text account (accounting/text_report.hpp) under a header naming the device.
  std::string report() const;

  // Frees that must wait for the end of all captures (see VramledgerAllocator::free_block).
  void defer_free(void* ptr);
  std::vector<void*> take_deferred_frees();

 private:
  struct Route {
    c10::MempoolId_t id;
    StreamFilter filter;
  };

  MemoryPool& private_pool_locked(c10::MempoolId_t id);  // throws if unknown
  // Plain device segments (cudaMalloc), never the paged heap or a stream-ordered pool: what
  // private pools and caching-disabled requests use. Created on first use, under pools_mutex_.
  DeviceBackend& plain_segment_backend_locked();
  // graph_pool: created by a capture (beginAllocateToPool), so on sleepable segments if it can.
  void create_or_incref_pool_locked(c10::MempoolId_t id,
                                    std::shared_ptr<c10_alloc::CUDAAllocator> foreign,
                                    bool graph_pool = false);
  void retire_locked(std::map<c10::MempoolId_t, std::unique_ptr<MemoryPool>>::iterator it);
  void destroy_empty_retired_locked();

  const c10::DeviceIndex device_;
  const Config config_;
  std::unique_ptr<DeviceBackend> backend_;
  std::unique_ptr<DeviceBackend> pool_segment_backend_;  // cudaMalloc for private pools
  // CUDA graph pools' segments over backend_'s virtual memory (null without it), created on
  // first use under pools_mutex_; outlives every pool (declared before them).
  std::unique_ptr<SleepableSegmentBackend> graph_segment_backend_;
  DeviceReservation reservation_;                  // torch's memory fraction, all pools together
  std::unique_ptr<CappedBackend> capped_backend_;  // the default pool's view of backend_
  bool paged_ = false;
  bool simulated_ = false;  // asked on every allocation and free: not a string compare each time
  Ledger ledger_;
  TorchHistory history_;
  EventGate gate_;
  std::unique_ptr<MemoryPool> default_pool_;

  mutable std::mutex pools_mutex_;
  std::map<c10::MempoolId_t, std::unique_ptr<MemoryPool>> private_pools_;
  std::vector<std::unique_ptr<MemoryPool>> retired_pools_;
  std::vector<Route> routes_;
  std::atomic<int> route_count_{0};
  std::vector<void*> deferred_frees_;
  std::set<c10::MempoolId_t> no_split_pools_;  // said before the pool existed
  bool graphs_asleep_ = false;                 // sleep_graph_pools; under pools_mutex_
  std::size_t cap_bytes_ = 0;
  std::atomic<std::int64_t> uncached_bytes_{0};
};

}  // namespace vramledger::torch_plugin
