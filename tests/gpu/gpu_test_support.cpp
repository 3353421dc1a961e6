#include "tests/gpu/gpu_test_support.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <limits>

#include "allocator/cuda/cuda_status.hpp"
#include "tests/gpu/pattern_kernels.hpp"

namespace vramledger::gpu_test {

std::string backend_param_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

void RealBackendTest::SetUp() {
  VRAMLEDGER_REQUIRE_GPU();
  try {
    backend_ = make_cuda_backend(GetParam(), kDevice);
  } catch (const Error& error) {
    if (error.code() == ErrorCode::kNotSupported) GTEST_SKIP() << error.what();
    FAIL() << "make_cuda_backend(" << GetParam() << "): " << error.what();
  }
}

void RealBackendTest::TearDown() {
  if (backend_) {
    EXPECT_TRUE(backend_->synchronize_device().is_ok());
  }
}

TestStream::TestStream() {
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    (void)cudaGetLastError();
    ADD_FAILURE() << "cudaStreamCreateWithFlags failed";
  }
  handle_ = reinterpret_cast<StreamHandle>(stream);
}

TestStream::~TestStream() {
  if (handle_ != 0) (void)cudaStreamDestroy(reinterpret_cast<cudaStream_t>(handle_));
}

Status TestStream::synchronize() const {
  return runtime_status(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(handle_)),
                        "cudaStreamSynchronize", "stream=" + describe_address(handle_));
}

MismatchCounters::MismatchCounters(std::size_t count) : count_(count) {
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, count * sizeof(std::uint64_t)) != cudaSuccess) {
    (void)cudaGetLastError();
    ADD_FAILURE() << "cudaMalloc of the mismatch counters failed";
    return;
  }
  base_ = reinterpret_cast<std::uintptr_t>(ptr);
  (void)reset();
}

MismatchCounters::~MismatchCounters() {
  if (base_ != 0) (void)cudaFree(reinterpret_cast<void*>(base_));
}

Status MismatchCounters::reset() {
  return runtime_status(
      cudaMemset(reinterpret_cast<void*>(base_), 0, count_ * sizeof(std::uint64_t)), "cudaMemset",
      "mismatch counters");
}

Status MismatchCounters::read(std::vector<std::uint64_t>* out) const {
  if (Status s = runtime_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize", "");
      !s.is_ok()) {
    return s;
  }
  out->assign(count_, 0);
  return runtime_status(cudaMemcpy(out->data(), reinterpret_cast<const void*>(base_),
                                   count_ * sizeof(std::uint64_t), cudaMemcpyDeviceToHost),
                        "cudaMemcpy", "mismatch counters");
}

std::uint64_t MismatchCounters::total() const {
  std::vector<std::uint64_t> values;
  if (!read(&values).is_ok()) return std::numeric_limits<std::uint64_t>::max();
  std::uint64_t sum = 0;
  for (std::uint64_t v : values) sum += v;
  return sum;
}

Status warm_up_kernels(StreamHandle stream) {
  void* buffer = nullptr;
  if (Status s = runtime_status(cudaMalloc(&buffer, 4096), "cudaMalloc", "warm-up"); !s.is_ok()) {
    return s;
  }
  const auto ptr = reinterpret_cast<std::uintptr_t>(buffer);
  Status status = fill_pattern(ptr, 4088, 1, stream);
  if (status.is_ok()) status = count_mismatches(ptr, 4088, 1, stream, ptr + 4088);
  if (status.is_ok()) status = spin(1000, stream);
  if (status.is_ok()) {
    status = runtime_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize", "warm-up");
  }
  (void)cudaFree(buffer);
  return status;
}

std::unique_ptr<NvmlDelta> NvmlDelta::open(int device, std::string* why) {
  Status status;
  std::unique_ptr<NvmlProcessMemory> nvml = NvmlProcessMemory::open(device, &status);
  if (!nvml) {
    *why = status.message();
    return nullptr;
  }
  std::uint64_t used = 0;
  if (Status s = nvml->process_used_bytes(&used); !s.is_ok()) {
    *why = s.message();
    return nullptr;
  }
  auto delta = std::unique_ptr<NvmlDelta>(new NvmlDelta());
  delta->nvml_ = std::move(nvml);
  delta->baseline_ = used;
  return delta;
}

Status NvmlDelta::rebase() { return nvml_->process_used_bytes(&baseline_); }

Status NvmlDelta::delta(std::int64_t* out) const {
  std::uint64_t used = 0;
  if (Status s = nvml_->process_used_bytes(&used); !s.is_ok()) return s;
  *out = static_cast<std::int64_t>(used) - static_cast<std::int64_t>(baseline_);
  return Status::ok();
}

std::string mib(std::int64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f MiB (%lld B)", static_cast<double>(bytes) / (1 << 20),
                static_cast<long long>(bytes));
  return text;
}

}  // namespace vramledger::gpu_test
