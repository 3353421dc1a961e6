// The process's device memory at one instant, as the driver reports it, and the interface that
// samples it. The classification (process_classification.hpp) splits `process_used_bytes` into
// lines; everything else here is context.
//
// The accounting layer is std-only, so the real source lives with the CUDA layer:
// allocator/cuda/nvml_process_memory.hpp (NvmlProcessMemory) already has exactly the two calls
// a source needs; probe_process_memory_source.hpp adapts it (or anything shaped like it) without
// this folder seeing a CUDA or NVML header.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace vramledger {

struct ProcessMemory {
  // NVML's per-process used memory for this process on this device (nvmlDeviceGetComputeRunning
  // Processes): every allocation plus context, modules and driver reservations. Absent where the
  // driver does not report it (some containers, PID namespaces NVML cannot see, vGPU, WDDM).
  std::optional<std::int64_t> process_used_bytes;
  std::string process_used_unavailable;  // why it is absent (empty when present)

  // Whole-device figures (nvmlDeviceGetMemoryInfo: total and used = total - free). Every process
  // on the device plus the driver's own reservations.
  std::int64_t device_used_bytes = 0;
  std::int64_t device_total_bytes = 0;
};

class ProcessMemorySource {
 public:
  virtual ~ProcessMemorySource() = default;
  // One sample. Never throws for "data unavailable": that is what the optional is for.
  virtual ProcessMemory sample() = 0;
};

}  // namespace vramledger
