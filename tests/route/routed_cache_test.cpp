// RoutedCache (preload/route/) over an in-process fake CUDA driver. The preload tests
// (tests/preload/) exercise the same cache end to end through LD_PRELOAD, which cannot run under
// the sanitizers; this binary calls the cache directly, so it runs in every build (ASan/UBSan,
// and TSan for the concurrency test, which is also registered in the 'concurrent' suite).
//
// The fake driver: malloc-backed cuMemAlloc with a per-device capacity (out-of-memory
// injection), two devices each with a primary context plus one context "the program created" on
// device 0, a per-thread current context with a push/pop stack, synchronisation counters per
// context with an injectable failure, and events that complete at once. It is strict where the
// cache's correctness shows: allocations need a current context and are attributed to its
// device, frees of anything but a live allocation base are refused and counted, and frees from
// another device's context are counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "allocator/config.hpp"
#include "preload/cuda_abi.h"
#include "preload/route/route_api.h"
#include "preload/route/route_driver.hpp"
#include "preload/route/routed_cache.hpp"

namespace vramledger::route {
namespace {

constexpr std::int64_t kKiB = std::int64_t{1} << 10;
constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr int kDeclined = VRAMLEDGER_ROUTE_DECLINED;
constexpr CUresult kInvalidContext = 201;    // CUDA_ERROR_INVALID_CONTEXT
constexpr CUresult kIllegalAddress = 700;    // CUDA_ERROR_ILLEGAL_ADDRESS
constexpr CUresult kLaunchFailure = 719;     // CUDA_ERROR_LAUNCH_FAILED

// The 16 driver functions RouteDriver::load asks for.
constexpr std::array<const char*, 17> kDriverSymbols = {
    "cuMemAlloc_v2",       "cuMemFree_v2",        "cuMemGetInfo_v2",
    "cuDeviceTotalMem_v2", "cuCtxGetCurrent",     "cuCtxGetDevice",
    "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2",  "cuCtxSynchronize",
    "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxGetState", "cuEventCreate",  "cuEventDestroy_v2",
    "cuEventRecord",       "cuEventQuery",        "cuEventSynchronize",
    "cuStreamWaitEvent"};

// ------------------------------------------------------------------------------ fake driver

class FakeDriver {
 public:
  static constexpr int kDevices = 2;
  static constexpr int kContexts = 3;  // primary 0, primary 1, the user context on device 0

  struct Allocation {
    std::size_t size = 0;
    int device = 0;
  };

  static CUcontext primary(int device) { return handle(device); }
  static CUcontext user_context() { return handle(2); }

  // This thread's current context (cuCtxSetCurrent); the push/pop stack is left alone.
  static void make_current(CUcontext context) {
    t_current = context;
    for (int device = 0; device < kDevices; ++device) {
      if (context == primary(device)) {
        std::lock_guard lock(mutex_);
        primary_active_[static_cast<std::size_t>(device)] = true;
      }
    }
  }
  static std::int64_t retains() { return locked(retains_); }
  static CUcontext current() { return t_current; }
  static std::size_t stack_depth() { return t_stack.size(); }

  // Back to a fresh driver: every allocation still held is freed (as a process exit would).
  static void reset() {
    std::lock_guard lock(mutex_);
    for (auto& [base, allocation] : allocations_) std::free(reinterpret_cast<void*>(base));
    allocations_.clear();
    live_ = {};
    capacity_ = {};
    alloc_calls_ = 0;
    free_calls_ = 0;
    bad_frees_ = 0;
    cross_device_frees_ = 0;
    syncs_ = {};
    fail_next_sync_ = 0;
    fail_next_alloc_ = 0;
    live_events_ = 0;
    retains_ = 0;
    primary_active_ = {};
    resolvable_ = true;
    missing_symbol_.clear();
    sync_hook_ = nullptr;
    t_current = nullptr;
    t_stack.clear();
  }

  // A context reset: the device's memory is gone (no cuMemFree calls counted).
  static void drop_device_memory(int device) {
    std::lock_guard lock(mutex_);
    for (auto it = allocations_.begin(); it != allocations_.end();) {
      if (it->second.device != device) {
        ++it;
        continue;
      }
      std::free(reinterpret_cast<void*>(it->first));
      live_[static_cast<std::size_t>(device)] -= static_cast<std::int64_t>(it->second.size);
      it = allocations_.erase(it);
    }
  }

  static std::int64_t live_bytes() {
    std::lock_guard lock(mutex_);
    return live_[0] + live_[1];
  }
  static std::int64_t live_bytes(int device) {
    std::lock_guard lock(mutex_);
    return live_[static_cast<std::size_t>(device)];
  }
  static std::int64_t alloc_calls() { return locked(alloc_calls_); }   // successful cuMemAlloc
  static std::int64_t free_calls() { return locked(free_calls_); }     // successful cuMemFree
  static std::int64_t bad_frees() { return locked(bad_frees_); }       // refused cuMemFree
  static std::int64_t cross_device_frees() { return locked(cross_device_frees_); }
  static std::int64_t live_events() { return locked(live_events_); }
  static std::int64_t syncs(CUcontext context) {
    std::lock_guard lock(mutex_);
    return syncs_[index(context)];
  }
  static std::int64_t all_syncs() {
    std::lock_guard lock(mutex_);
    return syncs_[0] + syncs_[1] + syncs_[2];
  }
  // The driver allocation holding `pointer` (its base in *base), if any.
  static bool find(std::uint64_t pointer, CUdeviceptr* base, Allocation* out) {
    std::lock_guard lock(mutex_);
    auto after = allocations_.upper_bound(pointer);
    if (after == allocations_.begin()) return false;
    auto it = std::prev(after);
    if (pointer >= it->first + it->second.size) return false;
    if (base != nullptr) *base = it->first;
    if (out != nullptr) *out = it->second;
    return true;
  }

  static void set_capacity(int device, std::int64_t bytes) {  // 0 = unlimited
    std::lock_guard lock(mutex_);
    capacity_[static_cast<std::size_t>(device)] = bytes;
  }
  static void fail_next_sync(CUresult error) {
    std::lock_guard lock(mutex_);
    fail_next_sync_ = error;
  }
  static void fail_next_alloc(CUresult error) {
    std::lock_guard lock(mutex_);
    fail_next_alloc_ = error;
  }
  // Runs once, inside the next cuCtxSynchronize (after it succeeded), on the synchronising thread.
  static void on_next_sync(std::function<void()> hook) {
    std::lock_guard lock(mutex_);
    sync_hook_ = std::move(hook);
  }
  // No symbol resolves (libcuda not loaded yet), or just `symbol` does not.
  static void set_resolvable(bool resolvable) {
    std::lock_guard lock(mutex_);
    resolvable_ = resolvable;
  }
  static void set_missing_symbol(std::string symbol) {
    std::lock_guard lock(mutex_);
    missing_symbol_ = std::move(symbol);
  }

