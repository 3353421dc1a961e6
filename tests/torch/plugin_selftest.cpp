// The torch plugin's own logic on the simulated device, without a GPU: pointer ownership, private
// pools and their routing, frees deferred during captures, torch's statistics, snapshots,
// history, OOM handling, memory fraction, installation, and the C API.
//
// Every test uses the process's one VramledgerAllocator (as torch does) on backend:simulated,
// which VRAMLEDGER_TORCH_ALLOW_SIMULATED=1 permits. The c10 entry points that ask CUDA for the
// current device or stream (allocate, raw_alloc) are exercised on the GPU by tests/torch/*.py.
#include <gtest/gtest.h>

#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "torch_plugin/install.hpp"
#include "torch_plugin/torch_compat.hpp"
#include "torch_plugin/torch_settings.hpp"
#include "torch_plugin/vramledger_allocator.hpp"
#include "tests/torch/simulated_plugin.hpp"
#include "abi/vramledger_c_api.h"

namespace vramledger::torch_plugin {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr auto kAll = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
constexpr auto kSmall = static_cast<std::size_t>(c10::CachingAllocator::StatType::SMALL_POOL);

cudaStream_t default_stream() { return nullptr; }

c10::CachingDeviceAllocator::DeviceStats stats() { return plugin().getDeviceStats(0); }

void* alloc(std::size_t bytes) { return plugin().malloc(bytes, 0, default_stream()); }

// The segment of the snapshot that holds `ptr` as an allocated block, or null.
const c10::CachingDeviceAllocator::SegmentInfo* segment_of(
    const c10_alloc::SnapshotInfo& snapshot, void* ptr) {
  const auto address = reinterpret_cast<std::size_t>(ptr);
  for (const auto& segment : snapshot.segments) {
    std::size_t at = segment.address;
    for (const auto& block : segment.blocks) {
      if (at == address && block.allocated) return &segment;
      at += block.size;
    }
  }
  return nullptr;
}

std::size_t segments_of_pool(const c10_alloc::SnapshotInfo& snapshot, c10::MempoolId_t id) {
  std::size_t count = 0;
  for (const auto& segment : snapshot.segments) count += segment.owner_private_pool_id == id;
  return count;
}

std::function<bool(cudaStream_t)> this_thread_only() {
  const auto me = std::this_thread::get_id();
  return [me](cudaStream_t) { return std::this_thread::get_id() == me; };
}

TEST(TorchPlugin, NameAndInit) {
  EXPECT_EQ(plugin().name(), "vramledger");
  EXPECT_TRUE(plugin().initialized());
}

TEST(TorchPlugin, AllocateAndFreeCountExactly) {
  const auto before = stats();
  void* p = alloc(1000);
  ASSERT_NE(p, nullptr);
  const auto during = stats();
  EXPECT_EQ(during.allocated_bytes[kAll].current - before.allocated_bytes[kAll].current, 1024);
  EXPECT_EQ(during.requested_bytes[kAll].current - before.requested_bytes[kAll].current, 1000);
  EXPECT_EQ(during.allocation[kSmall].current - before.allocation[kSmall].current, 1);
  EXPECT_GE(during.reserved_bytes[kAll].current, during.allocated_bytes[kAll].current);
  plugin().free_block(p);
  const auto after = stats();
  EXPECT_EQ(after.allocated_bytes[kAll].current, before.allocated_bytes[kAll].current);
  EXPECT_EQ(after.allocation[kAll].allocated - before.allocation[kAll].allocated, 1);
  EXPECT_EQ(after.allocation[kAll].freed - before.allocation[kAll].freed, 1);
}

TEST(TorchPlugin, ZeroBytesAndNull) {
  EXPECT_EQ(alloc(0), nullptr);
  EXPECT_NO_THROW(plugin().free_block(nullptr));
}

TEST(TorchPlugin, ForeignAndDoubleFreesAreRefused) {
  EXPECT_THROW(plugin().free_block(reinterpret_cast<void*>(0x1234)), c10::Error);
  void* p = alloc(4096);
  plugin().free_block(p);
  EXPECT_THROW(plugin().free_block(p), c10::Error);
}

TEST(TorchPlugin, PrivatePoolRoutingAndRelease) {
  const c10::MempoolId_t pool{101, 0};
  const auto reserved_before = stats().reserved_bytes[kAll].current;
  plugin().beginAllocateToPool(0, pool, this_thread_only());
  void* in_pool = alloc(3 * kMiB);
  plugin().endAllocateToPool(0, pool);
  void* outside = alloc(3 * kMiB);

  auto snapshot = plugin().snapshot();
  ASSERT_NE(segment_of(snapshot, in_pool), nullptr);
  EXPECT_EQ(segment_of(snapshot, in_pool)->owner_private_pool_id, pool);
  ASSERT_NE(segment_of(snapshot, outside), nullptr);
  EXPECT_EQ(segment_of(snapshot, outside)->owner_private_pool_id, (c10::MempoolId_t{0, 0}));
  const auto only_pool = plugin().snapshot(pool);
  EXPECT_GT(only_pool.segments.size(), 0u);
  for (const auto& segment : only_pool.segments) EXPECT_EQ(segment.owner_private_pool_id, pool);
  // Private pools never use the paged heap: their segments are plain ones.
  for (const auto& segment : only_pool.segments) EXPECT_FALSE(segment.is_expandable);
  EXPECT_EQ(plugin().getPoolUseCount(0, pool), 1);

  plugin().releasePool(0, pool);  // torch no longer uses the pool, but in_pool is still live
  EXPECT_EQ(plugin().getPoolUseCount(0, pool), 0);
  EXPECT_GT(segments_of_pool(plugin().snapshot(), pool), 0u);
  plugin().free_block(in_pool);   // its last block: the pool gives its memory back
  EXPECT_EQ(segments_of_pool(plugin().snapshot(), pool), 0u);
  plugin().free_block(outside);
  plugin().emptyCache();
  EXPECT_LE(stats().reserved_bytes[kAll].current, reserved_before);
}

TEST(TorchPlugin, PoolInUseKeepsItsSegments) {
  const c10::MempoolId_t pool{102, 0};
  plugin().beginAllocateToPool(0, pool, this_thread_only());
  void* p = alloc(5 * kMiB);
  plugin().free_block(p);  // freed inside the "capture": stays in the pool for reuse
  void* again = alloc(5 * kMiB);
  EXPECT_EQ(again, p) << "a block freed inside the pool is reused by the pool";
  plugin().endAllocateToPool(0, pool);
  plugin().free_block(again);
  plugin().emptyCache();
  EXPECT_GT(segments_of_pool(plugin().snapshot(), pool), 0u)
      << "a graph may still replay into this memory: empty_cache must keep it";
  plugin().releasePool(0, pool);
  EXPECT_EQ(segments_of_pool(plugin().snapshot(), pool), 0u);
}

TEST(TorchPlugin, SharedPoolCountsUsers) {
  const c10::MempoolId_t pool{103, 0};
  plugin().createOrIncrefPool(0, pool, nullptr);                  // MemPool()
  plugin().beginAllocateToPool(0, pool, this_thread_only());      // use_mem_pool
  EXPECT_EQ(plugin().getPoolUseCount(0, pool), 2);
  EXPECT_THROW(plugin().beginAllocateToPool(0, pool, this_thread_only()), c10::Error);
  void* p = alloc(kMiB);
  void* q = alloc(2 * kMiB);
  plugin().endAllocateToPool(0, pool);
  EXPECT_THROW(plugin().endAllocateToPool(0, pool), c10::Error);
  plugin().releasePool(0, pool);
  EXPECT_EQ(plugin().getPoolUseCount(0, pool), 1);
  EXPECT_TRUE(plugin().checkPoolLiveAllocations(0, pool, {p, q}));
  EXPECT_FALSE(plugin().checkPoolLiveAllocations(0, pool, {p}));
  plugin().free_block(p);
  plugin().free_block(q);
  plugin().setUseOnOOM(0, pool, false);  // what ~MemPool does, then:
  plugin().releasePool(0, pool);
  plugin().emptyCache(pool);
  EXPECT_EQ(segments_of_pool(plugin().snapshot(), pool), 0u);
  EXPECT_EQ(plugin().getPoolUseCount(0, pool), 0);
}

TEST(TorchPlugin, DefaultPoolFreesWaitForTheEndOfACapture) {
  void* p = alloc(2 * kMiB);
  const auto allocated = stats().allocated_bytes[kAll].current;
  const c10::MempoolId_t pool{104, 0};
  plugin().beginAllocateToPool(0, pool, [](cudaStream_t) { return false; });
  plugin().free_block(p);
  EXPECT_EQ(stats().allocated_bytes[kAll].current, allocated) << "freed during a capture";
  plugin().endAllocateToPool(0, pool);
  EXPECT_EQ(stats().allocated_bytes[kAll].current, allocated - 2 * static_cast<std::int64_t>(kMiB));
  plugin().releasePool(0, pool);
}

TEST(TorchPlugin, MemoryFractionCapsAndOomObserverRuns) {
  // Observers stay attached for the process (as in torch): they must outlive this test.
  static std::vector<std::size_t> requests;
  requests.clear();
  plugin().attachOutOfMemoryObserver(
      [](int64_t, size_t bytes, size_t, size_t) { requests.push_back(bytes); });
  static std::vector<std::size_t> rejected;
  rejected.clear();
  plugin().add_oom_rejection_observer(
      [](int64_t, size_t bytes, size_t, size_t) { rejected.push_back(bytes); });
  const auto ooms = stats().num_ooms;
  const auto rejections = plugin().oom_rejections(0);
  plugin().setMemoryFraction(0.001, 0);  // ~82 MiB of the simulated 80 GiB
  EXPECT_DOUBLE_EQ(plugin().getMemoryFraction(0), 0.001);
  try {
    alloc(200 * kMiB);
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const c10::OutOfMemoryError& error) {
    // torch's wording, which tools parse, then the cap and vramledger's account.
    const std::string what = error.what();
    EXPECT_NE(what.find("CUDA out of memory. Tried to allocate 200.00 MiB. GPU 0 has a total "
                        "capacity of "), std::string::npos) << what;
    EXPECT_NE(what.find("is reserved by PyTorch but unallocated."), std::string::npos) << what;
    EXPECT_NE(what.find("memory fraction"), std::string::npos) << what;
    EXPECT_NE(what.find("vramledger's account of this process on GPU 0"), std::string::npos)
        << what;
  }
  plugin().setMemoryFraction(1.0, 0);
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0], 200 * kMiB);
  EXPECT_EQ(stats().num_ooms, ooms + 1);
  // The device had room: the cap refused it, which torch 2.12+ counts as an OOM rejection.
  EXPECT_EQ(plugin().oom_rejections(0), rejections + 1);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_EQ(rejected[0], 200 * kMiB);
  void* p = alloc(200 * kMiB);
  plugin().free_block(p);
  EXPECT_THROW(plugin().setMemoryFraction(1.5, 0), c10::Error);
}

