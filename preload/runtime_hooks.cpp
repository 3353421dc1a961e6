// Wrappers of the CUDA runtime's memory functions and driver entry-point lookups, for programs
// that link libcudart dynamically (a static cudart is reached through the driver hooks instead).
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

std::uint64_t key_of(void** ptr, cudaError_t result) {
  return result == 0 && ptr != nullptr ? reinterpret_cast<std::uint64_t>(*ptr) : 0;
}

// Each allocating hook runs the real call inside a RuntimeCallScope so the driver calls libcudart
// makes on our behalf are not counted a second time.
cudaError_t cuda_malloc(int v, void** ptr, size_t size, const void* ra) {
  auto real = real_as<vl_cudaMalloc_t>(Fn::kCudaMalloc, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  if (!nested && ptr != nullptr) {
    // Routed only when a primary context is already current (the runtime set one up); the
    // first cudaMalloc of a program goes to libcudart, which creates it. The common error codes
    // of the driver and the runtime are the same numbers (2 out of memory, 1 invalid value).
    std::uint64_t routed_pointer = 0;
    const int routed = try_routed_allocation(size, &routed_pointer, ra);
    if (routed != kRouteDeclined) {
      if (routed == 0) *ptr = reinterpret_cast<void*>(routed_pointer);
      return routed;
    }
  }
  cudaError_t result;
  {
    RuntimeCallScope scope;
    result = real(ptr, size);
  }
  after_allocation(result, KeyKind::kDevicePointer, key_of(ptr, result), size, ra, nested);
  return result;
}

cudaError_t cuda_free(int v, void* ptr) {
  auto real = real_as<vl_cudaFree_t>(Fn::kCudaFree, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  if (!nested && ptr != nullptr) {
    const int routed = try_routed_free(reinterpret_cast<std::uint64_t>(ptr));
    if (routed != kRouteDeclined) return routed;
  }
  FreeInProgress free_call(KeyKind::kDevicePointer, reinterpret_cast<std::uint64_t>(ptr), nested);
  cudaError_t result;
  {
    RuntimeCallScope scope;
    result = real(ptr);
  }
  free_call.finish(result);
  return result;
}

cudaError_t cuda_malloc_pitch(int v, void** ptr, size_t* pitch, size_t width, size_t height,
                              const void* ra) {
  auto real = real_as<vl_cudaMallocPitch_t>(Fn::kCudaMallocPitch, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  cudaError_t result;
  {
    RuntimeCallScope scope;
    result = real(ptr, pitch, width, height);
  }
  const std::uint64_t bytes = result == 0 && pitch != nullptr ? *pitch * height : 0;
  after_allocation(result, KeyKind::kDevicePointer, key_of(ptr, result), bytes, ra, nested);
  return result;
}

cudaError_t cuda_malloc_managed(int v, void** ptr, size_t size, unsigned int flags,
                                const void* ra) {
  auto real = real_as<vl_cudaMallocManaged_t>(Fn::kCudaMallocManaged, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  cudaError_t result;
  {
    RuntimeCallScope scope;
    result = real(ptr, size, flags);
  }
  after_allocation(result, KeyKind::kDevicePointer, key_of(ptr, result), size, ra, nested);
  return result;
}

// fn: the plain function or its _ptsz twin (programs built for the per-thread default stream
// call those; same arguments).
cudaError_t cuda_malloc_async(Fn fn, int v, void** ptr, size_t size, cudaStream_t stream,
                              const void* ra) {
  auto real = real_as<vl_cudaMallocAsync_t>(fn, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  cudaError_t result;
  {
    RuntimeCallScope scope;
    result = real(ptr, size, stream);
  }
  after_allocation(result, KeyKind::kDevicePointer, key_of(ptr, result), size, ra, nested);
  return result;
}

cudaError_t cuda_malloc_from_pool_async(Fn fn, int v, void** ptr, size_t size,
                                        cudaMemPool_t pool, cudaStream_t stream, const void* ra) {
  auto real = real_as<vl_cudaMallocFromPoolAsync_t>(fn, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  cudaError_t result;
  {
    RuntimeCallScope scope;
    result = real(ptr, size, pool, stream);
  }
  after_allocation(result, KeyKind::kDevicePointer, key_of(ptr, result), size, ra, nested);
  return result;
}

cudaError_t cuda_free_async(Fn fn, int v, void* ptr, cudaStream_t stream) {
  auto real = real_as<vl_cudaFreeAsync_t>(fn, v);
  if (real == nullptr) return kNotInitialized;
  const bool nested = inside_runtime_call();
  FreeInProgress free_call(KeyKind::kDevicePointer, reinterpret_cast<std::uint64_t>(ptr), nested);
  cudaError_t result;
  {
    RuntimeCallScope scope;
    result = real(ptr, stream);
  }
  free_call.finish(result);
  return result;
}

// The runtime's current device is reset: the routed cache forgets its memory there, as for
// cuDevicePrimaryCtxReset (libcudart's own call to it may or may not pass through the shim).
cudaError_t cuda_device_reset(int v) {
  auto real = real_as<vl_cudaDeviceReset_t>(Fn::kCudaDeviceReset, v);
  if (real == nullptr) return kNotInitialized;
  const int device = route_current_device();  // asked first: the reset ends the context
  const cudaError_t result = real();
  if (result == 0 && device >= 0) route_forget_device(device);
  return result;
}

// Without a version argument the driver answers for the runtime's own version; every cudart
// that has cudaGetDriverEntryPoint with this ABI is 12.x or later.
constexpr int kAssumedRuntimeVersion = 12000;

cudaError_t get_driver_entry_point(int v, const char* symbol, void** pfn,
                                   unsigned long long flags,
                                   cudaDriverEntryPointQueryResult* status) {
  auto real = real_as<vl_cudaGetDriverEntryPoint_t>(Fn::kCudaGetDriverEntryPoint, v);
  if (real == nullptr) return kNotInitialized;
  const cudaError_t result = real(symbol, pfn, flags, status);
  if (result == 0 && pfn != nullptr && *pfn != nullptr) {
    *pfn = wrap_entry(fn_by_driver_symbol(symbol, kAssumedRuntimeVersion, flags), *pfn);
  }
  return result;
}

cudaError_t get_driver_entry_point_by_version(int v, const char* symbol, void** pfn,
                                              unsigned int version, unsigned long long flags,
                                              cudaDriverEntryPointQueryResult* status) {
  auto real =
      real_as<vl_cudaGetDriverEntryPointByVersion_t>(Fn::kCudaGetDriverEntryPointByVersion, v);
  if (real == nullptr) return kNotInitialized;
  const cudaError_t result = real(symbol, pfn, version, flags, status);
  if (result == 0 && pfn != nullptr && *pfn != nullptr) {
    *pfn = wrap_entry(fn_by_driver_symbol(symbol, static_cast<int>(version), flags), *pfn);
  }
  return result;
}

template <int V>
cudaError_t cuda_malloc_w(void** p, size_t n) { return cuda_malloc(V, p, n, RETURN_ADDRESS); }
template <int V>
cudaError_t cuda_free_w(void* p) { return cuda_free(V, p); }
template <int V>
cudaError_t cuda_malloc_pitch_w(void** p, size_t* pitch, size_t w, size_t h) {
  return cuda_malloc_pitch(V, p, pitch, w, h, RETURN_ADDRESS);
}
template <int V>
cudaError_t cuda_malloc_managed_w(void** p, size_t n, unsigned int f) {
  return cuda_malloc_managed(V, p, n, f, RETURN_ADDRESS);
}
template <Fn F, int V>
cudaError_t cuda_malloc_async_w(void** p, size_t n, cudaStream_t s) {
  return cuda_malloc_async(F, V, p, n, s, RETURN_ADDRESS);
}
template <Fn F, int V>
cudaError_t cuda_malloc_from_pool_async_w(void** p, size_t n, cudaMemPool_t pool,
                                          cudaStream_t s) {
  return cuda_malloc_from_pool_async(F, V, p, n, pool, s, RETURN_ADDRESS);
}
template <Fn F, int V>
cudaError_t cuda_free_async_w(void* p, cudaStream_t s) { return cuda_free_async(F, V, p, s); }
template <int V>
cudaError_t cuda_device_reset_w() { return cuda_device_reset(V); }
template <int V>
cudaError_t get_driver_entry_point_w(const char* s, void** p, unsigned long long f,
                                     cudaDriverEntryPointQueryResult* st) {
  return get_driver_entry_point(V, s, p, f, st);
}
template <int V>
cudaError_t get_driver_entry_point_by_version_w(const char* s, void** p, unsigned int v,
                                                unsigned long long f,
                                                cudaDriverEntryPointQueryResult* st) {
  return get_driver_entry_point_by_version(V, s, p, v, f, st);
}

}  // namespace
}  // namespace vramledger::preload

using namespace vramledger::preload;

VRAMLEDGER_PRELOAD_EXPORT cudaError_t cudaMalloc(void** p, size_t n) {
  return cuda_malloc(0, p, n, RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT cudaError_t cudaFree(void* p) { return cuda_free(0, p); }
VRAMLEDGER_PRELOAD_EXPORT cudaError_t cudaMallocPitch(void** p, size_t* pitch, size_t w,
                                                      size_t h) {
  return cuda_malloc_pitch(0, p, pitch, w, h, RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT cudaError_t cudaMallocManaged(void** p, size_t n, unsigned int f) {
  return cuda_malloc_managed(0, p, n, f, RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t s) {
  return cuda_malloc_async(Fn::kCudaMallocAsync, 0, p, n, s, RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT cudaError_t cudaMallocAsync_ptsz(void** p, size_t n, cudaStream_t s) {
  return cuda_malloc_async(Fn::kCudaMallocAsyncPtsz, 0, p, n, s, RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT cudaError_t cudaMallocFromPoolAsync(void** p, size_t n,
                                                              cudaMemPool_t pool,
                                                              cudaStream_t s) {
  return cuda_malloc_from_pool_async(Fn::kCudaMallocFromPoolAsync, 0, p, n, pool, s,
                                     RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void** p, size_t n,
                                                                   cudaMemPool_t pool,
                                                                   cudaStream_t s) {
  return cuda_malloc_from_pool_async(Fn::kCudaMallocFromPoolAsyncPtsz, 0, p, n, pool, s,
                                     RETURN_ADDRESS);
}
VRAMLEDGER_PRELOAD_EXPORT cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  return cuda_free_async(Fn::kCudaFreeAsync, 0, p, s);
}
VRAMLEDGER_PRELOAD_EXPORT cudaError_t cudaFreeAsync_ptsz(void* p, cudaStream_t s) {
  return cuda_free_async(Fn::kCudaFreeAsyncPtsz, 0, p, s);
}
VRAMLEDGER_PRELOAD_EXPORT cudaError_t cudaDeviceReset() { return cuda_device_reset(0); }
VRAMLEDGER_PRELOAD_EXPORT cudaError_t cudaGetDriverEntryPoint(
    const char* s, void** p, unsigned long long f, cudaDriverEntryPointQueryResult* st) {
  return get_driver_entry_point(0, s, p, f, st);
}
VRAMLEDGER_PRELOAD_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(
    const char* s, void** p, unsigned int v, unsigned long long f,
    cudaDriverEntryPointQueryResult* st) {
  return get_driver_entry_point_by_version(0, s, p, v, f, st);
}

namespace vramledger::preload {

void* runtime_wrapper(Fn fn, int variant) {
  static void* const kWrappers[kFnCount - kFirstRuntimeFn][kVariants] = {
      VL_RUNTIME_FUNCTIONS(VL_WRAPPER_ROW, VL_WRAPPER_ROW_SHARED)
  };
  return kWrappers[static_cast<int>(fn) - kFirstRuntimeFn][variant];
}

}  // namespace vramledger::preload
