// The allocators vramledger-bench-gpu-latency compares, each behind the same small interface so
// one templated benchmark body serves them all (no virtual call in the timed loop):
//
//   void* allocate(std::size_t bytes, cudaStream_t stream);              // throws PeerError
//   void deallocate(void* ptr, std::size_t bytes, cudaStream_t stream);  // throws PeerError
//   void prepare_growth();                                               // before a growth loop
//   GrowthSample grow_cold(std::size_t bytes, cudaStream_t);             // see GrowthSample
//   void finish_growth();                                                // after it
//   void release_cache();                       // cached memory back to the driver, if it can
//
// `stream` is the stream the block is used on; allocators without streams ignore it, and a
// block is always freed with the stream it was allocated with. `bytes` in deallocate is the size
// the block was allocated with: RMM's resources need it (rmm_peer.hpp); the others use it at
// most in an error message.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/spin_mutex.hpp"
#include "allocator/config.hpp"
#include "allocator/device_backend.hpp"

namespace vramledger::gpu_latency {

inline constexpr int kDevice = 0;

// A failure reported by the allocator under test; the benchmark turns it into SkipWithError.
class PeerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws PeerError naming the call, the size and the CUDA error.
[[noreturn]] void throw_cuda(cudaError_t error, const char* call, std::size_t bytes);

// One cold growth: allocate `bytes` from an allocator that holds nothing, then free it and give
// the memory back to the driver. The benchmark times the whole; alloc_seconds is the allocate
// call alone.
struct GrowthSample {
  double alloc_seconds = 0;
};

// What production puts between a device's allocators and its ledger (torch_plugin/event_gate.hpp):
// a mutex, then the ledger. The plugin's gate also forwards to torch's memory history, which
// returns at once while history recording is off (the default), so it is left out here.
class GatedLedger final : public AllocatorObserver {
 public:
  // VRAMLEDGER_BENCH_TRACE_CAPACITY (records; 0: no trace) sets the ledger's trace ring, to
  // measure what recording every event costs the threads (default: the ledger's own).
  GatedLedger() : ledger_(ledger_options()) {}
  void on_event(const AllocatorEvent& event) noexcept override {
    std::lock_guard<SpinMutex> lock(mutex_);
    ledger_.on_event(event);
  }
  // Front caches (front_cache_mb) report to the ledger's shards directly; the ledger orders them
  // after this gate (gate lock -> ledger lock -> shard mutexes).
  // Every event goes through mutex_: safe from several threads at once, so the allocator runs
  // own-stream operations under their stream's lock (docs/design.md 4), as it does over a Ledger.
  bool accept_concurrent_events() noexcept override { return true; }
  bool has_shards() const noexcept override { return ledger_.has_shards(); }
  ObserverShard* open_shard() override { return ledger_.open_shard(); }
  // The streams' shards too (docs/design.md 5.2): their fast path bypasses the gate as a front
  // cache's does; their slow path takes the ledger's lock (stream lock -> ledger lock -> shard
  // mutexes), never the gate.
  ObserverShard* open_stream_shard() override { return ledger_.open_stream_shard(); }
  void close_shard(ObserverShard* shard) noexcept override { ledger_.close_shard(shard); }
  std::string describe() const override;
  // "consistent", or what differs between the ledger and the allocator's census.
  std::string check_against(const CachingAllocator& allocator) const;
  bool consistent_with(const CachingAllocator& allocator) const;
  // The trace ring's pages touched now (EventTrace::prefault): warm cases measure the steady
  // state, not the first million events' page faults (which made the first case of each peer
  // the slowest: 512 B in every table before this).
  void prefault_trace() { ledger_.trace().prefault(); }
  std::int64_t slow_events() const {
    return static_cast<std::int64_t>(ledger_.shard_tally().slow);
  }
  std::int64_t gathered_events() const {
    return static_cast<std::int64_t>(ledger_.shard_tally().gathered);
  }
  // Nanoseconds with every ledger shard held (Ledger::ShardTally::all_held_ns).
  std::int64_t all_shards_held_ns() const {
    return static_cast<std::int64_t>(ledger_.shard_tally().all_held_ns);
  }
  // Maps, unmaps, device allocations and frees so far (the ledger's counts of those events).
  std::int64_t driver_calls() const { return ledger_.counters().driver_calls(); }

 private:
  static LedgerOptions ledger_options();
  mutable SpinMutex mutex_;  // as the plugin's EventGate
  Ledger ledger_;
};

// vramledger's policy (CachingAllocator) configured from a configuration string, as the plugin
// is ("backend:vmm", ...), over a backend, with the ledger attached.
class VramledgerPeer {
 public:
  using BackendFactory = std::function<std::unique_ptr<DeviceBackend>()>;

