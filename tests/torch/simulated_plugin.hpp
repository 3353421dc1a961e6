// The process's one VramledgerAllocator on the simulated device, for the plugin's self-tests and
// benchmarks (no GPU): backend:simulated, which VRAMLEDGER_TORCH_ALLOW_SIMULATED=1 permits (set
// here, before the allocator is created), one device. VRAMLEDGER_SIMULATED_PLUGIN_CONF adds
// settings (the benchmark's front_cache_mb:64, say).
#pragma once

#include <cstdlib>
#include <string>

#include "torch_plugin/vramledger_allocator.hpp"

namespace vramledger::torch_plugin {

inline VramledgerAllocator& plugin() {
  static VramledgerAllocator& instance = []() -> VramledgerAllocator& {
    setenv("VRAMLEDGER_TORCH_ALLOW_SIMULATED", "1", 1);
    std::string config = "backend:simulated";
    if (const char* more = std::getenv("VRAMLEDGER_SIMULATED_PLUGIN_CONF")) {
      if (*more != '\0') config += std::string(",") + more;
    }
    VramledgerAllocator& created = VramledgerAllocator::get_or_create(config);
    created.init(1);
    return created;
  }();
  return instance;
}

}  // namespace vramledger::torch_plugin
