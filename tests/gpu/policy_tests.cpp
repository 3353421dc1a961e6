// Policy-level GPU tests: CachingAllocator over each real backend. Memory handed out is real and
// private, cross-stream reuse waits for the other stream, OOM near the real device limit is clean
// and recoverable, the cap holds, empty_cache gives memory back to the driver, and the census's
// reserved bytes equal what NVML says this process holds after every step.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "allocator/caching_allocator.hpp"
#include "allocator/cuda/cuda_backend_factory.hpp"
#include "allocator/cuda/malloc_async_backend.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/pattern_kernels.hpp"

namespace vramledger::gpu_test {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr std::size_t kTiB = std::size_t{1} << 40;

std::int64_t total_reserved(const BlockCensus& census) {
  return census.pools[0].reserved_bytes + census.pools[1].reserved_bytes;
}

class PolicyTest : public RealBackendTest {
 protected:
  void SetUp() override {
    RealBackendTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    allocator_ = std::make_unique<CachingAllocator>(*backend_, nullptr);
  }
  void TearDown() override {
    allocator_.reset();
    RealBackendTest::TearDown();
  }

  CachingAllocator& allocator() { return *allocator_; }
  MallocAsyncBackend* async_backend() { return dynamic_cast<MallocAsyncBackend*>(backend_.get()); }

  // What the driver should see for us: the census's reserved bytes, or for malloc_async the pool
  // underneath (which keeps freed segments until trimmed).
  std::int64_t driver_held_expected() {
    if (auto* async = async_backend()) {
      std::uint64_t reserved = 0;
      EXPECT_TRUE(async->reserved_bytes(&reserved).is_ok());
      return static_cast<std::int64_t>(reserved);
    }
    return total_reserved(allocator().census());
  }

  std::unique_ptr<CachingAllocator> allocator_;
};

struct Live {
  DevicePtr ptr;
  std::size_t bytes;  // allocated (rounded) size: the pattern covers every byte of it
  std::uint32_t seed;
};

TEST_P(PolicyTest, EveryAllocatedByteIsUsableAndPrivate) {
  TestStream stream;
  MismatchCounters counters;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> log_size(0.0, std::log2(64.0 * kMiB));
  std::vector<Live> live;
  std::uint32_t next_seed = 1;
  auto allocate_some = [&](int count) {
    for (int i = 0; i < count; ++i) {
      const auto requested = static_cast<std::size_t>(std::exp2(log_size(rng)));
      const DevicePtr ptr = allocator().allocate(requested, stream.handle());
      const AllocationInfo info = allocator().describe(ptr);
      ASSERT_EQ(info.base, ptr);
      ASSERT_GE(info.size, requested);
      live.push_back({ptr, info.size, next_seed});
      ASSERT_TRUE(fill_pattern(ptr, info.size, next_seed++, stream.handle()).is_ok());
    }
  };
  allocate_some(300);
  if (HasFatalFailure()) return;
  std::shuffle(live.begin(), live.end(), rng);
  for (std::size_t i = 0; i < live.size() / 2; ++i) allocator().deallocate(live[i].ptr);
  live.erase(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(live.size() / 2));
  allocate_some(200);  // reuses freed and split blocks
  if (HasFatalFailure()) return;
  for (const Live& l : live) {
    VRAMLEDGER_ASSERT_OK(count_mismatches(l.ptr, l.bytes, l.seed, stream.handle(), counters.at(0)));
  }
  EXPECT_EQ(counters.total(), 0u) << "some block overlapped another or lost its data";
  auto sorted = live;
  std::sort(sorted.begin(), sorted.end(), [](const Live& a, const Live& b) { return a.ptr < b.ptr; });
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    EXPECT_LE(sorted[i - 1].ptr + sorted[i - 1].bytes, sorted[i].ptr) << "blocks overlap";
  }
  for (const Live& l : live) allocator().deallocate(l.ptr);
  allocator().empty_cache();
}

