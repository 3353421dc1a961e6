// Sleep and wake through the C API (torch_plugin/sleep_by_name.cpp, docs/sleep.md) on the
// simulated device, without a GPU: names to tags, the refusals the plugin adds (unknown tag,
// capture underway, invalid device), -2 for a wake that finds no memory, a tensor freed while
// asleep freed at the wake, and torch's statistics: allocated drops by the sleeping bytes.
// CUDA graph pools under the name "graphs": a pool a capture created sleeps whole and wakes at
// the same addresses, its output bitwise back; the ledger's reserved equals the device's bytes
// at every step; allocating into it, sleeping or waking it twice, a capture underway: refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "abi/vramledger_c_api.h"
#include "allocator/simulated/simulated_device.hpp"
#include "torch_plugin/device_allocators.hpp"
#include "torch_plugin/vramledger_allocator.hpp"
#include "tests/torch/simulated_plugin.hpp"

namespace vramledger::torch_plugin {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr auto kAll = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);

// This process's plugin (hides simulated_plugin.hpp's plugin(), which takes its settings from the
// environment).
VramledgerAllocator& plugin() {
  return simulated_plugin("sleepable_graph_pools:true");  // 80 GiB, VMM
}

void* alloc_tagged(const char* tag, std::size_t bytes) {
  EXPECT_EQ(vramledger_tag_push(tag), 0);
  struct Pop {
    ~Pop() { vramledger_tag_pop(); }
  } pop;
  return plugin().malloc(bytes, 0, nullptr);
}

std::int64_t allocated() { return plugin().getDeviceStats(0).allocated_bytes[kAll].current; }

TEST(SleepCApi, SleepsWakesAndRefuses) {
  void* weights = alloc_tagged("sleep_weights", 64 * kMiB);
  void* kv = alloc_tagged("sleep_kv", 96 * kMiB);
  const std::int64_t before = allocated();
  vramledger_sleep_result result{};
  EXPECT_EQ(vramledger_sleep(0, "no_such_tag", nullptr, &result), -1);
  EXPECT_NE(std::string(vramledger_last_error()).find("unknown tag 'no_such_tag'"),
            std::string::npos);
  EXPECT_EQ(vramledger_sleep(7, "sleep_weights", nullptr, &result), -1);  // device never used
  EXPECT_EQ(vramledger_sleep(-1, "sleep_weights", nullptr, &result), -1);

  ASSERT_EQ(vramledger_sleep(0, "sleep_weights, sleep_kv", "sleep_weights", &result), 0)
      << vramledger_last_error();
  EXPECT_EQ(result.blocks, 2u);
  EXPECT_EQ(result.offloaded_bytes, 64 * kMiB);
  EXPECT_GT(result.released_bytes, 150 * kMiB);
  EXPECT_EQ(allocated(), before - static_cast<std::int64_t>(160 * kMiB));
  char names[64];
  vramledger_sleeping_tags(0, names, sizeof names);
  EXPECT_EQ(std::string(names), "sleep_weights,sleep_kv");
  EXPECT_EQ(vramledger_sleep(0, "sleep_kv", nullptr, &result), -1);
  EXPECT_NE(std::string(vramledger_last_error()).find("already asleep"), std::string::npos);
  EXPECT_THROW(alloc_tagged("sleep_kv", kMiB), c10::Error);

  // torch frees a sleeping tensor: its deleter must not throw; the free happens at the wake.
  EXPECT_NO_THROW(plugin().free_block(kv));

  // The device fills up meanwhile: the wake fails with -2, nothing lost, and works later.
  void* squatter = plugin().malloc((std::size_t{80} << 30) - 100 * kMiB, 0, nullptr);
  EXPECT_EQ(vramledger_wake(0, nullptr, &result), -2);
  EXPECT_NE(std::string(vramledger_last_error()).find("Nothing is lost"), std::string::npos);
  plugin().free_block(squatter);
  ASSERT_EQ(vramledger_wake(0, "", &result), 0) << vramledger_last_error();
  EXPECT_EQ(result.blocks, 2u);
  EXPECT_EQ(allocated(), before - static_cast<std::int64_t>(96 * kMiB)) << "kv freed at the wake";
  EXPECT_EQ(vramledger_wake(0, "sleep_weights", &result), -1);
  EXPECT_NE(std::string(vramledger_last_error()).find("not asleep"), std::string::npos);
  plugin().free_block(weights);
}

