/* The C interface between the preload shim and libvramledger_route.so, the optional cache that
 * serves non-torch cuMemAlloc / cudaMalloc calls (VRAMLEDGER_PRELOAD_ROUTE; docs/preload.md).
 *
 * The shim dlopen's the library only when routing is asked for, so programs that do not route
 * never load libstdc++ or the allocator through the shim. Every function is thread-safe and
 * never throws. Driver results are CUresult values (0 = success). */
#ifndef VRAMLEDGER_PRELOAD_ROUTE_API_H_
#define VRAMLEDGER_PRELOAD_ROUTE_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Not a CUresult: the call is not one for the routed cache (no current primary context, a
 * pointer it does not own); the shim then calls the real driver function. */
#define VRAMLEDGER_ROUTE_DECLINED (-1)

/* The real driver function named `symbol` ("cuMemAlloc_v2", "cuCtxSynchronize", ...), bypassing
 * the shim's hooks; NULL when libcuda is not loaded (yet). */
typedef void* (*vramledger_route_resolve_fn)(const char* symbol);

typedef struct vramledger_route_stats {
  int64_t reserved_bytes;       /* device memory the routed cache holds from the driver */
  int64_t reserved_peak_bytes;
  int64_t live_bytes;           /* requested bytes of routed allocations not yet freed */
  int64_t idle_bytes;           /* reserved - live: cached, rounding, split remainders (>= 0) */
  int64_t idle_peak_bytes;      /* largest idle_bytes after any routed call */
  int64_t allocations;          /* routed allocations served, running total */
  int64_t frees;                /* routed frees, running total */
  int64_t declined;             /* allocation calls passed to the driver (no primary context) */
  int64_t failed;               /* routed calls that returned an error to the caller */
  int64_t devices;              /* devices with a routed cache */
} vramledger_route_stats;

/* Once, before any other call. config: allocator keys (allocator/config.hpp; backend must be
 * auto or cuda_malloc), NULL or "" for defaults. Returns 0, or -1 with a message in error. */
__attribute__((visibility("default"))) int vramledger_route_init(vramledger_route_resolve_fn resolve,
                                                                 const char* config, char* error,
                                                                 size_t error_size);
/* An allocation of `bytes` (> 0) in the calling thread's current context, when that is a
 * device's primary context; otherwise VRAMLEDGER_ROUTE_DECLINED. */
__attribute__((visibility("default"))) int vramledger_route_alloc(uint64_t bytes, uint64_t* out);
/* Frees `pointer` if the routed cache handed it out, after the device finished its queued work
 * (cudaFree's and cuMemFree's implicit synchronisation); otherwise VRAMLEDGER_ROUTE_DECLINED.
 * When that synchronisation fails its error is returned and the allocation stays live. */
__attribute__((visibility("default"))) int vramledger_route_free(uint64_t pointer);
/* Returns cached memory nobody uses to the driver; the bytes released. */
__attribute__((visibility("default"))) int64_t vramledger_route_release_idle(void);
/* Forgets `device`'s routed cache without freeing anything: its primary context is about to be
 * reset, which frees all of it. */
__attribute__((visibility("default"))) void vramledger_route_forget_device(int device);
__attribute__((visibility("default"))) void vramledger_route_get_stats(vramledger_route_stats* out);

#ifdef __cplusplus
}
#endif

#endif /* VRAMLEDGER_PRELOAD_ROUTE_API_H_ */
