/* vramledger's C interface, exported by libvramledger_torch.so.
 *
 * Two ways to use vramledger from PyTorch:
 *  - vramledger_install(): vramledger becomes torch's CUDA allocator (full replacement; every
 *    torch.cuda memory API answers with vramledger's numbers, CUDA graphs work).
 *  - vramledger_malloc / vramledger_free: the functions torch.cuda.memory.CUDAPluggableAllocator
 *    and torch.cuda.MemPool take. With a pluggable allocator torch's own memory statistics
 *    raise, so read vramledger's with vramledger_stats_json / vramledger_get_stats.
 * Both share one vramledger instance per process, configured by the first call that needs it
 * (vramledger_install's argument, else the VRAMLEDGER_CONF environment variable).
 *
 * Strings returned through (buffer, capacity) follow snprintf: the result is the full length
 * without the terminating NUL; at most capacity - 1 bytes are written, always NUL-terminated
 * when capacity > 0.
 */
#ifndef VRAMLEDGER_C_API_H_
#define VRAMLEDGER_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VRAMLEDGER_API __attribute__((visibility("default")))

typedef struct CUstream_st* vramledger_stream_t; /* the same type as cudaStream_t */

/* Installs vramledger as torch's CUDA allocator. conf: PYTORCH_CUDA_ALLOC_CONF-style
 * "key:value,..." (allocator/config.hpp); NULL or "" for defaults. Returns 0 on success, -1 on
 * refusal or error (the reason in vramledger_last_error()). Refused once torch's own allocator
 * has allocated CUDA memory. Installing twice with the same conf is a no-op. */
VRAMLEDGER_API int vramledger_install(const char* conf);
VRAMLEDGER_API int vramledger_is_installed(void);
/* The last error of this thread's vramledger_* calls ("" if none). */
VRAMLEDGER_API const char* vramledger_last_error(void);

/* For CUDAPluggableAllocator / MemPool. vramledger_malloc throws c10::OutOfMemoryError (a C++
 * exception, which torch expects of an allocator) when memory runs out; vramledger_try_malloc
 * returns NULL instead. */
VRAMLEDGER_API void* vramledger_malloc(size_t size, int device, vramledger_stream_t stream);
VRAMLEDGER_API void* vramledger_try_malloc(size_t size, int device, vramledger_stream_t stream);
VRAMLEDGER_API void vramledger_free(void* ptr, size_t size, int device, vramledger_stream_t stream);

/* One statistic, with torch's meaning (current, peak since the last peak reset, and running
 * totals of increases and decreases since the last accumulated reset). */
typedef struct vramledger_stat {
  int64_t current;
  int64_t peak;
  int64_t allocated;
  int64_t freed;
} vramledger_stat;

/* Aggregate (all pools) figures of one device, torch's memory_stats keys. */
typedef struct vramledger_stats {
  vramledger_stat allocation;
  vramledger_stat segment;
  vramledger_stat active;
  vramledger_stat inactive_split;
  vramledger_stat allocated_bytes;
  vramledger_stat reserved_bytes;
  vramledger_stat active_bytes;
  vramledger_stat inactive_split_bytes;
  vramledger_stat requested_bytes;
  vramledger_stat mapped_bytes;
  vramledger_stat virtual_bytes;
  int64_t num_alloc_retries;
  int64_t num_ooms;
  int64_t num_device_alloc;
  int64_t num_device_free;
} vramledger_stats;

/* Fills *out for `device` (zeros for a device vramledger never used). Returns 0, or -1 for an
 * invalid device. */
VRAMLEDGER_API int vramledger_get_stats(int device, vramledger_stats* out);
/* Every statistic as JSON: an object for `device`, or for device == -1 a list with one object
 * per device vramledger used. */
VRAMLEDGER_API size_t vramledger_stats_json(int device, char* buffer, size_t capacity);
/* A human-readable account of every device vramledger used. */
VRAMLEDGER_API size_t vramledger_report(char* buffer, size_t capacity);

/* This process's memory on `device` split into additive lines (docs/classification.md): torch's
 * lines from vramledger's ledger, one line per library from the LD_PRELOAD shim
 * (libvramledger_preload.so) when it is loaded in the process (else none: non-torch memory is
 * then inside the remainder, whose label says so), and the remainder (context, modules,
 * driver), summing exactly to NVML's per-process used memory; other processes apart. Without
 * NVML per-process data (no NVML, some containers, the simulated device) process usage is the
 * device's used memory (NVML, else cudaMemGetInfo) and a CAVEAT says what the remainder then
 * holds. A negative remainder is reported as MISSING HOOK, never clamped.
 * format: "text" (NULL or "" too) or "json" (docs/report_schema.md, "Process report").
 * Returns a NUL-terminated string owned by the calling thread, valid until this thread's next
 * vramledger_process_report call (do not free it); NULL for an invalid device or format, or on
 * error, with the reason in vramledger_last_error(). Costs an NVML initialisation on the first
 * call per device (tens of ms), a few NVML queries after. */
