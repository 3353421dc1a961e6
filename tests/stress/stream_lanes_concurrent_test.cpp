// Threads allocating on one stream (docs/design.md 4, lanes; allocator/detail/stream_lanes.cpp).
// A thread that keeps finding its stream's lock held by another thread of the stream gets a lane
// of its own and then allocates beside the others; eight threads on one stream, whether or not
// they got lanes, keep every counter and peak exact, the census agreeing with the ledger, and the
// trace replaying to the same figures. Suite 'concurrent', so CI also runs it under
// ThreadSanitizer.
//
// VRAMLEDGER_STREAM_LANES_OPS sets the ring's operations per thread (default 20,000);
// VRAMLEDGER_STRESS_SEED changes the random choices.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/errors.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "tests/stress/concat.hpp"
#include "tests/stress/ledger_replay_check.hpp"
#include "tests/stress/stress_env.hpp"

namespace vramledger::stress {
namespace {

constexpr std::size_t kGiB = std::size_t{1} << 30;

SimulatedDeviceOptions device_options(bool paged) {
  SimulatedDeviceOptions options;
  options.capacity_bytes = 64 * kGiB;
  options.supports_virtual_memory = paged;
  return options;
}

// The mixed ring's sizes: log-uniform from 512 B to 4 MiB.
std::size_t mixed_size(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> exponent(9.0, 22.0);
  return static_cast<std::size_t>(std::exp2(exponent(rng)));
}

class StreamLanesConcurrent : public testing::TestWithParam<bool> {};  // paged heap or not

// Holds each armed allocation event of the holder thread inside the allocator (on the fast path:
// with its lane's lock held): until the other thread says it is about to allocate, then a few
// milliseconds more; in the last round, until an allocation event of another thread arrives.
// Every wait has a 10 s limit, so a broken allocator fails the test instead of hanging it.
class HoldingObserver final : public AllocatorObserver {
 public:
  void on_event(const AllocatorEvent& event) noexcept override {
    if (event.kind != EventKind::kAlloc) return;
    std::unique_lock lock(mutex_);
    if (std::this_thread::get_id() != holder_ || !armed_) {
      if (last_round_ && inside_) {
        other_reported_ = true;
        changed_.notify_all();
      }
      return;
    }
    armed_ = false;
    inside_ = true;
    ++entered_;
    changed_.notify_all();
    if (last_round_) {
      met_ = changed_.wait_for(lock, kLimit, [&] { return other_reported_; });
    } else if (changed_.wait_for(lock, kLimit, [&] { return other_about_to_allocate_; })) {
      changed_.wait_for(lock, std::chrono::milliseconds(5), [] { return false; });
    }
    inside_ = false;
    changed_.notify_all();
  }
  bool accept_concurrent_events() noexcept override { return true; }

  void set_holder(std::thread::id holder) {
    std::lock_guard lock(mutex_);
    holder_ = holder;
  }
  // Returns the number of holds so far: wait_until_entered(that) waits for the next.
  int arm(bool last_round) {
    std::lock_guard lock(mutex_);
    armed_ = true;
    last_round_ = last_round;
    other_reported_ = met_ = other_about_to_allocate_ = false;
    return entered_;
  }
  // The holder is inside (or was: the count is sticky, so a late waker does not hang); the
  // caller allocates next.
  void wait_until_entered_then_allocate(int before) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, kLimit, [&] { return entered_ > before; });
    other_about_to_allocate_ = true;
    changed_.notify_all();
  }
  bool met() {
    std::lock_guard lock(mutex_);
    return met_;
  }

 private:
  static constexpr std::chrono::seconds kLimit{10};
  std::mutex mutex_;
  std::condition_variable changed_;
  std::thread::id holder_;
  int entered_ = 0;
  bool armed_ = false, last_round_ = false, inside_ = false, other_reported_ = false,
       met_ = false, other_about_to_allocate_ = false;
};

// Thread A allocates on stream s and is held inside the allocator with the lock of s's lane
// (HoldingObserver) each round, while the calling thread allocates on s too: run_round(last).
// Two streams start the per-stream fast path; two warm blocks on s serve both threads there.
struct WaitingRig {
  static constexpr std::size_t kBytes = std::size_t{1} << 20;
  SimulatedDevice device;
  StreamHandle s, other;
  HoldingObserver observer;
  CachingAllocator allocator;
  DevicePtr warm_1 = 0, warm_2 = 0;
  std::int64_t heaps_before = 0;
  std::mutex mutex;
  std::condition_variable changed;
  int round_started = -1, round_done = -1;
  int rounds = 0;
  std::thread a;

