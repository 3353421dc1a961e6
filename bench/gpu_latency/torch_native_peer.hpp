// PyTorch's native CUDA caching allocator through its C++ API, as torch's own callers reach it:
// c10::cuda::CUDACachingAllocator::get()->raw_alloc_with_stream / raw_delete.
//
// Nobody installs vramledger into torch in this binary, so get() is torch's own allocator; the
// constructor still checks that name() is "native" (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
// would swap it) and refuses otherwise. Built only when torch is found (see meson.build).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "bench/gpu_latency/peers.hpp"

namespace vramledger::gpu_latency {

class TorchNativePeer {
 public:
  // Initialises the native allocator for every device (init is idempotent). With
  // `expandable_segments` the growth loop runs under expandable_segments:True (set through
  // c10::CachingAllocator::setAllocatorSettings, as torch.cuda.memory._set_allocator_settings
  // does) and restores expandable_segments:False after it. Throws PeerError when torch's
  // allocator is not the native one or cannot be initialised.
  explicit TorchNativePeer(bool expandable_segments = false);
  ~TorchNativePeer();

  void* allocate(std::size_t bytes, cudaStream_t stream) {
    return allocator_->raw_alloc_with_stream(bytes, stream);  // throws c10::Error (OOM, ...)
  }
  void deallocate(void* ptr, std::size_t /*bytes*/,
                  cudaStream_t /*stream: the allocator remembers both*/) {
    allocator_->raw_delete(ptr);
  }

  // torch has no public way to build a second native allocator, so "cold" is the same allocator
  // after emptyCache(): the allocation must create (or, expandable, map) memory, and the
  // iteration ends with emptyCache() giving it back.
  void prepare_growth();
  GrowthSample grow_cold(std::size_t bytes, cudaStream_t stream);
  void finish_growth();
  void release_cache() { allocator_->emptyCache(); }

  // "native (c10::cuda::CUDACachingAllocator::get()->name()), torch <version>" and, when set,
  // the PYTORCH_CUDA_ALLOC_CONF that shapes it.
  std::string describe() const;

 private:
  void set_expandable(bool on);
  bool expandable_ = false;
  c10::cuda::CUDACachingAllocator::CUDAAllocator* allocator_ = nullptr;
};

}  // namespace vramledger::gpu_latency
