#include "preload/route/driver_segment_backend.hpp"

#include <iterator>
#include <string>

namespace vramledger::route {
namespace {

CUstream as_stream(StreamHandle stream) { return reinterpret_cast<CUstream>(stream); }
CUevent as_event(EventHandle event) { return reinterpret_cast<CUevent>(event); }

}  // namespace

DriverSegmentBackend::DriverSegmentBackend(const RouteDriver& driver, CUdevice device,
                                           CUcontext context)
    : driver_(driver), context_(context) {
  info_.name = "cuda_malloc (routed)";
  info_.device = device;
  info_.granularity = 2u << 20;  // the driver rounds cuMemAlloc segments to 2 MiB pages
  info_.supports_virtual_memory = false;
  info_.stream_ordered_segments = false;
  std::size_t total = 0;
  if (driver_.device_total_mem(&total, device) == kCudaSuccess) info_.total_bytes = total;
}

template <typename Call>
Status DriverSegmentBackend::in_context(const char* what, Call call) {
  CUresult result = driver_.ctx_push_current(context_);
  if (result == kCudaSuccess) {
    result = call();
    CUcontext popped = nullptr;
    (void)driver_.ctx_pop_current(&popped);
  }
  if (result == kCudaSuccess) return Status::ok();
  last_error_.store(result, std::memory_order_relaxed);
  // Appended piece by piece: GCC 12's -Warray-bounds misreads the chain of operator+ on
  // temporaries once inlined under ThreadSanitizer at -O1 (a false positive that --werror
  // turns into a failed build).
  std::string message = what;
  message += " failed with CUresult ";
  message += std::to_string(result);
  message += " on device ";
  message += std::to_string(info_.device);
  return {result == kCudaErrorOutOfMemory ? ErrorCode::kOutOfMemory : ErrorCode::kDriverError,
          message};
}

Status DriverSegmentBackend::memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  return in_context("cuMemGetInfo", [&] { return driver_.mem_get_info(free_bytes, total_bytes); });
}

Status DriverSegmentBackend::allocate_segment(std::size_t bytes, StreamHandle, DevicePtr* out) {
  CUdeviceptr pointer = 0;
  Status status = in_context("cuMemAlloc", [&] { return driver_.mem_alloc(&pointer, bytes); });
  if (status) {
    *out = static_cast<DevicePtr>(pointer);
    segments_[*out] = bytes;
  }
  return status;
}

Status DriverSegmentBackend::free_segment(DevicePtr ptr, std::size_t, StreamHandle) {
  if (abandoned_.load(std::memory_order_relaxed)) return Status::ok();
  Status status =
      in_context("cuMemFree", [&] { return driver_.mem_free(static_cast<CUdeviceptr>(ptr)); });
  if (status) segments_.erase(ptr);
  return status;
}

bool DriverSegmentBackend::contains(DevicePtr pointer) const {
  auto after = segments_.upper_bound(pointer);
  if (after == segments_.begin()) return false;
  const auto& [base, size] = *std::prev(after);
  return pointer < base + size;
}

Status DriverSegmentBackend::create_event(EventHandle* out) {
  CUevent event = nullptr;
  constexpr unsigned int kDisableTiming = 2;  // CU_EVENT_DISABLE_TIMING
  Status status = in_context("cuEventCreate", [&] { return driver_.event_create(&event, kDisableTiming); });
  if (status) *out = reinterpret_cast<EventHandle>(event);
  return status;
}

Status DriverSegmentBackend::destroy_event(EventHandle event) {
  if (abandoned_.load(std::memory_order_relaxed)) return Status::ok();
  return in_context("cuEventDestroy", [&] { return driver_.event_destroy(as_event(event)); });
}

Status DriverSegmentBackend::record_event(EventHandle event, StreamHandle stream) {
  return in_context("cuEventRecord",
                    [&] { return driver_.event_record(as_event(event), as_stream(stream)); });
}

Status DriverSegmentBackend::query_event(EventHandle event, EventState* state) {
  CUresult raw = kCudaSuccess;
  Status status = in_context("cuEventQuery", [&] {
    raw = driver_.event_query(as_event(event));
    return raw == kCudaErrorNotReady ? kCudaSuccess : raw;
  });
  if (status) *state = raw == kCudaErrorNotReady ? EventState::kPending : EventState::kComplete;
  return status;
}

Status DriverSegmentBackend::synchronize_event(EventHandle event) {
  return in_context("cuEventSynchronize", [&] { return driver_.event_synchronize(as_event(event)); });
}

Status DriverSegmentBackend::stream_wait_event(StreamHandle stream, EventHandle event) {
  return in_context("cuStreamWaitEvent", [&] {
    return driver_.stream_wait_event(as_stream(stream), as_event(event), 0);
  });
}

Status DriverSegmentBackend::synchronize_device() {
  // The allocator's destructor synchronises before giving memory back; after abandon() the
  // context was reset, so there is nothing to wait for and no call to make on it.
  if (abandoned_.load(std::memory_order_relaxed)) return Status::ok();
  return in_context("cuCtxSynchronize", [&] { return driver_.ctx_synchronize(); });
}

}  // namespace vramledger::route
