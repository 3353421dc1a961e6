// Load-time set-up, the load log line, and the shim's C API (vramledger_preload.h).
#include <cstdlib>
#include <cstring>

#include "preload/categories.hpp"
#include "preload/interposed_functions.hpp"
#include "preload/loader_hooks.hpp"
#include "preload/log.hpp"
#include "preload/routing.hpp"
#include "preload/torch_install.hpp"
#include "preload/usage_counters.hpp"
#include "abi/vramledger_preload.h"

namespace vramledger::preload {
namespace {

bool env_is_one(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// Priority 101: before ordinary constructors of later-initialised objects, so dlopen / dlsym
// calls made by other libraries' constructors already take the fast paths.
__attribute__((constructor(101))) void load_shim() {
  const bool watch_torch = env_is_one("VRAMLEDGER_PRELOAD_INSTALL_TORCH");
  init_loader_hooks(watch_torch);
  if (watch_torch) {
    log_line("tracking %d driver and %d runtime memory functions (direct, dlsym, "
             "cuGetProcAddress, cudaGetDriverEntryPoint*); will install the vramledger torch "
             "allocator from %s when libc10_cuda loads",
             kFirstRuntimeFn, kFnCount - kFirstRuntimeFn, torch_plugin_path());
  } else {
    log_line("tracking %d driver and %d runtime memory functions (direct, dlsym, "
             "cuGetProcAddress, cudaGetDriverEntryPoint*); torch allocator not installed by the "
             "shim (VRAMLEDGER_PRELOAD_INSTALL_TORCH=1 to do so)",
             kFirstRuntimeFn, kFnCount - kFirstRuntimeFn);
  }
  init_routing();
}

}  // namespace
}  // namespace vramledger::preload

extern "C" {

int vramledger_preload_get_stats(vramledger_preload_stats* out) {
  if (out == nullptr) return -1;
  vramledger::preload::fill_stats(out);
  return 0;
}

const char* vramledger_preload_category_name(int category) {
  return vramledger::preload::category_name(category);
}

int64_t vramledger_preload_route_release_idle(void) {
  return vramledger::preload::route_release_idle();
}

uint64_t vramledger_preload_overhead_ns(void) { return vramledger::preload::overhead_ns(); }

}  // extern "C"