TEST(SleepCApi, RefusedWhileACaptureRoutesToAPrivatePool) {
  void* weights = alloc_tagged("sleep_capture", 8 * kMiB);
  DeviceAllocators& state = plugin().device_state(0);
  const c10::MempoolId_t pool{7, 0};
  state.create_or_incref_pool(pool, nullptr);
  state.begin_allocate_to_pool(pool, [](cudaStream_t) { return true; });
  vramledger_sleep_result result{};
  EXPECT_EQ(vramledger_sleep(0, "sleep_capture", nullptr, &result), -1);
  EXPECT_NE(std::string(vramledger_last_error()).find("capture"), std::string::npos);
  state.end_allocate_to_pool(pool);
  state.release_pool(pool);
  EXPECT_EQ(vramledger_sleep(0, "sleep_capture", nullptr, &result), 0);
  EXPECT_EQ(vramledger_wake(0, "sleep_capture", &result), 0);
  plugin().free_block(weights);
}

TEST(SleepCApi, PrepareOffloadPinsAheadForTheNamedTags) {
  void* weights = alloc_tagged("prepare_weights", 24 * kMiB);
  CachingAllocator& policy = plugin().device_state(0).default_pool().policy();
  policy.release_sleep_host_memory();  // what earlier cases kept
  std::uint64_t kept = 0;
  EXPECT_EQ(vramledger_prepare_offload(0, "no_such_tag", &kept), -1);
  EXPECT_NE(std::string(vramledger_last_error()).find("unknown tag"), std::string::npos);
  ASSERT_EQ(vramledger_prepare_offload(0, "prepare_weights", &kept), 0) << vramledger_last_error();
  EXPECT_EQ(kept, 24 * kMiB);
  EXPECT_EQ(policy.kept_sleep_host_bytes(), 24 * kMiB);
  vramledger_sleep_result result{};
  ASSERT_EQ(vramledger_sleep(0, "prepare_weights", "prepare_weights", &result), 0);
  EXPECT_EQ(result.offloaded_bytes, 24 * kMiB);
  EXPECT_EQ(policy.kept_sleep_host_bytes(), 0u) << "the sleep took the prepared buffer";
  ASSERT_EQ(vramledger_wake(0, "prepare_weights", &result), 0);
  EXPECT_EQ(policy.kept_sleep_host_bytes(), 24 * kMiB);
  plugin().free_block(weights);
  policy.release_sleep_host_memory();
}

std::string graph_pools() {
  const std::size_t length = vramledger_graph_pools(0, nullptr, 0);
  std::string text(length + 1, '\0');
  vramledger_graph_pools(0, text.data(), text.size());
  text.resize(length);
  return text;
}

