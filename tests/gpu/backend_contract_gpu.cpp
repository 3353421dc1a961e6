// The DeviceBackend contract (tests/backend_contract/) over the CUDA backends: cudaMalloc, VMM
// and the cudaMallocAsync pool, and the sleepable segments of CUDA graph pools over VMM. Without a GPU the binary reports itself skipped
// (gpu_test_main.cpp); a backend the device cannot offer is skipped with the reason.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "allocator/cuda/cuda_backend_factory.hpp"
#include "allocator/sleepable_segment_backend.hpp"
#include "tests/backend_contract/backend_contract.hpp"

namespace vramledger::contract {
namespace {

// Graph pools' segments (docs/sleep.md): one reservation and one chunk each, over the VMM backend.
class SleepableOverVmm final : public BackendFixture {
 public:
  explicit SleepableOverVmm(std::unique_ptr<DeviceBackend> vmm)
      : vmm_(std::move(vmm)), segments_(std::make_unique<SleepableSegmentBackend>(*vmm_)) {}
  ~SleepableOverVmm() override { segments_.reset(); }
  DeviceBackend& backend() override { return *segments_; }

 private:
  std::unique_ptr<DeviceBackend> vmm_;
  std::unique_ptr<SleepableSegmentBackend> segments_;
};

std::vector<BackendUnderTest> cuda_backends() {
  std::vector<BackendUnderTest> backends;
  for (const std::string& name : cuda_backend_names()) {
    backends.push_back({name, [name](std::string* why_skipped) -> std::unique_ptr<BackendFixture> {
                          if (!cuda_device_available()) {
                            *why_skipped = "no CUDA device: " + cuda_device_unavailable_reason();
                            return nullptr;
                          }
                          try {
                            return std::make_unique<Owning<DeviceBackend>>(
                                make_cuda_backend(name, /*device=*/0));
                          } catch (const Error& error) {
                            if (error.code() != ErrorCode::kNotSupported) throw;
                            *why_skipped = error.what();
                            return nullptr;
                          }
                        }});
  }
  backends.push_back({"sleepable_segments_vmm",
                      [](std::string* why_skipped) -> std::unique_ptr<BackendFixture> {
                        if (!cuda_device_available()) {
                          *why_skipped = "no CUDA device: " + cuda_device_unavailable_reason();
                          return nullptr;
                        }
                        try {
                          return std::make_unique<SleepableOverVmm>(make_cuda_backend("vmm", 0));
                        } catch (const Error& error) {
                          if (error.code() != ErrorCode::kNotSupported) throw;
                          *why_skipped = error.what();
                          return nullptr;
                        }
                      }});
  return backends;
}

INSTANTIATE_TEST_SUITE_P(CudaBackends, BackendContractTest, ::testing::ValuesIn(cuda_backends()),
                         backend_name);

}  // namespace
}  // namespace vramledger::contract
