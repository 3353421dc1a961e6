#include "allocator/device_backend.hpp"

#include <cstdlib>

namespace vramledger {

namespace {
Status not_supported(const DeviceBackend& backend, const char* what) {
  return {ErrorCode::kNotSupported,
          std::string(what) + " needs virtual memory management, which backend '" +
              backend.info().name + "' does not offer"};
}
}  // namespace

Status DeviceBackend::create_physical(std::size_t, PhysicalHandle*) {
  return not_supported(*this, "create_physical");
}
Status DeviceBackend::release_physical(PhysicalHandle) {
  return not_supported(*this, "release_physical");
}
Status DeviceBackend::reserve_address_range(std::size_t, DevicePtr*) {
  return not_supported(*this, "reserve_address_range");
}
Status DeviceBackend::free_address_range(DevicePtr, std::size_t) {
  return not_supported(*this, "free_address_range");
}
Status DeviceBackend::map_pages(DevicePtr, std::size_t, std::span<const PhysicalHandle>) {
  return not_supported(*this, "map_pages");
}
Status DeviceBackend::unmap_pages(DevicePtr, std::size_t, std::size_t) {
  return not_supported(*this, "unmap_pages");
}

Status DeviceBackend::grant_peer_access(int /*peer_device*/) { return Status::ok(); }

Status DeviceBackend::allocate_host(std::size_t bytes, void** out) {
  *out = std::malloc(bytes == 0 ? 1 : bytes);
  if (*out == nullptr) {
    return {ErrorCode::kOutOfMemory, "no host memory for " + std::to_string(bytes) + " bytes"};
  }
  return Status::ok();
}
Status DeviceBackend::free_host(void* host) {
  std::free(host);
  return Status::ok();
}
Status DeviceBackend::copy_to_host(void*, DevicePtr, std::size_t) {
  return {ErrorCode::kNotSupported,
          "backend '" + info().name + "' cannot copy device memory to the host"};
}
Status DeviceBackend::copy_to_device(DevicePtr, const void*, std::size_t) {
  return {ErrorCode::kNotSupported,
          "backend '" + info().name + "' cannot copy host memory to the device"};
}

Status DeviceBackend::release_segment_memory(DevicePtr, std::size_t) {
  return {ErrorCode::kNotSupported,
          "backend '" + info().name + "' cannot release a segment's memory and keep its address "
          "(only sleepable segments can: a VMM reservation with one physical chunk each)"};
}
Status DeviceBackend::restore_segment_memory(DevicePtr, std::size_t) {
  return {ErrorCode::kNotSupported,
          "backend '" + info().name + "' has no sleeping segment to give memory back to"};
}

}  // namespace vramledger
