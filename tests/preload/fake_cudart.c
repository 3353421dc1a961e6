/* A CPU test double of a dynamically linked libcudart: like the real one, it reaches the driver
 * only through cuGetProcAddress fetched with dlsym, so the preload shim sees its driver calls
 * nested inside its own cudaMalloc hook and must not count them twice. */
#include <dlfcn.h>
#include <stddef.h>

#include "fake_cuda.h"

#define EXPORT __attribute__((visibility("default")))

static vl_cuMemAlloc_v2_t g_alloc;
static vl_cuMemFree_v2_t g_free;
static vl_cuMemAllocAsync_t g_alloc_async_ptsz;
static vl_cuMemFreeAsync_t g_free_async_ptsz;

static int load_driver(void) {
  if (g_alloc != NULL) return 0;
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == NULL) return -1;
  vl_cuGetProcAddress_v2_t get = (vl_cuGetProcAddress_v2_t)dlsym(driver, "cuGetProcAddress_v2");
  if (get == NULL) return -1;
  void* alloc = NULL;
  void* release = NULL;
  if (get("cuMemAlloc", &alloc, 12000, 0, NULL) != 0) return -1;
  if (get("cuMemFree", &release, 12000, 0, NULL) != 0) return -1;
  void* alloc_async = NULL;
  void* free_async = NULL;
  /* The per-thread-default-stream versions, as a cudart built for them asks. */
  if (get("cuMemAllocAsync", &alloc_async, 12000, 2, NULL) != 0) return -1;
  if (get("cuMemFreeAsync", &free_async, 12000, 2, NULL) != 0) return -1;
  g_alloc_async_ptsz = (vl_cuMemAllocAsync_t)alloc_async;
  g_free_async_ptsz = (vl_cuMemFreeAsync_t)free_async;
  g_free = (vl_cuMemFree_v2_t)release;
  g_alloc = (vl_cuMemAlloc_v2_t)alloc;
  return 0;
}

EXPORT cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (load_driver() != 0) return 3;
  CUdeviceptr dptr = 0;
  const CUresult result = g_alloc(&dptr, size);
  if (result != 0) return 2; /* cudaErrorMemoryAllocation */
  *ptr = (void*)dptr;
  return 0;
}

/* What cudaMallocAsync / cudaFreeAsync become in programs built for the per-thread default stream. */
EXPORT cudaError_t cudaMallocAsync_ptsz(void** ptr, size_t size, cudaStream_t stream) {
  if (load_driver() != 0) return 3;
  CUdeviceptr dptr = 0;
  if (g_alloc_async_ptsz(&dptr, size, stream) != 0) return 2;
  *ptr = (void*)dptr;
  return 0;
}

EXPORT cudaError_t cudaFreeAsync_ptsz(void* ptr, cudaStream_t stream) {
  if (load_driver() != 0) return 3;
  return g_free_async_ptsz((CUdeviceptr)ptr, stream) == 0 ? 0 : 1;
}

/* Resets the current device's primary context through the driver, as libcudart does. */
EXPORT cudaError_t cudaDeviceReset(void) {
  if (load_driver() != 0) return 3;
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  vl_cuGetProcAddress_v2_t get = (vl_cuGetProcAddress_v2_t)dlsym(driver, "cuGetProcAddress_v2");
  CUresult (*get_device)(int*) = (CUresult (*)(int*))dlsym(driver, "cuCtxGetDevice");
  void* reset = NULL;
  int device = 0;
  if (get("cuDevicePrimaryCtxReset", &reset, 12000, 0, NULL) != 0 || get_device(&device) != 0) {
    return 3;
  }
  return ((CUresult (*)(int))reset)(device) == 0 ? 0 : 1;
}

EXPORT cudaError_t cudaFree(void* ptr) {
  if (load_driver() != 0) return 3;
  return g_free((CUdeviceptr)ptr) == 0 ? 0 : 1;
}