  // `backend` serves the warm cases (it may be shared with another peer: the simulated dry run
  // puts both heap shapes on one device); `make_backend` builds a fresh one for the growth case.
  VramledgerPeer(const std::string& conf, std::shared_ptr<DeviceBackend> backend,
                 BackendFactory make_backend);
  // The real backend the string names (make_cuda_backend on GPU 0), with `extra_conf` (e.g.
  // ",front_cache_mb:1024") appended. Throws Error(kNotSupported) when the device lacks what it
  // needs.
  static std::unique_ptr<VramledgerPeer> on_gpu(const std::string& backend_name,
                                                const std::string& extra_conf = "");
  ~VramledgerPeer();

  void* allocate(std::size_t bytes, cudaStream_t stream) {
    return reinterpret_cast<void*>(
        allocator_->allocate(bytes, reinterpret_cast<StreamHandle>(stream)));
  }
  void deallocate(void* ptr, std::size_t /*bytes*/,
                  cudaStream_t /*stream: the allocator remembers both*/) {
    allocator_->deallocate(reinterpret_cast<DevicePtr>(ptr));
  }
  // Growth uses a second backend of the same kind (make_backend), made before the loop, so the
  // warm allocator's cache cannot serve it. Each iteration builds a fresh ledger and CachingAllocator
  // over it; destroying the allocator returns every byte to the driver.
  void prepare_growth();
  GrowthSample grow_cold(std::size_t bytes, cudaStream_t stream);
  void finish_growth() { growth_backend_.reset(); }
  void release_cache() { allocator_->empty_cache(); }

  // "paged heap on vmm (conf backend:vmm, ledger attached)".
  std::string describe() const;
  std::string check_ledger() const { return ledger_.check_against(*allocator_); }
  bool ledger_consistent() const { return ledger_.consistent_with(*allocator_); }
  std::int64_t driver_calls() const { return ledger_.driver_calls(); }
  // Lanes given to threads so far (BlockCensus::lane_choices; takes the allocator's lock).
  std::int64_t lane_choices() const { return allocator_->census().lane_choices; }
  // Where the hot path's work went (docs/design.md 4, 5.2): the policy's running figures
  // (allocations the per-stream fast path left to the allocator's lock, the time it was held,
  // rooms short everywhere, ...), and shard events that took the ledger's exact path
  // (Ledger::ShardTally::slow: the ledger's mutex and every shard's).
  PolicyFigures policy_figures() const { return allocator_->policy_figures(); }
  std::int64_t ledger_slow_events() const { return ledger_.slow_events(); }
  std::int64_t ledger_all_shards_held_ns() const { return ledger_.all_shards_held_ns(); }
  std::int64_t ledger_gathered_events() const { return ledger_.gathered_events(); }

 private:
  std::string conf_;
  Config config_;
  std::shared_ptr<DeviceBackend> backend_;
  BackendFactory make_backend_;
  GatedLedger ledger_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<DeviceBackend> growth_backend_;
};

// cudaMalloc + cudaFree, nothing cached.
class CudaMallocPeer {
 public:
  void* allocate(std::size_t bytes, cudaStream_t /*stream*/) {
    void* ptr = nullptr;
    const cudaError_t error = cudaMalloc(&ptr, bytes);
    if (error != cudaSuccess) [[unlikely]] throw_cuda(error, "cudaMalloc", bytes);
    return ptr;
  }
  void deallocate(void* ptr, std::size_t bytes, cudaStream_t /*stream*/) {
    const cudaError_t error = cudaFree(ptr);
    if (error != cudaSuccess) [[unlikely]] throw_cuda(error, "cudaFree", bytes);
  }
  void prepare_growth() {}
  GrowthSample grow_cold(std::size_t bytes, cudaStream_t stream);
  void finish_growth() {}
  void release_cache() {}
};

// cudaMallocAsync + cudaFreeAsync on the device's default memory pool, with its release threshold
// raised to UINT64_MAX so freed memory stays in the pool (the setting of the anchors and of
// torch's cudaMallocAsync backend). The previous threshold is restored on destruction.
class MallocAsyncPeer {
 public:
  MallocAsyncPeer();  // throws PeerError when the device has no memory pools
  ~MallocAsyncPeer();

  void* allocate(std::size_t bytes, cudaStream_t stream) {
    void* ptr = nullptr;
    const cudaError_t error = cudaMallocAsync(&ptr, bytes, stream);
    if (error != cudaSuccess) [[unlikely]] throw_cuda(error, "cudaMallocAsync", bytes);
    return ptr;
  }
  void deallocate(void* ptr, std::size_t bytes, cudaStream_t stream) {
    const cudaError_t error = cudaFreeAsync(ptr, stream);
    if (error != cudaSuccess) [[unlikely]] throw_cuda(error, "cudaFreeAsync", bytes);
  }
  // Cold = the pool trimmed to zero before the loop; each iteration ends by trimming again.
  void prepare_growth() { trim(); }
  GrowthSample grow_cold(std::size_t bytes, cudaStream_t stream);
  void finish_growth() {}
  void release_cache() { trim(); }
  // Returns every unused byte of the pool to the driver (after synchronising the device).
  void trim();

 private:
  cudaMemPool_t pool_ = nullptr;
  std::uint64_t previous_threshold_ = 0;
};

}  // namespace vramledger::gpu_latency
