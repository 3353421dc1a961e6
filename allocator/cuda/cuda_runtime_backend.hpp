// Services every real backend shares: device selection, cudaMemGetInfo, streams and events
// through the CUDA runtime. The three backends differ only in where memory comes from.
#pragma once

#include <cstddef>
#include <string>

#include "allocator/device_backend.hpp"

namespace vramledger {

class CudaRuntimeBackend : public DeviceBackend {
 public:
  const BackendInfo& info() const override { return info_; }
  Status memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override;

  // Events are created with cudaEventDisableTiming: they only order work, and timing events
  // cost more to record and query.
  Status create_event(EventHandle* out) override;
  Status destroy_event(EventHandle event) override;
  Status record_event(EventHandle event, StreamHandle stream) override;
  Status query_event(EventHandle event, EventState* state) override;
  Status synchronize_event(EventHandle event) override;
  Status stream_wait_event(StreamHandle stream, EventHandle event) override;
  Status synchronize_device() override;
  // Sleep and wake (docs/sleep.md): pinned host memory (pinned_host_memory.hpp, two ways) and
  // copies queued on the legacy default stream (cudaMemcpyAsync), complete at synchronize_device().
  Status allocate_host(std::size_t bytes, void** out) override;
  Status free_host(void* host) override;
  Status copy_to_host(void* host, DevicePtr device, std::size_t bytes) override;
  Status copy_to_device(DevicePtr device, const void* host, std::size_t bytes) override;

 protected:
  // Makes `device` usable (initialises its primary context) and fills info(): total bytes and
  // the VMM granularity where the driver offers it. Throws Error when the device is unusable.
  CudaRuntimeBackend(int device, std::string name);

  // cudaMalloc / cudaFree segments, shared by the backends that use them.
  Status malloc_segment(std::size_t bytes, DevicePtr* out);
  Status free_malloc_segment(DevicePtr ptr, std::size_t bytes);

  int device() const { return info_.device; }
  BackendInfo& mutable_info() { return info_; }

 private:
  BackendInfo info_;
};

}  // namespace vramledger