  WaitingRig(bool paged, const AllocatorOptions& options)
      : device(device_options(paged)),
        s(device.create_stream()),
        other(device.create_stream()),
        allocator(device, &observer, options) {
    allocator.deallocate(allocator.allocate(512, other));
    warm_1 = allocator.allocate(kBytes, s);
    warm_2 = allocator.allocate(kBytes, s);
    allocator.deallocate(warm_1);
    allocator.deallocate(warm_2);
    heaps_before = allocator.census().stream_heaps;
    a = std::thread([this] {
      observer.set_holder(std::this_thread::get_id());
      for (int round = 0;; ++round) {
        {
          std::unique_lock lock(mutex);
          changed.wait(lock, [&] { return round_started >= round; });
          if (round_started < 0 || round_started == 1000) return;
        }
        allocator.deallocate(allocator.allocate(kBytes, s));
        std::lock_guard lock(mutex);
        round_done = round;
        changed.notify_all();
      }
    });
  }
  ~WaitingRig() {
    {
      std::lock_guard lock(mutex);
      round_started = 1000;
      changed.notify_all();
    }
    a.join();
  }
  // One round: A is held inside the allocator, this thread allocates on s (waiting for A's
  // lane's lock, or not); in the last round A stays held until this thread's event arrives.
  void run_round(bool last) {
    const int round = rounds++;
    const int holds = observer.arm(last);
    {
      std::lock_guard lock(mutex);
      round_started = round;
      changed.notify_all();
    }
    observer.wait_until_entered_then_allocate(holds);
    allocator.deallocate(allocator.allocate(kBytes, s));
    std::unique_lock lock(mutex);
    changed.wait_for(lock, std::chrono::seconds(10), [&] { return round_done >= round; });
  }
};

// The test thread waits for A's lane round after round; it then gets a lane of its own (one
// more set of heaps in the census), and in the last round its allocation on s goes through
// while A's is still held: it no longer waits for A's lane. Then two threads in turn do the
// same and leave: an idle lane is given again.
TEST_P(StreamLanesConcurrent, AThreadKeptWaitingOnItsStreamGetsALaneOfItsOwn) {
  WaitingRig rig(GetParam(), AllocatorOptions{});
  constexpr std::size_t kBytes = WaitingRig::kBytes;
  CachingAllocator& allocator = rig.allocator;
  HoldingObserver& observer = rig.observer;
  const StreamHandle s = rig.s;
  const std::int64_t heaps_before = rig.heaps_before;
  ASSERT_EQ(heaps_before, 2);
  auto run_round = [&](int, bool last) { rig.run_round(last); };
  int round = 0;  // counts the rounds; WaitingRig numbers them itself
  // 256 / 16: sixteen waits ask for a lane; the seventeenth allocation gets it.
  for (; round < 80 && allocator.census().stream_heaps == heaps_before; ++round) {
    run_round(round, false);
  }
  EXPECT_EQ(allocator.census().stream_heaps, heaps_before + 1)
      << "no lane after " << round << " rounds of waiting";
  EXPECT_GE(round, 16) << "a lane came before the thread had waited enough";
  // Warm the new lane (its first block grows it under the allocator's lock, which A's held
  // lane lock is part of), then the last round.
  const DevicePtr on_own_lane = allocator.allocate(kBytes, s);
  allocator.deallocate(on_own_lane);
  run_round(round++, true);
  EXPECT_TRUE(observer.met()) << "the allocation on s waited for the other thread's lane";
  EXPECT_EQ(allocator.census().stream_heaps, heaps_before + 1);

  // Threads come and go; their lanes stay, and are given again. Each newcomer below waits on
  // lane 0 like the test thread did, then leaves. The first takes a new lane (the test thread's
  // lane allocated since the last choice); the second is given the test thread's lane, idle
  // since the first newcomer's choice: the count of heaps does not move, and its block is the
  // one the test thread last freed there.
  std::vector<std::int64_t> heaps_after;
  for (int newcomer = 0; newcomer < 2; ++newcomer) {
    const std::int64_t before = allocator.census().stream_heaps;
    std::thread visitor([&] {
      // run_round's allocation, from this thread, until it got a lane (its own wait score).
      for (int i = 0; i < 80; ++i) {
        if (newcomer == 0 && allocator.census().stream_heaps != before) break;
        if (newcomer == 1) {
          const DevicePtr ptr = allocator.allocate(kBytes, s);
          allocator.deallocate(ptr);
          if (ptr == on_own_lane) break;
        }
        run_round(round++, false);
      }
      allocator.deallocate(allocator.allocate(kBytes, s));
      if (newcomer == 1) {
        run_round(round++, true);
        EXPECT_TRUE(observer.met()) << "the second newcomer still waited for another's lane";
      }
    });
    visitor.join();
    heaps_after.push_back(allocator.census().stream_heaps);
  }
  EXPECT_EQ(heaps_after[0], heaps_before + 2) << "the first newcomer got no lane of its own";
  EXPECT_EQ(heaps_after[1], heaps_before + 2) << "the second newcomer did not reuse a lane";
  // release_stream gives every lane of the stream back.
  allocator.release_stream(s);
  EXPECT_EQ(allocator.census().stream_heaps, 1);
  EXPECT_EQ(allocator.census().lane_choices, 2 + 1) << "the test thread's and two newcomers'";
}