TEST(TorchPlugin, OomNoteOfTheBudgetBoardEndsTheMessage) {
  // docs/board.md, "Enforcement": the board's sentence naming the other instances.
  const std::string note = "vramledger budget board (test): other instances: pid 42 holds 1 GiB.";
  ASSERT_EQ(vramledger_set_oom_note(0, note.c_str()), 0);
  EXPECT_EQ(vramledger_set_oom_note(-1, "x"), -1);
  EXPECT_NE(std::string(vramledger_last_error()).find("invalid device -1"), std::string::npos);
  plugin().setMemoryFraction(0.001, 0);
  const auto message = []() -> std::string {
    try {
      alloc(1000 * kMiB);  // more than the cap and than what earlier tests left cached
    } catch (const c10::OutOfMemoryError& error) {
      return error.what();
    }
    return "no out-of-memory error";
  };
  const std::string with_note = message();
  EXPECT_NE(with_note.find(" " + note), std::string::npos) << with_note;
  ASSERT_EQ(vramledger_set_oom_note(0, ""), 0);  // removed
  const std::string without = message();
  EXPECT_NE(without.find("CUDA out of memory."), std::string::npos) << without;
  EXPECT_EQ(without.find("budget board"), std::string::npos) << without;
  plugin().setMemoryFraction(1.0, 0);
}

