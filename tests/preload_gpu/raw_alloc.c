/* Raw CUDA allocations from C, for tests/preload_gpu/mixed_workload.py (loaded with ctypes) and
 * the overhead measurement of run_checks.py. Built by scripts/gpu_suite.d/50-preload.sh:
 *
 *   gcc -O2 -fPIC -shared -fno-optimize-sibling-calls -I$CUDA/include raw_alloc.c \
 *       -o libraw_alloc.so -L$CUDA/lib64 -L$CUDA/lib64/stubs -lcudart -lcuda -ldl
 *
 * Every function returns the CUDA status (0 = success) and is a real call, never a tail jump
 * (-fno-optimize-sibling-calls, and each checks the result), so the shim sees this library as
 * the caller and attributes the bytes to "user". Each path a program can take to the driver has
 * its own function: direct (PLT) calls, a cuGetProcAddress pointer and a
 * cudaGetDriverEntryPointByVersion pointer. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

/* Makes `device` current on this thread (the runtime's primary context, which the driver calls
 * below then use). */
EXPORT int raw_init(int device) {
  cudaError_t status = cudaSetDevice(device);
  if (status != cudaSuccess) return (int)status;
  status = cudaFree(NULL);
  return (int)status;
}

EXPORT int raw_cuda_malloc(size_t bytes, uint64_t* out) {
  void* pointer = NULL;
  const cudaError_t status = cudaMalloc(&pointer, bytes);
  if (status != cudaSuccess) return (int)status;
  *out = (uint64_t)(uintptr_t)pointer;
  return 0;
}

EXPORT int raw_cuda_free(uint64_t pointer) {
  const cudaError_t status = cudaFree((void*)(uintptr_t)pointer);
  return status == cudaSuccess ? 0 : (int)status;
}

EXPORT int raw_cu_mem_alloc(size_t bytes, uint64_t* out) {
  CUdeviceptr pointer = 0;
  const CUresult status = cuMemAlloc(&pointer, bytes);
  if (status != CUDA_SUCCESS) return (int)status;
  *out = (uint64_t)pointer;
  return 0;
}

EXPORT int raw_cu_mem_free(uint64_t pointer) {
  const CUresult status = cuMemFree((CUdeviceptr)pointer);
  return status == CUDA_SUCCESS ? 0 : (int)status;
}

static void fill_prop(CUmemAllocationProp* prop, CUmemLocationType location, int id) {
  memset(prop, 0, sizeof(*prop));
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = location;
  prop->location.id = id;
}

