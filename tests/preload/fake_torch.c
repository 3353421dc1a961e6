/* Test doubles for the torch side: built as libc10_cuda.so (torch's CUDA library, whose
 * allocations the shim counts as torch) and libvramledger_torch_fake.so (a stand-in plugin whose
 * vramledger_install records that it was called). */
#include <stddef.h>

#include "fake_cuda.h"

#define EXPORT __attribute__((visibility("default")))

#ifdef FAKE_C10_CUDA
EXPORT CUresult c10_fake_alloc(CUdeviceptr* dptr, size_t bytes) { return cuMemAlloc_v2(dptr, bytes); }
EXPORT CUresult c10_fake_free(CUdeviceptr dptr) { return cuMemFree_v2(dptr); }
#else
static int g_install_calls;
EXPORT int vramledger_install(const char* conf) {
  (void)conf;
  ++g_install_calls;
  return 0;
}
EXPORT const char* vramledger_last_error(void) { return ""; }
EXPORT int fake_plugin_install_calls(void) { return g_install_calls; }
#endif