TEST(TorchPlugin, ImpossibleRequestsAreOutOfMemoryInTorchsWords) {
  const auto ooms = stats().num_ooms;
  const std::size_t huge = std::size_t{800000000} * 1024 * 1024 * 1024;  // 800,000,000 GiB
  try {
    alloc(huge);
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const c10::OutOfMemoryError& error) {
    EXPECT_NE(std::string(error.what()).find("Tried to allocate 800000000.00 GiB"),
              std::string::npos) << error.what();
  }
  EXPECT_EQ(stats().num_ooms, ooms + 1);
  try {
    alloc(std::size_t{1} << 62);
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const c10::OutOfMemoryError& error) {
    EXPECT_NE(std::string(error.what()).find("Tried to allocate more than 1EB memory"),
              std::string::npos) << error.what();
  }
  // Nothing was lost: the next request succeeds and the books are back where they were.
  const auto allocated = stats().allocated_bytes[kAll].current;
  void* p = alloc(kMiB);
  plugin().free_block(p);
  EXPECT_EQ(stats().allocated_bytes[kAll].current, allocated);
}

// Issue 16, "out of memory that helps": at the memory-fraction cap and at the device's own limit
// the allocator frees its cache and retries before it raises; the message keeps torch's wording
// and says where the memory is: the largest free block left after the cache went back (what
// fragmentation leaves), the graph and other private pools' memory, the additive account. The
// process continues: later requests succeed.
TEST(TorchPlugin, OutOfMemoryFreesTheCacheRetriesAndSaysWhereTheMemoryIs) {
  plugin().emptyCache();
  const auto reserved_start = stats().reserved_bytes[kAll].current;
  // A private (graph) pool holding memory.
  const c10::MempoolId_t pool{116, 0};
  plugin().beginAllocateToPool(0, pool, this_thread_only());
  void* in_pool = alloc(3 * kMiB);
  plugin().endAllocateToPool(0, pool);
  std::int64_t pool_bytes = 0;
  for (const auto& segment : plugin().snapshot(pool).segments) {
    pool_bytes += static_cast<std::int64_t>(segment.total_size);
  }
  ASSERT_GT(pool_bytes, 0);
  // The message counts every private pool of the process: those earlier tests left too (the
  // plugin is one per process, and tests run in any order).
  std::int64_t private_pool_bytes = 0;
  for (const auto& segment : plugin().snapshot({0, 0}).segments) {
    if (segment.owner_private_pool_id != c10::MempoolId_t{0, 0}) {
      private_pool_bytes += static_cast<std::int64_t>(segment.total_size);
    }
  }
  ASSERT_GE(private_pool_bytes, pool_bytes);
  // In the default pool: a 2.5 MiB block, then a 1.5 MiB block ending on the same 2 MiB page;
  // freed, the second is a hole in a page the first still needs (1.50 MiB that no cache release
  // can return), plus 64 MiB of plain cache that a release does return.
  void* kept = alloc(5 * kMiB / 2);
  void* hole = alloc(3 * kMiB / 2);
  void* cached = alloc(64 * kMiB);
  plugin().free_block(hole);
  plugin().free_block(cached);
  const auto reserved_cached = stats().reserved_bytes[kAll].current;
  ASSERT_GE(reserved_cached - reserved_start, static_cast<std::int64_t>(64 * kMiB) + pool_bytes);
  const auto total = static_cast<double>(plugin().device_state(0).backend_info().total_bytes);

  auto out_of_memory = [](std::size_t bytes) -> std::string {
    try {
      void* p = alloc(bytes);
      plugin().free_block(p);
    } catch (const c10::OutOfMemoryError& error) {
      return error.what();
    }
    return "no out-of-memory error";
  };
  const std::string pool_text = "graph and other private pools hold " +
                                c10::CachingAllocator::format_size(private_pool_bytes) + ".";
  for (const bool at_cap : {true, false}) {
    SCOPED_TRACE(at_cap ? "at the memory-fraction cap" : "at the simulated device's limit");
    const auto retries = stats().num_alloc_retries;
    const auto ooms = stats().num_ooms;
    // At the cap: 100 MiB, above the cap (32 MiB over what is reserved) but below the cap plus
    // the cache. At the device's limit: 78 GiB live of its 80 GiB, then 4 GiB (a request the
    // device could hold, so the cache is released and the request retried first).
    void* filler = nullptr;
    if (at_cap) {
      plugin().setMemoryFraction((reserved_cached + 32.0 * kMiB) / total, 0);
    } else {
      filler = alloc(78 * kMiB * 1024);
      ASSERT_NE(filler, nullptr);
    }
    const std::int64_t filler_bytes = at_cap ? 0 : static_cast<std::int64_t>(78 * kMiB * 1024);
    const std::size_t request = at_cap ? 100 * kMiB : 4 * kMiB * 1024;
    const std::string what = out_of_memory(request);
    plugin().setMemoryFraction(1.0, 0);
    EXPECT_EQ(what.rfind("CUDA out of memory. Tried to allocate " +
                         c10::CachingAllocator::format_size(request) + ". GPU 0 has a total "
                         "capacity of ", 0), 0u) << what;
    EXPECT_NE(what.find(" is allocated by PyTorch, and "), std::string::npos) << what;
    EXPECT_NE(what.find("Largest free cached block: 1.50 MiB;"), std::string::npos)
        << "the hole is the largest free block once the cache went back: " << what;
    EXPECT_NE(what.find(pool_text), std::string::npos) << what;
    EXPECT_NE(what.find("vramledger's account of this process on GPU 0"), std::string::npos)
        << what;
    EXPECT_EQ(what.find("memory fraction") != std::string::npos, at_cap) << what;
    EXPECT_GT(stats().num_alloc_retries, retries) << "no retry after freeing the cache";
    EXPECT_EQ(stats().num_ooms, ooms + 1);
    // The cache went back before the error: what is reserved is the live blocks' pages (the
    // kept block's two) and the private pool.
    // The cache went back before the error, and so did any page the failed attempt gathered:
    // what is reserved is the live blocks' pages (the kept block's two, the filler's) and the
    // private pool.
    EXPECT_EQ(stats().reserved_bytes[kAll].current,
              reserved_start + static_cast<std::int64_t>(4 * kMiB) + filler_bytes + pool_bytes);
    if (filler != nullptr) plugin().free_block(filler);
  }
  // The process continues: the request that hit the cap now succeeds.
  void* later = alloc(100 * kMiB);
  plugin().free_block(later);
  plugin().free_block(kept);
  plugin().free_block(in_pool);
  plugin().releasePool(0, pool);
  plugin().emptyCache();
  EXPECT_EQ(stats().reserved_bytes[kAll].current, reserved_start);
}

