// A DeviceBackend that passes every call to another one: the base of adaptors that change a few
// calls of a backend and keep the rest (as RMM's resource adaptors wrap a memory resource).
// The inner backend must outlive the adaptor.
#pragma once

#include <cstddef>
#include <span>

#include "allocator/device_backend.hpp"

namespace vramledger {

class ForwardingBackend : public DeviceBackend {
 public:
  explicit ForwardingBackend(DeviceBackend& inner) : inner_(inner) {}

  const BackendInfo& info() const override { return inner_.info(); }
  Status memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    return inner_.memory_info(free_bytes, total_bytes);
  }
  Status allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) override {
    return inner_.allocate_segment(bytes, stream, out);
  }
  Status free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) override {
    return inner_.free_segment(ptr, bytes, stream);
  }
  Status create_physical(std::size_t bytes, PhysicalHandle* out) override {
    return inner_.create_physical(bytes, out);
  }
  Status release_physical(PhysicalHandle handle) override {
    return inner_.release_physical(handle);
  }
  Status reserve_address_range(std::size_t bytes, DevicePtr* out) override {
    return inner_.reserve_address_range(bytes, out);
  }
  Status free_address_range(DevicePtr base, std::size_t bytes) override {
    return inner_.free_address_range(base, bytes);
  }
  Status map_pages(DevicePtr va, std::size_t page_bytes,
                   std::span<const PhysicalHandle> handles) override {
    return inner_.map_pages(va, page_bytes, handles);
  }
  Status unmap_pages(DevicePtr va, std::size_t page_bytes, std::size_t count) override {
    return inner_.unmap_pages(va, page_bytes, count);
  }
  Status grant_peer_access(int peer_device) override { return inner_.grant_peer_access(peer_device); }
  Status create_event(EventHandle* out) override { return inner_.create_event(out); }
  Status destroy_event(EventHandle event) override { return inner_.destroy_event(event); }
  Status record_event(EventHandle event, StreamHandle stream) override {
    return inner_.record_event(event, stream);
  }
  Status query_event(EventHandle event, EventState* state) override {
    return inner_.query_event(event, state);
  }
  Status synchronize_event(EventHandle event) override { return inner_.synchronize_event(event); }
  Status stream_wait_event(StreamHandle stream, EventHandle event) override {
    return inner_.stream_wait_event(stream, event);
  }
  Status synchronize_device() override { return inner_.synchronize_device(); }
  Status allocate_host(std::size_t bytes, void** out) override {
    return inner_.allocate_host(bytes, out);
  }
  Status free_host(void* host) override { return inner_.free_host(host); }
  Status copy_to_host(void* host, DevicePtr device, std::size_t bytes) override {
    return inner_.copy_to_host(host, device, bytes);
  }
  Status copy_to_device(DevicePtr device, const void* host, std::size_t bytes) override {
    return inner_.copy_to_device(device, host, bytes);
  }
  bool capture_underway() const override { return inner_.capture_underway(); }
  Status release_segment_memory(DevicePtr ptr, std::size_t bytes) override {
    return inner_.release_segment_memory(ptr, bytes);
  }
  Status restore_segment_memory(DevicePtr ptr, std::size_t bytes) override {
    return inner_.restore_segment_memory(ptr, bytes);
  }

 protected:
  DeviceBackend& inner() const { return inner_; }

 private:
  DeviceBackend& inner_;
};

}  // namespace vramledger
