#include "torch_plugin/routed_cache_release.hpp"

#include <dlfcn.h>

namespace vramledger::torch_plugin {

std::int64_t release_routed_cache_idle() noexcept {
  using ReleaseIdle = std::int64_t (*)();
  // Looked up at each call (rare: only on the way to out of memory); the shim is in the global
  // scope from process start when it is there at all.
  auto release = reinterpret_cast<ReleaseIdle>(
      dlsym(RTLD_DEFAULT, "vramledger_preload_route_release_idle"));
  return release != nullptr ? release() : 0;
}

}  // namespace vramledger::torch_plugin
