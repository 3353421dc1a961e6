// H200 check 4 of docs/preload.md: a program with the CUDA runtime linked statically
// (nvcc -cudart static) has no cudaMalloc symbol the shim could interpose; its runtime reaches
// the driver through dlopen("libcuda.so.1") + dlsym + cuGetProcAddress, which the shim wraps.
// The allocations must still be seen, as "user" (the static runtime's code is in this program).
//
//   nvcc -O2 -cudart static -I$REPO static_cudart.cu -o static_cudart -ldl
//   LD_PRELOAD=libvramledger_preload.so ./static_cudart --expect-shim
//
// Prints one line "RESULT {json}" and exits 0 when every check passed (without --expect-shim it
// only checks the calls succeed, for the run without the shim).
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "abi/vramledger_preload.h"

namespace {

using StatsFn = int (*)(vramledger_preload_stats*);

std::string g_failures;

void check(bool ok, const char* what, long long actual, long long expected) {
  if (ok) return;
  char line[256];
  std::snprintf(line, sizeof(line), "%s%s: %lld, expected %lld", g_failures.empty() ? "" : "; ",
                what, actual, expected);
  g_failures += line;
}

bool read_stats(StatsFn fn, vramledger_preload_stats* out) {
  std::memset(out, 0, sizeof(*out));
  return fn != nullptr && fn(out) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool expect_shim = argc > 1 && std::strcmp(argv[1], "--expect-shim") == 0;
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    std::printf("RESULT {\"ok\": false, \"error\": \"no usable CUDA device (cudaSetDevice/cudaFree(0) failed)\"}\n");
    return 1;
  }
  const auto stats_fn =
      reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "vramledger_preload_get_stats"));
  if (expect_shim) check(stats_fn != nullptr, "shim API found", 0, 1);

  // Sizes chosen so no two are equal and none is a multiple of a page: the shim counts the
  // requested size, so the delta must match these exactly.
  const size_t sizes[] = {(size_t{3} << 20) + 123, (size_t{1} << 20) + 4097, 777};
  size_t expected_bytes = 0;
  for (size_t size : sizes) expected_bytes += size;
  const size_t async_bytes = (size_t{2} << 20) + 5;

  vramledger_preload_stats before{}, live{}, after{};
  read_stats(stats_fn, &before);
  void* pointers[3] = {};
  int failed_calls = 0;
  for (int i = 0; i < 3; ++i) failed_calls += cudaMalloc(&pointers[i], sizes[i]) != cudaSuccess;
  // The stream-ordered path (cuMemAllocAsync through the runtime's entry-point table).
  cudaStream_t stream = nullptr;
  void* async_pointer = nullptr;
  failed_calls += cudaStreamCreate(&stream) != cudaSuccess;
  failed_calls += cudaMallocAsync(&async_pointer, async_bytes, stream) != cudaSuccess;
  failed_calls += cudaStreamSynchronize(stream) != cudaSuccess;
  read_stats(stats_fn, &live);
  for (void* pointer : pointers) failed_calls += cudaFree(pointer) != cudaSuccess;
  failed_calls += cudaFreeAsync(async_pointer, stream) != cudaSuccess;
  failed_calls += cudaStreamSynchronize(stream) != cudaSuccess;
  failed_calls += cudaStreamDestroy(stream) != cudaSuccess;
  read_stats(stats_fn, &after);
  check(failed_calls == 0, "failed CUDA calls", failed_calls, 0);

  const auto& user_before = before.categories[VRAMLEDGER_PRELOAD_USER];
  const auto& user_live = live.categories[VRAMLEDGER_PRELOAD_USER];
  const auto& user_after = after.categories[VRAMLEDGER_PRELOAD_USER];
  const long long seen_bytes = user_live.current_bytes - user_before.current_bytes;
  const long long seen_allocations = user_live.allocations - user_before.allocations;
  const long long seen_frees = user_after.frees - user_live.frees;
  long long other_bytes = 0;  // every category but user: nothing else allocated meanwhile
  for (int c = 0; c < VRAMLEDGER_PRELOAD_CATEGORY_COUNT; ++c) {
    // The routed cache's idle memory moves when it serves the calls (checked below).
    if (c == VRAMLEDGER_PRELOAD_USER || c == VRAMLEDGER_PRELOAD_ROUTED_CACHE) continue;
    other_bytes += live.categories[c].current_bytes - before.categories[c].current_bytes;
  }
  if (expect_shim) {
    check(seen_bytes == static_cast<long long>(expected_bytes + async_bytes),
          "user bytes seen while live", seen_bytes, static_cast<long long>(expected_bytes + async_bytes));
    check(seen_allocations == 4, "user allocations seen", seen_allocations, 4);
    check(other_bytes == 0, "bytes in other categories", other_bytes, 0);
    check(user_after.current_bytes == user_before.current_bytes, "user bytes after the frees",
          user_after.current_bytes, user_before.current_bytes);
    check(seen_frees == 4, "user frees seen", seen_frees, 4);
    check(after.untracked_frees == before.untracked_frees, "untracked frees",
          after.untracked_frees, before.untracked_frees);
    check(after.unwrapped_lookups == 0, "unwrapped lookups", after.unwrapped_lookups, 0);
  }
  // Routing mode (VRAMLEDGER_PRELOAD_ROUTE=1): the three cudaMalloc calls reach the driver's
  // cuMemAlloc through the static runtime's entry points and are served by the routed cache
  // (cudaMallocAsync is stream-ordered and never routed); the books balance while they live.
  const long long routed = live.routed_allocations - before.routed_allocations;
  if (expect_shim && live.route_state == 1) {
    check(routed == 3, "routed allocations", routed, 3);
    check(user_live.routed_current_bytes - user_before.routed_current_bytes ==
              static_cast<long long>(expected_bytes),
          "routed user bytes", user_live.routed_current_bytes - user_before.routed_current_bytes,
          static_cast<long long>(expected_bytes));
    const long long idle = live.categories[VRAMLEDGER_PRELOAD_ROUTED_CACHE].current_bytes;
    check(live.routed_reserved_bytes == live.routed_live_bytes + idle,
          "routed reserved = live + idle", live.routed_reserved_bytes, live.routed_live_bytes + idle);
    check(after.routed_failed == 0, "routed calls failed", after.routed_failed, 0);
  }
  std::printf(
      "RESULT {\"ok\": %s, \"shim\": %s, \"expected_bytes\": %zu, \"seen_bytes\": %lld, "
      "\"seen_allocations\": %lld, \"seen_frees\": %lld, \"other_category_bytes\": %lld, "
      "\"intercepted_calls\": %lld, \"untracked_frees\": %lld, \"unwrapped_lookups\": %lld, "
      "\"route_state\": %lld, \"routed_allocations\": %lld, \"failures\": \"%s\"}\n",
      g_failures.empty() ? "true" : "false", stats_fn ? "true" : "false",
      expected_bytes + async_bytes, seen_bytes, seen_allocations, seen_frees, other_bytes,
      static_cast<long long>(after.intercepted_calls), static_cast<long long>(after.untracked_frees),
      static_cast<long long>(after.unwrapped_lookups), static_cast<long long>(live.route_state),
      routed, g_failures.c_str());
  return g_failures.empty() ? 0 : 1;
}
