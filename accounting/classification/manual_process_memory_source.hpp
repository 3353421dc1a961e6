// A ProcessMemorySource whose figures are set by hand: the fake the tests script, and the way an
// integration that samples NVML itself (Python through pynvml, a sidecar) feeds the profiler.
#pragma once

#include <cstdint>
#include <string>

#include "accounting/classification/process_memory.hpp"

namespace vramledger {

class ManualProcessMemorySource final : public ProcessMemorySource {
 public:
  ManualProcessMemorySource() = default;
  explicit ManualProcessMemorySource(ProcessMemory memory) : memory_(std::move(memory)) {}

  ProcessMemory sample() override { return memory_; }

  void set(ProcessMemory memory) { memory_ = std::move(memory); }
  ProcessMemory& memory() noexcept { return memory_; }

  // Shorthands for scripted scenarios: our process and a neighbour move device-used alike, but
  // only our own change moves process_used_bytes.
  void add_own_bytes(std::int64_t bytes) {
    if (memory_.process_used_bytes) *memory_.process_used_bytes += bytes;
    memory_.device_used_bytes += bytes;
  }
  void add_neighbour_bytes(std::int64_t bytes) { memory_.device_used_bytes += bytes; }
  void make_process_usage_unavailable(std::string why) {
    memory_.process_used_bytes.reset();
    memory_.process_used_unavailable = std::move(why);
  }

 private:
  ProcessMemory memory_;
};

}  // namespace vramledger
