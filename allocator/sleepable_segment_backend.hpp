// Segments whose memory can sleep: each segment is one reserved address range with one physical
// chunk mapped under it, instead of a cudaMalloc allocation, so the chunk can go back to the
// device while the address stays reserved and come back at the same address (docs/sleep.md).
// CUDA graphs keep raw pointers into their private pool; this is what lets that pool sleep.
//
// Why not the paged heap: it records fence events and may map pages on the capturing stream.
// Here every call is a driver call outside any stream (cuMemAddressReserve, cuMemCreate,
// cuMemMap, cuMemSetAccess — legal in a relaxed-mode capture, as torch's expandable segments
// show), and a segment is freed only whole, as a cudaMalloc segment is.
//
// Needs an inner backend with virtual memory; every other call is forwarded. Thread safe.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>

#include "allocator/forwarding_backend.hpp"

namespace vramledger {

class SleepableSegmentBackend final : public ForwardingBackend {
 public:
  // Throws Error(kNotSupported) when `inner` has no virtual memory. `inner` must outlive this.
  explicit SleepableSegmentBackend(DeviceBackend& inner);
  ~SleepableSegmentBackend() override;  // gives back whatever is still held (best effort)

  const BackendInfo& info() const override { return info_; }
  // The chunk is `bytes` rounded up to info().granularity, as cudaMalloc rounds (the torch
  // plugin asks for whole chunks only, so its books stay exact: memory_pool.cpp).
  Status allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) override;
  // Waits for the device first, as cudaFree does: the policy frees a segment without fences.
  Status free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) override;
  Status release_segment_memory(DevicePtr ptr, std::size_t bytes) override;
  Status restore_segment_memory(DevicePtr ptr, std::size_t bytes) override;
  // Segments only, as info() says: the virtual memory calls are not offered to the policy.
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

  // Segments held and, of them, those with no memory behind them (tests, reports).
  std::size_t segment_count() const;
  std::size_t released_count() const;

 private:
  struct Segment {
    std::size_t bytes = 0;   // as asked for
    std::size_t mapped = 0;  // reserved and backed: bytes rounded up to the granularity
    PhysicalHandle handle = 0;
    bool released = false;  // asleep: address reserved, no chunk
  };
  Status find(DevicePtr ptr, std::size_t bytes, const char* what, Segment** out);
  Status map_new_chunk(DevicePtr ptr, std::size_t bytes, PhysicalHandle* handle);

  BackendInfo info_;
  mutable std::mutex mutex_;
  std::map<DevicePtr, Segment> segments_;
};

}  // namespace vramledger
