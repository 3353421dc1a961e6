// Wrappers of the CUDA driver's memory functions and of cuGetProcAddress.
#include "preload/cuda_abi.h"
#include "preload/hook_support.hpp"
#include "preload/interposed_functions.hpp"
#include "preload/wrapper_variants.hpp"
#include "preload/routing.hpp"

#define RETURN_ADDRESS __builtin_return_address(0)

namespace vramledger::preload {
namespace {

template <typename F>
F real_as(Fn fn, int variant) {
  return reinterpret_cast<F>(real_function(fn, variant));
}

std::uint64_t key_of(CUdeviceptr* dptr, CUresult result) {
  return result == 0 && dptr != nullptr ? static_cast<std::uint64_t>(*dptr) : 0;
}

CUresult mem_alloc(int v, CUdeviceptr* dptr, size_t bytes, const void* ra) {
  auto real = real_as<vl_cuMemAlloc_v2_t>(Fn::kMemAlloc, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  if (!nested && dptr != nullptr) {  // a runtime hook has already offered its call
    std::uint64_t routed_pointer = 0;
    const int routed = try_routed_allocation(bytes, &routed_pointer, ra);
    if (routed != kRouteDeclined) {
      if (routed == 0) *dptr = static_cast<CUdeviceptr>(routed_pointer);
      return routed;
    }
  }
  const CUresult result = real(dptr, bytes);
  after_allocation(result, KeyKind::kDevicePointer, key_of(dptr, result), bytes, ra, nested);
  return result;
}

CUresult mem_free(int v, CUdeviceptr dptr) {
  auto real = real_as<vl_cuMemFree_v2_t>(Fn::kMemFree, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  if (!nested) {
    const int routed = try_routed_free(dptr);
    if (routed != kRouteDeclined) return routed;
  }
  FreeInProgress free_call(KeyKind::kDevicePointer, dptr, nested);
  const CUresult result = real(dptr);
  free_call.finish(result);
  return result;
}

CUresult mem_alloc_pitch(int v, CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                         unsigned int element_size, const void* ra) {
  auto real = real_as<vl_cuMemAllocPitch_v2_t>(Fn::kMemAllocPitch, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  const CUresult result = real(dptr, pitch, width, height, element_size);
  const std::uint64_t bytes = result == 0 && pitch != nullptr ? *pitch * height : 0;
  after_allocation(result, KeyKind::kDevicePointer, key_of(dptr, result), bytes, ra, nested);
  return result;
}

CUresult mem_alloc_managed(int v, CUdeviceptr* dptr, size_t bytes, unsigned int flags,
                           const void* ra) {
  auto real = real_as<vl_cuMemAllocManaged_t>(Fn::kMemAllocManaged, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  const CUresult result = real(dptr, bytes, flags);
  after_allocation(result, KeyKind::kDevicePointer, key_of(dptr, result), bytes, ra, nested);
  return result;
}

CUresult mem_alloc_async(Fn fn, int v, CUdeviceptr* dptr, size_t bytes, CUstream stream,
                         const void* ra) {
  auto real = real_as<vl_cuMemAllocAsync_t>(fn, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  const CUresult result = real(dptr, bytes, stream);
  after_allocation(result, KeyKind::kDevicePointer, key_of(dptr, result), bytes, ra, nested);
  return result;
}

CUresult mem_alloc_from_pool_async(Fn fn, int v, CUdeviceptr* dptr, size_t bytes,
                                   CUmemoryPool pool, CUstream stream, const void* ra) {
  auto real = real_as<vl_cuMemAllocFromPoolAsync_t>(fn, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  const CUresult result = real(dptr, bytes, pool, stream);
  after_allocation(result, KeyKind::kDevicePointer, key_of(dptr, result), bytes, ra, nested);
  return result;
}

// Counted free when enqueued: the memory returns to the pool in stream order, which the shim
// cannot observe without a callback.
CUresult mem_free_async(Fn fn, int v, CUdeviceptr dptr, CUstream stream) {
  auto real = real_as<vl_cuMemFreeAsync_t>(fn, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  FreeInProgress free_call(KeyKind::kDevicePointer, dptr, nested);
  const CUresult result = real(dptr, stream);
  free_call.finish(result);
  return result;
}

CUresult mem_create(int v, CUmemGenericAllocationHandle* handle, size_t size,
                    const CUmemAllocationProp* prop, unsigned long long flags, const void* ra) {
  auto real = real_as<vl_cuMemCreate_t>(Fn::kMemCreate, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  const CUresult result = real(handle, size, prop, flags);
  const std::uint64_t key = result == 0 && handle != nullptr ? *handle : 0;
  // Host-located physical memory (NCCL allocates its host buffers this way by default) holds no
  // device bytes: recorded with 0 bytes so its cuMemRelease is still a tracked free.
  const bool on_device =
      prop == nullptr || reinterpret_cast<const vl_CUmemAllocationPropHead*>(prop)->location_type ==
                             VRAMLEDGER_CU_MEM_LOCATION_TYPE_DEVICE;
  after_allocation(result, KeyKind::kPhysicalHandle, key, on_device ? size : 0, ra, nested);
  return result;
}

CUresult mem_release(int v, CUmemGenericAllocationHandle handle) {
  auto real = real_as<vl_cuMemRelease_t>(Fn::kMemRelease, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  FreeInProgress free_call(KeyKind::kPhysicalHandle, handle, nested);
  const CUresult result = real(handle);
  free_call.finish(result);
  return result;
}

// A reset frees everything allocated in the device's primary context, the routed cache's
// segments included: the cache forgets them (without freeing) once the reset succeeded.
CUresult primary_ctx_reset(int v, int device) {
  auto real = real_as<vl_cuDevicePrimaryCtxReset_v2_t>(Fn::kDevicePrimaryCtxReset, v);
  if (real == nullptr) return kNotInitialized;
  const CUresult result = real(device);
  if (result == 0) route_forget_device(device);
  return result;
}

// Lookups: the real answer, with memory functions (and cuGetProcAddress itself) swapped for
// wrappers bound to the pointer the driver returned.
CUresult get_proc_address(int v, const char* symbol, void** pfn, int version, std::uint64_t flags) {
  auto real = real_as<vl_cuGetProcAddress_t>(Fn::kGetProcAddress, v);
  if (real == nullptr) return kNotInitialized;
  const CUresult result = real(symbol, pfn, version, flags);
  if (result == 0 && pfn != nullptr && *pfn != nullptr) {
    *pfn = wrap_entry(fn_by_driver_symbol(symbol, version, flags), *pfn);
  }
  return result;
}

CUresult get_proc_address_v2(int v, const char* symbol, void** pfn, int version,
                             std::uint64_t flags, CUdriverProcAddressQueryResult* status) {
  auto real = real_as<vl_cuGetProcAddress_v2_t>(Fn::kGetProcAddressV2, v);
  if (real == nullptr) return kNotInitialized;
  const CUresult result = real(symbol, pfn, version, flags, status);
  if (result == 0 && pfn != nullptr && *pfn != nullptr) {
    *pfn = wrap_entry(fn_by_driver_symbol(symbol, version, flags), *pfn);
  }
  return result;
}

// Variants 1..3, bound to pointers handed out by lookups (interposed_functions.hpp).
template <int V>
CUresult mem_alloc_w(CUdeviceptr* d, size_t n) { return mem_alloc(V, d, n, RETURN_ADDRESS); }
template <int V>
CUresult mem_free_w(CUdeviceptr d) { return mem_free(V, d); }
template <int V>
CUresult mem_alloc_pitch_w(CUdeviceptr* d, size_t* p, size_t w, size_t h, unsigned int e) {
  return mem_alloc_pitch(V, d, p, w, h, e, RETURN_ADDRESS);
}
template <int V>
CUresult mem_alloc_managed_w(CUdeviceptr* d, size_t n, unsigned int f) {
  return mem_alloc_managed(V, d, n, f, RETURN_ADDRESS);
}
template <Fn F, int V>
CUresult mem_alloc_async_w(CUdeviceptr* d, size_t n, CUstream s) {
  return mem_alloc_async(F, V, d, n, s, RETURN_ADDRESS);
}
template <Fn F, int V>
CUresult mem_alloc_from_pool_async_w(CUdeviceptr* d, size_t n, CUmemoryPool p, CUstream s) {
  return mem_alloc_from_pool_async(F, V, d, n, p, s, RETURN_ADDRESS);
}
template <Fn F, int V>
CUresult mem_free_async_w(CUdeviceptr d, CUstream s) { return mem_free_async(F, V, d, s); }
template <int V>
CUresult mem_create_w(CUmemGenericAllocationHandle* h, size_t n, const CUmemAllocationProp* p,
                      unsigned long long f) {
  return mem_create(V, h, n, p, f, RETURN_ADDRESS);
}
template <int V>
CUresult mem_release_w(CUmemGenericAllocationHandle h) { return mem_release(V, h); }
template <int V>
CUresult primary_ctx_reset_w(int d) { return primary_ctx_reset(V, d); }
template <int V>
CUresult get_proc_address_w(const char* s, void** p, int v, std::uint64_t f) {
  return get_proc_address(V, s, p, v, f);
}
template <int V>
CUresult get_proc_address_v2_w(const char* s, void** p, int v, std::uint64_t f,
                               CUdriverProcAddressQueryResult* st) {
  return get_proc_address_v2(V, s, p, v, f, st);
}

}  // namespace
}  // namespace vramledger::preload

using namespace vramledger::preload;

// Variant 0: the exported symbols a direct call (or RTLD_DEFAULT lookup) binds to.
VRAMLEDGER_PRELOAD_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* d, size_t n) {
  return mem_alloc(0, d, n, RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT CUresult cuMemFree_v2(CUdeviceptr d) { return mem_free(0, d); }
VRAMLEDGER_PRELOAD_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* d, size_t* p, size_t w,
                                                      size_t h, unsigned int e) {
  return mem_alloc_pitch(0, d, p, w, h, e, RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* d, size_t n, unsigned int f) {
  return mem_alloc_managed(0, d, n, f, RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* d, size_t n, CUstream s) {
  return mem_alloc_async(Fn::kMemAllocAsync, 0, d, n, s, RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* d, size_t n, CUstream s) {
  return mem_alloc_async(Fn::kMemAllocAsyncPtsz, 0, d, n, s, RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* d, size_t n,
                                                           CUmemoryPool p, CUstream s) {
  return mem_alloc_from_pool_async(Fn::kMemAllocFromPoolAsync, 0, d, n, p, s, RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* d, size_t n,
                                                                CUmemoryPool p, CUstream s) {
  return mem_alloc_from_pool_async(Fn::kMemAllocFromPoolAsyncPtsz, 0, d, n, p, s,
                                   RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s) {
  return mem_free_async(Fn::kMemFreeAsync, 0, d, s);
}
VRAMLEDGER_PRELOAD_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s) {
  return mem_free_async(Fn::kMemFreeAsyncPtsz, 0, d, s);
}
VRAMLEDGER_PRELOAD_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t n,
                                               const CUmemAllocationProp* p,
                                               unsigned long long f) {
  return mem_create(0, h, n, p, f, RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  return mem_release(0, h);
}
VRAMLEDGER_PRELOAD_EXPORT CUresult cuDevicePrimaryCtxReset_v2(int d) {
  return primary_ctx_reset(0, d);
}
VRAMLEDGER_PRELOAD_EXPORT CUresult cuGetProcAddress(const char* s, void** p, int v,
                                                    std::uint64_t f) {
  return get_proc_address(0, s, p, v, f);
}
VRAMLEDGER_PRELOAD_EXPORT CUresult cuGetProcAddress_v2(const char* s, void** p, int v,
                                                       std::uint64_t f,
                                                       CUdriverProcAddressQueryResult* st) {
  return get_proc_address_v2(0, s, p, v, f, st);
}

namespace vramledger::preload {

void* driver_wrapper(Fn fn, int variant) {
  static void* const kWrappers[kFirstRuntimeFn][kVariants] = {
      VL_DRIVER_FUNCTIONS(VL_WRAPPER_ROW, VL_WRAPPER_ROW_SHARED)
  };
  return kWrappers[static_cast<int>(fn)][variant];
}

}  // namespace vramledger::preload
