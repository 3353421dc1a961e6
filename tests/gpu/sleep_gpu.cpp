// Sleep and wake by tag over the real VMM backend (issue 17, docs/sleep.md), and of a CUDA
// graph's private pool over sleepable segments (its graph launched after the wake). By tag:
// blocks of two tags (one offloaded, one discarded) and an awake neighbour, written by a kernel;
// after the sleep NVML sees the memory gone (within the pages kept for the neighbour), after the
// wake the offloaded blocks and the neighbour hold their pattern on the GPU, at the same
// addresses; the census agrees with the device throughout. Skips without a GPU; the CPU side is
// tests/policy/sleep_test.cpp and tests/policy/pool_sleep_test.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h>

#include <chrono>

#include "allocator/caching_allocator.hpp"
#include "allocator/sleepable_segment_backend.hpp"
#include "allocator/cuda/pinned_host_memory.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/pattern_kernels.hpp"

namespace vramledger::gpu_test {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr TagId kWeights = 1;
constexpr TagId kKv = 2;
constexpr TagId kAwake = 3;

std::int64_t total_reserved(const BlockCensus& census) {
  return census.pools[0].reserved_bytes + census.pools[1].reserved_bytes;
}
std::int64_t total_mapped(const BlockCensus& census) {
  return census.pools[0].mapped_bytes + census.pools[1].mapped_bytes;
}

class SleepGpu : public RealBackendTest {};

TEST_P(SleepGpu, MemoryGoesBackAndOffloadedBytesComeBackBitwise) {
  if (!backend().info().supports_virtual_memory) GTEST_SKIP() << "sleep needs VMM";
  TestStream stream;
  MismatchCounters counters;
  VRAMLEDGER_ASSERT_OK(warm_up_kernels(stream.handle()));
  std::string why;
  std::unique_ptr<NvmlDelta> nvml = NvmlDelta::open(kDevice, &why);
  auto allocator = std::make_unique<CachingAllocator>(backend(), nullptr);
  struct Block {
    DevicePtr ptr;
    std::size_t bytes;
    TagId tag;
    std::uint32_t seed;
  };
  std::vector<Block> blocks;
  std::uint32_t seed = 11;
  // Sizes that are multiples of 8 but not of the page: neighbours share pages.
  for (std::size_t bytes : {96 * kMiB + 8 * 1000, 40 * kMiB + 8 * 333, 8 * kMiB + 8 * 7}) {
    for (TagId tag : {kWeights, kKv, kAwake}) {
      const DevicePtr ptr = allocator->allocate(bytes, stream.handle(), tag);
      VRAMLEDGER_ASSERT_OK(fill_pattern(ptr, bytes, seed, stream.handle()));
      blocks.push_back({ptr, bytes, tag, seed++});
    }
  }
  VRAMLEDGER_ASSERT_OK(stream.synchronize());
  if (nvml) VRAMLEDGER_ASSERT_OK(nvml->rebase());
  const std::int64_t reserved_before = total_reserved(allocator->census());
  const std::int64_t mapped_before = total_mapped(allocator->census());

  const std::vector<TagId> tags = {kWeights, kKv};
  const std::vector<TagId> offload = {kWeights};
  const SleepResult slept = allocator->sleep(tags, offload);
  EXPECT_EQ(slept.blocks, 6u);
  const std::int64_t reserved_asleep = total_reserved(allocator->census());
  EXPECT_EQ(reserved_before - reserved_asleep, static_cast<std::int64_t>(slept.released_bytes));
  EXPECT_GE(slept.released_bytes + slept.resident_bytes + 8 * 2 * kMiB, slept.bytes)
      << "all but the pages kept for neighbours went back";
  if (nvml) {
    std::int64_t delta = 0;
    VRAMLEDGER_ASSERT_OK(nvml->delta(&delta));
    // Pinned host memory for the offload is not device memory; allow for a driver page anyway.
    EXPECT_NEAR(static_cast<double>(-delta), static_cast<double>(slept.released_bytes),
                2.0 * kMiB)
        << "NVML sees the released bytes go: " << mib(-delta) << " vs "
        << mib(static_cast<std::int64_t>(slept.released_bytes));
  } else {
    std::printf("NVML per-process figures unavailable: %s\n", why.c_str());
  }
  // The awake neighbours are untouched by their neighbours' sleep.
  VRAMLEDGER_ASSERT_OK(counters.reset());
  for (const Block& b : blocks) {
    if (b.tag != kAwake) continue;
    VRAMLEDGER_ASSERT_OK(count_mismatches(b.ptr, b.bytes, b.seed, stream.handle(), counters.at(0)));
  }
  EXPECT_EQ(counters.total(), 0u);

  const SleepResult woken = allocator->wake(tags);
  EXPECT_EQ(woken.blocks, 6u);
  EXPECT_EQ(total_mapped(allocator->census()), mapped_before) << "the same pages mapped again";
  VRAMLEDGER_ASSERT_OK(counters.reset());
  for (const Block& b : blocks) {
    EXPECT_EQ(allocator->describe(b.ptr).base, b.ptr);
    if (b.tag == kKv) continue;  // discarded
    VRAMLEDGER_ASSERT_OK(count_mismatches(b.ptr, b.bytes, b.seed, stream.handle(), counters.at(0)));
  }
  EXPECT_EQ(counters.total(), 0u) << "offloaded and awake bytes intact after the wake";
  // The discarded blocks are usable again.
  for (const Block& b : blocks) {
    if (b.tag == kKv) VRAMLEDGER_ASSERT_OK(fill_pattern(b.ptr, b.bytes, b.seed, stream.handle()));
  }
  VRAMLEDGER_ASSERT_OK(stream.synchronize());
  for (const Block& b : blocks) allocator->deallocate(b.ptr);
  allocator.reset();
}

// A CUDA graph's private pool sleeps whole (docs/sleep.md, "graphs"): a graph captured writing
// into a segment heap over sleepable segments, one block kept (its output) and one freed inside
// the capture (an intermediate it writes on every launch); after sleep_pool NVML sees every
// segment's memory go; after wake_pool the graph, launched again, writes the same bytes at the
// same addresses.
TEST_P(SleepGpu, AGraphPoolSleepsWholeAndItsGraphReplaysAfterTheWake) {
  if (!backend().info().supports_virtual_memory) GTEST_SKIP() << "sleepable segments need VMM";
  TestStream stream;
  MismatchCounters counters;
  VRAMLEDGER_ASSERT_OK(warm_up_kernels(stream.handle()));
  std::string why;
  std::unique_ptr<NvmlDelta> nvml = NvmlDelta::open(kDevice, &why);
  auto segments = std::make_unique<SleepableSegmentBackend>(backend());
  AllocatorOptions options;
  options.use_paged_heap = false;
  auto pool = std::make_unique<CachingAllocator>(*segments, nullptr, options);
  const auto cuda_stream = reinterpret_cast<cudaStream_t>(stream.handle());
  constexpr std::size_t kOutput = 48 * kMiB + 8 * 1000;
  constexpr std::size_t kScratch = 30 * kMiB;
  ASSERT_EQ(cudaStreamBeginCapture(cuda_stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  const DevicePtr output = pool->allocate(kOutput, stream.handle());
  const DevicePtr scratch = pool->allocate(kScratch, stream.handle());
  VRAMLEDGER_ASSERT_OK(fill_pattern(scratch, kScratch, 5, stream.handle()));
  VRAMLEDGER_ASSERT_OK(fill_pattern(output, kOutput, 7, stream.handle()));
  pool->deallocate(scratch);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(cuda_stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, cuda_stream), cudaSuccess);
  VRAMLEDGER_ASSERT_OK(stream.synchronize());
  if (nvml) VRAMLEDGER_ASSERT_OK(nvml->rebase());
  const std::int64_t reserved = total_reserved(pool->census());
  EXPECT_GE(reserved, static_cast<std::int64_t>(kOutput + kScratch));

  const SleepResult slept = pool->sleep_pool(/*offload=*/false);
  EXPECT_EQ(static_cast<std::int64_t>(slept.released_bytes), reserved) << "every segment, whole";
  EXPECT_EQ(total_reserved(pool->census()), 0);
  EXPECT_EQ(segments->released_count(), segments->segment_count());
  if (nvml) {
    std::int64_t delta = 0;
    VRAMLEDGER_ASSERT_OK(nvml->delta(&delta));
    EXPECT_NEAR(static_cast<double>(-delta), static_cast<double>(reserved), 2.0 * kMiB)
        << "NVML sees the pool's memory go: " << mib(-delta) << " vs " << mib(reserved);
  } else {
    std::printf("NVML per-process figures unavailable: %s\n", why.c_str());
  }

  const SleepResult woken = pool->wake_pool();
  EXPECT_EQ(static_cast<std::int64_t>(woken.mapped_bytes), reserved);
  ASSERT_EQ(cudaMemsetAsync(reinterpret_cast<void*>(output), 0, kOutput, cuda_stream), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, cuda_stream), cudaSuccess);
  VRAMLEDGER_ASSERT_OK(counters.reset());
  VRAMLEDGER_ASSERT_OK(count_mismatches(output, kOutput, 7, stream.handle(), counters.at(0)));
  VRAMLEDGER_ASSERT_OK(stream.synchronize());
  EXPECT_EQ(counters.total(), 0u) << "the graph wrote its output again after the wake";
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  pool->deallocate(output);
  pool.reset();
  EXPECT_EQ(segments->segment_count(), 0u) << "every segment went back with the pool";
  segments.reset();
}

// Both ways of pinning host memory for offloading (pinned_host_memory.hpp) give memory the device
// copies to and from; prints how long each took for 1 GiB (the benchmark times 8 GiB).
TEST(SleepPinnedHost, BothWaysPinMemoryTheDeviceCopiesThrough) {
  VRAMLEDGER_REQUIRE_GPU();
  constexpr std::size_t kBytes = std::size_t{1} << 30;
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(device, 0x5a, kBytes), cudaSuccess);
  for (PinMethod method : {PinMethod::kHostAlloc, PinMethod::kRegister}) {
    const auto start = std::chrono::steady_clock::now();
    void* host = nullptr;
    VRAMLEDGER_ASSERT_OK(allocate_pinned(kBytes, method, &host));
    const double pin_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    unsigned int flags = 0;
    EXPECT_EQ(cudaHostGetFlags(&flags, host), cudaSuccess) << to_string(method) << ": pinned";
    ASSERT_EQ(cudaMemcpy(host, device, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    const auto* bytes = static_cast<const unsigned char*>(host);
    EXPECT_EQ(bytes[0], 0x5a);
    EXPECT_EQ(bytes[kBytes - 1], 0x5a);
    std::printf("pin %s: 1 GiB in %.3f s\n", to_string(method).c_str(), pin_s);
    VRAMLEDGER_ASSERT_OK(free_pinned(host));
  }
  EXPECT_EQ(cudaFree(device), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(Vmm, SleepGpu, ::testing::Values(std::string("vmm")),
                         backend_param_name);

}  // namespace
}  // namespace vramledger::gpu_test
