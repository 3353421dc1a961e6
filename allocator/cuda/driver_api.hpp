// The few CUDA driver API (cuda.h) functions vramledger calls, resolved at run time.
//
// Why not link libcuda directly: the real libcuda.so.1 only exists where an NVIDIA driver is
// installed. A binary linked against it cannot even start on a machine without one, whereas the
// GPU tests must start and skip there. The runtime (cudart, linked statically) already dlopens
// the driver, and cudaGetDriverEntryPointByVersion hands us its entry points with the ABI we
// compiled against.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include "allocator/errors.hpp"

namespace vramledger {

struct DriverApi {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity = nullptr;
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
};

// Resolves every entry point once per process (thread-safe). On failure *out is null and the
// Status names the missing symbol or the runtime error; later calls return the same result.
Status load_driver_api(const DriverApi** out);

}  // namespace vramledger
