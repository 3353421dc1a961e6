// The device a replay runs on: the simulated one, or (in builds with CUDA) a real backend on
// GPU 0, with one backend stream per trace stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "allocator/config.hpp"
#include "allocator/device_backend.hpp"
#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {

class ReplayDevice {
 public:
  // `backend` is "simulated" (or "auto") or a real backend name ("vmm", "cuda_malloc",
  // "malloc_async"); the latter throws Error(kNotSupported) without CUDA or a GPU.
  ReplayDevice(const std::string& backend, double simulated_capacity_gib);
  ~ReplayDevice();
  ReplayDevice(const ReplayDevice&) = delete;
  ReplayDevice& operator=(const ReplayDevice&) = delete;

  DeviceBackend& backend() { return *backend_; }
  SimulatedDevice* simulated() { return simulated_; }  // null on a real GPU
  // The stream standing for the trace's stream `index` (0 is the default stream); created on
  // first use.
  StreamHandle stream(std::uint32_t index);

 private:
  std::unique_ptr<DeviceBackend> backend_;
  SimulatedDevice* simulated_ = nullptr;
  std::vector<StreamHandle> streams_{0};
};

bool is_simulated_backend(const std::string& backend);
// "paged heap on vmm", "segment heap on simulated", ...
std::string describe_policy(const Config& config, const DeviceBackend& backend);

}  // namespace vramledger