TEST(SleepCApi, GraphPoolsSleepWholeAndWakeAtTheSameAddresses) {
  DeviceAllocators& state = plugin().device_state(0);
  auto& device = dynamic_cast<SimulatedDevice&>(state.backend());
  auto reserved = [&] { return state.counters().aggregate().reserved_bytes.current; };
  auto books_match_device = [&](const char* where) {
    EXPECT_EQ(reserved(), static_cast<std::int64_t>(device.physical_bytes_in_use())) << where;
    EXPECT_FALSE(state.ledger_view().inconsistent) << where;
  };
  state.default_pool().policy().empty_cache();
  void* weights = alloc_tagged("graph_weights", 16 * kMiB);
  // A capture: torch creates the pool (beginAllocateToPool), keeps an output, frees a temporary.
  const c10::MempoolId_t pool{23, 0};
  state.begin_allocate_to_pool(pool, [](cudaStream_t) { return true; });
  void* output = plugin().malloc(6 * kMiB, 0, nullptr);
  void* temporary = plugin().malloc(30 * kMiB, 0, nullptr);
  vramledger_sleep_result result{};
  EXPECT_EQ(vramledger_sleep(0, "graphs", nullptr, &result), -1);
  EXPECT_NE(std::string(vramledger_last_error()).find("capture"), std::string::npos);
  state.end_allocate_to_pool(pool);
  plugin().free_block(temporary);
  std::vector<std::uint8_t> pattern(6 * kMiB);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::uint8_t>(i * 13);
  ASSERT_TRUE(device.write_bytes(reinterpret_cast<DevicePtr>(output), pattern.data(),
                                 pattern.size()).is_ok());
  books_match_device("captured");
  const std::int64_t held = reserved();
  const std::int64_t before = allocated();

  ASSERT_EQ(vramledger_sleep(0, "graph_weights, graphs", "graphs", &result), 0)
      << vramledger_last_error();
  EXPECT_EQ(result.blocks, 2u);
  EXPECT_EQ(result.offloaded_bytes, 6 * kMiB) << "the graph's output only";
  EXPECT_EQ(static_cast<std::int64_t>(result.released_bytes), held) << "every byte went back";
  EXPECT_EQ(device.physical_bytes_in_use(), 0u);
  EXPECT_FALSE(device.is_range_accessible(reinterpret_cast<DevicePtr>(output), 1));
  EXPECT_EQ(allocated(), before - static_cast<std::int64_t>(22 * kMiB));
  books_match_device("asleep");
  char names[64];
  vramledger_sleeping_tags(0, names, sizeof names);
  EXPECT_EQ(std::string(names), "graph_weights,graphs");
  EXPECT_NE(graph_pools().find("\"asleep\":true"), std::string::npos) << graph_pools();
  EXPECT_EQ(vramledger_sleep(0, "graphs", nullptr, &result), -1);
  EXPECT_NE(std::string(vramledger_last_error()).find("asleep already"), std::string::npos);
  // Capturing into the sleeping pool again (a shared pool handle): refused.
  state.begin_allocate_to_pool(pool, [](cudaStream_t) { return true; });
  EXPECT_THROW(plugin().malloc(kMiB, 0, nullptr), c10::Error);
  state.end_allocate_to_pool(pool);
  state.release_pool(pool);  // that graph is destroyed
  books_match_device("refused");

  ASSERT_EQ(vramledger_wake(0, nullptr, &result), 0) << vramledger_last_error();
  EXPECT_EQ(result.blocks, 2u);
  EXPECT_EQ(reserved(), held);
  books_match_device("awake");
  std::vector<std::uint8_t> back(pattern.size());
  ASSERT_TRUE(device.read_bytes(reinterpret_cast<DevicePtr>(output), back.data(), back.size())
                  .is_ok());
  EXPECT_TRUE(back == pattern) << "the output came back bitwise at its address";
  EXPECT_EQ(vramledger_wake(0, "graphs", &result), -1);
  EXPECT_NE(std::string(vramledger_last_error()).find("not asleep"), std::string::npos);

  // The device fills up while the graphs sleep: the wake fails with -2, nothing lost; once the
  // squatter is freed (its memory cached by the default pool) the wake releases that cache and
  // succeeds.
  ASSERT_EQ(vramledger_sleep(0, "graphs", "graphs", &result), 0) << vramledger_last_error();
  void* squatter = plugin().malloc(device.options().capacity_bytes - 24 * kMiB, 0, nullptr);
  EXPECT_EQ(vramledger_wake(0, "graphs", &result), -2);
  EXPECT_NE(std::string(vramledger_last_error()).find("Nothing is lost"), std::string::npos)
      << vramledger_last_error();
  books_match_device("wake refused");
  plugin().free_block(squatter);
  ASSERT_EQ(vramledger_wake(0, "graphs", &result), 0) << vramledger_last_error();
  EXPECT_EQ(reserved(), held) << "the default pool's cache went back for the wake";
  ASSERT_TRUE(device.read_bytes(reinterpret_cast<DevicePtr>(output), back.data(), back.size())
                  .is_ok());
  EXPECT_TRUE(back == pattern) << "offloaded again, back again";
  books_match_device("woken after the squatter");

  // Asleep again, the graph is destroyed and its output freed: both wait for the wake, then the
  // pool goes, with every byte.
  ASSERT_EQ(vramledger_sleep(0, "graphs", nullptr, &result), 0) << vramledger_last_error();
  state.release_pool(pool);
  EXPECT_NO_THROW(plugin().free_block(output));
  ASSERT_EQ(vramledger_wake(0, "graphs", &result), 0) << vramledger_last_error();
  EXPECT_EQ(graph_pools().find("[23,0]"), std::string::npos) << graph_pools();
  plugin().free_block(weights);
  state.default_pool().policy().empty_cache();
  books_match_device("emptied");
  EXPECT_EQ(reserved(), 0);
}

}  // namespace
}  // namespace vramledger::torch_plugin
