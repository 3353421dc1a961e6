// The one list of interposed functions (as PyTorch's C10_LIBCUDA_DRIVER_API): the Fn ids
// (interposed_functions.hpp), the exported names (interposed_functions.cpp) and the wrapper
// tables of driver_hooks.cpp / runtime_hooks.cpp are all generated from it, so a row cannot
// drift out of step with the others. Driver functions first, then runtime functions.
//
// Each row names the Fn id, the exported symbol, and the template of its lookup variants 1..3
// (interposed_functions.hpp explains variants). ROW's template is `template <int V>`;
// ROW_SHARED's is `template <Fn F, int V>`, one template shared by functions of one signature.
// The exported symbol itself (variant 0) is written out by hand in the hooks file, since its
// signature is the library's ABI; a row without one does not compile.
#pragma once

#define VL_DRIVER_FUNCTIONS(ROW, ROW_SHARED)                                                   \
  ROW(kMemAlloc, cuMemAlloc_v2, mem_alloc_w)                                                   \
  ROW(kMemFree, cuMemFree_v2, mem_free_w)                                                      \
  ROW(kMemAllocPitch, cuMemAllocPitch_v2, mem_alloc_pitch_w)                                   \
  ROW(kMemAllocManaged, cuMemAllocManaged, mem_alloc_managed_w)                                \
  ROW_SHARED(kMemAllocAsync, cuMemAllocAsync, mem_alloc_async_w)                               \
  ROW_SHARED(kMemAllocAsyncPtsz, cuMemAllocAsync_ptsz, mem_alloc_async_w)                      \
  ROW_SHARED(kMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, mem_alloc_from_pool_async_w)     \
  ROW_SHARED(kMemAllocFromPoolAsyncPtsz, cuMemAllocFromPoolAsync_ptsz,                         \
             mem_alloc_from_pool_async_w)                                                      \
  ROW_SHARED(kMemFreeAsync, cuMemFreeAsync, mem_free_async_w)                                  \
  ROW_SHARED(kMemFreeAsyncPtsz, cuMemFreeAsync_ptsz, mem_free_async_w)                         \
  ROW(kMemCreate, cuMemCreate, mem_create_w)                                                   \
  ROW(kMemRelease, cuMemRelease, mem_release_w)                                                \
  /* frees the routed cache's memory */                                                        \
  ROW(kDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2, primary_ctx_reset_w)                 \
  /* CUDA 11.3 ABI (4 arguments), CUDA 12 ABI (5 arguments) */                                 \
  ROW(kGetProcAddress, cuGetProcAddress, get_proc_address_w)                                   \
  ROW(kGetProcAddressV2, cuGetProcAddress_v2, get_proc_address_v2_w)

#define VL_RUNTIME_FUNCTIONS(ROW, ROW_SHARED)                                                  \
  ROW(kCudaMalloc, cudaMalloc, cuda_malloc_w)                                                  \
  ROW(kCudaFree, cudaFree, cuda_free_w)                                                        \
  ROW(kCudaMallocPitch, cudaMallocPitch, cuda_malloc_pitch_w)                                  \
  ROW(kCudaMallocManaged, cudaMallocManaged, cuda_malloc_managed_w)                            \
  ROW_SHARED(kCudaMallocAsync, cudaMallocAsync, cuda_malloc_async_w)                           \
  ROW_SHARED(kCudaMallocFromPoolAsync, cudaMallocFromPoolAsync, cuda_malloc_from_pool_async_w) \
  ROW_SHARED(kCudaFreeAsync, cudaFreeAsync, cuda_free_async_w)                                 \
  ROW(kCudaDeviceReset, cudaDeviceReset, cuda_device_reset_w)                                  \
  ROW(kCudaGetDriverEntryPoint, cudaGetDriverEntryPoint, get_driver_entry_point_w)             \
  ROW(kCudaGetDriverEntryPointByVersion, cudaGetDriverEntryPointByVersion,                     \
      get_driver_entry_point_by_version_w)                                                     \
  /* the per-thread-default-stream twins (same arguments) */                                   \
  ROW_SHARED(kCudaMallocAsyncPtsz, cudaMallocAsync_ptsz, cuda_malloc_async_w)                  \
  ROW_SHARED(kCudaMallocFromPoolAsyncPtsz, cudaMallocFromPoolAsync_ptsz,                       \
             cuda_malloc_from_pool_async_w)                                                    \
  ROW_SHARED(kCudaFreeAsyncPtsz, cudaFreeAsync_ptsz, cuda_free_async_w)

// Row expanders.
#define VL_FN_ID(id, export_name, tmpl) id,
#define VL_FN_EXPORTED_NAME(id, export_name, tmpl) #export_name,
#define VL_FN_COUNT(id, export_name, tmpl) +1
// A wrapper table row: the exported function, then variants 1..3 of its template.
#define VL_WRAPPER_ROW(id, export_name, tmpl)                                                  \
  {reinterpret_cast<void*>(&export_name), reinterpret_cast<void*>(&tmpl<1>),                   \
   reinterpret_cast<void*>(&tmpl<2>), reinterpret_cast<void*>(&tmpl<3>)},
#define VL_WRAPPER_ROW_SHARED(id, export_name, tmpl)                                           \
  {reinterpret_cast<void*>(&export_name), reinterpret_cast<void*>(&tmpl<Fn::id, 1>),           \
   reinterpret_cast<void*>(&tmpl<Fn::id, 2>), reinterpret_cast<void*>(&tmpl<Fn::id, 3>)},