TEST(TorchPlugin, BuiltForTheTorchThatIsLoaded) {
  // The self-test runs against the torch it was compiled for: the load-time check must agree.
  const std::string loaded = loaded_torch_version();
  const std::string built = std::to_string(compat::kBuiltTorchMajor) + "." +
                            std::to_string(compat::kBuiltTorchMinor) + ".";
  ASSERT_FALSE(loaded.empty()) << "libc10.so is not in a wheel's torch/lib/ folder";
  EXPECT_EQ(loaded.rfind(built, 0), 0u) << loaded << " vs " << built;
  EXPECT_NO_THROW(check_loaded_torch_matches_build());
  EXPECT_GE(compat::kBuiltTorchMinor, compat::kTorchMinorMin);
  EXPECT_LE(compat::kBuiltTorchMinor, compat::kTorchMinorMax);
}

TEST(TorchPlugin, HonoursTorchsRoundupPower2Divisions) {
  constexpr std::size_t kBytes = 84 * kMiB;  // between 64 and 128 MiB
  EXPECT_EQ(torch_power2_division_block(kBytes), 0u) << "no setting: vramledger's own rounding";
  c10::CachingAllocator::setAllocatorSettings("roundup_power2_divisions:4");
  EXPECT_EQ(torch_power2_division_block(kBytes), 96 * kMiB);  // 64 + 16 + 16
  EXPECT_EQ(torch_power2_division_block(64 * kMiB), 0u) << "a power of two stays itself";
  const auto allocated = stats().allocated_bytes[kAll].allocated;
  const auto requested = stats().requested_bytes[kAll].allocated;
  void* p = alloc(kBytes);
  EXPECT_EQ(stats().allocated_bytes[kAll].allocated - allocated, static_cast<std::int64_t>(96 * kMiB));
  EXPECT_EQ(stats().requested_bytes[kAll].allocated - requested, static_cast<std::int64_t>(kBytes));
  plugin().free_block(p);
  c10::CachingAllocator::setAllocatorSettings("roundup_power2_divisions:[64:8,128:2,>:1]");
  EXPECT_EQ(torch_power2_division_block(kBytes), 88 * kMiB);  // 8 divisions between 64 and 128
  c10::CachingAllocator::setAllocatorSettings("garbage_collection_threshold:0.5");
  EXPECT_EQ(torch_power2_division_block(kBytes), 0u) << "a new setting string resets it";
}