TEST_P(PolicyTest, RecordStreamDelaysReuseUntilTheConsumerFinished) {
  TestStream producer;
  TestStream consumer;
  constexpr int kRounds = 40;
  constexpr std::size_t kBytes = 8 * kMiB;
  MismatchCounters counters(kRounds);
  EventHandle ready = 0;
  VRAMLEDGER_ASSERT_OK(backend_->create_event(&ready));
  for (int round = 0; round < kRounds; ++round) {
    const DevicePtr ptr = allocator().allocate(kBytes, producer.handle());
    const auto seed = static_cast<std::uint32_t>(round + 1);
    VRAMLEDGER_ASSERT_OK(fill_pattern(ptr, kBytes, seed, producer.handle()));
    VRAMLEDGER_ASSERT_OK(backend_->record_event(ready, producer.handle()));
    VRAMLEDGER_ASSERT_OK(backend_->stream_wait_event(consumer.handle(), ready));
    // The consumer is slow: if the block were reused at once, the next round's fill on the
    // producer would overwrite it before this check runs.
    VRAMLEDGER_ASSERT_OK(spin(2'000'000, consumer.handle()));
    VRAMLEDGER_ASSERT_OK(count_mismatches(ptr, kBytes, seed, consumer.handle(),
                                          counters.at(static_cast<std::size_t>(round))));
    allocator().record_stream(ptr, consumer.handle());
    allocator().deallocate(ptr);
  }
  std::vector<std::uint64_t> wrong;
  VRAMLEDGER_ASSERT_OK(counters.read(&wrong));
  for (int round = 0; round < kRounds; ++round) {
    EXPECT_EQ(wrong[static_cast<std::size_t>(round)], 0u) << "round " << round;
  }
  // Once the consumer is done, the memory is reusable: the cache does not grow without bound.
  allocator().process_completed_frees();
  const std::int64_t reserved_before = total_reserved(allocator().census());
  const DevicePtr again = allocator().allocate(kBytes, producer.handle());
  EXPECT_EQ(total_reserved(allocator().census()), reserved_before) << "completed frees reused";
  RecordProperty("reserved_after_rounds", std::to_string(reserved_before));
  allocator().deallocate(again);
  VRAMLEDGER_ASSERT_OK(backend_->destroy_event(ready));
  allocator().empty_cache();
}

TEST_P(PolicyTest, OutOfMemoryNearTheDeviceLimitThenRecovery) {
  TestStream stream;
  std::size_t free_at_start = 0, total = 0;
  VRAMLEDGER_ASSERT_OK(backend_->memory_info(&free_at_start, &total));
  // Made before the device is full: afterwards our cache holds everything and a cudaMalloc
  // outside the allocator fails (measured), as it would for any library next to a full cache.
  MismatchCounters counters;
  std::vector<DevicePtr> held;
  std::size_t held_bytes = 0;
  std::string message;
  for (std::size_t chunk : {2 * kGiB, 64 * kMiB}) {
    for (;;) {
      try {
        held.push_back(allocator().allocate(chunk, stream.handle()));
        held_bytes += chunk;
      } catch (const OutOfMemoryError& error) {
        EXPECT_EQ(error.code(), ErrorCode::kOutOfMemory);
        message = error.what();
        break;
      }
    }
  }
  const double share = static_cast<double>(held_bytes) / static_cast<double>(free_at_start);
  std::printf("[ info ] %s: held %.2f GiB of %.2f GiB free at start (%.4f) before OOM\n",
              GetParam().c_str(), static_cast<double>(held_bytes) / kGiB,
              static_cast<double>(free_at_start) / kGiB, share);
  RecordProperty("held_share_of_free", std::to_string(share));
  RecordProperty("oom_message", message);
  EXPECT_GT(share, 0.95) << "OOM came far from the device limit";
  EXPECT_FALSE(message.empty());
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess) << "OOM left a CUDA error behind";

  for (DevicePtr ptr : held) allocator().deallocate(ptr);
  // Recovery: a large block right after the OOM, and it is real memory.
  const DevicePtr big = allocator().allocate(4 * kGiB, stream.handle());
  VRAMLEDGER_ASSERT_OK(fill_pattern(big, 4 * kGiB, 99, stream.handle()));
  VRAMLEDGER_ASSERT_OK(count_mismatches(big, 4 * kGiB, 99, stream.handle(), counters.at(0)));
  EXPECT_EQ(counters.total(), 0u);
  allocator().deallocate(big);
  allocator().empty_cache();
  EXPECT_EQ(total_reserved(allocator().census()), 0);
}

