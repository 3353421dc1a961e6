// The process's one VramledgerAllocator on the simulated device, for the plugin's self-tests and
// benchmarks (no GPU): backend:simulated, which VRAMLEDGER_TORCH_ALLOW_SIMULATED=1 permits (set
// here, before the allocator is created), one device.
#pragma once

#include <cstdlib>
#include <string>

#include "torch_plugin/vramledger_allocator.hpp"

namespace vramledger::torch_plugin {

// The plugin with `settings` added to backend:simulated ("" for none). The plugin is one per
// process: the first call's settings hold for every later one.
inline VramledgerAllocator& simulated_plugin(const std::string& settings) {
  static VramledgerAllocator& instance = [&]() -> VramledgerAllocator& {
    setenv("VRAMLEDGER_TORCH_ALLOW_SIMULATED", "1", 1);
    VramledgerAllocator& created = VramledgerAllocator::get_or_create(
        settings.empty() ? std::string("backend:simulated") : "backend:simulated," + settings);
    created.init(1);
    return created;
  }();
  return instance;
}

// With the settings of VRAMLEDGER_SIMULATED_PLUGIN_CONF, if set (the benchmark's
// front_cache_mb:64, say).
inline VramledgerAllocator& plugin() {
  const char* settings = std::getenv("VRAMLEDGER_SIMULATED_PLUGIN_CONF");
  return simulated_plugin(settings != nullptr ? settings : "");
}

}  // namespace vramledger::torch_plugin
