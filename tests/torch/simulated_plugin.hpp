// The process's one VramledgerAllocator on the simulated device, for the plugin's self-tests and
// benchmarks (no GPU): backend:simulated, which VRAMLEDGER_TORCH_ALLOW_SIMULATED=1 permits (set
// here, before the allocator is created), one device.
#pragma once

#include <cstdlib>

#include "torch_plugin/vramledger_allocator.hpp"

namespace vramledger::torch_plugin {

inline VramledgerAllocator& plugin() {
  static VramledgerAllocator& instance = []() -> VramledgerAllocator& {
    setenv("VRAMLEDGER_TORCH_ALLOW_SIMULATED", "1", 1);
    VramledgerAllocator& created = VramledgerAllocator::get_or_create("backend:simulated");
    created.init(1);
    return created;
  }();
  return instance;
}

}  // namespace vramledger::torch_plugin
