/* The slice of the CUDA driver and runtime ABI the preload shim interposes, declared here so the
 * shim (and its CPU test doubles) build without the CUDA toolkit. Types match cuda.h /
 * cuda_runtime_api.h on 64-bit Linux: enums are int, handles are pointers or 64-bit integers. */
#ifndef VRAMLEDGER_PRELOAD_CUDA_ABI_H_
#define VRAMLEDGER_PRELOAD_CUDA_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int CUresult;                          /* CUDA_SUCCESS == 0 */
typedef unsigned long long CUdeviceptr;        /* CUdeviceptr_v2 */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUstream_st* CUstream;
typedef struct CUmemPoolHandle_st* CUmemoryPool;
typedef struct CUmemAllocationProp_st CUmemAllocationProp; /* passed through; the shim reads only
                                                            the leading fields below */
/* The first fields of cuda.h's CUmemAllocationProp (type, requestedHandleTypes, location): enough
 * to tell device memory from host memory (CU_MEM_LOCATION_TYPE_HOST*, which NCCL's cuMem host
 * buffers use). */
typedef struct vl_CUmemAllocationPropHead {
  int type;
  int requested_handle_types;
  int location_type;
  int location_id;
} vl_CUmemAllocationPropHead;
#define VRAMLEDGER_CU_MEM_LOCATION_TYPE_DEVICE 1
typedef int CUdriverProcAddressQueryResult;
typedef int cudaError_t;                       /* cudaSuccess == 0 */
typedef struct CUstream_st* cudaStream_t;
typedef struct CUmemPoolHandle_st* cudaMemPool_t;
typedef int cudaDriverEntryPointQueryResult;

/* cuGetProcAddress flags */
#define VRAMLEDGER_CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2ull
/* cudaGetDriverEntryPoint flags */
#define VRAMLEDGER_CUDA_ENABLE_PER_THREAD_DEFAULT_STREAM 2ull

typedef CUresult (*vl_cuMemAlloc_v2_t)(CUdeviceptr* dptr, size_t bytesize);
typedef CUresult (*vl_cuMemFree_v2_t)(CUdeviceptr dptr);
typedef CUresult (*vl_cuMemAllocPitch_v2_t)(CUdeviceptr* dptr, size_t* pitch, size_t width_bytes,
                                            size_t height, unsigned int element_size_bytes);
typedef CUresult (*vl_cuMemAllocManaged_t)(CUdeviceptr* dptr, size_t bytesize, unsigned int flags);
typedef CUresult (*vl_cuMemAllocAsync_t)(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
typedef CUresult (*vl_cuMemAllocFromPoolAsync_t)(CUdeviceptr* dptr, size_t bytesize,
                                                 CUmemoryPool pool, CUstream stream);
typedef CUresult (*vl_cuMemFreeAsync_t)(CUdeviceptr dptr, CUstream stream);
typedef CUresult (*vl_cuMemCreate_t)(CUmemGenericAllocationHandle* handle, size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags);
typedef CUresult (*vl_cuMemRelease_t)(CUmemGenericAllocationHandle handle);
typedef CUresult (*vl_cuDevicePrimaryCtxReset_v2_t)(int device);
typedef CUresult (*vl_cuGetProcAddress_t)(const char* symbol, void** pfn, int cuda_version,
                                          uint64_t flags);
typedef CUresult (*vl_cuGetProcAddress_v2_t)(const char* symbol, void** pfn, int cuda_version,
                                             uint64_t flags,
                                             CUdriverProcAddressQueryResult* symbol_status);

typedef cudaError_t (*vl_cudaMalloc_t)(void** ptr, size_t size);
typedef cudaError_t (*vl_cudaFree_t)(void* ptr);
typedef cudaError_t (*vl_cudaMallocPitch_t)(void** ptr, size_t* pitch, size_t width, size_t height);
typedef cudaError_t (*vl_cudaMallocManaged_t)(void** ptr, size_t size, unsigned int flags);
typedef cudaError_t (*vl_cudaMallocAsync_t)(void** ptr, size_t size, cudaStream_t stream);
typedef cudaError_t (*vl_cudaMallocFromPoolAsync_t)(void** ptr, size_t size, cudaMemPool_t pool,
                                                    cudaStream_t stream);
typedef cudaError_t (*vl_cudaFreeAsync_t)(void* ptr, cudaStream_t stream);
typedef cudaError_t (*vl_cudaDeviceReset_t)(void);
typedef cudaError_t (*vl_cudaGetDriverEntryPoint_t)(const char* symbol, void** pfn,
                                                    unsigned long long flags,
                                                    cudaDriverEntryPointQueryResult* status);
typedef cudaError_t (*vl_cudaGetDriverEntryPointByVersion_t)(
    const char* symbol, void** pfn, unsigned int cuda_version, unsigned long long flags,
    cudaDriverEntryPointQueryResult* status);

#ifdef __cplusplus
}
#endif

#endif /* VRAMLEDGER_PRELOAD_CUDA_ABI_H_ */
