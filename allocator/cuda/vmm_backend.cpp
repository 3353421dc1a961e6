#include "allocator/cuda/vmm_backend.hpp"

#include <string>
#include <utility>
#include <vector>

#include "allocator/cuda/cuda_status.hpp"
#include "allocator/cuda/driver_api.hpp"

namespace vramledger {

namespace {

// Loaded by the constructor (which throws if it cannot), so always valid afterwards.
const DriverApi& driver() {
  const DriverApi* api = nullptr;
  (void)load_driver_api(&api);
  return *api;
}

std::string page_args(DevicePtr va, std::size_t page_bytes, std::size_t count) {
  return "va=" + describe_address(va) + ", page=" + describe_bytes(page_bytes) +
         ", pages=" + std::to_string(count);
}

}  // namespace

VmmBackend::VmmBackend(int device, UnmapMode unmap_mode) : CudaRuntimeBackend(device, "vmm") {
  const std::string context = "vramledger: vmm backend on CUDA device " + std::to_string(device);
  throw_if_error(query_vmm_properties(device, &props_), context);
  if (!props_.supported) {
    throw Error(ErrorCode::kNotSupported,
                context + ": the driver reports CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_"
                          "SUPPORTED = 0");
  }
  access_.push_back(props_.access);
  mutable_info().granularity = props_.granularity;
  mutable_info().supports_virtual_memory = true;
  mutable_info().allows_second_mapping = true;
  mutable_info().stream_ordered_segments = false;
  switch (unmap_mode) {
    case UnmapMode::kPerPage: batched_unmap_ = false; break;
    case UnmapMode::kBatched: batched_unmap_ = true; break;
    case UnmapMode::kAuto: {
      bool legal = false;
      // A failed probe (e.g. no memory left) just keeps the always-legal per-page path.
      batched_unmap_ = probe_batched_unmap(&legal).is_ok() && legal;
      break;
    }
  }
}

Status VmmBackend::allocate_segment(std::size_t bytes, StreamHandle, DevicePtr* out) {
  return malloc_segment(bytes, out);
}

Status VmmBackend::free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle) {
  return free_malloc_segment(ptr, bytes);
}

Status VmmBackend::create_physical(std::size_t bytes, PhysicalHandle* out) {
  if (bytes == 0 || bytes % props_.granularity != 0) {
    return {ErrorCode::kInvalidArgument,
            "cuMemCreate: size " + describe_bytes(bytes) + " is not a positive multiple of the " +
                "granularity " + describe_bytes(props_.granularity)};
  }
  CUmemGenericAllocationHandle handle = 0;
  CUmemAllocationProp prop = props_.allocation;
  if (!exportable_.load(std::memory_order_relaxed)) {
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  }
  CUresult result = driver().mem_create(&handle, bytes, &prop, 0);
  if (result != CUDA_SUCCESS && result != CUDA_ERROR_OUT_OF_MEMORY &&
      prop.requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE) {
    // A setup that refuses exportable memory (a container's driver, a policy): plain memory from
    // now on; CUDA IPC of paged blocks then fails with the driver's reason (docs/ipc.md).
    exportable_.store(false, std::memory_order_relaxed);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    result = driver().mem_create(&handle, bytes, &prop, 0);
  }
  Status status = check_driver(result, "cuMemCreate", [&] {
    return "bytes=" + describe_bytes(bytes) + ", device=" + std::to_string(device());
  });
  if (status.is_ok()) *out = handle;
  return status;
}

Status VmmBackend::release_physical(PhysicalHandle handle) {
  return check_driver(driver().mem_release(handle), "cuMemRelease",
                      [&] { return "handle=" + describe_address(handle); });
}

Status VmmBackend::reserve_address_range(std::size_t bytes, DevicePtr* out) {
  if (bytes == 0 || bytes % props_.granularity != 0) {
    return {ErrorCode::kInvalidArgument,
            "cuMemAddressReserve: size " + describe_bytes(bytes) +
                " is not a positive multiple of the granularity " +
                describe_bytes(props_.granularity)};
  }
  CUdeviceptr base = 0;
  Status status = check_driver(
      driver().mem_address_reserve(&base, bytes, props_.granularity, 0, 0), "cuMemAddressReserve",
      [&] {
        return "bytes=" + describe_bytes(bytes) + ", alignment=" + describe_bytes(props_.granularity);
      });
  if (status.is_ok()) *out = static_cast<DevicePtr>(base);
  return status;
}

Status VmmBackend::free_address_range(DevicePtr base, std::size_t bytes) {
  return check_driver(driver().mem_address_free(static_cast<CUdeviceptr>(base), bytes),
                      "cuMemAddressFree",
                      [&] { return "va=" + describe_address(base) + ", bytes=" + describe_bytes(bytes); });
}

Status VmmBackend::set_access_locked(DevicePtr va, std::size_t bytes) const {
  return check_driver(
      driver().mem_set_access(static_cast<CUdeviceptr>(va), bytes, access_.data(), access_.size()),
      "cuMemSetAccess", [&] {
        return "va=" + describe_address(va) + ", bytes=" + describe_bytes(bytes) +
               ", flags=PROT_READWRITE, devices=" + std::to_string(access_.size()) +
               " (this one first)";
      });
}

