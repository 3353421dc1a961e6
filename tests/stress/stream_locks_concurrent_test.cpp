// Sixteen threads, each on its own stream, on one allocator with per-stream locks
// (docs/design.md 4): the own-stream fast path runs beside cross-stream frees, record_stream,
// empty_cache, the census and ledger queries, all under the allocator's lock. The peaks must be
// exact, the census must agree with the ledger, and a replay of the ledger's trace into a fresh
// ledger must give every counter and peak. Suite 'concurrent', so CI also runs it under
// ThreadSanitizer.
//
// VRAMLEDGER_STREAM_LOCKS_OPS sets the operations per thread of the random test (default
// 20,000); VRAMLEDGER_STRESS_SEED changes the random choices.
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
#include <string>
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

constexpr int kThreads = 16;
constexpr std::uint64_t kProgressFromOps = 200'000;
constexpr std::size_t kGiB = std::size_t{1} << 30;

// kPagedCold: the paged heap with cross_stream_cold_allocs (docs/configuration.md), low enough
// that the stamps and quiet-stream looks decide often.
enum class Heap { kSegment, kPaged, kPagedCold };

AllocatorOptions allocator_options(Heap heap) {
  AllocatorOptions options;
  if (heap == Heap::kPagedCold) options.cross_stream_cold_allocations = 64;
  return options;
}

SimulatedDeviceOptions device_options(Heap heap) {
  SimulatedDeviceOptions options;
  options.capacity_bytes = 64 * kGiB;
  options.supports_virtual_memory = heap != Heap::kSegment;
  return options;
}

// The mixed ring's sizes: log-uniform from 512 B to 4 MiB.
std::size_t mixed_size(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> exponent(9.0, 22.0);
  return static_cast<std::size_t>(std::exp2(exponent(rng)));
}

class StreamLocksConcurrent : public testing::TestWithParam<Heap> {};

// The per-stream fast path, and the ledger's own lock, start with the allocator's second stream.
// Before that the ledger's queries, as always, must not run beside allocations (ledger.hpp):
// the threads below query it from the start.
void use_two_streams(CachingAllocator& allocator, const std::vector<StreamHandle>& streams) {
  for (std::size_t i = 0; i < 2; ++i) allocator.deallocate(allocator.allocate(512, streams[i]));
}

// Holds the first allocation event of stream `a` until an allocation event of stream `b`
// arrives (or 10 s pass). With one lock for every stream, b's allocation would wait for a's to finish: it could
// never report first, and the wait would time out.
class Rendezvous final : public AllocatorObserver {
 public:
  Rendezvous(StreamHandle a, StreamHandle b) : a_(a), b_(b) {}
  void on_event(const AllocatorEvent& event) noexcept override {
    std::unique_lock lock(mutex_);
    if (event.kind == EventKind::kAlloc && event.stream == b_ && armed_) {
      b_reported_ = true;
      changed_.notify_all();
    }
    if (event.kind != EventKind::kAlloc || event.stream != a_ || !armed_ || a_waiting_) return;
    a_waiting_ = true;
    changed_.notify_all();
    met_ = changed_.wait_for(lock, std::chrono::seconds(10), [&] { return b_reported_; });
  }
  bool accept_concurrent_events() noexcept override { return true; }
  void arm() {
    std::lock_guard lock(mutex_);
    armed_ = true;
  }
  void wait_until_a_waits() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return a_waiting_; });
  }
  bool met() {
    std::lock_guard lock(mutex_);
    return met_;
  }

 private:
  const StreamHandle a_, b_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool armed_ = false, a_waiting_ = false, b_reported_ = false, met_ = false;
};

// Two streams, a and b, and an allocator whose observer is a Rendezvous of the two.
struct TwoStreamRig {
  explicit TwoStreamRig(Heap heap)
      : device(device_options(heap)),
        a(device.create_stream()),
        b(device.create_stream()),
        observer(a, b),
        allocator(device, &observer, allocator_options(heap)) {}
  SimulatedDevice device;
  const StreamHandle a;
  const StreamHandle b;
  Rendezvous observer;
  CachingAllocator allocator;
};

