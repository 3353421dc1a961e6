#include "allocator/cuda/malloc_async_backend.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "allocator/cuda/cuda_status.hpp"
#include "allocator/cuda/device_guard.hpp"

namespace vramledger {

namespace {

cudaStream_t as_stream(StreamHandle stream) { return reinterpret_cast<cudaStream_t>(stream); }

}  // namespace

MallocAsyncBackend::MallocAsyncBackend(int device, std::uint64_t release_threshold)
    : CudaRuntimeBackend(device, "malloc_async") {
  mutable_info().supports_virtual_memory = false;
  mutable_info().stream_ordered_segments = true;

  const DeviceGuard guard(device);
  throw_if_error(guard.status(), "vramledger: malloc_async backend");
  int supported = 0;
  throw_if_error(runtime_status(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported,
                                                       device),
                                "cudaDeviceGetAttribute",
                                "attribute=cudaDevAttrMemoryPoolsSupported, device=" +
                                    std::to_string(device)),
                 "vramledger: malloc_async backend");
  if (supported == 0) {
    throw Error(ErrorCode::kNotSupported,
                "vramledger: CUDA device " + std::to_string(device) +
                    " does not support stream-ordered memory pools (cudaMallocAsync)");
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  throw_if_error(runtime_status(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate",
                                "device=" + std::to_string(device)),
                 "vramledger: malloc_async backend");
  std::uint64_t threshold = release_threshold;
  const Status status = runtime_status(
      cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
      "cudaMemPoolSetAttribute", "attribute=cudaMemPoolAttrReleaseThreshold, value=" +
                                     std::to_string(release_threshold));
  if (!status.is_ok()) {
    (void)cudaMemPoolDestroy(pool_);
    throw_if_error(status, "vramledger: malloc_async backend");
  }
}

MallocAsyncBackend::~MallocAsyncBackend() {
  if (pool_ != nullptr && cudaMemPoolDestroy(pool_) != cudaSuccess) (void)cudaGetLastError();
}

Status MallocAsyncBackend::allocate_segment(std::size_t bytes, StreamHandle stream,
                                            DevicePtr* out) {
  if (bytes == 0) {
    return {ErrorCode::kInvalidArgument, "cudaMallocFromPoolAsync: a segment of 0 bytes"};
  }
  void* ptr = nullptr;
  Status status = check_runtime(
      cudaMallocFromPoolAsync(&ptr, bytes, pool_, as_stream(stream)), "cudaMallocFromPoolAsync",
      [&] {
        return "bytes=" + describe_bytes(bytes) + ", stream=" + describe_address(stream) +
               ", device=" + std::to_string(device());
      },
      HandleRole::kStream);
  if (status.is_ok()) *out = reinterpret_cast<DevicePtr>(ptr);
  return status;
}

Status MallocAsyncBackend::free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) {
  return check_runtime(
      cudaFreeAsync(reinterpret_cast<void*>(ptr), as_stream(stream)), "cudaFreeAsync",
      [&] {
        return "ptr=" + describe_address(ptr) + ", bytes=" + describe_bytes(bytes) +
               ", stream=" + describe_address(stream);
      },
      HandleRole::kStream);
}

Status MallocAsyncBackend::grant_peer_access(int peer_device) {
  cudaMemAccessDesc desc{};
  desc.location.type = cudaMemLocationTypeDevice;
  desc.location.id = peer_device;
  desc.flags = cudaMemAccessFlagsProtReadWrite;
  return runtime_status(cudaMemPoolSetAccess(pool_, &desc, 1), "cudaMemPoolSetAccess",
                        "peer device=" + std::to_string(peer_device) + ", flags=ReadWrite");
}

Status MallocAsyncBackend::trim(std::size_t keep_bytes) {
  return runtime_status(cudaMemPoolTrimTo(pool_, keep_bytes), "cudaMemPoolTrimTo",
                        "keep=" + describe_bytes(keep_bytes));
}

Status MallocAsyncBackend::reserved_bytes(std::uint64_t* out) const {
  return runtime_status(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, out),
                        "cudaMemPoolGetAttribute", "attribute=cudaMemPoolAttrReservedMemCurrent");
}

Status MallocAsyncBackend::used_bytes(std::uint64_t* out) const {
  return runtime_status(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, out),
                        "cudaMemPoolGetAttribute", "attribute=cudaMemPoolAttrUsedMemCurrent");
}

}  // namespace vramledger