VRAMLEDGER_API const char* vramledger_process_report(int device, const char* format);

VRAMLEDGER_API int vramledger_empty_cache(void);
VRAMLEDGER_API void vramledger_reset_peak_stats(int device);
VRAMLEDGER_API void vramledger_reset_accumulated_stats(int device);

/* Allocations made by this thread until the matching pop are counted under tag `name`
 * ("weights", "kv_cache", ...). Scopes nest. Returns 0, or -1 for an invalid name. */
VRAMLEDGER_API int vramledger_tag_push(const char* name);
VRAMLEDGER_API void vramledger_tag_pop(void);

/* A sentence appended to this process's out-of-memory messages on `device` (NULL or "" removes
 * it). The budget board (docs/board.md) keeps it naming the other instances on the GPU and what
 * they hold and claim. Returns 0, or -1 for an invalid device. */
VRAMLEDGER_API int vramledger_set_oom_note(int device, const char* note);

/* Sleep and wake by tag (docs/sleep.md): for serving engines that give a model's memory back
 * between jobs. vramledger_sleep waits for the device, then the physical memory under every live
 * allocation of `tags` on `device` goes back to the driver while its addresses stay reserved:
 * tensor pointers and captured CUDA graphs stay valid for after the wake. Tags in `offload` are
 * copied to pinned host memory first and restored by vramledger_wake; the others come back with
 * undefined contents (a KV cache). tags, offload: comma-separated tag names as given to
 * vramledger_tag_push ("weights,kv_cache"; offload may be NULL or ""). vramledger_wake: tags NULL
 * or "" wakes every sleeping tag. The tags of the default pool sleep over the VMM backend; the
 * name "graphs" (in tags, offload, wake) stands for every CUDA graph private pool of the device,
 * which sleeps whole (free blocks included) and wakes at the same addresses, so a captured graph
 * replays bitwise the same (VMM backend only; docs/sleep.md). Returns 0 and fills *out (if not
 * NULL); -1 for a refusal or error (an unknown tag, a tag already asleep or not asleep, a CUDA
 * graph capture underway, a block of the tag still awaiting other streams: nothing changed);
 * -2 when a wake finds too little device memory: the tags stay asleep, nothing lost, wake again
 * later. The reason is in vramledger_last_error(). Freeing a sleeping tensor, or allocating under
 * a sleeping tag, fails with an error naming the tag. */
typedef struct vramledger_sleep_result {
  uint64_t blocks;
  uint64_t bytes;           /* block bytes put to sleep or woken */
  uint64_t offloaded_bytes; /* copied to the host (sleep) or back (wake) */
  uint64_t released_bytes;  /* sleep: physical bytes given back to the driver */
  uint64_t mapped_bytes;    /* wake: block bytes that had no memory and have it again */
  uint64_t resident_bytes;  /* sleep: sleeping bytes on pages kept for awake neighbours */
} vramledger_sleep_result;
VRAMLEDGER_API int vramledger_sleep(int device, const char* tags, const char* offload,
                                    vramledger_sleep_result* out);
VRAMLEDGER_API int vramledger_wake(int device, const char* tags, vramledger_sleep_result* out);
/* Pins host memory now for the next vramledger_sleep's offload of `tags` (each tag's allocated
 * bytes) and keeps it, so that sleep pays only for the copy: call once at start-up, after the
 * weights are loaded (pinning 8 GiB takes seconds). Returns 0 and sets *kept_bytes (if not NULL)
 * to the host bytes ready for these tags; -1 with vramledger_last_error() otherwise. */
VRAMLEDGER_API int vramledger_prepare_offload(int device, const char* tags, uint64_t* kept_bytes);
/* Every private memory pool of `device` (CUDA graph pools, torch.cuda.MemPool) as a JSON array:
 * id, use_count, segments, blocks, reserved_bytes, live_bytes, requested_bytes, cached_bytes,
 * largest_free_bytes, fragmentation_bytes, recounted from the pool's blocks (exact;
 * docs/graphs.md defines each). "[]" for a device vramledger never used. snprintf-style. */
VRAMLEDGER_API size_t vramledger_graph_pools(int device, char* buffer, size_t capacity);
/* The sleeping tags of `device`, comma-separated (snprintf-style result). */
VRAMLEDGER_API size_t vramledger_sleeping_tags(int device, char* buffer, size_t capacity);

#ifdef __cplusplus
}
#endif

#endif /* VRAMLEDGER_C_API_H_ */
