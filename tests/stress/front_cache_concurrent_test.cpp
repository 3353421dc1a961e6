// Sixteen threads on one allocator with per-thread front caches and the ledger's shards
// (docs/design.md, 5): the peaks of sums over shards must be exact, and a replay of the ledger's
// trace into a fresh ledger must give the same counters and peaks. Suite 'concurrent', so CI
// also runs it under ThreadSanitizer.
//
// VRAMLEDGER_FRONT_CACHE_OPS sets the operations per thread of the random test (default
// 20,000; the recorded long run used 1,000,000: bench/results/); VRAMLEDGER_STRESS_SEED changes
// the random choices.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/errors.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "tests/stress/concat.hpp"
#include "tests/stress/ledger_replay_check.hpp"
#include "tests/stress/stress_env.hpp"

namespace vramledger::stress {
namespace {

constexpr int kThreads = 16;
constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

enum class Heap { kSegment, kPaged };

SimulatedDeviceOptions device_options(Heap heap) {
  SimulatedDeviceOptions options;
  options.capacity_bytes = 16 * kGiB;
  options.supports_virtual_memory = heap == Heap::kPaged;
  return options;
}

AllocatorOptions front_options() {
  AllocatorOptions options;
  options.front_cache_bytes = 64 * kMiB;
  return options;
}

class FrontCacheConcurrent : public testing::TestWithParam<Heap> {};

// Phases separated by barriers: every thread allocates some blocks, all wait, then free them.
// Within a phase the sums only rise, between phases they only fall, so the peak of the count and
// of the requested bytes is exactly the largest phase total, whatever the interleaving; a
// credit scheme that let a shard pass a peak unseen, or raised one too early, shows here.
TEST_P(FrontCacheConcurrent, PeaksOfSumsOverShardsAreExact) {
  SimulatedDevice device(device_options(GetParam()));
  Ledger ledger;
  CachingAllocator allocator(device, &ledger, front_options());
  std::vector<StreamHandle> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(device.create_stream());
  const std::uint64_t seed = env_u64("VRAMLEDGER_STRESS_SEED", 0x5eed'2026);
  constexpr int kPhases = 60;
  constexpr std::size_t kSizes[] = {512, 3 * kKiB + 512, 64 * kKiB, 700 * kKiB};
  // Per phase and thread: how many blocks of which size; per phase: the totals.
  std::vector<std::vector<std::pair<int, std::size_t>>> plan(kPhases);
  std::mt19937_64 rng(seed);
  std::int64_t expected_count = 0, expected_bytes = 0;
  std::vector<std::int64_t> expected_stream_bytes(kThreads, 0);
  for (int phase = 0; phase < kPhases; ++phase) {
    std::int64_t count = 0, bytes = 0;
    for (int t = 0; t < kThreads; ++t) {
      const int blocks = static_cast<int>(rng() % 9);
      const std::size_t size = kSizes[rng() % 4] - rng() % 500;
      plan[phase].emplace_back(blocks, size);
      count += blocks;
      bytes += blocks * static_cast<std::int64_t>(size);
      expected_stream_bytes[t] =
          std::max(expected_stream_bytes[t], blocks * static_cast<std::int64_t>(size));
    }
    expected_count = std::max(expected_count, count);
    expected_bytes = std::max(expected_bytes, bytes);
  }
  std::barrier sync(kThreads);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<DevicePtr> mine;
      for (int phase = 0; phase < kPhases; ++phase) {
        const auto [blocks, size] = plan[phase][t];
        try {
          for (int i = 0; i < blocks; ++i) mine.push_back(allocator.allocate(size, streams[t]));
        } catch (const Error&) {
          failures++;
        }
        sync.arrive_and_wait();  // every block of the phase is live now
        for (DevicePtr ptr : mine) allocator.deallocate(ptr);
        mine.clear();
        sync.arrive_and_wait();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_EQ(failures.load(), 0);
  const LedgerCounters counters = ledger.counters();
  EXPECT_EQ(counters.aggregate().allocation.peak, expected_count);
  EXPECT_EQ(counters.aggregate().requested_bytes.peak, expected_bytes);
  EXPECT_EQ(counters.aggregate().allocation.current, 0);
  for (const StreamUsage& entry : ledger.per_stream()) {
    const auto at = std::find(streams.begin(), streams.end(), entry.stream);
    ASSERT_NE(at, streams.end());
    EXPECT_EQ(entry.usage.requested_bytes.peak, expected_stream_bytes[at - streams.begin()]);
  }
  expect_consistent(ledger, allocator);
  expect_replay_agrees(ledger);
  // reset_peaks gives every shard's credit back: the next phase's peak is exact again.
  ledger.reset_peaks();
  EXPECT_EQ(ledger.counters().aggregate().requested_bytes.peak, 0);
  const DevicePtr one = allocator.allocate(1000, streams[0]);
  EXPECT_EQ(ledger.counters().aggregate().requested_bytes.peak, 1000);
  allocator.deallocate(one);
}

struct Mailbox {
  std::mutex mutex;
  std::vector<std::pair<DevicePtr, std::size_t>> letters;
};

// Random operations: front-cache sizes on own streams and on one shared stream, larger blocks
// and tagged requests through the heaps, frees of other threads' blocks, record_stream,
// empty_cache, census and queries while others allocate. Afterwards the census agrees with the
// ledger and a replay of the trace reproduces its counters and peaks. The per-stream fast path
// runs beside the caches (their misses and the heap's own-stream frees take it): its streams'
// shards counted events with split changes, which a front cache's shard never does.
TEST_P(FrontCacheConcurrent, SixteenThreadsOfRandomOperationsKeepTheBooksExact) {
  const std::uint64_t seed = env_u64("VRAMLEDGER_STRESS_SEED", 0x5eed'2026);
  const std::uint64_t ops = env_u64("VRAMLEDGER_FRONT_CACHE_OPS", 20'000);
  SimulatedDevice device(device_options(GetParam()));
  Ledger ledger;
  CachingAllocator allocator(device, &ledger, front_options());
  std::vector<StreamHandle> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(device.create_stream());
  const StreamHandle shared_stream = device.create_stream();
  Mailbox mailbox;
  std::atomic<int> failures{0};
  std::mutex failure_mutex;
  std::string first_failure;
  auto fail = [&](const std::string& what) {
    std::lock_guard lock(failure_mutex);
    if (failures++ == 0) first_failure = what;
  };
  constexpr std::size_t kSizes[] = {512, 1024, 8 * kKiB, 64 * kKiB, 256 * kKiB, 2 * kMiB};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 7919 + static_cast<std::uint64_t>(t));
      std::vector<std::pair<DevicePtr, std::size_t>> mine;
      for (std::uint64_t step = 0; step < ops && failures.load() == 0; ++step) {
        try {
          const std::uint64_t choice = rng() % 1000;
          if (choice < 480 && mine.size() < 48) {
            const std::size_t bytes =
                choice < 10 ? 40 * kMiB + rng() % kMiB : kSizes[rng() % 6] - rng() % 3;
            const StreamHandle stream = rng() % 4 == 0 ? shared_stream : streams[t];
            const TagId tag = choice < 40 ? TagId{3} : kUntagged;
            DevicePtr ptr = 0;
            try {
              ptr = allocator.allocate(bytes, stream, tag);
            } catch (const OutOfMemoryError&) {
              continue;  // others hold the memory: allowed, and the books must still balance
            }
            mine.emplace_back(ptr, bytes);
          } else if (choice < 900 && !mine.empty()) {
            const std::size_t at = rng() % mine.size();
            const auto block = mine[at];
            mine[at] = mine.back();
            mine.pop_back();
            if (rng() % 8 == 0) {
              std::lock_guard lock(mailbox.mutex);
              mailbox.letters.push_back(block);
            } else {
              allocator.deallocate(block.first);
            }
          } else if (choice < 960) {  // about as often as letters are posted
            std::pair<DevicePtr, std::size_t> letter{0, 0};
            {
              std::lock_guard lock(mailbox.mutex);
              if (!mailbox.letters.empty()) {
                letter = mailbox.letters.back();
                mailbox.letters.pop_back();
              }
            }
            if (letter.first != 0) allocator.deallocate(letter.first);
          } else if (choice < 970 && !mine.empty()) {
            allocator.record_stream(mine[rng() % mine.size()].first, streams[rng() % kThreads]);
          } else if (choice < 975) {
            allocator.process_completed_frees();
          } else if (choice < 977) {
            allocator.empty_cache();
          } else if (choice < 979) {
            (void)allocator.census();
          } else if (choice < 981) {
            (void)ledger.counters();
          } else if (!mine.empty()) {
            const auto [ptr, bytes] = mine[rng() % mine.size()];
            const AllocationInfo info = allocator.describe(ptr);
            if (!allocator.owns(ptr) || info.base != ptr || info.requested != bytes) {
              fail(concat("thread ", t, ": describe(", ptr, ") requested ", info.requested,
                          ", expected ", bytes));
            }
          }
        } catch (const Error& error) {
          fail(concat("thread ", t, ": ", error.what()));
        }
      }
      for (const auto& block : mine) allocator.deallocate(block.first);
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_EQ(failures.load(), 0) << first_failure;
  for (const auto& letter : mailbox.letters) allocator.deallocate(letter.first);
  allocator.process_completed_frees();
  const LedgerCounters counters = ledger.counters();
  EXPECT_EQ(counters.aggregate().allocation.current, 0);
  EXPECT_EQ(counters.aggregate().requested_bytes.current, 0);
  EXPECT_GT(counters.aggregate().requested_bytes.peak, 0);
  EXPECT_GT(ledger.shard_tally().fast_with_splits, 0u) << "the per-stream fast path never ran";
  expect_consistent(ledger, allocator);
  expect_replay_agrees(ledger);
  allocator.empty_cache();
  expect_consistent(ledger, allocator);
}

INSTANTIATE_TEST_SUITE_P(Heaps, FrontCacheConcurrent,
                         testing::Values(Heap::kSegment, Heap::kPaged),
                         [](const testing::TestParamInfo<Heap>& info) {
                           return info.param == Heap::kPaged ? "paged" : "segment";
                         });

}  // namespace
}  // namespace vramledger::stress
