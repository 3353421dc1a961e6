// The per-thread front caches (allocator/detail/thread_cache.hpp, front_cache.cpp) and the
// ledger's shards (accounting/ledger_shard.hpp), single- and few-threaded, on both heap shapes:
// parked blocks are free in every count, every query still sees the truth, and the ledger's
// counters and peaks are those of the same operations without front caches.
#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <thread>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/errors.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "tests/stress/ledger_replay_check.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

enum class Heap { kSegment, kPaged };

SimulatedDeviceOptions device_options(Heap heap) {
  SimulatedDeviceOptions options;
  options.capacity_bytes = 8 * kGiB;
  options.supports_virtual_memory = heap == Heap::kPaged;
  return options;
}

AllocatorOptions with_front_cache(std::size_t bytes = 64 * kMiB) {
  AllocatorOptions options;
  options.front_cache_bytes = bytes;
  return options;
}

// Two streams, a block of each live at once: the second stream opens the per-stream fast path
// (docs/design.md 4). `room` bytes on the first stay free for what follows.
std::pair<StreamHandle, StreamHandle> open_fast_path(SimulatedDevice& device,
                                                     CachingAllocator& allocator,
                                                     std::size_t room = 8 * kMiB) {
  const StreamHandle a = device.create_stream();
  const StreamHandle b = device.create_stream();
  const DevicePtr room_a = allocator.allocate(room, a);
  const DevicePtr room_b = allocator.allocate(8 * kMiB, b);
  allocator.deallocate(room_a);
  allocator.deallocate(room_b);
  return {a, b};
}

class FrontCacheTest : public testing::TestWithParam<Heap> {
 protected:
  FrontCacheTest() : device_(device_options(GetParam())), allocator_(device_, &ledger_, with_front_cache()) {}

  void expect_consistent() {
    const ConsistencyReport report = check_consistency(ledger_, allocator_.census());
    EXPECT_TRUE(report.ok()) << report.to_string();
  }
  // A front cache manages only sizes its thread asked for before (ThreadCache::worth_adopting).
  void warm(std::size_t bytes, StreamHandle stream = 0) {
    allocator_.deallocate(allocator_.allocate(bytes, stream));
  }
  const PoolCounters& all() {
    counters_ = ledger_.counters();
    return counters_.aggregate();
  }

  SimulatedDevice device_;
  Ledger ledger_;
  CachingAllocator allocator_;
  LedgerCounters counters_;
};

TEST_P(FrontCacheTest, ParkedBlockIsFreeInEveryCountAndComesBack) {
  warm(4 * kKiB);
  const DevicePtr first = allocator_.allocate(4 * kKiB, 0);
  expect_consistent();
  const std::int64_t reserved = all().reserved_bytes.current;
  allocator_.deallocate(first);  // parked
  EXPECT_EQ(all().allocated_bytes.current, 0);
  EXPECT_EQ(all().requested_bytes.current, 0);
  EXPECT_EQ(all().active.current, 0);
  EXPECT_EQ(all().reserved_bytes.current, reserved);
  expect_consistent();
  EXPECT_FALSE(allocator_.owns(first));
  EXPECT_THROW(allocator_.describe(first), Error);
  for (const SegmentInfo& segment : allocator_.segments()) {
    for (const BlockInfo& block : segment.blocks) {
      if (block.address == first) {
        EXPECT_FALSE(block.allocated);
      }
    }
  }

  const DevicePtr again = allocator_.allocate(4 * kKiB - 100, 0);  // same block size
  EXPECT_EQ(again, first);
  EXPECT_TRUE(allocator_.owns(again));
  EXPECT_EQ(allocator_.describe(again).requested, 4 * kKiB - 100);
  EXPECT_EQ(all().requested_bytes.current, static_cast<std::int64_t>(4 * kKiB - 100));
  EXPECT_EQ(all().requested_bytes.peak, static_cast<std::int64_t>(4 * kKiB));
  expect_consistent();
  allocator_.deallocate(again);
  expect_consistent();
}

TEST_P(FrontCacheTest, DoubleFreeOfAParkedBlockIsRefusedAndChangesNothing) {
  warm(512);
  const DevicePtr ptr = allocator_.allocate(512, 0);
  allocator_.deallocate(ptr);
  const LedgerCounters before = ledger_.counters();
  try {
    allocator_.deallocate(ptr);
    FAIL() << "double free accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kDoubleFree);
  }
  EXPECT_THROW(allocator_.record_stream(ptr, device_.create_stream()), Error);
  EXPECT_EQ(ledger_.counters().aggregate(), before.aggregate());
  expect_consistent();
}

