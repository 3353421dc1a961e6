// The torch plugin's default pool used from several threads and streams, on the simulated
// device: its per-stream fast path and front caches count through the ledger's shards, wrapped by
// the device's event gate (torch_plugin/event_gate.hpp), and torch's statistics stay exact; once
// torch records history, every event of theirs reaches it.
//
// Its own process (not plugin_selftest's): the plugin is one per process, and that binary's
// history test attaches a trace tracker, which cannot be detached and keeps history active (every
// shard event on the slow path) for every test after it.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "allocator/simulated/simulated_device.hpp"
#include "torch_plugin/device_allocators.hpp"
#include "torch_plugin/vramledger_allocator.hpp"
#include "tests/torch/simulated_plugin.hpp"

namespace vramledger::torch_plugin {
namespace {

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr auto kAll = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);

// The process's plugin on the simulated device, front caches on (hides simulated_plugin.hpp's
// plugin(), which takes its settings from the environment).
VramledgerAllocator& plugin() { return simulated_plugin("front_cache_mb:64"); }

std::vector<cudaStream_t> new_streams(std::size_t count) {
  auto* device = dynamic_cast<SimulatedDevice*>(&plugin().device_state(0).backend());
  EXPECT_NE(device, nullptr);
  std::vector<cudaStream_t> streams;
  for (std::size_t i = 0; i < count; ++i) {
    streams.push_back(reinterpret_cast<cudaStream_t>(device->create_stream()));
  }
  return streams;
}

c10::CachingDeviceAllocator::DeviceStats stats() { return plugin().getDeviceStats(0); }

// Each thread on its own stream: a warm fixed size (front cache hits) and a ring of mixed sizes
// (the per-stream fast path), with a random pick of live blocks.
void run_threads(const std::vector<cudaStream_t>& streams, int pairs) {
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < streams.size(); ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t));
      std::vector<void*> live;
      for (int i = 0; i < pairs; ++i) {
        plugin().free_block(plugin().malloc(4 * kKiB, 0, streams[t]));
        if (live.size() < 12 && random() % 2 == 0) {
          live.push_back(plugin().malloc(1 + random() % (3 * kMiB), 0, streams[t]));
        } else if (!live.empty()) {
          plugin().free_block(live.back());
          live.pop_back();
        }
      }
      for (void* p : live) plugin().free_block(p);
    });
  }
  for (auto& thread : threads) thread.join();
}

TEST(TorchPluginThreads, DefaultPoolCountsOnShardsAndStaysExact) {
  DeviceAllocators& device = plugin().device_state(0);
  const std::vector<cudaStream_t> streams = new_streams(4);
  // Two streams with blocks live at once open the per-stream fast path (docs/design.md 4).
  void* a = plugin().malloc(8 * kMiB, 0, streams[0]);
  void* b = plugin().malloc(8 * kMiB, 0, streams[1]);
  plugin().free_block(a);
  plugin().free_block(b);
  const Ledger::ShardTally before = device.shard_tally();
  run_threads(streams, 20000);
  const Ledger::ShardTally after = device.shard_tally();
  // Most events counted without the gate: 4 threads x 20,000 iterations x 3-4 events.
  EXPECT_GT(after.fast - before.fast, 200000u);
  EXPECT_LT(after.slow - before.slow, (after.fast - before.fast) / 20);
  const auto now = stats();
  EXPECT_EQ(now.allocated_bytes[kAll].current, 0);
  EXPECT_EQ(now.requested_bytes[kAll].current, 0);
  EXPECT_EQ(now.allocation[kAll].current, 0);
  EXPECT_EQ(now.active[kAll].current, 0);
  // Every allocation counted once: torch's cumulative count matches what the threads made.
  EXPECT_GE(now.allocation[kAll].allocated, 4 * 20000);
  EXPECT_EQ(now.allocation[kAll].allocated, now.allocation[kAll].freed);
  EXPECT_EQ(now.allocated_bytes[kAll].allocated, now.allocated_bytes[kAll].freed);
  // emptyCache returns what the front caches park, and then every page.
  plugin().emptyCache();
  EXPECT_EQ(stats().reserved_bytes[kAll].current, 0);
}