/* The minimum granularity of device memory on `device` (cuMemCreate sizes are multiples of it). */
EXPORT int raw_cu_granularity(int device, size_t* out) {
  CUmemAllocationProp prop;
  fill_prop(&prop, CU_MEM_LOCATION_TYPE_DEVICE, device);
  const CUresult status =
      cuMemGetAllocationGranularity(out, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  return status == CUDA_SUCCESS ? 0 : (int)status;
}

EXPORT int raw_cu_mem_create(size_t bytes, int device, uint64_t* handle) {
  CUmemAllocationProp prop;
  fill_prop(&prop, CU_MEM_LOCATION_TYPE_DEVICE, device);
  CUmemGenericAllocationHandle created = 0;
  const CUresult status = cuMemCreate(&created, bytes, &prop, 0);
  if (status != CUDA_SUCCESS) return (int)status;
  *handle = (uint64_t)created;
  return 0;
}

/* Host memory through cuMemCreate (NUMA node 0), as NCCL allocates its host buffers: holds no
 * device bytes. Fails on drivers/systems without host cuMem support (the caller skips then). */
EXPORT int raw_cu_mem_create_host(size_t bytes, uint64_t* handle) {
  CUmemAllocationProp prop;
  fill_prop(&prop, CU_MEM_LOCATION_TYPE_HOST_NUMA, 0);
  CUmemGenericAllocationHandle created = 0;
  const CUresult status = cuMemCreate(&created, bytes, &prop, 0);
  if (status != CUDA_SUCCESS) return (int)status;
  *handle = (uint64_t)created;
  return 0;
}

EXPORT int raw_cu_mem_release(uint64_t handle) {
  const CUresult status = cuMemRelease((CUmemGenericAllocationHandle)handle);
  return status == CUDA_SUCCESS ? 0 : (int)status;
}

typedef CUresult (*MemAllocFn)(CUdeviceptr*, size_t);
typedef CUresult (*MemFreeFn)(CUdeviceptr);

/* cuMemAlloc / cuMemFree through pointers from cuGetProcAddress (CUDA 12 ABI, version 12000):
 * *fn_out receives the cuMemAlloc pointer the lookup handed out (for the report). */
EXPORT int raw_cu_mem_alloc_via_proc_address(size_t bytes, uint64_t* out, uint64_t* fn_out) {
  void* alloc_fn = NULL;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CUresult status = cuGetProcAddress("cuMemAlloc", &alloc_fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT,
                                     &found);
  if (status != CUDA_SUCCESS) return (int)status;
  if (alloc_fn == NULL) return -1;
  *fn_out = (uint64_t)(uintptr_t)alloc_fn;
  CUdeviceptr pointer = 0;
  status = ((MemAllocFn)alloc_fn)(&pointer, bytes);
  if (status != CUDA_SUCCESS) return (int)status;
  *out = (uint64_t)pointer;
  return 0;
}

EXPORT int raw_cu_mem_free_via_proc_address(uint64_t pointer) {
  void* free_fn = NULL;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CUresult status = cuGetProcAddress("cuMemFree", &free_fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT,
                                     &found);
  if (status != CUDA_SUCCESS) return (int)status;
  if (free_fn == NULL) return -1;
  status = ((MemFreeFn)free_fn)((CUdeviceptr)pointer);
  return status == CUDA_SUCCESS ? 0 : (int)status;
}

/* The same through the runtime's entry-point lookup. */
EXPORT int raw_cu_mem_alloc_via_entry_point(size_t bytes, uint64_t* out, uint64_t* fn_out) {
  void* alloc_fn = NULL;
  enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaError_t status =
      cudaGetDriverEntryPointByVersion("cuMemAlloc", &alloc_fn, 12000, cudaEnableDefault, &found);
  if (status != cudaSuccess) return (int)status;
  if (alloc_fn == NULL) return -1;
  *fn_out = (uint64_t)(uintptr_t)alloc_fn;
  CUdeviceptr pointer = 0;
  const CUresult result = ((MemAllocFn)alloc_fn)(&pointer, bytes);
  if (result != CUDA_SUCCESS) return (int)result;
  *out = (uint64_t)pointer;
  return 0;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Overhead measurement: `batches` batches of `per_batch` alloc+free pairs of `bytes`;
 * batch_ns[i] receives batch i's mean ns per pair. kind 0: cudaMalloc + cudaFree (runtime),
 * kind 1: cuMemAlloc + cuMemFree (driver, direct calls). */
EXPORT int raw_bench(int kind, size_t bytes, int batches, int per_batch, double* batch_ns) {
  for (int b = 0; b < batches; ++b) {
    const uint64_t start = now_ns();
    for (int i = 0; i < per_batch; ++i) {
      int status;
      if (kind == 0) {
        void* pointer = NULL;
        status = (int)cudaMalloc(&pointer, bytes);
        if (status == 0) status = (int)cudaFree(pointer);
      } else {
        CUdeviceptr pointer = 0;
        status = (int)cuMemAlloc(&pointer, bytes);
        if (status == 0) status = (int)cuMemFree(pointer);
      }
      if (status != 0) return status;
    }
    batch_ns[b] = (double)(now_ns() - start) / (double)per_batch;
  }
  return 0;
}
