// A cuMemAlloc-segment DeviceBackend for one device, over the real driver functions: the routed
// cache's memory. Plain cuMemAlloc memory (not VMM) so pointers handed to other libraries behave
// like the driver's own for copies, pointer attributes and peer access.
#pragma once

#include <atomic>
#include <map>

#include "allocator/device_backend.hpp"
#include "preload/route/route_driver.hpp"

namespace vramledger::route {

class DriverSegmentBackend final : public DeviceBackend {
 public:
  // context: the device's primary context (retained by the caller for the process's lifetime).
  DriverSegmentBackend(const RouteDriver& driver, CUdevice device, CUcontext context);

  const BackendInfo& info() const override { return info_; }
  Status memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override;
  Status allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) override;
  Status free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) override;
  Status create_event(EventHandle* out) override;
  Status destroy_event(EventHandle event) override;
  Status record_event(EventHandle event, StreamHandle stream) override;
  Status query_event(EventHandle event, EventState* state) override;
  Status synchronize_event(EventHandle event) override;
  Status stream_wait_event(StreamHandle stream, EventHandle event) override;
  Status synchronize_device() override;

  // True when `pointer` lies in a segment this backend holds. Callers serialise with the
  // allocator (the routed cache's mutex).
  bool contains(DevicePtr pointer) const;

  // The context was reset: its memory is gone, so from now on frees, event destruction and
  // device synchronisation are not passed to the driver (the allocator can then be destroyed
  // without touching freed memory or the reset context).
  void abandon() { abandoned_.store(true, std::memory_order_relaxed); }
  // The driver's code behind the last failed call (for the caller's CUresult).
  CUresult last_error() const { return last_error_.load(std::memory_order_relaxed); }

 private:
  // Runs `call` with the device's primary context current and turns its result into a Status.
  template <typename Call>
  Status in_context(const char* what, Call call);

  const RouteDriver& driver_;
  CUcontext context_;
  BackendInfo info_;
  std::map<DevicePtr, std::size_t> segments_;  // base -> size
  std::atomic<bool> abandoned_{false};
  std::atomic<CUresult> last_error_{kCudaSuccess};
};

}  // namespace vramledger::route
