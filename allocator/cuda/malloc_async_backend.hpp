// Backend over a private stream-ordered memory pool (cudaMemPoolCreate + cudaMallocFromPoolAsync).
//
// Segments are allocated and freed in stream order: free_segment returns memory to the pool at
// the point of `stream` where it is called, so the policy need not wait for the stream itself.
// The pool is private so that other users of the device's default pool (torch, libraries) can
// neither take our cached memory nor make our accounting move.
//
// The pool is a second cache under the policy: with the default release threshold (UINT64_MAX)
// memory freed here stays in the pool and is not returned to the driver until trim() is called
// or the backend is destroyed. reserved_bytes() says how much the pool really holds.
#pragma once

#include <driver_types.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "allocator/cuda/cuda_runtime_backend.hpp"

namespace vramledger {

class MallocAsyncBackend final : public CudaRuntimeBackend {
 public:
  static constexpr std::uint64_t kKeepEverything = std::numeric_limits<std::uint64_t>::max();

  // Creates the pool on `device`. Throws Error when the device or the pool cannot be used.
  explicit MallocAsyncBackend(int device, std::uint64_t release_threshold = kKeepEverything);
  ~MallocAsyncBackend() override;  // destroys the pool (memory returns once all frees complete)

  Status allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) override;
  Status free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) override;

  // Releases pool memory not in use down to `keep_bytes` (cudaMemPoolTrimTo). Frees queued on a
  // stream count only once that stream reached them: synchronise first to release everything.
  Status trim(std::size_t keep_bytes = 0);
  // cudaMemPoolSetAccess: pool memory is not covered by cudaDeviceEnablePeerAccess.
  Status grant_peer_access(int peer_device) override;
  // Physical bytes the pool holds from the driver / hands out (cudaMemPoolAttr*MemCurrent).
  Status reserved_bytes(std::uint64_t* out) const;
  Status used_bytes(std::uint64_t* out) const;

  cudaMemPool_t pool() const { return pool_; }

 private:
  cudaMemPool_t pool_ = nullptr;
};

}  // namespace vramledger
