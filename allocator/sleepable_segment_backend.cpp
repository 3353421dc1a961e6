#include "allocator/sleepable_segment_backend.hpp"

#include <cstdint>
#include <string>
#include <utility>

#include "allocator/text_format.hpp"

namespace vramledger {

SleepableSegmentBackend::SleepableSegmentBackend(DeviceBackend& inner)
    : ForwardingBackend(inner), info_(inner.info()) {
  if (!info_.supports_virtual_memory) {
    throw Error(ErrorCode::kNotSupported,
                "sleepable segments need virtual memory management, which backend '" +
                    info_.name + "' does not offer");
  }
  info_.name = "sleepable_segments(" + info_.name + ")";
  info_.supports_virtual_memory = false;  // segments only: the policy uses its segment heap
  info_.stream_ordered_segments = false;
}

SleepableSegmentBackend::~SleepableSegmentBackend() {
  std::lock_guard lock(mutex_);
  if (segments_.empty()) return;
  (void)inner().synchronize_device();
  for (auto& [ptr, segment] : segments_) {
    if (!segment.released && inner().unmap_pages(ptr, segment.mapped, 1).is_ok()) {
      (void)inner().release_physical(segment.handle);
    }
    (void)inner().free_address_range(ptr, segment.mapped);
  }
}

// Creates a chunk of `bytes` and maps it at `ptr`; on failure nothing is left behind.
Status SleepableSegmentBackend::map_new_chunk(DevicePtr ptr, std::size_t bytes,
                                              PhysicalHandle* handle) {
  Status status = inner().create_physical(bytes, handle);
  if (!status.is_ok()) return status;
  const PhysicalHandle handles[1] = {*handle};
  status = inner().map_pages(ptr, bytes, handles);
  if (!status.is_ok()) (void)inner().release_physical(*handle);
  return status;
}

Status SleepableSegmentBackend::allocate_segment(std::size_t bytes, StreamHandle /*stream*/,
                                                 DevicePtr* out) {
  if (bytes == 0) return {ErrorCode::kInvalidArgument, "a segment of 0 bytes"};
  const std::size_t granularity = info_.granularity;
  if (bytes > SIZE_MAX - granularity) {
    return {ErrorCode::kOutOfMemory, "no segment of " + format_bytes_exact(bytes)};
  }
  const std::size_t mapped = (bytes + granularity - 1) / granularity * granularity;
  DevicePtr base = 0;
  Status status = inner().reserve_address_range(mapped, &base);
  if (!status.is_ok()) return status;
  PhysicalHandle handle = 0;
  status = map_new_chunk(base, mapped, &handle);
  if (!status.is_ok()) {
    (void)inner().free_address_range(base, mapped);
    return status;
  }
  try {
    std::lock_guard lock(mutex_);
    segments_[base] = Segment{bytes, mapped, handle, false};
  } catch (...) {
    (void)inner().unmap_pages(base, mapped, 1);
    (void)inner().release_physical(handle);
    (void)inner().free_address_range(base, mapped);
    return {ErrorCode::kOutOfMemory, "out of host memory recording a segment"};
  }
  *out = base;
  return Status::ok();
}

Status SleepableSegmentBackend::find(DevicePtr ptr, std::size_t bytes, const char* what,
                                     Segment** out) {
  const auto it = segments_.find(ptr);
  if (it == segments_.end() || it->second.bytes != bytes) {
    return {ErrorCode::kInvalidPointer, std::string(what) + ": no sleepable segment of " +
                                            format_bytes_exact(bytes) + " at " + format_hex(ptr)};
  }
  *out = &it->second;
  return Status::ok();
}

Status SleepableSegmentBackend::free_segment(DevicePtr ptr, std::size_t bytes,
                                             StreamHandle /*stream*/) {
  std::lock_guard lock(mutex_);
  Segment* segment = nullptr;
  Status status = find(ptr, bytes, "free_segment", &segment);
  if (!status.is_ok()) return status;
  const std::size_t mapped = segment->mapped;
  if (!segment->released) {
    status = inner().synchronize_device();
    if (status.is_ok()) status = inner().unmap_pages(ptr, mapped, 1);
    if (!status.is_ok()) return status;
    // Unmapped: from here on the segment is gone whatever the driver says about the rest.
    status = inner().release_physical(segment->handle);
  }
  const Status freed = inner().free_address_range(ptr, mapped);
  segments_.erase(ptr);
  return status.is_ok() ? freed : status;
}

Status SleepableSegmentBackend::release_segment_memory(DevicePtr ptr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  Segment* segment = nullptr;
  Status status = find(ptr, bytes, "release_segment_memory", &segment);
  if (!status.is_ok()) return status;
  if (segment->released) {
    return {ErrorCode::kInvalidArgument,
            "the segment at " + format_hex(ptr) + " has no memory to release (asleep already)"};
  }
  status = inner().unmap_pages(ptr, segment->mapped, 1);
  if (!status.is_ok()) return status;
  status = inner().release_physical(segment->handle);
  if (!status.is_ok()) {
    // Nothing changed, as the contract asks: the chunk goes back under its address.
    const PhysicalHandle handles[1] = {segment->handle};
    const Status remapped = inner().map_pages(ptr, segment->mapped, handles);
    if (remapped.is_ok()) return status;
    segment->released = true;  // neither released nor mapped: the address holds nothing now
    segment->handle = 0;
    return {status.code(), status.message() + "; mapping the chunk back failed too (" +
                               remapped.message() + "): the segment has no memory now"};
  }
  segment->released = true;
  segment->handle = 0;
  return Status::ok();
}

Status SleepableSegmentBackend::restore_segment_memory(DevicePtr ptr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  Segment* segment = nullptr;
  Status status = find(ptr, bytes, "restore_segment_memory", &segment);
  if (!status.is_ok()) return status;
  if (!segment->released) {
    return {ErrorCode::kInvalidArgument,
            "the segment at " + format_hex(ptr) + " has its memory (awake already)"};
  }
  status = map_new_chunk(ptr, segment->mapped, &segment->handle);
  if (status.is_ok()) segment->released = false;
  return status;
}

std::size_t SleepableSegmentBackend::segment_count() const {
  std::lock_guard lock(mutex_);
  return segments_.size();
}

std::size_t SleepableSegmentBackend::released_count() const {
  std::lock_guard lock(mutex_);
  std::size_t count = 0;
  for (const auto& [ptr, segment] : segments_) count += segment.released ? 1 : 0;
  return count;
}

}  // namespace vramledger