TEST_P(FrontCacheTest, EmptyCacheReturnsParkedBlocks) {
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 6; ++i) {
    const std::size_t bytes = (i + 1) * 8 * kKiB;
    warm(bytes);  // a miss: the size is new
    warm(bytes);  // a miss: managed from now on
    blocks.push_back(allocator_.allocate(bytes, 0));  // a hit: the pops keep serving
  }
  for (DevicePtr ptr : blocks) allocator_.deallocate(ptr);
  EXPECT_GT(all().reserved_bytes.current, 0);
  allocator_.empty_cache();
  std::size_t returned = 0;  // parked blocks going back announce themselves
  for (const TraceRecord& record : ledger_.trace()) {
    returned += record.kind == EventKind::kFrontCacheReturn ? 1 : 0;
  }
  EXPECT_EQ(returned, 6u);
  EXPECT_EQ(all().allocated_bytes.current, 0);
  if (GetParam() == Heap::kSegment) {
    EXPECT_EQ(all().reserved_bytes.current, 0);
  }
  EXPECT_EQ(all().mapped_bytes.current, 0);
  expect_consistent();
}

TEST_P(FrontCacheTest, ReleaseStreamReturnsThatStreamsParkedBlocks) {
  const StreamHandle side = device_.create_stream();
  warm(64 * kKiB, side);
  const DevicePtr ptr = allocator_.allocate(64 * kKiB, side);
  allocator_.deallocate(ptr);
  allocator_.release_stream(side);
  EXPECT_EQ(all().mapped_bytes.current, 0);
  expect_consistent();
  (void)device_.destroy_stream(side);
}

TEST_P(FrontCacheTest, RecordStreamTakesTheBlockOutOfTheFrontCache) {
  const StreamHandle side = device_.create_stream();
  ASSERT_TRUE(device_.pause_stream(side).is_ok());
  const DevicePtr ptr = allocator_.allocate(8 * kKiB, 0);
  allocator_.deallocate(ptr);
  const DevicePtr held = allocator_.allocate(8 * kKiB - 7, 0);  // from the front cache
  ASSERT_EQ(held, ptr);
  allocator_.record_stream(held, side);
  allocator_.deallocate(held);  // waits for `side`: pending, not parked
  EXPECT_EQ(all().allocated_bytes.current, 0);
  EXPECT_EQ(all().active_bytes.current, static_cast<std::int64_t>(8 * kKiB));
  EXPECT_EQ(all().requested_bytes.current, static_cast<std::int64_t>(8 * kKiB - 7));
  expect_consistent();
  EXPECT_NE(allocator_.allocate(8 * kKiB, 0), held);  // not reusable yet
  ASSERT_TRUE(device_.resume_stream(side).is_ok());
  allocator_.process_completed_frees();
  expect_consistent();
}

TEST_P(FrontCacheTest, AFreeFromAnotherThreadAndThreadExitKeepTheBooks) {
  std::vector<DevicePtr> made;
  std::thread maker([&] {
    warm(16 * kKiB);
    warm(32 * kKiB);
    for (int i = 0; i < 4; ++i) made.push_back(allocator_.allocate(16 * kKiB, 0));
    const DevicePtr parked = allocator_.allocate(32 * kKiB, 0);
    allocator_.deallocate(parked);  // parked in the maker's cache, returned at its exit
  });
  maker.join();
  expect_consistent();
  allocator_.deallocate(made[0]);  // the maker's cache is gone: the heap's block now
  std::thread other([&] { allocator_.deallocate(made[1]); });
  other.join();
  expect_consistent();
  // Held by this thread's cache, freed by another thread: the heap frees it.
  warm(16 * kKiB);
  const DevicePtr mine = allocator_.allocate(16 * kKiB, 0);
  std::thread freer([&] { allocator_.deallocate(mine); });
  freer.join();
  expect_consistent();
  EXPECT_THROW(allocator_.deallocate(mine), Error);
  allocator_.deallocate(made[2]);
  allocator_.deallocate(made[3]);
  allocator_.empty_cache();
  EXPECT_EQ(all().allocated_bytes.current, 0);
  expect_consistent();
}

