/* A CPU test double of libcuda.so.1: the memory functions the preload shim interposes, backed by
 * malloc, plus cuGetProcAddress handing out its own functions. Linked -Bsymbolic like the real
 * driver, so the pointers it hands out are its own, never the shim's.
 * An allocation of FAKE_CUDA_ERROR_SIZE bytes fails with CUDA_ERROR_OUT_OF_MEMORY (2). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "preload/cuda_abi.h"
#include "fake_cuda.h"

#define EXPORT __attribute__((visibility("default")))

static atomic_llong g_live_bytes;
static atomic_ullong g_next_handle = 1;

/* Each fake device allocation carries its size in a header just before the returned address. */
static CUresult fake_alloc(CUdeviceptr* dptr, size_t bytes) {
  if (dptr == NULL) return 1; /* CUDA_ERROR_INVALID_VALUE */
  if (bytes == FAKE_CUDA_ERROR_SIZE) return 2;
  unsigned char* block = malloc(bytes + 16);
  if (block == NULL) return 2;
  memcpy(block, &bytes, sizeof bytes);
  *dptr = (CUdeviceptr)(block + 16);
  atomic_fetch_add(&g_live_bytes, (long long)bytes);
  return 0;
}

static CUresult fake_free(CUdeviceptr dptr) {
  if (dptr == 0) return 0;
  unsigned char* block = (unsigned char*)dptr - 16;
  size_t bytes;
  memcpy(&bytes, block, sizeof bytes);
  atomic_fetch_sub(&g_live_bytes, (long long)bytes);
  free(block);
  return 0;
}

EXPORT long long fake_cuda_live_bytes(void) { return atomic_load(&g_live_bytes); }

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) { return fake_alloc(dptr, bytes); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { return fake_free(dptr); }
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                   unsigned int element_size) {
  (void)element_size;
  if (pitch == NULL) return 1;
  const size_t rounded = (width + 511) / 512 * 512;
  const CUresult result = fake_alloc(dptr, rounded * height);
  if (result == 0) *pitch = rounded;
  return result;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int flags) {
  (void)flags;
  return fake_alloc(dptr, bytes);
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  (void)stream;
  return fake_alloc(dptr, bytes);
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                        CUstream stream) {
  (void)pool;
  (void)stream;
  return fake_alloc(dptr, bytes);
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  (void)stream;
  return fake_free(dptr);
}

/* Physical handles: a fake allocation per handle, found again through a small table. */
#define FAKE_HANDLES 4096
static struct { atomic_ullong handle; CUdeviceptr memory; } g_handles[FAKE_HANDLES];

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                            const CUmemAllocationProp* prop, unsigned long long flags) {
  (void)prop;
  (void)flags;
  if (handle == NULL) return 1;
  CUdeviceptr memory;
  const CUresult result = fake_alloc(&memory, size);
  if (result != 0) return result;
  const unsigned long long value = atomic_fetch_add(&g_next_handle, 1);
  for (int i = 0; i < FAKE_HANDLES; ++i) {
    unsigned long long empty = 0;
    if (atomic_compare_exchange_strong(&g_handles[i].handle, &empty, value)) {
      g_handles[i].memory = memory;
      *handle = value;
      return 0;
    }
  }
  fake_free(memory);
  return 2;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  for (int i = 0; i < FAKE_HANDLES; ++i) {
    if (atomic_load(&g_handles[i].handle) == handle) {
      const CUdeviceptr memory = g_handles[i].memory;
      atomic_store(&g_handles[i].handle, 0);
      return fake_free(memory);
    }
  }
  return 1;
}

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                    uint64_t flags, CUdriverProcAddressQueryResult* status);

static void* lookup(const char* symbol, int version) {
  static const struct { const char* name; void* fn; } kTable[] = {
      {"cuMemAlloc", (void*)&cuMemAlloc_v2},
      {"cuMemFree", (void*)&cuMemFree_v2},
      {"cuMemAllocPitch", (void*)&cuMemAllocPitch_v2},
      {"cuMemAllocManaged", (void*)&cuMemAllocManaged},
      {"cuMemAllocAsync", (void*)&cuMemAllocAsync},
      {"cuMemAllocFromPoolAsync", (void*)&cuMemAllocFromPoolAsync},
      {"cuMemFreeAsync", (void*)&cuMemFreeAsync},
      {"cuMemCreate", (void*)&cuMemCreate},
      {"cuMemRelease", (void*)&cuMemRelease},
  };
  if (strcmp(symbol, "cuGetProcAddress") == 0 && version >= 12000) {
    return (void*)&cuGetProcAddress_v2;
  }
  for (size_t i = 0; i < sizeof kTable / sizeof kTable[0]; ++i) {
    if (strcmp(kTable[i].name, symbol) == 0) return kTable[i].fn;
  }
  return NULL;
}

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                    uint64_t flags, CUdriverProcAddressQueryResult* status) {
  (void)flags;
  if (symbol == NULL || pfn == NULL) return 1;
  *pfn = lookup(symbol, version);
  if (status != NULL) *status = *pfn != NULL ? 0 : 1; /* CU_GET_PROC_ADDRESS_SUCCESS / _NOT_FOUND */
  return *pfn != NULL ? 0 : 500;                       /* CUDA_ERROR_NOT_FOUND */
}