TEST(TorchPlugin, CachingDisabledBypassesTheCacheAndTheStatistics) {
  const auto requested = stats().requested_bytes[kAll].allocated;
  plugin().enable(false);
  void* p = alloc(kMiB);
  EXPECT_EQ(stats().requested_bytes[kAll].allocated, requested) << "torch: not in the stats";
  EXPECT_EQ(plugin().device_state(0).uncached_bytes(), static_cast<std::int64_t>(kMiB));
  std::size_t size = 0;
  EXPECT_EQ(plugin().getBaseAllocation(p, &size), p);
  EXPECT_EQ(size, kMiB);
  plugin().enable(true);
  plugin().free_block(p);  // freed after re-enabling: still returned to cudaMalloc's side
  EXPECT_EQ(plugin().device_state(0).uncached_bytes(), 0);
  EXPECT_THROW(plugin().free_block(p), c10::Error) << "double free";
  void* q = alloc(kMiB);
  EXPECT_EQ(stats().requested_bytes[kAll].allocated, requested + static_cast<std::int64_t>(kMiB));
  plugin().free_block(q);
}

TEST(TorchPlugin, MemoryFractionCapsAllPoolsTogether) {
  // torch's allowed_memory_maximum counts every segment of the device, private pools included
  // (its test_mempool_limited_memory_with_allocator): 96 MiB for the pool and the default pool.
  const c10::MempoolId_t pool{303, 0};
  plugin().emptyCache();
  const auto reserved = static_cast<double>(stats().reserved_bytes[kAll].current);
  const auto total = static_cast<double>(plugin().device_state(0).backend_info().total_bytes);
  plugin().setMemoryFraction((reserved + 96.0 * kMiB) / total, 0);
  plugin().beginAllocateToPool(0, pool, this_thread_only());
  void* in_pool = alloc(60 * kMiB);
  plugin().endAllocateToPool(0, pool);
  EXPECT_THROW(alloc(60 * kMiB), c10::OutOfMemoryError) << "60 + 60 MiB > 96 MiB";
  void* fits = alloc(20 * kMiB);
  plugin().free_block(fits);
  plugin().free_block(in_pool);
  plugin().releasePool(0, pool);  // the pool's memory goes back: the default pool may use it
  void* now_fits = alloc(60 * kMiB);
  plugin().free_block(now_fits);
  plugin().setMemoryFraction(1.0, 0);
  plugin().emptyCache();
}