  // The resolver handed to RoutedCache (vramledger_route_resolve_fn).
  static void* resolve(const char* symbol) {
    const std::string_view name(symbol);
    {
      std::lock_guard lock(mutex_);
      if (!resolvable_ || name == missing_symbol_) return nullptr;
    }
    struct Entry {
      std::string_view name;
      void* function;
    };
    static const Entry kTable[] = {
        {"cuMemAlloc_v2", as_symbol(&mem_alloc)},
        {"cuMemFree_v2", as_symbol(&mem_free)},
        {"cuMemGetInfo_v2", as_symbol(&mem_get_info)},
        {"cuDeviceTotalMem_v2", as_symbol(&device_total_mem)},
        {"cuCtxGetCurrent", as_symbol(&ctx_get_current)},
        {"cuCtxGetDevice", as_symbol(&ctx_get_device)},
        {"cuCtxPushCurrent_v2", as_symbol(&ctx_push_current)},
        {"cuCtxPopCurrent_v2", as_symbol(&ctx_pop_current)},
        {"cuCtxSynchronize", as_symbol(&ctx_synchronize)},
        {"cuDevicePrimaryCtxRetain", as_symbol(&primary_ctx_retain)},
        {"cuDevicePrimaryCtxGetState", as_symbol(&primary_ctx_get_state)},
        {"cuEventCreate", as_symbol(&event_create)},
        {"cuEventDestroy_v2", as_symbol(&event_destroy)},
        {"cuEventRecord", as_symbol(&event_record)},
        {"cuEventQuery", as_symbol(&event_query)},
        {"cuEventSynchronize", as_symbol(&event_synchronize)},
        {"cuStreamWaitEvent", as_symbol(&stream_wait_event)},
    };
    for (const Entry& entry : kTable) {
      if (entry.name == name) return entry.function;
    }
    return nullptr;
  }

 private:
  struct Context {
    int device;
    bool primary;
  };

  template <typename F>
  static void* as_symbol(F* function) {
    return reinterpret_cast<void*>(function);
  }
  static CUcontext handle(int i) { return reinterpret_cast<CUcontext>(&contexts_[i]); }
  static std::size_t index(CUcontext context) {
    for (int i = 0; i < kContexts; ++i) {
      if (handle(i) == context) return static_cast<std::size_t>(i);
    }
    ADD_FAILURE() << "the fake driver was handed a context it never made";
    std::abort();
  }
  static const Context& context_of(CUcontext context) { return contexts_[index(context)]; }
  static std::int64_t locked(const std::int64_t& value) {
    std::lock_guard lock(mutex_);
    return value;
  }

  // ---- the driver functions, with cuda.h's C signatures

  static CUresult mem_alloc(CUdeviceptr* dptr, size_t bytes) {
    if (dptr == nullptr || bytes == 0) return 1;
    if (t_current == nullptr) return kInvalidContext;
    const auto device = static_cast<std::size_t>(context_of(t_current).device);
    std::lock_guard lock(mutex_);
    if (fail_next_alloc_ != 0) return std::exchange(fail_next_alloc_, 0);
    const auto size = static_cast<std::int64_t>(bytes);
    if (capacity_[device] != 0 && live_[device] + size > capacity_[device]) return 2;
    void* memory = std::malloc(bytes);
    if (memory == nullptr) return 2;
    *dptr = reinterpret_cast<CUdeviceptr>(memory);
    allocations_[*dptr] = Allocation{bytes, static_cast<int>(device)};
    live_[device] += size;
    ++alloc_calls_;
    return 0;
  }
  static CUresult mem_free(CUdeviceptr dptr) {
    if (t_current == nullptr) return kInvalidContext;
    const int device = context_of(t_current).device;
    std::lock_guard lock(mutex_);
    auto it = allocations_.find(dptr);
    if (it == allocations_.end()) {
      ++bad_frees_;
      return 1;  // not an allocation base: CUDA_ERROR_INVALID_VALUE
    }
    if (it->second.device != device) ++cross_device_frees_;
    live_[static_cast<std::size_t>(it->second.device)] -= static_cast<std::int64_t>(it->second.size);
    std::free(reinterpret_cast<void*>(dptr));
    allocations_.erase(it);
    ++free_calls_;
    return 0;
  }
  static CUresult mem_get_info(size_t* free_bytes, size_t* total_bytes) {
    if (t_current == nullptr) return kInvalidContext;
    const auto device = static_cast<std::size_t>(context_of(t_current).device);
    std::lock_guard lock(mutex_);
    const std::int64_t total = capacity_[device] != 0 ? capacity_[device] : std::int64_t{1} << 36;
    *total_bytes = static_cast<size_t>(total);
    *free_bytes = static_cast<size_t>(std::max<std::int64_t>(0, total - live_[device]));
    return 0;
  }
  static CUresult device_total_mem(size_t* bytes, CUdevice device) {
    if (bytes == nullptr || device < 0 || device >= kDevices) return 101;
    std::lock_guard lock(mutex_);
    const std::int64_t capacity = capacity_[static_cast<std::size_t>(device)];
    *bytes = static_cast<size_t>(capacity != 0 ? capacity : std::int64_t{1} << 36);
    return 0;
  }
  static CUresult ctx_get_current(CUcontext* out) {
    if (out == nullptr) return 1;
    *out = t_current;
    return 0;
  }
  static CUresult ctx_get_device(CUdevice* device) {
    if (device == nullptr) return 1;
    if (t_current == nullptr) return kInvalidContext;
    *device = context_of(t_current).device;
    return 0;
  }
  static CUresult ctx_push_current(CUcontext context) {
    if (context == nullptr) return kInvalidContext;
    (void)index(context);
    t_stack.push_back(t_current);
    t_current = context;
    return 0;
  }
  static CUresult ctx_pop_current(CUcontext* out) {
    if (t_stack.empty()) return kInvalidContext;
    if (out != nullptr) *out = t_current;
    t_current = t_stack.back();
    t_stack.pop_back();
    return 0;
  }
  static CUresult ctx_synchronize() {
    if (t_current == nullptr) return kInvalidContext;
    std::function<void()> hook;
    {
      std::lock_guard lock(mutex_);
      if (fail_next_sync_ != 0) return std::exchange(fail_next_sync_, 0);
      ++syncs_[index(t_current)];
      hook = std::move(sync_hook_);
      sync_hook_ = nullptr;
    }
    if (hook) hook();
    return 0;
  }
  static CUresult primary_ctx_retain(CUcontext* out, CUdevice device) {
    if (out == nullptr || device < 0 || device >= kDevices) return 101;  // INVALID_DEVICE
    *out = primary(device);
    std::lock_guard lock(mutex_);
    ++retains_;
    primary_active_[static_cast<std::size_t>(device)] = true;
    return 0;
  }
  // Active once a thread made it current or it was retained (the driver starts it then).
  static CUresult primary_ctx_get_state(CUdevice device, unsigned int* flags, int* active) {
    if (flags == nullptr || active == nullptr || device < 0 || device >= kDevices) return 101;
    std::lock_guard lock(mutex_);
    *flags = 0;
    *active = primary_active_[static_cast<std::size_t>(device)] ? 1 : 0;
    return 0;
  }
  // Events complete at once: the fake device has no queue.
  static CUresult event_create(CUevent* out, unsigned int) {
    if (out == nullptr) return 1;
    if (t_current == nullptr) return kInvalidContext;
    *out = reinterpret_cast<CUevent>(new int(0));
    std::lock_guard lock(mutex_);
    ++live_events_;
    return 0;
  }
  static CUresult event_destroy(CUevent event) {
    if (event == nullptr) return 400;  // CUDA_ERROR_INVALID_HANDLE
    delete reinterpret_cast<int*>(event);
    std::lock_guard lock(mutex_);
    --live_events_;
    return 0;
  }
  static CUresult event_record(CUevent event, CUstream) { return event != nullptr ? 0 : 400; }
  static CUresult event_query(CUevent event) { return event != nullptr ? 0 : 400; }
  static CUresult event_synchronize(CUevent event) { return event != nullptr ? 0 : 400; }
  static CUresult stream_wait_event(CUstream, CUevent event, unsigned int) {
    return event != nullptr ? 0 : 400;
  }

