#include "accounting/classification/probe_process_memory_source.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace vramledger {
namespace {

// Shaped like allocator/cuda's NvmlProcessMemory and its Status, without CUDA.
struct FakeStatus {
  bool ok = true;
  std::string text;
  bool is_ok() const { return ok; }
  const std::string& message() const { return text; }
};

struct FakeNvml {
  bool process_visible = true;
  std::uint64_t own = 641'728'512;
  std::uint64_t used = 650'969'088 + (std::uint64_t{8} << 30);
  std::uint64_t total = std::uint64_t{143'771} << 20;

  FakeStatus process_used_bytes(std::uint64_t* out) const {
    if (!process_visible) return {false, "kInvalidArgument: process not listed"};
    *out = own;
    return {};
  }
  FakeStatus device_memory(std::uint64_t* used_out, std::uint64_t* total_out) const {
    *used_out = used;
    *total_out = total;
    return {};
  }
};

TEST(ProbeProcessMemorySource, CopiesTheProbesFigures) {
  FakeNvml nvml;
  ProbeProcessMemorySource<FakeNvml> source(nvml);
  const ProcessMemory memory = source.sample();
  ASSERT_TRUE(memory.process_used_bytes.has_value());
  EXPECT_EQ(*memory.process_used_bytes, 641'728'512);
  EXPECT_EQ(memory.device_used_bytes, static_cast<std::int64_t>(nvml.used));
  EXPECT_EQ(memory.device_total_bytes, static_cast<std::int64_t>(nvml.total));
  EXPECT_TRUE(memory.process_used_unavailable.empty());
}

TEST(ProbeProcessMemorySource, ProcessNotVisibleLeavesTheReason) {
  FakeNvml nvml;
  nvml.process_visible = false;
  ProbeProcessMemorySource<FakeNvml> source(nvml);
  const ProcessMemory memory = source.sample();
  EXPECT_FALSE(memory.process_used_bytes.has_value());
  EXPECT_EQ(memory.process_used_unavailable, "kInvalidArgument: process not listed");
  EXPECT_EQ(memory.device_total_bytes, static_cast<std::int64_t>(nvml.total));
}

}  // namespace
}  // namespace vramledger
