// Shared pieces of the GPU suites: skipping without a device, RAII streams and mismatch counters,
// and NVML sampling for the exactness tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "allocator/cuda/cuda_backend_factory.hpp"
#include "allocator/cuda/nvml_process_memory.hpp"
#include "allocator/device_backend.hpp"

// Every GPU test starts with this: on a machine without a usable device it skips, saying why.
#define VRAMLEDGER_REQUIRE_GPU()                                                            \
  do {                                                                                      \
    const std::string vramledger_no_gpu_reason = ::vramledger::cuda_device_unavailable_reason(); \
    if (!vramledger_no_gpu_reason.empty()) {                                                \
      GTEST_SKIP() << "no CUDA device: " << vramledger_no_gpu_reason;                       \
    }                                                                                       \
  } while (0)

#define VRAMLEDGER_ASSERT_OK(expr)                                   \
  do {                                                               \
    const ::vramledger::Status vramledger_status = (expr);           \
    ASSERT_TRUE(vramledger_status.is_ok()) << #expr << ": "          \
                                           << vramledger_status.message(); \
  } while (0)

namespace vramledger::gpu_test {

inline constexpr int kDevice = 0;

// gtest-friendly names for parameterised suites.
std::string backend_param_name(const ::testing::TestParamInfo<std::string>& info);

// A test over the real backend its parameter names: skipped without a GPU or where the device
// does not support that backend, and the device synchronised at the end.
class RealBackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override;     // derived SetUps: return early when IsSkipped() or HasFatalFailure()
  void TearDown() override;  // derived TearDowns: release what uses the backend first

  DeviceBackend& backend() { return *backend_; }
  std::size_t granularity() const { return backend_->info().granularity; }

  std::unique_ptr<DeviceBackend> backend_;
};

// A non-blocking stream, destroyed at scope exit.
class TestStream {
 public:
  TestStream();
  ~TestStream();
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  StreamHandle handle() const { return handle_; }
  Status synchronize() const;

 private:
  StreamHandle handle_ = 0;
};

// Device-side 64-bit counters for count_mismatches (one cudaMalloc for all of them, made before
// any exactness baseline is taken).
class MismatchCounters {
 public:
  explicit MismatchCounters(std::size_t count = 1);
  ~MismatchCounters();
  MismatchCounters(const MismatchCounters&) = delete;
  MismatchCounters& operator=(const MismatchCounters&) = delete;
  std::uintptr_t at(std::size_t i) const { return base_ + i * sizeof(std::uint64_t); }
  Status reset();                             // synchronous
  Status read(std::vector<std::uint64_t>* out) const;  // synchronous, after a device sync
  std::uint64_t total() const;                // synchronous; UINT64_MAX when reading failed

 private:
  std::uintptr_t base_ = 0;
  std::size_t count_ = 0;
};

// Runs every kernel once on a tiny buffer so module loading (lazy by default) and the first
// launch's driver allocations happen before an exactness baseline is taken.
Status warm_up_kernels(StreamHandle stream);

// NVML per-process usage relative to a baseline.
class NvmlDelta {
 public:
  // Null (and *why set) when NVML cannot report this process's usage.
  static std::unique_ptr<NvmlDelta> open(int device, std::string* why);
  Status rebase();                              // baseline := now
  Status delta(std::int64_t* out) const;        // now - baseline
  std::uint64_t baseline() const { return baseline_; }

 private:
  std::unique_ptr<NvmlProcessMemory> nvml_;
  std::uint64_t baseline_ = 0;
};

std::string mib(std::int64_t bytes);  // "12.00 MiB (12582912 B)"

}  // namespace vramledger::gpu_test
