/* libnccl_fake.so: a library whose name makes the shim attribute its allocations to NCCL, and
 * which reaches the driver the three ways real libraries do. */
#include <dlfcn.h>
#include <stddef.h>

#include "fake_cuda.h"

#define EXPORT __attribute__((visibility("default")))

static void* driver_symbol_by_dlsym(const char* name) {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return driver ? dlsym(driver, name) : NULL;
}

static void* driver_symbol_by_proc_address(const char* name) {
  vl_cuGetProcAddress_v2_t get =
      (vl_cuGetProcAddress_v2_t)driver_symbol_by_dlsym("cuGetProcAddress_v2");
  void* fn = NULL;
  if (get == NULL || get(name, &fn, 12000, 0, NULL) != 0) return NULL;
  return fn;
}

EXPORT CUresult nccl_fake_alloc(int how, CUdeviceptr* dptr, size_t bytes) {
  if (how == 0) return cuMemAlloc_v2(dptr, bytes);
  vl_cuMemAlloc_v2_t alloc = how == 1
      ? (vl_cuMemAlloc_v2_t)driver_symbol_by_proc_address("cuMemAlloc")
      : (vl_cuMemAlloc_v2_t)driver_symbol_by_dlsym("cuMemAlloc_v2");
  return alloc ? alloc(dptr, bytes) : 999;
}

EXPORT CUresult nccl_fake_free(int how, CUdeviceptr dptr) {
  if (how == 0) return cuMemFree_v2(dptr);
  vl_cuMemFree_v2_t release = how == 1
      ? (vl_cuMemFree_v2_t)driver_symbol_by_proc_address("cuMemFree")
      : (vl_cuMemFree_v2_t)driver_symbol_by_dlsym("cuMemFree_v2");
  return release ? release(dptr) : 999;
}