TEST_P(PolicyTest, HardCapIsNeverExceeded) {
  TestStream stream;
  constexpr std::size_t kCap = 256 * kMiB;
  allocator().set_cap(kCap);
  EXPECT_EQ(allocator().cap(), kCap);
  std::vector<DevicePtr> held;
  std::string message;
  for (int i = 0; i < 100; ++i) {
    try {
      held.push_back(allocator().allocate(i % 3 == 0 ? 100 * 1024 : 24 * kMiB, stream.handle()));
    } catch (const OutOfMemoryError& error) {
      message = error.what();
      break;
    }
    ASSERT_LE(total_reserved(allocator().census()), static_cast<std::int64_t>(kCap));
  }
  EXPECT_FALSE(message.empty()) << "the cap never stopped allocation";
  EXPECT_NE(message.find("cap"), std::string::npos) << message;
  EXPECT_GE(held.size(), 12u) << "the cap stopped allocation far below it";
  RecordProperty("blocks_under_cap", std::to_string(held.size()));
  for (DevicePtr ptr : held) allocator().deallocate(ptr);
  allocator().set_cap(0);
  const DevicePtr big = allocator().allocate(512 * kMiB, stream.handle());
  allocator().deallocate(big);
  allocator().empty_cache();
}

TEST_P(PolicyTest, EmptyCacheReturnsMemoryToTheDriver) {
  std::string why;
  std::unique_ptr<NvmlDelta> nvml = NvmlDelta::open(kDevice, &why);
  if (!nvml) GTEST_SKIP() << "NVML unavailable: " << why;
  TestStream stream;
  VRAMLEDGER_ASSERT_OK(warm_up_kernels(stream.handle()));
  allocator().deallocate(allocator().allocate(4 * kMiB, stream.handle()));
  allocator().empty_cache();
  // The pool can only trim frees its stream has reached (measured: without this sync the
  // baseline kept a 32 MiB pool chunk that left later).
  VRAMLEDGER_ASSERT_OK(backend_->synchronize_device());
  if (auto* async = async_backend()) VRAMLEDGER_ASSERT_OK(async->trim(0));
  std::size_t free_before = 0, total = 0;
  VRAMLEDGER_ASSERT_OK(backend_->memory_info(&free_before, &total));
  VRAMLEDGER_ASSERT_OK(nvml->rebase());

  std::vector<DevicePtr> blocks = {allocator().allocate(kGiB, stream.handle())};
  for (int i = 0; i < 100; ++i) blocks.push_back(allocator().allocate(4096 + 4096 * i, stream.handle()));
  for (DevicePtr ptr : blocks) allocator().deallocate(ptr);
  const std::int64_t cached = total_reserved(allocator().census());
  EXPECT_GE(cached, static_cast<std::int64_t>(kGiB)) << "freed blocks stay cached";
  std::int64_t delta = 0;
  VRAMLEDGER_ASSERT_OK(nvml->delta(&delta));
  EXPECT_EQ(delta, driver_held_expected()) << "while cached";

  allocator().empty_cache();
  EXPECT_EQ(total_reserved(allocator().census()), 0);
  if (auto* async = async_backend()) {
    // The pool keeps what the policy gave back until it is trimmed.
    VRAMLEDGER_ASSERT_OK(backend_->synchronize_device());
    VRAMLEDGER_ASSERT_OK(async->trim(0));
  }
  VRAMLEDGER_ASSERT_OK(nvml->delta(&delta));
  EXPECT_EQ(delta, 0) << "NVML: memory went back to the driver";
  std::size_t free_after = 0;
  VRAMLEDGER_ASSERT_OK(backend_->memory_info(&free_after, &total));
  EXPECT_LE(std::llabs(static_cast<long long>(free_after) - static_cast<long long>(free_before)),
            static_cast<long long>(2 * granularity()))
      << "cudaMemGetInfo: free bytes back to the baseline";
  RecordProperty("cached_bytes", std::to_string(cached));
}

TEST_P(PolicyTest, DriverFailuresSurfaceAsClearErrors) {
  TestStream stream;
  try {
    (void)allocator().allocate(kTiB, stream.handle());
    FAIL() << "a 1 TiB allocation succeeded";
  } catch (const OutOfMemoryError& error) {
    const std::string text = error.what();
    RecordProperty("oom_message", text);
    const char* call = GetParam() == "vmm"            ? "cuMemCreate"
                       : GetParam() == "malloc_async" ? "cudaMallocFromPoolAsync"
                                                      : "cudaMalloc";
    EXPECT_NE(text.find(call), std::string::npos) << "the driver call is named: " << text;
    EXPECT_NE(text.find("1099511627776"), std::string::npos) << "the size is named: " << text;
  }
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess) << "the failure left a CUDA error behind";
  const DevicePtr ptr = allocator().allocate(kMiB, stream.handle());
  try {
    allocator().deallocate(ptr + 512);
    FAIL() << "freeing an interior pointer succeeded";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidPointer) << error.what();
  }
  allocator().deallocate(ptr);
  try {
    allocator().deallocate(ptr);
    FAIL() << "a double free succeeded";
  } catch (const Error& error) {
    EXPECT_TRUE(error.code() == ErrorCode::kDoubleFree ||
                error.code() == ErrorCode::kInvalidPointer)
        << error.what();
  }
  allocator().empty_cache();
}