// Once a second stream opens the per-stream fast path (docs/design.md 4), a front cache's miss
// is served, and its block adopted, under the stream's lock alone, and so is the heap's free of
// a block no cache manages: after a warm-up, rounds of both never take the allocator's lock,
// which growth still does. The adopted block's allocation is counted in the stream's ledger
// shard and what follows in the cache's; the trace keeps their order (a replay gives the same
// counters and peaks).
TEST_P(FrontCacheTest, MissesAndHeapFreesTakeOnlyTheirStreamsLock) {
  // Blocks up to 256 KiB enter the cache: the rooms and the heap's sizes below never do.
  Ledger ledger;
  CachingAllocator allocator(device_, &ledger, with_front_cache(kMiB));
  const StreamHandle a = device_.create_stream();
  const StreamHandle b = device_.create_stream();
  constexpr std::size_t kCached = 48 * kKiB;
  const auto heap_size = [](int round) { return (300 + 4 * static_cast<std::size_t>(round)) * kKiB; };
  // Room on each stream, live at once (paged heap: neither stream's pages go to the other): the
  // second stream opens the fast path. The cached size asked for once: not adopted yet.
  const DevicePtr room_a = allocator.allocate(8 * kMiB, a);
  const DevicePtr room_b = allocator.allocate(8 * kMiB, b);
  allocator.deallocate(allocator.allocate(kCached, a));
  for (const StreamHandle stream : {a, b}) allocator.deallocate(allocator.allocate(heap_size(4), stream));
  allocator.deallocate(room_a);
  allocator.deallocate(room_b);
  const std::int64_t opened = allocator.census().locked_allocations;
  DevicePtr adopted = 0;
  for (int round = 0; round < 4; ++round) {
    // Round 0: a miss the fast path serves and the cache adopts; then hits.
    const DevicePtr cached = allocator.allocate(kCached, a);
    if (round == 0) adopted = cached;
    EXPECT_EQ(cached, adopted) << "round " << round;
    for (const StreamHandle stream : {a, b}) {
      allocator.deallocate(allocator.allocate(heap_size(round), stream));  // the heap's free
    }
    allocator.deallocate(cached);  // parked
  }
  EXPECT_EQ(allocator.census().locked_allocations, opened)
      << "misses or heap frees took the allocator's lock";
  // Parked in this thread's cache, the block serves no other thread: a second thread's
  // allocation of the same size gets other bytes.
  std::thread other_thread([&] {
    const DevicePtr ptr = allocator.allocate(kCached, a);
    EXPECT_NE(ptr, adopted) << "the block is not in the front cache";
    allocator.deallocate(ptr);
  });
  other_thread.join();
  // (Growth returns the stream's parked blocks first: after it the block is the heap's again.)
  const DevicePtr grown = allocator.allocate(64 * kMiB, a);  // no free block holds it: growth
  EXPECT_EQ(allocator.census().locked_allocations, opened + 1) << "the fast path is not open";
  allocator.deallocate(grown);
  for (const bool emptied : {false, true}) {
    if (emptied) allocator.empty_cache();
    const ConsistencyReport report = check_consistency(ledger, allocator.census());
    EXPECT_TRUE(report.ok()) << report.to_string();
  }
  stress::expect_replay_agrees(ledger);
}

// An adopted block's allocation is counted in its stream's ledger shard, its free and what
// follows in the cache's shard: once the cache's shard fills its staged records it folds alone,
// and the trace must already hold the allocation (the stream shard is published at adoption),
// else a replay meets the free of a block it never saw allocated.
TEST_P(FrontCacheTest, AnAdoptedBlocksAllocationPrecedesItsFreeInTheTrace) {
  Ledger ledger;
  CachingAllocator allocator(device_, &ledger, with_front_cache(kMiB));
  const StreamHandle a = open_fast_path(device_, allocator).first;
  constexpr std::size_t kHit = 16 * kKiB;
  constexpr std::size_t kAdopted = 48 * kKiB;
  for (int i = 0; i < 3; ++i) allocator.deallocate(allocator.allocate(kHit, a));  // hits on a
  allocator.deallocate(allocator.allocate(kAdopted, a));  // asked once
  const std::int64_t locked = allocator.census().locked_allocations;
  allocator.deallocate(allocator.allocate(kAdopted, a));  // adopted on the fast path, parked
  ASSERT_EQ(allocator.census().locked_allocations, locked) << "the miss took the allocator's lock";
  // More than a shard's staged records (LedgerShard::kStaged) of hits: the cache's shard folds.
  for (int i = 0; i < 100; ++i) allocator.deallocate(allocator.allocate(kHit, a));
  stress::expect_replay_agrees(ledger);
  const ConsistencyReport report = check_consistency(ledger, allocator.census());
  EXPECT_TRUE(report.ok()) << report.to_string();
}