// stream_lanes:1 (AllocatorOptions::stream_lanes): the same waiting, twice as many rounds as
// gave a lane above, and the thread stays on the stream's heaps.
TEST_P(StreamLanesConcurrent, WithLanesOffAThreadKeptWaitingStaysOnItsStreamsHeaps) {
  AllocatorOptions options;
  options.stream_lanes = 1;
  WaitingRig rig(GetParam(), options);
  for (int round = 0; round < 40; ++round) rig.run_round(false);
  const BlockCensus census = rig.allocator.census();
  EXPECT_EQ(census.stream_heaps, rig.heaps_before);
  EXPECT_EQ(census.lane_choices, 0);
}

// Eight threads on one stream of a fresh allocator (the fast path starts once they contend for
// the allocator's lock, then lanes as they contend for the stream's): in 32 phases each
// allocates a planned set of mixed sizes, the figures are read while all wait, and each frees
// the next thread's blocks (another lane's, where lanes formed). The count and requested bytes,
// in total and for the stream, stand at each phase's totals with their peaks at the running
// maxima. Then a ring on each thread; afterwards the census agrees with the ledger and the
// trace replays to every counter and peak.
TEST_P(StreamLanesConcurrent, EightThreadsOnOneStreamKeepTheBooksExact) {
  constexpr int kThreads = 8;
  constexpr int kPhases = 32;
  constexpr std::size_t kRing = 32;
  SimulatedDevice device(device_options(GetParam()));
  LedgerOptions ledger_options;
  ledger_options.trace_capacity = std::size_t{1} << 21;
  Ledger ledger(ledger_options);
  CachingAllocator allocator(device, &ledger, AllocatorOptions{});
  const StreamHandle stream = device.create_stream();
  const std::uint64_t seed = env_u64("VRAMLEDGER_STRESS_SEED", 0x5eed'2026);
  const std::uint64_t ring_ops = env_u64("VRAMLEDGER_STREAM_LANES_OPS", 20'000);
  std::vector<std::vector<std::vector<std::size_t>>> plan(kPhases);  // [phase][thread] sizes
  std::vector<std::int64_t> count(kPhases, 0), requested(kPhases, 0);
  std::vector<std::int64_t> count_peak(kPhases, 0), requested_peak(kPhases, 0);
  std::mt19937_64 rng(seed ^ 0x1a4e);
  for (int phase = 0; phase < kPhases; ++phase) {
    for (int t = 0; t < kThreads; ++t) {
      const int blocks = phase < 2 ? 24 : static_cast<int>(rng() % 20);
      std::vector<std::size_t> sizes;
      for (int i = 0; i < blocks; ++i) sizes.push_back(mixed_size(rng));
      count[phase] += blocks;
      for (std::size_t size : sizes) requested[phase] += static_cast<std::int64_t>(size);
      plan[phase].push_back(std::move(sizes));
    }
    count_peak[phase] = std::max(count[phase], phase > 0 ? count_peak[phase - 1] : 0);
    requested_peak[phase] =
        std::max(requested[phase], phase > 0 ? requested_peak[phase - 1] : 0);
  }
  struct Seen {
    std::int64_t count = -1, requested = -1, count_peak = -1, requested_peak = -1;
    std::int64_t stream_count = -1, stream_peak = -1, stream_requested = -1;
  };
  std::vector<Seen> seen(kPhases);
  int phase_seen = 0;
  bool freeing = false;
  auto at_barrier = [&]() noexcept {  // every worker waits: nothing allocates or frees
    if (!freeing) {
      const LedgerCounters counters = ledger.counters();
      Seen& s = seen[phase_seen];
      s.count = counters.aggregate().allocation.current;
      s.requested = counters.aggregate().allocated_requested_bytes.current;
      s.count_peak = counters.aggregate().allocation.peak;
      s.requested_peak = counters.aggregate().allocated_requested_bytes.peak;
      for (const StreamUsage& entry : ledger.per_stream()) {
        if (entry.stream != stream) continue;
        s.stream_count = entry.usage.allocation.current;
        s.stream_peak = entry.usage.allocation.peak;
        s.stream_requested = entry.usage.requested_bytes.current;
      }
      expect_consistent(ledger, allocator);
      // The paged heap's own peak of active bytes, counted per lane (detail/active_bytes.cpp),
      // is the ledger's: each phase only allocates or only frees, so every order of the
      // threads' operations reaches the same peak.
      if (GetParam()) {
        EXPECT_EQ(allocator.census().peak_active_bytes, counters.aggregate().active_bytes.peak)
            << "phase " << phase_seen;
      }
    } else {
      ++phase_seen;
    }
    freeing = !freeing;
  };
  std::barrier sync(kThreads, at_barrier);
  std::atomic<int> failures{0};
  std::vector<std::vector<DevicePtr>> live(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 local(seed * 977 + static_cast<std::uint64_t>(t));
      for (int phase = 0; phase < kPhases; ++phase) {
        live[t].clear();  // freed by the previous thread last phase
        try {
          for (std::size_t size : plan[phase][t]) {
            live[t].push_back(allocator.allocate(size, stream));
          }
        } catch (const Error&) {
          failures++;
        }
        sync.arrive_and_wait();  // all of the phase's blocks live: its figures are read
        std::vector<DevicePtr> next = live[(t + 1) % kThreads];
        std::shuffle(next.begin(), next.end(), local);
        for (DevicePtr ptr : next) {
          try {
            allocator.deallocate(ptr);
          } catch (const Error&) {
            failures++;
          }
        }
        sync.arrive_and_wait();
      }
      // The ring: free the oldest, allocate a new size, all on the one stream.
      std::vector<DevicePtr> ring(kRing, 0);
      try {
        for (std::uint64_t i = 0; i < ring_ops; ++i) {
          DevicePtr& slot = ring[i % kRing];
          if (slot != 0) allocator.deallocate(slot);
          slot = allocator.allocate(mixed_size(local), stream);
        }
        for (DevicePtr ptr : ring) {
          if (ptr != 0) allocator.deallocate(ptr);
        }
      } catch (const Error&) {
        failures++;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_EQ(failures.load(), 0);
  for (int phase = 0; phase < kPhases; ++phase) {
    SCOPED_TRACE(concat("phase ", phase));
    EXPECT_EQ(seen[phase].count, count[phase]);
    EXPECT_EQ(seen[phase].requested, requested[phase]);
    EXPECT_EQ(seen[phase].count_peak, count_peak[phase]);
    EXPECT_EQ(seen[phase].requested_peak, requested_peak[phase]);
    EXPECT_EQ(seen[phase].stream_count, count[phase]);
    EXPECT_EQ(seen[phase].stream_peak, count_peak[phase]);
    EXPECT_EQ(seen[phase].stream_requested, requested[phase]);
  }
  const LedgerCounters counters = ledger.counters();
  EXPECT_EQ(counters.aggregate().allocation.current, 0);
  const Ledger::ShardTally tally = ledger.shard_tally();
  std::printf("%s heap: %lld stream heaps (1 + lanes); stream shards: %llu events on their fast "
              "path, %llu through the ledger's slow path\n",
              GetParam() ? "paged" : "segment",
              static_cast<long long>(allocator.census().stream_heaps),
              static_cast<unsigned long long>(tally.fast),
              static_cast<unsigned long long>(tally.slow));
  expect_consistent(ledger, allocator);
  expect_replay_agrees(ledger);
}

INSTANTIATE_TEST_SUITE_P(Heaps, StreamLanesConcurrent, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Paged") : std::string("Segment");
                         });

}  // namespace
}  // namespace vramledger::stress