  static inline Context contexts_[kContexts] = {{0, true}, {1, true}, {0, false}};
  static inline thread_local CUcontext t_current = nullptr;
  static inline thread_local std::vector<CUcontext> t_stack;

  static inline std::mutex mutex_;
  static inline std::map<CUdeviceptr, Allocation> allocations_;
  static inline std::array<std::int64_t, kDevices> live_{};
  static inline std::array<std::int64_t, kDevices> capacity_{};
  static inline std::int64_t alloc_calls_ = 0;
  static inline std::int64_t free_calls_ = 0;
  static inline std::int64_t bad_frees_ = 0;
  static inline std::int64_t cross_device_frees_ = 0;
  static inline std::array<std::int64_t, kContexts> syncs_{};
  static inline CUresult fail_next_sync_ = 0;
  static inline CUresult fail_next_alloc_ = 0;
  static inline std::int64_t live_events_ = 0;
  static inline std::int64_t retains_ = 0;
  static inline std::array<bool, kDevices> primary_active_{};
  static inline bool resolvable_ = true;
  static inline std::string missing_symbol_;
  static inline std::function<void()> sync_hook_;
};

// ------------------------------------------------------------------------------ helpers

// The cache's books: reserved == live + idle, reserved == what the fake driver holds for it
// (its live bytes minus `foreign` bytes the test allocated itself), live == `expected_live`.
::testing::AssertionResult Consistent(const RoutedCache& cache, std::int64_t expected_live,
                                      std::int64_t foreign = 0) {
  const vramledger_route_stats s = cache.stats();
  const std::int64_t driver = FakeDriver::live_bytes() - foreign;
  auto fail = [&](const char* what) {
    return ::testing::AssertionFailure()
           << what << ": reserved " << s.reserved_bytes << ", live " << s.live_bytes << ", idle "
           << s.idle_bytes << ", expected live " << expected_live << ", driver holds " << driver
           << " for the cache, reserved peak " << s.reserved_peak_bytes << ", idle peak "
           << s.idle_peak_bytes;
  };
  if (s.reserved_bytes != s.live_bytes + s.idle_bytes) return fail("reserved != live + idle");
  if (s.idle_bytes < 0) return fail("idle < 0");
  if (s.live_bytes != expected_live) return fail("live is not what the test holds");
  if (s.reserved_bytes != driver) return fail("reserved != the fake driver's bytes");
  if (s.reserved_peak_bytes < s.reserved_bytes) return fail("reserved peak < reserved");
  if (s.idle_peak_bytes < s.idle_bytes) return fail("idle peak < idle");
  return ::testing::AssertionSuccess();
}

// Writes the first and last requested byte of a block: a block outside its driver allocation
// shows under ASan, and a block handed out twice shows as a race under TSan.
void touch(std::uint64_t pointer, std::uint64_t bytes, unsigned char value) {
  auto* memory = reinterpret_cast<unsigned char*>(pointer);
  memory[0] = value;
  memory[bytes - 1] = value;
}

class RoutedCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeDriver::reset();
    cache_ = std::make_unique<RoutedCache>(&FakeDriver::resolve, Config{});
  }
  void TearDown() override {
    FakeDriver::on_next_sync(nullptr);  // a hook left armed must not run in the destructor
    cache_.reset();
    FakeDriver::reset();
  }

  // Allocates in the current context and expects success.
  std::uint64_t alloc(std::uint64_t bytes) {
    std::uint64_t pointer = 0;
    const int result = cache_->allocate(bytes, &pointer);
    EXPECT_EQ(result, 0) << "allocating " << bytes << " bytes";
    if (result == 0) {
      EXPECT_NE(pointer, 0u);
      touch(pointer, bytes, 0xA5);
    }
    return pointer;
  }

  std::unique_ptr<RoutedCache> cache_;
};

// ------------------------------------------------------------------------------ declining

