#include "torch_plugin/ipc_driver.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <mutex>

#include "allocator/cuda/cuda_status.hpp"
#include "allocator/cuda/device_guard.hpp"
#include "allocator/text_format.hpp"

namespace vramledger::torch_plugin {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == 64, "ipc_handle.hpp assumes a 64-byte handle");

class CudaIpcDriver final : public IpcDriver {
 public:
  Status export_allocation(int device, DevicePtr base, std::size_t bytes,
                           std::string* handle) override {
    DeviceGuard guard(device);
    if (!guard.status().is_ok()) return guard.status();
    cudaIpcMemHandle_t raw{};
    Status status = check_runtime(
        cudaIpcGetMemHandle(&raw, reinterpret_cast<void*>(base)), "cudaIpcGetMemHandle", [&] {
          return "ptr=" + format_hex(base) + " bytes=" + std::to_string(bytes);
        });
    if (!status.is_ok()) return status;
    handle->assign(reinterpret_cast<const char*>(&raw), sizeof raw);
    return Status::ok();
  }

  Status open(int device, const std::string& handle, DevicePtr* base,
              std::size_t* bytes) override {
    if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
      return {ErrorCode::kInvalidArgument, "a cudaIpcMemHandle_t has 64 bytes"};
    }
    DeviceGuard guard(device);
    if (!guard.status().is_ok()) return guard.status();
    cudaIpcMemHandle_t raw;
    std::memcpy(&raw, handle.data(), sizeof raw);
    void* mapped = nullptr;
    Status status = check_runtime(
        cudaIpcOpenMemHandle(&mapped, raw, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle",
        [&] { return "device=" + std::to_string(device); });
    if (!status.is_ok()) return status;
    // The size of the whole allocation the handle names: cudaIpcOpenMemHandle does not say it.
    CUdeviceptr range_base = 0;
    std::size_t range_bytes = 0;
    status = address_range(reinterpret_cast<CUdeviceptr>(mapped), &range_base, &range_bytes);
    if (!status.is_ok()) {
      (void)cudaIpcCloseMemHandle(mapped);
      (void)cudaGetLastError();
      return status;
    }
    *base = reinterpret_cast<DevicePtr>(mapped);
    *bytes = range_bytes;
    return Status::ok();
  }

  Status close(int device, DevicePtr base) override {
    DeviceGuard guard(device);
    if (!guard.status().is_ok()) return guard.status();
    return check_runtime(cudaIpcCloseMemHandle(reinterpret_cast<void*>(base)),
                         "cudaIpcCloseMemHandle", [&] { return "ptr=" + format_hex(base); });
  }

 private:
  // cuMemGetAddressRange through the runtime's entry-point table (the driver library is not
  // linked: driver_api.hpp says why), resolved once.
  static Status address_range(CUdeviceptr ptr, CUdeviceptr* base, std::size_t* bytes) {
    static const PFN_cuMemGetAddressRange_v3020 get_range = [] {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
      if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                           &found) != cudaSuccess ||
          found != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        fn = nullptr;
      }
      return reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(fn);
    }();
    if (get_range == nullptr) {
      return {ErrorCode::kNotSupported,
              "the CUDA driver does not provide cuMemGetAddressRange (needed to size an "
              "imported CUDA IPC allocation)"};
    }
    return check_driver(get_range(base, bytes, ptr), "cuMemGetAddressRange",
                        [&] { return "ptr=" + format_hex(static_cast<DevicePtr>(ptr)); });
  }
};

// Handles are 64 bytes: a magic word, then base and size of the exported range.
class SimulatedIpcDriver final : public IpcDriver {
 public:
  Status export_allocation(int /*device*/, DevicePtr base, std::size_t bytes,
                           std::string* handle) override {
    handle->assign(64, '\0');
    std::memcpy(handle->data(), kMagic, sizeof kMagic);
    std::memcpy(handle->data() + 8, &base, sizeof base);
    std::memcpy(handle->data() + 16, &bytes, sizeof bytes);
    return Status::ok();
  }

  Status open(int /*device*/, const std::string& handle, DevicePtr* base,
              std::size_t* bytes) override {
    if (handle.size() != 64 || std::memcmp(handle.data(), kMagic, sizeof kMagic) != 0) {
      return {ErrorCode::kInvalidArgument,
              "not a handle of the simulated device (cudaIpcOpenMemHandle would fail too)"};
    }
    std::size_t size = 0;
    std::memcpy(&size, handle.data() + 16, sizeof size);
    std::lock_guard<std::mutex> lock(mutex_);
    *base = next_;
    *bytes = size;
    // Fake addresses far above the simulated device's, never reused, 2 MiB apart at least.
    next_ += (size + (DevicePtr{2} << 20)) & ~((DevicePtr{2} << 20) - 1);
    open_.emplace(*base, size);
    return Status::ok();
  }

  Status close(int /*device*/, DevicePtr base) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (open_.erase(base) == 0) {
      return {ErrorCode::kInvalidPointer, "simulated CUDA IPC: " + format_hex(base) +
                                              " is not an open mapping"};
    }
    return Status::ok();
  }

 private:
  static constexpr char kMagic[8] = {'v', 'l', 's', 'i', 'm', 'i', 'p', 'c'};
  std::mutex mutex_;
  DevicePtr next_ = DevicePtr{0x7e00} << 32;
  std::map<DevicePtr, std::size_t> open_;
};

}  // namespace

std::unique_ptr<IpcDriver> make_cuda_ipc_driver() { return std::make_unique<CudaIpcDriver>(); }
std::unique_ptr<IpcDriver> make_simulated_ipc_driver() {
  return std::make_unique<SimulatedIpcDriver>();
}

}  // namespace vramledger::torch_plugin
