// Concurrency on the GPU (issue 16): 16 threads share one CachingAllocator (the ledger attached)
// over a real backend and several real streams. Each thread allocates blocks of mixed sizes on
// any stream and fills every allocated byte with a kernel writing a pattern of its own; later it
// (or another thread the block was handed to) checks the pattern with a kernel, on the block's
// stream or on another stream ordered after the fill by an event (then `record_stream`, and a
// short spin first now and then, so the free stays pending while the reader runs), and frees it;
// now and then a thread empties the cache or completes pending frees. A block handed out twice,
// reused before another stream's reader finished, or mapped wrongly shows up as mismatched bytes
// (counted on the GPU, one counter per thread) or as overlapping live blocks (checked on the host).
// At the end: no mismatched byte, the ledger equals a census recount, no block left, the bytes
// NVML says this process holds above the start equal the census's reserved bytes, and after
// empty_cache both are 0.
//
// Knobs (environment): VRAMLEDGER_CONCURRENCY_OPS operations over all threads per backend (default
// 1,000,000), VRAMLEDGER_CONCURRENCY_SECONDS time limit per backend (default 60: the run stops
// early, then checks as usual, and says so), VRAMLEDGER_CONCURRENCY_NVML=0 leaves out the NVML
// comparisons (under compute-sanitizer, whose own device allocations move NVML's figure),
// VRAMLEDGER_CONCURRENCY_SEED.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/pattern_kernels.hpp"
#include "tests/stress/stress_env.hpp"

namespace vramledger::gpu_test {
namespace {

constexpr int kThreads = 16;
constexpr int kStreams = 4;
constexpr std::size_t kMaxLivePerThread = 24;

struct Held {
  DevicePtr ptr = 0;
  std::size_t bytes = 0;  // allocated (rounded) size: the pattern covers all of it
  std::uint32_t seed = 0;
  StreamHandle stream = 0;  // the stream it was allocated on (and filled on)
};

// What every thread shares. Blocks leave `live` before their free and enter it after their
// allocation, so an address can be handed out again only once it has left.
struct Shared {
  Shared(CachingAllocator& allocator_, DeviceBackend& backend_, MismatchCounters& counters_,
         std::chrono::steady_clock::time_point deadline_)
      : allocator(allocator_), backend(backend_), counters(counters_), deadline(deadline_) {}

  CachingAllocator& allocator;
  DeviceBackend& backend;
  std::vector<StreamHandle> streams;
  MismatchCounters& counters;
  std::chrono::steady_clock::time_point deadline;

  std::mutex mutex;  // guards live, mailbox and problem
  std::map<DevicePtr, std::size_t> live;
  std::vector<Held> mailbox;  // blocks handed from one thread to another
  std::string problem;
  std::atomic<bool> stop{false};
  std::atomic<bool> timed_out{false};
  std::atomic<std::uint32_t> next_seed{1};

  std::atomic<std::uint64_t> operations{0}, allocations{0}, frees{0}, cross_stream_frees{0},
      handed_over{0}, empty_caches{0};

  void fail(const std::string& what) {
    std::lock_guard lock(mutex);
    if (problem.empty()) problem = what;
    stop = true;
  }
  // Empty when the block overlaps no live one; else what it overlaps.
  std::string enter(DevicePtr ptr, std::size_t bytes) {
    std::lock_guard lock(mutex);
    auto after = live.lower_bound(ptr);
    if (after != live.end() && after->first < ptr + bytes) return "overlaps the next live block";
    if (after != live.begin() && std::prev(after)->first + std::prev(after)->second > ptr) {
      return "overlaps the previous live block";
    }
    live.emplace_hint(after, ptr, bytes);
    return {};
  }
  void leave(DevicePtr ptr) {
    std::lock_guard lock(mutex);
    live.erase(ptr);
  }
};

class Worker {
 public:
  // `ready`: this thread's event, made before the NVML baseline (the driver may back events
  // with device memory).
  Worker(Shared& shared, int index, std::uint64_t seed, std::uint64_t operations, EventHandle ready)
      : s_(shared), index_(index), rng_(seed * 1000003 + static_cast<std::uint64_t>(index)),
        operations_(operations), ready_(ready) {}

