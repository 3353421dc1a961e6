/* Shared by the preload test doubles and the test program. */
#ifndef VRAMLEDGER_TESTS_PRELOAD_FAKE_CUDA_H_
#define VRAMLEDGER_TESTS_PRELOAD_FAKE_CUDA_H_

#include <stddef.h>

#include "preload/cuda_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FAKE_CUDA_ERROR_SIZE ((size_t)0xBAD) /* the fake driver refuses exactly this size */

/* fake libcuda.so.1 */
typedef struct CUctx_st* CUcontext;
typedef struct CUevent_st* CUevent;
long long fake_cuda_live_bytes(void);
void fake_cuda_set_capacity(long long bytes);      /* allocations beyond it fail; 0 = none */
void fake_cuda_make_current(int device, int primary); /* device -1: no current context */
long long fake_cuda_synchronizations(void);
void fake_cuda_fail_next_synchronize(CUresult error);
int fake_cuda_resets(void);
CUresult cuDevicePrimaryCtxReset_v2(int device);
CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                            unsigned int element_size);
CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int flags);
CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream stream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);

/* fake libcudart.so.12 */
cudaError_t cudaMalloc(void** ptr, size_t size);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaMallocAsync_ptsz(void** ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync_ptsz(void* ptr, cudaStream_t stream);

/* libnccl_fake.so: how NCCL-like code reaches the driver. How: 0 direct call, 1 cuGetProcAddress,
 * 2 dlsym on a libcuda handle. */
CUresult nccl_fake_alloc(int how, CUdeviceptr* dptr, size_t bytes);
CUresult nccl_fake_free(int how, CUdeviceptr dptr);

#ifdef __cplusplus
}
#endif

#endif
