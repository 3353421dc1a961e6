// What the driver says about virtual memory management on one device: whether it is offered,
// the allocation properties vramledger uses (pinned device memory, exportable as a POSIX file
// descriptor where the device offers it: docs/ipc.md) and the page granularity for them.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "allocator/errors.hpp"

namespace vramledger {

struct VmmProperties {
  CUdevice device = 0;
  bool supported = false;              // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  CUmemAllocationProp allocation{};    // what cuMemCreate is given
  CUmemAccessDesc access{};            // read/write from this device
  std::size_t granularity = 0;         // recommended granularity (what we create and map in)
  std::size_t minimum_granularity = 0;
};

// Fills *out for CUDA device ordinal `device`. Granularities are only queried when supported.
Status query_vmm_properties(int device, VmmProperties* out);

}  // namespace vramledger