// Allocates `bytes_a` on stream a in a thread whose event the observer holds (a's allocation
// stays inside the allocator, a's lock held), and meanwhile `bytes_b` on stream b. Afterwards
// observer.met() says whether b's allocation finished without waiting for a's.
struct OverlappedAllocations {
  DevicePtr on_a = 0;
  DevicePtr on_b = 0;
};
OverlappedAllocations allocate_on_b_while_a_waits(CachingAllocator& allocator,
                                                  Rendezvous& observer, StreamHandle a,
                                                  std::size_t bytes_a, StreamHandle b,
                                                  std::size_t bytes_b) {
  observer.arm();
  OverlappedAllocations result;
  std::thread first([&] { result.on_a = allocator.allocate(bytes_a, a); });
  observer.wait_until_a_waits();
  result.on_b = allocator.allocate(bytes_b, b);
  first.join();
  return result;
}

// Warm allocations on two streams proceed at once: b's runs while a's is still inside the
// allocator (its event held by the observer), so b's did not wait for an allocator-wide lock.
TEST_P(StreamLocksConcurrent, OwnStreamAllocationsDoNotWaitForEachOther) {
  TwoStreamRig rig(GetParam());
  auto& [device, a, b, observer, allocator] = rig;
  constexpr std::size_t kBytes = std::size_t{1} << 20;
  // Both blocks live at once: neither stream's pages can go to the other (paged heap).
  const DevicePtr warm_a = allocator.allocate(kBytes, a);
  const DevicePtr warm_b = allocator.allocate(kBytes, b);
  allocator.deallocate(warm_a);
  allocator.deallocate(warm_b);
  const auto [on_a, on_b] = allocate_on_b_while_a_waits(allocator, observer, a, kBytes, b, kBytes);
  EXPECT_TRUE(observer.met()) << "the allocation on stream b waited for the one on stream a";
  allocator.deallocate(on_a);
  allocator.deallocate(on_b);
}

// Paged heap: when the best fit by size needs pages mapped but another of the stream's free
// blocks holds the request on mapped pages, the fast path takes that block, under b's lock alone
// (a's allocation is held inside the allocator meanwhile, with a's lock), and it is the place
// the allocator's lock would have chosen: the mapped block, with no driver call.
TEST(StreamLocksConcurrentPaged, APlaceNeedingNoPagesIsTakenOnTheFastPath) {
  TwoStreamRig rig(Heap::kPaged);
  auto& [device, a, b, observer, allocator] = rig;
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  // On b: a 6 MiB block whose pages are unmapped (the best fit for 6 MiB) and an 8 MiB block
  // still mapped, kept apart by live blocks.
  const DevicePtr unmapped = allocator.allocate(6 * kMiB, b);
  const DevicePtr fence_1 = allocator.allocate(2 * kMiB, b);
  const DevicePtr mapped = allocator.allocate(8 * kMiB, b);
  const DevicePtr fence_2 = allocator.allocate(2 * kMiB, b);
  allocator.deallocate(unmapped);
  allocator.empty_cache();
  allocator.deallocate(mapped);
  const DevicePtr warm_a = allocator.allocate(kMiB, a);
  allocator.deallocate(warm_a);
  const std::size_t maps_before = device.call_count(SimOp::kMapPages);
  const auto [on_a, on_b] = allocate_on_b_while_a_waits(allocator, observer, a, kMiB, b, 6 * kMiB);
  EXPECT_TRUE(observer.met()) << "the allocation on stream b took the allocator's lock";
  EXPECT_EQ(on_b, mapped);
  EXPECT_EQ(device.call_count(SimOp::kMapPages), maps_before);
  for (const DevicePtr ptr : {on_a, on_b, fence_1, fence_2}) allocator.deallocate(ptr);
}

