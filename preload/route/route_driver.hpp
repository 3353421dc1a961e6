// The CUDA driver functions the routed cache calls, taken from the real libcuda (never through
// the shim's hooks, so its own segments are not counted as someone's allocation).
#pragma once

#include <string>

#include "preload/cuda_abi.h"
#include "preload/route/route_api.h"

namespace vramledger::route {

using CUcontext = struct CUctx_st*;
using CUdevice = int;
using CUevent = struct CUevent_st*;

// CUresult values the routed cache produces or recognises.
inline constexpr CUresult kCudaSuccess = 0;
inline constexpr CUresult kCudaErrorInvalidValue = 1;
inline constexpr CUresult kCudaErrorOutOfMemory = 2;
inline constexpr CUresult kCudaErrorNotReady = 600;
inline constexpr CUresult kCudaErrorUnknown = 999;

struct RouteDriver {
  CUresult (*mem_alloc)(CUdeviceptr*, size_t) = nullptr;             // cuMemAlloc_v2
  CUresult (*mem_free)(CUdeviceptr) = nullptr;                       // cuMemFree_v2
  CUresult (*mem_get_info)(size_t*, size_t*) = nullptr;              // cuMemGetInfo_v2
  CUresult (*device_total_mem)(size_t*, CUdevice) = nullptr;         // cuDeviceTotalMem_v2
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_get_device)(CUdevice*) = nullptr;
  CUresult (*ctx_push_current)(CUcontext) = nullptr;                 // cuCtxPushCurrent_v2
  CUresult (*ctx_pop_current)(CUcontext*) = nullptr;                 // cuCtxPopCurrent_v2
  CUresult (*ctx_synchronize)() = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;    // cuDevicePrimaryCtxRetain
  CUresult (*primary_ctx_get_state)(CUdevice, unsigned int*, int*) = nullptr;
  CUresult (*event_create)(CUevent*, unsigned int) = nullptr;
  CUresult (*event_destroy)(CUevent) = nullptr;                      // cuEventDestroy_v2
  CUresult (*event_record)(CUevent, CUstream) = nullptr;
  CUresult (*event_query)(CUevent) = nullptr;
  CUresult (*event_synchronize)(CUevent) = nullptr;
  CUresult (*stream_wait_event)(CUstream, CUevent, unsigned int) = nullptr;

  // Fills every entry from `resolve`; false (naming the first missing symbol) if one is absent.
  bool load(vramledger_route_resolve_fn resolve, std::string* missing);
};

}  // namespace vramledger::route
