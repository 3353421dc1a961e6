#include "preload/torch_install.hpp"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "preload/loader_hooks.hpp"
#include "preload/log.hpp"
#include "preload/real_symbols.hpp"
#include "preload/usage_counters.hpp"

namespace vramledger::preload {
namespace {

enum State : int { kWaiting = 0, kInstalling = 1, kDone = 2 };
std::atomic<int> g_state{kWaiting};

bool torch_cuda_loaded() {
  void* handle = real_dlopen()("libc10_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  dlclose(handle);  // NOLOAD took a reference
  return true;
}

using InstallFn = int (*)(const char*);
using LastErrorFn = const char* (*)();

void install_torch_allocator() {
  const char* plugin = torch_plugin_path();
  // RTLD_GLOBAL: the Python package finds the same instance through its own dlopen.
  void* library = real_dlopen()(plugin, RTLD_NOW | RTLD_GLOBAL);
  if (library == nullptr) {
    const char* error = dlerror();
    set_torch_install_state(-1);
    log_line("torch allocator NOT installed: cannot load %s (%s)", plugin, error ? error : "?");
    return;
  }
  auto install = reinterpret_cast<InstallFn>(real_dlsym()(library, "vramledger_install"));
  auto last_error = reinterpret_cast<LastErrorFn>(real_dlsym()(library, "vramledger_last_error"));
  if (install == nullptr) {
    set_torch_install_state(-1);
    log_line("torch allocator NOT installed: %s has no vramledger_install", plugin);
    return;
  }
  const char* conf = std::getenv("VRAMLEDGER_CONF");
  if (install(conf) != 0) {
    set_torch_install_state(-1);
    log_line("torch allocator NOT installed: %s", last_error ? last_error() : "refused");
    return;
  }
  set_torch_install_state(1);
  log_line("torch allocator installed from %s (conf \"%s\")", plugin, conf ? conf : "");
}

}  // namespace

const char* torch_plugin_path() {
  static char path[4096];
  if (const char* chosen = std::getenv("VRAMLEDGER_TORCH_PLUGIN"); chosen && *chosen) return chosen;
  std::snprintf(path, sizeof(path), "%slibvramledger_torch.so", shim_directory());
  return path;
}

}  // namespace vramledger::preload

extern "C" void* dlopen_watching_for_torch(const char* file, int mode) {
  using namespace vramledger::preload;
  void* handle = real_dlopen()(file, mode);
  if (handle == nullptr || g_state.load(std::memory_order_acquire) != kWaiting) return handle;
  if (!torch_cuda_loaded()) return handle;
  int expected = kWaiting;
  if (!g_state.compare_exchange_strong(expected, kInstalling)) return handle;
  install_torch_allocator();
  g_state.store(kDone, std::memory_order_release);
  stop_dlopen_watch();
  return handle;
}
