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
static atomic_llong g_capacity; /* 0: unlimited */
static atomic_ullong g_next_handle = 1;

/* Each fake device allocation carries its size and a marker in a header just before the
 * returned address, so a free of anything else is refused like the driver refuses it. */
static const unsigned long long kLiveMarker = 0xFA4EC0DA11ull;

static CUresult fake_alloc(CUdeviceptr* dptr, size_t bytes) {
  if (dptr == NULL || bytes == 0) return 1; /* CUDA_ERROR_INVALID_VALUE */
  if (bytes == FAKE_CUDA_ERROR_SIZE) return 2;
  const long long capacity = atomic_load(&g_capacity);
  if (capacity != 0 && atomic_load(&g_live_bytes) + (long long)bytes > capacity) return 2;
  unsigned char* block = malloc(bytes + 16);
  if (block == NULL) return 2;
  memcpy(block, &bytes, sizeof bytes);
  memcpy(block + 8, &kLiveMarker, sizeof kLiveMarker);
  *dptr = (CUdeviceptr)(block + 16);
  atomic_fetch_add(&g_live_bytes, (long long)bytes);
  return 0;
}

static CUresult fake_free(CUdeviceptr dptr) {
  if (dptr == 0) return 0;
  unsigned char* block = (unsigned char*)dptr - 16;
  unsigned long long marker;
  memcpy(&marker, block + 8, sizeof marker);
  if (marker != kLiveMarker) return 1; /* not an allocation base: CUDA_ERROR_INVALID_VALUE */
  size_t bytes;
  memcpy(&bytes, block, sizeof bytes);
  memset(block + 8, 0, sizeof marker);
  atomic_fetch_sub(&g_live_bytes, (long long)bytes);
  free(block);
  return 0;
}

EXPORT long long fake_cuda_live_bytes(void) { return atomic_load(&g_live_bytes); }
EXPORT void fake_cuda_set_capacity(long long bytes) { atomic_store(&g_capacity, bytes); }

/* Contexts: two devices, each with a primary context, plus one context "the program created"
 * on device 0. The current context is per thread, as in the driver. */
struct CUctx_st { int device; int primary; };
static struct CUctx_st g_primary[2] = {{0, 1}, {1, 1}};
static struct CUctx_st g_user_context = {0, 0};
static _Thread_local CUcontext t_current;
static _Thread_local CUcontext t_stack[8];
static _Thread_local int t_depth;
static atomic_llong g_synchronizations;
static atomic_int g_fail_next_synchronize;
static atomic_int g_resets;

static atomic_int g_primary_active[2];

EXPORT void fake_cuda_make_current(int device, int primary) {
  t_current = device < 0 ? NULL : primary ? &g_primary[device] : &g_user_context;
  if (device >= 0 && primary) atomic_store(&g_primary_active[device], 1);
}
EXPORT long long fake_cuda_synchronizations(void) { return atomic_load(&g_synchronizations); }
EXPORT void fake_cuda_fail_next_synchronize(CUresult error) {
  atomic_store(&g_fail_next_synchronize, error);
}
EXPORT int fake_cuda_resets(void) { return atomic_load(&g_resets); }

EXPORT CUresult cuCtxGetCurrent(CUcontext* out) {
  if (out == NULL) return 1;
  *out = t_current;
  return 0;
}
EXPORT CUresult cuCtxGetDevice(int* device) {
  if (device == NULL) return 1;
  if (t_current == NULL) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
  *device = t_current->device;
  return 0;
}
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext context) {
  if (t_depth == 8) return 1;
  t_stack[t_depth++] = t_current;
  t_current = context;
  return 0;
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* out) {
  if (t_depth == 0) return 201;
  if (out != NULL) *out = t_current;
  t_current = t_stack[--t_depth];
  return 0;
}
EXPORT CUresult cuCtxSynchronize(void) {
  if (t_current == NULL) return 201;
  const int error = atomic_exchange(&g_fail_next_synchronize, 0);
  if (error != 0) return error;
  atomic_fetch_add(&g_synchronizations, 1);
  return 0;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* out, int device) {
  if (out == NULL || device < 0 || device > 1) return 101; /* CUDA_ERROR_INVALID_DEVICE */
  *out = &g_primary[device];
  atomic_store(&g_primary_active[device], 1);
  return 0;
}
EXPORT CUresult cuDevicePrimaryCtxGetState(int device, unsigned int* flags, int* active) {
  if (flags == NULL || active == NULL || device < 0 || device > 1) return 101;
  *flags = 0;
  *active = atomic_load(&g_primary_active[device]);
  return 0;
}
/* The real reset frees the context's memory; the fake only counts (its memory stays readable). */
EXPORT CUresult cuDevicePrimaryCtxReset_v2(int device) {
  if (device < 0 || device > 1) return 101;
  atomic_fetch_add(&g_resets, 1);
  return 0;
}
EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  const long long capacity = atomic_load(&g_capacity) != 0 ? atomic_load(&g_capacity) : (1ll << 36);
  *total_bytes = (size_t)capacity;
  *free_bytes = (size_t)(capacity - atomic_load(&g_live_bytes));
  return 0;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, int device) {
  (void)device;
  *bytes = (size_t)1 << 36;
  return 0;
}
/* Events complete at once: the fake device has no queue. */
struct CUevent_st { int unused; };
EXPORT CUresult cuEventCreate(CUevent* out, unsigned int flags) {
  (void)flags;
  *out = malloc(sizeof(struct CUevent_st));
  return *out != NULL ? 0 : 2;
}
EXPORT CUresult cuEventDestroy_v2(CUevent event) { free(event); return 0; }
EXPORT CUresult cuEventRecord(CUevent event, CUstream stream) { (void)event; (void)stream; return 0; }
EXPORT CUresult cuEventQuery(CUevent event) { (void)event; return 0; }
EXPORT CUresult cuEventSynchronize(CUevent event) { (void)event; return 0; }
EXPORT CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  (void)stream; (void)event; (void)flags;
  return 0;
}

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
      {"cuDevicePrimaryCtxReset", (void*)&cuDevicePrimaryCtxReset_v2},
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
