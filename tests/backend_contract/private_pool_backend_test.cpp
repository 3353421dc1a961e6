// The DeviceBackend contract over the torch plugin's private-pool backend
// (torch_plugin/private_pool_backend.hpp), its segments and services from a simulated device.
// Without a foreign torch allocator it calls no CUDA, so it runs on the CPU; built only when the
// torch plugin builds (its header needs torch's). Release is allowed, as after torch released
// the pool: while a graph still uses the pool, free_segment refuses by design.
#include <memory>

#include "allocator/simulated/simulated_device.hpp"
#include "tests/backend_contract/backend_contract.hpp"
#include "torch_plugin/private_pool_backend.hpp"

namespace vramledger::contract {
namespace {

class PrivatePoolFixture final : public BackendFixture {
 public:
  PrivatePoolFixture() : pool_(device_, device_, /*foreign=*/nullptr) { pool_.allow_release(true); }
  DeviceBackend& backend() override { return pool_; }

 private:
  SimulatedDevice device_;
  torch_plugin::PrivatePoolBackend pool_;
};

INSTANTIATE_TEST_SUITE_P(
    TorchPlugin, BackendContractTest,
    ::testing::Values(BackendUnderTest{"private_pool_over_simulated",
                                       [](std::string*) -> std::unique_ptr<BackendFixture> {
                                         return std::make_unique<PrivatePoolFixture>();
                                       }}),
    backend_name);

}  // namespace
}  // namespace vramledger::contract