// Paged heap: when every near fit needs pages mapped but idle mapped memory is plentiful, the
// locked path takes the tightest free run of mapped pages; the fast path now does the same under
// b's lock alone. b's only fitting free block below its span's tail is 14 MiB whose front 6 MiB
// are unmapped and whose back 8 MiB are mapped: a 6 MiB request goes to the back, with no driver
// call, while a's allocation is held inside the allocator with a's lock.
TEST(StreamLocksConcurrentPaged, ATightestMappedRunIsTakenOnTheFastPath) {
  TwoStreamRig rig(Heap::kPaged);
  auto& [device, a, b, observer, allocator] = rig;
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  const DevicePtr front = allocator.allocate(6 * kMiB, b);
  const DevicePtr back = allocator.allocate(8 * kMiB, b);
  const DevicePtr fence = allocator.allocate(2 * kMiB, b);
  ASSERT_EQ(back, front + 6 * kMiB) << "the test needs the two blocks side by side";
  allocator.deallocate(front);
  allocator.empty_cache();  // the front's pages unmapped
  allocator.deallocate(back);  // merged with the front: 14 MiB, mapped from 6 MiB on
  const DevicePtr warm_a = allocator.allocate(kMiB, a);
  allocator.deallocate(warm_a);
  const std::size_t maps_before = device.call_count(SimOp::kMapPages);
  const auto [on_a, on_b] = allocate_on_b_while_a_waits(allocator, observer, a, kMiB, b, 6 * kMiB);
  EXPECT_TRUE(observer.met()) << "the allocation on stream b took the allocator's lock";
  EXPECT_EQ(on_b, back);
  EXPECT_EQ(device.call_count(SimOp::kMapPages), maps_before);
  EXPECT_EQ(allocator.census().locked_allocations, 0);
  for (const DevicePtr ptr : {on_a, on_b, fence}) allocator.deallocate(ptr);
}

// Paged heap: a stream whose room for active bytes is short takes it from another stream's room
// without that stream's lock (detail/active_bytes.cpp). Here the room b needs is a's, and a's
// lock is held by a's allocation (its event held by the observer): b's allocation is still
// served on the fast path, raising no peak. Before (a try_lock of a's lock), the shortfall went
// to the allocator's lock and b waited for a.
TEST(StreamLocksConcurrentPaged, AShortRoomTakesFromAnotherStreamWhileItsLockIsHeld) {
  TwoStreamRig rig(Heap::kPaged);
  auto& [device, a, b, observer, allocator] = rig;
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  // The peak: 41 MiB live at once (a: 12 + 8 + 1 side by side; b: 20).
  const DevicePtr a12 = allocator.allocate(12 * kMiB, a);
  const DevicePtr a8 = allocator.allocate(8 * kMiB, a);
  const DevicePtr a1 = allocator.allocate(kMiB, a);
  const DevicePtr b20 = allocator.allocate(20 * kMiB, b);
  // Frees past a room of 16 MiB give all but 8 MiB to the shared spare: rooms a 8, b 8, spare 24.
  allocator.deallocate(a8);
  allocator.deallocate(a12);
  allocator.deallocate(b20);
  // a takes its 20 MiB back (its room's 8 and 12 from the spare, with 8 more for its room), then
  // frees its 1 MiB: rooms a 9, b 8, spare 4, with 20 MiB live.
  const DevicePtr a20 = allocator.allocate(20 * kMiB, a);
  allocator.deallocate(a1);
  const PolicyFigures before = allocator.policy_figures();
  ASSERT_EQ(before.peak_active_bytes, static_cast<std::int64_t>(41 * kMiB));
  // a's 1 MiB (room a 8) is held inside the allocator with a's lock; b's 15 MiB, on b's mapped
  // pages, is short of 7 MiB that the spare (4) lacks and a's room holds.
  const auto [on_a, on_b] =
      allocate_on_b_while_a_waits(allocator, observer, a, kMiB, b, 15 * kMiB);
  EXPECT_TRUE(observer.met()) << "the allocation on stream b waited for stream a's lock";
  const PolicyFigures after = allocator.policy_figures();
  EXPECT_EQ(after.locked_allocations, before.locked_allocations);
  EXPECT_EQ(after.room_shortfalls, before.room_shortfalls);
  EXPECT_EQ(after.active_peak_rises, before.active_peak_rises);
  EXPECT_EQ(after.peak_active_bytes, before.peak_active_bytes);
  EXPECT_NO_THROW(allocator.census());  // rooms, spare and active bytes still sum to the peak
  // A real rise (36 MiB live, 16 more): the allocator's lock raises the peak to the sum, 52 MiB.
  const DevicePtr more = allocator.allocate(16 * kMiB, b);
  const PolicyFigures risen = allocator.policy_figures();
  EXPECT_EQ(risen.peak_active_bytes, static_cast<std::int64_t>(52 * kMiB));
  EXPECT_GT(risen.active_peak_rises, after.active_peak_rises);
  EXPECT_NO_THROW(allocator.census());
  for (const DevicePtr ptr : {on_a, on_b, a20, more}) allocator.deallocate(ptr);
}

