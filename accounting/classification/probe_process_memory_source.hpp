// Adapts any probe shaped like allocator/cuda/nvml_process_memory.hpp's NvmlProcessMemory into a
// ProcessMemorySource:
//
//   Status process_used_bytes(std::uint64_t* out) const;
//   Status device_memory(std::uint64_t* used, std::uint64_t* total) const;
//
// where Status has is_ok() and message(). A template so this std-only folder never includes the
// CUDA layer; an integration writes
//   auto nvml = NvmlProcessMemory::open(device, &status);
//   ProbeProcessMemorySource<NvmlProcessMemory> source(*nvml);
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "accounting/classification/process_memory.hpp"

namespace vramledger {

template <typename Probe>
class ProbeProcessMemorySource final : public ProcessMemorySource {
 public:
  explicit ProbeProcessMemorySource(const Probe& probe) : probe_(probe) {}

  ProcessMemory sample() override {
    ProcessMemory memory;
    // Device figures first, then our own: a neighbour's change between the two reads can only
    // make "other processes" stale, never our own line.
    std::uint64_t used = 0;
    std::uint64_t total = 0;
    const auto device_status = probe_.device_memory(&used, &total);
    if (device_status.is_ok()) {
      memory.device_used_bytes = to_signed(used);
      memory.device_total_bytes = to_signed(total);
    }
    std::uint64_t own = 0;
    const auto own_status = probe_.process_used_bytes(&own);
    if (own_status.is_ok()) {
      memory.process_used_bytes = to_signed(own);
    } else {
      memory.process_used_unavailable = own_status.message();
    }
    return memory;
  }

 private:
  // Device memory sizes are far below 2^63; saturate instead of wrapping if a driver lies.
  static std::int64_t to_signed(std::uint64_t bytes) {
    constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    return static_cast<std::int64_t>(bytes > kMax ? kMax : bytes);
  }

  const Probe& probe_;
};

}  // namespace vramledger
