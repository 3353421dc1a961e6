// One DeviceBackend contract, instantiated over every backend (as RMM runs one test file over
// every memory resource): the same TEST_Ps (backend_contract.cpp) run for each BackendUnderTest
// a binary registers with INSTANTIATE_TEST_SUITE_P. The CPU backends (simulated, capped, routed)
// are instantiated in cpu_backends_test.cpp (CI), the private-pool backend in private_pool_backend_test.cpp (when
// the torch plugin builds), the CUDA backends in tests/gpu/backend_contract_gpu.cpp (skipped
// without a GPU).
//
// What every backend promises (device_backend.hpp): segments are distinct, aligned, and come
// back; lack of memory is a kOutOfMemory Status that changes nothing and does not stick; events
// can be created, recorded, waited for and destroyed; the virtual memory calls either work as a
// set or all say kNotSupported, as info().supports_virtual_memory announces. The contract reads
// device memory only through the backend's own copies (copy_to_host, for sleep and wake), so it
// runs over backends whose memory the CPU cannot touch.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "allocator/device_backend.hpp"

namespace vramledger::contract {

// A backend and whatever it needs kept alive (the device it wraps, a fake driver, ...).
class BackendFixture {
 public:
  virtual ~BackendFixture() = default;
  virtual DeviceBackend& backend() = 0;
  // A stream the tests may queue on (0, the legacy default stream, unless overridden).
  virtual StreamHandle stream() { return 0; }
};

struct BackendUnderTest {
  std::string name;  // a GoogleTest parameter name: letters, digits, underscores
  // nullptr skips the backend (e.g. no GPU); `why_skipped` says why.
  std::function<std::unique_ptr<BackendFixture>(std::string* why_skipped)> make;
};

class BackendContractTest : public ::testing::TestWithParam<BackendUnderTest> {
 protected:
  void SetUp() override;
  DeviceBackend& backend() { return fixture_->backend(); }
  StreamHandle stream() { return fixture_->stream(); }

 private:
  std::unique_ptr<BackendFixture> fixture_;
};

// For INSTANTIATE_TEST_SUITE_P: names each instance after its backend.
std::string backend_name(const ::testing::TestParamInfo<BackendUnderTest>& info);

// A fixture owning one backend object.
template <typename Backend>
class Owning final : public BackendFixture {
 public:
  explicit Owning(std::unique_ptr<Backend> backend) : backend_(std::move(backend)) {}
  DeviceBackend& backend() override { return *backend_; }
  Backend& get() { return *backend_; }

 private:
  std::unique_ptr<Backend> backend_;
};

}  // namespace vramledger::contract