// BlockCensus::locked_allocations counts what the fast path leaves to the allocator's lock once
// it is open, and nothing before: a warm allocation adds nothing, one that must grow adds one.
TEST_P(StreamLocksConcurrent, LockedAllocationsCountWhatTheFastPathLeaves) {
  TwoStreamRig rig(GetParam());
  auto& [device, a, b, observer, allocator] = rig;
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  const DevicePtr warm_a = allocator.allocate(kMiB, a);  // one stream: no fast path yet
  EXPECT_EQ(allocator.census().locked_allocations, 0);
  // Both live at once, so neither stream's pages go to the other (paged heap); the second
  // stream opens the fast path.
  const DevicePtr warm_b = allocator.allocate(kMiB, b);
  allocator.deallocate(warm_a);
  allocator.deallocate(warm_b);
  const std::int64_t opened = allocator.census().locked_allocations;
  for (int round = 0; round < 3; ++round) {
    allocator.deallocate(allocator.allocate(kMiB, a));
    allocator.deallocate(allocator.allocate(kMiB, b));
  }
  EXPECT_EQ(allocator.census().locked_allocations, opened) << "warm allocations took the lock";
  const DevicePtr grown = allocator.allocate(64 * kMiB, a);  // no free block holds it: growth
  EXPECT_EQ(allocator.census().locked_allocations, opened + 1);
  allocator.deallocate(grown);
}

// Two streams taking turns with one small block each: once each has a page, no allocation
// needs the driver (paged heap: the cross-stream slack is at least two pages, so a heap whose
// 1% share is under a page grows by one rather than trade its single page at every turn).
TEST_P(StreamLocksConcurrent, TwoSmallStreamsTakingTurnsKeepAPageEach) {
  TwoStreamRig rig(GetParam());
  auto& [device, a, b, observer, allocator] = rig;
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  for (int round = 0; round < 2; ++round) {  // each stream's first allocations may grow
    allocator.deallocate(allocator.allocate(kMiB, a));
    allocator.deallocate(allocator.allocate(kMiB, b));
  }
  allocator.finish_background_unmaps();  // unmaps of the first rounds' moves, if any
  const std::size_t maps = device.call_count(SimOp::kMapPages);
  const std::size_t unmaps = device.call_count(SimOp::kUnmapPages);
  for (int round = 0; round < 8; ++round) {
    allocator.deallocate(allocator.allocate(kMiB, a));
    allocator.deallocate(allocator.allocate(kMiB, b));
  }
  allocator.finish_background_unmaps();
  EXPECT_EQ(device.call_count(SimOp::kMapPages), maps) << "a page moved between the streams";
  EXPECT_EQ(device.call_count(SimOp::kUnmapPages), unmaps);
}

