#include "preload/loader_hooks.hpp"

#include <atomic>

#include "preload/interposed_functions.hpp"
#include "preload/real_symbols.hpp"
#include "preload/torch_install.hpp"

namespace {

void* dlsym_next_slow(void* handle, const char* name) {
  // Only before the constructor ran: the caller is then this file, not the program (rare).
  return vramledger::preload::real_dlsym()(handle, name);
}

void* dlopen_slow(const char* file, int mode) {
  return vramledger::preload::real_dlopen()(file, mode);
}

}  // namespace

// Read by loader_stubs.S; plain pointers (not std::atomic) so assembly can load them. Aligned
// word stores and loads are atomic on the supported targets.
extern "C" {
__attribute__((visibility("hidden"))) void* volatile vramledger_preload_dlsym_next_target =
    reinterpret_cast<void*>(&dlsym_next_slow);
__attribute__((visibility("hidden"))) void* volatile vramledger_preload_dlopen_target =
    reinterpret_cast<void*>(&dlopen_slow);

// dlsym(handle, name) for any handle but RTLD_NEXT: glibc's answer, with interposed memory
// functions (ctypes' CDLL("libcuda.so.1").cuMemAlloc_v2, cudart fetching cuGetProcAddress) swapped
// for wrappers bound to that answer.
__attribute__((visibility("hidden"))) void* vramledger_preload_dlsym_hook(void* handle,
                                                                          const char* name) {
  using namespace vramledger::preload;
  void* result = real_dlsym()(handle, name);
  if (result == nullptr) return nullptr;
  const Fn fn = fn_by_exported_name(name);
  return fn == Fn::kNone ? result : wrap_entry(fn, result);
}
}

namespace vramledger::preload {

void init_loader_hooks(bool watch_torch) {
  if (real_dlsym() == nullptr || real_dlopen() == nullptr) return;  // keep the slow paths
  vramledger_preload_dlsym_next_target = reinterpret_cast<void*>(real_dlsym());
  vramledger_preload_dlopen_target =
      watch_torch ? reinterpret_cast<void*>(&dlopen_watching_for_torch)
                  : reinterpret_cast<void*>(real_dlopen());
}

void stop_dlopen_watch() {
  if (real_dlopen() == nullptr) return;
  vramledger_preload_dlopen_target = reinterpret_cast<void*>(real_dlopen());
}

}  // namespace vramledger::preload
