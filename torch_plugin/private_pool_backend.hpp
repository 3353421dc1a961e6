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
//    CUDA graph pools on a device with virtual memory get sleepable segments instead (one
//    reservation and one chunk each, no stream calls: SleepableSegmentBackend), so they can
//    sleep and wake at the same addresses (docs/sleep.md).
//
// Streams and events are the device backend's.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <memory>
#include <span>

#include "allocator/device_backend.hpp"
#include "allocator/forwarding_backend.hpp"

namespace vramledger::torch_plugin {

class PrivatePoolBackend final : public ForwardingBackend {
 public:
  // `segments` provides memory unless `foreign` is given; `services` provides streams and events.
  // Both must outlive this backend.
  PrivatePoolBackend(DeviceBackend& segments, DeviceBackend& services,
                     std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> foreign);

  // While false, free_segment refuses (kNotSupported) and the allocation that asked for it
  // fails as out of memory instead of corrupting a captured graph.
  void allow_release(bool allowed) { release_allowed_.store(allowed); }

  const BackendInfo& info() const override { return info_; }
  Status allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) override;
  Status free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) override;
  // Segments only (see above): no virtual memory, whatever the device backend offers.
  Status create_physical(std::size_t bytes, PhysicalHandle* out) override {
    return DeviceBackend::create_physical(bytes, out);
  }
  Status release_physical(PhysicalHandle handle) override {
    return DeviceBackend::release_physical(handle);
  }
  Status reserve_address_range(std::size_t bytes, DevicePtr* out) override {
    return DeviceBackend::reserve_address_range(bytes, out);
  }
  Status free_address_range(DevicePtr base, std::size_t bytes) override {
    return DeviceBackend::free_address_range(base, bytes);
  }
  Status map_pages(DevicePtr va, std::size_t page_bytes,
                   std::span<const PhysicalHandle> handles) override {
    return DeviceBackend::map_pages(va, page_bytes, handles);
  }
  Status unmap_pages(DevicePtr va, std::size_t page_bytes, std::size_t count) override {
    return DeviceBackend::unmap_pages(va, page_bytes, count);
  }
  Status grant_peer_access(int peer_device) override {
    return DeviceBackend::grant_peer_access(peer_device);
  }
  // Graph pools over sleepable segments (docs/sleep.md); a foreign allocator's memory cannot.
  Status release_segment_memory(DevicePtr ptr, std::size_t bytes) override {
    return foreign_ ? DeviceBackend::release_segment_memory(ptr, bytes)
                    : segments_.release_segment_memory(ptr, bytes);
  }
  Status restore_segment_memory(DevicePtr ptr, std::size_t bytes) override {
    return foreign_ ? DeviceBackend::restore_segment_memory(ptr, bytes)
                    : segments_.restore_segment_memory(ptr, bytes);
  }

 private:
  DeviceBackend& segments_;
  std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> foreign_;
  BackendInfo info_;
  std::atomic<bool> release_allowed_{false};
};

}  // namespace vramledger::torch_plugin
