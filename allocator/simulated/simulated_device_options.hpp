// Shape of a simulated device. The defaults describe one H200-class GPU.
#pragma once

#include <cstddef>

namespace vramledger {

struct SimulatedDeviceOptions {
  // Physical memory: limits segment bytes (after segment_rounding) plus physical handles.
  std::size_t capacity_bytes = std::size_t{80} << 30;
  // VMM page granularity; address ranges, segments and mappings are aligned to it.
  // Must be a power of two.
  std::size_t granularity = std::size_t{2} << 20;
  // Without it, the virtual memory calls return kNotSupported (a cudaMalloc-only device).
  bool supports_virtual_memory = true;
  int device = 0;
  // cudaMalloc rounds every segment up to this; the rounding is charged against capacity but
  // the extra bytes are not accessible.
  std::size_t segment_rounding = std::size_t{2} << 20;
  // The driver lets one physical allocation be mapped at several addresses (the policy does so
  // on purpose with AllocatorOptions::alias_pending_pages); off, a second mapping is refused as a
  // policy bug, for tests that prove a configuration never aliases.
  bool allow_aliased_mappings = true;
};

}  // namespace vramledger