TEST_F(RoutedCacheTest, DeclinesWithoutCurrentContext) {
  std::uint64_t pointer = 12345;
  EXPECT_EQ(cache_->allocate(4096, &pointer), kDeclined);
  EXPECT_EQ(pointer, 12345u) << "a declined call must not write the result";
  EXPECT_EQ(FakeDriver::alloc_calls(), 0);
  // Nothing was ever routed, so no pointer is the cache's.
  EXPECT_EQ(cache_->free(0x7000'0000), kDeclined);
  EXPECT_EQ(cache_->free(0), kDeclined);
  const vramledger_route_stats s = cache_->stats();
  EXPECT_EQ(s.declined, 1);
  EXPECT_EQ(s.allocations, 0);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.reserved_bytes, 0);
  EXPECT_EQ(FakeDriver::all_syncs(), 0);
}

TEST_F(RoutedCacheTest, DeclinesInNonPrimaryContext) {
  FakeDriver::make_current(FakeDriver::user_context());
  std::uint64_t pointer = 0;
  EXPECT_EQ(cache_->allocate(4096, &pointer), kDeclined);
  EXPECT_EQ(cache_->allocate(64 * kMiB, &pointer), kDeclined);
  EXPECT_EQ(FakeDriver::alloc_calls(), 0) << "no segment may be made for a declined call";
  EXPECT_EQ(FakeDriver::retains(), 0) << "an inactive primary context must not be started";
  EXPECT_EQ(cache_->stats().declined, 2);
  EXPECT_EQ(FakeDriver::current(), FakeDriver::user_context());
  EXPECT_EQ(FakeDriver::stack_depth(), 0u);

  // Memory the program allocated itself in its context is not the cache's to free.
  CUdeviceptr own = 0;
  auto* driver_alloc = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(
      FakeDriver::resolve("cuMemAlloc_v2"));
  ASSERT_EQ(driver_alloc(&own, 8192), 0);
  EXPECT_EQ(cache_->free(own), kDeclined);

  // The same device's primary context is served: the context decided, not the device.
  FakeDriver::make_current(FakeDriver::primary(0));
  const std::uint64_t served = alloc(4096);
  EXPECT_NE(served, 0u);
  EXPECT_EQ(cache_->free(own), kDeclined);
  EXPECT_EQ(FakeDriver::bad_frees(), 0);
  EXPECT_TRUE(Consistent(*cache_, 4096, /*foreign=*/8192));
  EXPECT_EQ(cache_->stats().declined, 2);
}

TEST_F(RoutedCacheTest, DeclinesUntilEveryDriverSymbolResolves) {
  FakeDriver::make_current(FakeDriver::primary(0));
  // libcuda not loaded yet: declined, and loaded lazily on a later call.
  FakeDriver::set_resolvable(false);
  std::uint64_t pointer = 0;
  EXPECT_EQ(cache_->allocate(4096, &pointer), kDeclined);
  FakeDriver::set_resolvable(true);
  for (const char* symbol : kDriverSymbols) {
    SCOPED_TRACE(symbol);
    RoutedCache cache(&FakeDriver::resolve, Config{});
    FakeDriver::set_missing_symbol(symbol);
    EXPECT_EQ(cache.allocate(4096, &pointer), kDeclined);
    EXPECT_EQ(cache.stats().declined, 1);
    FakeDriver::set_missing_symbol("");
    ASSERT_EQ(cache.allocate(4096, &pointer), 0);
    EXPECT_EQ(cache.free(pointer), 0);
  }
  EXPECT_EQ(cache_->allocate(4096, &pointer), 0);
  EXPECT_EQ(cache_->free(pointer), 0);
}

TEST_F(RoutedCacheTest, RejectsZeroBytesAndNullResult) {
  FakeDriver::make_current(FakeDriver::primary(0));
  std::uint64_t pointer = 0;
  // Passed on to the driver, which reports its own error.
  EXPECT_EQ(cache_->allocate(0, &pointer), kDeclined);
  EXPECT_EQ(cache_->allocate(4096, nullptr), kDeclined);
  EXPECT_EQ(FakeDriver::alloc_calls(), 0);
}

// ------------------------------------------------------------------------------ allocation

TEST_F(RoutedCacheTest, AllocatesOnTheCurrentDevice) {
  for (int device : {1, 0}) {
    SCOPED_TRACE("device " + std::to_string(device));
    FakeDriver::make_current(FakeDriver::primary(device));
    const std::int64_t before = FakeDriver::live_bytes(device);
    const std::uint64_t pointer = alloc(1000);
    CUdeviceptr base = 0;
    FakeDriver::Allocation segment;
    ASSERT_TRUE(FakeDriver::find(pointer, &base, &segment));
    EXPECT_EQ(segment.device, device);
    EXPECT_GE(segment.size, 1000u);
    EXPECT_GT(FakeDriver::live_bytes(device), before);
    // The caller's context is as it was: pushes and pops balance.
    EXPECT_EQ(FakeDriver::current(), FakeDriver::primary(device));
    EXPECT_EQ(FakeDriver::stack_depth(), 0u);
  }
  const vramledger_route_stats s = cache_->stats();
  EXPECT_EQ(s.allocations, 2);
  EXPECT_EQ(s.devices, 2);
  EXPECT_EQ(s.declined, 0);
  EXPECT_EQ(s.live_bytes, 2000);
  EXPECT_TRUE(Consistent(*cache_, 2000));
}

TEST_F(RoutedCacheTest, FreeSynchronisesOnceAndKeepsMemoryCached) {
  FakeDriver::make_current(FakeDriver::primary(0));
  const std::uint64_t pointer = alloc(3 * kMiB);
  const std::int64_t driver_bytes = FakeDriver::live_bytes();
  const std::int64_t driver_frees = FakeDriver::free_calls();
  EXPECT_EQ(FakeDriver::all_syncs(), 0) << "allocation must not synchronise";

  // Freed from a thread with no current context: the cache synchronises the owner's context.
  FakeDriver::make_current(nullptr);
  EXPECT_EQ(cache_->free(pointer), 0);
  EXPECT_EQ(FakeDriver::syncs(FakeDriver::primary(0)), 1);
  EXPECT_EQ(FakeDriver::all_syncs(), 1);
  EXPECT_EQ(FakeDriver::current(), nullptr);
  EXPECT_EQ(FakeDriver::stack_depth(), 0u);
  // Cached, not returned.
  EXPECT_EQ(FakeDriver::live_bytes(), driver_bytes);
  EXPECT_EQ(FakeDriver::free_calls(), driver_frees);
  const vramledger_route_stats s = cache_->stats();
  EXPECT_EQ(s.frees, 1);
  EXPECT_EQ(s.live_bytes, 0);
  EXPECT_EQ(s.idle_bytes, s.reserved_bytes);
  EXPECT_GT(s.idle_bytes, 0);
  EXPECT_TRUE(Consistent(*cache_, 0));
}

TEST_F(RoutedCacheTest, ReusesCachedMemoryWithoutDriverAllocations) {
  FakeDriver::make_current(FakeDriver::primary(0));
  // One block of each pool, freed: their segments stay cached.
  const std::uint64_t small = alloc(4 * kKiB);
  const std::uint64_t large = alloc(5 * kMiB);
  ASSERT_EQ(cache_->free(small), 0);
  ASSERT_EQ(cache_->free(large), 0);
  const std::int64_t alloc_calls = FakeDriver::alloc_calls();
  CUdeviceptr small_segment = 0;
  CUdeviceptr large_segment = 0;
  ASSERT_TRUE(FakeDriver::find(small, &small_segment, nullptr));
  ASSERT_TRUE(FakeDriver::find(large, &large_segment, nullptr));

  EXPECT_EQ(alloc(4 * kKiB), small) << "the same size gets the freed block back";
  EXPECT_EQ(cache_->free(small), 0);
  std::mt19937_64 random(7);
  for (int i = 0; i < 200; ++i) {
    const bool is_small = i % 2 == 0;
    const std::uint64_t bytes = is_small ? 1 + random() % (512 * kKiB) : kMiB + random() % (4 * kMiB);
    const std::uint64_t pointer = alloc(bytes);
    CUdeviceptr segment = 0;
    ASSERT_TRUE(FakeDriver::find(pointer, &segment, nullptr));
    EXPECT_EQ(segment, is_small ? small_segment : large_segment);
    ASSERT_EQ(cache_->free(pointer), 0);
  }
  EXPECT_EQ(FakeDriver::alloc_calls(), alloc_calls) << "reuse must not allocate from the driver";
  EXPECT_EQ(cache_->stats().allocations, 203);
  EXPECT_EQ(cache_->stats().frees, 203);
  EXPECT_TRUE(Consistent(*cache_, 0));
}

// ------------------------------------------------------------------------------ bad frees

TEST_F(RoutedCacheTest, DoubleFreeAndInteriorPointerAreRejected) {
  FakeDriver::make_current(FakeDriver::primary(0));
  const std::uint64_t a = alloc(4 * kKiB);
  const std::uint64_t b = alloc(4 * kKiB);
  CUdeviceptr segment = 0;
  FakeDriver::Allocation info;
  ASSERT_TRUE(FakeDriver::find(b, &segment, &info));
  ASSERT_EQ(cache_->free(a), 0);
  const std::int64_t syncs = FakeDriver::all_syncs();

  EXPECT_EQ(cache_->free(a), 1) << "double free";
  EXPECT_EQ(cache_->free(b + 16), 1) << "interior pointer";
  EXPECT_EQ(cache_->free(segment + info.size - 512), 1) << "free space inside a segment";
  EXPECT_EQ(cache_->free(segment + info.size), kDeclined) << "just past the segment";
  // None reached the driver (at a segment's base it would free the segment under the cache),
  // and none waited for the device.
  EXPECT_EQ(FakeDriver::bad_frees(), 0);
  EXPECT_EQ(FakeDriver::free_calls(), 0);
  EXPECT_EQ(FakeDriver::all_syncs(), syncs);
  vramledger_route_stats s = cache_->stats();
  EXPECT_EQ(s.failed, 3);
  EXPECT_EQ(s.frees, 1);
  EXPECT_TRUE(Consistent(*cache_, 4 * kKiB));

  // Nothing lost: b still frees, and a's block is handed out again.
  EXPECT_EQ(cache_->free(b), 0);
  EXPECT_EQ(alloc(4 * kKiB), a);
  EXPECT_EQ(cache_->free(a), 0);
  s = cache_->stats();
  EXPECT_EQ(s.frees, 3);
  EXPECT_EQ(s.failed, 3);
  EXPECT_TRUE(Consistent(*cache_, 0));
}

TEST_F(RoutedCacheTest, FailedSynchronisationKeepsBlockLive) {
  FakeDriver::make_current(FakeDriver::primary(0));
  const std::uint64_t a = alloc(64 * kKiB);
  FakeDriver::fail_next_sync(kIllegalAddress);
  EXPECT_EQ(cache_->free(a), kIllegalAddress);
  EXPECT_EQ(FakeDriver::stack_depth(), 0u) << "the pushed context must be popped on failure";
  EXPECT_EQ(FakeDriver::current(), FakeDriver::primary(0));
  vramledger_route_stats s = cache_->stats();
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.frees, 0);
  EXPECT_TRUE(Consistent(*cache_, 64 * kKiB)) << "the block must still be live";

  // Still live: not handed out again.
  const std::uint64_t b = alloc(64 * kKiB);
  EXPECT_NE(b, a);
  EXPECT_TRUE(Consistent(*cache_, 128 * kKiB));
  // The retry succeeds, exactly once.
  EXPECT_EQ(cache_->free(a), 0);
  EXPECT_EQ(cache_->free(a), 1);
  EXPECT_EQ(cache_->free(b), 0);
  s = cache_->stats();
  EXPECT_EQ(s.frees, 2);
  EXPECT_EQ(s.failed, 2);
  EXPECT_EQ(FakeDriver::all_syncs(), 2);
  EXPECT_TRUE(Consistent(*cache_, 0));
}

