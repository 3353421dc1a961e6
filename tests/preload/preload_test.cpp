// Runs under LD_PRELOAD=libvramledger_preload.so with the fake driver (fake_cuda_driver.c), and
// without it. Modes:
//   check   every call's result on stdout as "RESULT ..." lines (the harness compares the runs);
//           with the shim loaded, also asserts the shim saw and attributed every byte.
//   torch   dlopen's libc10_cuda.so and checks the shim installed the (fake) plugin and counts
//           torch's allocations as torch, outside the non-torch total.
//   route   with VRAMLEDGER_PRELOAD_ROUTE=1: non-torch cuMemAlloc / cudaMalloc served by the routed
//           cache; every figure still reconciles with the (fake) driver's live bytes.
//   bench N time per alloc+free pair through direct calls (compare with and without the shim).
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "abi/vramledger_preload.h"
#include "tests/preload/fake_cuda.h"

namespace {

int g_failures = 0;

#define EXPECT_EQ(actual, expected)                                                        \
  do {                                                                                     \
    const long long a_ = static_cast<long long>(actual);                                   \
    const long long e_ = static_cast<long long>(expected);                                 \
    if (a_ != e_) {                                                                        \
      std::fprintf(stderr, "FAIL %s:%d: %s = %lld, expected %lld\n", __FILE__, __LINE__,   \
                   #actual, a_, e_);                                                       \
      ++g_failures;                                                                        \
    }                                                                                      \
  } while (0)

void result(const char* what, long long value) { std::printf("RESULT %s %lld\n", what, value); }

using StatsFn = int (*)(vramledger_preload_stats*);

StatsFn shim_stats() {
  return reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "vramledger_preload_get_stats"));
}

vramledger_preload_stats read_stats() {
  vramledger_preload_stats stats{};
  if (StatsFn fn = shim_stats()) fn(&stats);
  return stats;
}

const vramledger_preload_category_stats& cat(const vramledger_preload_stats& s, int c) {
  return s.categories[c];
}

void check_health(const vramledger_preload_stats& s) {
  EXPECT_EQ(s.table_overflow, 0);
  EXPECT_EQ(s.untracked_frees, 0);
  EXPECT_EQ(s.unwrapped_lookups, 0);
}

