// The functions the shim wraps, and how a looked-up real entry point becomes a wrapper.
//
// A caller can reach a memory function four ways: a direct call (bound to the shim's export),
// dlsym on a libcuda/libcudart handle, cuGetProcAddress, cudaGetDriverEntryPoint*. The last
// three hand out whatever pointer the real library returns; each function therefore has a few
// wrapper *variants*, each bound to one real pointer. Variant 0 is the shim's export, bound to
// the definition it hides; the others are bound on first use to a pointer a lookup returned
// (the driver may answer cuGetProcAddress with a pointer other than its exported symbol).
#pragma once

#include <cstdint>

namespace vramledger::preload {

enum class Fn : int {
  // driver
  kMemAlloc,  // cuMemAlloc_v2
  kMemFree,   // cuMemFree_v2
  kMemAllocPitch,
  kMemAllocManaged,
  kMemAllocAsync,
  kMemAllocAsyncPtsz,
  kMemAllocFromPoolAsync,
  kMemAllocFromPoolAsyncPtsz,
  kMemFreeAsync,
  kMemFreeAsyncPtsz,
  kMemCreate,
  kMemRelease,
  kDevicePrimaryCtxReset,  // cuDevicePrimaryCtxReset_v2: frees the routed cache's memory
  kGetProcAddress,    // CUDA 11.3 ABI (4 arguments)
  kGetProcAddressV2,  // CUDA 12 ABI (5 arguments)
  // runtime
  kCudaMalloc,
  kCudaFree,
  kCudaMallocPitch,
  kCudaMallocManaged,
  kCudaMallocAsync,
  kCudaMallocFromPoolAsync,
  kCudaFreeAsync,
  kCudaDeviceReset,
  kCudaGetDriverEntryPoint,
  kCudaGetDriverEntryPointByVersion,
  kCudaMallocAsyncPtsz,  // the per-thread-default-stream twins (same arguments)
  kCudaMallocFromPoolAsyncPtsz,
  kCudaFreeAsyncPtsz,
  kCount,
  kNone = -1
};

inline constexpr int kFnCount = static_cast<int>(Fn::kCount);
inline constexpr int kVariants = 4;
inline constexpr int kFirstRuntimeFn = static_cast<int>(Fn::kCudaMalloc);

// The exported symbol name of each function ("cuMemAlloc_v2", "cudaMalloc", ...).
const char* exported_name(Fn fn);
// The function a dlsym name names (exact exported names), or kNone.
Fn fn_by_exported_name(const char* name);
// The function cuGetProcAddress / cudaGetDriverEntryPoint* resolves `symbol` to for this
// version and flags, or kNone when the shim does not wrap it (e.g. the 32-bit cuMemAlloc of
// CUDA < 3.2, whose ABI differs).
Fn fn_by_driver_symbol(const char* symbol, int cuda_version, std::uint64_t flags);

// The real function behind wrapper `variant` of `fn` (resolving variant 0 lazily); nullptr when
// it cannot be found.
void* real_function(Fn fn, int variant);
// What a lookup should hand out for a real pointer `real` of `fn`: a wrapper bound to it, or
// `real` itself (counted as an unwrapped lookup) when every variant is taken.
void* wrap_entry(Fn fn, void* real);

// Defined by driver_hooks.cpp / runtime_hooks.cpp: the address of wrapper `variant` of `fn`.
void* driver_wrapper(Fn fn, int variant);
void* runtime_wrapper(Fn fn, int variant);

}  // namespace vramledger::preload
