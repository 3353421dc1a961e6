#include "allocator/cuda/driver_api.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

#include "allocator/cuda/cuda_status.hpp"

namespace vramledger {

namespace {

// The ABI version we ask for: the typedefs above describe these functions as of CUDA 12.0.
constexpr unsigned int kDriverAbiVersion = 12000;

template <typename Fn>
Status resolve(const char* symbol, Fn* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &fn, kDriverAbiVersion, cudaEnableDefault, &found);
  if (err != cudaSuccess) {
    return runtime_status(err, "cudaGetDriverEntryPointByVersion",
                          std::string("symbol=") + symbol);
  }
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return {ErrorCode::kNotSupported,
            std::string("the installed CUDA driver does not provide ") + symbol +
                " (query result " + std::to_string(static_cast<int>(found)) + ")"};
  }
  *out = reinterpret_cast<Fn>(fn);
  return Status::ok();
}

struct Loaded {
  DriverApi api;
  Status status;
};

Loaded load() {
  Loaded loaded;
  DriverApi& api = loaded.api;
  const struct {
    const char* symbol;
    Status (*bind)(const char*, DriverApi&);
  } table[] = {
      {"cuGetErrorName", [](const char* s, DriverApi& a) { return resolve(s, &a.get_error_name); }},
      {"cuGetErrorString",
       [](const char* s, DriverApi& a) { return resolve(s, &a.get_error_string); }},
      {"cuDeviceGet", [](const char* s, DriverApi& a) { return resolve(s, &a.device_get); }},
      {"cuDeviceGetAttribute",
       [](const char* s, DriverApi& a) { return resolve(s, &a.device_get_attribute); }},
      {"cuMemGetAllocationGranularity",
       [](const char* s, DriverApi& a) { return resolve(s, &a.mem_get_allocation_granularity); }},
      {"cuMemCreate", [](const char* s, DriverApi& a) { return resolve(s, &a.mem_create); }},
      {"cuMemRelease", [](const char* s, DriverApi& a) { return resolve(s, &a.mem_release); }},
      {"cuMemAddressReserve",
       [](const char* s, DriverApi& a) { return resolve(s, &a.mem_address_reserve); }},
      {"cuMemAddressFree",
       [](const char* s, DriverApi& a) { return resolve(s, &a.mem_address_free); }},
      {"cuMemMap", [](const char* s, DriverApi& a) { return resolve(s, &a.mem_map); }},
      {"cuMemUnmap", [](const char* s, DriverApi& a) { return resolve(s, &a.mem_unmap); }},
      {"cuMemSetAccess", [](const char* s, DriverApi& a) { return resolve(s, &a.mem_set_access); }},
  };
  for (const auto& entry : table) {
    loaded.status = entry.bind(entry.symbol, api);
    if (!loaded.status.is_ok()) return loaded;
  }
  return loaded;
}

}  // namespace

Status load_driver_api(const DriverApi** out) {
  static const Loaded loaded = load();
  *out = loaded.status.is_ok() ? &loaded.api : nullptr;
  return loaded.status;
}

}  // namespace vramledger