// A fresh cache's ledger shard meets each stream through its slow path at that stream's first
// hit: a thread starting on as many streams as its bins hold must not take those for a sign
// that the counters sit at their peaks and start shedding (a shedding cache lets the heap free
// its blocks, where another thread's allocation would then get the same bytes).
TEST_P(FrontCacheTest, FirstHitsOnSeveralStreamsDoNotShed) {
  constexpr std::size_t kBytes = 16 * kKiB;
  std::vector<StreamHandle> streams;
  std::vector<DevicePtr> parked;
  for (int i = 0; i < 4; ++i) streams.push_back(device_.create_stream());
  warm(kBytes, streams[0]);  // the size asked for once: adopted from now on
  for (const StreamHandle stream : streams) {
    allocator_.deallocate(allocator_.allocate(kBytes, stream));  // adopted, parked
    const DevicePtr hit = allocator_.allocate(kBytes, stream);   // this stream's first hit
    allocator_.deallocate(hit);
    parked.push_back(hit);
  }
  std::thread other_thread([&] {
    for (std::size_t i = 0; i < streams.size(); ++i) {
      const DevicePtr ptr = allocator_.allocate(kBytes, streams[i]);
      EXPECT_NE(ptr, parked[i]) << "stream " << i << ": its block left the cache";
      allocator_.deallocate(ptr);
    }
  });
  other_thread.join();
  expect_consistent();
  for (const StreamHandle stream : streams) allocator_.release_stream(stream);
  expect_consistent();
}

TEST_P(FrontCacheTest, OutOfMemoryRetryReclaimsParkedBlocks) {
  SimulatedDeviceOptions options = device_options(GetParam());
  options.capacity_bytes = 64 * kMiB;
  SimulatedDevice device(options);
  Ledger ledger;
  CachingAllocator allocator(device, &ledger, with_front_cache(256 * kMiB));
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(allocator.allocate(8 * kMiB, 0));
  for (DevicePtr ptr : blocks) allocator.deallocate(ptr);  // 48 MiB parked
  const DevicePtr big = allocator.allocate(40 * kMiB, 0);  // fits only once they are returned
  EXPECT_TRUE(allocator.owns(big));
  allocator.deallocate(big);
  const ConsistencyReport report = check_consistency(ledger, allocator.census());
  EXPECT_TRUE(report.ok()) << report.to_string();
}

// Parked blocks are cached memory: a request they would serve once merged back takes them
// before the heap grows (front caches on, the corpus replayed at up to 1.79 of peak requested
// before: gpt2_generate with front_cache_mb:1024).
TEST_P(FrontCacheTest, ParkedBlocksAreReturnedBeforeTheHeapGrows) {
  warm(8 * kMiB);
  warm(8 * kMiB);
  const DevicePtr a = allocator_.allocate(8 * kMiB, 0);
  const DevicePtr b = allocator_.allocate(8 * kMiB, 0);
  allocator_.deallocate(a);
  allocator_.deallocate(b);
  const std::int64_t reserved = all().reserved_bytes.current;
  const std::size_t records_before = ledger_.trace().size();
  const DevicePtr merged = allocator_.allocate(16 * kMiB, 0);
  EXPECT_EQ(all().reserved_bytes.current, reserved);
  EXPECT_EQ(all().reserved_bytes.peak, reserved);
  std::size_t returned = 0;
  for (std::size_t i = records_before; i < ledger_.trace().size(); ++i) {
    returned += ledger_.trace()[i].kind == EventKind::kFrontCacheReturn ? 1 : 0;
  }
  EXPECT_EQ(returned, 2u) << "both blocks were parked and went back for the request";
  expect_consistent();
  allocator_.deallocate(merged);
  expect_consistent();
}