// While torch records history, an event the shards would count on their own goes through the
// gate: every allocation and free of the fast paths shows in torch's trace.
TEST(TorchPluginThreads, HistoryRecordsTheFastPathsEvents) {
  const std::vector<cudaStream_t> streams = new_streams(2);
  void* a = plugin().malloc(8 * kMiB, 0, streams[0]);
  void* b = plugin().malloc(8 * kMiB, 0, streams[1]);
  plugin().free_block(a);
  plugin().free_block(b);
  // A size the front cache serves, and one the stream's fast path serves.
  for (int i = 0; i < 64; ++i) plugin().free_block(plugin().malloc(4 * kKiB, 0, streams[0]));
  plugin().free_block(plugin().malloc(5 * kMiB, 0, streams[1]));
  plugin().recordHistory(true, nullptr, 100000, c10_alloc::RecordContext::NEVER, true, {});
  std::vector<std::uintptr_t> made;
  for (int i = 0; i < 16; ++i) {
    void* cached = plugin().malloc(4 * kKiB, 0, streams[0]);
    void* streamed = plugin().malloc(5 * kMiB, 0, streams[1]);
    made.push_back(reinterpret_cast<std::uintptr_t>(cached));
    made.push_back(reinterpret_cast<std::uintptr_t>(streamed));
    plugin().free_block(cached);
    plugin().free_block(streamed);
  }
  std::size_t allocs = 0;
  std::size_t frees = 0;
  const auto snapshot = plugin().snapshot();
  ASSERT_GE(snapshot.device_traces.size(), 1u);
  for (const auto& entry : snapshot.device_traces[0]) {
    allocs += entry.action_ == c10_alloc::TraceEntry::ALLOC ? 1 : 0;
    frees += entry.action_ == c10_alloc::TraceEntry::FREE_COMPLETED ? 1 : 0;
  }
  EXPECT_EQ(allocs, made.size());
  EXPECT_EQ(frees, made.size());
  plugin().recordHistory(false, nullptr, 0, c10_alloc::RecordContext::NEVER, true, {});
}

// Hostile: threads on their own streams hand blocks to each other to free (cross-thread,
// cross-stream frees), while another thread switches history recording on and off; the books
// stay exact and consistent, nothing deadlocks.
TEST(TorchPluginThreads, CrossThreadFreesWhileHistoryFlips) {
  DeviceAllocators& device = plugin().device_state(0);
  const std::vector<cudaStream_t> streams = new_streams(4);
  std::mutex handoff_mutex;
  std::vector<void*> handoff;
  std::atomic<bool> done{false};
  std::thread flipper([&] {
    bool on = false;
    while (!done.load()) {
      on = !on;
      plugin().recordHistory(on, nullptr, 4096, c10_alloc::RecordContext::NEVER, true, {});
      std::this_thread::yield();
    }
    plugin().recordHistory(false, nullptr, 0, c10_alloc::RecordContext::NEVER, true, {});
  });
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < streams.size(); ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(100 + t));
      std::vector<void*> mine;
      for (int i = 0; i < 20000; ++i) {
        const std::size_t bytes = random() % 4 == 0 ? 1 + random() % (2 * kMiB) : 4 * kKiB;
        void* ptr = plugin().malloc(bytes, 0, streams[t]);
        if (random() % 3 == 0) {
          std::lock_guard lock(handoff_mutex);
          handoff.push_back(ptr);  // another thread frees it
        } else {
          mine.push_back(ptr);
        }
        if (mine.size() > 8) {
          plugin().free_block(mine.front());
          mine.erase(mine.begin());
        }
        void* theirs = nullptr;
        {
          std::lock_guard lock(handoff_mutex);
          if (!handoff.empty() && random() % 2 == 0) {
            theirs = handoff.back();
            handoff.pop_back();
          }
        }
        if (theirs != nullptr) plugin().free_block(theirs);
      }
      for (void* p : mine) plugin().free_block(p);
    });
  }
  for (auto& thread : threads) thread.join();
  done.store(true);
  flipper.join();
  for (void* p : handoff) plugin().free_block(p);
  const auto now = stats();
  EXPECT_EQ(now.allocated_bytes[kAll].current, 0);
  EXPECT_EQ(now.requested_bytes[kAll].current, 0);
  EXPECT_EQ(now.allocation[kAll].allocated, now.allocation[kAll].freed);
  EXPECT_FALSE(device.ledger_view().inconsistent);
  plugin().emptyCache();
  EXPECT_EQ(stats().reserved_bytes[kAll].current, 0);
}

}  // namespace
}  // namespace vramledger::torch_plugin
