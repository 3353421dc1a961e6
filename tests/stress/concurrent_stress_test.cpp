// Eight threads share one allocator with the ledger attached: mixed allocate / free /
// record_stream on their own streams and on shared ones, frees of blocks other threads
// allocated, and occasional empty_cache and queries. Afterwards the books must balance and every
// byte must be back. CI also runs this under ThreadSanitizer (suite 'concurrent').
//
// VRAMLEDGER_CONCURRENT_OPS sets the operations per thread (default 20,000);
// VRAMLEDGER_STRESS_SEED changes the random choices.
#include <gtest/gtest.h>

#include <atomic>
#include <iterator>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "accounting/tag_registry.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "tests/stress/concat.hpp"
#include "tests/stress/stress_env.hpp"

namespace vramledger::stress {
namespace {

constexpr int kThreads = 8;
constexpr int kSharedStreams = 2;
constexpr std::size_t kMaxLivePerThread = 32;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

// Live blocks of all threads by address, to catch the allocator handing memory out twice.
// Entries are removed before the free and added after the allocation, so a block's address can
// only be reused once it has left the map.
class LiveSet {
 public:
  // Empty when fine, else what overlapped.
  std::string add(DevicePtr address, std::size_t size) {
    std::lock_guard lock(mutex_);
    auto after = blocks_.lower_bound(address);
    if (after != blocks_.end() && after->first < address + size) return "overlaps the next block";
    if (after != blocks_.begin() && std::prev(after)->first + std::prev(after)->second > address) {
      return "overlaps the previous block";
    }
    blocks_.emplace_hint(after, address, size);
    return {};
  }
  void remove(DevicePtr address) {
    std::lock_guard lock(mutex_);
    blocks_.erase(address);
  }

 private:
  std::mutex mutex_;
  std::map<DevicePtr, std::size_t> blocks_;
};

// Blocks handed from one thread to another, which then frees them.
class Mailbox {
 public:
  void post(DevicePtr ptr) {
    std::lock_guard lock(mutex_);
    letters_.push_back(ptr);
  }
  bool take(DevicePtr* ptr) {
    std::lock_guard lock(mutex_);
    if (letters_.empty()) return false;
    *ptr = letters_.back();
    letters_.pop_back();
    return true;
  }
  std::vector<DevicePtr> take_all() {
    std::lock_guard lock(mutex_);
    return std::exchange(letters_, {});
  }

 private:
  std::mutex mutex_;
  std::vector<DevicePtr> letters_;
};

struct Shared {
  Shared(SimulatedDevice& d, CachingAllocator& a) : device(d), allocator(a) {}

  SimulatedDevice& device;
  CachingAllocator& allocator;
  std::vector<StreamHandle> own_streams;
  std::vector<StreamHandle> shared_streams;
  LiveSet live;
  Mailbox mailbox;
  std::atomic<int> failures{0};
  std::mutex failure_mutex;
  std::string first_failure;

