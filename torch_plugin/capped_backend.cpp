#include "torch_plugin/capped_backend.hpp"

#include <string>

#include "allocator/text_format.hpp"

namespace vramledger::torch_plugin {

bool DeviceReservation::try_take(std::size_t bytes) {
  const std::size_t cap = cap_.load();
  std::size_t current = reserved_.load();
  do {
    if (cap != 0 && (bytes > cap || current > cap - bytes)) return false;
  } while (!reserved_.compare_exchange_weak(current, current + bytes));
  return true;
}

Status CappedBackend::refused(std::size_t bytes) const {
  return {ErrorCode::kOutOfMemory,
          "the memory fraction caps this device at " + format_bytes_exact(budget_.cap()) +
              " for all of this process's pools together; they reserve " +
              format_bytes_exact(budget_.reserved()) + " and " + format_bytes_exact(bytes) +
              " more would pass it"};
}

Status CappedBackend::allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) {
  if (!budget_.try_take(bytes)) return refused(bytes);
  Status status = inner().allocate_segment(bytes, stream, out);
  if (!status.is_ok()) budget_.give_back(bytes);
  return status;
}

Status CappedBackend::free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) {
  Status status = inner().free_segment(ptr, bytes, stream);
  if (status.is_ok()) budget_.give_back(bytes);
  return status;
}

Status CappedBackend::create_physical(std::size_t bytes, PhysicalHandle* out) {
  if (!budget_.try_take(bytes)) return refused(bytes);
  Status status = inner().create_physical(bytes, out);
  if (!status.is_ok()) {
    budget_.give_back(bytes);
    return status;
  }
  try {
    std::lock_guard<std::mutex> lock(physical_mutex_);
    physical_bytes_[*out] = bytes;
  } catch (...) {
    (void)inner().release_physical(*out);
    budget_.give_back(bytes);
    return {ErrorCode::kOutOfMemory, "out of host memory recording a physical chunk"};
  }
  return status;
}

Status CappedBackend::release_physical(PhysicalHandle handle) {
  Status status = inner().release_physical(handle);
  if (!status.is_ok()) return status;
  std::lock_guard<std::mutex> lock(physical_mutex_);
  if (auto it = physical_bytes_.find(handle); it != physical_bytes_.end()) {
    budget_.give_back(it->second);
    physical_bytes_.erase(it);
  }
  return status;
}

Status CappedBackend::release_segment_memory(DevicePtr ptr, std::size_t bytes) {
  Status status = inner().release_segment_memory(ptr, bytes);
  if (status.is_ok()) budget_.give_back(bytes);
  return status;
}

Status CappedBackend::restore_segment_memory(DevicePtr ptr, std::size_t bytes) {
  if (!budget_.try_take(bytes)) return refused(bytes);
  Status status = inner().restore_segment_memory(ptr, bytes);
  if (!status.is_ok()) budget_.give_back(bytes);
  return status;
}

}  // namespace vramledger::torch_plugin
