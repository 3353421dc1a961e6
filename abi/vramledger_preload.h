/* The C interface of libvramledger_preload.so (LD_PRELOAD shim; see docs/preload.md).
 *
 * Reach it with dlsym(RTLD_DEFAULT, "vramledger_preload_get_stats"): absent when the shim is not
 * loaded. All figures are for the whole process, every device together. */
#ifndef VRAMLEDGER_PRELOAD_H_
#define VRAMLEDGER_PRELOAD_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Who made an allocation, from the return address of the intercepted call. */
enum vramledger_preload_category {
  VRAMLEDGER_PRELOAD_NCCL = 0,
  VRAMLEDGER_PRELOAD_CUBLAS = 1,      /* libcublas, libcublasLt */
  VRAMLEDGER_PRELOAD_CUDNN = 2,
  VRAMLEDGER_PRELOAD_TRITON = 3,      /* code under a triton/ path */
  VRAMLEDGER_PRELOAD_JIT = 4,         /* no object maps the caller: JIT'd code (unknown/JIT) */
  VRAMLEDGER_PRELOAD_TORCH = 5,       /* libc10_cuda, libtorch_cuda: torch's own allocator lines */
  VRAMLEDGER_PRELOAD_VRAMLEDGER = 6,  /* libvramledger*: already in the ledger, never non-torch */
  VRAMLEDGER_PRELOAD_USER = 7,        /* any other named object: the program, its extensions */
  VRAMLEDGER_PRELOAD_UNKNOWN = 8,     /* caller hidden (e.g. inside libcudart's own helpers) */
  /* Routing mode only (VRAMLEDGER_PRELOAD_ROUTE): memory vramledger's routed cache holds beyond
   * the routed allocations counted in the lines above (cached blocks, rounding). Its live and
   * allocation counts stay 0; current and peak are the cache's idle bytes. */
  VRAMLEDGER_PRELOAD_ROUTED_CACHE = 9,
  VRAMLEDGER_PRELOAD_CATEGORY_COUNT = 10
};

typedef struct vramledger_preload_category_stats {
  int64_t current_bytes;
  int64_t peak_bytes;
  int64_t live_allocations;
  int64_t allocations;   /* successful allocating calls, running total */
  int64_t frees;         /* successful freeing calls of memory this category allocated */
  int64_t failed_calls;  /* allocating calls the real function refused (error passed through) */
  int64_t routed_current_bytes;  /* part of current_bytes served by the routed cache */
} vramledger_preload_category_stats;

typedef struct vramledger_preload_stats {
  vramledger_preload_category_stats categories[VRAMLEDGER_PRELOAD_CATEGORY_COUNT];
  /* Sum over NCCL, cuBLAS, cuDNN, Triton, JIT, user, unknown, routed cache: the non-torch lines.
   * torch and vramledger are excluded (the torch lines already hold them). */
  int64_t non_torch_current_bytes;
  int64_t intercepted_calls;     /* every call through a wrapper, nested ones included */
  int64_t table_capacity;        /* fixed size of the allocation table */
  int64_t table_live;            /* records held now */
  int64_t table_overflow;        /* allocations not recorded because the table was full */
  int64_t table_overflow_bytes;  /* their bytes (in no category: a loud, known gap) */
  int64_t untracked_frees;       /* successful frees of pointers/handles never recorded */
  int64_t unwrapped_lookups;     /* memory entry points handed out unwrapped (unknown ABI) */
  int64_t torch_install;         /* 0 not tried, 1 installed, -1 refused or failed */
  /* Routing mode (docs/preload.md): 0 off, 1 on, -1 asked for but not possible. */
  int64_t route_state;
  int64_t routed_reserved_bytes;  /* what the routed cache holds from the driver */
  int64_t routed_reserved_peak_bytes;
  int64_t routed_live_bytes;      /* routed allocations not yet freed (in their categories) */
  int64_t routed_allocations;     /* running total of allocations the cache served */
  int64_t routed_declined;        /* routable calls passed to the driver (no primary context) */
  int64_t routed_failed;          /* routed calls that returned an error */
} vramledger_preload_stats;

/* Fills *out. Returns 0, or -1 when out is NULL. */
__attribute__((visibility("default"))) int vramledger_preload_get_stats(vramledger_preload_stats* out);
/* Name of a category ("nccl", "cublas", ..., "unknown"); NULL when out of range. */
__attribute__((visibility("default"))) const char* vramledger_preload_category_name(int category);
/* Routing mode: returns the routed cache's idle memory to the driver; the bytes released (0 when
 * routing is off). */
__attribute__((visibility("default"))) int64_t vramledger_preload_route_release_idle(void);
/* Total nanoseconds spent in the shim's own bookkeeping (not in the real functions) so far. */
__attribute__((visibility("default"))) uint64_t vramledger_preload_overhead_ns(void);

#ifdef __cplusplus
}
#endif

#endif /* VRAMLEDGER_PRELOAD_H_ */
