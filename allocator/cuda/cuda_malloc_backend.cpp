#include "allocator/cuda/cuda_malloc_backend.hpp"

namespace vramledger {

CudaMallocBackend::CudaMallocBackend(int device) : CudaRuntimeBackend(device, "cuda_malloc") {
  mutable_info().supports_virtual_memory = false;
  mutable_info().stream_ordered_segments = false;
}

Status CudaMallocBackend::allocate_segment(std::size_t bytes, StreamHandle, DevicePtr* out) {
  return malloc_segment(bytes, out);
}

Status CudaMallocBackend::free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle) {
  return free_malloc_segment(ptr, bytes);
}

}  // namespace vramledger