// After every step of a random workload, the census's reserved bytes equal the change in this
// process's NVML usage (for malloc_async: the pool's reserve, which sits under the policy).
TEST_P(PolicyTest, ReservedBytesMatchNvmlAfterEveryStep) {
  std::string why;
  std::unique_ptr<NvmlDelta> nvml = NvmlDelta::open(kDevice, &why);
  if (!nvml) GTEST_SKIP() << "NVML unavailable: " << why;
  TestStream main_stream;
  TestStream side_stream;
  VRAMLEDGER_ASSERT_OK(warm_up_kernels(main_stream.handle()));
  {  // warm-up: both pools, a cross-stream free (creates events), empty_cache
    const DevicePtr small = allocator().allocate(4096, main_stream.handle());
    const DevicePtr large = allocator().allocate(32 * kMiB, main_stream.handle());
    allocator().record_stream(large, side_stream.handle());
    allocator().deallocate(small);
    allocator().deallocate(large);
    VRAMLEDGER_ASSERT_OK(backend_->synchronize_device());
    allocator().empty_cache();
    VRAMLEDGER_ASSERT_OK(backend_->synchronize_device());  // let the pool see the frees
    if (auto* async = async_backend()) VRAMLEDGER_ASSERT_OK(async->trim(0));
  }
  VRAMLEDGER_ASSERT_OK(nvml->rebase());

  std::mt19937_64 rng(2026);
  std::uniform_real_distribution<double> log_size(0.0, std::log2(256.0 * kMiB));
  std::uniform_int_distribution<int> action(0, 99);
  std::vector<DevicePtr> live;
  std::int64_t worst = 0;
  int steps = 0, exact = 0;
  auto check = [&](const char* what) {
    std::int64_t delta = 0;
    ASSERT_TRUE(nvml->delta(&delta).is_ok());
    const std::int64_t expected = driver_held_expected();
    const std::int64_t diff = delta - expected;
    worst = std::max<std::int64_t>(worst, std::llabs(diff));
    exact += diff == 0 ? 1 : 0;
    ++steps;
    ASSERT_LT(std::llabs(diff), static_cast<std::int64_t>(granularity()))
        << "step " << steps << " (" << what << "): NVML delta " << mib(delta) << " vs "
        << mib(expected);
    if (async_backend() != nullptr) {
      EXPECT_LE(total_reserved(allocator().census()), expected) << "census above the pool";
    }
  };
  for (int i = 0; i < 150; ++i) {
    const int a = action(rng);
    if (a < 65 || live.empty()) {
      const auto bytes = static_cast<std::size_t>(std::exp2(log_size(rng))) + 1;
      live.push_back(allocator().allocate(bytes, main_stream.handle()));
      if (a % 7 == 0) allocator().record_stream(live.back(), side_stream.handle());
      check("allocate");
      if (HasFatalFailure()) return;
    } else if (a < 95) {
      const std::size_t victim = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      allocator().deallocate(live[victim]);
      live[victim] = live.back();
      live.pop_back();
      check("deallocate");
      if (HasFatalFailure()) return;
    } else {
      allocator().empty_cache();
      check("empty_cache");
      if (HasFatalFailure()) return;
    }
  }
  for (DevicePtr ptr : live) allocator().deallocate(ptr);
  check("free all");
  VRAMLEDGER_ASSERT_OK(backend_->synchronize_device());
  allocator().empty_cache();
  check("empty_cache at end");
  EXPECT_EQ(total_reserved(allocator().census()), 0);
  std::printf("[ info ] %s: %d steps, %d exact, worst |NVML delta - reserved| = %lld B\n",
              GetParam().c_str(), steps, exact, static_cast<long long>(worst));
  RecordProperty("steps", std::to_string(steps));
  RecordProperty("exact_steps", std::to_string(exact));
  RecordProperty("worst_abs_diff_bytes", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(AllBackends, PolicyTest, ::testing::ValuesIn(cuda_backend_names()),
                         backend_param_name);

}  // namespace
}  // namespace vramledger::gpu_test