TEST(TorchPlugin, ResetPeakAndAccumulated) {
  void* p = alloc(64 * kMiB);
  plugin().free_block(p);
  EXPECT_GE(stats().allocated_bytes[kAll].peak, static_cast<std::int64_t>(64 * kMiB));
  plugin().resetPeakStats(0);
  EXPECT_EQ(stats().allocated_bytes[kAll].peak, stats().allocated_bytes[kAll].current);
  plugin().resetAccumulatedStats(0);
  EXPECT_EQ(stats().allocation[kAll].allocated, 0);
  EXPECT_EQ(stats().allocated_bytes[kAll].freed, 0);
}

TEST(TorchPlugin, StatsOfAnUnusedDeviceAreZero) {
  const auto unused = plugin().getDeviceStats(7);
  EXPECT_EQ(unused.reserved_bytes[kAll].current, 0);
  EXPECT_EQ(plugin().device_if_created(7), nullptr);
}

TEST(TorchPlugin, HistoryAndTraceTrackers) {
  // Trackers cannot be detached (as in torch): the counter must outlive the test, or later
  // tests' events write into a dead stack frame.
  static std::atomic<int> tracked{0};
  tracked.store(0);
  plugin().attachAllocatorTraceTracker(
      [](const c10_alloc::TraceEntry&) { tracked.fetch_add(1); });
  plugin().recordHistory(true, nullptr, 1000, c10_alloc::RecordContext::STATE, true, {});
  EXPECT_TRUE(plugin().isHistoryEnabled());
  void* p = alloc(5000);
  plugin().free_block(p);
  const auto snapshot = plugin().snapshot();
  ASSERT_GE(snapshot.device_traces.size(), 1u);
  bool saw_alloc = false;
  bool saw_free = false;
  for (const auto& entry : snapshot.device_traces[0]) {
    if (entry.addr_ == reinterpret_cast<std::size_t>(p)) {
      // Like torch (checked on the H200: an alloc of 1000 bytes is traced as 1000), trace
      // entries carry the requested size, not the rounded 5120.
      saw_alloc |= entry.action_ == c10_alloc::TraceEntry::ALLOC && entry.size_ == 5000;
      saw_free |= entry.action_ == c10_alloc::TraceEntry::FREE_COMPLETED;
    }
  }
  EXPECT_TRUE(saw_alloc);
  EXPECT_TRUE(saw_free);
  // As torch (its test_cpp_memory_snapshot_pickle): a snapshot's trace ends with the last
  // allocator event; its marker is recorded after the copy and shows in the next snapshot.
  EXPECT_EQ(snapshot.device_traces[0].back().action_, c10_alloc::TraceEntry::FREE_COMPLETED);
  EXPECT_EQ(snapshot.device_traces[0].back().compile_context_, "N/A");
  EXPECT_EQ(plugin().snapshot().device_traces[0].back().action_, c10_alloc::TraceEntry::SNAPSHOT);
  EXPECT_GE(tracked.load(), 3);
  plugin().recordHistory(false, nullptr, 0, c10_alloc::RecordContext::NEVER, true, {"alloc"});
  EXPECT_FALSE(plugin().isHistoryEnabled());
  EXPECT_TRUE(plugin().snapshot().device_traces[0].empty());
}

TEST(TorchPlugin, SnapshotMatchesStats) {
  std::vector<void*> live = {alloc(3 * kMiB), alloc(700), alloc(21 * kMiB)};
  const auto snapshot = plugin().snapshot();
  std::int64_t allocated = 0;
  for (const auto& segment : snapshot.segments) {
    std::size_t total = 0;
    for (const auto& block : segment.blocks) total += block.size;
    EXPECT_EQ(total, segment.total_size);
    allocated += static_cast<std::int64_t>(segment.allocated_size);
  }
  EXPECT_EQ(allocated, stats().allocated_bytes[kAll].current);
  for (void* p : live) EXPECT_NE(segment_of(snapshot, p), nullptr);
  for (void* p : live) plugin().free_block(p);
}