// Two frees of one pointer racing: the second finds the block gone only after its
// synchronisation (outside the cache's lock). Made deterministic by freeing from inside the
// first free's cuCtxSynchronize.
TEST_F(RoutedCacheTest, FreeRacingAnotherFreeOfTheSamePointerFailsAndIsCounted) {
  FakeDriver::make_current(FakeDriver::primary(0));
  const std::uint64_t a = alloc(4 * kKiB);
  int inner = -2;
  FakeDriver::on_next_sync([&] { inner = cache_->free(a); });
  EXPECT_EQ(cache_->free(a), 1);
  FakeDriver::on_next_sync(nullptr);
  EXPECT_EQ(inner, 0) << "the free inside the synchronisation did not run";
  const vramledger_route_stats s = cache_->stats();
  EXPECT_EQ(s.frees, 1);
  EXPECT_EQ(s.failed, 1) << "an error returned to the caller is a failed routed call";
  EXPECT_EQ(FakeDriver::stack_depth(), 0u);
  EXPECT_TRUE(Consistent(*cache_, 0));
}

// ------------------------------------------------------------------------------ out of memory

// Memory another vramledger cache of the process (the torch allocator) holds idle would have
// served the call without routing: on out of memory the cache asks for it once, then retries.
// Sizes no device could hold get the driver's answer (out of memory), and nothing changes.
TEST_F(RoutedCacheTest, ImpossibleSizesAreOutOfMemory) {
  FakeDriver::make_current(FakeDriver::primary(0));
  for (const std::uint64_t bytes : {std::uint64_t{1} << 50, ~std::uint64_t{0}, ~std::uint64_t{0} - 511}) {
    SCOPED_TRACE(bytes);
    std::uint64_t pointer = 0;
    EXPECT_EQ(cache_->allocate(bytes, &pointer), 2);
    EXPECT_EQ(pointer, 0u);
  }
  EXPECT_EQ(cache_->stats().failed, 3);
  EXPECT_EQ(cache_->stats().allocations, 0);
  EXPECT_TRUE(Consistent(*cache_, 0));
}

TEST_F(RoutedCacheTest, OutOfMemoryAsksTheOtherCacheOnceThenRetries) {
  CUdeviceptr held_elsewhere = 0;  // stands for the torch allocator's idle segment
  int asked = 0;
  bool frees_something = true;
  auto* driver_alloc = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(
      FakeDriver::resolve("cuMemAlloc_v2"));
  auto* driver_free = reinterpret_cast<CUresult (*)(CUdeviceptr)>(
      FakeDriver::resolve("cuMemFree_v2"));
  cache_ = std::make_unique<RoutedCache>(&FakeDriver::resolve, Config{}, [&] {
    ++asked;
    if (!frees_something || held_elsewhere == 0) return false;
    EXPECT_EQ(driver_free(held_elsewhere), 0);
    held_elsewhere = 0;
    return true;
  });
  FakeDriver::make_current(FakeDriver::primary(0));
  FakeDriver::set_capacity(0, 24 * kMiB);
  ASSERT_EQ(driver_alloc(&held_elsewhere, 16 * kMiB), 0);

  // 16 MiB cannot fit next to the other cache's 16 MiB: asked once, then served.
  const std::uint64_t served = alloc(16 * kMiB);
  EXPECT_NE(served, 0u);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(held_elsewhere, 0u);
  vramledger_route_stats s = cache_->stats();
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.allocations, 1);
  EXPECT_TRUE(Consistent(*cache_, 16 * kMiB));

  // Nothing more to give: asked once more, and the error is the driver's out of memory.
  frees_something = false;
  std::uint64_t pointer = 0;
  EXPECT_EQ(cache_->allocate(16 * kMiB, &pointer), 2);
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(cache_->stats().failed, 1);
  // Other errors and declined calls do not ask.
  FakeDriver::make_current(nullptr);
  EXPECT_EQ(cache_->allocate(kKiB, &pointer), kDeclined);
  EXPECT_EQ(asked, 2);
  FakeDriver::make_current(FakeDriver::primary(0));
  EXPECT_EQ(cache_->free(served), 0);
  EXPECT_TRUE(Consistent(*cache_, 0));
}

