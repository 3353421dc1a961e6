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
#include <unordered_map>

#include "allocator/device_backend.hpp"
#include "allocator/forwarding_backend.hpp"

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

class CappedBackend final : public ForwardingBackend {
 public:
  // Both must outlive this backend.
  CappedBackend(DeviceBackend& inner, DeviceReservation& budget)
      : ForwardingBackend(inner), budget_(budget) {}

  Status allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) override;
  Status free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) override;
  Status create_physical(std::size_t bytes, PhysicalHandle* out) override;
  Status release_physical(PhysicalHandle handle) override;
  // A sleeping graph pool's segment leaves the budget and must fit it again to wake.
  Status release_segment_memory(DevicePtr ptr, std::size_t bytes) override;
  Status restore_segment_memory(DevicePtr ptr, std::size_t bytes) override;

 private:
  Status refused(std::size_t bytes) const;

  DeviceReservation& budget_;
  std::mutex physical_mutex_;
  std::unordered_map<PhysicalHandle, std::size_t> physical_bytes_;  // release has no size
};

}  // namespace vramledger::torch_plugin