// Phases separated by barriers: every thread allocates blocks of mixed sizes on its own stream,
// all wait, then each frees another thread's blocks (a cross-stream free: the owner stream's
// lock), some after record_stream on a third stream. Within a phase the allocated count and
// requested bytes only rise, between phases they only fall, so their peaks — in total and per
// stream — are exactly the largest phase totals whatever the interleaving. Meanwhile a
// seventeenth thread empties the cache and reads the census and the ledger.
TEST_P(StreamLocksConcurrent, PeaksOfMixedSizesOnOwnStreamsAreExact) {
  SimulatedDevice device(device_options(GetParam()));
  Ledger ledger;
  CachingAllocator allocator(device, &ledger, allocator_options(GetParam()));
  std::vector<StreamHandle> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(device.create_stream());
  const std::uint64_t seed = env_u64("VRAMLEDGER_STRESS_SEED", 0x5eed'2026);
  constexpr int kPhases = 40;
  std::vector<std::vector<std::vector<std::size_t>>> plan(kPhases);  // [phase][thread] sizes
  std::mt19937_64 rng(seed);
  std::int64_t expected_count = 0, expected_requested = 0;
  std::vector<std::int64_t> expected_stream_count(kThreads, 0);
  for (int phase = 0; phase < kPhases; ++phase) {
    std::int64_t count = 0, requested = 0;
    for (int t = 0; t < kThreads; ++t) {
      const int blocks = static_cast<int>(rng() % 12);
      std::vector<std::size_t> sizes;
      for (int i = 0; i < blocks; ++i) sizes.push_back(mixed_size(rng));
      count += blocks;
      for (std::size_t size : sizes) requested += static_cast<std::int64_t>(size);
      expected_stream_count[t] = std::max<std::int64_t>(expected_stream_count[t], blocks);
      plan[phase].push_back(std::move(sizes));
    }
    expected_count = std::max(expected_count, count);
    expected_requested = std::max(expected_requested, requested);
  }
  use_two_streams(allocator, streams);  // one 512-byte block at a time: peaks of at least that
  expected_count = std::max<std::int64_t>(expected_count, 1);
  expected_requested = std::max<std::int64_t>(expected_requested, 512);
  for (std::size_t i = 0; i < 2; ++i) {
    expected_stream_count[i] = std::max<std::int64_t>(expected_stream_count[i], 1);
  }
  std::barrier sync(kThreads);
  std::vector<std::vector<DevicePtr>> live(kThreads);  // handed over at the barrier
  std::atomic<int> failures{0};
  std::atomic<bool> done{false};
  std::thread meddler([&] {
    for (int i = 0; !done.load(); ++i) {
      switch (i % 4) {
        case 0: allocator.empty_cache(); break;
        case 1: (void)allocator.census(); break;
        case 2: (void)ledger.counters(); break;
        default: (void)ledger.per_stream(); break;
      }
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 local(seed * 31 + static_cast<std::uint64_t>(t));
      for (int phase = 0; phase < kPhases; ++phase) {
        try {
          for (std::size_t size : plan[phase][t]) {
            live[t].push_back(allocator.allocate(size, streams[t]));
          }
        } catch (const Error&) {
          failures++;
        }
        sync.arrive_and_wait();  // every block of the phase is live now
        const int owner = (t + 1 + phase) % kThreads;
        for (DevicePtr ptr : live[owner]) {
          try {
            if (local() % 8 == 0) allocator.record_stream(ptr, streams[(owner + 3) % kThreads]);
            allocator.deallocate(ptr);
          } catch (const Error&) {
            failures++;
          }
        }
        sync.arrive_and_wait();
        live[(t + 1 + phase) % kThreads].clear();  // each vector has exactly one reader
        sync.arrive_and_wait();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  done = true;
  meddler.join();
  ASSERT_EQ(failures.load(), 0);
  allocator.process_completed_frees();
  const LedgerCounters counters = ledger.counters();
  EXPECT_EQ(counters.aggregate().allocation.peak, expected_count);
  EXPECT_EQ(counters.aggregate().allocated_requested_bytes.peak, expected_requested);
  EXPECT_EQ(counters.aggregate().allocation.current, 0);
  EXPECT_EQ(counters.aggregate().allocated_requested_bytes.current, 0);
  for (const StreamUsage& entry : ledger.per_stream()) {
    const auto at = std::find(streams.begin(), streams.end(), entry.stream);
    ASSERT_NE(at, streams.end());
    EXPECT_EQ(entry.usage.allocation.peak, expected_stream_count[at - streams.begin()]);
  }
  expect_consistent(ledger, allocator);
  expect_replay_agrees(ledger);
}

// The streams' ledger shards (docs/design.md 5.2): 16 threads allocate mixed sizes on their own
// streams from their warm caches (splits: the inactive split, the paged heap's page fragments)
// and free them again (merges), so nearly every event is counted by its stream's shard, most
// with split changes, while a seventeenth thread reads the ledger (each read folds every shard).
// At the end of each phase's allocations the count, the requested bytes and each stream's count
// stand exactly at the phase's totals and the peaks at their running maxima, and the census
// agrees with the ledger; after all phases the trace replays to every counter and peak.
TEST_P(StreamLocksConcurrent, StreamShardsKeepEachPhasesPeaksExact) {
  SimulatedDevice device(device_options(GetParam()));
  LedgerOptions ledger_options;
  ledger_options.trace_capacity = std::size_t{1} << 20;
  Ledger ledger(ledger_options);
  CachingAllocator allocator(device, &ledger, allocator_options(GetParam()));
  std::vector<StreamHandle> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(device.create_stream());
  const std::uint64_t seed = env_u64("VRAMLEDGER_STRESS_SEED", 0x5eed'2026);
  constexpr int kPhases = 48;
  std::vector<std::vector<std::vector<std::size_t>>> plan(kPhases);  // [phase][thread] sizes
  std::mt19937_64 rng(seed ^ 0x5a4d);
  // Expected at the end of each phase's allocations: current values, and running maxima.
  struct Figures {
    std::int64_t count = 0, requested = 0, count_peak = 0, requested_peak = 0;
    std::vector<std::int64_t> stream_count, stream_peak;
  };
  std::vector<Figures> expected(kPhases);
  use_two_streams(allocator, streams);  // one 512-byte block at a time before the phases
  std::int64_t count_peak = 1, requested_peak = 512;
  std::vector<std::int64_t> stream_peak(kThreads, 0);
  stream_peak[0] = stream_peak[1] = 1;
  for (int phase = 0; phase < kPhases; ++phase) {
    Figures& figures = expected[phase];
    for (int t = 0; t < kThreads; ++t) {
      // Warm phases first (the heaps grow under the allocator's lock), then mostly smaller ones.
      const int blocks = phase < 2 ? 24 : static_cast<int>(rng() % 20);
      std::vector<std::size_t> sizes;
      for (int i = 0; i < blocks; ++i) sizes.push_back(mixed_size(rng));
      figures.count += blocks;
      for (std::size_t size : sizes) figures.requested += static_cast<std::int64_t>(size);
      stream_peak[t] = std::max<std::int64_t>(stream_peak[t], blocks);
      figures.stream_count.push_back(blocks);
      plan[phase].push_back(std::move(sizes));
    }
    count_peak = std::max(count_peak, figures.count);
    requested_peak = std::max(requested_peak, figures.requested);
    figures.count_peak = count_peak;
    figures.requested_peak = requested_peak;
    figures.stream_peak = stream_peak;
  }
  std::vector<Figures> seen(kPhases);
  std::vector<std::int64_t> count_after_frees(kPhases, -1);
  int phase_seen = 0;
  bool freeing = false;
  // Runs while every worker waits at the barrier: nothing else allocates or frees.
  auto at_barrier = [&]() noexcept {
    const LedgerCounters counters = ledger.counters();
    if (freeing) {
      count_after_frees[phase_seen++] = counters.aggregate().allocation.current;
    } else {
      Figures& figures = seen[phase_seen];
      figures.count = counters.aggregate().allocation.current;
      figures.requested = counters.aggregate().allocated_requested_bytes.current;
      figures.count_peak = counters.aggregate().allocation.peak;
      figures.requested_peak = counters.aggregate().allocated_requested_bytes.peak;
      figures.stream_count.assign(kThreads, -1);
      figures.stream_peak.assign(kThreads, -1);
      for (const StreamUsage& entry : ledger.per_stream()) {
        const auto at = std::find(streams.begin(), streams.end(), entry.stream);
        if (at == streams.end()) continue;
        figures.stream_count[at - streams.begin()] = entry.usage.allocation.current;
        figures.stream_peak[at - streams.begin()] = entry.usage.allocation.peak;
      }
      expect_consistent(ledger, allocator);
    }
    freeing = !freeing;
  };
  std::barrier sync(kThreads, at_barrier);
  std::atomic<int> failures{0};
  std::atomic<bool> done{false};
  std::thread reader([&] {
    for (int i = 0; !done.load(); ++i) {
      switch (i % 4) {
        case 0: (void)ledger.counters(); break;
        case 1: (void)ledger.per_stream(); break;
        case 2: (void)ledger.shard_tally(); break;
        default: (void)ledger.trace().size(); break;
      }
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 local(seed * 131 + static_cast<std::uint64_t>(t));
      std::vector<DevicePtr> live;
      for (int phase = 0; phase < kPhases; ++phase) {
        try {
          for (std::size_t size : plan[phase][t]) live.push_back(allocator.allocate(size, streams[t]));
        } catch (const Error&) {
          failures++;
        }
        sync.arrive_and_wait();  // the phase's blocks are all live: its figures are read
        std::shuffle(live.begin(), live.end(), local);  // frees merge in a random order
        for (DevicePtr ptr : live) {
          try {
            allocator.deallocate(ptr);
          } catch (const Error&) {
            failures++;
          }
        }
        live.clear();
        sync.arrive_and_wait();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  done = true;
  reader.join();
  ASSERT_EQ(failures.load(), 0);
  for (int phase = 0; phase < kPhases; ++phase) {
    SCOPED_TRACE(concat("phase ", phase));
    EXPECT_EQ(seen[phase].count, expected[phase].count);
    EXPECT_EQ(seen[phase].requested, expected[phase].requested);
    EXPECT_EQ(seen[phase].count_peak, expected[phase].count_peak);
    EXPECT_EQ(seen[phase].requested_peak, expected[phase].requested_peak);
    EXPECT_EQ(seen[phase].stream_count, expected[phase].stream_count);
    EXPECT_EQ(seen[phase].stream_peak, expected[phase].stream_peak);
    EXPECT_EQ(count_after_frees[phase], 0);
  }
  // The shards did the counting: most events on their fast path, many with split changes. (Each
  // phase climbs from nothing, often to new peaks of a stream's or the pool's figures, which
  // only the slow path may count: a third of the events take it here, few in a steady ring.)
  const Ledger::ShardTally tally = ledger.shard_tally();
  EXPECT_GT(tally.fast, tally.slow) << "fast " << tally.fast << ", slow " << tally.slow;
  EXPECT_GT(tally.fast_with_splits, tally.fast / 4) << "of " << tally.fast;
  std::printf("stream shards: %llu events on their fast path (%llu with split changes, %llu "
              "after gathering other shards' credit), %llu through the ledger's slow path\n",
              static_cast<unsigned long long>(tally.fast),
              static_cast<unsigned long long>(tally.fast_with_splits),
              static_cast<unsigned long long>(tally.gathered),
              static_cast<unsigned long long>(tally.slow));
  expect_consistent(ledger, allocator);
  expect_replay_agrees(ledger);
}

struct Mailbox {
  std::mutex mutex;
  std::vector<DevicePtr> letters;
};

// Random operations: the mixed ring on each thread's own stream, frees of other threads' blocks,
// record_stream, tagged requests, a stream released and used again, empty_cache, census and
// queries meanwhile. Afterwards the census agrees with the ledger and a replay of the trace
// reproduces every counter and peak.
TEST_P(StreamLocksConcurrent, SixteenThreadsOfRandomOperationsKeepTheBooksExact) {
  const std::uint64_t seed = env_u64("VRAMLEDGER_STRESS_SEED", 0x5eed'2026);
  const std::uint64_t ops = env_u64("VRAMLEDGER_STREAM_LOCKS_OPS", 20'000);
  SimulatedDevice device(device_options(GetParam()));
  // Room for every record of a long run (about two per operation), so that its trace replays
  // too: up to 4 Mi records (224 MiB), 125,000 operations per thread.
  LedgerOptions ledger_options;
  ledger_options.trace_capacity = std::clamp<std::uint64_t>(
      ops * kThreads * 2, EventTrace::kDefaultCapacity, std::uint64_t{1} << 22);
  Ledger ledger(ledger_options);
  CachingAllocator allocator(device, &ledger, allocator_options(GetParam()));
  std::vector<StreamHandle> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(device.create_stream());
  use_two_streams(allocator, streams);
  Mailbox mailbox;
  std::atomic<int> failures{0};
  std::mutex failure_mutex;
  std::string first_failure;
  auto fail = [&](const std::string& what) {
    std::lock_guard lock(failure_mutex);
    if (failures++ == 0) first_failure = what;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 7919 + static_cast<std::uint64_t>(t));
      std::vector<std::pair<DevicePtr, std::size_t>> mine;
      for (std::uint64_t step = 0; step < ops && failures.load() == 0; ++step) {
        // Long runs (scripts/tsan_threads_long.sh) say how far they got, in case a limit stops
        // them: thread 0 at every tenth.
        if (t == 0 && ops >= kProgressFromOps && step % (ops / 10) == 0) {
          std::fprintf(stderr, "[ progress ] thread 0: %llu of %llu operations\n",
                       static_cast<unsigned long long>(step), static_cast<unsigned long long>(ops));
        }
        try {
          const std::uint64_t choice = rng() % 1000;
          if (choice < 470 && mine.size() < 64) {
            const std::size_t bytes = mixed_size(rng);
            const TagId tag = choice < 20 ? TagId{5} : kUntagged;
            DevicePtr ptr = 0;
            try {
              ptr = allocator.allocate(bytes, streams[t], tag);
            } catch (const OutOfMemoryError&) {
              continue;
            }
            mine.emplace_back(ptr, bytes);
          } else if (choice < 920 && !mine.empty()) {
            const std::size_t at = rng() % mine.size();
            const DevicePtr ptr = mine[at].first;
            mine[at] = mine.back();
            mine.pop_back();
            if (rng() % 8 == 0) {
              std::lock_guard lock(mailbox.mutex);
              mailbox.letters.push_back(ptr);
            } else {
              allocator.deallocate(ptr);
            }
          } else if (choice < 975) {
            DevicePtr letter = 0;
            {
              std::lock_guard lock(mailbox.mutex);
              if (!mailbox.letters.empty()) {
                letter = mailbox.letters.back();
                mailbox.letters.pop_back();
              }
            }
            if (letter != 0) allocator.deallocate(letter);  // another stream's block
          } else if (choice < 985 && !mine.empty()) {
            allocator.record_stream(mine[rng() % mine.size()].first, streams[rng() % kThreads]);
          } else if (choice < 988) {
            allocator.process_completed_frees();
          } else if (choice < 990) {
            allocator.empty_cache();
          } else if (choice < 992) {
            (void)allocator.census();
          } else if (choice < 994) {
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
  for (DevicePtr letter : mailbox.letters) allocator.deallocate(letter);
  allocator.process_completed_frees();
  const LedgerCounters counters = ledger.counters();
  EXPECT_EQ(counters.aggregate().allocation.current, 0);
  EXPECT_EQ(counters.aggregate().requested_bytes.current, 0);
  EXPECT_GT(counters.aggregate().requested_bytes.peak, 0);
  expect_consistent(ledger, allocator);
  expect_replay_agrees(ledger);
  allocator.empty_cache();
  expect_consistent(ledger, allocator);
  // A released stream's heaps stay, closed; the stream used again gets new ones.
  allocator.release_stream(streams[0]);
  allocator.deallocate(allocator.allocate(1000, streams[0]));
  expect_consistent(ledger, allocator);
}

INSTANTIATE_TEST_SUITE_P(Heaps, StreamLocksConcurrent,
                         testing::Values(Heap::kSegment, Heap::kPaged, Heap::kPagedCold),
                         [](const testing::TestParamInfo<Heap>& info) {
                           return info.param == Heap::kPagedCold ? "paged_cold"
                                  : info.param == Heap::kPaged   ? "paged"
                                                                 : "segment";
                         });

}  // namespace
}  // namespace vramledger::stress