TEST_F(RoutedCacheTest, OutOfMemoryReleasesCacheRetriesThenFails) {
  FakeDriver::make_current(FakeDriver::primary(0));
  FakeDriver::set_capacity(0, 24 * kMiB);
  // A 12 MiB segment, cached once freed.
  const std::uint64_t a = alloc(12 * kMiB);
  ASSERT_EQ(cache_->free(a), 0);
  EXPECT_EQ(FakeDriver::live_bytes(0), 12 * kMiB);
  EXPECT_TRUE(Consistent(*cache_, 0));

  // 16 MiB does not fit next to it: the cache gives its 12 MiB back and retries.
  const std::uint64_t b = alloc(16 * kMiB);
  ASSERT_NE(b, 0u);
  EXPECT_EQ(FakeDriver::free_calls(), 1);
  EXPECT_EQ(FakeDriver::live_bytes(0), 16 * kMiB);
  vramledger_route_stats s = cache_->stats();
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.reserved_bytes, 16 * kMiB);
  EXPECT_EQ(s.reserved_peak_bytes, 16 * kMiB);
  EXPECT_TRUE(Consistent(*cache_, 16 * kMiB));

  // A small segment cached, then 10 MiB more than the device has even without it:
  // released, retried, CUDA_ERROR_OUT_OF_MEMORY.
  ASSERT_EQ(cache_->free(alloc(kKiB)), 0);
  EXPECT_EQ(FakeDriver::live_bytes(0), 18 * kMiB);
  std::uint64_t pointer = 0;
  EXPECT_EQ(cache_->allocate(10 * kMiB, &pointer), 2);
  EXPECT_EQ(FakeDriver::free_calls(), 2) << "the cached small segment was released";
  EXPECT_EQ(FakeDriver::live_bytes(0), 16 * kMiB);
  s = cache_->stats();
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.allocations, 3);
  EXPECT_TRUE(Consistent(*cache_, 16 * kMiB)) << "stats must reflect the release of the retry";
  EXPECT_EQ(FakeDriver::stack_depth(), 0u);

  // Once b is freed (and cached), a request its segment cannot hold and the device cannot
  // hold next to it succeeds by releasing it.
  ASSERT_EQ(cache_->free(b), 0);
  const std::uint64_t c = alloc(20 * kMiB);
  ASSERT_NE(c, 0u);
  EXPECT_EQ(FakeDriver::free_calls(), 3);
  EXPECT_EQ(FakeDriver::live_bytes(0), 20 * kMiB);
  EXPECT_TRUE(Consistent(*cache_, 20 * kMiB));
  EXPECT_EQ(cache_->free(c), 0);
  EXPECT_TRUE(Consistent(*cache_, 0));
  EXPECT_EQ(cache_->stats().reserved_peak_bytes, 20 * kMiB);
  EXPECT_EQ(cache_->stats().failed, 1);
}

TEST_F(RoutedCacheTest, DriverErrorIsReturnedAsItsCUresult) {
  FakeDriver::make_current(FakeDriver::primary(1));
  FakeDriver::fail_next_alloc(kLaunchFailure);
  std::uint64_t pointer = 0;
  EXPECT_EQ(cache_->allocate(kMiB, &pointer), kLaunchFailure);
  EXPECT_EQ(cache_->stats().failed, 1);
  EXPECT_TRUE(Consistent(*cache_, 0));
  // Not sticky.
  const std::uint64_t a = alloc(kMiB);
  EXPECT_EQ(cache_->free(a), 0);
  EXPECT_TRUE(Consistent(*cache_, 0));
}

// ------------------------------------------------------------------------------ stats

TEST_F(RoutedCacheTest, StatsStayConsistentThroughARandomSequence) {
  std::mt19937_64 random(2024);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live;  // pointer, bytes
  std::int64_t live_bytes = 0;
  std::int64_t max_reserved = 0;
  std::int64_t max_idle = 0;
  std::int64_t released_total = 0;
  std::int64_t driver_freed_total = 0;
  int allocations = 0;
  int frees = 0;
  FakeDriver::set_capacity(0, 96 * kMiB);  // out-of-memory now and then on device 0
  for (int step = 0; step < 1500; ++step) {
    const int device = static_cast<int>(random() % 2);
    FakeDriver::make_current(FakeDriver::primary(device));
    const auto choice = random() % 100;
    if (choice < 50 || live.empty()) {
      std::uint64_t bytes = 0;
      switch (random() % 4) {
        case 0: bytes = 1 + random() % 2048; break;
        case 1: bytes = 1 + random() % kMiB; break;
        case 2: bytes = kMiB + random() % (9 * kMiB); break;
        default: bytes = 10 * kMiB + random() % (14 * kMiB); break;
      }
      std::uint64_t pointer = 0;
      const int result = cache_->allocate(bytes, &pointer);
      ASSERT_TRUE(result == 0 || (result == 2 && device == 0))
          << "step " << step << ": allocate(" << bytes << ") gave " << result;
      if (result == 0) {
        touch(pointer, bytes, static_cast<unsigned char>(step));
        live.emplace_back(pointer, bytes);
        live_bytes += static_cast<std::int64_t>(bytes);
        ++allocations;
      }
    } else if (choice < 95) {
      const std::size_t index = random() % live.size();
      ASSERT_EQ(cache_->free(live[index].first), 0) << "step " << step;
      live_bytes -= static_cast<std::int64_t>(live[index].second);
      live[index] = live.back();
      live.pop_back();
      ++frees;
    } else {
      const std::int64_t driver_before = FakeDriver::live_bytes();
      const std::int64_t released = cache_->release_idle();
      EXPECT_EQ(released, driver_before - FakeDriver::live_bytes()) << "step " << step;
      released_total += released;
      driver_freed_total += driver_before - FakeDriver::live_bytes();
    }
    ASSERT_TRUE(Consistent(*cache_, live_bytes)) << "step " << step;
    const vramledger_route_stats s = cache_->stats();
    max_reserved = std::max(max_reserved, s.reserved_bytes);
    max_idle = std::max(max_idle, s.idle_bytes);
    ASSERT_EQ(s.reserved_peak_bytes, max_reserved) << "step " << step;
    ASSERT_EQ(s.idle_peak_bytes, max_idle) << "step " << step;
    ASSERT_EQ(s.allocations, allocations);
    ASSERT_EQ(s.frees, frees);
  }
  EXPECT_GT(cache_->stats().failed, 0) << "the sequence was meant to run out of memory";
  EXPECT_EQ(released_total, driver_freed_total);
  for (const auto& [pointer, bytes] : live) ASSERT_EQ(cache_->free(pointer), 0);
  EXPECT_TRUE(Consistent(*cache_, 0));
  EXPECT_EQ(FakeDriver::cross_device_frees(), 0);
  EXPECT_EQ(FakeDriver::bad_frees(), 0);
}