// Several threads allocate and free through all three paths at once.
void threaded(bool with_shim) {
  constexpr int kThreads = 4;
  constexpr int kIterations = 3000;
  const vramledger_preload_stats before = read_stats();
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &errors] {
      std::vector<CUdeviceptr> live;
      for (int i = 0; i < kIterations; ++i) {
        CUdeviceptr p = 0;
        const int how = (i + t) % 3;
        if (nccl_fake_alloc(how, &p, 64 + static_cast<size_t>((i * 7 + t) % 512)) != 0) ++errors;
        live.push_back(p);
        if (live.size() > 8) {
          if (nccl_fake_free(how, live.front()) != 0) ++errors;
          live.erase(live.begin());
        }
      }
      for (CUdeviceptr p : live) {
        if (cuMemFree_v2(p) != 0) ++errors;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  result("threaded_errors", errors.load());
  if (!with_shim) return;
  const vramledger_preload_stats after = read_stats();
  EXPECT_EQ(cat(after, VRAMLEDGER_PRELOAD_NCCL).allocations -
                cat(before, VRAMLEDGER_PRELOAD_NCCL).allocations,
            kThreads * kIterations);
  EXPECT_EQ(cat(after, VRAMLEDGER_PRELOAD_NCCL).current_bytes, 0);
  // Frees from the test program of NCCL's memory still decrement NCCL's line.
  EXPECT_EQ(cat(after, VRAMLEDGER_PRELOAD_NCCL).frees - cat(before, VRAMLEDGER_PRELOAD_NCCL).frees,
            kThreads * kIterations);
  EXPECT_EQ(after.non_torch_current_bytes, fake_cuda_live_bytes());
  check_health(after);
}

int check_mode() {
  const bool with_shim = shim_stats() != nullptr;
  std::fprintf(stderr, "preload_test: shim %s\n", with_shim ? "loaded" : "absent");

  // (1) NCCL: direct call, cuGetProcAddress pointer, dlsym pointer.
  CUdeviceptr nccl[3] = {};
  long long nccl_bytes = 0;
  for (int how = 0; how < 3; ++how) {
    const size_t bytes = 1000 + 10 * static_cast<size_t>(how);
    result("nccl_alloc", nccl_fake_alloc(how, &nccl[how], bytes));
    nccl_bytes += static_cast<long long>(bytes);
  }
  // (2) User code: every driver function, directly.
  CUdeviceptr a = 0, pitched = 0, managed = 0, async = 0;
  size_t pitch = 0;
  CUmemGenericAllocationHandle handle = 0;
  result("user_alloc", cuMemAlloc_v2(&a, 5000));
  result("user_pitch", cuMemAllocPitch_v2(&pitched, &pitch, 100, 3, 4));
  result("pitch", static_cast<long long>(pitch));
  result("user_managed", cuMemAllocManaged(&managed, 700, 1));
  result("user_async", cuMemAllocAsync(&async, 300, nullptr));
  result("user_create", cuMemCreate(&handle, 4096, nullptr, 0));
  // (3) Through the (fake) runtime, which calls the driver through fetched pointers: counted once.
  void* runtime = nullptr;
  result("user_cuda_malloc", cudaMalloc(&runtime, 2048));
  // ... and its per-thread-default-stream twin, directly and through dlsym on libcudart.
  void* runtime_ptsz = nullptr;
  result("user_cuda_malloc_async_ptsz", cudaMallocAsync_ptsz(&runtime_ptsz, 1536, nullptr));
  using MallocAsync = cudaError_t (*)(void**, size_t, cudaStream_t);
  void* cudart = dlopen("libcudart.so.12", RTLD_NOW | RTLD_NOLOAD);
  auto looked_up = cudart ? reinterpret_cast<MallocAsync>(dlsym(cudart, "cudaMallocAsync_ptsz")) : nullptr;
  void* runtime_ptsz_dlsym = nullptr;
  result("user_cuda_malloc_async_ptsz_dlsym",
         looked_up ? looked_up(&runtime_ptsz_dlsym, 1024, nullptr) : -1);
  const long long user_bytes =
      5000 + static_cast<long long>(pitch) * 3 + 700 + 300 + 4096 + 2048 + 1536 + 1024;
  // (4) Errors pass through unchanged.
  CUdeviceptr refused = 0;
  result("error_direct", cuMemAlloc_v2(&refused, FAKE_CUDA_ERROR_SIZE));
  result("error_proc_address", nccl_fake_alloc(1, &refused, FAKE_CUDA_ERROR_SIZE));
  void* refused_runtime = nullptr;
  result("error_runtime", cudaMalloc(&refused_runtime, FAKE_CUDA_ERROR_SIZE));
  result("live_bytes", fake_cuda_live_bytes());

  if (with_shim) {
    const vramledger_preload_stats s = read_stats();
    EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_NCCL).current_bytes, nccl_bytes);
    EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_NCCL).live_allocations, 3);
    EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_NCCL).failed_calls, 1);
    EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_USER).current_bytes, user_bytes);
    EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_USER).live_allocations, 8);
    EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_USER).failed_calls, 2);
    EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_UNKNOWN).current_bytes, 0);  // cudart's nested call
    EXPECT_EQ(s.non_torch_current_bytes, fake_cuda_live_bytes());     // every byte seen
    EXPECT_EQ(s.table_live, 11);
    check_health(s);
  }

  // (5) Frees decrement, whichever path frees.
  result("nccl_free0", nccl_fake_free(2, nccl[0]));
  result("nccl_free1", nccl_fake_free(0, nccl[1]));
  result("nccl_free2", nccl_fake_free(1, nccl[2]));
  result("user_free", cuMemFree_v2(a));
  result("user_free_pitch", cuMemFree_v2(pitched));
  result("user_free_managed", cuMemFree_v2(managed));
  result("user_free_async", cuMemFreeAsync(async, nullptr));
  result("user_release", cuMemRelease(handle));
  result("user_cuda_free", cudaFree(runtime));
  result("user_cuda_free_async_ptsz", cudaFreeAsync_ptsz(runtime_ptsz, nullptr));
  result("user_cuda_free_async_ptsz_dlsym", cudaFreeAsync_ptsz(runtime_ptsz_dlsym, nullptr));
  result("live_bytes_after_free", fake_cuda_live_bytes());
  if (with_shim) {
    const vramledger_preload_stats s = read_stats();
    for (int c = 0; c < VRAMLEDGER_PRELOAD_CATEGORY_COUNT; ++c) EXPECT_EQ(s.categories[c].current_bytes, 0);
    EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_NCCL).peak_bytes, nccl_bytes);
    EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_USER).peak_bytes, user_bytes);
    EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_USER).frees, 8);
    EXPECT_EQ(s.table_live, 0);
    check_health(s);
  }

  // (6) Thread safety.
  threaded(with_shim);
  std::fprintf(stderr, "preload_test: %d failure(s)\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}

using ReleaseIdleFn = int64_t (*)();

// The shim's total for non-torch memory must equal what the driver holds, byte for byte: routed
// allocations in their libraries' lines plus the cache's idle memory, plus unrouted memory.
void expect_reconciled(const char* where) {
  const vramledger_preload_stats s = read_stats();
  if (s.non_torch_current_bytes != fake_cuda_live_bytes()) {
    std::fprintf(stderr, "at %s:\n", where);
  }
  EXPECT_EQ(s.non_torch_current_bytes, fake_cuda_live_bytes());
  EXPECT_EQ(s.routed_reserved_bytes,
            s.routed_live_bytes + cat(s, VRAMLEDGER_PRELOAD_ROUTED_CACHE).current_bytes);
  check_health(s);
}

void routed_threads() {
  constexpr int kThreads = 4;
  constexpr int kIterations = 2000;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &errors] {
      fake_cuda_make_current(0, 1);  // the current context is per thread
      std::vector<CUdeviceptr> live;
      for (int i = 0; i < kIterations; ++i) {
        CUdeviceptr p = 0;
        if (cuMemAlloc_v2(&p, 256 + static_cast<size_t>((i * 13 + t) % 4096)) != 0) ++errors;
        live.push_back(p);
        if (live.size() > 6) {
          if (cuMemFree_v2(live.front()) != 0) ++errors;
          live.erase(live.begin());
        }
      }
      for (CUdeviceptr p : live) {
        if (cuMemFree_v2(p) != 0) ++errors;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(errors.load(), 0);
  const vramledger_preload_stats s = read_stats();
  EXPECT_EQ(s.routed_live_bytes, 0);
  EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_USER).routed_current_bytes, 0);
  expect_reconciled("after the threads");
}

