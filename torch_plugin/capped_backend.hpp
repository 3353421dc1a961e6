// torch's per-process memory fraction as vramledger applies it: one cap on everything the
// device's allocators reserve together — the default pool and every private pool (CUDA graphs,
// MemPools, including those whose memory comes from a MemPool's own allocator) — as torch's
// allocator counts all its segments against `allowed_memory_maximum`.
//
// DeviceReservation is the shared budget; CappedBackend wraps the backend each pool's policy
// allocates from and asks the budget before every segment or physical chunk, so the policy sees
// the cap as the device running out of memory: it releases its cache and retries, and then
// fails with torch's OutOfMemoryError. Reservations are taken before the driver call and given
// back if it fails, so concurrent pools never overshoot the cap together.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>

#include "allocator/device_backend.hpp"

namespace vramledger::torch_plugin {

class DeviceReservation {
 public:
  // 0: no cap.
  void set_cap(std::size_t cap_bytes) { cap_.store(cap_bytes); }
  std::size_t cap() const { return cap_.load(); }
  std::size_t reserved() const { return reserved_.load(); }
  // False (nothing taken) when `bytes` more would pass the cap.
  bool try_take(std::size_t bytes);
  void give_back(std::size_t bytes) { reserved_.fetch_sub(bytes); }

 private:
  std::atomic<std::size_t> cap_{0};
  std::atomic<std::size_t> reserved_{0};
};

class CappedBackend final : public DeviceBackend {
 public:
  // Both must outlive this backend.
  CappedBackend(DeviceBackend& inner, DeviceReservation& budget) : inner_(inner), budget_(budget) {}

  const BackendInfo& info() const override { return inner_.info(); }
  Status memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    return inner_.memory_info(free_bytes, total_bytes);
  }
  Status allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) override;
  Status free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) override;
  Status create_physical(std::size_t bytes, PhysicalHandle* out) override;
  Status release_physical(PhysicalHandle handle) override;

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

 private:
  Status refused(std::size_t bytes) const;

  DeviceBackend& inner_;
  DeviceReservation& budget_;
  std::mutex physical_mutex_;
  std::unordered_map<PhysicalHandle, std::size_t> physical_bytes_;  // release has no size
};

}  // namespace vramledger::torch_plugin