TEST_F(RoutedCacheTest, ReleaseIdleReturnsExactlyWhatTheDriverGetsBack) {
  FakeDriver::make_current(FakeDriver::primary(0));
  // Device 0: a small segment kept busy by one block, a large one entirely free.
  const std::uint64_t kept = alloc(8 * kKiB);
  ASSERT_EQ(cache_->free(alloc(16 * kKiB)), 0);
  ASSERT_EQ(cache_->free(alloc(4 * kMiB)), 0);
  // Device 1: two large segments, both free.
  FakeDriver::make_current(FakeDriver::primary(1));
  const std::uint64_t x = alloc(12 * kMiB);
  const std::uint64_t y = alloc(14 * kMiB);
  ASSERT_EQ(cache_->free(x), 0);
  ASSERT_EQ(cache_->free(y), 0);
  EXPECT_TRUE(Consistent(*cache_, 8 * kKiB));

  const std::int64_t driver_before = FakeDriver::live_bytes();
  const std::int64_t frees_before = FakeDriver::free_calls();
  const std::int64_t released = cache_->release_idle();
  EXPECT_EQ(released, driver_before - FakeDriver::live_bytes());
  EXPECT_EQ(released, 20 * kMiB + 12 * kMiB + 14 * kMiB);
  EXPECT_EQ(FakeDriver::free_calls() - frees_before, 3);
  EXPECT_EQ(FakeDriver::live_bytes(1), 0);
  EXPECT_EQ(FakeDriver::cross_device_frees(), 0) << "each segment freed in its device's context";
  EXPECT_EQ(FakeDriver::stack_depth(), 0u);
  EXPECT_EQ(FakeDriver::current(), FakeDriver::primary(1));
  EXPECT_TRUE(Consistent(*cache_, 8 * kKiB));
  // The busy segment stays; nothing more to release.
  EXPECT_EQ(cache_->release_idle(), 0);
  EXPECT_EQ(cache_->free(kept), 0);
  EXPECT_EQ(cache_->release_idle(), 2 * kMiB);
  EXPECT_EQ(FakeDriver::live_bytes(), 0);
  EXPECT_TRUE(Consistent(*cache_, 0));
  EXPECT_EQ(cache_->stats().reserved_bytes, 0);
}

// ------------------------------------------------------------------------------ devices

TEST_F(RoutedCacheTest, ForgetDeviceMakesNoDriverCallsAndStartsAFreshCache) {
  FakeDriver::make_current(FakeDriver::primary(0));
  const std::uint64_t live0 = alloc(64 * kKiB);
  ASSERT_EQ(cache_->free(alloc(3 * kMiB)), 0);  // a cached large segment
  FakeDriver::make_current(FakeDriver::primary(1));
  const std::uint64_t live1 = alloc(32 * kKiB);
  const std::int64_t device0_bytes = FakeDriver::live_bytes(0);
  const std::int64_t frees = FakeDriver::free_calls();
  const std::int64_t syncs = FakeDriver::all_syncs();
  const std::int64_t events = FakeDriver::live_events();

  // Device 0's primary context was reset: its memory is the driver's business now.
  cache_->forget_device(0);
  EXPECT_EQ(FakeDriver::free_calls(), frees) << "forget_device must not free";
  EXPECT_EQ(FakeDriver::live_bytes(0), device0_bytes);
  EXPECT_EQ(FakeDriver::all_syncs(), syncs) << "forget_device must not use the reset context";
  EXPECT_EQ(FakeDriver::live_events(), events);
  EXPECT_EQ(FakeDriver::stack_depth(), 0u);
  vramledger_route_stats s = cache_->stats();
  EXPECT_EQ(s.devices, 1);
  EXPECT_TRUE(Consistent(*cache_, 32 * kKiB, /*foreign=*/device0_bytes));
  FakeDriver::drop_device_memory(0);  // what the reset did
  EXPECT_TRUE(Consistent(*cache_, 32 * kKiB));

  // The old pointer is not the cache's any more.
  EXPECT_EQ(cache_->free(live0), kDeclined);
  // A later allocation on device 0 starts a fresh cache: a new segment from the driver.
  FakeDriver::make_current(FakeDriver::primary(0));
  const std::int64_t allocs = FakeDriver::alloc_calls();
  const std::uint64_t again = alloc(64 * kKiB);
  EXPECT_EQ(FakeDriver::alloc_calls(), allocs + 1);
  FakeDriver::Allocation info;
  ASSERT_TRUE(FakeDriver::find(again, nullptr, &info));
  EXPECT_EQ(info.device, 0);
  s = cache_->stats();
  EXPECT_EQ(s.devices, 2);
  EXPECT_TRUE(Consistent(*cache_, 96 * kKiB));

  // Unknown devices are ignored; device 1 was untouched throughout.
  cache_->forget_device(-1);
  cache_->forget_device(7);
  EXPECT_EQ(cache_->free(live1), 0);
  EXPECT_EQ(cache_->free(again), 0);
  EXPECT_TRUE(Consistent(*cache_, 0));
}

TEST_F(RoutedCacheTest, TwoDevicesHaveSeparateCaches) {
  FakeDriver::make_current(FakeDriver::primary(0));
  const std::uint64_t a = alloc(256 * kKiB);
  FakeDriver::make_current(FakeDriver::primary(1));
  const std::uint64_t b = alloc(256 * kKiB);
  FakeDriver::Allocation info;
  ASSERT_TRUE(FakeDriver::find(a, nullptr, &info));
  EXPECT_EQ(info.device, 0);
  ASSERT_TRUE(FakeDriver::find(b, nullptr, &info));
  EXPECT_EQ(info.device, 1);
  EXPECT_EQ(cache_->stats().devices, 2);

  // Each free synchronises its owner's primary context, whichever is current.
  EXPECT_EQ(cache_->free(a), 0);  // device 1 current
  EXPECT_EQ(FakeDriver::syncs(FakeDriver::primary(0)), 1);
  EXPECT_EQ(FakeDriver::syncs(FakeDriver::primary(1)), 0);
  FakeDriver::make_current(FakeDriver::primary(0));
  EXPECT_EQ(cache_->free(b), 0);
  EXPECT_EQ(FakeDriver::syncs(FakeDriver::primary(1)), 1);
  EXPECT_EQ(FakeDriver::syncs(FakeDriver::user_context()), 0);

  // Each device reuses its own cached block, without the driver.
  const std::int64_t allocs = FakeDriver::alloc_calls();
  EXPECT_EQ(alloc(256 * kKiB), a);
  FakeDriver::make_current(FakeDriver::primary(1));
  EXPECT_EQ(alloc(256 * kKiB), b);
  EXPECT_EQ(FakeDriver::alloc_calls(), allocs);
  EXPECT_TRUE(Consistent(*cache_, 512 * kKiB));

  // Frees go to the right cache: freeing device 0's block makes only device 0's memory idle.
  EXPECT_EQ(cache_->free(a), 0);
  EXPECT_EQ(cache_->release_idle(), 2 * kMiB);
  EXPECT_EQ(FakeDriver::live_bytes(0), 0);
  EXPECT_EQ(FakeDriver::live_bytes(1), 2 * kMiB);
  EXPECT_TRUE(Consistent(*cache_, 256 * kKiB));
  EXPECT_EQ(cache_->free(b), 0);
  EXPECT_EQ(FakeDriver::cross_device_frees(), 0);
  EXPECT_TRUE(Consistent(*cache_, 0));
}