// The same random single-threaded run with and without front caches: every counter the user
// drives (counts and requested bytes, current and peak, per pool, per stream and untagged) ends
// equal, and the census agrees with the ledger throughout.
TEST_P(FrontCacheTest, CountersAndPeaksEqualThoseWithoutFrontCaches) {
  auto run = [&](bool front) {
    SimulatedDevice device(device_options(GetParam()));
    Ledger ledger;
    AllocatorOptions options = with_front_cache(front ? 64 * kMiB : 0);
    CachingAllocator allocator(device, &ledger, options);
    // Six streams and 28 sizes: more than a cache bins (4 streams, 16 sizes) and more streams
    // than a ledger shard counts for itself, so both give room up as the run goes.
    std::vector<StreamHandle> streams = {0};
    for (int i = 0; i < 5; ++i) streams.push_back(device.create_stream());
    std::mt19937_64 rng(42);
    std::vector<DevicePtr> live;
    std::vector<std::size_t> sizes = {512, 1000, 4 * kKiB, 60 * kKiB, 700 * kKiB, 3 * kMiB, 20 * kMiB};
    for (std::size_t i = 1; i <= 21; ++i) sizes.push_back(i * 3 * kKiB);
    for (int step = 0; step < 20'000; ++step) {
      const auto threshold = static_cast<std::uint64_t>(50 + (step / 2000) % 3 * 3);
      const bool grow = live.size() < 8 || (live.size() < 200 && rng() % 100 < threshold);
      if (grow) {
        const std::size_t size = sizes[rng() % sizes.size()] - rng() % 400;
        const StreamHandle stream = streams[(step / 3000 + rng() % 2) % streams.size()];
        live.push_back(allocator.allocate(size, stream));
      } else {
        const std::size_t at = rng() % live.size();
        allocator.deallocate(live[at]);
        live[at] = live.back();
        live.pop_back();
      }
      if (step % 2500 == 0) {
        const ConsistencyReport report = check_consistency(ledger, allocator.census());
        EXPECT_TRUE(report.ok()) << report.to_string();
      }
      if (step == 10'000) ledger.reset_peaks();
    }
    LedgerCounters counters = ledger.counters();
    std::vector<StreamUsage> per_stream = ledger.per_stream();
    for (DevicePtr ptr : live) allocator.deallocate(ptr);
    return std::make_pair(counters, per_stream);
  };
  const auto [off, off_streams] = run(false);
  const auto [on, on_streams] = run(true);
  for (std::size_t pool = 0; pool < kStatPoolCount; ++pool) {
    SCOPED_TRACE(pool);
    const PoolCounters& a = off.pools[pool];
    const PoolCounters& b = on.pools[pool];
    EXPECT_EQ(a.allocation, b.allocation);
    EXPECT_EQ(a.active, b.active);
    EXPECT_EQ(a.requested_bytes, b.requested_bytes);
    EXPECT_EQ(a.allocated_requested_bytes, b.allocated_requested_bytes);
    if (GetParam() == Heap::kPaged) {  // blocks are exactly the rounded request there
      EXPECT_EQ(a.allocated_bytes, b.allocated_bytes);
      EXPECT_EQ(a.active_bytes, b.active_bytes);
    }
  }
  ASSERT_EQ(off_streams.size(), on_streams.size());
  for (std::size_t i = 0; i < off_streams.size(); ++i) {
    EXPECT_EQ(off_streams[i].usage.allocation, on_streams[i].usage.allocation);
    EXPECT_EQ(off_streams[i].usage.requested_bytes, on_streams[i].usage.requested_bytes);
  }
}

// A ring of 64 live blocks of a few repeated sizes keeps the count at its peak: the ledger's shard
// has no headroom to grant, so front-cache hits take its slow path, the cache sheds its blocks
// (ThreadCache::note_slow_hit) and probes now and then. Through every switch the books stay
// exact: the census agrees, and counters and peaks are those of the run without front caches.
TEST_P(FrontCacheTest, ARingAtItsPeakShedsAndKeepsTheBooks) {
  auto run = [&](bool front) {
    SimulatedDevice device(device_options(GetParam()));
    Ledger ledger;
    CachingAllocator allocator(device, &ledger, with_front_cache(front ? 64 * kMiB : 0));
    const std::vector<std::size_t> sizes = {512, 1536, 8 * kKiB, 40 * kKiB, 300 * kKiB, 2 * kMiB};
    std::mt19937_64 rng(7);
    std::vector<DevicePtr> live;
    for (std::size_t i = 0; i < 64; ++i) live.push_back(allocator.allocate(sizes[i % 6], 0));
    for (int step = 0; step < 30'000; ++step) {
      const std::size_t at = rng() % live.size();
      allocator.deallocate(live[at]);
      live[at] = allocator.allocate(sizes[rng() % sizes.size()] - rng() % 300, 0);
      if (step % 3000 == 0) {
        const ConsistencyReport report = check_consistency(ledger, allocator.census());
        EXPECT_TRUE(report.ok()) << report.to_string();
      }
      if (step == 15'000) ledger.reset_peaks();
    }
    LedgerCounters counters = ledger.counters();
    for (DevicePtr ptr : live) allocator.deallocate(ptr);
    return counters;
  };
  const LedgerCounters off = run(false);
  const LedgerCounters on = run(true);
  for (std::size_t pool = 0; pool < kStatPoolCount; ++pool) {
    SCOPED_TRACE(pool);
    EXPECT_EQ(off.pools[pool].allocation, on.pools[pool].allocation);
    EXPECT_EQ(off.pools[pool].active, on.pools[pool].active);
    EXPECT_EQ(off.pools[pool].requested_bytes, on.pools[pool].requested_bytes);
    if (GetParam() == Heap::kPaged) {
      EXPECT_EQ(off.pools[pool].allocated_bytes, on.pools[pool].allocated_bytes);
    }
  }
  EXPECT_EQ(on.aggregate().allocation.peak, 64);
}

// The same ring on the per-stream fast path: each allocation needs exactly the credit the free
// before it made, and a free the cache parks leaves that credit in the cache's ledger shard,
// while the next miss is counted in the stream's. A cache whose misses keep taking the ledger's
// slow path must stop parking (ThreadCache::note_slow_miss, and trials that back off). Here,
// one thread: 11.7-11.9 slow events per thousand pairs before, 0.60-0.65 after, 0.23-0.25 with
// front caches off (both heaps).
TEST_P(FrontCacheTest, ARingWhoseMissesTakeTheSlowPathStopsParking) {
  auto slow_per_thousand = [&](bool front) {
    SimulatedDevice device(device_options(GetParam()));
    Ledger ledger;
    CachingAllocator allocator(device, &ledger, with_front_cache(front ? 64 * kMiB : 0));
    const StreamHandle a = open_fast_path(device, allocator, 256 * kMiB).first;
    const std::vector<std::size_t> sizes = {512, 1536, 8 * kKiB, 40 * kKiB, 300 * kKiB, 2 * kMiB};
    std::mt19937_64 rng(11);
    std::vector<DevicePtr> live;
    for (std::size_t i = 0; i < 64; ++i) live.push_back(allocator.allocate(sizes[i % 6], a));
    constexpr int kWarm = 60'000, kSteps = 60'000;
    std::uint64_t slow_before = 0;
    for (int step = 0; step < kWarm + kSteps; ++step) {
      if (step == kWarm) slow_before = ledger.shard_tally().slow;
      const std::size_t at = rng() % live.size();
      allocator.deallocate(live[at]);
      live[at] = allocator.allocate(sizes[rng() % sizes.size()] + 512 * (rng() % 4), a);
    }
    const double slow = static_cast<double>(ledger.shard_tally().slow - slow_before);
    EXPECT_GT(ledger.shard_tally().fast, 0u) << "the fast path never counted an event";
    const ConsistencyReport report = check_consistency(ledger, allocator.census());
    EXPECT_TRUE(report.ok()) << report.to_string();
    for (DevicePtr ptr : live) allocator.deallocate(ptr);
    return 1000.0 * slow / kSteps;
  };
  const double off = slow_per_thousand(false);
  const double on = slow_per_thousand(true);
  RecordProperty("slow_per_kpair_front_off", std::to_string(off));
  RecordProperty("slow_per_kpair_front_on", std::to_string(on));
  EXPECT_LE(on, off + 1.0) << "front caches on: " << on << " slow events per thousand pairs, off: "
                           << off;
}

INSTANTIATE_TEST_SUITE_P(Heaps, FrontCacheTest, testing::Values(Heap::kSegment, Heap::kPaged),
                         [](const testing::TestParamInfo<Heap>& info) {
                           return info.param == Heap::kPaged ? "paged" : "segment";
                         });

}  // namespace
}  // namespace vramledger
