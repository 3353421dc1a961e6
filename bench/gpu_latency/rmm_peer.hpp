// RAPIDS RMM's pool_memory_resource and arena_memory_resource (issue 15), each over RMM's
// cuda_memory_resource (cudaMalloc / cudaFree), as C++ users of RMM build them.
//
// Built only when meson finds RMM (scripts/fetch_rmm.sh puts it in .deps/rmm; option rmm_root):
// rmm_peer.cpp is the only file compiled against RMM's headers (and RMM's own copy of CCCL), so
// this header names no RMM type and the rest of the binary never sees them. allocate and
// deallocate are therefore out-of-line calls, one plain call more than an inline peer, as
// VramledgerPeer's CachingAllocator calls are.
//
// Both resources are documented thread-safe (each takes its own lock; the arena's per-thread and
// per-stream arenas have their own), so the multi-threaded cases use one peer from every thread as
// with the other allocators. RMM's deallocation needs the size and the alignment of the
// allocation: the peer interface is sized for it (peers.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

#include "bench/gpu_latency/peers.hpp"

namespace vramledger::gpu_latency {

class RmmPeer {
 public:
  enum class Kind {
    kPool,   // pool_memory_resource: initial size 0, no maximum, grows on demand
    kArena,  // arena_memory_resource: a 16 GiB global arena taken at construction
  };

  // Builds the resource on the current device (GPU 0). Throws PeerError when RMM refuses (the
  // arena's 16 GiB not available, ...).
  explicit RmmPeer(Kind kind);
  ~RmmPeer();
  RmmPeer(const RmmPeer&) = delete;
  RmmPeer& operator=(const RmmPeer&) = delete;

  // RMM exceptions (rmm::out_of_memory, rmm::bad_alloc, ...) come out as PeerError naming the
  // call and the size. Blocks are 256-byte aligned (RMM's CUDA_ALLOCATION_ALIGNMENT).
  void* allocate(std::size_t bytes, cudaStream_t stream);
  void deallocate(void* ptr, std::size_t bytes, cudaStream_t stream);

  // Pool only (the arena is left out of the growth list: its whole global arena is taken from
  // cudaMalloc when it is built, so a first allocation is carved from memory it already holds and
  // there is no growth to time). Each iteration builds a fresh pool_memory_resource over a fresh
  // cuda_memory_resource, times the allocation (which makes the pool take the size from
  // cudaMalloc), frees it and destroys the pool, which gives the memory back with cudaFree.
  void prepare_growth() {}
  GrowthSample grow_cold(std::size_t bytes, cudaStream_t stream);
  void finish_growth() {}
  // A pool or arena keeps what it took until destroyed (the pool grows to a trace's peak).
  void release_cache() {}

  // "RMM 26.10.0 pool_memory_resource over cuda_memory_resource (initial 0, grows on demand)".
  std::string describe() const;

 private:
  struct Resources;  // RMM's types, defined in rmm_peer.cpp
  Kind kind_;
  std::unique_ptr<Resources> resources_;
};

}  // namespace vramledger::gpu_latency