int route_mode() {
  if (shim_stats() == nullptr) {
    std::fprintf(stderr, "route mode needs the shim\n");
    return 1;
  }
  EXPECT_EQ(read_stats().route_state, 1);
  // (1) No current context: nothing to route to; the driver serves it and it is counted as usual.
  fake_cuda_make_current(-1, 0);
  CUdeviceptr early = 0;
  EXPECT_EQ(cuMemAlloc_v2(&early, 4000), 0);
  vramledger_preload_stats s = read_stats();
  EXPECT_EQ(s.routed_declined, 1);
  EXPECT_EQ(s.routed_allocations, 0);
  EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_USER).current_bytes, 4000);
  EXPECT_EQ(fake_cuda_live_bytes(), 4000);

  // (2) The primary context current: served by the cache, attributed to its caller.
  fake_cuda_make_current(0, 1);
  CUdeviceptr a = 0;
  EXPECT_EQ(cuMemAlloc_v2(&a, 1000), 0);
  s = read_stats();
  EXPECT_EQ(s.routed_allocations, 1);
  EXPECT_EQ(s.routed_live_bytes, 1000);
  EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_USER).current_bytes, 5000);
  EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_USER).routed_current_bytes, 1000);
  const long long segment = fake_cuda_live_bytes() - 4000;  // the cache's first segment
  EXPECT_EQ(segment > 1000, true);
  EXPECT_EQ(s.routed_reserved_bytes, segment);
  EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_ROUTED_CACHE).current_bytes, segment - 1000);
  expect_reconciled("first routed allocation");

  // (3) A free synchronises the device (cudaFree's semantics) and keeps the memory cached.
  const long long syncs = fake_cuda_synchronizations();
  EXPECT_EQ(cuMemFree_v2(a), 0);
  EXPECT_EQ(fake_cuda_synchronizations(), syncs + 1);
  EXPECT_EQ(fake_cuda_live_bytes(), 4000 + segment);
  s = read_stats();
  EXPECT_EQ(s.routed_live_bytes, 0);
  EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_USER).current_bytes, 4000);
  EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_ROUTED_CACHE).current_bytes, segment);
  expect_reconciled("routed free");

  // (4) Reuse without the driver; the runtime routes too (fake libcudart is never entered).
  CUdeviceptr b = 0;
  EXPECT_EQ(cuMemAlloc_v2(&b, 1000), 0);
  void* runtime = nullptr;
  EXPECT_EQ(cudaMalloc(&runtime, 3000), 0);
  EXPECT_EQ(fake_cuda_live_bytes(), 4000 + segment);
  EXPECT_EQ(read_stats().routed_allocations, 3);
  expect_reconciled("cache hits");

  // (5) Bad frees are refused with the driver's error and lose nothing: a double free of a
  // routed block (which could otherwise reach the driver and free the cache's segment) and an
  // interior pointer.
  EXPECT_EQ(cuMemFree_v2(b), 0);
  EXPECT_EQ(cuMemFree_v2(b), 1);
  EXPECT_EQ(cudaFree(static_cast<char*>(runtime) + 8), 1);
  EXPECT_EQ(fake_cuda_live_bytes(), 4000 + segment);
  EXPECT_EQ(read_stats().untracked_frees, 0);

  // (6) A failed synchronisation is returned and the block stays live; the retry frees it.
  fake_cuda_fail_next_synchronize(700);  // CUDA_ERROR_ILLEGAL_ADDRESS from earlier work
  EXPECT_EQ(cudaFree(runtime), 700);
  EXPECT_EQ(read_stats().routed_live_bytes, 3000);
  EXPECT_EQ(cudaFree(runtime), 0);
  EXPECT_EQ(read_stats().routed_live_bytes, 0);
  expect_reconciled("failed synchronisation");

  // (7) Not routed: NCCL (default set), a context the program created, zero-byte calls.
  CUdeviceptr nccl = 0;
  EXPECT_EQ(nccl_fake_alloc(1, &nccl, 5000), 0);
  EXPECT_EQ(cat(read_stats(), VRAMLEDGER_PRELOAD_NCCL).routed_current_bytes, 0);
  EXPECT_EQ(fake_cuda_live_bytes(), 4000 + segment + 5000);
  fake_cuda_make_current(0, 0);
  CUdeviceptr own_context = 0;
  EXPECT_EQ(cuMemAlloc_v2(&own_context, 700), 0);
  EXPECT_EQ(read_stats().routed_declined, 2);
  fake_cuda_make_current(0, 1);
  CUdeviceptr zero = 0;
  EXPECT_EQ(cuMemAlloc_v2(&zero, 0), 1);  // the driver's own answer
  expect_reconciled("unrouted calls");

  // (8) Out of memory: the cache gives back its idle memory and retries, then reports the
  // driver's error; nothing is recorded.
  CUdeviceptr kept = 0;
  EXPECT_EQ(cuMemAlloc_v2(&kept, 100), 0);
  fake_cuda_set_capacity(fake_cuda_live_bytes() + (1 << 20));
  CUdeviceptr big = 0;
  EXPECT_EQ(cuMemAlloc_v2(&big, 64u << 20), 2);
  void* big_runtime = nullptr;
  EXPECT_EQ(cudaMalloc(&big_runtime, 64u << 20), 2);
  s = read_stats();
  EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_USER).failed_calls, 3);  // with the zero-byte call
  // Two bad frees, the failed synchronisation, the two refused allocations.
  EXPECT_EQ(s.routed_failed, 5);
  fake_cuda_set_capacity(0);
  EXPECT_EQ(cuMemFree_v2(kept), 0);
  expect_reconciled("out of memory");

  // (9) Idle memory goes back on request.
  auto release = reinterpret_cast<ReleaseIdleFn>(
      dlsym(RTLD_DEFAULT, "vramledger_preload_route_release_idle"));
  const long long before_release = fake_cuda_live_bytes();
  const long long released = release != nullptr ? release() : -1;
  EXPECT_EQ(released > 0, true);
  EXPECT_EQ(fake_cuda_live_bytes(), before_release - released);
  EXPECT_EQ(read_stats().routed_reserved_bytes, 0);
  expect_reconciled("release idle");

  // (10) Threads.
  routed_threads();

  // (11) A reset frees the context's memory: the cache forgets its segments (without freeing
  // them) and starts afresh.
  CUdeviceptr before_reset = 0;
  EXPECT_EQ(cuMemAlloc_v2(&before_reset, 2000), 0);
  EXPECT_EQ(cuDevicePrimaryCtxReset_v2(0), 0);
  s = read_stats();
  EXPECT_EQ(s.routed_reserved_bytes, 0);
  EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_ROUTED_CACHE).current_bytes, 0);
  CUdeviceptr after_reset = 0;
  EXPECT_EQ(cuMemAlloc_v2(&after_reset, 2000), 0);
  EXPECT_EQ(read_stats().routed_live_bytes, 2000);
  EXPECT_EQ(cudaDeviceReset(), 0);
  EXPECT_EQ(read_stats().routed_reserved_bytes, 0);
  EXPECT_EQ(fake_cuda_resets(), 2);

  EXPECT_EQ(cuMemFree_v2(early), 0);
  EXPECT_EQ(cuMemFree_v2(nccl), 0);
  EXPECT_EQ(cuMemFree_v2(own_context), 0);
  std::fprintf(stderr, "preload_test route: %d failure(s)\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}

int torch_mode() {
  void* c10 = dlopen("libc10_cuda.so", RTLD_NOW | RTLD_GLOBAL);
  if (c10 == nullptr) {
    std::fprintf(stderr, "cannot load libc10_cuda.so: %s\n", dlerror());
    return 1;
  }
  using CallsFn = int (*)();
  auto calls = reinterpret_cast<CallsFn>(dlsym(RTLD_DEFAULT, "fake_plugin_install_calls"));
  EXPECT_EQ(calls != nullptr, 1);
  if (calls) EXPECT_EQ(calls(), 1);
  using AllocFn = CUresult (*)(CUdeviceptr*, size_t);
  using FreeFn = CUresult (*)(CUdeviceptr);
  auto alloc = reinterpret_cast<AllocFn>(dlsym(c10, "c10_fake_alloc"));
  auto release = reinterpret_cast<FreeFn>(dlsym(c10, "c10_fake_free"));
  CUdeviceptr p = 0;
  EXPECT_EQ(alloc(&p, 12345), 0);
  vramledger_preload_stats s = read_stats();
  EXPECT_EQ(s.torch_install, 1);
  EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_TORCH).current_bytes, 12345);
  EXPECT_EQ(s.non_torch_current_bytes, 0);
  EXPECT_EQ(release(p), 0);
  s = read_stats();
  EXPECT_EQ(cat(s, VRAMLEDGER_PRELOAD_TORCH).current_bytes, 0);
  // Loading another library afterwards must not install twice.
  void* again = dlopen("libnccl_fake.so", RTLD_NOW);
  EXPECT_EQ(again != nullptr, 1);
  if (calls) EXPECT_EQ(calls(), 1);
  std::fprintf(stderr, "preload_test torch: %d failure(s)\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}

int bench_mode(long iterations) {
  using Clock = std::chrono::steady_clock;
  void* fetched = nullptr;
  vl_cuGetProcAddress_v2_t get = reinterpret_cast<vl_cuGetProcAddress_v2_t>(
      dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuGetProcAddress_v2"));
  get("cuMemAlloc", &fetched, 12000, 0, nullptr);
  auto fetched_alloc = reinterpret_cast<vl_cuMemAlloc_v2_t>(fetched);
  for (int round = 0; round < 2; ++round) {  // round 0 warms up
    const auto start = Clock::now();
    for (long i = 0; i < iterations; ++i) {
      CUdeviceptr p = 0;
      if (fetched_alloc(&p, 256) != 0 || cuMemFree_v2(p) != 0) return 1;
    }
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    if (round == 1) std::printf("BENCH ns_per_alloc_free_pair %.1f\n", ns / static_cast<double>(iterations));
  }
  using OverheadFn = uint64_t (*)();
  if (auto overhead = reinterpret_cast<OverheadFn>(dlsym(RTLD_DEFAULT, "vramledger_preload_overhead_ns"))) {
    std::printf("BENCH shim_bookkeeping_ns_per_call %.1f\n",
                static_cast<double>(overhead()) / static_cast<double>(4 * iterations));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "check";
  if (std::strcmp(mode, "check") == 0) return check_mode();
  if (std::strcmp(mode, "torch") == 0) return torch_mode();
  if (std::strcmp(mode, "route") == 0) return route_mode();
  if (std::strcmp(mode, "bench") == 0) return bench_mode(argc > 2 ? std::atol(argv[2]) : 200000);
  std::fprintf(stderr, "usage: preload_test [check|torch|bench N]\n");
  return 2;
}
