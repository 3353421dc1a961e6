// What CUDA IPC asks of the driver, behind an interface so the bookkeeping above it
// (ipc_imports.hpp, the plugin's shareIpcHandle / getIpcDevPtr) runs on the simulated device in
// CI: export a cudaMalloc allocation as a cudaIpcMemHandle_t, map one exported by another process,
// unmap it. (docs/ipc.md)
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "allocator/device_backend.hpp"

namespace vramledger::torch_plugin {

class IpcDriver {
 public:
  virtual ~IpcDriver() = default;
  // The 64-byte handle of the driver allocation of `bytes` that starts at `base` on `device`.
  virtual Status export_allocation(int device, DevicePtr base, std::size_t bytes,
                                   std::string* handle) = 0;
  // Maps the allocation `handle` names on `device`: its address in this process and its size.
  // A handle may be mapped once per process: the caller keeps one mapping per handle.
  virtual Status open(int device, const std::string& handle, DevicePtr* base,
                      std::size_t* bytes) = 0;
  virtual Status close(int device, DevicePtr base) = 0;
};

// cudaIpcGetMemHandle / cudaIpcOpenMemHandle (peer access enabled lazily, as torch) /
// cudaIpcCloseMemHandle; the size from cuMemGetAddressRange.
std::unique_ptr<IpcDriver> make_cuda_ipc_driver();

// The simulated device (backend:simulated, tests): a handle names (base, bytes) in this process,
// and opening it maps it at a fresh fake address, as another process would see it.
std::unique_ptr<IpcDriver> make_simulated_ipc_driver();

}  // namespace vramledger::torch_plugin