Status VmmBackend::map_pages(DevicePtr va, std::size_t page_bytes,
                             std::span<const PhysicalHandle> handles) {
  if (handles.empty()) return Status::ok();
  const DriverApi& api = driver();
  const std::lock_guard lock(access_mutex_);
  for (std::size_t i = 0; i < handles.size(); ++i) {
    const CUdeviceptr at = static_cast<CUdeviceptr>(va + i * page_bytes);
    Status status = check_driver(api.mem_map(at, page_bytes, 0, handles[i], 0), "cuMemMap", [&] {
      return "va=" + describe_address(at) + ", bytes=" + describe_bytes(page_bytes) +
             ", handle=" + describe_address(handles[i]) + ", page " + std::to_string(i) + " of " +
             std::to_string(handles.size());
    });
    if (!status.is_ok()) {
      (void)unmap_each(va, page_bytes, i);  // leave nothing of this call behind
      return status;
    }
  }
  const std::size_t run_bytes = handles.size() * page_bytes;
  Status status = set_access_locked(va, run_bytes);
  if (!status.is_ok()) {
    (void)unmap_each(va, page_bytes, handles.size());
    return status;
  }
  for (std::size_t i = 0; i < handles.size(); ++i) mappings_[va + i * page_bytes] = page_bytes;
  return status;
}

Status VmmBackend::grant_peer_access(int peer_device) {
  const std::lock_guard lock(access_mutex_);
  for (const CUmemAccessDesc& desc : access_) {
    if (desc.location.id == peer_device) return Status::ok();
  }
  CUmemAccessDesc peer = props_.access;
  peer.location.id = peer_device;
  access_.push_back(peer);
  // Contiguous mappings share one call.
  auto it = mappings_.begin();
  while (it != mappings_.end()) {
    const DevicePtr start = it->first;
    DevicePtr end = it->first + it->second;
    for (++it; it != mappings_.end() && it->first == end; ++it) end += it->second;
    Status status = set_access_locked(start, end - start);
    if (!status.is_ok()) {
      access_.pop_back();
      return status;
    }
  }
  return Status::ok();
}

Status VmmBackend::unmap_pages(DevicePtr va, std::size_t page_bytes, std::size_t count) {
  if (count == 0) return Status::ok();
  // The driver call runs outside access_mutex_, so that the policy's helper thread unmapping an
  // old address (unmap_in_background) does not hold up a map on the allocating thread. The
  // mappings leave the list first: a peer granted access meanwhile skips them (access to an
  // address being unmapped is of no use); they come back if the driver refuses.
  std::vector<std::pair<DevicePtr, std::size_t>> leaving;
  {
    const std::lock_guard lock(access_mutex_);
    const auto first = mappings_.lower_bound(va);
    const auto last = mappings_.lower_bound(va + count * page_bytes);
    leaving.assign(first, last);
    mappings_.erase(first, last);
  }
  Status status;
  if (!batched_unmap_ || count == 1) {
    status = unmap_each(va, page_bytes, count);
  } else {
    status = check_driver(
        driver().mem_unmap(static_cast<CUdeviceptr>(va), count * page_bytes), "cuMemUnmap",
        [&] { return page_args(va, page_bytes, count) + " (one call for the run)"; });
  }
  if (!status.is_ok()) {
    const std::lock_guard lock(access_mutex_);
    mappings_.insert(leaving.begin(), leaving.end());
  }
  return status;
}

Status VmmBackend::unmap_each(DevicePtr va, std::size_t page_bytes, std::size_t count) {
  Status first_failure;
  for (std::size_t i = 0; i < count; ++i) {
    const CUdeviceptr at = static_cast<CUdeviceptr>(va + i * page_bytes);
    Status status = check_driver(driver().mem_unmap(at, page_bytes), "cuMemUnmap", [&] {
      return "va=" + describe_address(at) + ", bytes=" + describe_bytes(page_bytes) + ", page " +
             std::to_string(i) + " of " + std::to_string(count);
    });
    // Keep going: unmapping the other pages is still right, and the first error is the story.
    if (!status.is_ok() && first_failure.is_ok()) first_failure = std::move(status);
  }
  return first_failure;
}

Status VmmBackend::probe_batched_unmap(bool* legal) {
  *legal = false;
  const std::size_t page = props_.granularity;
  const DriverApi& api = driver();
  PhysicalHandle handles[2] = {0, 0};
  DevicePtr va = 0;
  Status status = reserve_address_range(2 * page, &va);
  if (!status.is_ok()) return status;
  int created = 0;
  for (; created < 2 && status.is_ok(); ++created) {
    status = create_physical(page, &handles[created]);
    if (!status.is_ok()) break;
  }
  if (status.is_ok()) status = map_pages(va, page, handles);
  if (status.is_ok()) {
    const bool accepted = api.mem_unmap(static_cast<CUdeviceptr>(va), 2 * page) == CUDA_SUCCESS;
    if (accepted) {
      // Mapping over a page that is still mapped fails, so both maps succeeding proves the one
      // call unmapped both pages.
      bool remapped[2] = {false, false};
      for (int i = 0; i < 2; ++i) {
        remapped[i] = api.mem_map(static_cast<CUdeviceptr>(va + i * page), page, 0, handles[i],
                                  0) == CUDA_SUCCESS;
      }
      *legal = remapped[0] && remapped[1];
    }
    // Whatever happened, leave both pages unmapped (an error for an unmapped page is harmless).
    (void)unmap_each(va, page, 2);
    const std::lock_guard lock(access_mutex_);
    mappings_.erase(mappings_.lower_bound(va), mappings_.lower_bound(va + 2 * page));
  }
  for (int i = 0; i < created; ++i) (void)release_physical(handles[i]);
  (void)free_address_range(va, 2 * page);
  return status;
}

}  // namespace vramledger
