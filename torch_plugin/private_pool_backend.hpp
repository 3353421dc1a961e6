// The backend under a private pool (CUDA graph capture, torch.cuda.MemPool).
//
// Two rules differ from the default pool:
//  * Memory a graph captured must stay where it is until the graph is gone: a block freed inside
//    the capture is free in the pool but the graph writes to it on every replay. So while the
//    pool is in use, segments may not be returned (the policy's OOM retry would otherwise free
//    them); once torch releases the pool they may.
//  * Segments come from plain device allocation (cudaMalloc), never from the paged heap or a
//    stream-ordered pool: their fences and cudaMallocAsync calls would be recorded into the graph
//    being captured. Or, for torch.cuda.MemPool(allocator=...), from that torch allocator (e.g. an
//    NCCL-registered CUDAPluggableAllocator), exactly as PyTorch's own caching allocator does.
//
// Streams and events are the device backend's.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <memory>

#include "allocator/device_backend.hpp"

namespace vramledger::torch_plugin {

class PrivatePoolBackend final : public DeviceBackend {
 public:
  // `segments` provides memory unless `foreign` is given; `services` provides streams and events.
  // Both must outlive this backend.
  PrivatePoolBackend(DeviceBackend& segments, DeviceBackend& services,
                     std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> foreign);

  // While false, free_segment refuses (kNotSupported) and the allocation that asked for it
  // fails as out of memory instead of corrupting a captured graph.
  void allow_release(bool allowed) { release_allowed_.store(allowed); }

  const BackendInfo& info() const override { return info_; }
  Status memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    return services_.memory_info(free_bytes, total_bytes);
  }
  Status allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) override;
  Status free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) override;

  Status create_event(EventHandle* out) override { return services_.create_event(out); }
  Status destroy_event(EventHandle event) override { return services_.destroy_event(event); }
  Status record_event(EventHandle event, StreamHandle stream) override {
    return services_.record_event(event, stream);
  }
  Status query_event(EventHandle event, EventState* state) override {
    return services_.query_event(event, state);
  }
  Status synchronize_event(EventHandle event) override {
    return services_.synchronize_event(event);
  }
  Status stream_wait_event(StreamHandle stream, EventHandle event) override {
    return services_.stream_wait_event(stream, event);
  }
  Status synchronize_device() override { return services_.synchronize_device(); }

 private:
  DeviceBackend& segments_;
  DeviceBackend& services_;
  std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> foreign_;
  BackendInfo info_;
  std::atomic<bool> release_allowed_{false};
};

}  // namespace vramledger::torch_plugin
