// The DeviceBackend contract over every backend that runs on the CPU: the simulated device (with
// and without virtual memory), the torch plugin's CappedBackend (the memory fraction; plain C++)
// over it, the sleepable segments of CUDA graph pools over it, and the routed cache's DriverSegmentBackend (preload/route/) over an in-process fake
// driver.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "allocator/simulated/simulated_device.hpp"
#include "allocator/sleepable_segment_backend.hpp"
#include "preload/route/driver_segment_backend.hpp"
#include "tests/backend_contract/backend_contract.hpp"
#include "torch_plugin/capped_backend.hpp"

namespace vramledger::contract {
namespace {

// Just enough of the driver for DriverSegmentBackend: addresses handed out from a counter (the
// contract never touches device memory), a capacity, contexts that push and pop, and events
// that complete at once (the fake device has no queue).
class FakeDriver {
 public:
  static constexpr std::size_t kCapacity = std::size_t{4} << 30;

  static route::RouteDriver table() {
    route::RouteDriver driver;
    driver.mem_alloc = &mem_alloc;
    driver.mem_free = &mem_free;
    driver.mem_get_info = &mem_get_info;
    driver.device_total_mem = [](size_t* total, route::CUdevice) -> CUresult {
      *total = kCapacity;
      return 0;
    };
    driver.ctx_get_current = [](route::CUcontext* out) -> CUresult {
      *out = context();
      return 0;
    };
    driver.ctx_get_device = [](route::CUdevice* out) -> CUresult {
      *out = 0;
      return 0;
    };
    driver.ctx_push_current = [](route::CUcontext) -> CUresult { return 0; };
    driver.ctx_pop_current = [](route::CUcontext* out) -> CUresult {
      if (out != nullptr) *out = context();
      return 0;
    };
    driver.ctx_synchronize = []() -> CUresult { return 0; };
    driver.primary_ctx_retain = [](route::CUcontext* out, route::CUdevice) -> CUresult {
      *out = context();
      return 0;
    };
    driver.primary_ctx_get_state = [](route::CUdevice, unsigned int* flags,
                                      int* active) -> CUresult {
      *flags = 0;
      *active = 1;
      return 0;
    };
    driver.event_create = [](route::CUevent* out, unsigned int) -> CUresult {
      *out = reinterpret_cast<route::CUevent>(new int(0));
      return 0;
    };
    driver.event_destroy = [](route::CUevent event) -> CUresult {
      delete reinterpret_cast<int*>(event);
      return 0;
    };
    driver.event_record = [](route::CUevent, CUstream) -> CUresult { return 0; };
    driver.event_query = [](route::CUevent) -> CUresult { return 0; };
    driver.event_synchronize = [](route::CUevent) -> CUresult { return 0; };
    driver.stream_wait_event = [](CUstream, route::CUevent, unsigned int) -> CUresult {
      return 0;
    };
    return driver;
  }
  static route::CUcontext context() { return reinterpret_cast<route::CUcontext>(&live_); }

 private:
  static CUresult mem_alloc(CUdeviceptr* out, size_t bytes) {
    std::lock_guard lock(mutex_);
    const std::size_t rounded = (bytes + kPage - 1) / kPage * kPage;
    if (bytes == 0) return 1;                              // CUDA_ERROR_INVALID_VALUE
    if (rounded > kCapacity - live_) return 2;             // CUDA_ERROR_OUT_OF_MEMORY
    *out = next_;
    next_ += rounded + kPage;  // never reused, never touching
    allocations_[*out] = rounded;
    live_ += rounded;
    return 0;
  }
  static CUresult mem_free(CUdeviceptr ptr) {
    std::lock_guard lock(mutex_);
    auto it = allocations_.find(ptr);
    if (it == allocations_.end()) return 1;
    live_ -= it->second;
    allocations_.erase(it);
    return 0;
  }
  static CUresult mem_get_info(size_t* free_bytes, size_t* total_bytes) {
    std::lock_guard lock(mutex_);
    *free_bytes = kCapacity - live_;
    *total_bytes = kCapacity;
    return 0;
  }

  static constexpr std::size_t kPage = std::size_t{2} << 20;
  static inline std::mutex mutex_;
  static inline std::map<CUdeviceptr, std::size_t> allocations_;
  static inline std::size_t live_ = 0;
  static inline CUdeviceptr next_ = CUdeviceptr{1} << 40;
};

// The routed backend keeps a reference to its driver table, so the fixture owns both.
class RoutedFixture final : public BackendFixture {
 public:
  RoutedFixture() : driver_(FakeDriver::table()), backend_(driver_, 0, FakeDriver::context()) {}
  DeviceBackend& backend() override { return backend_; }

 private:
  route::RouteDriver driver_;
  route::DriverSegmentBackend backend_;
};

// The memory fraction's cap over a simulated device: under the cap it must behave as the device.
class CappedFixture final : public BackendFixture {
 public:
  explicit CappedFixture(std::size_t cap_bytes) : capped_(device_, budget_) {
    budget_.set_cap(cap_bytes);
  }
  DeviceBackend& backend() override { return capped_; }

 private:
  SimulatedDevice device_;
  torch_plugin::DeviceReservation budget_;
  torch_plugin::CappedBackend capped_;
};

// CUDA graph pools' sleepable segments (one reservation and one chunk each) over the device.
class SleepableFixture final : public BackendFixture {
 public:
  SleepableFixture() : segments_(device_) {}
  DeviceBackend& backend() override { return segments_; }

 private:
  SimulatedDevice device_;
  SleepableSegmentBackend segments_;
};

std::unique_ptr<BackendFixture> simulated(bool virtual_memory) {
  SimulatedDeviceOptions options;
  options.supports_virtual_memory = virtual_memory;
  return std::make_unique<Owning<SimulatedDevice>>(std::make_unique<SimulatedDevice>(options));
}

INSTANTIATE_TEST_SUITE_P(
    CpuBackends, BackendContractTest,
    ::testing::Values(
        BackendUnderTest{"simulated_vmm", [](std::string*) { return simulated(true); }},
        BackendUnderTest{"simulated_segments", [](std::string*) { return simulated(false); }},
        BackendUnderTest{"capped_simulated_vmm",
                         [](std::string*) -> std::unique_ptr<BackendFixture> {
                           return std::make_unique<CappedFixture>(std::size_t{1} << 30);
                         }},
        BackendUnderTest{"sleepable_segments_simulated",
                         [](std::string*) -> std::unique_ptr<BackendFixture> {
                           return std::make_unique<SleepableFixture>();
                         }},
        BackendUnderTest{"routed_driver_segments",
                         [](std::string*) -> std::unique_ptr<BackendFixture> {
                           return std::make_unique<RoutedFixture>();
                         }}),
    backend_name);

}  // namespace
}  // namespace vramledger::contract
