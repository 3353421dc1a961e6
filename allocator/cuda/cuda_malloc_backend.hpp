// Backend over plain cudaMalloc / cudaFree: the reference every other backend is compared with.
//
// cudaFree synchronises the whole device before it returns (and so stalls every stream): the
// policy must release segments rarely (empty_cache, OOM retry), never on the hot path.
// Freeing is not stream-ordered: the policy first waits for pending events itself.
#pragma once

#include "allocator/cuda/cuda_runtime_backend.hpp"

namespace vramledger {

class CudaMallocBackend final : public CudaRuntimeBackend {
 public:
  // Throws Error when `device` cannot be used.
  explicit CudaMallocBackend(int device);

  // `stream` is ignored: cudaMalloc memory is usable by every stream as soon as it returns.
  Status allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) override;
  Status free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) override;
};

}  // namespace vramledger