TEST_F(RoutedCacheTest, DestructionReturnsCachedSegmentsAndLeavesLiveBlocks) {
  FakeDriver::make_current(FakeDriver::primary(0));
  const std::uint64_t kept = alloc(kKiB);
  ASSERT_EQ(cache_->free(alloc(5 * kMiB)), 0);
  FakeDriver::make_current(nullptr);
  CUdeviceptr kept_segment = 0;
  FakeDriver::Allocation info;
  ASSERT_TRUE(FakeDriver::find(kept, &kept_segment, &info));
  cache_.reset();
  EXPECT_EQ(FakeDriver::live_bytes(), static_cast<std::int64_t>(info.size));
  EXPECT_TRUE(FakeDriver::find(kept, nullptr, nullptr)) << "a live block's segment stays";
  EXPECT_EQ(FakeDriver::bad_frees(), 0);
  EXPECT_EQ(FakeDriver::live_events(), 0);
  EXPECT_EQ(FakeDriver::stack_depth(), 0u);
}

// ------------------------------------------------------------------------------ threads

// Four threads, each with its own current context (devices 0 and 1), allocate and free a few
// thousand blocks, free blocks other threads allocated, try the non-primary context now and then
// (declined), release idle memory and read the stats. Run under ThreadSanitizer too (suite
// 'concurrent').
TEST(RoutedCacheConcurrencyTest, ThreadsAllocateAndFreeWithTheirOwnContexts) {
  FakeDriver::reset();
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 3000;
  constexpr std::size_t kMaxLive = 16;
  auto cache = std::make_unique<RoutedCache>(&FakeDriver::resolve, Config{});

  std::mutex shared_mutex;  // blocks handed to other threads to free
  std::vector<std::pair<std::uint64_t, std::uint64_t>> shared;
  std::atomic<std::int64_t> served{0};
  std::atomic<std::int64_t> freed{0};
  std::atomic<std::int64_t> declined{0};

  // The first 8 bytes of each block hold its owner's tag; a block handed out twice shows.
  auto check_and_free = [&](std::uint64_t pointer, std::uint64_t bytes) {
    if (bytes >= sizeof(std::uint64_t)) {
      std::uint64_t tag = 0;
      std::memcpy(&tag, reinterpret_cast<void*>(pointer), sizeof tag);
      EXPECT_EQ(tag, pointer ^ bytes) << "a live block was overwritten";
    }
    EXPECT_EQ(cache->free(pointer), 0);
    freed.fetch_add(1, std::memory_order_relaxed);
  };

  auto worker = [&](int thread) {
    const CUcontext own = FakeDriver::primary(thread % 2);
    FakeDriver::make_current(own);
    std::mt19937_64 random(1000 + static_cast<unsigned>(thread));
    std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
    for (int op = 0; op < kOpsPerThread; ++op) {
      const auto choice = random() % 100;
      if (choice < 2) {
        FakeDriver::make_current(FakeDriver::user_context());
        std::uint64_t pointer = 0;
        EXPECT_EQ(cache->allocate(4096, &pointer), kDeclined);
        declined.fetch_add(1, std::memory_order_relaxed);
        FakeDriver::make_current(own);
      } else if (choice < 3) {
        (void)cache->release_idle();
      } else if (choice < 5) {
        const vramledger_route_stats s = cache->stats();
        EXPECT_EQ(s.reserved_bytes, s.live_bytes + s.idle_bytes);
        EXPECT_GE(s.idle_bytes, 0);
      } else if (choice < 52 && live.size() < kMaxLive) {
        const std::uint64_t bytes =
            random() % 8 == 0 ? kMiB + random() % (3 * kMiB) : 1 + random() % (64 * kKiB);
        std::uint64_t pointer = 0;
        const int result = cache->allocate(bytes, &pointer);
        EXPECT_EQ(result, 0);
        if (result != 0) continue;
        served.fetch_add(1, std::memory_order_relaxed);
        if (bytes >= sizeof(std::uint64_t)) {
          const std::uint64_t tag = pointer ^ bytes;
          std::memcpy(reinterpret_cast<void*>(pointer), &tag, sizeof tag);
        }
        if (bytes > sizeof(std::uint64_t)) {
          reinterpret_cast<unsigned char*>(pointer)[bytes - 1] = 0x5A;
        } else {
          touch(pointer, bytes, 0x5A);
        }
        if (random() % 4 == 0) {
          std::lock_guard lock(shared_mutex);
          shared.emplace_back(pointer, bytes);
        } else {
          live.emplace_back(pointer, bytes);
        }
      } else if (!live.empty()) {
        const std::size_t index = random() % live.size();
        check_and_free(live[index].first, live[index].second);
        live[index] = live.back();
        live.pop_back();
      } else {
        std::pair<std::uint64_t, std::uint64_t> other{0, 0};
        {
          std::lock_guard lock(shared_mutex);
          if (!shared.empty()) {
            other = shared.back();
            shared.pop_back();
          }
        }
        if (other.first != 0) check_and_free(other.first, other.second);
      }
    }
    for (const auto& [pointer, bytes] : live) check_and_free(pointer, bytes);
    EXPECT_EQ(FakeDriver::stack_depth(), 0u);
    FakeDriver::make_current(nullptr);
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& thread : threads) thread.join();
  // The main thread has no current context: the cache still frees in the owners' contexts.
  for (const auto& [pointer, bytes] : shared) check_and_free(pointer, bytes);

  const vramledger_route_stats s = cache->stats();
  EXPECT_GT(served.load(), kThreads * kOpsPerThread / 4);
  EXPECT_EQ(s.allocations, served.load());
  EXPECT_EQ(s.frees, freed.load());
  EXPECT_EQ(s.frees, s.allocations);
  EXPECT_EQ(s.declined, declined.load());
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.devices, 2);
  EXPECT_TRUE(Consistent(*cache, 0));
  EXPECT_EQ(FakeDriver::all_syncs(), s.frees) << "every free synchronised once";
  EXPECT_EQ(FakeDriver::syncs(FakeDriver::user_context()), 0);
  EXPECT_EQ(FakeDriver::cross_device_frees(), 0);
  EXPECT_EQ(FakeDriver::bad_frees(), 0);

  FakeDriver::make_current(nullptr);
  const std::int64_t reserved = s.reserved_bytes;
  EXPECT_EQ(cache->release_idle(), reserved);
  EXPECT_EQ(FakeDriver::live_bytes(), 0);
  EXPECT_TRUE(Consistent(*cache, 0));
  cache.reset();
  FakeDriver::reset();
}

}  // namespace
}  // namespace vramledger::route