TEST(TorchPlugin, BaseAllocationCacheInfoAndSegmentSizes) {
  void* p = alloc(64 * kMiB);
  std::size_t size = 0;
  void* base = plugin().getBaseAllocation(p, &size);
  EXPECT_LE(base, p);
  EXPECT_LT(static_cast<char*>(p), static_cast<char*>(base) + size);
  EXPECT_FALSE(plugin().getExpandableSegmentSizes(0).empty()) << "simulated device has VMM";
  plugin().free_block(p);
  std::size_t largest = 1;
  plugin().cacheInfo(0, &largest);
  EXPECT_GE(largest, 64 * kMiB);
  largest = 0;
  plugin().cacheInfo(0, &largest);  // 0: starts from the device's free memory
  EXPECT_GT(largest, 64 * kMiB);
}

TEST(TorchPlugin, IpcNoSplitAndUnknownPoolsAreClearlyRefused) {
  void* p = alloc(kMiB);
  EXPECT_THROW(plugin().getIpcDevPtr("x"), c10::Error) << "CUDA IPC: tests/torch/ipc_selftest.cpp";
  EXPECT_THROW(plugin().getCheckpointState(0, {1, 0}), c10::Error) << "no such pool";
  EXPECT_THROW(plugin().setNoSplit(0, {0, 0}), c10::Error) << "the default pool";
  plugin().free_block(p);
}

// torch.cuda.MemPool(no_split=True): every block of the pool is a whole segment of its own, whether
// torch says so before creating the pool or after.
TEST(TorchPlugin, NoSplitPoolGivesEachBlockItsOwnSegment) {
  for (const bool said_first : {true, false}) {
    SCOPED_TRACE(said_first ? "setNoSplit before createOrIncrefPool" : "after");
    const c10::MempoolId_t pool{said_first ? 106 : 107, 0};
    if (said_first) plugin().setNoSplit(0, pool);
    plugin().createOrIncrefPool(0, pool, nullptr);
    if (!said_first) plugin().setNoSplit(0, pool);
    plugin().beginAllocateToPool(0, pool, this_thread_only());
    std::vector<void*> blocks = {alloc(kMiB), alloc(700 * 1024), alloc(5 * kMiB), alloc(512)};
    plugin().free_block(blocks[2]);
    blocks[2] = alloc(3 * kMiB);  // reuses the freed 6 MiB segment whole, never a piece of it
    plugin().endAllocateToPool(0, pool);
    const auto snapshot = plugin().snapshot(pool);
    std::size_t segments = 0;
    for (const auto& segment : snapshot.segments) {
      ++segments;
      EXPECT_EQ(segment.blocks.size(), 1u) << "segment at " << segment.address << " was split";
    }
    EXPECT_EQ(segments, 4u);
    for (void* p : blocks) plugin().free_block(p);
    plugin().releasePool(0, pool);
    plugin().releasePool(0, pool);
    plugin().emptyCache(pool);
    EXPECT_EQ(segments_of_pool(plugin().snapshot(), pool), 0u);
  }
}

