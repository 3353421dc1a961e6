// This process's device memory as NVML (the driver's own per-process account, what nvidia-smi
// shows) reports it: the ground truth the ledger's exactness contract is checked against.
//
// libnvidia-ml.so.1 is dlopen'ed at run time: no link dependency and no nvml.h needed, so the
// library builds and runs where NVML is absent (open() then says why). The NVML device is found
// by the CUDA device's PCI bus id (falling back to its UUID), never by index: NVML ignores
// CUDA_VISIBLE_DEVICES and may order devices differently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "allocator/errors.hpp"

namespace vramledger {

class NvmlProcessMemory {
 public:
  // Loads and initialises NVML and finds the device matching CUDA device ordinal `cuda_device`.
  // Returns null and sets *status (kNotSupported when NVML is not installed, kDriverError for
  // NVML failures) when any step fails.
  static std::unique_ptr<NvmlProcessMemory> open(int cuda_device, Status* status);
  ~NvmlProcessMemory();  // nvmlShutdown, dlclose
  NvmlProcessMemory(const NvmlProcessMemory&) = delete;
  NvmlProcessMemory& operator=(const NvmlProcessMemory&) = delete;

  // Device memory NVML attributes to this process (getpid()) on the device, in bytes: every
  // allocation plus the context, modules and driver reservations. kNotSupported when NVML does
  // not report a figure (e.g. WDDM, some vGPU setups); kInvalidArgument when this process is not
  // among the device's compute processes (no context yet, or a PID namespace NVML cannot see).
  Status process_used_bytes(std::uint64_t* out) const;
  // Whole-device figures (nvmlDeviceGetMemoryInfo): every process plus driver reservations.
  Status device_memory(std::uint64_t* used_bytes, std::uint64_t* total_bytes) const;

  const std::string& pci_bus_id() const { return pci_bus_id_; }

 private:
  struct Api;
  NvmlProcessMemory() = default;

  void* library_ = nullptr;
  std::unique_ptr<Api> api_;
  void* device_ = nullptr;  // nvmlDevice_t
  std::string pci_bus_id_;
};

// One-shot convenience: open() then process_used_bytes(). Costs an NVML initialisation (tens of
// ms); keep a NvmlProcessMemory when sampling repeatedly.
Status nvml_process_used_bytes(int cuda_device, std::uint64_t* out);

}  // namespace vramledger
