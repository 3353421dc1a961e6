#include "preload/interposed_functions.hpp"

#include <atomic>
#include <cstring>

#include "preload/real_symbols.hpp"
#include "preload/usage_counters.hpp"

namespace vramledger::preload {
namespace {

constexpr const char* kExportedNames[kFnCount] = {
    VL_DRIVER_FUNCTIONS(VL_FN_EXPORTED_NAME, VL_FN_EXPORTED_NAME)
    VL_RUNTIME_FUNCTIONS(VL_FN_EXPORTED_NAME, VL_FN_EXPORTED_NAME)};

static_assert(kExportedNames[kFnCount - 1] != nullptr, "a name for every Fn");

std::atomic<void*> g_real[kFnCount][kVariants];

void* wrapper_of(Fn fn, int variant) {
  return static_cast<int>(fn) < kFirstRuntimeFn ? driver_wrapper(fn, variant)
                                                : runtime_wrapper(fn, variant);
}

bool is_our_wrapper(void* pointer) {
  for (int f = 0; f < kFnCount; ++f) {
    for (int v = 0; v < kVariants; ++v) {
      if (wrapper_of(static_cast<Fn>(f), v) == pointer) return true;
    }
  }
  return false;
}

}  // namespace

const char* exported_name(Fn fn) { return kExportedNames[static_cast<int>(fn)]; }

Fn fn_by_exported_name(const char* name) {
  if (name == nullptr || name[0] != 'c' || name[1] != 'u') return Fn::kNone;  // fast path
  for (int f = 0; f < kFnCount; ++f) {
    if (std::strcmp(kExportedNames[f], name) == 0) return static_cast<Fn>(f);
  }
  return Fn::kNone;
}

Fn fn_by_driver_symbol(const char* symbol, int cuda_version, std::uint64_t flags) {
  if (symbol == nullptr || symbol[0] != 'c' || symbol[1] != 'u') return Fn::kNone;
  const bool per_thread = (flags & 2ull) != 0;  // ..._PER_THREAD_DEFAULT_STREAM
  struct Entry {
    const char* name;
    Fn fn;
    Fn per_thread_fn;
    int min_version;  // below it the driver returns an older ABI
  };
  static constexpr Entry kEntries[] = {
      {"cuMemAlloc", Fn::kMemAlloc, Fn::kMemAlloc, 3020},
      {"cuMemFree", Fn::kMemFree, Fn::kMemFree, 3020},
      {"cuMemAllocPitch", Fn::kMemAllocPitch, Fn::kMemAllocPitch, 3020},
      {"cuMemAllocManaged", Fn::kMemAllocManaged, Fn::kMemAllocManaged, 0},
      {"cuMemAllocAsync", Fn::kMemAllocAsync, Fn::kMemAllocAsyncPtsz, 0},
      {"cuMemAllocFromPoolAsync", Fn::kMemAllocFromPoolAsync, Fn::kMemAllocFromPoolAsyncPtsz, 0},
      {"cuMemFreeAsync", Fn::kMemFreeAsync, Fn::kMemFreeAsyncPtsz, 0},
      {"cuMemCreate", Fn::kMemCreate, Fn::kMemCreate, 0},
      {"cuMemRelease", Fn::kMemRelease, Fn::kMemRelease, 0},
      // v1 and v2 share the ABI (CUresult(CUdevice)).
      {"cuDevicePrimaryCtxReset", Fn::kDevicePrimaryCtxReset, Fn::kDevicePrimaryCtxReset, 0},
  };
  for (const Entry& entry : kEntries) {
    if (std::strcmp(entry.name, symbol) != 0) continue;
    if (cuda_version < entry.min_version) return Fn::kNone;
    return per_thread ? entry.per_thread_fn : entry.fn;
  }
  if (std::strcmp(symbol, "cuGetProcAddress") == 0) {
    return cuda_version >= 12000 ? Fn::kGetProcAddressV2 : Fn::kGetProcAddress;
  }
  return Fn::kNone;
}

void* real_function(Fn fn, int variant) {
  std::atomic<void*>& slot = g_real[static_cast<int>(fn)][variant];
  void* real = slot.load(std::memory_order_acquire);
  if (real != nullptr || variant != 0) return real;
  const Library library =
      static_cast<int>(fn) < kFirstRuntimeFn ? Library::kDriver : Library::kRuntime;
  real = next_definition(library, exported_name(fn));
  if (real == nullptr || is_our_wrapper(real)) return nullptr;
  slot.store(real, std::memory_order_release);  // every thread finds the same definition
  return real;
}

void* wrap_entry(Fn fn, void* real) {
  if (real == nullptr || fn == Fn::kNone || is_our_wrapper(real)) return real;
  if (real_function(fn, 0) == real) return wrapper_of(fn, 0);
  for (int v = 1; v < kVariants; ++v) {
    std::atomic<void*>& slot = g_real[static_cast<int>(fn)][v];
    void* expected = nullptr;
    if (slot.compare_exchange_strong(expected, real, std::memory_order_acq_rel) ||
        expected == real) {
      return wrapper_of(fn, v);
    }
  }
  count_unwrapped_lookup();
  return real;
}

}  // namespace vramledger::preload