  void fail(const std::string& what) {
    std::lock_guard lock(failure_mutex);
    if (failures++ == 0) first_failure = what;
  }
};

void worker(Shared& shared, int index, std::uint64_t seed, std::uint64_t ops) {
  std::mt19937_64 rng(seed * 1000003 + static_cast<std::uint64_t>(index));
  auto uniform = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
  std::uniform_real_distribution<double> exponent(9.0, 26.0);  // 512 B .. 64 MiB
  TagScope tag(index % 2 == 0 ? "concurrent.even" : "concurrent.odd");
  const StreamHandle own = shared.own_streams[index];
  std::vector<DevicePtr> mine;

  auto release = [&](DevicePtr ptr) {
    shared.live.remove(ptr);
    shared.allocator.deallocate(ptr);
  };

  for (std::uint64_t step = 0; step < ops && shared.failures.load() == 0; ++step) {
    try {
      const std::size_t choice = uniform(100);
      if (choice < 40 && mine.size() < kMaxLivePerThread) {
        const auto bytes = static_cast<std::size_t>(std::exp2(exponent(rng)));
        const StreamHandle stream =
            uniform(4) == 0 ? shared.shared_streams[uniform(kSharedStreams)] : own;
        DevicePtr ptr = 0;
        try {
          ptr = shared.allocator.allocate(bytes, stream, current_tag());
        } catch (const OutOfMemoryError&) {
          continue;
        }
        const std::size_t size = shared.allocator.describe(ptr).size;
        if (std::string problem = shared.live.add(ptr, size); !problem.empty()) {
          shared.fail(concat("thread ", index, ": new block ", ptr, " ", problem));
        }
        if (!shared.device.is_range_accessible(ptr, size)) {
          shared.fail(concat("thread ", index, ": new block is not accessible"));
        }
        mine.push_back(ptr);
      } else if (choice < 75 && !mine.empty()) {
        const std::size_t at = uniform(mine.size());
        const DevicePtr ptr = mine[at];
        mine[at] = mine.back();
        mine.pop_back();
        if (uniform(5) == 0) {
          shared.mailbox.post(ptr);  // someone else frees it
        } else {
          release(ptr);
        }
      } else if (choice < 88 && !mine.empty()) {
        // Used on a shared stream or on another thread's stream.
        const StreamHandle stream = uniform(2) == 0
                                        ? shared.shared_streams[uniform(kSharedStreams)]
                                        : shared.own_streams[uniform(kThreads)];
        shared.allocator.record_stream(mine[uniform(mine.size())], stream);
      } else if (choice < 94) {
        DevicePtr letter = 0;
        if (shared.mailbox.take(&letter)) release(letter);
      } else if (choice < 96) {
        shared.allocator.process_completed_frees();
      } else if (choice < 97) {
        shared.allocator.empty_cache();
      } else if (choice < 98) {
        (void)shared.allocator.census();  // takes the lock while others allocate
      } else if (choice < 99 && index == 0) {
        // The first thread plays the device: a shared stream stalls for a while, then resumes.
        const StreamHandle stream = shared.shared_streams[uniform(kSharedStreams)];
        (void)(uniform(2) == 0 ? shared.device.pause_stream(stream)
                               : shared.device.resume_stream(stream));
      } else if (!mine.empty()) {
        const DevicePtr ptr = mine[uniform(mine.size())];
        if (!shared.allocator.owns(ptr) || shared.allocator.describe(ptr).base != ptr) {
          shared.fail(concat("thread ", index, ": lost its own live block"));
        }
      }
    } catch (const Error& error) {
      shared.fail(concat("thread ", index, ": ", error.what()));
    }
  }
  for (DevicePtr ptr : mine) {
    try {
      release(ptr);
    } catch (const Error& error) {
      shared.fail(concat("thread ", index, " at exit: ", error.what()));
    }
  }
}

TEST(ConcurrentStress, EightThreadsKeepTheBooksExact) {
  const std::uint64_t seed = env_u64("VRAMLEDGER_STRESS_SEED", 0x5eed'2026);
  const std::uint64_t ops = env_u64("VRAMLEDGER_CONCURRENT_OPS", 20'000);
  for (bool paged : {false, true}) {
    SCOPED_TRACE(paged ? "paged heap" : "segment heap");
    SimulatedDeviceOptions device_options;
    device_options.capacity_bytes = 4 * kGiB;
    device_options.supports_virtual_memory = paged;
    SimulatedDevice device(device_options);
    Ledger ledger;
    auto allocator = std::make_unique<CachingAllocator>(device, &ledger, AllocatorOptions{});
    Shared shared(device, *allocator);
    for (int i = 0; i < kThreads; ++i) shared.own_streams.push_back(device.create_stream());
    for (int i = 0; i < kSharedStreams; ++i) shared.shared_streams.push_back(device.create_stream());

    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back(worker, std::ref(shared), i, seed, ops);
    }
    for (std::thread& thread : threads) thread.join();
    ASSERT_EQ(shared.failures.load(), 0) << shared.first_failure << " (seed " << seed << ")";

    // Letters nobody picked up, then let every stream finish and give everything back.
    for (DevicePtr ptr : shared.mailbox.take_all()) {
      shared.live.remove(ptr);
      allocator->deallocate(ptr);
    }
    for (StreamHandle stream : shared.shared_streams) (void)device.resume_stream(stream);
    ASSERT_TRUE(device.synchronize_device());
    allocator->empty_cache();

    const BlockCensus census = allocator->census();
    const ConsistencyReport report = check_consistency(ledger, census);
    EXPECT_TRUE(report.ok()) << report.to_string();
    for (const auto& pool : census.pools) {
      EXPECT_EQ(pool.allocation, 0);
      EXPECT_EQ(pool.active, 0);
      EXPECT_EQ(pool.reserved_bytes, 0);
    }
    EXPECT_EQ(device.physical_bytes_in_use(), 0u);
    EXPECT_GT(ledger.counters().aggregate().allocation.allocated, 0);
    allocator.reset();
    EXPECT_EQ(device.reserved_address_bytes(), 0u);
    EXPECT_EQ(device.live_event_count(), 0u);
  }
}

}  // namespace
}  // namespace vramledger::stress
