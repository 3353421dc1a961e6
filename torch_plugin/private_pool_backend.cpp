#include "torch_plugin/private_pool_backend.hpp"

#include <c10/cuda/CUDAGuard.h>

#include <exception>
#include <string>
#include <utility>

namespace vramledger::torch_plugin {

PrivatePoolBackend::PrivatePoolBackend(
    DeviceBackend& segments, DeviceBackend& services,
    std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> foreign)
    : ForwardingBackend(services), segments_(segments), foreign_(std::move(foreign)) {
  info_ = services.info();
  info_.name = "private_pool(";
  info_.name += foreign_ ? foreign_->name() : segments_.info().name;
  info_.name += ')';
  info_.supports_virtual_memory = false;  // segment heap only: see the header
  info_.stream_ordered_segments = false;
}

Status PrivatePoolBackend::allocate_segment(std::size_t bytes, StreamHandle stream,
                                            DevicePtr* out) {
  if (!foreign_) return segments_.allocate_segment(bytes, stream, out);
  try {
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(info_.device));
    void* ptr = foreign_->raw_alloc_with_stream(bytes, reinterpret_cast<cudaStream_t>(stream));
    if (ptr == nullptr) {
      return {ErrorCode::kOutOfMemory,
              foreign_->name() + " returned no memory for " + std::to_string(bytes) + " bytes"};
    }
    *out = reinterpret_cast<DevicePtr>(ptr);
    return Status::ok();
  } catch (const c10::OutOfMemoryError& error) {
    return {ErrorCode::kOutOfMemory, error.what_without_backtrace()};
  } catch (const std::exception& error) {
    return {ErrorCode::kDriverError, foreign_->name() + ": " + error.what()};
  }
}

Status PrivatePoolBackend::free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) {
  if (!release_allowed_.load()) {
    return {ErrorCode::kNotSupported,
            "a private memory pool (CUDA graph / MemPool) keeps its segments while torch still "
            "uses the pool; its cached memory is returned once the pool is released"};
  }
  if (!foreign_) return segments_.free_segment(ptr, bytes, stream);
  try {
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(info_.device));
    foreign_->raw_delete(reinterpret_cast<void*>(ptr));
    return Status::ok();
  } catch (const std::exception& error) {
    return {ErrorCode::kDriverError, foreign_->name() + ": " + error.what()};
  }
}

}  // namespace vramledger::torch_plugin