  void run() {
    try {
      for (std::uint64_t i = 0; i < operations_ && !s_.stop; ++i) {
        if (i % 256 == 0 && std::chrono::steady_clock::now() > s_.deadline) {
          s_.timed_out = true;
          s_.stop = true;
          break;
        }
        step();
        s_.operations.fetch_add(1, std::memory_order_relaxed);
      }
      while (!mine_.empty()) release_at(mine_.size() - 1);
    } catch (const Error& error) {
      s_.fail("thread " + std::to_string(index_) + ": " + error.what());
    }
  }

  // Checks the block's pattern and frees it (any thread may call this for a block it holds).
  void check_and_free(const Held& block) {
    const bool cross = s_.streams.size() > 1 && pick(3) == 0;
    StreamHandle reader = block.stream;
    if (cross) {
      do {
        reader = s_.streams[pick(s_.streams.size())];
      } while (reader == block.stream);
      ok(s_.backend.record_event(ready_, block.stream), "record_event");
      ok(s_.backend.stream_wait_event(reader, ready_), "stream_wait_event");
      // A slow reader: a free that did not wait for it would let the next fill overwrite the
      // bytes before this check runs.
      if (pick(4) == 0) ok(spin(20'000, reader), "spin");
    }
    ok(count_mismatches(block.ptr, block.bytes, block.seed, reader,
                        s_.counters.at(static_cast<std::size_t>(index_))),
       "count_mismatches");
    if (cross) s_.allocator.record_stream(block.ptr, reader);
    s_.leave(block.ptr);
    s_.allocator.deallocate(block.ptr);
    s_.frees.fetch_add(1, std::memory_order_relaxed);
    if (cross) s_.cross_stream_frees.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  std::size_t pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }

  void ok(const Status& status, const char* what) {
    if (!status) throw Error(ErrorCode::kDriverError, std::string(what) + ": " + status.message());
  }

  void step() {
    const std::size_t action = pick(1000);
    if (action < 480) {
      if (mine_.size() < kMaxLivePerThread) allocate();
    } else if (action < 880) {
      if (!mine_.empty()) release_at(pick(mine_.size()));
    } else if (action < 940) {
      if (!mine_.empty()) {  // hand a block to whichever thread takes it
        const std::size_t i = pick(mine_.size());
        {
          std::lock_guard lock(s_.mutex);
          s_.mailbox.push_back(mine_[i]);
        }
        mine_[i] = mine_.back();
        mine_.pop_back();
        s_.handed_over.fetch_add(1, std::memory_order_relaxed);
      }
    } else if (action < 990) {
      Held block;
      {
        std::lock_guard lock(s_.mutex);
        if (s_.mailbox.empty()) return;
        block = s_.mailbox.back();
        s_.mailbox.pop_back();
      }
      check_and_free(block);
    } else if (action < 998) {
      s_.allocator.process_completed_frees();
    } else {
      s_.allocator.empty_cache();
      s_.empty_caches.fetch_add(1, std::memory_order_relaxed);
    }
  }

  void allocate() {
    // Mixed sizes, log-uniform from 512 B to 16 MiB (small and large pools, splits, several
    // pages), and 1 in 100 of 64 MiB.
    const std::size_t bytes = pick(100) == 0
        ? std::size_t{64} << 20
        : static_cast<std::size_t>(std::exp2(std::uniform_real_distribution<double>(9.0, 24.0)(rng_)));
    Held block;
    block.stream = s_.streams[pick(s_.streams.size())];
    block.ptr = s_.allocator.allocate(bytes, block.stream);
    const AllocationInfo info = s_.allocator.describe(block.ptr);
    if (info.base != block.ptr || info.size < bytes) {
      s_.fail("describe() of a new block disagrees with it");
      return;
    }
    block.bytes = info.size;
    block.seed = s_.next_seed.fetch_add(1, std::memory_order_relaxed);
    if (const std::string overlap = s_.enter(block.ptr, block.bytes); !overlap.empty()) {
      s_.fail("a new block of " + std::to_string(block.bytes) + " B " + overlap);
      return;
    }
    ok(fill_pattern(block.ptr, block.bytes, block.seed, block.stream), "fill_pattern");
    mine_.push_back(block);
    s_.allocations.fetch_add(1, std::memory_order_relaxed);
  }

  void release_at(std::size_t i) {
    const Held block = mine_[i];
    mine_[i] = mine_.back();
    mine_.pop_back();
    check_and_free(block);
  }

  Shared& s_;
  int index_;
  std::mt19937_64 rng_;
  std::uint64_t operations_;
  EventHandle ready_ = 0;
  std::vector<Held> mine_;
};

std::int64_t total_reserved(const BlockCensus& census) {
  return census.pools[0].reserved_bytes + census.pools[1].reserved_bytes;
}

class ConcurrencyGpuTest : public RealBackendTest {};

TEST_P(ConcurrencyGpuTest, SixteenThreadsOverRealStreamsLoseNoByte) {
  const bool with_nvml = stress::env_u64("VRAMLEDGER_CONCURRENCY_NVML", 1) != 0;
  std::unique_ptr<NvmlDelta> nvml;
  if (with_nvml) {
    std::string why;
    nvml = NvmlDelta::open(kDevice, &why);
    if (!nvml) GTEST_SKIP() << "NVML unavailable: " << why;
  }
  const std::uint64_t total_ops = stress::env_u64("VRAMLEDGER_CONCURRENCY_OPS", 1'000'000);
  const std::uint64_t seed = stress::env_u64("VRAMLEDGER_CONCURRENCY_SEED", 2026);
  const auto seconds = std::chrono::seconds(stress::env_u64("VRAMLEDGER_CONCURRENCY_SECONDS", 60));

  std::vector<std::unique_ptr<TestStream>> streams;
  for (int i = 0; i < kStreams; ++i) streams.push_back(std::make_unique<TestStream>());
  MismatchCounters counters(kThreads);
  std::vector<EventHandle> events(kThreads);
  for (EventHandle& event : events) VRAMLEDGER_ASSERT_OK(backend_->create_event(&event));
  VRAMLEDGER_ASSERT_OK(warm_up_kernels(streams[0]->handle()));
  VRAMLEDGER_ASSERT_OK(backend_->synchronize_device());

  Ledger ledger;  // declared first: it outlives the allocator
  CachingAllocator allocator(*backend_, &ledger);
  {  // warm-up: both pools, and 1,024 cross-stream frees pending at once behind 50 ms kernels, so
     // the policy's spare events (kept until it is destroyed) are made before the NVML baseline
    for (int i = 1; i < kStreams; ++i) VRAMLEDGER_ASSERT_OK(spin(50'000'000, streams[i]->handle()));
    std::vector<DevicePtr> blocks;
    for (int i = 0; i < 1024; ++i) {
      blocks.push_back(allocator.allocate(i % 2 == 0 ? 4096 : (std::size_t{2} << 20),
                                          streams[0]->handle()));
      allocator.record_stream(blocks.back(), streams[1 + i % (kStreams - 1)]->handle());
    }
    for (DevicePtr ptr : blocks) allocator.deallocate(ptr);
    VRAMLEDGER_ASSERT_OK(backend_->synchronize_device());
    allocator.process_completed_frees();
    allocator.empty_cache();
  }
  if (nvml) VRAMLEDGER_ASSERT_OK(nvml->rebase());

  Shared shared(allocator, *backend_, counters, std::chrono::steady_clock::now() + seconds);
  for (const auto& stream : streams) shared.streams.push_back(stream->handle());
  const auto start = std::chrono::steady_clock::now();
  {
    std::vector<std::unique_ptr<Worker>> workers;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      workers.push_back(std::make_unique<Worker>(shared, t, seed, total_ops / kThreads,
                                                 events[static_cast<std::size_t>(t)]));
    }
    for (auto& worker : workers) threads.emplace_back([&worker] { worker->run(); });
    for (std::thread& thread : threads) thread.join();
    // Blocks handed over and not taken: thread 0's worker checks and frees them.
    for (const Held& block : shared.mailbox) {
      try {
        workers[0]->check_and_free(block);
      } catch (const Error& error) {
        shared.fail(std::string("freeing handed-over blocks: ") + error.what());
      }
    }
    shared.mailbox.clear();
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(shared.problem, "");

  VRAMLEDGER_ASSERT_OK(backend_->synchronize_device());
  allocator.process_completed_frees();
  std::vector<std::uint64_t> mismatched;
  VRAMLEDGER_ASSERT_OK(counters.read(&mismatched));
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(mismatched[static_cast<std::size_t>(t)], 0u)
        << "bytes of blocks checked by thread " << t << " were not their pattern";
  }
  const BlockCensus census = allocator.census();
  const ConsistencyReport report = check_consistency(ledger, census);
  EXPECT_TRUE(report.ok()) << report.to_string();
  EXPECT_EQ(census.pools[0].allocation + census.pools[1].allocation, 0) << "blocks left";
  const std::int64_t reserved = total_reserved(census);
  const LedgerCounters books = ledger.counters();
  char figures[512];
  std::snprintf(figures, sizeof figures,
                "%llu operations in %.2f s over %d threads and %d streams: %llu allocations, %llu "
                "frees (%llu cross-stream, %llu handed to another thread), %llu empty_cache; peak "
                "reserved %lld B, reserved at the end %lld B",
                static_cast<unsigned long long>(shared.operations.load()), elapsed, kThreads,
                kStreams, static_cast<unsigned long long>(shared.allocations.load()),
                static_cast<unsigned long long>(shared.frees.load()),
                static_cast<unsigned long long>(shared.cross_stream_frees.load()),
                static_cast<unsigned long long>(shared.handed_over.load()),
                static_cast<unsigned long long>(shared.empty_caches.load()),
                static_cast<long long>(books.aggregate().reserved_bytes.peak),
                static_cast<long long>(reserved));
  std::printf("[ info ] %s: %s\n", GetParam().c_str(), figures);
  if (shared.timed_out) {
    std::printf("[ info ] %s: the time limit stopped the run at %llu of %llu operations\n",
                GetParam().c_str(), static_cast<unsigned long long>(shared.operations.load()),
                static_cast<unsigned long long>(total_ops));
  }
  RecordProperty("operations", std::to_string(shared.operations.load()));
  RecordProperty("seconds", std::to_string(elapsed));
  RecordProperty("figures", figures);
  EXPECT_GT(shared.cross_stream_frees.load(), 0u);
  EXPECT_GT(shared.handed_over.load(), 0u);

  if (nvml) {  // what the driver says this process holds above the start: the reserved bytes
    std::int64_t held = 0;
    VRAMLEDGER_ASSERT_OK(nvml->delta(&held));
    EXPECT_EQ(held, reserved) << "NVML " << mib(held) << ", census reserved " << mib(reserved);
  }
  allocator.empty_cache();
  EXPECT_EQ(total_reserved(allocator.census()), 0);
  if (nvml) {
    std::int64_t held = 0;
    VRAMLEDGER_ASSERT_OK(nvml->delta(&held));
    EXPECT_EQ(held, 0) << "NVML: " << mib(held) << " still held after empty_cache";
  }
  for (EventHandle event : events) EXPECT_TRUE(backend_->destroy_event(event).is_ok());
}

// The backends whose memory NVML follows block by block; malloc_async's pool keeps freed memory.
INSTANTIATE_TEST_SUITE_P(VmmAndCudaMalloc, ConcurrencyGpuTest,
                         ::testing::Values(std::string("vmm"), std::string("cuda_malloc")),
                         backend_param_name);

}  // namespace
}  // namespace vramledger::gpu_test
