#include "allocator/cuda/vmm_properties.hpp"

#include <string>

#include "allocator/cuda/cuda_status.hpp"
#include "allocator/cuda/driver_api.hpp"

namespace vramledger {

Status query_vmm_properties(int device, VmmProperties* out) {
  const DriverApi* api = nullptr;
  if (Status status = load_driver_api(&api); !status.is_ok()) return status;
  const std::string args = "device=" + std::to_string(device);
  VmmProperties props;
  if (Status status = driver_status(api->device_get(&props.device, device), "cuDeviceGet", args);
      !status.is_ok()) {
    return status;
  }
  int supported = 0;
  if (Status status = driver_status(
          api->device_get_attribute(&supported,
                                    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                    props.device),
          "cuDeviceGetAttribute", args + ", attribute=VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED");
      !status.is_ok()) {
    return status;
  }
  props.supported = supported != 0;

  // Exportable as a POSIX file descriptor where the device offers it, as torch creates its
  // expandable segments: what lets CUDA IPC share the paged heap's blocks (docs/ipc.md).
  int posix_fd = 0;
  if (api->device_get_attribute(&posix_fd,
                                CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                props.device) != CUDA_SUCCESS) {
    posix_fd = 0;
  }
  props.allocation.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.allocation.requestedHandleTypes =
      posix_fd != 0 ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  props.allocation.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.allocation.location.id = props.device;
  props.access.location = props.allocation.location;
  props.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  if (props.supported) {
    if (Status status = driver_status(
            api->mem_get_allocation_granularity(&props.granularity, &props.allocation,
                                                CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
            "cuMemGetAllocationGranularity", args + ", option=RECOMMENDED");
        !status.is_ok()) {
      return status;
    }
    if (Status status = driver_status(
            api->mem_get_allocation_granularity(&props.minimum_granularity, &props.allocation,
                                                CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity", args + ", option=MINIMUM");
        !status.is_ok()) {
      return status;
    }
  }
  *out = props;
  return Status::ok();
}

}  // namespace vramledger