// What torch.compile's CUDA graph trees do: checkpoint a private pool after recording a graph,
// let the pool change, then put the checkpoint back before recording on another path.
TEST(TorchPlugin, CheckpointedPoolComesBackExactly) {
  const c10::MempoolId_t pool{104, 0};
  plugin().beginAllocateToPool(0, pool, this_thread_only());
  void* kept = alloc(3 * kMiB);
  void* also_kept = alloc(700 * 1024);
  void* dropped_later = alloc(5 * kMiB);
  plugin().free_block(dropped_later);
  const auto allocated_at_checkpoint = stats().allocated_bytes[kAll].current;
  const auto checkpoint = plugin().getCheckpointState(0, pool);

  plugin().free_block(also_kept);  // the pool moves on: one block freed, another one made
  void* newer = alloc(2 * kMiB);
  plugin().endAllocateToPool(0, pool);  // graph trees restore between recordings
  auto delta = plugin().setCheckpointPoolState(0, checkpoint);

  // Freed: what was allocated just before (kept, newer); allocated: the checkpoint's blocks.
  std::set<void*> freed(delta.ptrs_freed.begin(), delta.ptrs_freed.end());
  EXPECT_EQ(freed, (std::set<void*>{kept, newer}));
  std::set<void*> allocd;
  for (const auto& data_ptr : delta.dataptrs_allocd) {
    allocd.insert(data_ptr.get());
    EXPECT_EQ(data_ptr.get_deleter(), plugin().raw_deleter());
  }
  EXPECT_EQ(allocd, (std::set<void*>{kept, also_kept}));
  EXPECT_EQ(stats().allocated_bytes[kAll].current, allocated_at_checkpoint);
  EXPECT_TRUE(plugin().checkPoolLiveAllocations(0, pool, {kept, also_kept}));
  // The restored blocks are ordinary ones: their DataPtrs free them.
  delta.dataptrs_allocd.clear();
  EXPECT_TRUE(plugin().checkPoolLiveAllocations(0, pool, {}));
  EXPECT_THROW(plugin().free_block(kept), c10::Error) << "already freed by its DataPtr";

  // Misuse is a clear error.
  plugin().beginAllocateToPool(0, pool, this_thread_only());
  void* small = alloc(kMiB);
  const auto one_block = plugin().getCheckpointState(0, pool);
  EXPECT_THROW(plugin().setCheckpointPoolState(0, one_block), c10::Error) << "while capturing";
  plugin().endAllocateToPool(0, pool);
  plugin().free_block(small);
  EXPECT_THROW(plugin().setCheckpointPoolState(1, one_block), c10::Error) << "wrong device";
  EXPECT_THROW(plugin().getCheckpointState(0, {0, 0}), c10::Error) << "default pool";
  plugin().releasePool(0, pool);
  plugin().emptyCache();
}

TEST(TorchPlugin, ConcurrentAllocateAndFree) {
  const auto before = stats().allocated_bytes[kAll].current;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      std::mt19937 random(static_cast<unsigned>(t));
      std::vector<void*> live;
      for (int i = 0; i < 2000; ++i) {
        if (live.size() < 16 && random() % 3 != 0) {
          live.push_back(alloc(1 + random() % (4 * kMiB)));
        } else if (!live.empty()) {
          plugin().free_block(live.back());
          live.pop_back();
        }
      }
      for (void* p : live) plugin().free_block(p);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(stats().allocated_bytes[kAll].current, before);
}

TEST(TorchPlugin, CApi) {
  EXPECT_EQ(vramledger_tag_push("selftest_weights"), 0);
  void* p = vramledger_malloc(8192, 0, nullptr);
  vramledger_tag_pop();
  vramledger_stats flat{};
  ASSERT_EQ(vramledger_get_stats(0, &flat), 0);
  EXPECT_EQ(flat.allocated_bytes.current, stats().allocated_bytes[kAll].current);
  EXPECT_EQ(vramledger_get_stats(-1, &flat), -1);

  const std::size_t length = vramledger_stats_json(0, nullptr, 0);
  std::string json(length + 1, '\0');
  EXPECT_EQ(vramledger_stats_json(0, json.data(), json.size()), length);
  json.resize(length);
  EXPECT_NE(json.find("\"allocated_bytes\":{\"all\":{\"current\":"), std::string::npos);
  EXPECT_NE(json.find("\"selftest_weights\":{\"allocation\""), std::string::npos);
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
  char small[8];
  EXPECT_EQ(vramledger_stats_json(0, small, sizeof small), length);
  EXPECT_EQ(std::string(small), json.substr(0, 7));

  std::string report(vramledger_report(nullptr, 0) + 1, '\0');
  vramledger_report(report.data(), report.size());
  EXPECT_NE(report.find("CUDA device 0, backend simulated"), std::string::npos);

  vramledger_free(p, 8192, 0, nullptr);
  EXPECT_EQ(vramledger_empty_cache(), 0);
  EXPECT_EQ(vramledger_tag_push(""), -1);
  EXPECT_NE(std::string(vramledger_last_error()), "");
}

TEST(TorchPlugin, InstallReplacesTorchsAllocatorOnce) {
  plugin();
  ASSERT_FALSE(installed());
  ASSERT_EQ(vramledger_install("backend:simulated"), 0) << vramledger_last_error();
  EXPECT_TRUE(installed());
  EXPECT_EQ(vramledger_is_installed(), 1);
  EXPECT_EQ(c10::cuda::CUDACachingAllocator::get(), &plugin());
  EXPECT_EQ(c10::GetAllocator(c10::DeviceType::CUDA), &plugin());
  EXPECT_EQ(vramledger_install("backend:simulated"), 0) << "same config: no-op";
  EXPECT_EQ(vramledger_install(""), 0) << "no config: no-op";
  EXPECT_EQ(vramledger_install("backend:vmm"), -1);
  EXPECT_NE(std::string(vramledger_last_error()).find("already installed"), std::string::npos);
}

}  // namespace
}  // namespace vramledger::torch_plugin
