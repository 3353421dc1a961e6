// Graph pool figures through the C API (torch_plugin/graph_pools.hpp, docs/graphs.md) on the
// simulated device, without a GPU: a private pool that a "capture" allocated into reports its
// live, cached and reserved bytes exactly (reserved = live + cached, recounted from its blocks);
// the default pool is not listed; a pool torch released and emptied leaves the list.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>

#include "abi/vramledger_c_api.h"
#include "torch_plugin/device_allocators.hpp"
#include "torch_plugin/vramledger_allocator.hpp"
#include "tests/torch/simulated_plugin.hpp"

namespace vramledger::torch_plugin {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

std::string pools_json() {
  const std::size_t length = vramledger_graph_pools(0, nullptr, 0);
  std::string text(length + 1, '\0');
  vramledger_graph_pools(0, text.data(), text.size());
  text.resize(length);
  return text;
}

// The number after "name": in the object of pool id [first,second].
std::int64_t field(const std::string& json, const std::string& id, const std::string& name) {
  const std::size_t at = json.find("{\"id\":" + id);
  if (at == std::string::npos) return -1;
  const std::size_t end = json.find('}', at);
  const std::string object = json.substr(at, end - at);
  std::smatch match;
  if (!std::regex_search(object, match, std::regex("\"" + name + "\":(-?[0-9]+)"))) return -2;
  return std::stoll(match[1]);
}

TEST(GraphPools, APoolReportsLiveCachedAndReservedExactly) {
  void* outside = plugin().malloc(3 * kMiB, 0, nullptr);  // the default pool: not listed
  EXPECT_EQ(pools_json(), "[]");
  DeviceAllocators& state = plugin().device_state(0);
  const c10::MempoolId_t pool{0, 41};
  state.begin_allocate_to_pool(pool, [](cudaStream_t) { return true; });  // creates it, as torch
  void* output = plugin().malloc(6 * kMiB, 0, nullptr);        // kept: the graph's output
  void* temporary = plugin().malloc(4 * kMiB + 512, 0, nullptr);  // freed inside the capture
  void* small = plugin().malloc(1000, 0, nullptr);
  plugin().free_block(temporary);
  state.end_allocate_to_pool(pool);

  const std::string json = pools_json();
  const std::string id = "[0,41]";
  ASSERT_NE(json.find(id), std::string::npos) << json;
  const std::int64_t live = field(json, id, "live_bytes");
  const std::int64_t cached = field(json, id, "cached_bytes");
  const std::int64_t reserved = field(json, id, "reserved_bytes");
  EXPECT_EQ(live, 6 * kMiB + 1024) << json << ": 6 MiB and 1000 B rounded to 512";
  EXPECT_EQ(field(json, id, "requested_bytes"), 6 * kMiB + 1000) << json;
  EXPECT_EQ(field(json, id, "blocks"), 2) << json;
  EXPECT_EQ(reserved, live + cached) << json;
  EXPECT_GE(cached, 4 * kMiB + 512) << json << ": the temporary's bytes stay with the pool";
  EXPECT_GE(field(json, id, "largest_free_bytes"), 4 * kMiB + 512) << json;
  // One free block per size class (the temporary merged back into its segment's rest).
  EXPECT_EQ(field(json, id, "fragmentation_bytes"), 0) << json;
  EXPECT_EQ(field(json, id, "use_count"), 1) << json;

  // The graph is gone: torch releases the pool, its blocks are freed, it leaves the list.
  state.release_pool(pool);
  plugin().free_block(output);
  plugin().free_block(small);
  state.empty_cache({0, 0});
  EXPECT_EQ(pools_json().find(id), std::string::npos) << pools_json();
  plugin().free_block(outside);
}

}  // namespace
}  // namespace vramledger::torch_plugin
